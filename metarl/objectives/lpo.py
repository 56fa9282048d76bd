"""Learned Policy Optimisation (LPO): an evolved drift function replaces PPO's clipping.

Mirror-learning view of PPO: the policy maximises ``r A`` minus a *drift* penalty that is
non-negative and vanishes, together with its gradient, at ``r = 1``. LPO learns the drift:

    features(r, A) = [r-1, (r-1)^2, log r, (log r)^2,
                      (r-1)A, (r-1)^2 A, (log r)A, (log r)^2 A]          (8 per sample)
    drift(r, A)    = relu(net(features) - 1e-4)
    L_pi           = -mean_i (r_i A_i - drift(r_i, A_i))

``net`` is an MLP with tanh hidden layers (default one layer of 128 units) and **no biases**.
Every feature is zero at ``r = 1``, so without biases ``net = 0`` there; the ``-1e-4`` shift
puts the ReLU in its flat region around ``r = 1``, so drift and its gradient vanish at
``r = 1`` and ``drift >= 0`` everywhere, for every parameter value.

With ``ppo_init=True`` the drift is PPO's clipping written as a drift plus the learned part,

    drift(r, A) = relu((r - clip(r, 1-eps, 1+eps)) A) + relu(net(features) - 1e-4),

where the first term equals ``r A - min(r A, clip(r, 1±eps) A)``; the network's output layer
starts at zero, so the initial objective is exactly PPO's clipped surrogate. The learned part
can then only add drift to PPO's: evolution can make the update more conservative than PPO's
clip, never less. With ``zero_init=True`` (and no ``ppo_init``) the output layer starts at
zero with nothing underneath: the search starts at the unpenalised surrogate ``r A`` and may
reach drifts on either side of PPO's.

The objective fills only PPO's policy slot (PPO keeps its clipped L2 value loss). The
builder :func:`drift_term` takes the feature function as an argument;
:mod:`metarl.objectives.ta_lpo` reuses it with progress-dependent features.

Meta-parameters: ``{"policy": {"layers": [{"w": [F, h1]}, ..., {"w": [hL, 1]}]},
"value": {}}`` with ``F = 8`` here, float32, no biases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from inner_loops.objective import LossInputs, LossTerm, Objective
from metarl.objectives import dpo
from metarl.objectives.drift import DriftFunction, drift_figures
from metarl.objectives.mlp import apply_mlp, init_mlp
from metarl.objectives.registry import register_objective

DEFAULT_HIDDEN_SIZES = (128,)
DRIFT_OFFSET = 1e-4

# (ratio, log_ratio, advantage, progress), all broadcast to one shape [...] -> [..., F]
FeatureFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def lpo_features(
    ratio: jax.Array, log_ratio: jax.Array, advantage: jax.Array, progress: jax.Array
) -> jax.Array:
    """LPO's 8 input features; all are zero at ``ratio = 1``.

    Args:
        ratio, log_ratio, advantage, progress: ``[...]`` arrays of one shape
            (``progress`` is ignored here).

    Returns:
        ``[..., 8]``: ``[r-1, (r-1)^2, log r, (log r)^2]`` and each of those times ``A``.
    """
    del progress
    base = jnp.stack(
        [ratio - 1.0, jnp.square(ratio - 1.0), log_ratio, jnp.square(log_ratio)], axis=-1
    )
    return jnp.concatenate([base, base * advantage[..., None]], axis=-1)


NUM_LPO_FEATURES = 8


def ppo_drift(ratio: jax.Array, advantage: jax.Array, clip_eps: jax.Array) -> jax.Array:
    """PPO's clipping as a drift, ``relu((r - clip(r, 1±eps)) A)``; broadcasting ``[...] -> [...]``.

    Equals ``r A - min(r A, clip(r, 1±eps) A)``: non-negative, zero (with zero gradient) for
    ``r`` inside ``[1-eps, 1+eps]``.
    """
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return jax.nn.relu((ratio - clipped) * advantage)


def init_drift_net(
    key: jax.Array,
    num_features: int,
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    zero_last: bool = False,
) -> dict:
    """Bias-free drift network ``num_features -> hidden_sizes -> 1``.

    Returns ``{"layers": [{"w": [F, h1]}, ..., {"w": [hL, 1]}]}`` (float32, LeCun normal).
    """
    sizes = (num_features, *tuple(hidden_sizes), 1)
    return init_mlp(key, sizes, use_bias=False, zero_last=zero_last)


def learned_drift(meta_params: dict, features: jax.Array) -> jax.Array:
    """``relu(net(features) - 1e-4)``; ``[..., F] -> [...]``, always ``>= 0``."""
    net = apply_mlp(meta_params, features, jnp.tanh)[..., 0]
    return jax.nn.relu(net - DRIFT_OFFSET)


def drift_with_features(
    feature_fn: FeatureFn,
    meta_params: dict,
    ratio: jax.Array,
    advantage: jax.Array,
    clip_eps: jax.Array | float = 0.2,
    progress: jax.Array | float = 0.0,
    *,
    ppo_init: bool = False,
    log_ratio: jax.Array | None = None,
) -> jax.Array:
    """Total drift for a given feature function, broadcasting all inputs.

    Args:
        feature_fn: maps ``(ratio, log_ratio, advantage, progress)`` ``[...]`` to ``[..., F]``.
        meta_params: the policy term's meta-parameters ``{"layers": [...]}``.
        ratio: ``[...]`` probability ratios (> 0).
        advantage: ``[...]`` advantages.
        clip_eps: ``[]`` PPO clip range, used only when ``ppo_init``.
        progress: ``[...]`` or ``[]`` training progress ``n / N``.
        ppo_init: add PPO's clipping drift (must match how the objective was built).
        log_ratio: ``[...]`` exact ``log(ratio)`` if known (otherwise computed).

    Returns:
        ``[...]`` drift values (broadcast shape of the inputs), ``>= 0``.
    """
    ratio = jnp.asarray(ratio, jnp.float32)
    if log_ratio is None:
        log_ratio = jnp.log(ratio)
    ratio, log_ratio, advantage, progress = jnp.broadcast_arrays(
        ratio,
        jnp.asarray(log_ratio, jnp.float32),
        jnp.asarray(advantage, jnp.float32),
        jnp.asarray(progress, jnp.float32),
    )
    result = learned_drift(meta_params, feature_fn(ratio, log_ratio, advantage, progress))
    if ppo_init:
        result = result + ppo_drift(ratio, advantage, clip_eps)
    return result


def drift_term(
    name: str,
    feature_fn: FeatureFn,
    num_features: int,
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    ppo_init: bool = False,
    zero_init: bool = False,
) -> LossTerm:
    """Policy loss term ``-mean(r A - drift(r, A, ...))`` for a drift on ``feature_fn``.

    With ``ppo_init`` the term is named ``f"{name}_ppo_init"``, PPO's drift is added and the
    network's output layer starts at zero (so the initial loss is PPO's clipped surrogate).
    With ``zero_init`` only the output layer starts at zero (the initial drift is zero).
    """
    hidden_sizes = tuple(int(h) for h in hidden_sizes)

    def init(key: jax.Array) -> dict:
        return init_drift_net(key, num_features, hidden_sizes,
                              zero_last=ppo_init or zero_init)

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        penalty = drift_with_features(
            feature_fn,
            meta_params,
            inputs.ratio,
            inputs.advantages,
            inputs.clip_eps,
            inputs.progress,
            ppo_init=ppo_init,
            log_ratio=inputs.log_ratio,
        )
        return -jnp.mean(inputs.ratio * inputs.advantages - penalty)

    return LossTerm(f"{name}_ppo_init" if ppo_init else name, init, loss)


def drift(
    meta_params: dict,
    ratio: jax.Array,
    advantage: jax.Array,
    clip_eps: jax.Array | float = 0.2,
    progress: jax.Array | float = 0.0,
    *,
    ppo_init: bool = False,
) -> jax.Array:
    """LPO's drift, broadcasting ``ratio`` and ``advantage`` (e.g. a heatmap grid).

    Args:
        meta_params: the ``"policy"`` meta-parameters of an ``"lpo"`` objective.
        ratio: ``[...]`` probability ratios (> 0).
        advantage: ``[...]`` advantages.
        clip_eps: PPO clip range, used only with ``ppo_init``.
        progress: ignored by LPO (kept for a uniform signature with ``ta_lpo``).
        ppo_init: whether the objective was built with ``ppo_init=True``.

    Returns:
        ``[...]`` drift, ``>= 0``, zero at ``ratio = 1``.
    """
    return drift_with_features(
        lpo_features, meta_params, ratio, advantage, clip_eps, progress, ppo_init=ppo_init
    )


def drift_fn(policy_meta_params: dict, clip_eps: float = 0.2,
             ppo_init: bool = False) -> DriftFunction:
    """The learned drift of ``policy_meta_params`` (an ``"lpo"`` objective's ``"policy"``
    meta-parameters) as a labelled function ``(ratio, advantage, progress=0.0) -> drift``."""

    def learned(ratio, advantage, progress):
        return drift(policy_meta_params, ratio, advantage, clip_eps, progress, ppo_init=ppo_init)

    return DriftFunction(learned, "learned LPO drift")


def ppo_drift_fn(clip_eps: float = 0.2) -> DriftFunction:
    """PPO's clipping written as a drift (:func:`ppo_drift`), as a labelled function."""

    def clipping(ratio, advantage, progress):
        del progress
        return ppo_drift(jnp.asarray(ratio, jnp.float32), jnp.asarray(advantage, jnp.float32),
                         clip_eps)

    return DriftFunction(clipping, f"PPO clip drift (ε = {clip_eps:g})")


