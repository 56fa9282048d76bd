"""The objective interface: how an algorithm's losses are made replaceable.

An algorithm has *loss slots*: PPO a ``"policy"`` slot (the surrogate objective) and a
``"value"`` slot (the critic's regression loss); off-policy learners a ``"value"`` slot
(the critic's TD loss). An :class:`Objective` fills some of them with :class:`LossTerm` s
and leaves the others to the algorithm's defaults (``None``). Each term owns its
meta-parameters (a pytree, possibly empty) and a pure loss function of
``(meta_params, LossInputs) -> scalar``; the algorithm only ever calls
``objective.policy_loss`` and ``objective.value_loss`` and knows no specific objective.

Meta-parameters of a whole objective are ``{"policy": ..., "value": ...}``, which is what
``Objective.init`` returns and what ``train(key, meta_params, hypers)`` expects. Fixed
terms, and slots left to the algorithm, use ``{}`` so that evolution strategies see only
the learnable part.

Besides the loss slots an objective may fill the *optimiser slot* with an
:class:`OptimizerTerm`: an update rule that replaces the algorithm's Adam (today PPO's
only; the algorithm registers ``"optimizer"`` among its slots when it supports it). Its
meta-parameters appear under an ``"optimizer"`` key of the meta-parameters *only* when the
slot is filled, so objectives without it keep exactly the pytree ``{"policy", "value"}``
(and the saved runs of such objectives still load).

Standard PPO (clipped surrogate, clipped L2 value loss) lives here because it is the
inner loop's default; learned objectives live in :mod:`metarl.objectives`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

MetaParams = Any  # a pytree of arrays


class LossInputs(NamedTuple):
    """Everything a loss term may look at, for one minibatch of ``B`` transitions.

    Fields an algorithm does not have are ``None`` (an off-policy critic has no ratio or
    advantages); a term only reads the fields of the slot it fills.

    Attributes:
        ratio: ``[B]`` probability ratio ``pi_new(a|s) / pi_old(a|s)``.
        log_ratio: ``[B]`` its logarithm (exact, not ``log(ratio)`` recomputed).
        advantages: ``[B]`` GAE advantages, normalised per minibatch when the config asks.
        values: ``[B]`` critic predictions of the current parameters (Q-values for
            off-policy critics).
        old_values: ``[B]`` critic predictions at rollout time (PPO).
        targets: ``[B]`` value targets (PPO: GAE advantage + old value; off-policy: the
            bootstrapped TD target).
        clip_eps: ``[]`` PPO clip range (a traced hyperparameter).
        progress: ``[]`` fraction of training completed, ``update / num_updates`` in [0, 1).
    """

    ratio: jax.Array | None = None
    log_ratio: jax.Array | None = None
    advantages: jax.Array | None = None
    values: jax.Array | None = None
    old_values: jax.Array | None = None
    targets: jax.Array | None = None
    clip_eps: jax.Array | None = None
    progress: jax.Array | None = None


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
class OptimizerTerm:
    """A replaceable update rule: fills an objective's ``"optimizer"`` slot.

    The algorithm builds the rule *inside* its traced update, from the (possibly traced,
    possibly ``vmap``-ed) meta-parameters, and uses it where it would use Adam's
    ``scale_by_adam``: PPO clips the gradient by global norm first and applies
    ``params - learning_rate * u`` to the rule's output ``u`` after, so learning-rate
    tuning and annealing still apply.

    Attributes:
        name: short identifier used in logs and plots.
        init: ``key -> meta_params`` of the rule.
        transformation: ``meta_params -> optax.GradientTransformationExtraArgs``. Its
            ``init(params)`` builds the rule's state (kept in the agent's state, so training
            resumes exactly); its ``update(grads, state, params, *, progress, key)`` receives
            two extra arguments: ``progress`` ``[]`` float32, the fraction of training
            done ``n / N`` in ``[0, 1]``, and ``key``, a fresh PRNG key for this step (for
            stochastic rules; deterministic ones ignore it). The algorithm derives ``key``
            from its own key, so no seed is needed in ``init``.
    """

    name: str
    init: Callable[[jax.Array], MetaParams]
    transformation: Callable[[MetaParams], optax.GradientTransformationExtraArgs]


SLOTS = ("policy", "value")  # the loss slots
OPTIMIZER_SLOT = "optimizer"
ALL_SLOTS = (*SLOTS, OPTIMIZER_SLOT)  # every slot an objective may fill, in canonical order


@dataclass(frozen=True)
class Objective:
    """Loss terms for some of an algorithm's slots, each possibly learned.

    Attributes:
        policy: the policy loss, or ``None`` for the algorithm's own.
        value: the value (critic) loss, or ``None`` for the algorithm's own.
        optimizer: the update rule replacing the algorithm's Adam, or ``None`` for Adam
            (only algorithms with an ``"optimizer"`` slot accept one).
        algorithms: the algorithms it applies to; ``None``: any that has its slots.
        label: the name it is known by (a registered objective's name); by default the
            names of its terms.
    """

    policy: LossTerm | None = None
    value: LossTerm | None = None
    algorithms: tuple[str, ...] | None = None
    label: str | None = None
    optimizer: OptimizerTerm | None = None

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots this objective fills (its terms that are not ``None``), among
        :data:`ALL_SLOTS`."""
        return tuple(slot for slot in ALL_SLOTS if getattr(self, slot) is not None)

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        name = "+".join(getattr(self, slot).name if getattr(self, slot) else "default"
                        for slot in SLOTS)
        return name if self.optimizer is None else f"{name}+{self.optimizer.name}"

    def with_defaults(self, **defaults: LossTerm) -> Objective:
        """This objective with every empty slot filled from ``defaults`` (slot -> term)."""
        unknown = sorted(set(defaults) - set(SLOTS))
        if unknown:
            raise ValueError(f"with_defaults: unknown slot(s) {unknown}; slots: {SLOTS}")
        filled = {slot: term for slot, term in defaults.items() if getattr(self, slot) is None}
        return dataclasses.replace(self, **filled)

    def init(self, key: jax.Array) -> dict[str, MetaParams]:
        """Meta-parameters ``{"policy": ..., "value": ...}``; ``{}`` for an empty loss slot.

        With the optimiser slot filled there is a third entry ``"optimizer"``, drawn from
        ``fold_in(key, 2)`` so that the loss terms' draws are those of an objective without
        it; without the slot the pytree (and every value in it) is unchanged.
        """
        policy_key, value_key = jax.random.split(key)
        meta_params = {"policy": self.policy.init(policy_key) if self.policy else {},
                       "value": self.value.init(value_key) if self.value else {}}
        if self.optimizer is not None:
            meta_params[OPTIMIZER_SLOT] = self.optimizer.init(jax.random.fold_in(key, 2))
        return meta_params

    def optimizer_transformation(
        self, meta_params: dict[str, MetaParams]
    ) -> optax.GradientTransformationExtraArgs:
        """The optimiser slot's update rule built from ``meta_params["optimizer"]``."""
        if self.optimizer is None:
            raise ValueError(f"objective {self.name!r} leaves the optimizer slot to the "
                             "algorithm (Adam)")
        if OPTIMIZER_SLOT not in meta_params:
            raise ValueError(f"objective {self.name!r} fills the optimizer slot but the "
                             f"meta-parameters have no {OPTIMIZER_SLOT!r} entry (keys: "
                             f"{sorted(meta_params)})")
        return self.optimizer.transformation(meta_params[OPTIMIZER_SLOT])

    def policy_loss(self, meta_params: dict[str, MetaParams], inputs: LossInputs) -> jax.Array:
        return self._term("policy").loss(meta_params["policy"], inputs)

    def value_loss(self, meta_params: dict[str, MetaParams], inputs: LossInputs) -> jax.Array:
        return self._term("value").loss(meta_params["value"], inputs)

    def _term(self, slot: str) -> LossTerm:
        term = getattr(self, slot)
        if term is None:
            raise ValueError(f"objective {self.name!r} leaves the {slot} slot to the algorithm; "
                             "fill it with with_defaults() before training")
        return term


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


def _squared_error_loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
    del meta_params
    return 0.5 * jnp.mean(jnp.square(inputs.values - inputs.targets))


def _huber_loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
    del meta_params
    error = jnp.abs(inputs.values - inputs.targets)
    quadratic = jnp.minimum(error, 1.0)
    return jnp.mean(0.5 * jnp.square(quadratic) + (error - quadratic))


def squared_error() -> LossTerm:
    """The L2 regression loss ``0.5 mean((values - targets)^2)`` (named ``"l2"``), e.g. an
    off-policy critic's TD loss with ``targets`` the bootstrapped TD targets."""
    return LossTerm("l2", no_meta_params, _squared_error_loss)


def huber() -> LossTerm:
    """The Huber loss of ``values - targets`` with threshold 1 (quadratic within ±1,
    linear beyond: bounded gradients for large TD errors), averaged over the batch."""
    return LossTerm("huber", no_meta_params, _huber_loss)


def ppo_objective() -> Objective:
    """Standard PPO: clipped surrogate and clipped L2 value loss, no meta-parameters."""
    return Objective(policy=ppo_clip(), value=clipped_l2(), algorithms=("ppo",))
