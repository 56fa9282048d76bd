"""The known-answer tasks of ``tests/test_known_answers.py`` measured, on held-out seeds,
paired: DQN with Huber's TD loss against L2 on the bandit with symmetric reward outliers,
and PPO's clip with a planted drift penalty against PPO's clip alone on its continuous
variant.

Trains ``--seeds`` agents per loss on the same keys (``metarl evaluate``'s evaluation seed),
with the tests' settings, and judges each planted answer against the algorithm's own loss
with the paired P(improvement) (:func:`metarl.stats.probability_of_improvement`). The
value-distance task's numbers are at the top level of the report, the drift task's under
``"drift_task"``.

    python benchmarks/studies/known_answer_task.py --seeds 64 \\
        --out docs/results/known_answer_task.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import jax
import numpy as np

from inner_loops.registry import algorithm_of
from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_objective
from metarl.objectives import make_objective
from metarl.stats import probability_of_improvement, verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_known_answers import (  # noqa: E402  (the tests' one definition)
    drift_config,
    known_answer_config,
    planted_drift,
)


def paired_comparison(candidates, config, seeds: int, planted: str, own: str) -> dict:
    """Train ``seeds`` agents of ``config``'s first ``[inner]`` with each of ``candidates``
    (``name -> (objective, meta_params)``) on the same held-out keys and judge ``planted``
    against ``own``: mean returns, their paired difference with its standard error, the
    paired P(improvement) with its 95% interval and verdict, and every seed's return."""
    inner = config.inner[0]
    returns = {}
    for name, (objective, meta_params) in candidates.items():
        result = evaluate_objective(objective, meta_params, inner, config.fitness, seeds,
                                    DEFAULT_EVAL_SEED, name)
        returns[name] = np.asarray(result.returns, np.float64)
    difference = returns[planted] - returns[own]
    estimate = probability_of_improvement(returns[planted], returns[own], paired=True)
    return {
        "env_id": inner.env_id, "algorithm": algorithm_of(inner).name,
        "mean_return": {name: float(np.mean(r)) for name, r in returns.items()},
        f"{planted}_minus_{own}": {"mean": float(np.mean(difference)),
                                   "standard_error": float(np.std(difference, ddof=1)
                                                           / np.sqrt(seeds))},
        f"p_improvement_{planted}_over_{own}": {
            "value": estimate.value, "low": estimate.low, "high": estimate.high,
            "verdict": verdict(estimate.low, estimate.high)},
        "returns": {name: r.tolist() for name, r in returns.items()},
    }


def value_distance_task(seeds: int) -> dict:
    """DQN with Huber against L2 (both fixed objectives)."""
    candidates = {}
    for name in ("l2", "huber"):
        objective = make_objective(name)
        candidates[name] = (objective, objective.init(jax.random.PRNGKey(0)))
    return paired_comparison(candidates, known_answer_config(), seeds, "huber", "l2")


def drift_task(seeds: int) -> dict:
    """PPO with the ``lpo`` drift at its start (exactly PPO's clip: the learned part's
    output layer is zero) against the same drift plus the planted penalty, one program."""
    config = drift_config()
    objective = config.objective.build()
    start = objective.init(jax.random.PRNGKey(0))
    planted = {**start, "policy": planted_drift(start["policy"])}
    return paired_comparison({"ppo_clip": (objective, start), "planted": (objective, planted)},
                             config, seeds, "planted", "ppo_clip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--out", default="docs/results/known_answer_task.json")
    args = parser.parse_args()
    value = value_distance_task(args.seeds)
    drift = drift_task(args.seeds)
    report = {
        "benchmark": "known_answer_task",
        "command": f"python benchmarks/studies/known_answer_task.py --seeds {args.seeds} "
                   f"--out {args.out}",
        "env_id": value.pop("env_id"), "algorithm": value.pop("algorithm"),
        "seeds": args.seeds, "eval_seed": DEFAULT_EVAL_SEED,
        "load_average_at_end": os.getloadavg(),
        **value,
        "drift_task": drift,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "returns"}
                     | {"drift_task": {k: v for k, v in drift.items() if k != "returns"}},
                     indent=1))


if __name__ == "__main__":
    main()
