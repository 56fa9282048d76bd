"""Subprocess of ``tests/test_sharding.py``: sharded vs single-device runs on fake CPU devices.

JAX fixes the device count when it starts, so the test runs this script in fresh processes
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` and reads one JSON object from
each one's stdout. The single-device references are computed here too (``mesh=None``:
device 0 only), under the same XLA flags, so the two sides differ only in sharding.

Usage: ``python tests/_sharding_worker.py [PART ...] [--chunked]`` with parts ``plain``,
``structure``, ``generation`` (the unsharded reference), ``generation_sharded`` and
``dqn``; all of them by default. One process runs several parts because
starting one costs several CPU-seconds (importing jax, metarl and, in the first part that
makes a learner, gymnax) before it computes anything. Each part's result is under its own
name in the output, and ``cpu_seconds`` says what each part cost (``start``: the imports
before the first), to split the parts evenly between the test's processes
(``PROCESSES`` in the test).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops import make_learner, population
from inner_loops.dqn import DQNConfig
from inner_loops.population import broadcast_to_population, stack_hyperparams
from inner_loops.ppo import PPOConfig, make_train
from metarl import sharding
from metarl.config import RunConfig
from metarl.evolve.config import ESConfig, ExperimentConfig, FitnessConfig, ObjectiveConfig
from metarl.evolve.generation import Evolution

TINY = PPOConfig(num_envs=2, num_steps=8, total_timesteps=64, hidden_sizes=(8,),
                 update_epochs=1, num_minibatches=1)
PLAIN_AGENTS = 6  # not a multiple of 4 devices: exercises padding
GENERATIONS = 2


def experiment(shard: bool) -> ExperimentConfig:
    """6 candidates × 3 seeds = 18 runs per generation (padded to 20 on 4 devices).

    The objective evolved is a learned optimiser (the optimiser slot, in place of Adam):
    its rule's meta-parameters and per-parameter features travel through the sharded
    program like a loss's, and the loss slots' sharding is the same code path (the main
    job's value distance runs on two devices in ``tests/test_runs.py``)."""
    return ExperimentConfig(
        name="sharding-test",
        objective=ObjectiveConfig(name="learned_optimizer", options={"hidden_sizes": [4]}),
        inner=(TINY.replace(num_steps=16, total_timesteps=128),),
        es=ESConfig(population_size=6, generations=GENERATIONS),
        fitness=FitnessConfig(seeds_per_candidate=3, common_seeds=False),
        run=RunConfig(shard=shard, chunk_size=1, progress=False),
    )


def listed(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float64).tolist(), tree)


def listed_leaves(tree) -> list:
    """Every leaf of ``tree`` (any pytree, e.g. a learner's state) as nested lists."""
    return [np.asarray(jax.device_get(x), np.float64).tolist() for x in jax.tree.leaves(tree)]


def plain() -> dict:
    """``train_population`` of 6 agents, unsharded and sharded (``--chunked``: also chunked),
    and sharded in two segments of ``init_population`` / ``advance_population`` (6 agents
    do not divide 4 devices: the states come back replicated between segments).

    Sharded chunking is checked numerically by the generations (``chunk_size=1``) and
    structurally by :func:`structure`, so the test skips the chunked compilation here.
    """
    train = make_train(TINY)
    keys = jax.random.split(jax.random.PRNGKey(3), PLAIN_AGENTS)
    hypers = broadcast_to_population(TINY.hyperparams(), PLAIN_AGENTS)
    mesh = sharding.population_mesh()
    results, seconds = {}, {}
    runs = {
        "reference": lambda k, h: population.train_population(train, k, None, h),
        "sharded": lambda k, h: sharding.train_population(train, k, None, h, mesh=mesh),
    }
    learner = make_learner(TINY)
    first = TINY.num_updates // 2

    def sharded_segments(k, h):
        states = sharding.init_population(learner, k, None, h, mesh=mesh)
        states, early = sharding.advance_population(learner, states, None, h, first, mesh=mesh)
        states, late = sharding.advance_population(learner, states, None, h,
                                                   TINY.num_updates - first, mesh=mesh)
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), early, late)

    runs["sharded_segments"] = sharded_segments
    if "--chunked" in sys.argv:
        runs["sharded_chunked"] = lambda k, h: sharding.train_population(train, k, None, h, 1,
                                                                         mesh)
    for name, fn in runs.items():
        started = time.perf_counter()
        metrics = jax.block_until_ready(jax.jit(fn)(keys, hypers))
        seconds[name] = time.perf_counter() - started
        results[name] = {
            "metrics": listed(metrics),
            "sharding": str(metrics["episode_return"].sharding),
        }
    return {"results": results, "seconds": seconds}


def structure() -> dict:
    """What each device runs when 64 agents are sharded over 4 devices in chunks of 4.

    Traced only (no compilation): the shard_map body sees 16 agents and walks them in a
    scan of 4 chunks, so a device never holds more than 4 agents' buffers at once.
    """
    train = make_train(TINY)
    keys = jax.random.split(jax.random.PRNGKey(0), 64)
    mesh = sharding.population_mesh()
    jaxpr = jax.make_jaxpr(lambda k: sharding.train_population(train, k, chunk_size=4,
                                                               mesh=mesh))(keys).jaxpr
    [shard_eqn] = [e for e in jaxpr.eqns if e.primitive.name == "shard_map"]
    body = shard_eqn.params["jaxpr"]
    scans = [e for e in body.eqns if e.primitive.name == "scan"]
    vmapped = [e for e in body.eqns if e.primitive.name != "scan"]
    return {
        # the agents' keys; scalar constants the learner closes over come in replicated
        "local_agents": int(next(v for v in body.invars if v.aval.ndim).aval.shape[0]),
        "scan_lengths": [int(e.params["length"]) for e in scans],
        "chunk_batch": [int(next(v for v in e.params["jaxpr"].jaxpr.invars if v.aval.ndim)
                            .aval.shape[0]) for e in scans],
        "other_primitives": sorted({e.primitive.name for e in vmapped}),
        "output_spec": str(shard_eqn.params["out_specs"]),
    }


