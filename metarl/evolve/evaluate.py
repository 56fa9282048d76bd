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
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from inner_loops.registry import algorithm_of
from metarl.config import ConfigError
from metarl.curves import CURVE_UPDATES, compact_curves
from metarl.evolve import tuning
from metarl.evolve.across import check_across, evaluate_across, format_across, save_across_figure
from metarl.evolve.config import ExperimentConfig, FitnessConfig, config_from_dict
from metarl.evolve.distill import distilled_objective
from metarl.evolve.engines import engine_of
from metarl.evolve.fitness import run_is_valid, run_return
from metarl.evolve.generation import build_learner
from metarl.evolve.judging import EVOLVED, START, comparison_pairs, held_out_scores, text_table
from metarl.evolve.store import TrainingStore, params_digest
from metarl.evolve.suite_verdicts import (
    UNTRAINED,
    format_suite,
    save_suite_figure,
    suite_section,
    untrained_hypers,
)
from metarl.evolve.tuning import (
    DEFAULT_TUNE_BY,
    DEFAULT_TUNE_ROUNDS,
    DEFAULT_TUNE_SEED,
    DEFAULT_TUNE_SEEDS,
)
from metarl.objectives import available_objectives, get_objective, make_objective
from metarl.programs import shared_program
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
from metarl.sharding import run_mesh
from metarl.stats import (
    AGGREGATES,
    CONFIDENCE,
    RESAMPLES,
    SEED,
    aggregate,
    aggregates,
    probability_of_improvement,
    verdict,
)
from metarl.suites import get_suite

__all__ = ["SEEN_MARK", "SEEN_NOTE", "ObjectiveResult", "default_baselines",
           "environment_statistics", "evaluate_objective", "evaluate_run", "format_table",
           "held_out_scores", "held_out_seeds_line", "judge"]
DEFAULT_EVAL_SEED = 10_007
SEEN_MARK = " *"  # after a verdict judged on held-out seeds an earlier evaluation used
SEEN_NOTE = ("judged on seen seeds: earlier evaluations already used these held-out seeds, "
             "so this verdict is no fresh test")


@dataclass(frozen=True)
class ObjectiveResult:
    """Held-out performance of one objective on one environment.

    Attributes:
        objective: ``"evolved"`` or a baseline's registered name.
        env_id: the task's label: its environment id, with its ``env_params`` where another
            task of the run shares the id (:func:`metarl.evolve.config.task_labels`).
        returns: ``[S]`` score of each seed (the run's fitness metric).
        mean, ci_low, ci_high: mean over valid seeds and its 95% bootstrap interval
            (:func:`metarl.stats.aggregate`).
        invalid: seeds whose training produced NaN or inf.
        curves: ``[S, K]`` episode return at the updates ``curve_updates`` (None before the
            first finished episode), compacted by :func:`metarl.curves.compact_curves`.
        steps_per_update: environment steps one agent takes per update (the curves' x unit).
        valid: ``[S]`` whether each seed's training stayed finite (records written before
            this field have none: a seed is then valid when its return is finite).
        curve_updates: ``[K]`` 1-based update number of each point of ``curves`` (records
            written before curves were compacted have none: their points are ``1..U``).
    """

    objective: str
    env_id: str
    returns: list[float]
    mean: float
    ci_low: float
    ci_high: float
    invalid: int
    curves: list[list[float]]
    steps_per_update: int | None = None
    valid: list[bool] | None = None
    curve_updates: list[int] | None = None


