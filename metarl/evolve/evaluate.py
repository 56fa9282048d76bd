"""Meta-test: train fresh agents with an evolved objective and with fixed baselines.

Agents are trained from scratch on held-out seeds (a key stream separate from the one
evolution used), on the run's training tasks (``[[inner]]``) and its held-out tasks
(``[[held_out]]``, never trained on during evolution; marked "held out" in the record's
``held_out_tasks`` and in the tables), each keyed by its task label
(:attr:`metarl.evolve.config.ExperimentConfig.task_labels`: the ``env_id`` where no other
task of the run shares it). Per environment, each objective's interquartile mean, median
and mean get 95% bootstrap intervals, and the evolved objective is judged against each
baseline by the probability of improvement (paired: every objective trains on the same
keys) and the rule of :func:`metarl.stats.verdict`, all from the full learning curves; the
record keeps them compacted (:func:`metarl.curves.compact_curves`: at most 80 updates,
5 significant digits) to be plotted against the baselines.

Held-out seeds are used once. By default (``eval_seed=None``) an evaluation whose spec,
its held-out root aside, equals an earlier record's is that record again; any other
draws a root that no earlier evaluation of the run used (nor, for the seeds of replicated
evolution, of its parent or other seeds; nor one listed in ``held_out_roots.json``, see
:func:`metarl.runs.evaluations.used_eval_seeds`), skipping ``run.seed``, ``run.seed + 1``
and the tuning seed (:func:`metarl.runs.evaluations.fresh_root`, from
:data:`DEFAULT_EVAL_SEED` up). Its record names the root (``eval_seed``) and
``eval_seed_reused: false``. A root asked for on purpose (``eval_seed=``) that an earlier
evaluation with another spec already used is recorded with ``eval_seed_reused: true`` and
the ids of those records (``eval_seed_earlier_records``), and every table of its verdicts
marks them as judged on seen seeds.

Judging is three steps: the plan of every training the evaluation needs
(:func:`metarl.evolve.plan.plan_evaluation`: objective x task x setting x seeds, checked and
listed before anything trains), the store that trains or finds each of them
(:func:`metarl.evolve.plan.train_plan` through a :class:`~metarl.evolve.store.TrainingStore`)
and the verdicts computed from what the store returns
(:func:`metarl.evolve.verdicts.verdicts`). This module checks the options, writes the
record's ``spec`` and keeps the record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from inner_loops.registry import algorithm_of
from metarl.config import ConfigError
from metarl.evolve import tuning
from metarl.evolve.across import check_across, format_across, save_across_figure
from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.distill import distilled_objective
from metarl.evolve.engines import engine_of
from metarl.evolve.judging import EVOLVED, START, held_out_scores
from metarl.evolve.plan import TuningSettings, plan_evaluation, train_plan, tuning_settings
from metarl.evolve.rows import ObjectiveResult, evaluate_objective
from metarl.evolve.store import TrainingStore
from metarl.evolve.suite_verdicts import format_suite, save_suite_figure
from metarl.evolve.tuning import (
    DEFAULT_TUNE_BY,
    DEFAULT_TUNE_ROUNDS,
    DEFAULT_TUNE_SEED,
    DEFAULT_TUNE_SEEDS,
)
from metarl.evolve.verdicts import (
    SEEN_MARK,
    SEEN_NOTE,
    environment_statistics,
    format_table,
    held_out_seeds_line,
    judge,
    verdicts,
)
from metarl.objectives import available_objectives, get_objective
from metarl.runs.engine import read_config
from metarl.runs.evaluations import (
    find_same,
    fresh_root,
    list_records,
    saved_evaluation,
    used_eval_seeds,
)
from metarl.runs.layout import RunError, read_metrics
from metarl.runs.meta_params import CANDIDATE_FILES, load_meta_params, meta_params_sha256
from metarl.suites import get_suite
from metarl.sweep import GridAxis

# rows and verdicts moved to metarl.evolve.rows and .verdicts; other modules, scripts and
# notebooks still import them from here
__all__ = ["SEEN_MARK", "SEEN_NOTE", "ObjectiveResult", "default_baselines",
           "environment_statistics", "evaluate_objective", "evaluate_run", "format_table",
           "held_out_scores", "held_out_seeds_line", "judge"]
DEFAULT_EVAL_SEED = 10_007


def default_baselines(objective_name: str, inner=None) -> list[str]:
    """The baselines ``objective_name`` declares, those that fit ``inner``'s algorithm
    (all of them without ``inner``)."""
    baselines = list(get_objective(objective_name).baselines)
    if inner is None:
        return baselines
    return [name for name in baselines if _fits(name, inner)]


def _fits(objective_name: str, inner) -> bool:
    algorithm = algorithm_of(inner)
    return get_objective(objective_name).fits(algorithm.name, algorithm.slots)


def evaluate_run(run_dir: str | Path, env_ids: list[str] | None = None, seeds: int = 16,
                 baselines: list[str] | None = None, which: str = "mean",
                 eval_seed: int | None = None, total_timesteps: int | None = None,
                 rerun: bool = False, tune: bool = False,
                 tune_seeds: int = DEFAULT_TUNE_SEEDS, tune_seed: int = DEFAULT_TUNE_SEED,
                 tune_grid: Mapping[str, Sequence[float]] | None = None,
                 across: Mapping[str, Sequence[float]] | None = None,
                 distilled: Sequence[int] = (), tune_by: str = DEFAULT_TUNE_BY,
                 start: bool = False, tune_rounds: int = DEFAULT_TUNE_ROUNDS,
                 suite: str | None = None, store: TrainingStore | None = None,
                 jobs: int = 1, *, avoid_roots_of: Sequence[str | Path] = ()
                 ) -> dict[str, Any]:
    """Evaluate a run's evolved objective against baselines; saves ``evaluations/<n>.json``.

    Evaluations accumulate (:mod:`metarl.runs.evaluations`): each is saved under the next
    number with its ``spec`` (environments, seeds, evaluation seed, budget per environment,
    which meta-parameters and a digest of them, baselines, fitness settings, and with
    ``tune`` the tuning seeds, grids and statistic). When an evaluation with the same spec
    exists, it is returned instead of computed again (``report["reused"]``), unless
    ``rerun``, which computes it and replaces that record (``report["replaced"]``); a tuned
    record saved before ``tune_by`` existed counts as chosen by the mean
    (:func:`spec_with_tune_by`). ``report["path"]`` is the record's file. A declared
    baseline left out (by ``baselines``, or because it does not fit the algorithm) is named
    with the reason in ``report["not_reported"]``.

    With ``tune`` (:mod:`metarl.evolve.tuning`), every objective is first searched over its
    grid on ``tune_seeds`` tuning seeds (one program per objective, environment and
    round), the grid widened past an edge its choice is at for up to ``tune_rounds``
    rounds, and every objective then brought to the same number of settings in all
    (:func:`metarl.evolve.tuning.balance`); each is then also trained on the held-out seeds
    at the setting with the best ``tune_by`` statistic there: rows ``"<objective>
    (tuned)"`` after the rows at the default setting, and ``report["tuning"]`` keeps
    ``tune_by``, the ``budget_rule``, every round's grid, every setting's tuning scores and
    the choices.

    The held-out root: see the module docstring (``eval_seed=None`` draws a fresh one;
    ``report["eval_seed"]``, ``report["eval_seed_reused"]``).

    With ``across`` (one traced hyperparameter -> values, e.g. ``{"learning_rate":
    [1e-4, 3e-4, 1e-3]}``), every objective is also trained at each value on the same
    held-out seeds, one vmapped program per objective and environment
    (:func:`metarl.evolve.across.evaluate_across`); ``report["across"]`` keeps each value's
    IQM and mean with 95% intervals, and the figure (one line per objective over the knob,
    :func:`metarl.figures.records.plot_across`) is written to ``plots/across_<n>.png``
    (``report["across_figure"]``).

    The tasks are the run's training tasks and then its held-out tasks (``[[held_out]]``)
    unless ``env_ids`` names others; each is keyed by its task label in the record (results,
    statistics, tuning, ``across``, the spec's budgets), and the held-out ones are listed
    in ``report["held_out_tasks"]`` (and the spec) and marked "(held out)" in the tables.
    A run without held-out tasks is evaluated, and its record written, as before they
    existed.

    Args:
        run_dir: the directory of an evolution run.
        env_ids: tasks (default: the run's training and held-out tasks). Each is a task
            label of the run, or an ``env_id``: every task of the run with that id, or
            for an environment the run has no task of, the first ``[inner]`` settings
            with ``env_id`` changed and the environment's default parameters (no
            ``env_params``).
        seeds: held-out seeds per objective and environment.
        baselines: registered fixed objectives (default: those the run's objective
            declares that fit the run's algorithm, :func:`default_baselines`).
        which: ``"mean"`` (centre of the search distribution) or ``"best"`` (best
            candidate seen) meta-parameters.
        eval_seed: root of the held-out key stream; ``None`` (the default): an identical
            earlier evaluation's, else a root no earlier evaluation of the run used. Never
            ``run.seed`` or ``run.seed + 1`` (evolution's and its fitness baselines').
        total_timesteps: override the training budget of every environment.
        rerun: compute an evaluation made before again, replacing its record.
        tune: tune every objective before the held-out comparison.
        tune_seeds: tuning seeds per setting (at least 2).
        tune_seed: root of the tuning key stream; must differ from ``eval_seed``,
            ``run.seed`` and ``run.seed + 1``.
        tune_rounds: with ``tune``, the cap of widening rounds (0: the declared grids
            only); a knob still at an edge when it is reached is named in the record
            (``widening.capped``) and the printed summary.
        tune_grid: knob -> values replacing the declared grid of that knob for every
            objective that declares it (multiples of the run's value for a relative knob
            such as ``learning_rate``).
        across: one traced hyperparameter of the algorithm -> at least 2 values to
            evaluate every objective at (absolute values; see above). ``None``: no
            evaluation across a knob.
        distilled: formula numbers of the run's ``distill.json`` for the ``which``
            candidate (:mod:`metarl.evolve.distill`); each is trained as a fixed
            objective on the same held-out seeds, row ``"distilled <k>"`` after the
            baselines, and judged against the network it came from (the evolved row) as a
            baseline is. Formulas are evaluated at the run's setting only: they are not
            tuned, nor trained across a knob.
        tune_by: the statistic over the tuning seeds a tuned setting is chosen by:
            ``"iqm"`` (the interquartile mean, the default: what the held-out verdicts
            use, and robust to the few failed seeds of heavy-tailed returns such as
            Acrobot's) or ``"mean"`` (what chose before this option existed).
        start: also train the meta-parameters the search started from
            (the ``search_start`` of the run's :class:`~metarl.evolve.engines.Engine`:
            :func:`metarl.evolve.generation.search_start`, or a meta-gradient run's
            :func:`metarl.evolve.metagradient.metagradient_start`), row ``"start"`` after the
            evolved row, on the same held-out seeds, and with ``tune`` tuned as the
            evolved objective is (row ``"start (tuned)"``). The evolved objective is judged
            against it as against a baseline: whether the search did anything its
            starting point did not already do.
        store: where the trainings that do not depend on the evolved objective (the
            baselines' held-out rows, tuning, tuned rows and points across a knob; with
            ``suite`` the untrained policy's rows) are kept and found again
            (:class:`metarl.evolve.store.TrainingStore`): reused exactly by any later
            evaluation asking for the same training, here or in another run. ``None``: a
            store in memory for this call only.
        suite: a registered suite (:mod:`metarl.suites`): the tasks are every environment
            of the suite at its settings (``env_ids`` and ``total_timesteps`` must not be
            given), and the record gets a ``suite`` section, the cross-environment verdicts
            of :mod:`metarl.evolve.suite_verdicts`.
        jobs: environments trained at once, each in a thread
            (:func:`metarl.evolve.plan.train_plan`): on a CPU, one compiles while another
            trains. The results, and the record, are those of one at a time.
        avoid_roots_of: other run directories whose evaluations' held-out roots a fresh
            root also avoids (the other seeds and the parent of replicated evolution).

    Returns the report dict that is also saved as JSON.
    """
    if which not in ("mean", "best"):
        raise ConfigError(f"which: got {which!r}; allowed: mean, best")
    if seeds < 2:
        raise ConfigError(f"seeds: need at least 2 for a confidence interval, got {seeds}")
    run_dir = Path(run_dir)
    config = read_config(run_dir, config_from_dict)
    store = TrainingStore() if store is None else store
    chosen_suite = _suite_of(suite, env_ids, total_timesteps, config)
    objective = config.objective.build()
    meta_path = run_dir / CANDIDATE_FILES[which]
    learned = {EVOLVED: load_meta_params(meta_path, objective.init(jax.random.PRNGKey(0)))}
    tasks = (evaluation_tasks(config, env_ids) if chosen_suite is None
             else chosen_suite.configs())
    first = next(iter(tasks.values()))
    baselines = _checked_baselines(baselines, config.objective.name, first)
    not_reported = _not_reported(config.objective.name, baselines, first)
    formulas = {f"distilled {number}": distilled_objective(run_dir, number, which)
                for number in dict.fromkeys(distilled)}
    if total_timesteps is not None:
        tasks = {label: inner.replace(total_timesteps=total_timesteps)
                 for label, inner in tasks.items()}
    settings = tuning_settings(tune, tune_seeds, tune_seed, tune_grid, eval_seed, config,
                               baselines, tasks, tune_by, start, tune_rounds)
    if start:
        learned[START] = engine_of(config).search_start(objective, config)
    axis = check_across(across, list(tasks.values()), objective)
    held_out = [label for label in tasks if label in config.held_out_labels]
    suite_dict = None if chosen_suite is None else chosen_suite.to_dict()
    spec = _spec(config, tasks, held_out, seeds, eval_seed, which, meta_path, baselines,
                 formulas, start, settings, axis, suite_dict)
    eval_seed = _held_out_root(run_dir, spec, eval_seed, config.run.seed, tune_seed,
                               avoid_roots_of)
    spec["eval_seed"] = eval_seed
    same = find_same(run_dir, spec, normalise=spec_with_tune_by)
    seen_by = [i for i in used_eval_seeds(run_dir, DEFAULT_EVAL_SEED).get(eval_seed, [])
               if same is None or i != same["id"]]
    plan = plan_evaluation(config, tasks, objective, learned, baselines, seeds, eval_seed,
                           formulas=formulas, tune=settings, axis=axis, suite=suite_dict)

    def compute() -> dict[str, Any]:
        trained = train_plan(plan, store, jobs)
        header = _report_header(run_dir, config, which, seeds, eval_seed, seen_by, held_out,
                                not_reported)
        return {**header, **verdicts(plan, trained)}

    report = saved_evaluation(run_dir, spec, compute, rerun, normalise=spec_with_tune_by)
    if report.get("across"):
        report["across_figure"] = str(save_across_figure(run_dir, report, config.name))
    if report.get("suite"):
        report["suite_figure"] = str(save_suite_figure(run_dir, report, config.name))
    return report


def _spec(config: ExperimentConfig, tasks: Mapping[str, Any], held_out: list[str],
          seeds: int, eval_seed: int | None, which: str, meta_path: Path,
          baselines: Sequence[str], formulas: Mapping[str, Mapping[str, Any]], start: bool,
          settings: TuningSettings | None, axis: GridAxis | None,
          suite: Mapping[str, Any] | None) -> dict[str, Any]:
    """What an evaluation is of, as its record's ``spec`` says (:func:`evaluate_run`): an
    evaluation with the same spec is the same evaluation."""
    spec = {
        "environments": list(tasks),
        **({"suite": suite} if suite is not None else {}),
        **({"held_out_tasks": held_out} if held_out else {}),
        "seeds": seeds,
        "eval_seed": eval_seed,
        "total_timesteps": {label: inner.total_timesteps for label, inner in tasks.items()},
        "meta_params": which,
        "meta_params_sha256": meta_params_sha256(meta_path),
        "baselines": list(baselines),
        **({"start": True} if start else {}),
        **({"distilled": {label: table["options"] for label, table in formulas.items()}}
           if formulas else {}),
        "fitness": {"metric": config.fitness.metric,
                    "final_fraction": config.fitness.final_fraction},
    }
    if settings is not None:
        spec["tune"] = {"seeds": settings.seeds, "tune_seed": settings.seed,
                        "by": settings.by, "rounds": settings.rounds,
                        "grids": {label: {name: plan.grid for name, plan in env.items()}
                                  for label, env in settings.plans.items()}}
        if settings.rounds:  # steps not the grid's own: a record widened otherwise differs
            spec["tune"]["widen_ratios"] = {
                label: {name: plan.widen_ratios for name, plan in env.items()
                        if plan.widen_ratios}
                for label, env in settings.plans.items()}
    if axis is not None:
        spec["across"] = {axis.name: list(axis.values)}
    return spec


def _checked_baselines(baselines: Sequence[str] | None, objective_name: str, inner
                       ) -> list[str]:
    """``baselines`` (default: :func:`default_baselines`), checked: every one registered
    and fitting ``inner``'s algorithm."""
    if baselines is None:
        baselines = default_baselines(objective_name, inner)
    unknown = [b for b in baselines if b not in available_objectives()]
    if unknown:
        raise ConfigError(
            f"baselines: unknown {unknown}; allowed: {', '.join(available_objectives())}"
        )
    for name in baselines:
        if not _fits(name, inner):
            raise ConfigError(f"baselines: objective {name!r} does not fit algorithm "
                              f"{algorithm_of(inner).name!r}")
    return baselines


def _report_header(run_dir: Path, config: ExperimentConfig, which: str, seeds: int,
                   eval_seed: int, seen_by: list[Any], held_out: list[str],
                   not_reported: dict[str, str]) -> dict[str, Any]:
    """What an evaluation record says before its verdicts: the objective, which of its
    meta-parameters and their generation, the metric, the held-out seeds and whether
    earlier evaluations used them, the held-out tasks and the baselines left out."""
    try:
        generation = read_metrics(run_dir)[-1]["generation"]
    except (RunError, IndexError, KeyError):
        generation = None
    return {
        "objective": config.objective.name,
        "meta_params": which,
        "meta_params_generation": generation,
        "metric": config.fitness.metric,
        "seeds": seeds,
        "eval_seed": eval_seed,
        "eval_seed_reused": bool(seen_by),
        **({"eval_seed_earlier_records": seen_by} if seen_by else {}),
        **({"held_out_tasks": held_out} if held_out else {}),
        "not_reported": not_reported,
    }


def _suite_of(name: str | None, env_ids, total_timesteps, config: ExperimentConfig):
    """The suite ``name`` (``None`` without one), checked against the other options and
    the run's objective before anything trains."""
    if name is None:
        return None
    given = [option for option, value in (("env_ids", env_ids),
                                          ("total_timesteps", total_timesteps)) if value]
    if given:
        raise ConfigError(f"suite: sets the environments and their budgets; "
                          f"{', '.join(given)} cannot be given with it")
    chosen = get_suite(name)
    for task in chosen.tasks:
        algorithm = algorithm_of(task.config())
        if not get_objective(config.objective.name).fits(algorithm.name, algorithm.slots):
            raise ConfigError(f"suite {name!r}: task {task.label} trains "
                              f"{algorithm.name!r}, which objective "
                              f"{config.objective.name!r} does not fit")
    return chosen


def evaluation_tasks(config: ExperimentConfig, env_ids: Sequence[str] | None = None
                     ) -> dict[str, Any]:
    """``{task label: [inner] config}``: what :func:`evaluate_run` trains on. Without
    ``env_ids``, the run's training tasks and then its held-out tasks; else for each name
    (in order, each task once) the run's task of that label, or every task of the run with
    that ``env_id``, or, for an environment the run has no task of, the first ``[inner]``
    settings with ``env_id`` changed and no ``env_params``, labelled by the id."""
    known = {**dict(zip(config.task_labels, config.inner, strict=True)),
             **dict(zip(config.held_out_labels, config.held_out, strict=True))}
    if not env_ids:
        return known
    tasks: dict[str, Any] = {}
    for name in env_ids:
        if name in known:
            tasks.setdefault(name, known[name])
            continue
        matched = {label: inner for label, inner in known.items() if inner.env_id == name}
        for label, inner in (matched or {name: config.inner[0].replace(
                env_id=name, env_params=())}).items():
            tasks.setdefault(label, inner)
    return tasks


def spec_with_tune_by(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A saved evaluation's ``spec`` as :func:`evaluate_run` writes it now: a tuned spec
    saved before ``tune_by`` existed gets ``tune.by`` ``"mean"`` (what chose then), so it
    is reused for a request tuned by the mean and never for one tuned by the IQM; one saved
    before grids widened themselves gets ``tune.rounds`` 0."""
    spec = dict(spec)
    if isinstance(spec.get("tune"), Mapping) and "by" not in spec["tune"]:
        spec["tune"] = {**spec["tune"], "by": tuning.UNRECORDED_TUNE_BY}
    if isinstance(spec.get("tune"), Mapping) and "rounds" not in spec["tune"]:
        spec["tune"] = {**spec["tune"], "rounds": 0}  # saved before grids widened themselves
    return spec


def evaluate_runs(run_dirs: Sequence[str | Path], **options) -> list[dict[str, Any]]:
    """Evaluate several evolution runs with the same ``options`` (those of
    :func:`evaluate_run`), training each baseline once.

    The baselines' rows, their tuning and their points across a knob do not depend on the
    evolved objective, so runs that share ``[inner]`` settings and fitness metric (the seeds
    of one experiment, or variants such as LPO and TA-LPO) reuse them instead of training
    them again; runs that differ simply train their own. Each run's record is saved in its
    own ``evaluations/`` exactly as :func:`evaluate_run` alone would save it. All are
    evaluated on one held-out root: without ``eval_seed``, the first run's (a fresh root
    avoids the roots every run given, and those of ``avoid_roots_of``, used). Returns the
    reports in the order of ``run_dirs``."""
    store = options.pop("store", None) or TrainingStore()
    run_dirs = list(run_dirs)
    avoid = list(options.pop("avoid_roots_of", ()))
    if options.get("eval_seed") is None and run_dirs:
        # one held-out root for all: the first run's, fresh for every run given
        first = evaluate_run(run_dirs[0], store=store,
                             avoid_roots_of=[*run_dirs[1:], *avoid], **options)
        options = {**options, "eval_seed": first["eval_seed"]}
        return [first, *(evaluate_run(run_dir, store=store, **options)
                         for run_dir in run_dirs[1:])]
    return [evaluate_run(run_dir, store=store, **options)
            for run_dir in run_dirs]


def _not_reported(objective_name: str, baselines: list[str], inner) -> dict[str, str]:
    """Each baseline ``objective_name`` declares that is not evaluated, and why."""
    left_out = {}
    for name in get_objective(objective_name).baselines:
        if name in baselines:
            continue
        if not _fits(name, inner):
            left_out[name] = f"does not fit algorithm {algorithm_of(inner).name!r}"
        else:
            left_out[name] = f"left out by baselines={','.join(baselines) or 'none'}"
    return left_out


def _held_out_root(run_dir: Path, spec: Mapping[str, Any], eval_seed: int | None,
                   run_seed: int, tune_seed: int, avoid_roots_of: Sequence[str | Path]) -> int:
    """The root of the held-out keys of an evaluation with ``spec`` (its ``eval_seed``
    left out): ``eval_seed`` when given (never ``run_seed`` or ``run_seed + 1``); else
    the root of an earlier record of the same spec, or a fresh one (module docstring)."""
    kept = {run_seed: "run.seed (evolution's seeds)",
            run_seed + 1: "run.seed + 1 (the fitness baselines' seeds)"}
    if eval_seed is not None:
        if isinstance(eval_seed, bool) or not isinstance(eval_seed, int):
            raise ConfigError(f"eval_seed: expected an integer, got {eval_seed!r}")
        if eval_seed in kept:
            raise ConfigError(f"eval_seed: {eval_seed} is the root of {kept[eval_seed]}; "
                              "choose another so that held-out seeds stay apart from them, "
                              "or leave it out to draw a root no evaluation used")
        return eval_seed

    # the same request made before: its first record on seeds it did not reuse, else its
    # latest (a root asked for on purpose)
    wanted = json.dumps({**spec, "eval_seed": None}, sort_keys=True)
    same = [record for record in list_records(run_dir) if isinstance(record.get("spec"), dict)
            and json.dumps({**spec_with_tune_by(record["spec"]), "eval_seed": None},
                           sort_keys=True) == wanted]
    if same:
        fresh = [record for record in same if not record.get("eval_seed_reused")]
        chosen = fresh[0] if fresh else same[-1]
        return chosen.get("eval_seed", chosen["spec"].get("eval_seed"))
    taken = {*kept, tune_seed}
    for folder in (run_dir, *avoid_roots_of):
        taken |= set(used_eval_seeds(folder, DEFAULT_EVAL_SEED))
    return fresh_root(taken, DEFAULT_EVAL_SEED)


def format_report(report: dict[str, Any]) -> str:
    """:func:`format_table`, then the setting each objective was tuned to (a tuned
    evaluation), the cross-environment verdicts of a suite, and the declared baselines
    left out of the report, with the reason."""
    parts = [format_table(report), tuning.format_tuning(report), format_across(report),
             format_suite(report) if report.get("suite") else ""]
    left_out = report.get("not_reported") or {}
    if left_out:
        parts.append("not reported: " + "; ".join(f"{name} ({reason})"
                                                  for name, reason in left_out.items()))
    return "\n".join(part for part in parts if part)
