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
  best setting may lie beyond it: the baseline is tuned no further than its grid. Every
  record names such knobs (``at_edge``, :func:`grid_edges`) and the printed summary says to
  widen them with ``--tune-grid``; on CartPole the learning rate was chosen at its edge
  (×3) by nearly every objective.
- **Seeds.** Tuning keys are ``split(PRNGKey(tune_seed), tune_seeds)``
  (:data:`DEFAULT_TUNE_SEED` 20 011) and held-out keys ``split(PRNGKey(eval_seed), seeds)``
  (10 007); evolution draws from ``PRNGKey(run.seed)`` and measures its fitness baselines
  from ``PRNGKey(run.seed + 1)``. A ``tune_seed`` equal to any of those roots is refused,
  since keys split from one root share their first members.
"""

from __future__ import annotations

import dataclasses
import inspect
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
from metarl.stats import point_estimate
from metarl.sweep import GridAxis, check_grid, summarise_sweep, sweep_population, train_sweep

__all__ = ["DEFAULT_TUNE_BY", "DEFAULT_TUNE_SEED", "DEFAULT_TUNE_SEEDS", "Knob", "SCORES",
           "TUNE_STATISTICS", "TuningPlan", "UNRECORDED_TUNE_BY", "check_overrides",
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


@dataclass(frozen=True)
class Knob:
    """One searched knob, resolved for a run's algorithm and environment.

    Attributes:
        name: hyperparameter field or objective option.
        values: the grid as declared (multiples of the run's value where ``relative``).
        trained: the values the agents train with (absolute).
        relative, shared, option, slot: as in
            :class:`~metarl.objectives.registry.Tunable`.
    """

    name: str
    values: tuple[float, ...]
    trained: tuple[float, ...]
    relative: bool = False
    shared: bool = False
    option: bool = False
    slot: str | None = None


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


def check_tune_options(tune_seeds: Any, tune_seed: Any, eval_seed: int, run_seed: int,
                       tune_by: Any = DEFAULT_TUNE_BY) -> None:
    """Raise :class:`ConfigError` naming a bad count of tuning seeds, a tuning seed whose
    keys would not be apart from the held-out or evolution keys, or a statistic to choose
    by that is not one of :data:`TUNE_STATISTICS`."""
    if not isinstance(tune_by, str) or tune_by not in TUNE_STATISTICS:
        raise ConfigError(f"tune_by: got {tune_by!r}; allowed: "
                          + ", ".join(f"{key} ({name})" if key != name else key
                                      for key, name in TUNE_STATISTICS.items()))
    if isinstance(tune_seeds, bool) or not isinstance(tune_seeds, int) or tune_seeds < 2:
        raise ConfigError(f"tune_seeds: need at least 2 to compare settings, got {tune_seeds!r}")
    if isinstance(tune_seed, bool) or not isinstance(tune_seed, int):
        raise ConfigError(f"tune_seed: expected an integer, got {tune_seed!r}")
    taken = {eval_seed: "eval_seed (the held-out seeds)",
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
            knobs.append(Knob(tunable.name, values, values, option=True, slot=tunable.slot,
                              shared=tunable.shared))
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
        if tunable.relative:
            relative_to[field] = base
        knobs.append(Knob(field, values, trained, tunable.relative, tunable.shared))
    return TuningPlan(name, tuple(knobs), skipped, relative_to)


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
        result.append(Knob(knob_name, values, trained, relative, shared=True))
    return TuningPlan(name, tuple(result), skipped, relative_to)


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
                   tune_by: str = DEFAULT_TUNE_BY) -> dict[str, Any]:
    """Train every setting of ``plan`` × ``seeds`` tuning seeds as one program and choose.

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

    Returns the record: ``tune_by``, ``grid``, ``relative_to``, ``skipped``, every
    setting's scores (``settings``: absolute ``setting``, ``mean``, ``ci_low``,
    ``ci_high``, ``iqm``, ``invalid``, ``returns [seeds]``), the ``chosen`` setting
    (absolute values) and its index, the knobs chosen at an end of their grid (``at_edge``,
    :func:`grid_edges`), the ``budget`` (settings, seeds, runs) and the seconds
    of compilation and training. With nothing to search nothing trains and ``chosen`` is
    ``{}`` (the default setting).
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
    learner = build_learner(inner, objective)
    axes = [GridAxis(knob.name, knob.trained) for knob in plan.knobs]
    options = tuple(knob.name for knob in plan.knobs if knob.option)
    settings, keys, hypers = sweep_population(learner, axes, seeds, tune_seed, options)
    members = len(settings) * seeds
    if options:
        meta_params = _option_meta_params(plan, objective, meta_params, settings, seeds)
    elif meta_params is not None:
        meta_params = broadcast_to_population(meta_params, members)
    trained = train_sweep(learner, keys, hypers, fitness, meta_params, chunk_size, mesh)
    results = summarise_sweep(settings, seeds, trained)
    index = choose(results, tune_by)
    return {
        **record,
        "settings": [{**{key: value for key, value in dataclasses.asdict(result).items()
                         if key not in ("curves", "curve_updates")},
                      "iqm": _score(result, "iqm")}
                     for result in results],
        "chosen": dict(settings[index]),
        "chosen_index": index,
        "at_edge": grid_edges({**record, "chosen": dict(settings[index])}),
        "compile_seconds": trained["compile_seconds"],
        "train_seconds": trained["train_seconds"],
    }


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
            plan = dataclasses.replace(plan, knobs=(Knob(field, (1.0,), (default,), True),),
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


def format_tuning(report: dict[str, Any]) -> str:
    """Lines naming each objective's chosen setting and tuning score (empty when the
    evaluation was not tuned)."""
    tuning = report.get("tuning")
    if not tuning:
        return ""
    statistic = tune_by_of(tuning)
    label = "IQM" if statistic == "iqm" else statistic
    lines = [f"tuned on {tuning['seeds']} tuning seeds (tune seed {tuning['tune_seed']}); "
             f"chosen settings, best {TUNE_STATISTICS[statistic]} over the tuning seeds:"]
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
                edges = grid_edges(record)
                if edges:
                    named = ", ".join(f"{knob} (its {end})" for knob, end in edges.items())
                    lines.append(f"      at the end of its grid: {named}; the best setting "
                                 f"may lie beyond (widen with --tune-grid)")
            for knob, reason in record["skipped"].items():
                lines.append(f"      not tuned: {knob}: {reason}")
    return "\n".join(lines)
