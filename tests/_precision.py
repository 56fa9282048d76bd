"""Checks of mixed precision that the learners' tests share: a network run with bfloat16
operands against the same network and parameters in float32, and a learner's state that
stayed float32 while it trained in bfloat16."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops import make_learner

# bfloat16 keeps 8 bits of mantissa (a relative rounding of 2^-9 per operand); products
# of a few dozen terms and a float32 accumulation stay well within 1 %.
BFLOAT16_RTOL = 1e-2


def train_briefly(config, jit) -> tuple:
    """An agent of ``config`` trained over its whole budget in one program compiled by
    ``jit``: ``(learner, state, metrics)``, the metrics on the host."""
    learner = make_learner(config)
    state, metrics = jit(lambda key: learner.advance(learner.init(key)))(jax.random.PRNGKey(2))
    return learner, state, jax.device_get(metrics)


def assert_learned_in_float32(learning, metrics, loss: str) -> None:
    """Finite metrics, a positive ``loss`` in every update that took gradient steps, and a
    float32 ``learning`` state (parameters, targets, optimiser states)."""
    assert metrics["finite"].all()
    assert metrics["learning"].any()
    assert np.all(metrics[loss][metrics["learning"]] > 0)
    assert_float32_state(learning)


def assert_float32_state(tree) -> None:
    """Every floating-point leaf of ``tree`` (parameters, optimiser state) is float32."""
    dtypes = {str(x.dtype) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.floating)}
    assert dtypes == {"float32"}, dtypes


def assert_close_to_float32(bfloat16_out, float32_out) -> None:
    """``bfloat16_out`` differs from ``float32_out`` (the bfloat16 products really ran) by
    at most ``BFLOAT16_RTOL`` relative to the outputs' scale; both are float32."""
    low, full = np.asarray(bfloat16_out), np.asarray(float32_out)
    assert low.dtype == full.dtype == np.float32, (low.dtype, full.dtype)
    assert not np.array_equal(low, full)
    np.testing.assert_allclose(low, full, rtol=BFLOAT16_RTOL,
                               atol=BFLOAT16_RTOL * np.abs(full).max())
