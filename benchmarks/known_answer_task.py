"""The known-answer task of ``tests/test_known_answers.py`` measured: DQN with Huber's TD
loss against L2 on the bandit with symmetric reward outliers, on held-out seeds, paired.

Trains ``--seeds`` agents per loss on the same keys (``metarl evaluate``'s evaluation seed),
with the test's settings, and judges Huber against L2 with the paired P(improvement)
(:func:`metarl.stats.probability_of_improvement`).

    python benchmarks/known_answer_task.py --seeds 64 --out docs/results/known_answer_task.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import jax
import numpy as np

from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_objective
from metarl.objectives import make_objective
from metarl.stats import probability_of_improvement, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_known_answers import known_answer_config  # noqa: E402  (the test's one definition)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--out", default="docs/results/known_answer_task.json")
    args = parser.parse_args()
    config = known_answer_config()
    inner = config.inner[0]
    returns = {}
    for name in ("l2", "huber"):
        objective = make_objective(name)
        result = evaluate_objective(objective, objective.init(jax.random.PRNGKey(0)), inner,
                                    config.fitness, args.seeds, DEFAULT_EVAL_SEED, name)
        returns[name] = np.asarray(result.returns, np.float64)
    estimate = probability_of_improvement(returns["huber"], returns["l2"], paired=True)
    report = {
        "benchmark": "known_answer_task",
        "command": f"python benchmarks/known_answer_task.py --seeds {args.seeds} "
                   f"--out {args.out}",
        "env_id": inner.env_id, "algorithm": "dqn", "seeds": args.seeds,
        "eval_seed": DEFAULT_EVAL_SEED, "load_average_at_end": os.getloadavg(),
        "mean_return": {name: float(np.mean(r)) for name, r in returns.items()},
        "huber_minus_l2": {"mean": float(np.mean(returns["huber"] - returns["l2"])),
                           "standard_error": float(np.std(returns["huber"] - returns["l2"],
                                                          ddof=1) / np.sqrt(args.seeds))},
        "p_improvement_huber_over_l2": {"value": estimate.value, "low": estimate.low,
                                        "high": estimate.high,
                                        "verdict": verdict(estimate.low, estimate.high)},
        "returns": {name: r.tolist() for name, r in returns.items()},
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "returns"}, indent=1))


if __name__ == "__main__":
    main()