DQN_TINY = DQNConfig(num_envs=2, train_frequency=2, gradient_steps=2, total_timesteps=64,
                     buffer_size=32, batch_size=8, learning_starts=16,
                     target_update_interval=2, hidden_sizes=(8,), exploration_fraction=0.5)
DQN_SEGMENT = 8  # of 16 updates
# A multiple of 4 devices: states left split over the devices cannot be padded and cut
# back (6 agents' states fail with an IndivisibleError); padding is checked by ``plain``.
DQN_AGENTS = 6  # not a multiple of the 4 devices: padded, and states come back whole


def dqn() -> dict:
    """6 DQN agents with their own hyperparameters, on one device and sharded over all.

    ``reference``: one device, ``init_population`` then ``advance_population`` over the
    whole budget (final states and metrics). ``sharded``: ``sharding.train_population``,
    what evolution runs (metrics). ``sharded_segments``: sharded ``init_population``, then
    two sharded segments of ``advance_population`` (final states and metrics), so the
    states (replay buffers included) stay split over the devices between segments.
    """
    learner = make_learner(DQN_TINY)
    keys = jax.random.split(jax.random.PRNGKey(5), DQN_AGENTS)
    hypers = stack_hyperparams([
        DQN_TINY.replace(learning_rate=lr, gamma=gamma, epsilon_end=eps).hyperparams()
        for lr, gamma, eps in zip((1e-3, 3e-3, 1e-2, 3e-4, 1e-3, 3e-3),
                                  (0.99, 0.9, 0.5, 0.99, 0.95, 0.8),
                                  (0.05, 0.2, 0.0, 0.1, 0.3, 0.05), strict=True)])
    mesh = sharding.population_mesh()

    def reference(k, h):
        states = population.init_population(learner, k, None, h)
        return population.advance_population(learner, states, None, h)

    def sharded_train(k, h):
        return sharding.train_population(learner.train, k, None, h, mesh=mesh)

    init = jax.jit(lambda k, h: sharding.init_population(learner, k, None, h, mesh=mesh))
    advance = jax.jit(lambda s, h: sharding.advance_population(
        learner, s, None, h, num_updates=DQN_SEGMENT, mesh=mesh))

    def sharded_segments(k, h):
        states = init(k, h)
        states, first = advance(states, h)
        shards = len(states.buffer.size.sharding.device_set)
        states, second = advance(states, h)
        metrics = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), first, second)
        return (states, metrics), shards

    results, seconds = {}, {}
    started = time.perf_counter()
    states, metrics = jax.block_until_ready(jax.jit(reference)(keys, hypers))
    seconds["reference"] = time.perf_counter() - started
    results["reference"] = {"metrics": listed(metrics), "states": listed_leaves(states)}
    started = time.perf_counter()
    metrics = jax.block_until_ready(jax.jit(sharded_train)(keys, hypers))
    seconds["sharded"] = time.perf_counter() - started
    results["sharded"] = {"metrics": listed(metrics),
                          "sharding": str(metrics["episode_return"].sharding)}
    started = time.perf_counter()
    (states, metrics), shards = sharded_segments(keys, hypers)
    jax.block_until_ready(states)
    seconds["sharded_segments"] = time.perf_counter() - started
    results["sharded_segments"] = {"metrics": listed(metrics), "states": listed_leaves(states),
                                   "state_devices": shards}
    return {"results": results, "seconds": seconds, "num_updates": learner.num_updates}


def run_generations(shard: bool) -> dict:
    evolution = Evolution(experiment(shard))
    state = evolution.init()
    fitness, seconds = [], []
    for _ in range(GENERATIONS):
        started = time.perf_counter()
        state, metrics = evolution.step(state)
        jax.block_until_ready(state)
        seconds.append(time.perf_counter() - started)
        fitness.append(np.asarray(metrics["fitness"], np.float64).tolist())
    mean = jnp.concatenate([jnp.ravel(x) for x in
                            jax.tree.leaves(evolution.mean_meta_params(state))])
    return {
        "fitness": fitness,
        "mean": np.asarray(mean, np.float64).tolist(),
        "best_fitness": float(state.best_fitness),
        "cache_size": evolution.step._cache_size(),
        "mesh_devices": sharding.num_shards(evolution.mesh),
        "seconds": seconds,
        "sharding": str(metrics["fitness"].sharding),
    }


TASKS = {
    "plain": plain,
    "structure": structure,
    "generation": lambda: run_generations(False),
    "generation_sharded": lambda: run_generations(True),
    "dqn": dqn,
}


def main(parts: list[str]) -> None:
    # A hang prints every thread's stack and exits, so the test fails with a reason.
    faulthandler.dump_traceback_later(float(os.environ.get("WORKER_WATCHDOG", "250")),
                                      exit=True)
    out = {"devices": jax.device_count(), "platform": jax.devices()[0].platform,
           "cpu_seconds": {"start": time.process_time()}}
    for part in [p for p in parts if not p.startswith("--")] or list(TASKS):
        started = time.process_time()
        out[part] = TASKS[part]()
        out["cpu_seconds"][part] = time.process_time() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
