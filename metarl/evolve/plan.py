"""The plan of an evaluation: every training it needs, listed before anything trains, and
their execution through the training store.

An evaluation (:func:`metarl.evolve.evaluate.evaluate_run`) judges objectives by what agents
trained with them score: objective x environment x setting x held-out seeds. Its plan
(:func:`plan_evaluation`, a pure function of the checked options and the run's config) is
a tuple of :class:`Training`, in this order:

- per task (in the record's order of task labels):

  - with a suite, the untrained policy's row (:data:`UNTRAINED_ROW`), the floor the suite
    normalises by;
  - the held-out rows at the default setting (:data:`HELD_OUT`): the evolved objective's,
    with ``start`` the search's starting point's, every baseline's, then every distilled
    formula's; a tuned suite, whose verdicts are the tuned rows', has the formulas' alone
    (and with them the rest);
  - with tuning, every objective's tuning search (:data:`TUNING`), then every objective's
    held-out row at the setting its search chose (:data:`TUNED_HELD_OUT`): that one needs
    its own search and default row (where the plan has one), and every search of its task,
    since each objective is balanced to the settings of the widest one (the equal budget);

- then per task the curves across a knob (:data:`ACROSS`): the evolved objective's and
  every baseline's.

An evaluation of one environment or several, tuned or not, with its starting point, of
several runs sharing one store (:func:`metarl.evolve.evaluate.evaluate_runs`) or of a suite
is such a list. :func:`train_plan` trains it in that order, which puts every training after
those it needs (all of its own task), through a
:class:`~metarl.evolve.store.TrainingStore` for every training with a
:attr:`Training.key`, several tasks at once if asked; :func:`metarl.evolve.verdicts.verdicts`
judges what it returns.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import jax

from metarl.config import ConfigError
from metarl.evolve import tuning
from metarl.evolve.across import evaluate_across
from metarl.evolve.config import ExperimentConfig
from metarl.evolve.generation import build_learner
from metarl.evolve.judging import EVOLVED, START, TUNED
from metarl.evolve.rows import (
    ObjectiveResult,
    evaluate_objective,
    fixed_objective,
    row_of,
    row_payload,
)
from metarl.evolve.store import TrainingStore, params_digest
from metarl.evolve.suite_verdicts import UNTRAINED, untrained_hypers
from metarl.objectives import make_objective
from metarl.sharding import run_mesh
from metarl.sweep import GridAxis

__all__ = ["ACROSS", "EQUAL_BUDGET", "HELD_OUT", "KINDS", "TUNED_HELD_OUT", "TUNING",
           "UNTRAINED_ROW", "EvaluationPlan", "Training", "TuningSettings", "config_part",
           "plan_evaluation", "train_plan", "tuning_settings"]

# the kinds of training, named as the store's keys name them
HELD_OUT = "held out"
TUNING = "tuned"
TUNED_HELD_OUT = "tuned held out"
ACROSS = "across"
UNTRAINED_ROW = "untrained"
KINDS = (UNTRAINED_ROW, HELD_OUT, TUNING, TUNED_HELD_OUT, ACROSS)


class _EqualBudget:
    def __repr__(self) -> str:
        return "EQUAL_BUDGET"


EQUAL_BUDGET = _EqualBudget()  # in a key: the settings of the widest search of the task


@dataclass(frozen=True)
class Training:
    """One training of a plan: objective ``name`` on task ``task``, as ``kind`` says.

    A training is named by ``kind``, ``name`` and ``task`` alone (equality and hashing
    look at nothing else, and a plan lists each once); the other fields say how it trains.

    Attributes:
        kind: one of :data:`KINDS`.
        name: the row's objective: ``"evolved"``, ``"start"``, a baseline's registered
            name, ``"distilled <k>"``, or the untrained policy.
        task: the label of the task it trains on.
        inner: that task's ``[inner]`` config, at the evaluation's budget.
        objective: the objective it trains with.
        meta_params: its meta-parameters; ``None``: the objective's initialisation (a
            fixed objective's).
        search: the objective's :class:`~metarl.evolve.tuning.TuningPlan` on this task
            (tuning searches and tuned rows only).
        key: what the store keys it by (:meth:`~metarl.evolve.store.TrainingStore.get`), a
            tuned row's with :data:`EQUAL_BUDGET` where the count of settings of its task's
            widest search goes; ``None``: trained by every evaluation, never stored (a
            distilled formula's row, the evolved objective across a knob).
    """

    kind: str
    name: str
    task: str
    inner: Any = field(default=None, compare=False, repr=False)
    objective: Any = field(default=None, compare=False, repr=False)
    meta_params: Any = field(default=None, compare=False, repr=False)
    search: tuning.TuningPlan | None = field(default=None, compare=False, repr=False)
    key: tuple | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TuningSettings:
    """How a tuned evaluation tunes (:mod:`metarl.evolve.tuning`): ``seeds`` tuning seeds
    from root ``seed``, the setting chosen by the statistic ``by``, grids widened for up to
    ``rounds`` rounds; ``plans``: task label -> objective -> its
    :class:`~metarl.evolve.tuning.TuningPlan` (the learned objectives first)."""

    seeds: int
    seed: int
    by: str
    rounds: int
    plans: Mapping[str, Mapping[str, tuning.TuningPlan]]


@dataclass(frozen=True)
class EvaluationPlan:
    """Every training of one evaluation (module docstring).

    Attributes:
        config: the run's experiment config (its fitness metric, chunking and sharding).
        tasks: task label -> ``[inner]`` config, in the record's order.
        seeds, eval_seed: held-out seeds per objective and task, and their root.
        trainings: every training, each after those it needs.
        tuning: how the objectives are tuned; ``None``: not tuned.
        axis: the knob every objective is also trained across; ``None``: none.
        suite: the suite's :meth:`~metarl.suites.Suite.to_dict`; ``None``: no suite.
    """

    config: ExperimentConfig
    tasks: Mapping[str, Any]
    seeds: int
    eval_seed: int
    trainings: tuple[Training, ...]
    tuning: TuningSettings | None = None
    axis: GridAxis | None = None
    suite: Mapping[str, Any] | None = None

    def of_kind(self, kind: str, task: str | None = None) -> list[Training]:
        """The trainings of ``kind`` (on ``task`` only, when given), in the plan's order."""
        return [t for t in self.trainings if t.kind == kind and task in (None, t.task)]


def config_part(config: ExperimentConfig) -> dict[str, Any]:
    """What of an experiment config a baseline's training reads: the fitness metric,
    chunking and sharding."""
    return {"fitness": [config.fitness.metric, config.fitness.final_fraction],
            "chunk_size": config.run.chunk_size, "shard": config.run.shard}


def tuning_settings(tune: bool, tune_seeds: int, tune_seed: int,
                    tune_grid: Mapping[str, Sequence[float]] | None, eval_seed: int | None,
                    config: ExperimentConfig, baselines: Sequence[str],
                    tasks: Mapping[str, Any], tune_by: str = tuning.DEFAULT_TUNE_BY,
                    start: bool = False, tune_rounds: int = tuning.DEFAULT_TUNE_ROUNDS
                    ) -> TuningSettings | None:
    """The tuning of an evaluation of ``tasks`` (``{label: [inner] config}``), its plans
    per task and objective (the evolved objective first, then with ``start`` the search's
    starting point on the same budget, then ``baselines``), checked before anything
    trains; ``None`` without ``tune``, where no tuning option may be given."""
    if not tune:
        given = [name for name, value, default in (
            ("tune_seeds", tune_seeds, tuning.DEFAULT_TUNE_SEEDS),
            ("tune_seed", tune_seed, tuning.DEFAULT_TUNE_SEED), ("tune_grid", tune_grid, None),
            ("tune_by", tune_by, tuning.DEFAULT_TUNE_BY),
            ("tune_rounds", tune_rounds, tuning.DEFAULT_TUNE_ROUNDS))
            if value != default and not (name == "tune_grid" and not value)]
        if given:
            raise ConfigError(f"{', '.join(given)}: only with tune=True (--tune)")
        return None
    tuning.check_tune_options(tune_seeds, tune_seed, eval_seed, config.run.seed, tune_by,
                              tune_rounds)
    overrides = tuning.check_overrides(tune_grid, baselines)
    learned = (EVOLVED, START) if start else (EVOLVED,)
    plans = {}
    for label, inner in tasks.items():
        baseline_plans = [tuning.objective_plan(name, inner, overrides) for name in baselines]
        plans[label] = {**{name: tuning.evolved_plan(name, baseline_plans) for name in learned},
                        **{plan.objective: plan for plan in baseline_plans}}
    return TuningSettings(tune_seeds, tune_seed, tune_by, tune_rounds, plans)


def plan_evaluation(config: ExperimentConfig, tasks: Mapping[str, Any], objective,
                    learned: Mapping[str, Any], baselines: Sequence[str], seeds: int,
                    eval_seed: int, *, formulas: Mapping[str, Mapping[str, Any]] | None = None,
                    tune: TuningSettings | None = None, axis: GridAxis | None = None,
                    suite: Mapping[str, Any] | None = None) -> EvaluationPlan:
    """The plan of an evaluation (module docstring); nothing trains.

    Args:
        config: the run's experiment config.
        tasks: task label -> ``[inner]`` config (at the evaluation's budget).
        objective: the run's objective, which every learned row trains with.
        learned: name -> meta-parameters of the learned rows: ``"evolved"`` first, then
            with ``start`` ``"start"``.
        baselines: registered fixed objectives, each at its default options.
        seeds, eval_seed: held-out seeds per objective and task, and their root.
        formulas: row name (``"distilled <k>"``) -> ``[objective]`` table of a distilled
            formula, trained at the default setting only.
        tune: :func:`tuning_settings`; ``None``: not tuned.
        axis: a knob to train every objective across (the evolved one and the
            baselines); ``None``: none.
        suite: the suite's :meth:`~metarl.suites.Suite.to_dict`, whose normalisation
            needs the untrained policy's rows; ``None``: no suite.
    """
    part = config_part(config)
    digests = {name: params_digest(params) for name, params in learned.items()}
    # A tuned suite judges its tuned rows alone (metarl.evolve.suite_verdicts): rows at
    # the default setting would be trained for no verdict. A distilled formula is judged
    # against the evolved objective's default row, so it keeps them.
    at_default = suite is None or tune is None or bool(formulas)

    def make(kind: str, name: str, task: str, *parts, search=None, stored=True):
        if name in learned:
            trained, params = objective, learned[name]
            identity = ("learned", name, config.objective, digests[name])
        else:
            trained, params, identity = fixed_objective(name), None, ("baseline", name)
        return Training(kind, name, task, tasks[task], trained, params, search,
                        (kind, identity, *parts, part) if stored else None)

    trainings = []
    for task, inner in tasks.items():
        if suite is not None:
            trainings.append(Training(UNTRAINED_ROW, UNTRAINED, task, inner,
                                      fixed_objective("ppo"),
                                      key=(UNTRAINED_ROW, inner, part, seeds, eval_seed)))
        if at_default:
            trainings += [make(HELD_OUT, name, task, inner, seeds, eval_seed)
                          for name in (*learned, *baselines)]
        # a formula's row and the evolved curve across a knob were never stored: they
        # stay out, so that the store holds what it always held
        trainings += [Training(HELD_OUT, label, task, inner,
                               make_objective(table["name"], **table["options"]))
                      for label, table in (formulas or {}).items()]
        if tune is not None:
            settings = (tune.seeds, tune.seed, tune.by, tune.rounds)
            searches = tune.plans[task].values()
            trainings += [make(TUNING, s.objective, task, s, inner, *settings, search=s)
                          for s in searches]
            trainings += [make(TUNED_HELD_OUT, s.objective, task, s, inner, seeds, eval_seed,
                               *settings, EQUAL_BUDGET, search=s) for s in searches]
    if axis is not None:
        for task, inner in tasks.items():
            trainings.append(make(ACROSS, EVOLVED, task, stored=False))
            trainings += [make(ACROSS, name, task, inner, axis.name, axis.values, seeds,
                               eval_seed) for name in baselines]
    return EvaluationPlan(config, dict(tasks), seeds, eval_seed, tuple(trainings), tune,
                          axis, suite)


def train_plan(plan: EvaluationPlan, store: TrainingStore, jobs: int = 1
               ) -> dict[Training, Any]:
    """Every training of ``plan``, trained in the plan's order or found in ``store``:
    training -> its result, labelled by its task. A row (held out, distilled, untrained)
    is an :class:`~metarl.evolve.rows.ObjectiveResult`; a tuning search its record
    (:func:`metarl.evolve.tuning.tune_objective`); a tuned row ``(record with the
    settings it was balanced to, row)``; a curve across a knob its points
    (:func:`metarl.evolve.across.evaluate_across`).

    ``jobs`` tasks train at once, each in a thread of its own, its trainings in the plan's
    order (a training needs only trainings of its own task), the tasks with the most
    sequential steps first. On a CPU, compiling a program keeps one core busy while
    training keeps every core busy, so one task compiles while another trains. Every
    result is the one trained alone. When a training fails or the process is interrupted,
    the other tasks stop after the training they are in, which the store keeps."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs: expected a whole number of tasks at once, at least 1, "
                          f"got {jobs!r}")
    by_task: dict[str, list[Training]] = {}
    for training in plan.trainings:
        by_task.setdefault(training.task, []).append(training)
    results: dict[Training, Any] = {}
    if jobs == 1 or len(by_task) < 2:
        for training in _with_progress(plan):
            results[training] = _train(training, plan, store, results)
        return results

    stop = threading.Event()

    def train_task(trainings: list[Training]) -> dict[Training, Any]:
        done: dict[Training, Any] = {}
        for training in trainings:
            if stop.is_set():
                break
            done[training] = _train(training, plan, store, done)
        return done

    # the dearest tasks first, so that the last to finish is a cheap one rather than one
    # that then trains alone while the other cores wait
    order = sorted(by_task, key=lambda task: -_sequential_steps(plan.tasks[task]))
    with ThreadPoolExecutor(min(jobs, len(by_task)), "metarl-task") as pool, \
            _progress_bar(len(by_task)) as bar:
        futures = [pool.submit(train_task, by_task[task]) for task in order]
        try:
            for future in as_completed(futures):
                results.update(future.result())
                bar.update()
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise
    return {training: results[training] for training in plan.trainings}


def _sequential_steps(inner) -> int:
    """Steps one environment of a task's agent takes one after another (its budget over
    its environments in parallel): what a task's training time grows with."""
    return inner.total_timesteps // max(1, getattr(inner, "num_envs", 1))