def reference_drifts(clip_eps: float = 0.2) -> dict[str, DriftFunction]:
    """The drifts a learned one is drawn against: PPO's clip at ``clip_eps`` and DPO's
    closed form, ``{label: drift}``."""
    return {fn.label: fn for fn in (ppo_drift_fn(clip_eps), dpo.drift_fn())}


def _figures(request) -> dict:
    return drift_figures(request, drift_fn, reference_drifts)


def _portable(meta_params: dict, options: Mapping[str, Any]) -> dict:
    """The learned drift as a plain function ``drift(ratio, advantage, *, clip_eps=0.2)``
    (broadcasting ``[...]`` inputs; ``clip_eps`` matters only with ``ppo_init``)."""
    policy_params, ppo_init = meta_params["policy"], bool(options.get("ppo_init", False))

    def learned(ratio: jax.Array, advantage: jax.Array, *, clip_eps: float = 0.2
                ) -> jax.Array:
        return drift(policy_params, ratio, advantage, clip_eps, ppo_init=ppo_init)

    return {"policy": learned}


@register_objective("lpo", slots=("policy",), algorithms=("ppo", "recurrent_ppo"),
                    baselines=("ppo", "dpo"),
                    plot=_figures, portable=_portable)
def make_lpo(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES, ppo_init: bool = False,
    zero_init: bool = False,
) -> Objective:
    """LPO's learned drift as PPO's policy loss (``zero_init``: start at zero drift)."""
    return Objective(policy=drift_term("lpo", lpo_features, NUM_LPO_FEATURES, hidden_sizes,
                                       ppo_init, zero_init))