def evaluate_objective(objective, meta_params, inner, fitness: FitnessConfig,
                       seeds: int, eval_seed: int, name: str, hypers=None,
                       label: str | None = None) -> ObjectiveResult:
    """Train ``seeds`` agents of ``inner``'s algorithm with ``objective`` (one jitted vmap)
    and summarise them; ``hypers`` (the learner's ``Hyperparams``, shared by every seed)
    replaces ``inner``'s hyperparameters, e.g. at a tuned setting. ``label`` names the
    task in the result (default ``inner.env_id``)."""
    learner = build_learner(inner, objective)
    keys = jax.random.split(jax.random.PRNGKey(eval_seed), seeds)
    # One jitted program per objective and [inner] table in a process (compiled once per
    # seed count), the hyperparameters traced: the default and the tuned row, the untrained
    # policy (learning rate 0), the baselines of several runs and a run evaluated again
    # all reuse it (compiling dominates on a CPU).
    program = shared_program(("evaluate", objective, inner),
                             lambda: jax.jit(jax.vmap(learner.train, in_axes=(0, None, None))))
    metrics = program(keys, meta_params, learner.default_hypers if hypers is None else hypers)
    returns = np.asarray(run_return(metrics, fitness))
    valid = np.asarray(run_is_valid(metrics, returns))
    mean = aggregate(returns[valid], "mean")
    compact = compact_curves(np.asarray(metrics["episode_return"], np.float64))
    return ObjectiveResult(
        objective=name,
        env_id=inner.env_id if label is None else label,
        returns=[float(r) for r in returns],
        mean=mean.value,
        ci_low=mean.low,
        ci_high=mean.high,
        invalid=int((~valid).sum()),
        curves=compact["curves"],
        steps_per_update=learner.steps_per_update,
        valid=[bool(v) for v in valid],
        curve_updates=compact[CURVE_UPDATES],
    )


def judge(evolved: str, baseline: str, evolved_scores, baseline_scores, paired: bool,
          resamples: int = RESAMPLES) -> dict[str, Any]:
    """The comparison of ``evolved_scores [S]`` with ``baseline_scores [S']`` (paired:
    trained on the same seeds, ``S == S'``): P(improvement) of ``evolved`` over
    ``baseline`` with its 95% interval and :func:`metarl.stats.verdict`, as saved in an
    evaluation record."""
    estimate = probability_of_improvement(evolved_scores, baseline_scores, paired=paired,
                                          resamples=resamples)
    return {"evolved": evolved, "baseline": baseline,
            "probability_of_improvement": estimate.value, "low": estimate.low,
            "high": estimate.high, "paired": paired,
            "verdict": verdict(estimate.low, estimate.high)}