def _train(training: Training, plan: EvaluationPlan, store: TrainingStore,
           results: Mapping[Training, Any]) -> Any:
    """One training of ``plan`` (``results``: those of its task so far), trained or found
    in ``store``, labelled by its task."""
    way = _WAYS[training.kind]
    compute = functools.partial(way.train, training, plan, results)
    if training.key is None:
        answer = compute()
    else:
        key = tuple(_equal_budget(plan, results, training.task) if part is EQUAL_BUDGET
                    else part for part in training.key)
        answer = store.get(key, compute, way.encode, way.decode)
    return way.label(answer, training.task)


def _progress_bar(total: int):
    """A progress bar over ``total`` environments, shown on a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="environments", unit="env", leave=False, disable=None)


def _with_progress(plan: EvaluationPlan) -> Iterator[Training]:
    """``plan.trainings``, with a progress bar on a terminal when there are several
    environments: one step when an environment's trainings (the curves across a knob
    aside) are done."""
    if len(plan.tasks) < 2:
        yield from plan.trainings
        return
    left = Counter(t.task for t in plan.trainings if t.kind != ACROSS)
    with _progress_bar(len(plan.tasks)) as bar:
        for training in plan.trainings:
            yield training
            if training.kind != ACROSS:
                left[training.task] -= 1
                if not left[training.task]:
                    bar.update()


def _equal_budget(plan: EvaluationPlan, results: Mapping[Training, Any], task: str) -> int:
    """The settings the widest tuning search of ``task`` ended with: every objective's
    tuned row gets as many."""
    return max(results[t]["budget"]["settings"] for t in plan.of_kind(TUNING, task))


def _initial(training: Training):
    """The meta-parameters ``training`` trains with."""
    if training.meta_params is None:
        return training.objective.init(jax.random.PRNGKey(0))
    return training.meta_params


def _held_out_row(training: Training, plan: EvaluationPlan, results) -> ObjectiveResult:
    return evaluate_objective(training.objective, _initial(training), training.inner,
                              plan.config.fitness, plan.seeds, plan.eval_seed, training.name)


def _untrained_row(training: Training, plan: EvaluationPlan, results) -> ObjectiveResult:
    # PPO's own losses under Adam: at learning rate 0 nothing moves (a learned
    # optimiser might ignore the rate), so the row is the environment's alone
    hypers = untrained_hypers(build_learner(training.inner, training.objective))
    return evaluate_objective(training.objective, _initial(training), training.inner,
                              plan.config.fitness, plan.seeds, plan.eval_seed, UNTRAINED,
                              hypers=hypers)


def _search(training: Training, plan: EvaluationPlan, results) -> dict[str, Any]:
    """The tuning record of one objective on one task, widened for up to ``rounds``
    rounds (:func:`metarl.evolve.tuning.tune_objective`)."""
    settings, run = plan.tuning, plan.config.run
    return tuning.tune_objective(training.search, training.objective, training.inner,
                                 plan.config.fitness, settings.seeds, settings.seed,
                                 training.meta_params, run.chunk_size, run_mesh(run.shard),
                                 settings.by, settings.rounds)


def _tuned_row(training: Training, plan: EvaluationPlan, results
               ) -> tuple[dict[str, Any], ObjectiveResult]:
    """The objective's search balanced to the equal budget
    (:func:`metarl.evolve.tuning.balance_objective`), and its row on the held-out seeds at
    the setting that chose: ``(record, "<objective> (tuned)" row)``. A choice equal to the
    default setting reuses the default row (the same keys and settings), or trains it
    where the plan has none."""
    settings, run, name = plan.tuning, plan.config.run, training.name
    record = dict(tuning.balance_objective(
        training.search, results[Training(TUNING, name, training.task)],
        _equal_budget(plan, results, training.task), training.objective, training.inner,
        plan.config.fitness, settings.seeds, settings.seed, training.meta_params,
        run.chunk_size, run_mesh(run.shard)))
    objective, meta_params = training.objective, training.meta_params
    hypers, options, is_default = tuning.chosen_values(
        training.search, record, build_learner(training.inner, objective), name)
    record["held_out_at_default"] = is_default
    if is_default:
        default_row = results.get(Training(HELD_OUT, name, training.task))
        if default_row is None:  # a tuned suite trains no default rows: this one trains it
            default_row = _held_out_row(training, plan, results)
        return record, dataclasses.replace(default_row, objective=name + TUNED)
    if options:
        objective = make_objective(name, **options)
    if name not in (EVOLVED, START):  # a baseline, at its tuned options' initialisation
        meta_params = objective.init(jax.random.PRNGKey(0))
    return record, evaluate_objective(objective, meta_params, training.inner,
                                      plan.config.fitness, plan.seeds, plan.eval_seed,
                                      name + TUNED, hypers=hypers, label=training.task)


def _curve(training: Training, plan: EvaluationPlan, results) -> list[dict[str, Any]]:
    return evaluate_across(training.objective, _initial(training), training.inner,
                           plan.config.fitness, plan.axis, plan.seeds, plan.eval_seed,
                           plan.config.run.chunk_size, run_mesh(plan.config.run.shard))


def _tuned_payload(pair) -> dict[str, Any]:
    record, row = pair
    return {"record": record, "row": row_payload(row)}


def _tuned_pair(payload) -> tuple[dict[str, Any], ObjectiveResult]:
    return payload["record"], row_of(payload["row"])


def _labelled_row(row: ObjectiveResult, task: str) -> ObjectiveResult:
    return dataclasses.replace(row, env_id=task)


def _labelled_pair(pair, task: str):
    record, row = pair
    return record, _labelled_row(row, task)


@dataclass(frozen=True)
class _Way:
    """How a kind of training trains (``train(training, plan, results so far)``), is kept
    in the store (``encode``, ``decode``) and is labelled by its task (``label``)."""

    train: Callable[..., Any]
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    label: Callable[[Any, str], Any] = lambda answer, task: answer


_WAYS = {
    UNTRAINED_ROW: _Way(_untrained_row, row_payload, row_of, _labelled_row),
    HELD_OUT: _Way(_held_out_row, row_payload, row_of, _labelled_row),
    TUNING: _Way(_search, dict, dict),
    TUNED_HELD_OUT: _Way(_tuned_row, _tuned_payload, _tuned_pair, _labelled_pair),
    ACROSS: _Way(_curve, list, list),
}
