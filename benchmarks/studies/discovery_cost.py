"""What a discovery costs: agent-steps and seconds until a cheaper search reaches the
held-out verdict of the full-budget one.

Runs one evolution experiment (default: the README's main job, the value distance on
CartPole-v1) with several search methods, each for ``--seeds`` evolution seeds:

- ``open_es``: the experiment's search with full generations (``es.rungs = 1`` whatever
  the file says: the main job and ``lpo_cpu.toml`` now train in rungs), every candidate
  training its whole budget, for its ``es.generations``; its agent-steps are the budget
  ``B`` every fraction refers to;
- ``rungs``: successive halving (``es.rungs = 3``, ``eta = 3``);
- ``pes`` / ``nres``: ``PersistentES`` / ``NoiseReuseES`` over ``--truncations``
  truncations of every training run (``metarl.evolve.truncation``).

The cheaper methods run until ``--budget`` x ``B`` agent-steps. At every fraction of ``B``
in ``--fractions`` (the full run also at its end) the search centre is trained on
``--held-out`` seeds disjoint from evolution (``metarl evaluate``'s evaluation seed), and
judged, pooled over evolution seeds with the held-out seed as the resampling unit
(:func:`metarl.stats.pooled_probability_of_improvement`):

- against the objective's starting point at the experiment's setting, on the same held-out
  seeds (L2 for the value distance, PPO's clip for an LPO drift started at it), and
- against the full-budget run's final objective of the same evolution seed.

A method *reaches* the full run's verdict at the first fraction where its verdict against
the start is the full run's and it is not worse than the full run. Seconds are the generations'
own (compilation apart, listed separately), measured in one process per method with the
generations run back to back.

    python benchmarks/studies/discovery_cost.py --seeds 3 --out docs/results/discovery_cost.json

An experiment with several ``[[inner]]`` tables (e.g. ``experiments/lpo_cpu.toml``, CartPole
and Acrobot) is judged on all of them: a held-out unit is one (environment, seed) pair, both
objectives paired on it, so P(improvement) averages over environments without mixing their
scales; the held-out means are reported per environment.

Writes the JSON document (and a figure next to it: held-out mean return against
agent-steps) and prints a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import jax
import numpy as np

import metarl
from metarl.evolve.config import FitnessConfig
from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_objective
from metarl.evolve.generation import Evolution
from metarl.kinds import load_experiment
from metarl.objectives import make_objective
from metarl.stats import pooled_probability_of_improvement, verdict

METHODS = {
    "open_es": {"rungs": 1},  # full generations (the base is forced to them as well)
    "rungs": {"rungs": 3, "eta": 3},
    "pes": {"strategy": "PersistentES"},
    "nres": {"strategy": "NoiseReuseES"},
}


def method_config(base, method: str, truncations: int):
    """The experiment ``base`` searched with ``method`` (:data:`METHODS`)."""
    es = dict(METHODS[method])
    if method in ("pes", "nres"):
        es["truncations"] = truncations
    return base.replace(es=dataclasses.replace(base.es, **es))


def run_method(config, seed: int, budget_steps: int, fractions: list[float],
               full_budget: int) -> dict:
    """Evolve ``config`` from ``PRNGKey(seed)`` until ``budget_steps`` agent-steps; keep the
    search centre at each fraction of ``full_budget`` reached. Returns the checkpoints
    ``[{fraction, generation, agent_steps, seconds, meta_params}]`` and compile seconds."""
    evolution = Evolution(config)
    state = evolution.init(jax.random.PRNGKey(seed))
    started = time.perf_counter()
    step = evolution.step.lower(state).compile()
    compile_seconds = time.perf_counter() - started
    per_generation = evolution.agent_steps_per_generation
    wanted = sorted(f for f in fractions if f * full_budget <= budget_steps + 1)
    checkpoints, seconds, generation = [], 0.0, 0
    for fraction in wanted:
        target = fraction * full_budget
        while generation * per_generation < target - 1:
            started = time.perf_counter()
            state, _ = step(state)
            jax.block_until_ready(state)
            seconds += time.perf_counter() - started
            generation += 1
        checkpoints.append({"fraction": fraction, "generation": generation,
                            "agent_steps": generation * per_generation, "seconds": seconds,
                            "meta_params": jax.device_get(evolution.mean_meta_params(state))})
    return {"compile_seconds": compile_seconds, "agent_steps_per_generation": per_generation,
            "checkpoints": checkpoints}


def held_out(objective, meta_params, inners, fitness: FitnessConfig, seeds: int,
             name: str) -> np.ndarray:
    """``[E * S]`` held-out returns (the fitness metric) of ``objective`` at
    ``meta_params`` on each of the ``E`` ``inners``, environment-major."""
    return np.concatenate([
        np.asarray(evaluate_objective(objective, meta_params, inner, fitness, seeds,
                                      DEFAULT_EVAL_SEED, name).returns, np.float64)
        for inner in inners])


def by_env(scores: np.ndarray, env_ids: list[str]) -> dict[str, np.ndarray]:
    """``[..., E * S]`` environment-major scores -> ``{env_id: [..., S]}``."""
    return dict(zip(env_ids, np.split(scores, len(env_ids), axis=-1), strict=True))


def judge(x: np.ndarray, y: np.ndarray) -> dict:
    """Pooled P(x > y) over ``[R, S]`` scores on shared held-out seeds, with its verdict."""
    estimate = pooled_probability_of_improvement(x, y)
    return {"p_improvement": estimate.value, "low": estimate.low, "high": estimate.high,
            "verdict": verdict(estimate.low, estimate.high)}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_ids = report["env_ids"]
    figure, axes = plt.subplots(1, len(env_ids), figsize=(6.4 * len(env_ids), 4.2),
                                squeeze=False)
    for axis, env_id in zip(axes[0], env_ids, strict=True):
        for method, rows in report["methods"].items():
            steps = [row["agent_steps_mean"] for row in rows["points"]]
            means = [row["held_out_mean"][env_id] for row in rows["points"]]
            spread = [row["held_out_seed_std"][env_id] for row in rows["points"]]
            axis.errorbar(steps, means, yerr=spread, marker="o", capsize=3, label=method)
        axis.axhline(report["start"]["held_out_mean"][env_id], color="0.4", linestyle="--",
                     label=f"{report['start']['name']} (start)")
        axis.set_xscale("log")
        axis.set_xlabel("agent-steps spent by the search (per evolution seed)")
        axis.set_ylabel(f"held-out mean return on {env_id}")
        axis.set_title(f"{report['experiment']}: {report['seeds']} evolution seeds, "
                       f"{report['held_out_seeds']} held-out", fontsize=9)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="experiments/value_distance_cartpole.toml")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--truncations", type=int, default=4)
    parser.add_argument("--budget", type=float, default=0.5,
                        help="cheaper methods run until this fraction of the full budget")
    parser.add_argument("--fractions", default="0.125,0.25,0.5")
    parser.add_argument("--generations", type=int, default=None,
                        help="the full run's generations (default: the experiment's)")
    parser.add_argument("--start-name", default=None,
                        help="what the search starts from, for the report (default: L2 "
                             "for a value distance, PPO for a drift)")
    parser.add_argument("--out", default="docs/results/discovery_cost.json")
    args = parser.parse_args()
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts

    base = load_experiment(args.experiment)
    # the full run, and the start of every method, is the full generation: the experiment
    # files may train in rungs themselves (the main job and lpo_cpu.toml do)
    base = base.replace(es=dataclasses.replace(base.es, rungs=1))
    if args.generations:
        base = base.replace(es=dataclasses.replace(base.es, generations=args.generations))
    base = base.replace(run=dataclasses.replace(base.run, progress=False))
    methods = args.methods.split(",")
    fractions = [float(f) for f in args.fractions.split(",")]
    full_budget = Evolution(base).agent_steps_per_generation * base.es.generations
    objective = make_objective(base.objective.name, **base.objective.options)
    inners, fitness = list(base.inner), base.fitness
    env_ids = [inner.env_id for inner in inners]
    start_name = args.start_name or ("PPO" if base.objective.name in ("lpo", "ta_lpo")
                                     else "L2")

    runs = {}
    for method in methods:
        config = method_config(base, method, args.truncations)
        budget = full_budget if method == "open_es" else args.budget * full_budget
        points = sorted(set(fractions + ([1.0] if method == "open_es" else [])))
        runs[method] = [run_method(config.replace(run=dataclasses.replace(
            config.run, seed=base.run.seed + seed)), base.run.seed + seed, budget, points,
            full_budget) for seed in range(args.seeds)]
        print(f"{method}: evolved", flush=True)

    # the search's start is the baseline exactly (L2's weight starts at 1; an LPO drift
    # with ppo_init starts at PPO's clip)
    start = held_out(objective, objective.init(jax.random.PRNGKey(0)), inners, fitness,
                     args.held_out, "start")
    scores = {method: [[held_out(objective, point["meta_params"], inners, fitness,
                                 args.held_out, method) for point in run["checkpoints"]]
                       for run in seed_runs] for method, seed_runs in runs.items()}
    full_final = np.stack([seed[-1] for seed in scores["open_es"]]) if "open_es" in scores \
        else None
    start_rows = np.broadcast_to(start, (args.seeds, start.size))
    full_verdict = (judge(full_final, start_rows)["verdict"] if full_final is not None
                    else None)

    report = {
        "benchmark": "discovery_cost",
        "command": "python benchmarks/studies/discovery_cost.py " + " ".join(
            f"--{key.replace('_', '-')} {value}" for key, value in vars(args).items()
            if value is not None),
        "experiment": base.name, "devices": jax.device_count(),
        "load_average_at_end": os.getloadavg(),
        "seeds": args.seeds, "held_out_seeds": args.held_out,
        "eval_seed": DEFAULT_EVAL_SEED, "full_budget_agent_steps": full_budget,
        "env_ids": env_ids,
        "full_verdict_vs_start": full_verdict,
        "start": {"name": start_name,
                  "held_out_mean": {env: float(np.mean(s))
                                    for env, s in by_env(start, env_ids).items()},
                  "returns": start.tolist()},
        "methods": {},
    }
    for method, seed_runs in runs.items():
        config = method_config(base, method, args.truncations)
        rows, reached = [], None
        for index, point in enumerate(seed_runs[0]["checkpoints"]):
            x = np.stack([scores[method][seed][index] for seed in range(args.seeds)])
            row = {
                "fraction": point["fraction"],
                "generation": point["generation"],
                "agent_steps_mean": float(np.mean([run["checkpoints"][index]["agent_steps"]
                                                   for run in seed_runs])),
                "seconds_mean": float(np.mean([run["checkpoints"][index]["seconds"]
                                               for run in seed_runs])),
                "held_out_mean": {env: float(np.mean(s))
                                  for env, s in by_env(x, env_ids).items()},
                "held_out_seed_std": {env: float(np.std(np.mean(s, axis=1)))
                                      for env, s in by_env(x, env_ids).items()},
                "vs_start": judge(x, start_rows),
            }
            if full_final is not None:
                row["vs_full"] = judge(x, full_final)
                if (reached is None and row["vs_start"]["verdict"] == full_verdict
                        and row["vs_full"]["verdict"] != "worse"):
                    reached = row["fraction"]
            rows.append(row)
        report["methods"][method] = {
            "es": {key: getattr(config.es, key) for key in
                   ("strategy", "population_size", "rungs", "eta", "truncations",
                    "sigma", "learning_rate", "fitness_shaping")},
            "compile_seconds_mean": float(np.mean([run["compile_seconds"]
                                                   for run in seed_runs])),
            "agent_steps_per_generation": seed_runs[0]["agent_steps_per_generation"],
            "points": rows,
            "reaches_full_verdict_at_fraction": reached,
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=_plain) + "\n")
    plot(report, out.with_suffix(".png"))
    for method, entry in report["methods"].items():
        for row in entry["points"]:
            versus = row.get("vs_full", {})
            means = " ".join(f"{v:7.1f}" for v in row["held_out_mean"].values())
            print(f"{method:8s} {row['fraction']:6.3f} B  {row['agent_steps_mean']:>11.0f} "
                  f"steps {row['seconds_mean']:7.1f} s  held-out {means}"
                  f"  vs {start_name} {row['vs_start']['p_improvement']:.2f} "
                  f"{row['vs_start']['verdict']:>20s}"
                  f"  vs full {versus.get('p_improvement', math.nan):.2f} "
                  f"{versus.get('verdict', '-')}")
    print(f"full run vs {start_name}: {full_verdict}; written {out}")


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value)}")


if __name__ == "__main__":
    main()
