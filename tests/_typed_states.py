"""States typed as an update returns them, so that one compiled update serves a fresh
state, an updated one and one restored from a checkpoint.

A jitted function is traced (and compiled, or loaded from the persistent cache) again for
every new input type, and JAX counts a leaf's weak type (a Python scalar's) as part of it.
Environment resets leave some leaves weakly typed: gymnax's Pendulum ``last_u``, the step
counter ``time`` and the running statistics' counts. An update's ``scan`` returns
``last_u`` strongly typed, and orbax restores every leaf strongly typed, so a tiny
TD3/SAC/DQN ``advance`` (or a DvD segment) was traced and compiled two or three times over
one test. The values are the same either way: only the type that promotion rules read
differs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def strongly_typed(tree: Any) -> Any:
    """``tree`` with every leaf a strongly typed array of its own dtype, values unchanged."""
    return jax.tree.map(lambda leaf: jnp.asarray(leaf, leaf.dtype), tree)


def typed_init(learner) -> Any:
    """``learner.init`` (same arguments) returning a :func:`strongly_typed` state."""

    def init(key, meta_params=None, hypers=None):
        return strongly_typed(learner.init(key, meta_params, hypers))

    return init
