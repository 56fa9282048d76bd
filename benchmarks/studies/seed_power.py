"""How many held-out seeds a verdict needs, from the spread of the records' own returns.

A verdict is "better" when the 95% interval of the paired probability of improvement lies
above 0.5. For a true probability ``p`` over ``n`` seeds that interval is about
``p ± 1.96 sqrt(p (1 - p) / n)``, so it clears 0.5 once ``n > 1.96² p (1 - p) / (p - 0.5)²``.
What ``p`` a difference in mean return gives depends on how much the two objectives' returns
differ from seed to seed: with paired differences of mean ``δ`` and standard deviation ``s``
(normal), ``p = Φ(δ / s)``. This script reads ``s`` from committed evaluation records
(the per-seed returns of each comparison) and reports, for differences of 0.5 %, 1 %, 2 % and
5 % of the baseline's mean return, the probability of improvement they give and the seeds
needed to call them; and the smallest difference each record's own seed count could call.

    python benchmarks/studies/seed_power.py --out docs/results/seed_power.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
# (record, environment, evolved row, baseline row): comparisons of the evidence pages
COMPARISONS = (
    ("value_distance_blog_cpu/evaluations/2.json", "CartPole-v1", "evolved (tuned)",
     "l2 (tuned)"),
    ("value_distance_blog_cpu/evaluations/1.json", "CartPole-v1", "evolved", "l2"),
    ("lpo_cpu/evaluations/9.json", "CartPole-v1", "evolved (tuned)", "ppo (tuned)"),
    ("learned_optimizer_cpu/evaluations/4.json", "Breakout-MinAtar", "evolved (tuned)",
     "ppo (tuned)"),
)
FRACTIONS = (0.005, 0.01, 0.02, 0.05)
Z = 1.959964  # the two-sided 95% normal quantile


def seeds_needed(p: float) -> float:
    """Held-out seeds for a P(improvement) of ``p`` to be called (``inf`` at 0.5)."""
    if abs(p - 0.5) < 1e-12:
        return math.inf
    return Z**2 * p * (1 - p) / (p - 0.5) ** 2


def returns_of(record: dict, environment: str, objective: str) -> np.ndarray:
    for result in record["results"]:
        if result["env_id"] == environment and result["objective"] == objective:
            return np.asarray(result["returns"], float)
    raise KeyError(f"{objective!r} on {environment!r} not in the record")


def power(path: str, environment: str, evolved: str, baseline: str) -> dict:
    record = json.loads((RESULTS / path).read_text())
    ours, theirs = returns_of(record, environment, evolved), returns_of(record, environment,
                                                                         baseline)
    differences = ours - theirs
    spread = float(differences.std(ddof=1))
    scale = float(abs(theirs.mean()))
    rows = []
    for fraction in FRACTIONS:
        p = float(stats.norm.cdf(fraction * scale / spread))
        rows.append({"difference": fraction * scale, "fraction_of_baseline_mean": fraction,
                     "probability_of_improvement": p, "seeds_needed": math.ceil(seeds_needed(p))})
    n = len(differences)
    # smallest p whose interval clears 0.5 with n seeds, and the difference giving it
    smallest_p = float(next(p for p in np.linspace(0.5005, 0.9995, 1999)
                            if seeds_needed(p) <= n))
    return {
        "record": path, "environment": environment, "evolved": evolved, "baseline": baseline,
        "seeds": n, "eval_seed": record.get("eval_seed"),
        "mean_difference": float(differences.mean()), "baseline_mean": float(theirs.mean()),
        "paired_difference_sd": spread, "by_difference": rows,
        "smallest_callable_difference": float(stats.norm.ppf(smallest_p) * spread),
        "smallest_callable_probability": smallest_p,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {"benchmark": "seed_power",
              "command": "python benchmarks/studies/seed_power.py --out " + str(args.out),
              "method": "seeds needed = 1.96^2 p (1 - p) / (p - 0.5)^2 with p = Phi(delta / s), "
                        "s the standard deviation of the record's paired per-seed differences",
              "comparisons": [power(*comparison) for comparison in COMPARISONS]}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for row in report["comparisons"]:
        cells = ", ".join(f"{r['fraction_of_baseline_mean']:.1%}: "
                          f"P {r['probability_of_improvement']:.2f} needs {r['seeds_needed']}"
                          for r in row["by_difference"])
        print(f"{row['record']} {row['environment']} {row['evolved']} vs {row['baseline']}: "
              f"{row['seeds']} seeds, sd {row['paired_difference_sd']:.1f}; {cells}; "
              f"smallest callable {row['smallest_callable_difference']:.1f}")


if __name__ == "__main__":
    main()
