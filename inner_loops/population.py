"""Populations of agents on one device: ``vmap``, chunking, and editing members.

A population is any pytree whose leaves share a leading agent axis ``[P, ...]``: PRNG keys,
meta-parameters, hyperparameters, and the agents' states themselves. The functions here
train, initialise or advance a whole population in one ``vmap``, or ``chunk_size`` agents at
a time (``lax.map`` over vmapped chunks, the remainder in one smaller chunk), which bounds
memory by the chunk instead of the population and gives the same agents. Between segments a
population can be edited like any array: :func:`select_members` makes member ``j`` a copy
of member ``indices[j]`` (what population-based training does), :func:`set_member` changes
one member (say its hyperparameters).

``chunk_size`` has one meaning everywhere in metarl: how many agents one device trains at
once. It is a positive integer, or ``"auto"`` (the default): :data:`CPU_CHUNK_SIZE` on a CPU
device, where a minibatch's activations for a few dozen agents outgrow a core's cache, and
the whole population at once on accelerators. A chunk at least the population's size trains
it in one ``vmap``. Sharding over devices is :mod:`metarl.sharding`.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Literal

import jax
import jax.numpy as jnp

AUTO = "auto"
ChunkSize = int | Literal["auto"]

# Agents a CPU device trains at once when asked for "auto" (see docs/results/ for the
# measurements behind the choice).
CPU_CHUNK_SIZE = 16


def check_chunk_size(chunk_size: Any) -> ChunkSize:
    """``chunk_size`` if it is ``"auto"`` or a positive integer; the error names it."""
    if chunk_size == AUTO:
        return AUTO
    try:
        value = operator.index(chunk_size)
    except TypeError:
        value = None
    if value is None or isinstance(chunk_size, bool) or value < 1:
        raise ValueError(f"chunk_size: must be a positive integer or 'auto', got {chunk_size!r}")
    return value


def resolve_chunk_size(chunk_size: ChunkSize, platform: str | None = None) -> int | None:
    """The agents per ``vmap`` that ``chunk_size`` means on devices of ``platform``
    (default: the default device's): an integer, or ``None`` for the whole population."""
    chunk_size = check_chunk_size(chunk_size)
    if chunk_size != AUTO:
        return chunk_size
    platform = platform or jax.devices()[0].platform
    return CPU_CHUNK_SIZE if platform == "cpu" else None


def population_size(tree: Any) -> int:
    """The length of the leading (agent) axis shared by every leaf of ``tree``."""
    return jax.tree.leaves(tree)[0].shape[0]


def map_population(fn, args: Any, chunk_size: ChunkSize = AUTO) -> Any:
    """``vmap(fn)(*args)`` over the leading axis of ``args`` (a tuple of pytrees),
    ``chunk_size`` agents at a time."""
    return map_in_chunks(fn, args, resolve_chunk_size(chunk_size))


def map_in_chunks(fn, args: Any, chunk: int | None) -> Any:
    """``vmap(fn)(*args)``, ``chunk`` agents at a time (``None``: all at once)."""
    if chunk is None or chunk >= population_size(args):
        return jax.vmap(fn)(*args)
    return jax.lax.map(lambda a: fn(*a), args, batch_size=chunk)


def train_population(train, keys, meta_params=None, hypers=None,
                     chunk_size: ChunkSize = AUTO):
    """Train ``P`` agents with ``train(key, meta_params, hypers)`` (a learner's ``train``):
    every argument has a leading axis ``[P, ...]`` (``None``: the learner's defaults).
    Returns metrics ``[P, num_updates]``."""
    return map_population(train, (keys, meta_params, hypers), chunk_size)


def init_population(learner, keys, meta_params=None, hypers=None,
                    chunk_size: ChunkSize = AUTO):
    """Fresh states of ``P`` agents: ``keys [P, 2]``, optional ``[P, ...]`` meta-parameters
    and hyperparameters. Returns the learner's state with a leading ``[P]`` axis."""
    return map_population(learner.init, (keys, meta_params, hypers), chunk_size)


def advance_population(learner, states, meta_params=None, hypers=None,
                       num_updates: int | None = None, chunk_size: ChunkSize = AUTO):
    """``num_updates`` more updates of every agent of ``states [P, ...]`` (default: the
    whole budget). Returns ``(states [P, ...], metrics [P, num_updates])``."""

    def advance(state, meta, hyper):
        return learner.advance(state, meta, hyper, num_updates)

    return map_population(advance, (states, meta_params, hypers), chunk_size)


def select_members(tree: Any, indices: jax.Array) -> Any:
    """The population whose member ``j`` is member ``indices[j]`` of ``tree``: copies whole
    agents (states, hyperparameters, ...). ``indices`` is ``[P']`` integers."""
    indices = jnp.asarray(indices)
    return jax.tree.map(lambda x: x[indices], tree)


def copy_member(tree: Any, source: int, target: int) -> Any:
    """``tree`` with member ``target`` replaced by a copy of member ``source``."""
    indices = jnp.arange(population_size(tree)).at[target].set(source)
    return select_members(tree, indices)


def set_member(tree: Any, index: int, value: Any) -> Any:
    """``tree`` with member ``index`` replaced by ``value`` (a pytree without the agent
    axis, e.g. one agent's hyperparameters)."""
    return jax.tree.map(lambda x, v: x.at[index].set(jnp.asarray(v, x.dtype)), tree, value)


def stack_hyperparams(hypers: list) -> Any:
    """Stack per-agent hyperparameters into ``[P]`` arrays."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *hypers)


def broadcast_to_population(tree: Any, size: int) -> Any:
    """Repeat every leaf of ``tree`` along a new leading axis of ``size``."""
    return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (size, *jnp.shape(x))), tree)


def agent_state_bytes(learner) -> int:
    """Bytes of one agent's state (replay buffer included), from shapes alone: the learner's
    ``init`` is traced with ``jax.eval_shape``, nothing is allocated."""
    shapes = jax.eval_shape(learner.init, jax.ShapeDtypeStruct((2,), jnp.uint32))
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(shapes))


def check_population_memory(learner, num_agents: int, chunk_size: ChunkSize = AUTO,
                            num_devices: int = 1, available: int | None = None,
                            fraction: float = 0.8) -> int:
    """Raise ``MemoryError`` when the states of the agents one device holds at once (its
    share of ``num_agents``, at most ``chunk_size`` of them when trained in chunks) would
    take more than ``fraction`` of its available memory
    (:func:`inner_loops.replay.available_memory_bytes`; unknown: nothing is checked).

    Returns the bytes of those states. The error gives the figure (agents x bytes per
    agent), what is available, and the options: a smaller replay capacity, a smaller
    ``chunk_size``, more devices.
    """
    from inner_loops.replay import available_memory_bytes, format_bytes

    per_device = -(-num_agents // max(1, num_devices))
    chunk = resolve_chunk_size(chunk_size)
    resident = per_device if chunk is None else min(chunk, per_device)
    per_agent = agent_state_bytes(learner)
    needed = resident * per_agent
    if available is None:
        available = available_memory_bytes()
    if available is None or needed <= fraction * available:
        return needed
    fitting = int(fraction * available // max(1, per_agent))
    raise MemoryError(
        f"{learner.algorithm} agents need {format_bytes(needed)} on one device ({resident} "
        f"agents at once x {format_bytes(per_agent)} of state each, replay buffers "
        f"included) but {format_bytes(available)} is available (the states may take "
        f"{fraction:.0%}); options: a smaller replay capacity (buffer_size), a smaller "
        f"chunk_size (at most {fitting} agents fit at once), or more devices to shard the "
        f"{num_agents} agents over"
    )
