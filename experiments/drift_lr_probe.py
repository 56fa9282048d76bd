"""Does the policy objective matter at a given PPO learning rate? PPO's clip, DPO's drift
and a zero drift (the unpenalised surrogate ``r A``: ``lpo`` with ``zero_init``) trained on
the same seeds of CartPole-v1 and Acrobot-v1 at ``lpo_cpu.toml``'s budget, one learning rate
at a time. Prints one line per (environment, learning rate, objective) and writes JSON.

    python experiments/drift_lr_probe.py --learning-rates 2.5e-4,1e-3,3e-3 \\
        --out docs/results/drift_lr_probe.json

About a minute per line on a busy 2-core CPU (mostly compilation).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

import metarl
from metarl.evolve.config import FitnessConfig
from metarl.evolve.evaluate import evaluate_objective
from metarl.kinds import load_experiment
from metarl.objectives import make_objective

EXPERIMENT = Path(__file__).with_name("lpo_cpu.toml")
OBJECTIVES = {"ppo": {}, "dpo": {}, "lpo": {"hidden_sizes": [16], "zero_init": True}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning-rates", default="2.5e-4,1e-3,3e-3")
    parser.add_argument("--objectives", default="ppo,dpo,lpo")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--eval-seed", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts
    config = load_experiment(EXPERIMENT)
    fitness = FitnessConfig(metric="mean_return")
    rows = []
    for base in config.inner:
        for lr in (float(x) for x in args.learning_rates.split(",")):
            inner = base.replace(learning_rate=lr)
            for name in args.objectives.split(","):
                objective = make_objective(name, **OBJECTIVES[name])
                start = time.time()
                result = evaluate_objective(objective, objective.init(jax.random.PRNGKey(0)),
                                            inner, fitness, args.seeds, args.eval_seed, name)
                row = {"env_id": inner.env_id, "learning_rate": lr, "objective": name,
                       "mean": result.mean, "ci_low": result.ci_low,
                       "ci_high": result.ci_high, "returns": result.returns,
                       "seconds": time.time() - start}
                rows.append(row)
                print(f"{inner.env_id} lr {lr:g} {name}: {result.mean:.1f} "
                      f"[{result.ci_low:.1f}, {result.ci_high:.1f}]", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"seeds": args.seeds, "eval_seed": args.eval_seed,
                                              "metric": "mean_return", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
