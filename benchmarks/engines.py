"""Which engine finds more per agent-step: evolution (Open_ES) and meta-gradients
(``[meta] method = "metagradient"``) on the same objective and task, at equal agent-steps,
over several meta-seeds.

Tasks (``--task``, several allowed):

- ``drift``: the drift known-answer task of ``tests/test_known_answers.py`` (LPO from PPO's
  clip on the continuous outlier bandit, PPO at a learning rate of 0.1); the known answer is
  a drift that pulls ratios back harder than PPO's clip (restoring slope above 1.45);
- ``outliers``: the value-distance known-answer task on PPO
  (``tests/test_metagradient_known_answers.py``: the discrete outlier bandit, where Huber
  beats L2 as PPO's value loss); the known answer is a distance that weights large errors
  less than ordinary ones (large-error weight below 0.5);
- ``cartpole``: a real task, the value distance on CartPole-v1 from L2 (a small PPO); it
  has no known answer, only the held-out verdict.

For each task, engine and meta-seed the search runs until it has trained ``--agent-steps``
environment steps (each engine's whole steps: the count it reached is recorded), and after
every step (every ``--measure-every`` steps, and the last) the known answer's shape measure
of the current meta-parameters (evolution: the search's centre; meta-gradients: the one
point) is recorded with the agent-steps so far.
Reported per run: that trajectory, the agent-steps at which the measure first crossed the
known-answer tests' threshold (``null`` if never), the final measure, and the held-out
verdict: ``--held-out-seeds`` fresh agents trained with the final meta-parameters and with
the search's start (the task's baseline: PPO's clip, L2), on the same keys
(``metarl evaluate``'s evaluation seed), judged by the paired probability of improvement
(:func:`metarl.stats.probability_of_improvement`) and :func:`metarl.stats.verdict`.
Per task and engine a summary gives the meta-seeds' verdicts, the spread of the final
gains and how many runs reached the known answer.

    python benchmarks/engines.py --task drift outliers --meta-seeds 0 1 2 3 \\
        --agent-steps 262144 --out docs/results/engines.json
    python benchmarks/engines.py --smoke --out /tmp/engines_smoke.json

``--smoke`` runs every task tiny (a few thousand agent-steps, 4 held-out seeds, one
meta-seed): it checks the harness, not the engines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_objective
from metarl.evolve.generation import Evolution, search_start
from metarl.evolve.metagradient import MetaGradient, metagradient_start
from metarl.stats import probability_of_improvement, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_known_answers import (  # noqa: E402  (the tests' one definition)
    MAX_LARGE_ERROR_WEIGHT,
    MIN_RESTORING_SLOPE,
    drift_config,
    large_error_weight,
    restoring_slope,
)
from test_metagradient_known_answers import (  # noqa: E402
    drift_metagradient,
    outliers_evolution,
    outliers_metagradient,
)

ENGINES = ("evolution", "metagradient")


@dataclass(frozen=True)
class Task:
    """One task of the comparison.

    Attributes:
        configs: ``engine -> (meta_seed -> ExperimentConfig)``: each engine's experiment
            (its budget is set here from ``--agent-steps``).
        measure: ``meta_params -> float``, the known answer's shape measure (``None``:
            the task has no known answer).
        reached: ``measure -> bool``, whether the measure shows the known answer.
        threshold: the threshold, as recorded.
        baseline: what the held-out verdict compares with (the search's start).
    """

    configs: dict[str, Callable[[int], ExperimentConfig]]
    measure: Callable[[Any], float] | None
    reached: Callable[[float], bool] | None
    threshold: str | None
    baseline: str


def drift_measure(meta_params) -> float:
    return restoring_slope(meta_params["policy"])


def outliers_measure(meta_params) -> float:
    return large_error_weight(meta_params["value"])


CARTPOLE_INNER = {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 64,
                  "total_timesteps": 16_384, "update_epochs": 2, "num_minibatches": 2,
                  "hidden_sizes": [32]}
CARTPOLE_OBJECTIVE = {"name": "value_distance", "options": {"hidden_sizes": [16]}}


def cartpole_evolution(seed: int) -> ExperimentConfig:
    return config_from_dict({
        "name": "engines_cartpole_evolution", "objective": CARTPOLE_OBJECTIVE,
        "inner": CARTPOLE_INNER,
        "es": {"strategy": "Open_ES", "population_size": 8, "sigma": 0.1,
               "learning_rate": 0.05},
        "fitness": {"metric": "mean_return", "seeds_per_candidate": 2},
        "run": {"seed": seed, "progress": False}})


def cartpole_metagradient(seed: int) -> ExperimentConfig:
    return config_from_dict({
        "name": "engines_cartpole_metagradient", "objective": CARTPOLE_OBJECTIVE,
        "inner": CARTPOLE_INNER,
        "meta": {"method": "metagradient", "unroll": 4, "agents": 8,
                 "objective": "actor_critic", "learning_rate": 0.01},
        "run": {"seed": seed, "progress": False}})


def drift_evolution(seed: int) -> ExperimentConfig:
    return drift_config(seed=seed)


TASKS = {
    "drift": Task({"evolution": drift_evolution, "metagradient": drift_metagradient},
                  drift_measure, lambda slope: slope > MIN_RESTORING_SLOPE,
                  f"restoring slope > {MIN_RESTORING_SLOPE}", "ppo_clip"),
    "outliers": Task({"evolution": outliers_evolution, "metagradient": outliers_metagradient},
                     outliers_measure, lambda weight: weight < MAX_LARGE_ERROR_WEIGHT,
                     f"large-error weight < {MAX_LARGE_ERROR_WEIGHT}", "l2"),
    "cartpole": Task({"evolution": cartpole_evolution, "metagradient": cartpole_metagradient},
                     None, None, None, "l2"),
}
# --smoke: every task's inner loop cut to a few updates, budgets of a few steps
SMOKE_INNER = {"drift": {"total_timesteps": 128}, "outliers": {"total_timesteps": 128},
               "cartpole": {"total_timesteps": 512, "num_steps": 32}}


def with_budget(config: ExperimentConfig, engine: str, steps: int) -> ExperimentConfig:
    if engine == "evolution":
        return config.replace(es=dataclasses.replace(config.es, generations=steps))
    return config.replace(meta=dataclasses.replace(config.meta, steps=steps))


def smaller(config: ExperimentConfig, changes: dict[str, Any]) -> ExperimentConfig:
    inner = config.inner[0].replace(**changes)
    config = config.replace(inner=(inner,))
    if config.meta.metagradient:
        updates = inner.num_updates
        unroll = min(config.meta.unroll, updates)
        while updates % unroll:
            unroll -= 1
        config = config.replace(meta=dataclasses.replace(config.meta, unroll=unroll,
                                                         agents=2, lifetime=0))
    else:
        config = config.replace(es=dataclasses.replace(config.es, population_size=4),
                                fitness=dataclasses.replace(config.fitness,
                                                            seeds_per_candidate=1))
    return config


def run_search(task: Task, engine: str, config: ExperimentConfig, agent_steps: int,
               measure_every: int = 1) -> dict[str, Any]:
    """One search of ``config`` by ``engine`` until ``agent_steps`` have trained, the
    known answer's measure taken every ``measure_every`` steps and after the last: the
    objective, the start, the final meta-parameters and the record."""
    started = time.process_time()
    if engine == "evolution":
        search = Evolution(config)
        per_step = search.agent_steps_per_generation
        state = search.init(jax.random.PRNGKey(config.run.seed))

        def current(state):
            return jax.device_get(search.mean_meta_params(state))
        start = search_start(search.objective, config.run.seed)
    else:
        search = MetaGradient(config)
        per_step = search.agent_steps_per_step
        state = search.init()

        def current(state):
            return jax.device_get(state.meta_params)
        start = metagradient_start(search.objective, config)
    steps = max(1, -(-agent_steps // per_step))
    trajectory = []
    if task.measure is not None:
        trajectory.append([0, task.measure(current(state))])
    for step in range(1, steps + 1):
        state, _ = search.step(state)
        if task.measure is not None and (step % measure_every == 0 or step == steps):
            trajectory.append([step * per_step, task.measure(current(state))])
    reached = None
    if task.reached is not None:
        reached = next((steps_done for steps_done, value in trajectory
                        if task.reached(value)), None)
    return {"objective": search.objective, "start": start, "final": current(state),
            "record": {"steps": steps, "agent_steps_per_step": per_step,
                       "agent_steps": steps * per_step, "trajectory": trajectory,
                       "final_measure": trajectory[-1][1] if trajectory else None,
                       "agent_steps_to_known_answer": reached,
                       "cpu_seconds_search": time.process_time() - started}}


def held_out(search: dict[str, Any], config: ExperimentConfig, seeds: int) -> dict[str, Any]:
    """The final meta-parameters against the search's start on ``seeds`` held-out keys."""
    started = time.process_time()
    objective, inner = search["objective"], config.inner[0]
    returns = {name: np.asarray(evaluate_objective(objective, params, inner, config.fitness,
                                                   seeds, DEFAULT_EVAL_SEED, name).returns,
                                np.float64)
               for name, params in (("start", search["start"]), ("found", search["final"]))}
    difference = returns["found"] - returns["start"]
    estimate = probability_of_improvement(returns["found"], returns["start"], paired=True)
    return {"mean_return": {name: float(np.mean(r)) for name, r in returns.items()},
            "gain": float(np.mean(difference)),
            "gain_standard_error": float(np.std(difference, ddof=1) / np.sqrt(seeds)),
            "p_improvement": {"value": estimate.value, "low": estimate.low,
                              "high": estimate.high},
            "verdict": verdict(estimate.low, estimate.high),
            "cpu_seconds_held_out": time.process_time() - started}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    gains = np.asarray([run["held_out"]["gain"] for run in runs])
    reached = [run["agent_steps_to_known_answer"] for run in runs]
    return {
        "verdicts": [run["held_out"]["verdict"] for run in runs],
        "gain_mean": float(gains.mean()), "gain_min": float(gains.min()),
        "gain_max": float(gains.max()),
        "reached_known_answer": sum(r is not None for r in reached),
        "agent_steps_to_known_answer": reached,
        "cpu_seconds": float(sum(run["cpu_seconds_search"]
                                 + run["held_out"]["cpu_seconds_held_out"] for run in runs)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", nargs="+", choices=tuple(TASKS), default=["drift",
                                                                            "outliers"])
    parser.add_argument("--engine", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--meta-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--agent-steps", type=int, default=262_144,
                        help="environment steps each search trains (both engines)")
    parser.add_argument("--held-out-seeds", type=int, default=64)
    parser.add_argument("--measure-every", type=int, default=1,
                        help="steps between two measures of the learned shape (each costs "
                             "about as much as a meta-gradient step on the outlier task)")
    parser.add_argument("--smoke", action="store_true",
                        help="every task tiny, one meta-seed, 4 held-out seeds")
    parser.add_argument("--out", default="docs/results/engines.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.meta_seeds, args.held_out_seeds = args.meta_seeds[:1], 4
        args.agent_steps = min(args.agent_steps, 2048)
    report = {"benchmark": "engines",
              "command": "python benchmarks/engines.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "agent_steps": args.agent_steps, "held_out_seeds": args.held_out_seeds,
              "measure_every": args.measure_every,
              "eval_seed": DEFAULT_EVAL_SEED, "meta_seeds": args.meta_seeds,
              "smoke": args.smoke, "jax": jax.__version__, "device": str(jax.devices()[0]),
              "tasks": {}}
    for name in args.task:
        task = TASKS[name]
        section = {"known_answer": task.threshold, "baseline": task.baseline,
                   "engines": {}}
        for engine in args.engine:
            runs = []
            for seed in args.meta_seeds:
                config = task.configs[engine](seed)
                if args.smoke:
                    config = smaller(config, SMOKE_INNER[name])
                search = run_search(task, engine, config, args.agent_steps,
                                    args.measure_every)
                config = with_budget(config, engine, search["record"]["steps"])
                record = {"meta_seed": seed, **search["record"],
                          "held_out": held_out(search, config, args.held_out_seeds),
                          "config": config.to_dict()}
                runs.append(record)
                print(json.dumps({"task": name, "engine": engine, "meta_seed": seed,
                                  "final_measure": record["final_measure"],
                                  "agent_steps_to_known_answer":
                                      record["agent_steps_to_known_answer"],
                                  "verdict": record["held_out"]["verdict"],
                                  "gain": record["held_out"]["gain"]}), flush=True)
            section["engines"][engine] = {"summary": summarise(runs), "runs": runs}
        report["tasks"][name] = section
    report["load_average_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
