"""Meta-test: train fresh agents with an evolved objective and with fixed baselines.

Agents are trained from scratch on held-out seeds (a key stream separate from the one
evolution used), and each objective's mean return gets a 95% bootstrap confidence interval.
The full learning curves are kept so they can be plotted against the baselines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from inner_loops.registry import algorithm_of
from metarl.config import ConfigError
from metarl.evolve.config import FitnessConfig, config_from_dict
from metarl.evolve.fitness import run_is_valid, run_return
from metarl.evolve.generation import build_learner
from metarl.objectives import available_objectives, get_objective, make_objective
from metarl.runs.engine import read_config
from metarl.runs.evaluations import saved_evaluation
from metarl.runs.layout import RunError, read_metrics
from metarl.runs.meta_params import CANDIDATE_FILES, load_meta_params
from metarl.stats import bootstrap_ci

__all__ = ["ObjectiveResult", "default_baselines", "evaluate_objective", "evaluate_run",
           "format_table"]
DEFAULT_EVAL_SEED = 10_007
EVOLVED = "evolved"


@dataclass(frozen=True)
class ObjectiveResult:
    """Held-out performance of one objective on one environment.

    Attributes:
        objective: ``"evolved"`` or a baseline's registered name.
        env_id: environment.
        returns: ``[S]`` score of each seed (the run's fitness metric).
        mean, ci_low, ci_high: mean over valid seeds and its 95% bootstrap interval.
        invalid: seeds whose training produced NaN or inf.
        curves: ``[S, U]`` episode return after every update.
        steps_per_update: environment steps one agent takes per update (the curves' x unit).
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


def evaluate_objective(objective, meta_params, inner, fitness: FitnessConfig,
                       seeds: int, eval_seed: int, name: str) -> ObjectiveResult:
    """Train ``seeds`` agents of ``inner``'s algorithm with ``objective`` (one jitted vmap)
    and summarise them."""
    learner = build_learner(inner, objective)
    train = learner.train
    keys = jax.random.split(jax.random.PRNGKey(eval_seed), seeds)
    metrics = jax.jit(jax.vmap(train, in_axes=(0, None)))(keys, meta_params)
    returns = np.asarray(run_return(metrics, fitness))
    valid = np.asarray(run_is_valid(metrics, returns))
    low, high = bootstrap_ci(returns[valid])
    curves = np.asarray(metrics["episode_return"], np.float64)
    return ObjectiveResult(
        objective=name,
        env_id=inner.env_id,
        returns=[float(r) for r in returns],
        mean=float(np.mean(returns[valid])) if valid.any() else float("nan"),
        ci_low=low,
        ci_high=high,
        invalid=int((~valid).sum()),
        curves=[[None if np.isnan(v) else float(v) for v in row] for row in curves],
        steps_per_update=learner.steps_per_update,
    )


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
                 eval_seed: int = DEFAULT_EVAL_SEED, total_timesteps: int | None = None,
                 rerun: bool = False) -> dict[str, Any]:
    """Evaluate a run's evolved objective against baselines; saves ``evaluations/<n>.json``.

    Evaluations accumulate (:mod:`metarl.runs.evaluations`): each is saved under the next
    number with its ``spec`` (environments, seeds, evaluation seed, budget per environment,
    which meta-parameters and a digest of them, baselines, fitness settings). When an
    evaluation with the same spec exists, it is returned instead of computed again
    (``report["reused"]``), unless ``rerun``, which computes it and replaces that record
    (``report["replaced"]``). ``report["path"]`` is the record's file.

    Args:
        run_dir: the directory of an evolution run.
        env_ids: environments (default: the run's own). An environment the run did not
            train on uses the first ``[inner]`` settings with ``env_id`` changed and the
            environment's default parameters (no ``env_params``).
        seeds: held-out seeds per objective and environment.
        baselines: registered fixed objectives (default: those the run's objective
            declares that fit the run's algorithm, :func:`default_baselines`).
        which: ``"mean"`` (centre of the search distribution) or ``"best"`` (best
            candidate seen) meta-parameters.
        eval_seed: seed of the held-out key stream (distinct from training seeds).
        total_timesteps: override the training budget of every environment.
        rerun: compute an evaluation made before again, replacing its record.

    Returns the report dict that is also saved as JSON.
    """
    if which not in ("mean", "best"):
        raise ConfigError(f"which: got {which!r}; allowed: mean, best")
    if seeds < 2:
        raise ConfigError(f"seeds: need at least 2 for a confidence interval, got {seeds}")
    run_dir = Path(run_dir)
    config = read_config(run_dir, config_from_dict)
    objective = config.objective.build()
    template = objective.init(jax.random.PRNGKey(0))
    meta_path = run_dir / CANDIDATE_FILES[which]
    meta_params = load_meta_params(meta_path, template)
    if baselines is None:
        baselines = default_baselines(config.objective.name, config.inner[0])
    unknown = [b for b in baselines if b not in available_objectives()]
    if unknown:
        raise ConfigError(
            f"baselines: unknown {unknown}; allowed: {', '.join(available_objectives())}"
        )
    for name in baselines:
        if not _fits(name, config.inner[0]):
            raise ConfigError(f"baselines: objective {name!r} does not fit algorithm "
                              f"{algorithm_of(config.inner[0]).name!r}")
    by_env = {inner.env_id: inner for inner in config.inner}
    env_ids = env_ids or list(by_env)
    inners = []
    for env_id in env_ids:
        inner = by_env.get(env_id) or config.inner[0].replace(env_id=env_id, env_params=())
        if total_timesteps is not None:
            inner = inner.replace(total_timesteps=total_timesteps)
        inners.append(inner)
    spec = {
        "environments": list(env_ids),
        "seeds": seeds,
        "eval_seed": eval_seed,
        "total_timesteps": {inner.env_id: inner.total_timesteps for inner in inners},
        "meta_params": which,
        "meta_params_sha256": hashlib.sha256(meta_path.read_bytes()).hexdigest(),
        "baselines": list(baselines),
        "fitness": {"metric": config.fitness.metric,
                    "final_fraction": config.fitness.final_fraction},
    }
    def compute() -> dict[str, Any]:
        results = []
        for inner in inners:
            results.append(evaluate_objective(objective, meta_params, inner, config.fitness,
                                              seeds, eval_seed, EVOLVED))
            for name in baselines:
                baseline = make_objective(name)
                results.append(evaluate_objective(
                    baseline, baseline.init(jax.random.PRNGKey(0)), inner, config.fitness,
                    seeds, eval_seed, name,
                ))
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
            "results": [r.__dict__ for r in results],
        }

    return saved_evaluation(run_dir, spec, compute, rerun)


def format_table(report: dict[str, Any]) -> str:
    """Plain-text table of mean return and 95% CI per environment and objective."""
    rows = [("environment", "objective", f"{report['metric']} (mean)", "95% CI", "invalid")]
    for r in report["results"]:
        rows.append((r["env_id"], r["objective"], f"{r['mean']:.2f}",
                     f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]", str(r["invalid"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
