"""Calibrate a suite's budgets: how far below each environment's ceiling tuned PPO stays.

A suite can tell objectives apart only where the tuned baseline has room to be beaten: an
environment where tuned PPO already scores the ceiling, or no better than its untrained
policy, says little. :func:`calibrate_suite` trains, per environment and per budget, PPO
with its own losses over its tuning grid (:func:`metarl.evolve.tuning.default_losses_plan`,
chosen by the IQM over the tuning seeds) and the untrained policy (learning rate 0), and
records where the tuned IQM lies between the untrained policy's (0) and the ceiling (1):
``ceiling_fraction``. ``metarl suites --calibrate NAME`` writes the record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from metarl.evolve.config import FitnessConfig
from metarl.evolve.evaluate import evaluate_objective
from metarl.evolve.generation import build_learner
from metarl.evolve.suite_verdicts import untrained_hypers
from metarl.evolve.tuning import DEFAULT_TUNE_SEED, default_losses_plan, tune_objective
from metarl.stats import aggregate

__all__ = ["calibrate_suite"]


def calibrate_suite(suite, budgets: Sequence[int] | None = None, seeds: int = 8,
                    seed: int = DEFAULT_TUNE_SEED, metric: str = "final_return",
                    final_fraction: float = 0.1,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The calibration record of ``suite`` (a :class:`metarl.suites.Suite`).

    Args:
        budgets: total steps per agent to try on every environment (default: each
            environment's own budget only).
        seeds, seed: tuning seeds per setting and the root of their keys.
        metric, final_fraction: the fitness each training is scored by (default: the mean
            return of the last tenth of training, the stricter of the two metrics).
        progress: called with one line per finished environment and budget.

    Returns ``{"suite", "metric", "final_fraction", "seeds", "seed", "environments": {label:
    {"ceiling", "source", "budgets": [{"total_timesteps", "untrained_iqm", "tuned_iqm" (with
    its interval), "chosen", "at_edge", "ceiling_fraction", "seconds"}]}}}``.
    """
    fitness = FitnessConfig(metric=metric, final_fraction=final_fraction)
    record = {"suite": suite.to_dict(), "metric": metric, "final_fraction": final_fraction,
              "seeds": seeds, "seed": seed, "environments": {}}
    for task in suite.tasks:
        entries = []
        for budget in budgets or [None]:
            inner = task.config(None if budget is None else {"total_timesteps": int(budget)})
            start = time.perf_counter()
            plan, objective = default_losses_plan(inner)
            tuned = tune_objective(plan, objective, inner, fitness, seeds, seed,
                                   tune_by="iqm")
            best = tuned["settings"][tuned["chosen_index"]]
            tuned_iqm = aggregate([r if r is not None else float("nan")
                                   for r in best["returns"]]).to_dict()
            learner = build_learner(inner, objective)
            untrained = evaluate_objective(objective, objective.init(jax.random.PRNGKey(0)),
                                           inner, fitness, seeds, seed, "untrained",
                                           hypers=untrained_hypers(learner))
            floor = aggregate(untrained.returns).value
            fraction = (None if task.ceiling is None or task.ceiling == floor else
                        (tuned_iqm["value"] - floor) / (task.ceiling - floor))
            entries.append({"total_timesteps": inner.total_timesteps, "untrained_iqm": floor,
                            "tuned_iqm": tuned_iqm, "chosen": tuned["chosen"],
                            "at_edge": tuned.get("at_edge", {}),
                            "ceiling_fraction": fraction,
                            "seconds": round(time.perf_counter() - start, 1)})
            progress(f"{task.label} at {inner.total_timesteps} steps: untrained {floor:.4g}, "
                     f"tuned PPO {tuned_iqm['value']:.4g} (ceiling {task.ceiling}; "
                     f"{'-' if fraction is None else f'{fraction:.2f}'} of the way)")
        record["environments"][task.label] = {"ceiling": task.ceiling, "source": task.source,
                                              "budgets": entries}
    return record
