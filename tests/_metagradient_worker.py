"""Subprocess of ``tests/test_metagradient.py``: meta-gradient steps sharded over two fake
CPU devices.

JAX fixes the device count when it starts, so the test runs this script with
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` and reads one JSON object from its
stdout: the sharded side's flattened meta-parameters, agents' returns and meta-losses after
each of ``SHARDED_STEPS`` steps (:func:`test_metagradient.record_steps`), and how many
programs its step compiled. The test runs the same steps on one device itself, with the
program its module's reference run (``RUN``) already compiled: this process compiles the
sharded program only.
"""

from __future__ import annotations

import json

import jax
from test_metagradient import RUN, SHARDED_STEPS, record_steps

from metarl.evolve.config import config_from_dict
from metarl.evolve.metagradient import MetaGradient
from metarl.sharding import population_mesh

# The tests' run (4 agents: 2 per device; agents 0 and 1 restart before the second step,
# so that a restart is sharded too), placed on the mesh given rather than on every device.
EXPERIMENT = {**RUN, "run": {**RUN["run"], "shard": False}}


if __name__ == "__main__":
    assert jax.device_count() == 2, jax.devices()
    metagradient = MetaGradient(config_from_dict(EXPERIMENT), population_mesh(2))
    print(json.dumps(record_steps(metagradient, SHARDED_STEPS)))
