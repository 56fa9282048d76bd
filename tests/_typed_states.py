"""What a jitted function is traced for: each input leaf's shape, dtype and weak type.

A jitted function is traced and compiled again for every new input type, and JAX counts a
leaf's weak type (a Python scalar's) as part of it. A fresh state must be typed as a step
returns it, or the step compiles twice (once for the first call, once for the rest).
"""

from __future__ import annotations

from typing import Any

import jax


def input_types(tree: Any) -> Any:
    """``tree`` (arrays, or :func:`jax.eval_shape`'s results) as ``(shape, dtype, weak)``."""
    return jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype, leaf.weak_type), tree)


def counting_traces(fn):
    """``fn``, counting in ``.traces`` how often JAX traced it: jit the result, call it,
    then read the count (a new input type traces, and compiles, again)."""

    def traced(*args, **kwargs):
        traced.traces += 1
        return fn(*args, **kwargs)

    traced.traces = 0
    return traced
