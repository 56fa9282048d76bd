"""Subprocess of ``tests/test_metagradient.py``: meta-gradient steps sharded over two fake
CPU devices against the same steps on one device, in one process.

JAX fixes the device count when it starts, so the test runs this script with
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` and reads one JSON object from its
stdout: per side the flattened meta-parameters, the agents' returns and meta-losses after
each of ``STEPS`` steps, and how many programs each side's step compiled.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.flatten_util import ravel_pytree
from test_metagradient import DRIFT  # the tests' tiny drift problem

from metarl.evolve.config import config_from_dict
from metarl.evolve.metagradient import MetaGradient
from metarl.sharding import population_mesh

STEPS = 2
# The tiny drift problem of the tests (4 agents: 2 per device), one agent restarting after
# the first step so that a restart is sharded too.
EXPERIMENT = {
    **DRIFT,
    "meta": {"method": "metagradient", "unroll": 1, "agents": 4, "lifetime": 2,
             "learning_rate": 0.01},
    "run": {"progress": False, "shard": False},
}


def run(mesh) -> dict:
    metagradient = MetaGradient(config_from_dict(EXPERIMENT), mesh)
    state = metagradient.init()
    sides = {"meta_params": [], "returns": [], "meta_loss": [], "restarted": []}
    for _ in range(STEPS):
        state, metrics = metagradient.step(state)
        sides["meta_params"].append(np.asarray(ravel_pytree(state.meta_params)[0]).tolist())
        sides["returns"].append(np.asarray(metrics["returns"]).tolist())
        sides["meta_loss"].append(float(metrics["meta_loss"]))
        sides["restarted"].append(int(metrics["restarted"]))
    sides["programs"] = metagradient.step._cache_size()
    sides["devices"] = 1 if metagradient.mesh is None else int(metagradient.mesh.devices.size)
    return sides


if __name__ == "__main__":
    assert jax.device_count() == 2, jax.devices()
    print(json.dumps({"sharded": run(population_mesh(2)), "plain": run(None)}))
