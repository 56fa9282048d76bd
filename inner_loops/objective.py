"""The objective interface: how PPO's policy and value losses are made replaceable.

An :class:`Objective` is a pair of :class:`LossTerm` s, one for the policy and one for
the value function. Each term owns its meta-parameters (a pytree, possibly empty) and a
pure loss function of ``(meta_params, LossInputs) -> scalar``. The PPO loop only ever calls
``objective.policy.loss`` and ``objective.value.loss``; it knows no specific objective.

Meta-parameters of a whole objective are ``{"policy": ..., "value": ...}``, which is what
``Objective.init`` returns and what ``train(key, meta_params, hypers)`` expects. Fixed
terms use ``{}`` so that evolution strategies see only the learnable part.

Standard PPO (clipped surrogate, clipped L2 value loss) lives here because it is the
inner loop's default; learned objectives live in :mod:`metarl.objectives`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

MetaParams = Any  # a pytree of arrays


class LossInputs(NamedTuple):
    """Everything a loss term may look at, for one minibatch of ``B`` transitions.

    Attributes:
        ratio: ``[B]`` probability ratio ``pi_new(a|s) / pi_old(a|s)``.
        log_ratio: ``[B]`` its logarithm (exact, not ``log(ratio)`` recomputed).
        advantages: ``[B]`` GAE advantages, normalised per minibatch when the config asks.
        values: ``[B]`` critic predictions of the current parameters.
        old_values: ``[B]`` critic predictions at rollout time.
        targets: ``[B]`` value targets (GAE advantage + old value).
        clip_eps: ``[]`` PPO clip range (a traced hyperparameter).
        progress: ``[]`` fraction of training completed, ``update / num_updates`` in [0, 1).
    """

    ratio: jax.Array
    log_ratio: jax.Array
    advantages: jax.Array
    values: jax.Array
    old_values: jax.Array
    targets: jax.Array
    clip_eps: jax.Array
    progress: jax.Array


@dataclass(frozen=True)
class LossTerm:
    """One replaceable loss.

    Attributes:
        name: short identifier used in logs and plots.
        init: ``key -> meta_params`` for this term (``{}`` for a fixed loss).
        loss: ``(meta_params, LossInputs) -> []`` scalar to *minimise*.
    """

    name: str
    init: Callable[[jax.Array], MetaParams]
    loss: Callable[[MetaParams, LossInputs], jax.Array]


@dataclass(frozen=True)
class Objective:
    """A policy loss and a value loss, each possibly learned."""

    policy: LossTerm
    value: LossTerm

    @property
    def name(self) -> str:
        return f"{self.policy.name}+{self.value.name}"

    def init(self, key: jax.Array) -> dict[str, MetaParams]:
        """Meta-parameters ``{"policy": ..., "value": ...}`` of both terms."""
        policy_key, value_key = jax.random.split(key)
        return {"policy": self.policy.init(policy_key), "value": self.value.init(value_key)}

    def policy_loss(self, meta_params: dict[str, MetaParams], inputs: LossInputs) -> jax.Array:
        return self.policy.loss(meta_params["policy"], inputs)

    def value_loss(self, meta_params: dict[str, MetaParams], inputs: LossInputs) -> jax.Array:
        return self.value.loss(meta_params["value"], inputs)


def no_meta_params(key: jax.Array) -> dict:
    """``init`` of a fixed loss term: it has nothing to learn."""
    del key
    return {}


def ppo_clip_surrogate(ratio: jax.Array, advantages: jax.Array, clip_eps: jax.Array) -> jax.Array:
    """PPO's clipped surrogate objective per sample (to maximise). Shapes ``[B] -> [B]``."""
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return jnp.minimum(ratio * advantages, clipped * advantages)


def _ppo_clip_loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
    del meta_params
    return -jnp.mean(ppo_clip_surrogate(inputs.ratio, inputs.advantages, inputs.clip_eps))


def _clipped_l2_loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
    del meta_params
    clipped = inputs.old_values + jnp.clip(
        inputs.values - inputs.old_values, -inputs.clip_eps, inputs.clip_eps
    )
    unclipped_error = jnp.square(inputs.values - inputs.targets)
    clipped_error = jnp.square(clipped - inputs.targets)
    return 0.5 * jnp.mean(jnp.maximum(unclipped_error, clipped_error))


def ppo_clip() -> LossTerm:
    """PPO's clipped surrogate policy loss: ``-mean(min(rA, clip(r, 1±eps)A))``."""
    return LossTerm("ppo_clip", no_meta_params, _ppo_clip_loss)


def clipped_l2() -> LossTerm:
    """PPO's clipped value loss: ``0.5 mean(max((v-t)^2, (v_old + clip(v-v_old, ±eps) - t)^2))``."""
    return LossTerm("clipped_l2", no_meta_params, _clipped_l2_loss)


def ppo_objective() -> Objective:
    """Standard PPO: clipped surrogate and clipped L2 value loss, no meta-parameters."""
    return Objective(policy=ppo_clip(), value=clipped_l2())
