"""Fixed baseline objectives: standard PPO, and a plain (unclipped) L2 value loss.

* ``"ppo"``: PPO's clipped surrogate ``L_pi = -mean_i min(r_i A_i, clip(r_i, 1±eps) A_i)``
  and clipped value loss ``0.5 mean max((v - t)^2, (v_old + clip(v - v_old, ±eps) - t)^2)``;
  both of PPO's slots, PPO only.
* ``"l2"``: the value slot alone, the plain squared error ``L_v = 0.5 mean((v - t)^2)``, the
  baseline the learned value distance (:mod:`metarl.objectives.value_distance`) starts
  from; any algorithm with a value slot (PPO keeps its clipped surrogate).

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


@register_objective("ppo", slots=("policy", "value"), algorithms=("ppo",))
def make_ppo() -> Objective:
    """Standard PPO: clipped surrogate and clipped L2 value loss."""
    return ppo_objective()


@register_objective("l2", slots=("value",), baselines=("ppo",))
def make_l2() -> Objective:
    """The plain unclipped L2 value loss."""
    return Objective(value=l2())


__all__ = ["clipped_l2", "l2", "l2_value_loss", "make_l2", "make_ppo"]
