"""What PBT's machinery costs on top of the plain vmapped population.

Three ways to train the same population over the same segments, timed interleaved so
machine noise hits them alike (best and median of ``--repeats``):

- ``plain``: one jitted ``advance_population`` per segment, nothing else;
- ``pbt``: PBT's jitted segment (advance, rank, copy whole states, perturb hyperparameters)
  and the host-side record of each segment (fitness, hyperparameters, exploit, returns);
- ``pbt_checkpointed``: the same plus an orbax checkpoint of the whole population state
  after every segment.

The target is an overhead of at most 5 %. The population is sharded over all CPU devices
(one per core), as a run would be.

    python benchmarks/studies/pbt_overhead.py                     # PPO, CartPole, 16 members
    python benchmarks/studies/pbt_overhead.py --population 64 --segments 4

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax

import metarl
from inner_loops import PPOConfig, make_learner
from metarl import sharding
from metarl.population.pbt import PBTConfig, initial_population, make_segment, segment_record
from metarl.population.priors import Prior


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--segment-updates", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts

    import orbax.checkpoint as ocp

    updates = args.segments * args.segment_updates
    learner = make_learner(PPOConfig(total_timesteps=updates * 512))
    config = PBTConfig(population_size=args.population, segment_updates=args.segment_updates,
                       priors={"learning_rate": Prior(1e-4, 1e-2, log=True)})
    mesh = sharding.population_mesh()
    key = jax.random.PRNGKey(0)
    states, hypers = initial_population(learner, config, key, mesh=mesh)
    segment = make_segment(learner, config, mesh=mesh)
    plain = jax.jit(lambda s, h: sharding.advance_population(
        learner, s, None, h, args.segment_updates, mesh=mesh))
    keys = jax.random.split(key, args.segments)
    checkpoint_root = Path(tempfile.mkdtemp(prefix="metarl-pbt-overhead-"))
    checkpointer = ocp.StandardCheckpointer()

    def run_plain():
        current = states
        for _ in range(args.segments):
            current, metrics = plain(current, hypers)
        jax.block_until_ready((current, metrics))

    def run_pbt(checkpoint: bool):
        current, current_hypers, history = states, hypers, []
        folder = checkpoint_root / str(time.monotonic_ns())
        for index in range(args.segments):
            trained_with = current_hypers
            current, current_hypers, metrics, fitness, record = segment(
                current, current_hypers, keys[index], jax.numpy.asarray(True))
            history.append(segment_record(trained_with, metrics, fitness, record))
            if checkpoint:
                checkpointer.save(folder / str(index), current)
        if checkpoint:
            checkpointer.wait_until_finished()
            shutil.rmtree(folder, ignore_errors=True)
        jax.block_until_ready(current)

    variants = {"plain": run_plain, "pbt": lambda: run_pbt(False),
                "pbt_checkpointed": lambda: run_pbt(True)}
    compile_seconds = {}
    for name, run in variants.items():  # the first call compiles
        started = time.perf_counter()
        run()
        compile_seconds[name] = round(time.perf_counter() - started, 2)
    seconds = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    shutil.rmtree(checkpoint_root, ignore_errors=True)

    def overhead(name, pick):
        return round(pick(seconds[name]) / pick(seconds["plain"]) - 1.0, 4)

    steps = args.population * learner.steps_per_update * updates
    print(json.dumps({
        "benchmark": "pbt_overhead",
        "settings": "PPO, CartPole-v1, PureJaxRL's settings, learning-rate prior 1e-4..1e-2",
        "population": args.population, "segments": args.segments,
        "segment_updates": args.segment_updates, "devices": len(mesh.devices),
        "repeats": args.repeats,
        "seconds": {name: [round(s, 3) for s in values] for name, values in seconds.items()},
        "agent_steps_per_second": {name: round(steps / min(values))
                                   for name, values in seconds.items()},
        "overhead_best": {name: overhead(name, min) for name in ("pbt", "pbt_checkpointed")},
        "overhead_median": {name: overhead(name, statistics.median)
                            for name in ("pbt", "pbt_checkpointed")},
        "first_call_seconds": compile_seconds,
    }, indent=1))


if __name__ == "__main__":
    main()