def environment_statistics(results: Sequence[Mapping[str, Any]], resamples: int = RESAMPLES
                           ) -> dict[str, Any]:
    """The statistics of an evaluation's ``results`` (saved :class:`ObjectiveResult`
    dicts), per environment: each objective's IQM, median and mean with intervals
    (``objectives``) and the comparisons of :func:`comparison_pairs` (``comparisons``,
    each from :func:`judge`), every interval from ``resamples`` bootstrap resamples. The
    objectives of one evaluation train on the same held-out keys, so a comparison is paired
    wherever both have as many seeds."""
    environments = {}
    for env_id in dict.fromkeys(r["env_id"] for r in results):
        scores = {r["objective"]: held_out_scores(r) for r in results if r["env_id"] == env_id}
        environments[env_id] = {
            "objectives": {name: {metric: estimate.to_dict() for metric, estimate
                                  in aggregates(values, resamples=resamples).items()}
                           for name, values in scores.items()},
            "comparisons": [judge(evolved, baseline, scores[evolved], scores[baseline],
                                  paired=scores[evolved].size == scores[baseline].size,
                                  resamples=resamples)
                            for evolved, baseline in comparison_pairs(list(scores))],
        }
    return {"confidence": CONFIDENCE, "resamples": resamples, "seed": SEED,
            "environments": environments}


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
                 suite: str | None = None, store: TrainingStore | None = None, *,
                 avoid_roots_of: Sequence[str | Path] = ()) -> dict[str, Any]:
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
    (:func:`evaluate_across`); ``report["across"]`` keeps each value's IQM and mean with
    95% intervals, and the figure (one line per objective over the knob,
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
    template = objective.init(jax.random.PRNGKey(0))
    meta_path = run_dir / CANDIDATE_FILES[which]
    meta_params = load_meta_params(meta_path, template)
    tasks = (evaluation_tasks(config, env_ids) if chosen_suite is None
             else chosen_suite.configs())
    first = next(iter(tasks.values()))
    if baselines is None:
        baselines = default_baselines(config.objective.name, first)
    unknown = [b for b in baselines if b not in available_objectives()]
    if unknown:
        raise ConfigError(
            f"baselines: unknown {unknown}; allowed: {', '.join(available_objectives())}"
        )
    for name in baselines:
        if not _fits(name, first):
            raise ConfigError(f"baselines: objective {name!r} does not fit algorithm "
                              f"{algorithm_of(first).name!r}")
    not_reported = _not_reported(config.objective.name, baselines, first)
    formulas = {f"distilled {number}": distilled_objective(run_dir, number, which)
                for number in dict.fromkeys(distilled)}
    if total_timesteps is not None:
        tasks = {label: inner.replace(total_timesteps=total_timesteps)
                 for label, inner in tasks.items()}
    held_out = [label for label in tasks if label in config.held_out_labels]
    inners = list(tasks.values())
    spec = {
        "environments": list(tasks),
        **({"suite": chosen_suite.to_dict()} if chosen_suite is not None else {}),
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
    plans = _tuning_plans(tune, tune_seeds, tune_seed, tune_grid, eval_seed, config,
                          baselines, tasks, tune_by, start, tune_rounds)
    learned = {EVOLVED: meta_params}
    if start:
        learned[START] = engine_of(config).search_start(objective, config)
    if tune:
        spec["tune"] = {"seeds": tune_seeds, "tune_seed": tune_seed, "by": tune_by,
                        "rounds": tune_rounds,
                        "grids": {label: {name: plan.grid for name, plan in env.items()}
                                  for label, env in plans.items()}}
    axis = check_across(across, inners, objective)
    if axis is not None:
        spec["across"] = {axis.name: list(axis.values)}
    eval_seed = _held_out_root(run_dir, spec, eval_seed, config.run.seed, tune_seed,
                               avoid_roots_of)
    spec["eval_seed"] = eval_seed
    same = find_same(run_dir, spec, normalise=spec_with_tune_by)
    seen_by = [i for i in used_eval_seeds(run_dir, DEFAULT_EVAL_SEED).get(eval_seed, [])
               if same is None or i != same["id"]]

    # every training of the plan goes through the store, keyed by what determines it: a
    # learned objective by its config and a digest of its meta-parameters, so a stopped
    # evaluation asked again resumes with what it had trained
    digests = {name: params_digest(params) for name, params in learned.items()}

    def stored(kind: str, name: str, parts: tuple, compute, encode=_row_payload,
               decode=lambda payload: ObjectiveResult(**payload)):
        identity = (("learned", name, config.objective, digests[name]) if name in learned
                    else ("baseline", name))
        return store.get((kind, identity, *parts, _config_part(config)), compute, encode,
                         decode)

    def trained_as(name: str):
        """``(objective, meta-parameters)`` a row named ``name`` trains with."""
        if name in learned:
            return objective, learned[name]
        return fixed_objective(name), None

    def compute() -> dict[str, Any]:
        results, tuned, records, untrained = [], [], {}, {}
        for task, inner in _over_environments(tasks):
            if chosen_suite is not None:
                untrained[task] = _untrained(inner, config, seeds, eval_seed, task,
                                             store).__dict__
            rows = []
            for name in (*learned, *baselines):
                def train_row(name=name, inner=inner):
                    trained, params = trained_as(name)
                    if params is None:
                        params = trained.init(jax.random.PRNGKey(0))
                    return evaluate_objective(trained, params, inner, config.fitness, seeds,
                                              eval_seed, name)
                row = stored("held out", name, (inner, seeds, eval_seed), train_row)
                rows.append(dataclasses.replace(row, env_id=task))
            results += rows
            for label, table in formulas.items():
                formula = make_objective(table["name"], **table["options"])
                results.append(evaluate_objective(formula, formula.init(jax.random.PRNGKey(0)),
                                                  inner, config.fitness, seeds, eval_seed,
                                                  label, label=task))
            if tune:
                searched = {}
                for plan in plans[task].values():
                    def search_it(plan=plan, inner=inner):
                        return _tune(plan, objective, learned.get(plan.objective), inner,
                                     config, tune_seeds, tune_seed, tune_by, tune_rounds)
                    searched[plan.objective] = stored(
                        "tuned", plan.objective, (plan, inner, tune_seeds, tune_seed, tune_by,
                                                  tune_rounds), search_it, dict, dict)
                # equal budget: every objective gets as many settings as the one with most
                count = max(record["budget"]["settings"] for record in searched.values())
                records[task] = {}
                for row, plan in zip(rows, plans[task].values(), strict=True):
                    def finish(plan=plan, row=row, inner=inner, task=task,
                               searched=searched, count=count):
                        params = learned.get(plan.objective)
                        record = _balance(plan, searched[plan.objective], count, objective,
                                          params, inner, config, tune_seeds, tune_seed)
                        return _evaluate_tuned(plan, record, row, objective, params, inner,
                                               config, seeds, eval_seed, task)
                    record, tuned_row = stored(
                        "tuned held out", plan.objective,
                        (plan, inner, seeds, eval_seed, tune_seeds, tune_seed, tune_by,
                         tune_rounds, count), finish, _tuned_payload, _tuned_pair)
                    records[task][plan.objective] = record
                    tuned.append(dataclasses.replace(tuned_row, env_id=task))
        results += tuned
        dicts = [r.__dict__ for r in results]
        statistics = environment_statistics(dicts)
        section = None
        if axis is not None:
            section = {"knob": axis.name, "values": list(axis.values), "seeds": seeds,
                       "eval_seed": eval_seed, "metric": config.fitness.metric,
                       "environments": {}}
            mesh = run_mesh(config.run.shard)
            for task, inner in tasks.items():
                curves = {EVOLVED: evaluate_across(objective, meta_params, inner,
                                                   config.fitness, axis, seeds, eval_seed,
                                                   config.run.chunk_size, mesh)}
                for name in baselines:
                    def across_it(name=name, inner=inner):
                        baseline = fixed_objective(name)
                        return evaluate_across(
                            baseline, baseline.init(jax.random.PRNGKey(0)), inner,
                            config.fitness, axis, seeds, eval_seed, config.run.chunk_size,
                            mesh)
                    curves[name] = stored("across", name, (inner, axis.name, axis.values,
                                                           seeds, eval_seed),
                                          across_it, list, list)
                section["environments"][task] = curves
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
            **({"tuning": {"seeds": tune_seeds, "tune_seed": tune_seed, "tune_by": tune_by,
                           "rounds": tune_rounds, "score": tuning.SCORES[tune_by],
                           "budget_rule": tuning.WIDENING_BUDGET_RULE,
                           "environments": records}}
               if tune else {}),
            **({"across": section} if section is not None else {}),
            "results": dicts,
            "statistics": statistics,
            **({"suite": suite_section(
                chosen_suite.to_dict(), dicts, untrained,
                [task for task, inner in tasks.items()
                 if inner.env_id in {trained.env_id for trained in config.inner}],
                statistics, records if tune else None)} if chosen_suite is not None else {}),
        }

    report = saved_evaluation(run_dir, spec, compute, rerun, normalise=spec_with_tune_by)
    if report.get("across"):
        report["across_figure"] = str(save_across_figure(run_dir, report, config.name))
    if report.get("suite"):
        report["suite_figure"] = str(save_suite_figure(run_dir, report, config.name))
    return report


def _over_environments(tasks: Mapping[str, Any]):
    """``tasks.items()``, with a progress bar on a terminal when there are several."""
    if len(tasks) < 2:
        return tasks.items()
    from tqdm.auto import tqdm

    return tqdm(tasks.items(), total=len(tasks), desc="environments", unit="env",
                leave=False, disable=None)


@functools.cache
def fixed_objective(name: str):
    """The registered objective ``name`` at its default options, built once per process:
    every training of a baseline then shares its compiled programs (its default and tuned
    held-out rows, its tuning rounds and their balancing)."""
    return make_objective(name)


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


def _untrained(inner, config, seeds: int, eval_seed: int, label: str,
               store: TrainingStore) -> ObjectiveResult:
    """The untrained policy's row (learning rate 0) on the held-out seeds: the floor a
    suite normalises by (:mod:`metarl.evolve.suite_verdicts`)."""
    def train() -> ObjectiveResult:
        # PPO's own losses under Adam: at learning rate 0 nothing moves (a learned
        # optimiser might ignore the rate), so the row is the environment's alone
        ppo = fixed_objective("ppo")
        hypers = untrained_hypers(build_learner(inner, ppo))
        return evaluate_objective(ppo, ppo.init(jax.random.PRNGKey(0)), inner,
                                  config.fitness, seeds, eval_seed, UNTRAINED, hypers=hypers)

    row = store.get(("untrained", inner, _config_part(config), seeds, eval_seed), train,
                    _row_payload, lambda payload: ObjectiveResult(**payload))
    return dataclasses.replace(row, env_id=label)


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


def _row_payload(row: ObjectiveResult) -> dict[str, Any]:
    return dataclasses.asdict(row)


def _tuned_payload(pair) -> dict[str, Any]:
    record, row = pair
    return {"record": record, "row": dataclasses.asdict(row)}


def _tuned_pair(payload) -> tuple[dict[str, Any], ObjectiveResult]:
    return payload["record"], ObjectiveResult(**payload["row"])


def _config_part(config: ExperimentConfig) -> dict[str, Any]:
    """What of an experiment config a baseline's training reads: the fitness metric,
    chunking and sharding."""
    return {"fitness": [config.fitness.metric, config.fitness.final_fraction],
            "chunk_size": config.run.chunk_size, "shard": config.run.shard}


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


def _tuning_plans(tune, tune_seeds, tune_seed, tune_grid, eval_seed, config, baselines,
                  tasks, tune_by=DEFAULT_TUNE_BY, start=False, tune_rounds=DEFAULT_TUNE_ROUNDS
                  ) -> dict[str, dict[str, tuning.TuningPlan]]:
    """``task label -> {objective: plan}`` (the evolved objective first, then with
    ``start`` the search's starting point on the same budget) for ``tasks`` (``{label:
    [inner] config}``), checked before anything trains; ``{}`` without ``tune``."""
    if not tune:
        given = [name for name, value, default in (
            ("tune_seeds", tune_seeds, tuning.DEFAULT_TUNE_SEEDS),
            ("tune_seed", tune_seed, tuning.DEFAULT_TUNE_SEED), ("tune_grid", tune_grid, None),
            ("tune_by", tune_by, tuning.DEFAULT_TUNE_BY),
            ("tune_rounds", tune_rounds, tuning.DEFAULT_TUNE_ROUNDS))
            if value != default and not (name == "tune_grid" and not value)]
        if given:
            raise ConfigError(f"{', '.join(given)}: only with tune=True (--tune)")
        return {}
    tuning.check_tune_options(tune_seeds, tune_seed, eval_seed, config.run.seed, tune_by,
                              tune_rounds)
    overrides = tuning.check_overrides(tune_grid, baselines)
    learned = (EVOLVED, START) if start else (EVOLVED,)
    plans = {}
    for label, inner in tasks.items():
        baseline_plans = [tuning.objective_plan(name, inner, overrides) for name in baselines]
        plans[label] = {**{name: tuning.evolved_plan(name, baseline_plans) for name in learned},
                        **{plan.objective: plan for plan in baseline_plans}}
    return plans


def _tune(plan, objective, meta_params, inner, config, tune_seeds, tune_seed, tune_by,
          tune_rounds) -> dict[str, Any]:
    """The tuning record of one objective on one environment, widened for up to
    ``tune_rounds`` rounds (:func:`metarl.evolve.tuning.tune_objective`)."""
    if plan.objective not in (EVOLVED, START):  # a baseline, at its own initialisation
        objective, meta_params = fixed_objective(plan.objective), None
    return tuning.tune_objective(plan, objective, inner, config.fitness, tune_seeds,
                                 tune_seed, meta_params, config.run.chunk_size,
                                 run_mesh(config.run.shard), tune_by, tune_rounds)


def _balance(plan, record, count, objective, meta_params, inner, config, tune_seeds,
             tune_seed) -> dict[str, Any]:
    """``record`` brought to ``count`` settings in all
    (:func:`metarl.evolve.tuning.balance_objective`), as a new dict."""
    if plan.objective not in (EVOLVED, START):
        objective, meta_params = fixed_objective(plan.objective), None
    return dict(tuning.balance_objective(plan, record, count, objective, inner,
                                         config.fitness, tune_seeds, tune_seed, meta_params,
                                         config.run.chunk_size, run_mesh(config.run.shard)))


def _evaluate_tuned(plan, record, default_row, objective, meta_params, inner, config, seeds,
                    eval_seed, label=None):
    """Train one objective on the held-out seeds at the setting its tuning ``record``
    chose: ``(record, "<objective> (tuned)" row)``, the row labelled ``label`` (default
    ``inner.env_id``). A choice equal to the default setting reuses ``default_row`` (the
    same keys and settings)."""
    evolved = plan.objective in (EVOLVED, START)  # the run's objective, not a baseline
    if not evolved:
        objective, meta_params = fixed_objective(plan.objective), None
    learner = build_learner(inner, objective)
    hypers, options, is_default = tuning.chosen_values(plan, record, learner, plan.objective)
    name = f"{plan.objective} (tuned)"
    record["held_out_at_default"] = is_default
    if is_default:
        return record, dataclasses.replace(default_row, objective=name)
    if options:
        objective = make_objective(plan.objective, **options)
    if not evolved:
        meta_params = objective.init(jax.random.PRNGKey(0))
    return record, evaluate_objective(objective, meta_params, inner, config.fitness, seeds,
                                      eval_seed, name, hypers=hypers, label=label)


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


def format_table(report: dict[str, Any]) -> str:
    """Plain-text tables of an evaluation: per environment and objective the IQM, median and
    mean of the held-out scores with 95% intervals; then each comparison of the evolved
    objective with a baseline, its P(improvement), interval and verdict. A record saved
    without ``statistics`` (an older version's) gets them computed from its returns. The
    run's held-out tasks (``held_out_tasks``) are marked "(held out)"."""
    statistics = report.get("statistics") or environment_statistics(report["results"])
    held_out = set(report.get("held_out_tasks") or ())

    def task(label: str) -> str:
        return f"{label} (held out)" if label in held_out else label

    environments = statistics["environments"]
    metric = report.get("metric", "score")
    rows = [("environment", "objective", f"{metric} IQM", "95% CI", "median", "95% CI",
             "mean", "95% CI", "invalid")]
    for r in report["results"]:
        estimates = environments.get(r["env_id"], {}).get("objectives", {}).get(
            r["objective"], {})
        cells = []
        for name in AGGREGATES:
            e = estimates.get(name, {"value": np.nan, "low": np.nan, "high": np.nan})
            cells += [f"{e['value']:.2f}", f"[{e['low']:.2f}, {e['high']:.2f}]"]
        rows.append((task(r["env_id"]), r["objective"], *cells, str(r.get("invalid", 0))))
    blocks = [held_out_seeds_line(report) + "\n" + text_table(rows)]
    found = [(env_id, c) for env_id, data in environments.items()
             for c in data.get("comparisons", [])]
    if found:
        seen = SEEN_MARK if report.get("eval_seed_reused") else ""
        rows = [("environment", "objective", "vs baseline", "P(improvement)", "95% CI",
                 "paired", "verdict")]
        rows += [(task(env_id), c["evolved"], c["baseline"],
                  f"{c['probability_of_improvement']:.2f}",
                  f"[{c['low']:.2f}, {c['high']:.2f}]", "yes" if c["paired"] else "no",
                  c["verdict"] + seen) for env_id, c in found]
        notes = ["verdict: better / worse when the 95% interval of P(improvement) lies wholly "
                 "above / below 0.5, else no difference found"]
        if seen:
            earlier = ", ".join(str(i) for i in report.get("eval_seed_earlier_records") or [])
            notes.append(f"{SEEN_MARK.strip()} {SEEN_NOTE} (evaluations {earlier or '?'} "
                         f"of this run used root {report.get('eval_seed')})")
        blocks.append(text_table(rows) + "\n" + "\n".join(notes))
    return "\n\n".join(blocks)


def held_out_seeds_line(report: Mapping[str, Any]) -> str:
    """How many held-out seeds an evaluation record used and their root, as a table's
    first line."""
    spec = report.get("spec") if isinstance(report.get("spec"), Mapping) else {}
    seeds = report.get("seeds", spec.get("seeds"))
    if seeds is None:  # an old record: as many as its rows have
        seeds = max((len(r.get("returns") or []) for r in report.get("results") or []),
                    default=0)
    root = report.get("eval_seed", spec.get("eval_seed"))
    return (f"held-out seeds: {seeds} per objective and task, keys split from root "
            f"{root if root is not None else 'unrecorded'}")
