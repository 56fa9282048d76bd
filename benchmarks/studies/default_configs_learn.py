"""What the default configs reach: TD3, SAC and DQN as shipped, returns over seeds.

``TD3Config()`` and ``SACConfig()`` train on Pendulum-v1 (2e4 environment steps per agent),
``DQNConfig()`` on CartPole-v1 (1e5 steps), every field at its default.

Each algorithm trains ``--seeds`` agents in one ``jit(vmap)`` (keys split from
``PRNGKey(--seed)``) and then evaluates every agent with ``learner.evaluate``: the mean
return of the config's ``eval_episodes`` (10) episodes of the deterministic policy (TD3:
the actor's action; SAC: ``tanh`` of the mean) or the greedy one (DQN). The suite's
learning checks (``tests/test_td3_sac.py``, ``tests/test_dqn.py``) train smaller configs,
to stay cheap; this is where the defaults are measured.

Reported per algorithm: the return of every agent, the median, interquartile mean and mean,
each with a 95 % stratified bootstrap interval (:func:`metarl.stats.aggregates`: rliable,
percentile method, a fixed resampling seed), a random policy's return for scale, and the
compile and run seconds (wall clock and process CPU). The XLA flags are those of the
environment (none: XLA's defaults).

    python benchmarks/studies/default_configs_learn.py                   # td3, sac and dqn, 8 seeds
    python benchmarks/studies/default_configs_learn.py --algorithms dqn --seeds 4 --seed 1
    python benchmarks/studies/default_configs_learn.py \\
        --output docs/results/default_configs_learn.json

Prints one JSON document (and writes it to ``--output`` when given), with the command, jax's
version, the CPU, the date and the load average before and after.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

# _per_device.py is in benchmarks/, one folder up
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ALGORITHMS = ("td3", "sac", "dqn")
# A uniformly random policy's mean return: Pendulum-v1 about -1246 (tests/test_ppo.py),
# CartPole-v1 22.4 (1e4 episodes, tests/test_dqn.py).
RANDOM_POLICY_RETURN = {"Pendulum-v1": -1246.0, "CartPole-v1": 22.4}


def default_config(algorithm: str):
    """The library's default config of ``algorithm`` (its environment included)."""
    from inner_loops.dqn import DQNConfig
    from inner_loops.sac import SACConfig
    from inner_loops.td3 import TD3Config

    return {"td3": TD3Config, "sac": SACConfig, "dqn": DQNConfig}[algorithm]()


def train_and_evaluate(config, seeds: int, seed: int) -> dict:
    """Train ``seeds`` agents of ``config`` in one ``jit(vmap)`` and evaluate each.

    Returns ``eval_return [seeds]`` and ``finite [seeds]`` (every training metric finite)
    as lists, and the compile and run seconds, wall clock and process CPU.
    """
    import jax
    import numpy as np

    from inner_loops import make_learner

    learner = make_learner(config)

    def train_one(key):
        train_key, eval_key = jax.random.split(key)
        state, metrics = learner.advance(learner.init(train_key))
        return metrics["finite"].all(), learner.evaluate(state, eval_key)["eval_return"]

    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    started, cpu_started = time.perf_counter(), time.process_time()
    program = jax.jit(jax.vmap(train_one)).lower(keys).compile()
    compiled, cpu_compiled = time.perf_counter(), time.process_time()
    finite, eval_return = jax.device_get(program(keys))
    finished, cpu_finished = time.perf_counter(), time.process_time()
    return {
        "eval_return": [round(float(x), 2) for x in np.asarray(eval_return)],
        "finite": [bool(x) for x in np.asarray(finite)],
        "compile_seconds": round(compiled - started, 2),
        "compile_cpu_seconds": round(cpu_compiled - cpu_started, 2),
        "run_seconds": round(finished - compiled, 2),
        "run_cpu_seconds": round(cpu_finished - cpu_compiled, 2),
    }


def summarise(returns: list[float]) -> dict:
    """Median, IQM and mean of ``returns [S]`` with their 95 % stratified bootstrap
    intervals, and the best and worst agent."""
    from metarl import stats

    estimates = stats.aggregates(returns)
    return {**{name: {key: round(value, 2) for key, value in estimate.to_dict().items()}
               for name, estimate in estimates.items()},
            "best": max(returns), "worst": min(returns)}


def measure(algorithm: str, seeds: int, seed: int) -> dict:
    """One algorithm's default config: its settings, every agent's return and the
    summary."""
    import dataclasses

    config = default_config(algorithm)
    trained = train_and_evaluate(config, seeds, seed)
    return {
        "env_id": config.env_id,
        "total_timesteps": config.total_timesteps,
        "config": {field.name: getattr(config, field.name)
                   for field in dataclasses.fields(config)},
        "random_policy_return": RANDOM_POLICY_RETURN.get(config.env_id),
        **summarise(trained["eval_return"]),
        **trained,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help="comma-separated: td3, sac, dqn")
    parser.add_argument("--seeds", type=int, default=8, help="agents per algorithm")
    parser.add_argument("--seed", type=int, default=0, help="base key: PRNGKey(SEED)")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not args.algorithms or set(args.algorithms) - set(ALGORITHMS):
        parser.error(f"--algorithms: a subset of {', '.join(ALGORITHMS)}")
    if args.seeds < 1:
        parser.error(f"--seeds: expected a positive integer, got {args.seeds}")
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.perf_counter()
    results = {}
    for algorithm in args.algorithms:
        results[algorithm] = measure(algorithm, args.seeds, args.seed)
        print(json.dumps({algorithm: {key: results[algorithm][key]
                                      for key in ("median", "iqm", "eval_return")}}),
              file=sys.stderr, flush=True)
    import jax
    from _per_device import cpu

    text = json.dumps({
        "benchmark": "default_configs_learn",
        "command": shlex.join(["python", "benchmarks/studies/default_configs_learn.py", *argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        **cpu(),
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": round(time.perf_counter() - started, 1),
        "seeds": args.seeds,
        "base_key": f"PRNGKey({args.seed})",
        "results": results,
    }, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
