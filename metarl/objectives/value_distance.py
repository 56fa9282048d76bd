"""Learned value distance: the critic regresses its targets under an evolved distance.

The value loss replaces PPO's squared error by a learned function of the scalar error
``x = value - target``:

    L_v = mean_i d(v_i - t_i),
    d(x) = MLP(x) - MLP(0)                      (l2_residual=False)
    d(x) = 0.5 x^2 + MLP(x) - MLP(0)            (l2_residual=True, the default)

``MLP`` maps a scalar to a scalar (default hidden sizes ``(64, 64)``, tanh). Subtracting
``MLP(0)`` makes ``d(0) = 0`` for every parameter value, so a perfect prediction always costs
nothing. With the residual form the output layer starts at exactly zero, so the initial
objective *is* the plain L2 loss ``0.5 mean((v - t)^2)`` and evolution searches around it.
There is no value clipping. The policy loss is PPO's clipped surrogate.

Meta-parameters: ``{"policy": {}, "value": {"layers": [{"w": [1, h1], "b": [h1]}, ...,
{"w": [hL, 1], "b": [1]}]}}``, float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from inner_loops.objective import LossInputs, LossTerm, Objective, ppo_clip
from metarl.objectives.mlp import apply_mlp, init_mlp
from metarl.objectives.registry import register_objective

DEFAULT_HIDDEN_SIZES = (64, 64)


def init_value_distance(
    key: jax.Array,
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    l2_residual: bool = True,
) -> dict:
    """Meta-parameters of the distance network ``1 -> hidden_sizes -> 1`` (tanh).

    With ``l2_residual`` the output layer is zero, so ``d(x) = 0.5 x^2`` initially.
    """
    sizes = (1, *tuple(hidden_sizes), 1)
    return init_mlp(key, sizes, use_bias=True, zero_last=l2_residual)


def value_distance(meta_params: dict, x: jax.Array, l2_residual: bool = True) -> jax.Array:
    """The learned distance ``d`` applied elementwise.

    Args:
        meta_params: the value term's meta-parameters (``{"layers": [...]}``).
        x: ``[...]`` errors ``value - target`` of any shape.
        l2_residual: add ``0.5 x^2`` (must match how the objective was built).

    Returns:
        ``[...]`` distances, same shape as ``x``, with ``d(0) = 0`` exactly.
    """
    x = jnp.asarray(x, jnp.float32)
    net = apply_mlp(meta_params, x[..., None])[..., 0]
    net_at_zero = apply_mlp(meta_params, jnp.zeros((1,), jnp.float32))[0]
    distance = net - net_at_zero
    # Batched matmuls may round MLP(0) differently from a lone MLP(0) (~1e-7); subtract that
    # residue where x == 0 so d(0) is exactly 0, through stop_gradient so d'(x) is unchanged.
    distance = distance - jax.lax.stop_gradient(jnp.where(x == 0.0, distance, 0.0))
    if l2_residual:
        distance = distance + 0.5 * jnp.square(x)
    return distance


def value_distance_term(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES, l2_residual: bool = True
) -> LossTerm:
    """The value loss term ``mean(d(values - targets))``."""
    hidden_sizes = tuple(int(h) for h in hidden_sizes)

    def init(key: jax.Array) -> dict:
        return init_value_distance(key, hidden_sizes, l2_residual)

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        errors = inputs.values - inputs.targets
        learned = jnp.mean(value_distance(meta_params, errors, l2_residual=False))
        if not l2_residual:
            return learned
        # mean(0.5 x^2 + learned(x)), written so that a zero network reproduces the L2 loss
        # 0.5 mean(x^2) bit for bit (the sum's rounding would otherwise differ by an ulp).
        return 0.5 * jnp.mean(jnp.square(errors)) + learned

    name = "value_distance" if l2_residual else "value_distance_raw"
    return LossTerm(name, init, loss)


@register_objective("value_distance")
def make_value_distance(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES, l2_residual: bool = True
) -> Objective:
    """PPO's clipped surrogate with a learned value distance (see the module docstring)."""
    return Objective(policy=ppo_clip(), value=value_distance_term(hidden_sizes, l2_residual))
