"""Inner-loop throughput: agent-steps per second of `jit(vmap(train))` by population size.

PureJaxRL's CartPole-v1 settings (4 envs x 128 steps, 4 epochs x 4 minibatches, 64-64 tanh).
Each population size runs in a fresh subprocess so its peak memory (max RSS) is its own.
With ``--devices 1 2``, every population is measured on one CPU device and on two, the
population sharded over them (:func:`metarl.sharding.train_population`): XLA runs one CPU
device largely on one core, so a device per core is how a population uses the whole CPU.
Throughput per step does not depend on the number of updates (the updates are a scan), so
``--total-timesteps`` only trades run time for timing precision.
``agent_steps_per_second`` is from the fastest of ``--repeats`` runs and
``median_agent_steps_per_second`` from their median; on a shared machine the median is the
figure to quote.

    python benchmarks/throughput.py                      # populations 1 16 64 256, 1 device
    python benchmarks/throughput.py --devices 1 2        # ... and sharded over 2 CPU devices
    python benchmarks/throughput.py --populations 64 --total-timesteps 500000

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time


def measure(population: int, total_timesteps: int, repeats: int, devices: int) -> dict:
    import jax

    from metarl import sharding

    sharding.use_cpu_cores(devices)
    from inner_loops import PPOConfig, make_train

    config = PPOConfig(total_timesteps=total_timesteps)
    mesh = sharding.population_mesh(devices) if devices > 1 else None
    train = jax.jit(
        lambda keys: sharding.train_population(make_train(config), keys, mesh=mesh)
    )
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    started = time.perf_counter()
    compiled = train.lower(keys).compile()
    compile_seconds = time.perf_counter() - started
    jax.block_until_ready(compiled(keys))  # warm-up run
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        metrics = compiled(keys)
        jax.block_until_ready(metrics)
        timings.append(time.perf_counter() - started)
    steps = population * config.steps_per_agent
    best = min(timings)
    return {
        "population": population,
        "devices": devices,
        "agent_steps": steps,
        "compile_seconds": round(compile_seconds, 2),
        "run_seconds": [round(t, 3) for t in timings],
        "agent_steps_per_second": round(steps / best),
        "median_agent_steps_per_second": round(steps / statistics.median(timings)),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final_return_mean": float(metrics["episode_return"][:, -1].mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--total-timesteps", type=int, default=131_072,
                        help="steps per agent (default 131072 = 256 updates)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--devices", type=int, nargs="+", default=[1],
                        help="CPU device counts to measure each population on (default 1)")
    parser.add_argument("--single", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single is not None:
        print(json.dumps(measure(args.single, args.total_timesteps, args.repeats,
                                 args.devices[0])))
        return
    results = []
    for population in args.populations:
        for devices in args.devices:
            out = subprocess.run(
                [sys.executable, __file__, "--single", str(population), "--total-timesteps",
                 str(args.total_timesteps), "--repeats", str(args.repeats),
                 "--devices", str(devices)],
                capture_output=True, text=True, check=True,
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), file=sys.stderr)
    import jax

    print(json.dumps({
        "benchmark": "inner_loop_throughput",
        "env": "CartPole-v1",
        "settings": "PureJaxRL: 4 envs x 128 steps, 4 epochs x 4 minibatches, 64-64 tanh",
        "total_timesteps_per_agent": args.total_timesteps,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "cpu": platform.processor() or platform.machine(),
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
