"""Peak memory of training a population of PPO agents, by population size and chunk size.

PureJaxRL's CartPole-v1 settings (4 envs x 128 steps, 4 epochs x 4 minibatches, 64-64 tanh).
Every setting runs in a fresh subprocess, which reports its own peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss``: compilation, buffers and all), next to XLA's
compile-time estimate of the program's temporary buffers. A child that imports JAX and
builds ``train`` without compiling anything gives the fixed cost (``baseline_rss_mb``).

Memory does not depend on ``total_timesteps``: the updates are a ``lax.scan`` that reuses
the same buffers, and the per-update metrics are a few floats. So each run trains only
``--updates`` updates (default 1) to stay fast; ``--updates 1,4`` shows the independence.

    python benchmarks/memory.py                                  # 64..4096, chunks all/64/256
    python benchmarks/memory.py --populations 4096 --chunk-sizes 256
    python benchmarks/memory.py --populations 256 --chunk-sizes all,16 --devices 4

``--chunk-sizes all`` means no chunking (one ``vmap`` over the population); with
``--devices N`` the population is sharded over N CPU devices and the chunk is per device.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

BUDGET_GB = 24.0
STEPS_PER_UPDATE = 4 * 128  # PureJaxRL CartPole: num_envs x num_steps


def child(population: int, chunk_size: int | str, updates: int, devices: int, mode: str) -> dict:
    """Runs inside the subprocess: build, compile and train one population once."""
    import jax

    from inner_loops.ppo import PPOConfig, make_train
    from metarl import sharding

    config = PPOConfig(total_timesteps=updates * STEPS_PER_UPDATE)
    train = make_train(config)
    if mode == "baseline":
        return {"mode": "baseline"}
    mesh = sharding.population_mesh(devices) if devices > 1 else None

    def run(keys):
        # "all": one chunk as large as the population (not the CPU's automatic 16)
        chunk = population if chunk_size == "all" else chunk_size
        return sharding.train_population(train, keys, chunk_size=chunk, mesh=mesh)

    keys = jax.random.split(jax.random.PRNGKey(0), population)
    started = time.perf_counter()
    compiled = jax.jit(run).lower(keys).compile()
    compile_seconds = time.perf_counter() - started
    analysis = compiled.memory_analysis()
    started = time.perf_counter()
    metrics = jax.block_until_ready(compiled(keys))
    run_seconds = time.perf_counter() - started
    return {
        "compile_seconds": round(compile_seconds, 2),
        "run_seconds": round(run_seconds, 2),
        "xla_temp_mb": round(analysis.temp_size_in_bytes / 2**20, 1) if analysis else None,
        "finite": bool(metrics["finite"].all()),
        "agent_steps_per_second": round(population * config.steps_per_agent / run_seconds),
    }


def measure(population: int, chunk_size: int | str, updates: int, devices: int, timeout: float,
            mode: str = "train") -> dict:
    """Run one setting in a fresh process; return its result and its peak RSS."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    command = [sys.executable, os.path.abspath(__file__), "--child", mode, str(population),
               str(chunk_size), str(updates), str(devices)]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return {"error": f"timed out after {timeout}s"}
    wall = time.perf_counter() - started
    if process.returncode != 0:
        return {"error": f"exit {process.returncode}", "stderr_tail": err[-1500:]}
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_seconds"] = round(wall, 1)
    return result


def run_child(argv: list[str]) -> None:
    import resource

    mode, population, chunk_size, updates, devices = argv
    chunk = chunk_size if chunk_size == "all" else int(chunk_size)
    result = child(int(population), chunk, int(updates), int(devices), mode)
    result["peak_rss_mb"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    print(json.dumps(result), flush=True)


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def chunk_sizes(text: str) -> list[int | str]:
    """``all`` (no chunking) or positive integers, comma-separated."""
    sizes = [part.strip() if part.strip() == "all" else int(part) for part in text.split(",")
             if part.strip()]
    if any(size != "all" and size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"chunk sizes are 'all' or positive, got {text!r}")
    return sizes


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", type=ints, default=[64, 256, 1024, 4096])
    parser.add_argument("--chunk-sizes", type=chunk_sizes, default=["all", 64, 256],
                        help="'all': no chunking; chunks >= the population are skipped")
    parser.add_argument("--updates", type=ints, default=[1],
                        help="PPO updates per run (memory does not depend on it)")
    parser.add_argument("--devices", type=int, default=1,
                        help="shard over this many (fake) CPU devices; chunks are per device")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per setting")
    parser.add_argument("--budget-gb", type=float, default=BUDGET_GB)
    args = parser.parse_args()

    baseline = measure(1, "all", 1, args.devices, args.timeout, mode="baseline")
    rows = []
    for population in args.populations:
        per_device = -(-population // args.devices)
        for chunk_size in args.chunk_sizes:
            if chunk_size != "all" and chunk_size >= per_device:
                continue  # the same program as no chunking
            for updates in args.updates:
                row = {"population": population, "chunk_size": chunk_size,
                       "updates": updates, "devices": args.devices}
                row.update(measure(population, chunk_size, updates, args.devices, args.timeout))
                if "peak_rss_mb" in row:
                    row["fits_budget"] = row["peak_rss_mb"] / 1024 <= args.budget_gb
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # progress
    print(json.dumps({
        "benchmark": "memory",
        "settings": "PureJaxRL CartPole-v1: 4 envs x 128 steps, 4 epochs x 4 minibatches, "
                    "64-64 tanh",
        "note": "each setting in a fresh process; peak_rss_mb is the process's maximum "
                "resident memory (ru_maxrss), xla_temp_mb XLA's estimate of temporary "
                "buffers. Only a few updates are trained because memory does not depend on "
                "total_timesteps (the updates are a lax.scan). chunk_size all = no chunking; "
                "with devices > 1 the chunk is per device.",
        "budget_gb": args.budget_gb,
        "baseline_rss_mb": baseline.get("peak_rss_mb"),
        "jax_version": __import__("jax").__version__,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor()},
        "results": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
