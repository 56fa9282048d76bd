"""Fixed baseline objectives: standard PPO and PPO with a plain (unclipped) L2 value loss.

Both use PPO's clipped surrogate as the policy loss,

    L_pi = -mean_i min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i),

and differ in the value loss:

* ``"ppo"``: PPO's clipped value loss
  ``0.5 mean max((v - t)^2, (v_old + clip(v - v_old, -eps, eps) - t)^2)``;
* ``"l2"``: the plain squared error ``L_v = 0.5 mean((v - t)^2)``, the baseline the learned
  value distance (:mod:`metarl.objectives.value_distance`) starts from.

Neither has meta-parameters: both terms' ``init`` return ``{}``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from inner_loops.objective import (
    LossInputs,
    LossTerm,
    Objective,
    clipped_l2,
    no_meta_params,
    ppo_clip,
    ppo_objective,
)
from metarl.objectives.registry import register_objective


def l2_value_loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
    """Plain value loss ``0.5 mean((values - targets)^2)``; ``[B], [B] -> []``."""
    del meta_params
    return 0.5 * jnp.mean(jnp.square(inputs.values - inputs.targets))


def l2() -> LossTerm:
    """The unclipped L2 value loss term (no meta-parameters)."""
    return LossTerm("l2", no_meta_params, l2_value_loss)


@register_objective("ppo")
def make_ppo() -> Objective:
    """Standard PPO: clipped surrogate and clipped L2 value loss."""
    return ppo_objective()


@register_objective("l2")
def make_l2() -> Objective:
    """PPO's clipped surrogate with the plain unclipped L2 value loss."""
    return Objective(policy=ppo_clip(), value=l2())


__all__ = ["clipped_l2", "l2", "l2_value_loss", "make_l2", "make_ppo"]
