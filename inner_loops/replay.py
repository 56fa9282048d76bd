"""A circular replay buffer that lives inside ``jit``: pure functions over a pytree.

One buffer holds ``capacity`` transitions of any pytree structure (a NamedTuple of arrays,
say) in fixed-size storage ``[capacity, ...]``. :func:`add` writes the transitions of one
step of ``n`` environments after the newest ones, overwriting the oldest once full;
:func:`sample` draws a batch by uniform integer indices over the filled part only. Nothing
here has a Python-side state or a data-dependent shape, so a population holds one buffer per
agent under ``vmap`` (every leaf gains a leading agent axis).

Replay storage dominates an off-policy population's memory, and it is known from shapes
alone: :func:`population_buffer_bytes` gives ``agents x capacity x bytes per transition``
without allocating anything, and :func:`check_buffer_memory` stops with that figure and the
ways out (a smaller capacity, fewer agents at once with ``chunk_size``, more devices) when
it would not fit.
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ReplayBuffer:
    """The state of one buffer.

    Attributes:
        storage: the transitions' pytree with every leaf ``[capacity, ...]``; slots at and
            beyond ``size`` hold zeros (never sampled).
        position: ``[]`` int32 slot the next transition is written to.
        size: ``[]`` int32 slots filled, at most ``capacity``.
    """

    storage: Any
    position: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        """Slots in the buffer: the storage's leading axis, static (call it on one agent's
        buffer, e.g. inside the vmapped function, not on a population's)."""
        return jax.tree.leaves(self.storage)[0].shape[0]


def init(capacity: int, example_transition: Any) -> ReplayBuffer:
    """An empty buffer of ``capacity`` transitions shaped like ``example_transition``
    (one transition, no batch axis; arrays or ``jax.ShapeDtypeStruct`` s)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity: must be a positive integer, got {capacity!r}")
    storage = jax.tree.map(lambda x: jnp.zeros((capacity, *x.shape), x.dtype),
                           example_transition)
    return ReplayBuffer(storage, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def add(buffer: ReplayBuffer, transitions: Any) -> ReplayBuffer:
    """``buffer`` with ``transitions`` (every leaf ``[n, ...]``, ``n <= capacity``) written
    at ``position, position + 1, ...`` modulo the capacity, overwriting the oldest."""
    capacity = buffer.capacity
    count = jax.tree.leaves(transitions)[0].shape[0]
    if count > capacity:
        raise ValueError(f"capacity: {capacity} is smaller than the {count} transitions "
                         "added at once (num_envs)")
    slots = (buffer.position + jnp.arange(count, dtype=jnp.int32)) % capacity
    storage = jax.tree.map(lambda store, x: store.at[slots].set(x.astype(store.dtype)),
                           buffer.storage, transitions)
    return ReplayBuffer(
        storage,
        (buffer.position + count) % capacity,
        jnp.minimum(buffer.size + count, capacity),
    )


def sample_indices(buffer: ReplayBuffer, key: jax.Array, batch_size: int) -> jax.Array:
    """``[batch_size]`` int32 slots drawn uniformly, with replacement, from the filled part
    ``[0, size)`` (the whole buffer once it has wrapped). An empty buffer gives slot 0."""
    return jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1),
                              dtype=jnp.int32)


def sample_index_batches(buffer: ReplayBuffer, key: jax.Array, num_batches: int,
                         batch_size: int) -> jax.Array:
    """``[num_batches, batch_size]`` int32 slots for a run of gradient steps, drawn in one
    batch (as :func:`sample_indices` draws one row); read each row with :func:`gather`.
    Drawing them up front keeps the random draws out of the gradient-step loop."""
    return jax.random.randint(key, (num_batches, batch_size), 0, jnp.maximum(buffer.size, 1),
                              dtype=jnp.int32)


def gather(buffer: ReplayBuffer, indices: jax.Array) -> Any:
    """The transitions at slots ``indices [n]`` (every leaf ``[n, ...]``)."""
    return jax.tree.map(lambda store: store[indices], buffer.storage)


def sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int) -> Any:
    """A batch of ``batch_size`` transitions (every leaf ``[batch_size, ...]``) drawn
    uniformly with replacement from the filled part of ``buffer``."""
    indices = sample_indices(buffer, key, batch_size)
    return jax.tree.map(lambda store: store[indices], buffer.storage)


# ------------------------------------------------------------------------------ memory


def transition_bytes(example_transition: Any) -> int:
    """Bytes one stored transition takes (from shapes and dtypes only)."""
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(example_transition))


def population_buffer_bytes(num_agents: int, capacity: int, example_transition: Any) -> int:
    """Bytes of the buffers of ``num_agents`` agents: ``agents x capacity x bytes per
    transition``, from the shapes :func:`init` would allocate (``jax.eval_shape``: nothing
    is allocated)."""
    shapes = jax.eval_shape(lambda: init(capacity, example_transition))
    return num_agents * transition_bytes(shapes.storage)


def available_memory_bytes(device: jax.Device | None = None) -> int | None:
    """Memory free for new arrays on ``device`` (default: the first device), or ``None``
    when unknown: the device's ``bytes_limit - bytes_in_use`` when its backend reports
    memory statistics (GPUs, TPUs), else the host's available RAM (CPU)."""
    device = device or jax.devices()[0]
    stats = None
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return host_available_bytes()


def host_available_bytes() -> int | None:
    """The host's available RAM (Linux ``MemAvailable``; else free pages), or ``None``."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(num_bytes: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num_bytes) < 1024 or unit == "TiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def check_buffer_memory(num_agents: int, capacity: int, example_transition: Any, *,
                        available: int | None = None, fraction: float = 0.8,
                        device: jax.Device | None = None) -> int:
    """Raise ``MemoryError`` when the buffers of ``num_agents`` agents held at once on one
    device would take more than ``fraction`` of its available memory.

    Args:
        num_agents: agents whose buffers live on the device at the same time (a
            population's size, or its chunk size when training in chunks, divided by the
            devices it is sharded over).
        capacity, example_transition: as for :func:`init`.
        available: bytes available (default: :func:`available_memory_bytes` of
            ``device``); when unknown nothing is checked.
        fraction: the share of it the buffers may take (the networks, optimiser states and
            the XLA program need the rest).

    Returns the buffers' bytes. The error gives that figure, what is available and the
    options: a smaller ``capacity``, fewer agents at once (``chunk_size``), more devices.
    """
    needed = population_buffer_bytes(num_agents, capacity, example_transition)
    if available is None:
        available = available_memory_bytes(device)
    if available is None or needed <= fraction * available:
        return needed
    per_transition = transition_bytes(example_transition)
    fitting_capacity = int(fraction * available // max(1, num_agents * per_transition))
    fitting_agents = int(fraction * available // max(1, capacity * per_transition))
    raise MemoryError(
        f"replay buffers need {format_bytes(needed)} ({num_agents} agents x capacity "
        f"{capacity} x {per_transition} bytes per transition) but {format_bytes(available)} "
        f"is available on {device or jax.devices()[0]} (the buffers may take "
        f"{fraction:.0%}); options: a smaller capacity (at most {fitting_capacity} for "
        f"{num_agents} agents), fewer agents at once with chunk_size (at most "
        f"{fitting_agents} at capacity {capacity}), or more devices to shard the population over"
    )
