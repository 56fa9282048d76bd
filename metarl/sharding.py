"""Shard a population of agents over devices (and hosts) with ``jax.sharding``.

A population is any pytree whose leaves share a leading agent axis ``[P, ...]``: PRNG
keys, meta-parameters, hyperparameters, agent states. :func:`train_population`,
:func:`init_population` and :func:`advance_population` split that axis over a 1-D device
:class:`~jax.sharding.Mesh` with :func:`jax.shard_map`: every device runs its ``P / D``
agents with :mod:`inner_loops.population` (one ``vmap``, or ``chunk_size`` agents at a
time). Metrics come back replicated; states stay split over the devices, ready for the
next segment. Agents never talk to each other, so the sharded result equals the
single-device one for the same keys, to float32 rounding (XLA may round a differently
partitioned program differently). Long RL runs amplify rounding: over generations the
candidates, and so the returns, of a run on 2 devices drift apart from the same run on 1.
Resume a run on the device count it started with to continue it exactly.

- **Uneven populations.** ``shard_map`` needs equal shares, so a population that does not
  divide the device count is padded with copies of its last agent to the next multiple and
  the copies are dropped from the result (at most ``D - 1`` wasted runs). States of such a
  population (:func:`init_population`, :func:`advance_population`) come back replicated
  rather than split, since ``P`` agents cannot be split evenly over ``D`` devices.
- **Memory and speed.** ``chunk_size`` is *per device* (see :mod:`inner_loops.population`
  for its one meaning, ``"auto"`` by default): peak memory per device is set by the chunk,
  not by ``P / D``.
- **Hosts.** Under :mod:`jax.distributed` (see :mod:`metarl.distributed`),
  :func:`population_mesh` spans the devices of every process; inputs that every process
  computes identically (the ES state, its keys) are treated as replicated, each process
  trains the agents of its own devices, and the results are gathered to all processes.
- **One device** (no mesh, or a mesh of one device) takes exactly the unsharded code path,
  so nothing changes for single-device users.
- **CPU cores.** XLA runs one CPU device's program largely on one core.
  :func:`use_cpu_cores` (called when ``metarl`` is imported, before JAX starts) exposes one
  CPU device per core, so sharding the population puts every core to work.

Shapes: ``P`` agents, ``D`` devices in the mesh, ``U`` updates.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from inner_loops import population
from inner_loops.population import AUTO, ChunkSize
from inner_loops.validation import check_positive_int

POPULATION_AXIS = "population"


COLLECTIVE_WAIT_SECONDS = 1800
_TERMINATE_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"


def _wait_patiently_for_collectives() -> None:
    """Raise XLA's CPU rendezvous abort timeout to :data:`COLLECTIVE_WAIT_SECONDS` through
    ``XLA_FLAGS`` (read when JAX's CPU backend starts), unless the user set it."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _TERMINATE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_TERMINATE_FLAG}={COLLECTIVE_WAIT_SECONDS}".strip()


def use_cpu_cores(count: int | None = None) -> int:
    """Make JAX's CPU backend expose ``count`` devices (default: one per usable core).

    Importing metarl changes nothing; the ``metarl`` command calls this before it runs
    (``--cpu-devices``), and a script or notebook calls it (as ``metarl.use_cpu_cores()``)
    before JAX's first computation to shard its populations over every core (JAX raises
    ``RuntimeError`` once it has started). A count the user already chose is kept:
    ``JAX_NUM_CPU_DEVICES``, XLA's ``--xla_force_host_platform_device_count``, or, when
    ``count`` is not given, ``jax.config.update("jax_num_cpu_devices", n)``. Accelerator
    backends are not affected. Returns the number of CPU devices JAX will expose.

    It also lets the CPU devices wait for each other as long as XLA lets any collective
    wait (:data:`COLLECTIVE_WAIT_SECONDS`) instead of XLA's 40 seconds, after which XLA
    aborts the process: a sharded run on a busy machine (a niced job, an oversubscribed
    core) can leave one device's thread that long behind the other's, and the abort
    loses the generation in progress. A value already in ``XLA_FLAGS`` is kept.
    """
    devices = _expose_cpu_devices(count)
    _wait_patiently_for_collectives()
    return devices


def _expose_cpu_devices(count: int | None) -> int:
    chosen = os.environ.get("JAX_NUM_CPU_DEVICES")
    if chosen:
        return int(chosen)
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith("--xla_force_host_platform_device_count="):
            return int(flag.split("=", 1)[1])
    configured = jax.config.jax_num_cpu_devices
    if count is None and configured is not None and configured > 0:
        return configured
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    check_positive_int("count", count)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as error:
        raise RuntimeError(
            f"use_cpu_cores({count}): JAX has already started in this process, so its CPU "
            "device count can no longer change. Call it before anything computes with JAX "
            "(importing gymnax or brax already does)."
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


def run_mesh(shard: bool, mesh: Mesh | None = None) -> Mesh | None:
    """The mesh a run shards its population over: ``mesh`` when given, else (with
    ``shard``, a config's ``run.shard``) :func:`population_mesh` over every device, else
    none. A mesh of one device comes back as ``None``, so that case runs exactly the
    unsharded program."""
    if mesh is None and shard:
        mesh = population_mesh()
    return None if mesh is not None and mesh.devices.size == 1 else mesh


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


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Constrain every leaf of ``tree`` to be replicated over ``mesh`` (inside ``jit``)."""
    sharding = replicated(mesh)
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


def put_replicated(tree: Any, mesh: Mesh) -> Any:
    """Place a copy of every leaf of ``tree`` on every device of ``mesh`` (outside ``jit``).

    Works across processes: each process supplies its own (identical) host value for the
    devices it owns, so no process needs to address another's devices. A jitted function
    fed replicated arrays returns replicated arrays (see
    :meth:`metarl.evolve.generation.Evolution.generation`), so its cache keeps one entry.
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


def _platform(mesh: Mesh | None) -> str:
    device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
    return device.platform


def default_chunk_size(mesh: Mesh | None = None) -> int | None:
    """What ``chunk_size="auto"`` means on ``mesh``'s devices (else the default device):
    :data:`inner_loops.population.CPU_CHUNK_SIZE` on CPUs, ``None`` (the whole share in
    one ``vmap``) on accelerators."""
    return population.resolve_chunk_size(AUTO, _platform(mesh))


def shard_population(fn: Callable, args: Any, mesh: Mesh | None,
                     chunk_size: ChunkSize = AUTO, replicate_output: bool = True) -> Any:
    """``vmap(fn)(*args)`` over the leading (agent) axis of ``args``, split over ``mesh``.

    Each device maps ``fn`` over its share ``chunk_size`` agents at a time. Outputs are
    replicated over the mesh (``replicate_output``) or left split along the agent axis.
    Pure and unjitted: wrap the caller in ``jax.jit``.
    """
    chunk = population.resolve_chunk_size(chunk_size, _platform(mesh))
    if num_shards(mesh) == 1:
        return population.map_in_chunks(fn, args, chunk)
    size = population.population_size(args)
    uneven = size % num_shards(mesh) != 0
    if uneven:
        # pinned whole: left free, XLA may split a [P] input over part of the mesh in a way
        # a 1-D mesh of D devices cannot name, and refuse to compile
        args = replicate(args, mesh)
    padded = pad_population(args, padded_size(size, num_shards(mesh)))
    spec = PartitionSpec(tuple(mesh.axis_names))

    def run_share(share):
        return population.map_in_chunks(fn, share, chunk)

    # check_vma=False: the scans start from constants (zeros, NaN) that are identical on
    # every device and become per-device values; nothing here needs the check.
    sharded = jax.shard_map(run_share, mesh=mesh, in_specs=(spec,), out_specs=spec,
                            check_vma=False)
    out = jax.tree.map(lambda x: x[:size], sharded(padded))
    if replicate_output or uneven:
        # a population that does not divide the devices cannot stay split evenly over them
        # once the padding is dropped: it comes back replicated
        return replicate(out, mesh)
    return out


def train_population(train, keys, meta_params=None, hypers=None,
                     chunk_size: ChunkSize = AUTO, mesh: Mesh | None = None):
    """:func:`inner_loops.population.train_population`, sharded over ``mesh``.

    Args:
        train: a learner's ``train(key, meta_params, hypers)``.
        keys: ``[P, 2]`` PRNG keys (or any pytree with leading axis ``P``).
        meta_params: pytree with leading axis ``[P]`` (or ``None``: the objective's default).
        hypers: hyperparameters of ``[P]`` arrays (or ``None``).
        chunk_size: agents each device trains at once (``"auto"`` or a positive integer).
        mesh: devices to shard over (:func:`population_mesh`); ``None`` or a one-device
            mesh runs the unsharded program.

    Returns metrics ``[P, U]``, replicated over the mesh.
    """
    return shard_population(train, (keys, meta_params, hypers), mesh, chunk_size)


def init_population(learner, keys, meta_params=None, hypers=None,
                    chunk_size: ChunkSize = AUTO, mesh: Mesh | None = None):
    """Fresh states of ``P`` agents, split over ``mesh`` along the agent axis."""
    return shard_population(learner.init, (keys, meta_params, hypers), mesh, chunk_size,
                            replicate_output=False)


def advance_population(learner, states, meta_params=None, hypers=None,
                       num_updates: int | None = None, chunk_size: ChunkSize = AUTO,
                       mesh: Mesh | None = None):
    """``num_updates`` more updates of every agent of ``states [P, ...]``, sharded.

    Returns ``(states, metrics [P, num_updates])``: states stay split over ``mesh``,
    metrics are replicated.
    """

    def advance(state, meta, hyper):
        return learner.advance(state, meta, hyper, num_updates)

    states, metrics = shard_population(advance, (states, meta_params, hypers), mesh,
                                       chunk_size, replicate_output=False)
    if mesh is not None and num_shards(mesh) > 1:
        metrics = replicate(metrics, mesh)
    return states, metrics
