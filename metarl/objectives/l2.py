"""Fixed baseline objectives: standard PPO, and plain L2 or Huber value (critic) losses.

* ``"ppo"``: PPO's clipped surrogate ``L_pi = -mean_i min(r_i A_i, clip(r_i, 1±eps) A_i)``
  and clipped value loss ``0.5 mean max((v - t)^2, (v_old + clip(v - v_old, ±eps) - t)^2)``;
  both of PPO's slots, PPO only.
* ``"l2"``: the value slot alone, the plain squared error ``L_v = 0.5 mean((v - t)^2)``, the
  baseline the learned value distance (:mod:`metarl.objectives.value_distance`) starts
  from; any algorithm with a value slot (PPO keeps its clipped surrogate; off-policy
  critics regress their TD targets).
* ``"huber"``: the value slot alone, the Huber loss of ``v - t`` with threshold 1 (DQN's
  usual TD loss).

None has meta-parameters: every term's ``init`` returns ``{}``.

What a tuned evaluation (``metarl evaluate --tune``) searches when one of them is a
baseline: ``l2`` and ``huber`` the value loss's weight ``vf_coef`` over 0.03, 0.1, 0.3, 1
(absolute; PPO's default is 0.5) times the learning rate at 1/3, 1 and 3 times the run's own
(TD3's and SAC's critic learning rate; they have no ``vf_coef``);
``ppo`` its clip range ``clip_eps`` over 0.05, 0.1, 0.2, 0.4 times the same learning rates.
Every grid has 12 settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from inner_loops.objective import Objective, huber, ppo_objective, squared_error
from metarl.objectives.registry import LEARNING_RATE, VF_COEF, Tunable, register_objective

CLIP_EPS = Tunable("clip_eps", (0.05, 0.1, 0.2, 0.4), low=0.0, high=1.0)


@register_objective("ppo", slots=("policy", "value"), algorithms=("ppo", "recurrent_ppo"),
                    tunables=(CLIP_EPS, LEARNING_RATE))
def make_ppo() -> Objective:
    """Standard PPO: clipped surrogate and clipped L2 value loss."""
    return ppo_objective()


def _portable_l2(meta_params: Any, options: Mapping[str, Any]) -> dict:
    """L2 as a plain distance ``d(x) = 0.5 x^2`` of errors ``x = value - target``."""
    del meta_params, options

    def distance(x: jax.Array) -> jax.Array:
        return 0.5 * jnp.square(jnp.asarray(x, jnp.float32))

    return {"value": distance}


def _portable_huber(meta_params: Any, options: Mapping[str, Any]) -> dict:
    """Huber as a plain distance of errors ``x = value - target`` (threshold 1)."""
    del meta_params, options

    def distance(x: jax.Array) -> jax.Array:
        error = jnp.abs(jnp.asarray(x, jnp.float32))
        quadratic = jnp.minimum(error, 1.0)
        return 0.5 * jnp.square(quadratic) + (error - quadratic)

    return {"value": distance}


@register_objective("l2", slots=("value",), baselines=("ppo",),
                    tunables=(VF_COEF, LEARNING_RATE), portable=_portable_l2)
def make_l2() -> Objective:
    """The plain unclipped L2 value loss."""
    return Objective(value=squared_error())


@register_objective("huber", slots=("value",), baselines=("l2",),
                    tunables=(VF_COEF, LEARNING_RATE), portable=_portable_huber)
def make_huber() -> Objective:
    """The Huber value loss (threshold 1)."""
    return Objective(value=huber())
