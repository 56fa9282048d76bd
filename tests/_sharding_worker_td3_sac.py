"""Subprocess of ``tests/test_td3_sac.py``: TD3 and SAC populations sharded over 4 fake CPU
devices against the same populations on one device.

The test runs this script with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (JAX
fixes the device count when it starts) and reads one JSON object from its stdout: for each
algorithm the metrics of 6 agents (padded to 8 on 4 devices) trained by
:func:`inner_loops.population.train_population` on device 0 and by
:func:`metarl.sharding.train_population` over the mesh.
"""

from __future__ import annotations

import faulthandler
import json
import os

import jax
import numpy as np

from inner_loops import make_learner, population
from inner_loops.population import broadcast_to_population
from inner_loops.sac import SACConfig
from inner_loops.td3 import TD3Config
from metarl import sharding

AGENTS = 6  # not a multiple of 4 devices: exercises padding
CONFIGS = {
    "td3": TD3Config(num_envs=2, train_frequency=2, gradient_steps=4, policy_delay=2,
                     total_timesteps=64, buffer_size=32, batch_size=8, learning_starts=16,
                     actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)),
    "sac": SACConfig(num_envs=2, train_frequency=2, gradient_steps=2, total_timesteps=64,
                     buffer_size=32, batch_size=8, learning_starts=16,
                     actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)),
}


def listed(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float64).tolist(), tree)


def compare(config) -> dict:
    learner = make_learner(config)
    keys = jax.random.split(jax.random.PRNGKey(3), AGENTS)
    hypers = broadcast_to_population(learner.default_hypers, AGENTS)
    mesh = sharding.population_mesh()
    reference = jax.jit(lambda k, h: population.train_population(learner.train, k, None, h,
                                                                 chunk_size=AGENTS))
    sharded = jax.jit(lambda k, h: sharding.train_population(learner.train, k, None, h,
                                                             AGENTS, mesh))
    sharded_metrics = sharded(keys, hypers)
    return {"reference": listed(reference(keys, hypers)),
            "sharded": listed(sharded_metrics),
            "sharding": str(sharded_metrics["episode_return"].sharding)}


def main() -> None:
    # A hang prints every thread's stack and exits, so the test fails with a reason.
    faulthandler.dump_traceback_later(float(os.environ.get("WORKER_WATCHDOG", "250")),
                                      exit=True)
    out = {"devices": jax.device_count()}
    for name, config in CONFIGS.items():
        out[name] = compare(config)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
