"""A row of an evaluation: one objective trained from scratch on the held-out seeds of one
task and summarised (:class:`ObjectiveResult`), and how a row is kept as JSON."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from metarl.curves import CURVE_UPDATES, compact_curves
from metarl.evolve.config import FitnessConfig
from metarl.evolve.fitness import run_is_valid, run_return
from metarl.evolve.generation import build_learner
from metarl.objectives import make_objective
from metarl.programs import judging_compiler_options, shared_program
from metarl.stats import aggregate

__all__ = ["ObjectiveResult", "evaluate_objective", "fixed_objective", "row_of",
           "row_payload"]


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
                             lambda: jax.jit(jax.vmap(learner.train, in_axes=(0, None, None)),
                                             compiler_options=judging_compiler_options()))
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


@functools.cache
def fixed_objective(name: str):
    """The registered objective ``name`` at its default options, built once per process:
    every training of a baseline then shares its compiled programs (its default and tuned
    held-out rows, its tuning rounds and their balancing)."""
    return make_objective(name)


def row_payload(row: ObjectiveResult) -> dict[str, Any]:
    """``row`` as JSON data (its fields)."""
    return dataclasses.asdict(row)


def row_of(payload: dict[str, Any]) -> ObjectiveResult:
    """The row :func:`row_payload` wrote."""
    return ObjectiveResult(**payload)
