"""Tuned baselines: search each objective's declared knobs before the held-out comparison.

An evolved objective measured against a baseline at one fixed setting (L2 at PPO's
``vf_coef = 0.5``) may only look good because that setting suits the baseline badly. With
tuning (``metarl evaluate RUN --tune``), every objective of the evaluation first trains over
a grid, one vmapped program per objective and environment (:func:`metarl.sweep.train_sweep`),
and is then trained on the held-out seeds at the setting that scored best.

- **What is searched.** Each baseline searches the knobs it declares
  (:class:`~metarl.objectives.registry.Tunable`, ``register_objective(tunables=...)``):
  traced hyperparameters of the algorithm (``vf_coef``, ``clip_eps``, the learning rate as
  multiples of the run's own) and options that its loss term reads traced from its
  meta-parameters (DPO's ``alpha`` and ``beta``). A knob the algorithm does not have
  (``vf_coef`` under DQN) is skipped and the reason recorded. ``tune_grid`` replaces a
  knob's values for every objective that declares it.
- **The evolved objective's budget.** It searches only the *shared* knobs (those that
  belong to training, not to one objective: the learning rate), with as many settings as
  the largest baseline grid: the union of the baselines' values of that knob, with points
  spaced evenly (in log where the values are positive) between them until the count is
  reached. With the shipped declarations every baseline grid has 12 settings, and the
  evolved objective gets 12 learning rates, so each objective is chosen from the same
  number of settings × tuning seeds.
- **Choosing.** The chosen setting has the best score (the run's fitness metric) over the
  tuning seeds by the statistic ``tune_by`` (:data:`TUNE_STATISTICS`): the interquartile
  mean (``"iqm"``, the default: the statistic the held-out verdicts use) or the mean
  (``"mean"``). Under heavy-tailed returns the two disagree: on Acrobot-v1, where a few
  seeds fail near -500, the mean chose PPO's ``clip_eps`` 0.1, whose held-out IQM is below
  the default 0.2's. The IQM comes from :func:`metarl.stats.point_estimate` over a
  setting's finite returns. A setting with any invalid (NaN) seed ranks after every setting
  without one, and ties go to the first in grid order. Every setting trains on the same
  tuning seeds (common random numbers). A record saved before ``tune_by`` existed has no
  such field and was chosen by the mean (:data:`UNRECORDED_TUNE_BY`).
- **Edges.** A choice at the lowest or highest value of a knob's grid says only that the
  best setting may lie beyond it (on CartPole the learning rate was chosen at its edge,
  ×3, by nearly every objective); widening (next item) follows it. Every record names the
  knobs still at an edge (``at_edge``, :func:`grid_edges`, which also reads records saved
  before rounds existed) and the printed summary says so.
- **Widening.** With ``rounds`` (``--tune-rounds``, :data:`DEFAULT_TUNE_ROUNDS` 3), a
  choice at an edge of a knob's values is followed past that edge, on the tuning seeds
  only (:func:`widen`): each round adds, for every knob at an edge, the chosen setting
  with that knob one step further, continuing the grid's own spacing (the ratio of its
  last two values for positive knobs, e.g. x3 steps of the learning rate; their
  difference otherwise), and the objective is chosen again over every setting scored so
  far. The evolved objective's shared knobs step as far as the baselines' do: their grid
  is filled finely between the baselines' values, and widening by its own small ratio
  (x1.25 for 12 learning rates over ⅓x to 3x) stops at the first noisy dip, short of
  where the baselines' x3 steps reach, so such a knob widens by the largest ratio
  between neighbouring values any baseline declares for it (``Knob.widen_ratio``). A step
  that leaves the knob's valid range (``Tunable.low``/``high``, or a value the algorithm
  refuses) is not taken: that knob is at the edge of its range. Rounds end
  when every choice is inside its values or after ``rounds`` widening rounds; the record
  then names the knobs still at an edge (``widening.capped``, ``widening.out_of_range``)
  and the printed summary says so.
- **Equal budget after widening.** Every objective compared on an environment trains the
  same number of settings in all: once each has widened, those with fewer settings than
  the most get the difference in extra points of their own (:func:`balance`), each the
  geometric (or arithmetic) midpoint between the best setting's value of a knob and a
  neighbouring value of that knob, the best setting's other knobs kept, nearest
  refinements first; an objective whose best setting has no neighbour left to refine
  towards extends past an edge of its grid instead. The record's ``rounds`` keep each
  round's grid, the settings it added with their scores, and the choice after it.
- **Seeds.** Tuning keys are ``split(PRNGKey(tune_seed), tune_seeds)``
  (:data:`DEFAULT_TUNE_SEED` 20 011) and held-out keys ``split(PRNGKey(eval_seed), seeds)``
  (a root no earlier evaluation of the run used, from 10 007 up, skipping the tuning
  seed: :mod:`metarl.evolve.evaluate`); evolution draws from ``PRNGKey(run.seed)`` and
  measures its fitness baselines from ``PRNGKey(run.seed + 1)``. A ``tune_seed`` equal
  to any of those roots is refused, since keys split from one root share their first
  members.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.population import broadcast_to_population, stack_hyperparams
from inner_loops.registry import algorithm_of
from metarl.config import ConfigError
from metarl.evolve.generation import build_learner
from metarl.objectives import get_objective, make_objective
from metarl.objectives.registry import LEARNING_RATE
from metarl.programs import shared_program
from metarl.stats import point_estimate
from metarl.sweep import GridAxis, SweepResult, check_grid, summarise_sweep, train_sweep

__all__ = ["DEFAULT_TUNE_BY", "DEFAULT_TUNE_ROUNDS", "DEFAULT_TUNE_SEED", "DEFAULT_TUNE_SEEDS",
           "Knob", "SCORES", "Search", "TUNE_STATISTICS", "TuningPlan", "UNRECORDED_TUNE_BY",
           "balance", "balance_objective", "check_overrides", "next_value", "widen",
           "check_tune_options", "choose", "chosen_values", "evolved_plan", "fill_grid",
           "default_losses_plan", "format_tuning", "grid_edges", "objective_plan", "tune_by_of",
           "tune_objective", "tuned_fitness_baselines", "tuning_keys"]

DEFAULT_TUNE_SEED = 20_011
DEFAULT_TUNE_SEEDS = 8
# statistic -> how a record and the printed summary name it
TUNE_STATISTICS = {"iqm": "interquartile mean", "mean": "mean"}
DEFAULT_TUNE_BY = "iqm"
UNRECORDED_TUNE_BY = "mean"  # what chose in records saved before tune_by existed
SCORES = {statistic: f"{name} of the run's fitness metric over the tuning seeds; a setting "
                     "with an invalid seed ranks after every setting without one; ties go "
                     "to the first in grid order"
          for statistic, name in TUNE_STATISTICS.items()}
BUDGET_RULE = ("each baseline searches its declared grid; the evolved objective searches "
               "the baselines' shared knobs (learning rate) with as many settings as the "
               "largest baseline grid, every objective on the same tuning seeds")
DEFAULT_TUNE_ROUNDS = 3
WIDENING_BUDGET_RULE = (
    BUDGET_RULE + "; a choice at an edge of its grid is followed past that edge, one step of "
    "the grid's own spacing per knob and round, within the knob's valid range, for at most "
    "the cap of widening rounds; then every objective gets as many settings in all as the "
    "one with the most, the others' extra points refining between their best setting's "
    "value and its neighbours (or extending past an edge where none is left)")


@dataclass(frozen=True)
class Knob:
    """One searched knob, resolved for a run's algorithm and environment.

    Attributes:
        name: hyperparameter field or objective option.
        values: the grid as declared (multiples of the run's value where ``relative``).
        trained: the values the agents train with (absolute).
        relative, shared, option, slot, low, high: as in
            :class:`~metarl.objectives.registry.Tunable`.
        base: the run's own value a relative knob's values multiply.
        widen_ratio: the factor one widening step moves a positive knob by, where it is
            not the grid's own spacing (the evolved objective's shared knobs: the
            baselines' coarsest step); ``None``: the grid's own.
    """

    name: str
    values: tuple[float, ...]
    trained: tuple[float, ...]
    relative: bool = False
    shared: bool = False
    option: bool = False
    slot: str | None = None
    low: float | None = None
    high: float | None = None
    base: float = 1.0
    widen_ratio: float | None = None

    def allows(self, value: float) -> bool:
        """Whether the declared ``value`` lies inside the knob's open valid range."""
        return ((self.low is None or value > self.low)
                and (self.high is None or value < self.high))

    def trained_value(self, value: float) -> float:
        """The value agents train with for the declared ``value``."""
        return _scaled((value,), self.base)[0] if self.relative else float(value)


@dataclass(frozen=True)
class TuningPlan:
    """What one objective searches on one environment.

    Attributes:
        objective: ``"evolved"`` or a registered baseline's name.
        knobs: the searched knobs (their product is the grid; none: nothing to search).
        skipped: knob -> why it is not searched here.
        relative_to: relative knob -> the run's own value it multiplies.
    """

    objective: str
    knobs: tuple[Knob, ...]
    skipped: dict[str, str]
    relative_to: dict[str, float]

    @property
    def settings(self) -> int:
        """Settings of the grid (1 when nothing is searched: the default setting)."""
        return math.prod(len(knob.values) for knob in self.knobs)

    @property
    def grid(self) -> dict[str, list[float]]:
        """Knob -> values as declared."""
        return {knob.name: list(knob.values) for knob in self.knobs}

    @property
    def widen_ratios(self) -> dict[str, float]:
        """Knob -> the factor its widening steps move by, where not the grid's own."""
        return {knob.name: knob.widen_ratio for knob in self.knobs
                if knob.widen_ratio is not None}


def check_tune_options(tune_seeds: Any, tune_seed: Any, eval_seed: int | None, run_seed: int,
                       tune_by: Any = DEFAULT_TUNE_BY,
                       tune_rounds: Any = DEFAULT_TUNE_ROUNDS) -> None:
    """Raise :class:`ConfigError` naming a bad count of tuning seeds, a tuning seed whose
    keys would not be apart from the held-out (``eval_seed``; ``None``: not chosen yet, a
    fresh root will skip the tuning seed's) or evolution keys, a statistic to choose by
    that is not one of :data:`TUNE_STATISTICS`, or a cap of widening rounds that is no
    count."""
    if isinstance(tune_rounds, bool) or not isinstance(tune_rounds, int) or tune_rounds < 0:
        raise ConfigError(f"tune_rounds: expected a count of widening rounds (0 or more), "
                          f"got {tune_rounds!r}")
    if not isinstance(tune_by, str) or tune_by not in TUNE_STATISTICS:
        raise ConfigError(f"tune_by: got {tune_by!r}; allowed: "
                          + ", ".join(f"{key} ({name})" if key != name else key
                                      for key, name in TUNE_STATISTICS.items()))
    if isinstance(tune_seeds, bool) or not isinstance(tune_seeds, int) or tune_seeds < 2:
        raise ConfigError(f"tune_seeds: need at least 2 to compare settings, got {tune_seeds!r}")
    if isinstance(tune_seed, bool) or not isinstance(tune_seed, int):
        raise ConfigError(f"tune_seed: expected an integer, got {tune_seed!r}")
    taken = {**({} if eval_seed is None else {eval_seed: "eval_seed (the held-out seeds)"}),
             run_seed: "run.seed (evolution's seeds)",
             run_seed + 1: "run.seed + 1 (the fitness baselines' seeds)"}
    if tune_seed in taken:
        raise ConfigError(f"tune_seed: {tune_seed} is the root of {taken[tune_seed]}; choose "
                          "another so that tuning seeds stay apart from them")


def tuning_keys(tune_seed: int, tune_seeds: int) -> jax.Array:
    """``[tune_seeds, 2]`` keys every setting of a tuning sweep trains with."""
    return jax.random.split(jax.random.PRNGKey(tune_seed), tune_seeds)


def check_overrides(tune_grid: Mapping[str, Sequence[float]] | None,
                    objectives: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """``tune_grid`` as ``knob -> values``; an error names a knob none of ``objectives``
    declares or a value that is no number."""
    if not tune_grid:
        return {}
    if not isinstance(tune_grid, Mapping):
        raise ConfigError(f"tune_grid: expected a mapping knob -> values, got {tune_grid!r}")
    declared = sorted({t.name for name in objectives for t in get_objective(name).tunables})
    overrides = {}
    for knob, values in tune_grid.items():
        if knob not in declared:
            raise ConfigError(f"tune_grid: unknown knob {knob!r}; the objectives tuned here "
                              f"({', '.join(objectives)}) declare: "
                              f"{', '.join(declared) or 'none'}")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise ConfigError(f"tune_grid {knob}: expected a list of numbers, got {values!r}")
        if not values or any(isinstance(v, bool) or not isinstance(v, int | float)
                             or not math.isfinite(v) for v in values):
            raise ConfigError(f"tune_grid {knob}: expected finite numbers, got {list(values)}")
        if len(set(values)) != len(values):
            raise ConfigError(f"tune_grid {knob}: give distinct values, got {list(values)}")
        overrides[knob] = tuple(float(v) for v in values)
    return overrides


def objective_plan(name: str, inner, overrides: Mapping[str, tuple[float, ...]] | None = None
                   ) -> TuningPlan:
    """What baseline ``name`` searches under ``inner``'s algorithm: its declared knobs
    (values replaced by ``overrides``), those the algorithm lacks skipped with the reason.

    Raises :class:`ConfigError` for a value the setting does not allow and for an override
    of a knob that this algorithm does not have."""
    learner = build_learner(inner, make_objective(name))
    return _plan(name, get_objective(name).tunables, inner, learner, overrides)


def _plan(name: str, tunables, inner, learner, overrides) -> TuningPlan:
    overrides = dict(overrides or {})
    fields = learner.default_hypers._fields
    knobs, skipped, relative_to = [], {}, {}
    for tunable in tunables:
        values = overrides.get(tunable.name, tunable.values)
        if tunable.option:
            for value in values:
                try:
                    make_objective(name, **{tunable.name: value})
                except ValueError as error:
                    raise ConfigError(f"tune_grid {tunable.name}: {value:g} is not allowed "
                                      f"for objective {name!r}: {error}") from None
            _check_range(tunable, values, name)
            knobs.append(Knob(tunable.name, values, values, option=True, slot=tunable.slot,
                              shared=tunable.shared, low=tunable.low, high=tunable.high))
            continue
        field = next((f for f in (tunable.name, *tunable.fallbacks) if f in fields), None)
        if field is None:
            reason = (f"{learner.algorithm} has no hyperparameter {tunable.name} (it has "
                      f"{', '.join(fields)})")
            if tunable.name in overrides:
                raise ConfigError(f"tune_grid {tunable.name}: {reason}")
            skipped[tunable.name] = reason
            continue
        base = float(getattr(inner, field))
        trained = _scaled(values, base) if tunable.relative else values
        _check_values(inner, learner, field, values, trained, base, tunable.relative)
        _check_range(tunable, values, name)
        if tunable.relative:
            relative_to[field] = base
        knobs.append(Knob(field, values, trained, tunable.relative, tunable.shared,
                          low=tunable.low, high=tunable.high,
                          base=base if tunable.relative else 1.0))
    return TuningPlan(name, tuple(knobs), skipped, relative_to)


def _check_range(tunable, values, name: str) -> None:
    outside = [value for value in values if not tunable.allows(value)]
    if outside:
        raise ConfigError(f"tune_grid {tunable.name}: {', '.join(f'{v:g}' for v in outside)} "
                          f"outside its valid range ({tunable.low}, {tunable.high}) for "
                          f"objective {name!r}")


def _check_values(inner, learner, name, values, trained, base, relative) -> None:
    for value, absolute in zip(values, trained, strict=True):
        try:
            check_grid(inner, learner, [GridAxis(name, (absolute,))])
        except ConfigError as error:
            detail = str(error).removeprefix("--grid ")
            scale = f" (x{value:g} of the run's {base:g})" if relative else ""
            raise ConfigError(f"tune_grid {name}: {value:g}{scale} is not allowed: "
                              f"{detail}") from None


def evolved_plan(name: str, baselines: Sequence[TuningPlan]) -> TuningPlan:
    """The evolved objective's search: the shared knobs of ``baselines``, with as many
    settings as the largest baseline grid (see the module docstring)."""
    budget = max((plan.settings for plan in baselines), default=1)
    shared: dict[str, list[Knob]] = {}
    for plan in baselines:
        for knob in plan.knobs:
            if knob.shared and not knob.option:
                shared.setdefault(knob.name, []).append(knob)
    skipped = {knob: reason for plan in baselines for knob, reason in plan.skipped.items()
               if any(t.shared for t in get_objective(plan.objective).tunables
                      if t.name == knob)}
    relative_to = {name_: base for plan in baselines for name_, base in plan.relative_to.items()
                   if name_ in shared}
    if not shared:
        return TuningPlan(name, (), skipped, {})
    anchors = {}
    for knob_name, knobs in shared.items():
        if len({knob.relative for knob in knobs}) != 1:
            raise ValueError(f"shared knob {knob_name!r} is relative for some objectives and "
                             "absolute for others")
        anchors[knob_name] = sorted({v for knob in knobs for v in knob.values})
    names = list(anchors)
    others = math.prod(len(anchors[n]) for n in names[1:])
    first = names[0]
    anchors[first] = fill_grid(anchors[first], max(len(anchors[first]), -(-budget // others)))
    result = []
    for knob_name in names:
        relative = shared[knob_name][0].relative
        values = tuple(anchors[knob_name])
        base = relative_to.get(knob_name, 1.0)
        trained = _scaled(values, base) if relative else values
        low = max((k.low for k in shared[knob_name] if k.low is not None), default=None)
        high = min((k.high for k in shared[knob_name] if k.high is not None), default=None)
        result.append(Knob(knob_name, values, trained, relative, shared=True, low=low,
                           high=high, base=base if relative else 1.0,
                           widen_ratio=_coarsest_ratio(knob.values
                                                       for knob in shared[knob_name])))
    return TuningPlan(name, tuple(result), skipped, relative_to)


def _coarsest_ratio(grids) -> float | None:
    """The largest ratio between neighbouring values of any of ``grids`` (each ascending
    positive values); ``None`` where no grid has two positive values."""
    ratios = [high / low for values in grids
              for low, high in zip(values, values[1:], strict=False) if low > 0 and high > 0]
    return max(ratios) if ratios else None


def _scaled(multiples: Sequence[float], base: float) -> tuple[float, ...]:
    """``multiples`` times ``base`` (7 significant digits: float32 holds no more)."""
    return tuple(float(f"{m * base:.7g}") for m in multiples)


def fill_grid(anchors: Sequence[float], count: int) -> list[float]:
    """``anchors`` (sorted) with points added evenly between neighbours (geometrically when
    both are positive, 4 significant digits) until there are ``count``; more anchors than
    ``count``, or a single one, come back unchanged."""
    anchors = sorted(float(a) for a in anchors)
    extra = count - len(anchors)
    gaps = len(anchors) - 1
    if extra <= 0 or gaps < 1:
        return anchors
    values = [anchors[0]]
    for index, (low, high) in enumerate(zip(anchors, anchors[1:], strict=False)):
        inside = extra // gaps + (1 if index < extra % gaps else 0)
        for step in range(1, inside + 1):
            t = step / (inside + 1)
            point = low * (high / low) ** t if low > 0 and high > 0 else low + (high - low) * t
            values.append(float(f"{point:.4g}"))
        values.append(high)
    return values


def tune_objective(plan: TuningPlan, objective, inner, fitness, seeds: int, tune_seed: int,
                   meta_params=None, chunk_size="auto", mesh=None,
                   tune_by: str = DEFAULT_TUNE_BY, rounds: int = 0) -> dict[str, Any]:
    """Train every setting of ``plan`` x ``seeds`` tuning seeds as one program and choose,
    then with ``rounds`` widen the grid past an edge the choice is at (:func:`widen`), one
    program per round.

    Args:
        plan: what is searched (:func:`objective_plan`, :func:`evolved_plan`).
        objective: the objective trained (built with its default options).
        inner: the algorithm's config of this environment.
        fitness: how a training run is scored (the run's ``[fitness]``).
        seeds, tune_seed: tuning seeds and the root of their keys.
        meta_params: the objective's meta-parameters (``None``: its own initialisation).
        chunk_size, mesh: how the members are split (:func:`metarl.sharding.
            train_population`).
        tune_by: the statistic the setting is chosen by, ``"iqm"`` or ``"mean"``
            (:func:`choose`).
        rounds: the cap of widening rounds (0: the declared grid only).

    Returns the record: ``tune_by``, ``grid`` (every value searched, declared units),
    ``relative_to``, ``skipped``, every setting's scores (``settings``: absolute
    ``setting``, ``mean``, ``ci_low``, ``ci_high``, ``iqm``, ``invalid``, ``returns
    [seeds]``), the ``chosen`` setting (absolute values) and its index, the knobs chosen at
    an end of their grid (``at_edge``, :func:`grid_edges`), the ``budget`` (settings,
    seeds, runs), ``rounds`` (each round's ``grid``, the settings it ``added`` in
    declared units with their ``score``, and the ``chosen`` setting after it),
    ``widening`` (``cap``, ``rounds`` run, the knobs still at an edge when the cap was
    reached, ``capped``, or because the next step leaves their valid range,
    ``out_of_range``, and ``ratios``, the knobs whose steps were not the grid's own
    spacing, :attr:`Knob.widen_ratio`) and the seconds of compilation and training. With nothing to
    search nothing trains and ``chosen`` is ``{}`` (the default setting).
    """
    if tune_by not in TUNE_STATISTICS:
        raise ValueError(f"tune_by: got {tune_by!r}; allowed: {', '.join(TUNE_STATISTICS)}")
    record = {"tune_by": tune_by, "grid": plan.grid, "relative_to": plan.relative_to,
              "skipped": plan.skipped,
              "budget": {"settings": plan.settings, "seeds": seeds,
                         "runs": plan.settings * seeds}}
    if not plan.knobs:
        return {**record, "budget": {"settings": 0, "seeds": seeds, "runs": 0},
                "settings": [], "chosen": {}, "chosen_index": None}
    timing = {"compile_seconds": 0.0, "train_seconds": 0.0}
    score = _scorer(plan, objective, inner, fitness, seeds, tune_seed, meta_params,
                    chunk_size, mesh, timing)
    allows = _allows(plan, inner, objective)
    ratios = plan.widen_ratios
    search = widen(plan.grid, score, allows, rounds, tune_by, ratios)
    return _search_record(record, search, tune_by, seeds, rounds, allows, timing, ratios)


def balance_objective(plan: TuningPlan, record: dict[str, Any], count: int, objective, inner,
                      fitness, seeds: int, tune_seed: int, meta_params=None,
                      chunk_size="auto", mesh=None) -> dict[str, Any]:
    """``record`` (from :func:`tune_objective` with the same arguments) with settings added
    by :func:`balance` until it has ``count`` in all, chosen again over all of them; the
    record as it is when it has as many already, searched nothing, or is an old one
    without ``rounds``."""
    if (not plan.knobs or "rounds" not in record
            or record["budget"]["settings"] >= count):
        return record
    tune_by = tune_by_of(record)
    timing = {"compile_seconds": record.get("compile_seconds", 0.0),
              "train_seconds": record.get("train_seconds", 0.0)}
    score = _scorer(plan, objective, inner, fitness, seeds, tune_seed, meta_params,
                    chunk_size, mesh, timing, record)
    allows = _allows(plan, inner, objective)
    balanced = balance(_search_of(record), score, count, allows, tune_by)
    base = {key: record[key] for key in ("tune_by", "relative_to", "skipped")}
    ratios = record["widening"].get("ratios") or {}
    return {**_search_record(base, balanced, tune_by, seeds, record["widening"]["cap"],
                             allows, timing, ratios),
            **{key: value for key, value in record.items() if key not in _SEARCH_KEYS
               and key not in base}}


_SEARCH_KEYS = ("grid", "budget", "settings", "chosen", "chosen_index", "at_edge", "rounds",
                "widening", "compile_seconds", "train_seconds")


@dataclass(frozen=True)
class Search:
    """The settings a tuning search scored, in declared units, and how it went.

    Attributes:
        settings: every setting scored, in the order scored (knob -> declared value).
        results: one score per setting (anything :func:`choose` reads: ``mean``,
            ``invalid``, ``returns [S]``).
        rounds: one entry per round (``round``, ``reason``: ``"grid"``, ``"widen"`` or
            ``"balance"``, the ``grid`` of every value so far, the settings ``added`` with
            their ``score`` and ``invalid`` seeds, the ``chosen`` setting after it).
    """

    settings: tuple[dict[str, float], ...]
    results: tuple[Any, ...]
    rounds: tuple[dict[str, Any], ...]

    def values(self, knob: str) -> list[float]:
        """The distinct values of ``knob`` scored, ascending."""
        return sorted({setting[knob] for setting in self.settings})

    def edges(self, index: int) -> dict[str, str]:
        """Knob -> ``"lowest"``/``"highest"`` where setting ``index`` is at an end of that
        knob's values (a knob with one value has none)."""
        edges = {}
        for knob, value in self.settings[index].items():
            values = self.values(knob)
            if len(values) > 1 and value in (values[0], values[-1]):
                edges[knob] = "highest" if value == values[-1] else "lowest"
        return edges


def next_value(values: Sequence[float], end: str, ratio: float | None = None) -> float:
    """The value one step past the ``end`` (``"lowest"``/``"highest"``) of ``values``
    (ascending, at least 2), continuing their spacing there: the ratio of the last two
    values when both are positive (x3 after 1, 3), else their difference; a positive end
    moves by ``ratio`` instead where one is given; 4 significant digits."""
    last, before = (values[-1], values[-2]) if end == "highest" else (values[0], values[1])
    if ratio is not None and last > 0:
        step = last * ratio if end == "highest" else last / ratio
    else:
        step = last * (last / before) if last > 0 and before > 0 else 2 * last - before
    return float(f"{step:.4g}")


def widen(grid: Mapping[str, Sequence[float]], score, allows,
          rounds: int = DEFAULT_TUNE_ROUNDS, statistic: str = DEFAULT_TUNE_BY,
          ratios: Mapping[str, float] | None = None) -> Search:
    """Score the product ``grid`` (knob -> declared values), then for at most ``rounds``
    rounds, while the best setting is at an edge of some knob's values, score that setting
    with each such knob moved :func:`next_value` past its edge (by ``ratios[knob]`` where
    given, else the grid's own spacing; where ``allows(knob, value)``) and choose again
    over everything scored.

    ``score`` maps a list of settings to one result per setting (:func:`choose` reads
    them); it is the only thing that trains, so a planted optimum can be found without
    training."""
    names = list(grid)
    first = [dict(zip(names, values, strict=True))
             for values in itertools.product(*[grid[name] for name in names])]
    search = _scored(Search((), (), ()), first, score, "grid", statistic)
    for _ in range(rounds):
        index = choose(search.results, statistic)
        added = []
        for knob, end in search.edges(index).items():
            value = next_value(search.values(knob), end, (ratios or {}).get(knob))
            if allows(knob, value):
                added.append({**search.settings[index], knob: value})
        if not added:
            break
        search = _scored(search, added, score, "widen", statistic)
    return search


def balance(search: Search, score, count: int, allows,
            statistic: str = DEFAULT_TUNE_BY) -> Search:
    """``search`` with settings added until it has ``count`` (see the module docstring:
    midpoints between the best setting's value of each knob and its neighbours, nearest
    first, or a step past an edge where no neighbour is left), scored as one round and
    chosen again; unchanged when it has as many, or when no point is left to add."""
    missing = count - len(search.settings)
    if missing <= 0:
        return search
    chosen = search.settings[choose(search.results, statistic)]
    values = {knob: search.values(knob) for knob in chosen}
    spacing = {knob: search.values(knob) for knob in chosen}  # the grid's own, for a step
    points: list[dict[str, float]] = []
    while len(points) < missing:
        before = len(points)
        for knob, value in chosen.items():
            for side in (-1, 1):
                if len(points) == missing:
                    break
                known = values[knob]
                neighbour = known.index(value) + side
                if 0 <= neighbour < len(known):
                    other = known[neighbour]
                    point = (value * other) ** 0.5 if value > 0 and other > 0 \
                        else (value + other) / 2
                    point = float(f"{point:.4g}")
                elif len(known) > 1:
                    point = next_value(spacing[knob], "lowest" if side < 0 else "highest")
                else:
                    continue
                if point in known or not allows(knob, point):
                    continue
                points.append({**chosen, knob: point})
                known.append(point)
                known.sort()
        if len(points) == before:
            break
    if not points:
        return search
    return _scored(search, points, score, "balance", statistic)


def _scored(search: Search, added: list[dict[str, float]], score, reason: str,
            statistic: str) -> Search:
    results = list(score(added))
    if len(results) != len(added):
        raise ValueError(f"score: got {len(results)} results for {len(added)} settings")
    settings = (*search.settings, *added)
    grown = Search(settings, (*search.results, *results), search.rounds)
    index = choose(grown.results, statistic)
    entry = {"round": len(search.rounds), "reason": reason,
             "grid": {knob: grown.values(knob) for knob in added[0]},
             "added": [{"setting": dict(setting), "score": _score(result, statistic),
                        "invalid": int(result.invalid)}
                       for setting, result in zip(added, results, strict=True)],
             "chosen": dict(settings[index]), "at_edge": grown.edges(index)}
    return Search(settings, grown.results, (*search.rounds, entry))


def _search_of(record: Mapping[str, Any]) -> Search:
    """The :class:`Search` a tuning record with ``rounds`` was made from."""
    settings = tuple(dict(added["setting"]) for entry in record["rounds"]
                     for added in entry["added"])
    results = tuple(SweepResult(
        setting=saved["setting"],
        returns=[np.nan if r is None else r for r in saved["returns"]],
        mean=np.nan if saved["mean"] is None else saved["mean"], ci_low=saved["ci_low"],
        ci_high=saved["ci_high"], invalid=saved["invalid"], curves=[])
        for saved in record["settings"])
    return Search(settings, results, tuple(record["rounds"]))


def _search_record(base: dict[str, Any], search: Search, tune_by: str, seeds: int,
                   cap: int, allows, timing: Mapping[str, float],
                   ratios: Mapping[str, float] | None = None) -> dict[str, Any]:
    grid: dict[str, list[float]] = {}
    for setting in search.settings:
        for knob, value in setting.items():
            if value not in grid.setdefault(knob, []):
                grid[knob].append(value)
    index = choose(search.results, tune_by)
    chosen = dict(search.results[index].setting)
    edges = search.edges(index)
    out_of_range = {knob: end for knob, end in edges.items()
                    if not allows(knob, next_value(search.values(knob), end,
                                                   (ratios or {}).get(knob)))}
    count = len(search.settings)
    record = {
        **base, "grid": grid,
        "budget": {"settings": count, "seeds": seeds, "runs": count * seeds},
        "settings": [{**{key: value for key, value in dataclasses.asdict(result).items()
                         if key not in ("curves", "curve_updates")},
                      "iqm": _score(result, "iqm")}
                     for result in search.results],
        "chosen": chosen,
        "chosen_index": index,
        "rounds": list(search.rounds),
        "widening": {"cap": cap,
                     "rounds": sum(entry["reason"] == "widen" for entry in search.rounds),
                     "capped": {knob: end for knob, end in edges.items()
                                if knob not in out_of_range},
                     "out_of_range": out_of_range,
                     "ratios": dict(ratios or {})},
        "compile_seconds": round(timing["compile_seconds"], 2),
        "train_seconds": round(timing["train_seconds"], 2),
    }
    record["at_edge"] = grid_edges(record)
    return record


def _sizes_used(record: Mapping[str, Any], seeds: int, steps_per_agent: int) -> set[int]:
    """The member counts a search's rounds trained at (``record`` from
    :func:`tune_objective`), replayed by the rule its scorer followed."""
    sizes: set[int] = set()
    for entry in record["rounds"]:
        sizes.add(padded_size(len(entry["added"]), seeds, steps_per_agent, sizes) * seeds)
    return sizes


def _scorer(plan: TuningPlan, objective, inner, fitness, seeds: int, tune_seed: int,
            meta_params, chunk_size, mesh, timing: dict[str, float],
            record: Mapping[str, Any] | None = None):
    """``score(settings)`` for :func:`widen`: trains the declared ``settings`` x ``seeds``
    tuning seeds as one program and returns their :class:`~metarl.sweep.SweepResult` s
    (absolute settings), adding its seconds to ``timing``. ``record``: the search being
    continued (balanced), whose rounds' sizes a call may pad up to; ``None``: a new
    search."""
    learner = build_learner(inner, objective)
    # the member counts this search trained at, the only sizes a call pads up to
    sizes = (set() if record is None
             else _sizes_used(record, seeds, learner.steps_per_agent))
    knobs = {knob.name: knob for knob in plan.knobs}
    options = tuple(knob.name for knob in plan.knobs if knob.option)
    # A widening round or the balancing adds fewer settings than the declared grid. Where
    # training is short, compiling a program for that size costs more than training repeats
    # of its first setting in a program already compiled, so such a call is padded up to
    # the smallest size this search trained at whose extra members train at most
    # PAD_AGENT_STEPS; a longer training gets a program of its own size instead. A
    # member's result can differ in float rounding with the size of its program (PPO on
    # classic's CartPole at level 1, 8 members alone or first of 40), so the choice depends
    # on this search's own rounds alone (replayed from its record when it is balanced
    # later): never on timings, nor on what else the process compiled (another run's
    # equal objective, a search read from the store).
    programs: dict[int, Any] = shared_program(
        ("tuning sweep", objective, inner, fitness.metric, fitness.final_fraction, seeds,
         chunk_size, mesh), dict)

    def score(declared: list[dict[str, float]]):
        settings = [{knob: knobs[knob].trained_value(value) for knob, value in setting.items()}
                    for setting in declared]
        size = padded_size(len(settings), seeds, learner.steps_per_agent, sizes)
        sizes.add(size * seeds)
        padded = settings + [settings[0]] * (size - len(settings))
        hypers = stack_hyperparams([
            learner.default_hypers._replace(**{k: jnp.float32(v) for k, v in setting.items()
                                               if k not in options})
            for setting in padded for _ in range(seeds)])
        keys = jnp.concatenate([tuning_keys(tune_seed, seeds)] * len(padded))
        members = len(padded) * seeds
        params = meta_params
        if options:
            params = _option_meta_params(plan, objective, meta_params, padded, seeds)
        elif meta_params is not None:
            params = broadcast_to_population(meta_params, members)
        trained = train_sweep(learner, keys, hypers, fitness, params, chunk_size, mesh,
                              programs)
        timing["compile_seconds"] += trained["compile_seconds"]
        timing["train_seconds"] += trained["train_seconds"]
        kept = len(settings) * seeds
        return summarise_sweep(settings, seeds, {
            **trained, **{name: trained[name][:kept] for name in ("curves", "returns",
                                                                   "valid")}})

    return score


#: The most agent-steps of padding a tuning call trains to reuse a compiled program rather
#: than compile one of its own size: about what the 2-core CPU trains in the CPU time a
#: small sweep program takes to compile at judging's XLA level (4.5 s of one core; PPO at
#: ``classic``'s CartPole settings trains 245k agent-steps/s on both cores). The earlier
#: 4e6 padded CartPole's one-setting widening rounds to its whole 12-setting grid: 10 s of
#: both cores where compiling its own program and training it took 5.6 s of one.
PAD_AGENT_STEPS = 500_000


def padded_size(settings: int, seeds: int, steps_per_agent: int, trained_members,
                budget: int = PAD_AGENT_STEPS) -> int:
    """How many settings a tuning call of ``settings`` x ``seeds`` members trains: the
    smallest size the search trained at before (``trained_members``, member counts) that
    holds them with at most ``budget`` agent-steps of padding (each member trains
    ``steps_per_agent``), else ``settings`` itself (a program of its own size)."""
    fits = [members // seeds for members in trained_members
            if members % seeds == 0 and members // seeds >= settings
            and (members // seeds - settings) * seeds * steps_per_agent <= budget]
    return min(fits, default=settings)


def _allows(plan: TuningPlan, inner, objective):
    """``allows(knob, declared value)``: inside the knob's valid range, and accepted by the
    algorithm's config (a hyperparameter) or the objective's factory (an option)."""
    knobs = {knob.name: knob for knob in plan.knobs}
    learner = build_learner(inner, objective)

    def allows(name: str, value: float) -> bool:
        knob = knobs[name]
        if not knob.allows(value):
            return False
        try:
            if knob.option:
                make_objective(plan.objective, **{name: value})
            else:
                check_grid(inner, learner, [GridAxis(name, (knob.trained_value(value),))])
        except (ConfigError, ValueError):
            return False
        return True

    return allows


def grid_edges(record: Mapping[str, Any]) -> dict[str, str]:
    """Knob -> ``"lowest"`` or ``"highest"`` for each knob of a tuning record whose chosen
    value is the lowest or highest of its grid (grids of one value have no edge). Read from
    the record's ``grid`` (as declared: multiples of ``relative_to`` for relative knobs) and
    ``chosen`` (absolute), so records saved before ``at_edge`` existed are read too."""
    edges = {}
    for knob, values in record.get("grid", {}).items():
        if len(values) < 2 or knob not in record.get("chosen", {}):
            continue
        chosen = record["chosen"][knob]
        if knob in record.get("relative_to", {}):
            chosen = chosen / record["relative_to"][knob]
        # chosen values went through float32 training hyperparameters
        if math.isclose(chosen, max(values), rel_tol=1e-5):
            edges[knob] = "highest"
        elif math.isclose(chosen, min(values), rel_tol=1e-5):
            edges[knob] = "lowest"
    return edges


def default_losses_plan(inner) -> tuple[TuningPlan, Any]:
    """``(plan, objective)`` searching ``inner``'s algorithm with its own losses: PPO's as
    the registered ``"ppo"`` objective with its declared grid; any other algorithm's
    (``objective`` ``None``) over the shared learning rate alone."""
    algorithm = algorithm_of(inner)
    if get_objective("ppo").fits(algorithm.name, algorithm.slots):
        return objective_plan("ppo", inner), make_objective("ppo")
    learner = build_learner(inner)
    return _plan(algorithm.name, (LEARNING_RATE,), inner, learner, None), None


def tuned_fitness_baselines(config, seed: int, mesh=None
                            ) -> tuple[list[float], dict[str, dict[str, Any]]]:
    """The normalising baselines of ``[fitness] tune_baseline``: per ``[[inner]]`` entry
    the best mean return of the algorithm's own losses over :func:`default_losses_plan`'s
    grid, on ``fitness.baseline_seeds`` seeds from ``PRNGKey(seed)``. Chosen by the mean
    whatever an evaluation's ``tune_by``: the fitness divides by that mean, and runs made
    before ``tune_by`` existed normalise the same way.

    Returns ``(returns [E], {task label: tuning record})`` (the labels of
    :attr:`~metarl.evolve.config.ExperimentConfig.task_labels`). An algorithm with no knob
    to search is measured at its default setting (the record's ``settings`` hold that
    one)."""
    values, records = [], {}
    seeds = config.fitness.baseline_seeds
    for label, inner in zip(config.task_labels, config.inner, strict=True):
        plan, objective = default_losses_plan(inner)
        if not plan.knobs:  # nothing to search: the default setting, as a grid of one
            field = build_learner(inner, objective).default_hypers._fields[0]
            default = float(getattr(inner, field))
            plan = dataclasses.replace(plan, knobs=(Knob(field, (1.0,), (default,), True,
                                                         base=default),),
                                       relative_to={field: default})
        record = tune_objective(plan, objective, inner, config.fitness, seeds, seed,
                                chunk_size=config.run.chunk_size, mesh=mesh, tune_by="mean")
        best = record["settings"][record["chosen_index"]]
        if not np.isfinite(best["mean"]) or best["invalid"] == seeds:
            raise RuntimeError(f"tuned baseline on {label} produced no finite return")
        if best["mean"] == 0:
            raise RuntimeError(f"the tuned baseline on {label} returns exactly 0; "
                               "cannot normalise")
        values.append(float(best["mean"]))
        records[label] = record
    return values, records


def _option_meta_params(plan: TuningPlan, objective, meta_params, settings, seeds):
    """Meta-parameters ``[P]`` carrying each member's option values in their slot."""
    base = objective.init(jax.random.PRNGKey(0)) if meta_params is None else meta_params
    members = []
    for setting in settings:
        tree = {slot: dict(params) for slot, params in base.items()}
        for knob in plan.knobs:
            if knob.option:
                tree[knob.slot][knob.name] = jnp.float32(setting[knob.name])
        members += [tree] * seeds
    return stack_hyperparams(members)


def _score(result, statistic: str) -> float:
    """``result``'s score by ``statistic``: its ``mean`` (over valid seeds), or the IQM of
    its finite ``returns``."""
    if statistic == "mean":
        return float(result.mean)
    return point_estimate(np.asarray(result.returns, np.float64), statistic)


def choose(results, statistic: str = DEFAULT_TUNE_BY) -> int:
    """Index of the best setting of ``results`` (:class:`~metarl.sweep.SweepResult` s in
    grid order, or anything with ``mean``, ``invalid`` and ``returns [S]``): no invalid
    seed first, then the highest ``statistic`` (``"iqm"``: interquartile mean of the
    returns; ``"mean"``: the ``mean``), then the first in grid order."""
    if statistic not in TUNE_STATISTICS:
        raise ValueError(f"choose: unknown statistic {statistic!r}; allowed: "
                         f"{', '.join(TUNE_STATISTICS)}")

    def rank(index: int):
        result = results[index]
        score = _score(result, statistic)
        return (result.invalid > 0, -score if np.isfinite(score) else np.inf, index)

    return min(range(len(results)), key=rank)


def tune_by_of(record: Mapping[str, Any]) -> str:
    """The statistic that chose in a tuning section or record: its ``tune_by``, or
    :data:`UNRECORDED_TUNE_BY` (the mean) for one saved before that field existed."""
    return record.get("tune_by", UNRECORDED_TUNE_BY)


def chosen_values(plan: TuningPlan, record: dict[str, Any], learner, name: str
                  ) -> tuple[Any, dict[str, float], bool]:
    """``(hypers, options, is_default)`` of a tuning record's choice: the learner's
    hyperparameters with the chosen ones set, the chosen objective options, and whether that
    is exactly the default setting (then the held-out run at the default stands for it)."""
    chosen = record["chosen"]
    options = {knob.name: chosen[knob.name] for knob in plan.knobs if knob.option}
    changes = {knob.name: jnp.float32(chosen[knob.name]) for knob in plan.knobs
               if not knob.option}
    hypers = learner.default_hypers._replace(**changes)
    same_hypers = all(bool(changes[field] == getattr(learner.default_hypers, field))
                      for field in changes)
    defaults = {} if not options else {
        parameter.name: parameter.default
        for parameter in inspect.signature(get_objective(name).factory).parameters.values()}
    same_options = all(defaults.get(option) == value for option, value in options.items())
    return hypers, options, same_hypers and same_options


def _edge_lines(record: Mapping[str, Any]) -> list[str]:
    """What the summary says of a record's rounds and of a choice still at an edge."""
    def named(edges: Mapping[str, str]) -> str:
        return ", ".join(f"{knob} (its {end})" for knob, end in edges.items())

    widening = record.get("widening")
    lines = []
    rounds = record.get("rounds") or []
    if len(rounds) > 1:
        lines.append("      rounds: " + "; ".join(
            f"{entry['reason']} +{len(entry['added'])}" for entry in rounds))
    if widening is None:  # a record saved before grids widened themselves
        edges = grid_edges(record)
        if edges:
            lines.append(f"      at the end of its grid: {named(edges)}; the best setting "
                         f"may lie beyond (widen with --tune-grid)")
        return lines
    if widening["capped"]:
        cap = (f"when the cap of {widening['cap']} widening rounds was reached"
               if widening["cap"] else "not widened (--tune-rounds 0)")
        lines.append(f"      at the end of its grid: {named(widening['capped'])} {cap}; the "
                     f"best setting may lie beyond (raise --tune-rounds or widen with "
                     f"--tune-grid)")
    if widening["out_of_range"]:
        lines.append(f"      at the edge of its valid range: {named(widening['out_of_range'])}"
                     f"; not widened there")
    return lines


def format_tuning(report: dict[str, Any]) -> str:
    """Lines naming each objective's chosen setting and tuning score (empty when the
    evaluation was not tuned)."""
    tuning = report.get("tuning")
    if not tuning:
        return ""
    statistic = tune_by_of(tuning)
    label = "IQM" if statistic == "iqm" else statistic
    widened = (f"grids widened past an edge for up to {tuning['rounds']} rounds; "
               if tuning.get("rounds") else "")
    lines = [f"tuned on {tuning['seeds']} tuning seeds (tune seed {tuning['tune_seed']}); "
             f"{widened}chosen settings, best {TUNE_STATISTICS[statistic]} over the tuning "
             "seeds:"]
    for env_id, records in tuning["environments"].items():
        for name, record in records.items():
            budget = record["budget"]
            if record["chosen_index"] is None:
                lines.append(f"  {env_id}  {name}: nothing to tune (default setting)")
            else:
                best = record["settings"][record["chosen_index"]]
                score = best["mean"] if statistic == "mean" else best.get("iqm")
                if score is None:
                    returns = [np.nan if r is None else r for r in best["returns"]]
                    score = point_estimate(np.asarray(returns, np.float64), statistic)
                chosen = "  ".join(
                    f"{knob}={value:.4g}" + (f" (x{value / record['relative_to'][knob]:.3g})"
                                             if knob in record["relative_to"] else "")
                    for knob, value in record["chosen"].items())
                lines.append(f"  {env_id}  {name}: {chosen}  ({label} {score:.2f}; "
                             f"{budget['settings']} settings x {budget['seeds']} seeds)")
                lines += _edge_lines(record)
            for knob, reason in record["skipped"].items():
                lines.append(f"      not tuned: {knob}: {reason}")
    return "\n".join(lines)
