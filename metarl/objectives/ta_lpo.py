"""Temporally-aware LPO: the learned drift also sees training progress ``p = n / N``.

Same as :mod:`metarl.objectives.lpo`, with the 8 LPO features ``f(r, A)`` extended by each of
them times the progress:

    features(r, A, p) = [f(r, A), p f(r, A)]                               (16 per sample)
    drift(r, A, p)    = relu(net(features) - 1e-4)       [+ relu((r - clip(r, 1±eps)) A)]
    L_pi              = -mean_i (r_i A_i - drift(r_i, A_i, p))

Multiplying (rather than appending ``p`` as a feature) keeps every feature zero at ``r = 1``
for every ``p``; with the bias-free network the drift is therefore ``>= 0`` and vanishes with
its gradient at ``r = 1`` throughout training, while its shape may change over time.
``p`` comes from ``LossInputs.progress``. It fills only PPO's policy slot.

Meta-parameters: ``{"policy": {"layers": [{"w": [16, h1]}, ..., {"w": [hL, 1]}]},
"value": {}}``, float32, no biases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from inner_loops.objective import Objective
from metarl.objectives.drift import DriftFunction, drift_figures
from metarl.objectives.lpo import (
    DEFAULT_HIDDEN_SIZES,
    NUM_LPO_FEATURES,
    drift_term,
    drift_with_features,
    lpo_features,
    reference_drifts,
)
from metarl.objectives.registry import register_objective

NUM_TA_LPO_FEATURES = 2 * NUM_LPO_FEATURES


def ta_lpo_features(
    ratio: jax.Array, log_ratio: jax.Array, advantage: jax.Array, progress: jax.Array
) -> jax.Array:
    """``[...]`` inputs of one shape -> ``[..., 16]``: LPO's 8 features and each times ``p``."""
    base = lpo_features(ratio, log_ratio, advantage, progress)
    return jnp.concatenate([base, base * progress[..., None]], axis=-1)


def drift(
    meta_params: dict,
    ratio: jax.Array,
    advantage: jax.Array,
    clip_eps: jax.Array | float = 0.2,
    progress: jax.Array | float = 0.0,
    *,
    ppo_init: bool = False,
) -> jax.Array:
    """Temporally-aware drift, broadcasting ``ratio``, ``advantage`` and ``progress``.

    Args:
        meta_params: the ``"policy"`` meta-parameters of a ``"ta_lpo"`` objective.
        ratio: ``[...]`` probability ratios (> 0).
        advantage: ``[...]`` advantages.
        clip_eps: PPO clip range, used only with ``ppo_init``.
        progress: ``[]`` or ``[...]`` training progress ``n / N`` in ``[0, 1]``.
        ppo_init: whether the objective was built with ``ppo_init=True``.

    Returns:
        ``[...]`` drift, ``>= 0``, zero at ``ratio = 1`` for every progress.
    """
    return drift_with_features(
        ta_lpo_features, meta_params, ratio, advantage, clip_eps, progress, ppo_init=ppo_init
    )


def drift_fn(policy_meta_params: dict, clip_eps: float = 0.2,
             ppo_init: bool = False) -> DriftFunction:
    """The learned drift of ``policy_meta_params`` (a ``"ta_lpo"`` objective's ``"policy"``
    meta-parameters) as a labelled function ``(ratio, advantage, progress=0.0) -> drift``."""

    def learned(ratio, advantage, progress):
        return drift(policy_meta_params, ratio, advantage, clip_eps, progress, ppo_init=ppo_init)

    return DriftFunction(learned, "learned TA-LPO drift", uses_progress=True)


def _figures(request) -> dict:
    return drift_figures(request, drift_fn, reference_drifts)


def _portable(meta_params: dict, options: Mapping[str, Any]) -> dict:
    """The learned drift as a plain function ``drift(ratio, advantage, progress, *,
    clip_eps=0.2)`` (broadcasting ``[...]`` inputs; ``progress`` is ``n / N`` in
    ``[0, 1)``; ``clip_eps`` matters only with ``ppo_init``)."""
    policy_params, ppo_init = meta_params["policy"], bool(options.get("ppo_init", False))

    def learned(ratio: jax.Array, advantage: jax.Array, progress: jax.Array, *,
                clip_eps: float = 0.2) -> jax.Array:
        return drift(policy_params, ratio, advantage, clip_eps, progress, ppo_init=ppo_init)

    return {"policy": learned}


@register_objective("ta_lpo", slots=("policy",), algorithms=("ppo", "recurrent_ppo"),
                     baselines=("ppo", "dpo"), plot=_figures, portable=_portable)
def make_ta_lpo(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES, ppo_init: bool = False,
    zero_init: bool = False,
) -> Objective:
    """Temporally-aware LPO drift as PPO's policy loss (``zero_init``: start at zero
    drift)."""
    return Objective(policy=drift_term("ta_lpo", ta_lpo_features, NUM_TA_LPO_FEATURES,
                                       hidden_sizes, ppo_init, zero_init))
