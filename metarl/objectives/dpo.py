"""Discovered Policy Optimisation (DPO): a closed-form drift distilled from learned LPO.

The policy maximises ``r A`` minus a drift that is non-negative and vanishes with its
gradient at ``r = 1``:

    drift(r, A) = relu((r - 1) A - alpha tanh((r - 1) A / alpha))      if A >= 0
                  relu(log(r) A - beta tanh(log(r) A / beta))          if A < 0
    L_pi        = -mean_i (r_i A_i - drift(r_i, A_i))

with ``alpha = 2`` and ``beta = 0.6`` by default. Since ``u - c tanh(u / c) >= 0`` exactly
when ``u >= 0`` (and is ``O(u^3)`` near zero), the drift only penalises moves of the ratio in
the direction the advantage rewards, and more softly than PPO's hard clip. It fills only
PPO's policy slot. There are no meta-parameters (``{"policy": {}, "value": {}}``).

``alpha`` and ``beta`` are the objective's options, and may also be traced: given in the
policy term's meta-parameters (``{"policy": {"alpha": a, "beta": b}, "value": {}}``) they
replace the options, so a tuning sweep (``metarl evaluate --tune``) trains every value of
its grid, alpha 1 and 4 times beta 0.3 and 1.2 (half and twice the defaults) times the
learning rate at 1/3, 1 and 3 times the run's own, as one program rather than one program
per value. ``init`` still returns ``{}``: evolution has nothing to learn here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from inner_loops.objective import LossInputs, LossTerm, Objective, no_meta_params
from metarl.objectives.drift import DriftFunction
from metarl.objectives.registry import LEARNING_RATE, Tunable, register_objective

DEFAULT_ALPHA = 2.0
DEFAULT_BETA = 0.6


def _soft_excess(u: jax.Array, scale: float) -> jax.Array:
    """``relu(u - scale * tanh(u / scale))``, elementwise."""
    return jax.nn.relu(u - scale * jnp.tanh(u / scale))


def drift_from_log_ratio(
    ratio: jax.Array,
    log_ratio: jax.Array,
    advantage: jax.Array,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
) -> jax.Array:
    """DPO drift given both ``ratio`` and its exact logarithm; broadcasting ``[...] -> [...]``."""
    positive = _soft_excess((ratio - 1.0) * advantage, alpha)
    negative = _soft_excess(log_ratio * advantage, beta)
    return jnp.where(advantage >= 0.0, positive, negative)


def drift(
    ratio: jax.Array,
    advantage: jax.Array,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
) -> jax.Array:
    """DPO's drift, broadcasting ``ratio`` ``[...]`` (> 0) and ``advantage`` ``[...]``.

    Returns:
        ``[...]`` drift, ``>= 0`` and zero (with zero gradient in ``ratio``) at ``ratio = 1``.
    """
    ratio = jnp.asarray(ratio, jnp.float32)
    advantage = jnp.asarray(advantage, jnp.float32)
    return drift_from_log_ratio(ratio, jnp.log(ratio), advantage, alpha, beta)


def dpo_term(alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA) -> LossTerm:
    """Policy loss term ``-mean(r A - drift(r, A))`` (no meta-parameters; ``alpha`` and
    ``beta`` given in the meta-parameters, ``[]`` arrays, replace the options)."""
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"DPO needs alpha > 0 and beta > 0, got alpha={alpha}, beta={beta}")

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        penalty = drift_from_log_ratio(
            inputs.ratio, inputs.log_ratio, inputs.advantages,
            meta_params.get("alpha", alpha), meta_params.get("beta", beta),
        )
        return -jnp.mean(inputs.ratio * inputs.advantages - penalty)

    return LossTerm("dpo", no_meta_params, loss)


def drift_fn(alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA) -> DriftFunction:
    """DPO's drift as a labelled function ``(ratio, advantage, progress=0.0) -> drift``."""

    def closed_form(ratio, advantage, progress):
        del progress
        return drift(ratio, advantage, alpha, beta)

    return DriftFunction(closed_form, f"DPO drift (α = {alpha:g}, β = {beta:g})")


def _portable(meta_params: dict, options: Mapping[str, Any]) -> dict:
    """DPO's drift as a plain function ``drift(ratio, advantage)`` (broadcasting
    ``[...]``), ``alpha`` and ``beta`` from the meta-parameters where they hold them, else
    from the options."""
    policy_params = meta_params.get("policy", {})
    alpha = policy_params.get("alpha", options.get("alpha", DEFAULT_ALPHA))
    beta = policy_params.get("beta", options.get("beta", DEFAULT_BETA))

    def closed_form(ratio: jax.Array, advantage: jax.Array) -> jax.Array:
        return drift(ratio, advantage, alpha, beta)

    return {"policy": closed_form}


@register_objective("dpo", slots=("policy",), algorithms=("ppo", "recurrent_ppo"),
                    baselines=("ppo",), portable=_portable,
                    tunables=(Tunable("alpha", (1.0, 4.0), option=True, low=0.0),
                              Tunable("beta", (0.3, 1.2), option=True, low=0.0),
                              LEARNING_RATE))
def make_dpo(alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA) -> Objective:
    """DPO's closed-form drift as PPO's policy loss."""
    return Objective(policy=dpo_term(alpha, beta))
