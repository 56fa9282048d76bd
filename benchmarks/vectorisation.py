"""Sequential vs vectorised vs vectorised-and-chunked training of a population of PPO agents.

The question of fast population-based RL (Flajolet et al., 2022), on this toolkit's PPO with
PureJaxRL's CartPole-v1 settings (4 envs x 128 steps, 4 epochs x 4 minibatches, 64-64 tanh):

- ``sequential``: a Python loop over one jitted single-agent ``train`` (compiled once,
  its compile time repeated in every row), each agent trained to completion before the
  next starts;
- ``sequential_async`` (not run by default): the same loop without waiting in between.
  JAX's asynchronous dispatch then lets the CPU run several agents' programs at once on
  different cores, so it is not sequential any more; shown for completeness;
- ``vectorised``: ``jit(vmap(train))`` over the whole population (compiled per size);
- ``chunked``: ``jit`` of ``lax.map`` over vmapped chunks of ``--chunk-size`` agents
  (:func:`inner_loops.population.train_population`); when the population fits in one chunk this
  is the very program of ``vectorised`` (compiled once, timed separately);
- ``sharded``: the population split over one CPU device per core (``--devices``), as
  ``metarl`` trains it (:func:`metarl.sharding.train_population`, each device training 16
  agents at a time, its CPU default). XLA runs one CPU device's program largely on one
  core; a device per core is how one process uses them all. The other modes run on the
  first device.

For every population size the modes are compiled first, then run in turn ``--repeats``
times (interleaved, so load on a shared machine hits all alike); the best time counts and
speed-ups are ratios within this one run. Both wall time and the process's CPU time are
recorded: on a machine shared with other work the CPU time (``cpu_seconds``,
``speedup_over_sequential_cpu``) measures the work each mode needs more stably than the
wall clock, which also measures how much of the CPU the process was given. Throughput
does not depend on the number of updates (a scan), so ``--updates`` stays small to keep
the benchmark to minutes.

    python benchmarks/vectorisation.py                          # populations 1 4 16 64 256
    python benchmarks/vectorisation.py --populations 1,64 --modes sequential,vectorised
    python benchmarks/vectorisation.py --plot vectorisation.png

Prints one JSON document; ``--plot PATH`` also draws agent-steps per second and compile
time against population size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax

from inner_loops.population import train_population
from inner_loops.ppo import PPOConfig, make_train
from metarl import sharding

MODES = ("sequential", "vectorised", "chunked", "sharded", "sequential_async")
DEFAULT_MODES = ("sequential", "vectorised", "chunked", "sharded")
STEPS_PER_UPDATE = 4 * 128  # PureJaxRL CartPole: num_envs x num_steps


def build_sequential(train):
    """``(compile_seconds, run, run_async)``: one jitted agent, compiled once."""
    started = time.perf_counter()
    single = jax.jit(train).lower(jax.random.PRNGKey(0)).compile()
    compile_seconds = time.perf_counter() - started

    def run(keys):
        return [jax.block_until_ready(single(key)) for key in keys]

    def run_async(keys):
        return jax.block_until_ready([single(key) for key in keys])

    return compile_seconds, run, run_async


def build_population(train, population: int, chunk_size: int, mesh=None):
    """``(compile_seconds, run)`` for ``train_population`` (vmapped, optionally chunked,
    optionally sharded over ``mesh``)."""
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    started = time.perf_counter()
    if mesh is None:
        program = jax.jit(lambda k: train_population(train, k, None, None, chunk_size))
    else:
        program = jax.jit(lambda k: sharding.train_population(train, k, mesh=mesh))
    compiled = program.lower(keys).compile()
    compile_seconds = time.perf_counter() - started

    def run(keys):
        return jax.block_until_ready(compiled(keys))

    return compile_seconds, run


def benchmark(populations, modes, updates: int, chunk_size: int, repeats: int,
              mesh=None) -> list[dict]:
    config = PPOConfig(total_timesteps=updates * STEPS_PER_UPDATE)
    train = make_train(config)
    if {"sequential", "sequential_async"} & set(modes):
        sequential_compile, sequential, sequential_async = build_sequential(train)
    rows = []
    for population in populations:
        keys = jax.random.split(jax.random.PRNGKey(1), population)
        runs, compile_seconds, same = {}, {}, {}
        one_chunk = chunk_size >= population  # then chunked is the vectorised program
        for mode in modes:
            other = {"vectorised": "chunked", "chunked": "vectorised"}.get(mode)
            if mode == "sequential":
                compile_seconds[mode], runs[mode] = sequential_compile, sequential
            elif mode == "sequential_async":
                compile_seconds[mode], runs[mode] = sequential_compile, sequential_async
            elif mode == "sharded":
                compile_seconds[mode], runs[mode] = build_population(train, population, None,
                                                                     mesh)
            elif one_chunk and other in runs:
                compile_seconds[mode], runs[mode] = compile_seconds[other], runs[other]
                same[mode] = other
            else:
                chunk = chunk_size if mode == "chunked" and not one_chunk else population
                compile_seconds[mode], runs[mode] = build_population(train, population, chunk)
            runs[mode](keys)  # warm-up
        timings = {mode: [] for mode in modes}
        cpu = {mode: [] for mode in modes}
        for _ in range(repeats):
            for mode in modes:
                started, cpu_started = time.perf_counter(), time.process_time()
                runs[mode](keys)
                timings[mode].append(time.perf_counter() - started)
                cpu[mode].append(time.process_time() - cpu_started)
        steps = population * config.steps_per_agent
        row = {"population": population, "agent_steps": steps}
        for mode in modes:
            best = min(timings[mode])
            row[mode] = {
                "compile_seconds": round(compile_seconds[mode], 2),
                "run_seconds": [round(t, 4) for t in timings[mode]],
                "cpu_seconds": [round(t, 4) for t in cpu[mode]],
                "agent_steps_per_second": round(steps / best),
                "agent_steps_per_cpu_second": round(steps / min(cpu[mode])),
            }
            if mode in same:
                row[mode]["same_program_as"] = same[mode]
        if "chunked" in modes:
            row["chunked"]["chunks"] = -(-population // chunk_size)
        if "sequential" in modes:
            for suffix, key in (("", "agent_steps_per_second"),
                                ("_cpu", "agent_steps_per_cpu_second")):
                base = row["sequential"][key]
                row["speedup_over_sequential" + suffix] = {
                    mode: round(row[mode][key] / base, 2) for mode in modes
                    if mode != "sequential"
                }
        rows.append(row)
        print(json.dumps(row), flush=True, file=sys.stderr)  # progress
    return rows


def plot(rows: list[dict], modes, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    populations = [row["population"] for row in rows]
    figure, (speed, compile_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in modes:
        speed.plot(populations, [row[mode]["agent_steps_per_second"] for row in rows],
                   marker="o", label=mode)
        compile_axis.plot(populations, [row[mode]["compile_seconds"] for row in rows],
                          marker="o", label=mode)
    for axis, label in ((speed, "agent-steps per second"), (compile_axis, "compile seconds")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("population (agents)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend()
    speed.set_yscale("log")
    figure.suptitle(f"PPO on CartPole-v1 (PureJaxRL settings), one process, "
                    f"{os.cpu_count()} CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", type=ints, default=[1, 4, 16, 64, 256])
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated subset of {', '.join(MODES)}")
    parser.add_argument("--updates", type=int, default=2, help="PPO updates per agent")
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--devices", type=int, default=None,
                        help="CPU devices for the sharded mode (default: one per core)")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a PNG here")
    args = parser.parse_args()
    devices = sharding.use_cpu_cores(args.devices)  # before JAX's first computation
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown}; allowed: {', '.join(MODES)}")
    if args.updates < 1 or args.chunk_size < 1 or args.repeats < 1:
        parser.error("--updates, --chunk-size and --repeats must be positive")

    mesh = sharding.population_mesh(devices) if "sharded" in modes else None
    rows = benchmark(args.populations, modes, args.updates, args.chunk_size, args.repeats,
                     mesh)
    result = {
        "benchmark": "vectorisation",
        "settings": "PureJaxRL CartPole-v1: 4 envs x 128 steps, 4 epochs x 4 minibatches, "
                    "64-64 tanh",
        "updates": args.updates,
        "chunk_size": args.chunk_size,
        "repeats": args.repeats,
        "note": "agent_steps_per_second (wall clock) and agent_steps_per_cpu_second (process "
                "CPU time) use the best of the repeats, compile time excluded; the modes run "
                "interleaved in one process, so their ratios are comparable. On a machine "
                "shared with other work prefer the CPU-time ratios. Few updates: throughput "
                "does not depend on them.",
        "devices": [str(d) for d in jax.devices()],
        "cpus": os.cpu_count(),
        "jax_version": jax.__version__,
        "results": rows,
    }
    at_64 = [row for row in rows if row["population"] == 64 and "speedup_over_sequential" in row]
    if at_64:
        speedups = at_64[0]["speedup_over_sequential"]
        result["target"] = {f"{mode}_over_sequential_at_64": speedups[mode]
                            for mode in ("vectorised", "sharded") if mode in speedups}
        result["target"].update(wanted=2.0, met=max(result["target"].values()) >= 2.0)
    if args.plot:
        plot(rows, modes, args.plot)
        result["plot"] = args.plot
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
