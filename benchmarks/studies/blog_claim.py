"""The blog-sized value distance against tuned L2, read both ways from one evaluation record.

A held-out verdict scores each seed by the run's fitness metric; for the blog-sized run
that is the mean return over the whole of training (learning speed at a fixed budget).
Near CartPole's ceiling the final performance can disagree, so this script also scores
each seed by the mean of its learning curve over the last tenth of training, from the
curve points the record keeps there (a record keeps at most 80 points of each curve, so
this is the mean of the kept points whose update lies in the final tenth), and judges
every tuned comparison both ways with the paired probability of improvement.

    python benchmarks/studies/blog_claim.py \\
        docs/results/value_distance_blog_cpu/evaluations/3.json --out docs/results/blog_claim.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from multi_env_transfer import emit  # this folder, on the path when run as a script

from metarl.evolve.evaluate import held_out_scores
from metarl.evolve.judging import comparison_pairs
from metarl.stats import aggregate, probability_of_improvement, verdict

FINAL_FRACTION = 0.1


def final_tenth(result: dict) -> np.ndarray:
    """``[S]`` mean of each seed's kept curve points in the last tenth of training."""
    curves = np.asarray([[np.nan if v is None else v for v in row] for row in result["curves"]],
                        np.float64)
    updates = np.asarray(result.get("curve_updates") or np.arange(1, curves.shape[1] + 1))
    last = updates > (1 - FINAL_FRACTION) * updates.max()
    return np.nanmean(curves[:, last], axis=1)


def judge_record(record: dict) -> dict:
    env = record["spec"]["environments"][0]
    rows = {r["objective"]: r for r in record["results"] if r["env_id"] == env}
    measures = {"mean_over_training": {name: held_out_scores(row) for name, row in rows.items()},
                "final_tenth": {name: final_tenth(row) for name, row in rows.items()}}
    out = {"record_id": record.get("id"), "environment": env, "seeds": record["seeds"],
           "eval_seed": record["eval_seed"],
           "eval_seed_reused": record.get("eval_seed_reused", False), "measures": {}}
    for measure, scores in measures.items():
        out["measures"][measure] = {
            "iqm": {name: aggregate(values).to_dict() for name, values in scores.items()},
            "comparisons": [],
        }
        for evolved, baseline in comparison_pairs(list(rows)):
            estimate = probability_of_improvement(scores[evolved], scores[baseline],
                                                  paired=True)
            out["measures"][measure]["comparisons"].append({
                "evolved": evolved, "baseline": baseline, **estimate.to_dict(),
                "verdict": verdict(estimate.low, estimate.high)})
    tuning = record.get("tuning", {}).get("environments", {}).get(env, {})
    out["tuned_choices"] = {name: {"chosen": t.get("chosen"), "at_edge": t.get("at_edge"),
                                   "settings": t.get("budget", {}).get("settings"),
                                   "widening": t.get("widening"),
                                   "relative_to": t.get("relative_to") or {},
                                   "widened": [{"round": r["round"], **point}
                                               for r in t.get("rounds", [])
                                               if r.get("reason") == "widen"
                                               for point in r["added"]]}
                            for name, t in tuning.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    record = json.loads(Path(args.record).read_text())
    record.setdefault("id", Path(args.record).stem)
    result = {"record": args.record, "command": "python benchmarks/studies/blog_claim.py "
              f"{args.record}" + (f" --out {args.out}" if args.out else ""),
              **judge_record(record)}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
