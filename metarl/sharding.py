"""Shard a population of training runs over devices (and hosts) with ``jax.sharding``.

A population is any pytree whose leaves share a leading agent axis ``[P, ...]``: PRNG
keys, meta-parameters, hyperparameters. :func:`train_population` splits that axis over a
1-D device :class:`~jax.sharding.Mesh` with :func:`jax.shard_map`: every device trains its
``P / D`` agents with :func:`inner_loops.ppo.train_population` (one ``vmap``, or
``chunk_size`` agents at a time), and the metrics come back replicated. Agents never talk to
each other, so the sharded result equals the single-device one for the same keys, to
float32 rounding (XLA may round a differently partitioned program differently). Long RL
runs amplify rounding: over generations the candidates, and so the returns, of a run on
2 devices drift apart from the same run on 1. Resume a run on the device count it started
with to continue it exactly.

- **Uneven populations.** ``shard_map`` needs equal shares, so a population that does not
  divide the device count is padded with copies of its last agent to the next multiple and
  the copies are dropped from the result (at most ``D - 1`` wasted runs).
- **Memory and speed.** ``chunk_size`` is *per device*: each device trains its share
  ``chunk_size`` agents at a time, so peak memory per device is set by the chunk, not by
  ``P / D``. Left unset on CPU devices it is :data:`CPU_CHUNK_SIZE`: a minibatch's
  activations for a few dozen agents outgrow a core's cache, and throughput fell from 64 to
  256 agents until the share was trained in chunks (:func:`default_chunk_size`).
- **Hosts.** Under :mod:`jax.distributed` (see :mod:`metarl.distributed`),
  :func:`population_mesh` spans the devices of every process; inputs that every process
  computes identically (the ES state, its keys) are treated as replicated, each process
  trains the agents of its own devices, and the results are gathered to all processes.
- **One device** (no mesh, or a mesh of one device) takes exactly the unsharded code path,
  so nothing changes for single-device users.
- **CPU cores.** XLA runs one CPU device's program largely on one core. :func:`use_cpu_cores`
  (called by the ``metarl`` command line) exposes one CPU device per core, so sharding the
  population puts every core to work: on a 2-core machine about 1.6x the agent-steps per
  second of one device at 64 agents (``benchmarks/throughput.py``).

Shapes: ``P`` agents, ``D`` devices in the mesh, ``U`` PPO updates.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from inner_loops import ppo

POPULATION_AXIS = "population"

# Agents a CPU device trains at once when no chunk size is given. Measured on a 2-core
# machine (PureJaxRL CartPole settings, 2 devices, one process, interleaved): 256 agents
# unchunked ran at 188k agent-steps/s against 212k for 64; in chunks of 32 per device 212k,
# of 16 218k-225k, of 8 219k; 64 agents in chunks of 16 or 8 were no slower than unchunked.
CPU_CHUNK_SIZE = 16


def use_cpu_cores(count: int | None = None) -> int:
    """Make JAX's CPU backend expose ``count`` devices (default: one per usable core).

    Must run before JAX's first computation (JAX raises ``RuntimeError`` otherwise). A
    device count already chosen by the user, through ``JAX_NUM_CPU_DEVICES`` or XLA's
    ``--xla_force_host_platform_device_count``, is kept. Accelerator backends are not
    affected. Returns the number of CPU devices JAX will expose.
    """
    chosen = os.environ.get("JAX_NUM_CPU_DEVICES")
    if chosen:
        return int(chosen)
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith("--xla_force_host_platform_device_count="):
            return int(flag.split("=", 1)[1])
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: must be a positive integer, got {count!r}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as error:
        raise RuntimeError(
            f"use_cpu_cores({count}): JAX has already started in this process, so its CPU "
            "device count can no longer change. Call it before anything computes with JAX; "
            "importing gymnax (and so metarl.config, metarl.run or metarl.evaluate) already "
            "does, so call it before those imports."
        ) from error
    return count


def population_mesh(devices: Sequence[jax.Device] | int | None = None,
                    axis_name: str = POPULATION_AXIS) -> Mesh:
    """A 1-D mesh whose single axis ``axis_name`` carries the population.

    Args:
        devices: the devices to shard over; an ``int`` takes the first that many of
            :func:`jax.devices`; ``None`` (default) takes every device of every process.
        axis_name: name of the mesh axis.
    """
    available = jax.devices()
    if devices is None:
        devices = available
    elif isinstance(devices, int) and not isinstance(devices, bool):
        if not 1 <= devices <= len(available):
            raise ValueError(
                f"devices: asked for {devices} but {len(available)} are visible "
                f"({available[0].platform}); allowed: 1..{len(available)}"
            )
        devices = available[:devices]
    devices = list(devices)
    if not devices:
        raise ValueError("devices: the mesh needs at least one device")
    return Mesh(np.asarray(devices, dtype=object), (axis_name,),
                axis_types=(jax.sharding.AxisType.Auto,))


def num_shards(mesh: Mesh | None) -> int:
    """How many shares a population is split into (1 without a mesh)."""
    return 1 if mesh is None else int(mesh.devices.size)


def padded_size(population_size: int, shards: int) -> int:
    """The smallest multiple of ``shards`` that holds ``population_size`` agents."""
    return -(-population_size // shards) * shards


def pad_population(tree: Any, size: int) -> Any:
    """Extend every leaf's leading axis to ``size`` by repeating its last entry."""

    def pad(x):
        missing = size - x.shape[0]
        if missing < 0:
            raise ValueError(f"pad_population: leading axis {x.shape[0]} exceeds size {size}")
        if missing == 0:
            return x
        return jnp.concatenate([x, jnp.broadcast_to(x[-1:], (missing, *x.shape[1:]))])

    return jax.tree.map(pad, tree)


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding that keeps a full copy of an array on every device of ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def population_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding that splits an array's leading (agent) axis over every mesh axis."""
    return NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Constrain every leaf of ``tree`` to be replicated over ``mesh`` (inside ``jit``)."""
    sharding = replicated(mesh)
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


def put_replicated(tree: Any, mesh: Mesh) -> Any:
    """Place a copy of every leaf of ``tree`` on every device of ``mesh`` (outside ``jit``).

    Works across processes: each process supplies its own (identical) host value for the
    devices it owns, so no process needs to address another's devices. A jitted function
    fed replicated arrays returns replicated arrays (see
    :meth:`metarl.evolution.Evolution.generation`), so its cache keeps one entry.
    """
    sharding = replicated(mesh)

    def put(x):
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(put(jax.random.key_data(x)), impl=impl)
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree)


def default_chunk_size(mesh: Mesh | None = None) -> int | None:
    """The per-device chunk :func:`train_population` uses when none is given:
    :data:`CPU_CHUNK_SIZE` when the devices (``mesh``'s, else the default device) are CPUs,
    ``None`` (the whole share in one ``vmap``) on accelerators."""
    device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
    return CPU_CHUNK_SIZE if device.platform == "cpu" else None


def train_population(train, keys, meta_params=None, hypers=None,
                     chunk_size: int | None = None, mesh: Mesh | None = None):
    """:func:`inner_loops.ppo.train_population`, sharded over ``mesh``.

    Args:
        train: ``make_train(...)`` output.
        keys: ``[P, 2]`` PRNG keys (or any pytree with leading axis ``P``).
        meta_params: pytree with leading axis ``[P]`` (or ``None``: the objective's default).
        hypers: :class:`~inner_loops.ppo.Hyperparams` of ``[P]`` arrays (or ``None``).
        chunk_size: train at most this many agents at once *per device*. ``None``/0:
            :func:`default_chunk_size` (16 on the CPU, the whole share on accelerators);
            a chunk at least the share trains it in one ``vmap``. Chunked and unchunked
            training give the same metrics.
        mesh: devices to shard over (:func:`population_mesh`); ``None`` or a one-device
            mesh runs :func:`inner_loops.ppo.train_population` unchanged.

    Returns metrics ``[P, U]``, replicated over the mesh. Pure and unjitted like the
    unsharded version: wrap the caller in ``jax.jit``.
    """
    if chunk_size is not None:
        try:
            chunk_size = operator.index(chunk_size) or None
        except TypeError:
            raise ValueError(f"chunk_size: must be an integer, got {chunk_size!r}") from None
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    if chunk_size is None:
        chunk_size = default_chunk_size(mesh)
    if num_shards(mesh) == 1:
        return ppo.train_population(train, keys, meta_params, hypers, chunk_size)

    population_size = jax.tree.leaves(keys)[0].shape[0]
    size = padded_size(population_size, num_shards(mesh))
    args = pad_population((keys, meta_params, hypers), size)
    spec = PartitionSpec(tuple(mesh.axis_names))

    def train_share(share):
        return ppo.train_population(train, *share, chunk_size)

    # check_vma=False: the PPO scans start from constants (zeros, NaN) that are identical
    # on every device and become per-device values; nothing here needs the check.
    sharded = jax.shard_map(train_share, mesh=mesh, in_specs=(spec,), out_specs=spec,
                            check_vma=False)
    metrics = sharded(args)
    return replicate(jax.tree.map(lambda x: x[:population_size], metrics), mesh)
