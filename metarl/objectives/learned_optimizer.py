"""A learned optimiser: a small per-parameter MLP that reshapes Adam's update.

The objective fills the ``"optimizer"`` slot (:class:`~inner_loops.objective.OptimizerTerm`)
and leaves the losses to the algorithm. In PPO the rule sits where ``scale_by_adam`` sits:
the gradient is clipped by global norm before it, and ``params - learning_rate * u`` is
applied after it, so a tuned (and annealed) learning rate still applies.

**Update.** For every parameter (every element of every leaf), with ``g`` its clipped
gradient:

    d   = Adam's direction, exactly optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-5)
    o   = MLP(features)                        (output layer zero at initialisation)
    u   = d * exp(a * tanh(o_1)) + b * tanh(o_2)

with ``a = max_log_scale`` (default 3: the learned factor on Adam's step lies in
``[e^-3, e^3]``) and ``b = max_additive`` (default 1: the learned additive part is at most
one learning-rate unit per step). Both parts are bounded whatever the meta-parameters, so
``|u| <= e^a |d| + b`` and a wild candidate cannot make a step larger than that; ``|d|``
is Adam's own step, ``|m_hat| / (sqrt(v_hat) + eps)``.

At initialisation ``o = 0`` exactly (zero weights and biases in the output layer, finite
hidden activations), so ``u = d * exp(0) + b * tanh(0) = d * 1 + 0``: equal to Adam's update
bit for bit (a ``-0.0`` of Adam's may come out as ``+0.0``, which compares equal).

**Inputs**, all per parameter (an array ``[*leaf_shape, F]`` per leaf; ``F = k + 3`` for
``k`` timescales):

* ``g / (sqrt(v_hat) + eps)``: the gradient, normalised by Adam's second moment;
* ``m_beta / (sqrt(v_hat) + eps)`` for each ``beta`` in ``timescales`` (default 0.5, 0.9,
  0.99): momenta ``m <- beta m + (1 - beta) g`` at several timescales, normalised alike;
* ``d``: Adam's normalised direction;
* ``progress``: the fraction of training done, ``n / N`` in ``[0, 1]`` (the same for every
  parameter), which the algorithm passes to ``update`` as the extra argument
  ``progress``.

Every input is clipped to ``±FEATURE_CLIP`` (10), so the network sees bounded inputs even
when ``v_hat`` is tiny. The normalisation makes the inputs invariant to the gradient's scale,
as Adam's direction is.

**State** (:class:`LearnedOptState`, in the agent's state so that training resumes exactly):
Adam's ``ScaleByAdamState`` and one momentum pytree per timescale. Its shape does not
depend on the meta-parameters.

**Cost per step.** A ``F -> hidden -> 2`` MLP per parameter: ``~(F + 2) * hidden`` multiply-
adds per parameter against Adam's handful; see ``docs/guides/objectives.md`` for measured
times.

Meta-parameters: ``{"policy": {}, "value": {}, "optimizer": {"layers": [{"w": [F, h1],
"b": [h1]}, ..., {"w": [hL, 2], "b": [2]}]}}``, float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from inner_loops.objective import Objective, OptimizerTerm
from metarl.objectives.mlp import apply_mlp, init_mlp
from metarl.objectives.registry import register_objective

DEFAULT_HIDDEN_SIZES = (16,)
DEFAULT_TIMESCALES = (0.5, 0.9, 0.99)
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-5  # PPO's scale_by_adam(eps=1e-5)
FEATURE_CLIP = 10.0
DEFAULT_MAX_LOG_SCALE = 3.0
DEFAULT_MAX_ADDITIVE = 1.0

# (grads, adam_state, params) -> per leaf, [*leaf_shape, E] extra per-parameter inputs
ExtraFeatures = Callable[[Any, optax.ScaleByAdamState, Any], Any]


class LearnedOptState(NamedTuple):
    """The learned rule's state.

    Attributes:
        adam: Adam's state (``count []`` int32, ``mu`` and ``nu`` like the parameters),
            which gives the base direction ``d``.
        momenta: one pytree like the parameters per timescale, ``m_beta``.
    """

    adam: optax.ScaleByAdamState
    momenta: tuple


def check_options(hidden_sizes: Any, timescales: Any, max_log_scale: Any,
                  max_additive: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """``(hidden_sizes, timescales)`` as tuples; ``ValueError`` naming a bad option."""
    try:
        hidden = tuple(hidden_sizes)
    except TypeError:
        raise ValueError(f"hidden_sizes: expected a list of layer widths, got "
                         f"{hidden_sizes!r}") from None
    if not hidden or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1
                             for h in hidden):
        raise ValueError(f"hidden_sizes: expected a non-empty list of positive integers, got "
                         f"{hidden_sizes!r}")
    try:
        scales = tuple(float(t) for t in timescales)
    except (TypeError, ValueError):
        raise ValueError(f"timescales: expected a list of numbers in (0, 1), got "
                         f"{timescales!r}") from None
    if not scales or not all(0.0 < t < 1.0 for t in scales):
        raise ValueError(f"timescales: every momentum timescale must lie in (0, 1) "
                         f"(open interval), got {timescales!r}")
    check_bound("max_log_scale", max_log_scale)
    check_bound("max_additive", max_additive)
    return hidden, scales


def check_bound(name: str, value: Any) -> float:
    """``value`` as a float if it is a positive finite number; else ``ValueError`` naming
    the option ``name``."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name}: must be a positive finite number, got {value!r}")
    return float(value)


def num_features(timescales: Sequence[float], num_extra: int = 0) -> int:
    """``F``: normalised gradient, one momentum per timescale, Adam's direction, progress,
    and ``num_extra`` further inputs."""
    return len(timescales) + 3 + num_extra


def init_rule(key: jax.Array, hidden_sizes: Sequence[int], num_inputs: int,
              num_outputs: int) -> dict:
    """Meta-parameters of the ``num_inputs -> hidden_sizes -> num_outputs`` tanh MLP with a
    zero output layer (so the rule starts at Adam)."""
    return init_mlp(key, (num_inputs, *hidden_sizes, num_outputs), zero_last=True)


def base_features(grads: Any, adam_state: optax.ScaleByAdamState, direction: Any,
                  momenta: tuple, progress: jax.Array) -> Any:
    """The per-parameter inputs of the module docstring, per leaf ``[*shape, k + 3]``."""
    count = adam_state.count.astype(jnp.float32)
    correction = 1.0 - ADAM_B2 ** count

    def leaf(g, nu, d, *ms):
        scale = 1.0 / (jnp.sqrt(nu / correction) + ADAM_EPS)
        columns = [g * scale, *(m * scale for m in ms), d,
                   jnp.broadcast_to(progress, g.shape).astype(g.dtype)]
        return jnp.clip(jnp.stack(columns, axis=-1), -FEATURE_CLIP, FEATURE_CLIP)

    return jax.tree.map(leaf, grads, adam_state.nu, direction, *momenta)


def learned_rule(
    meta_params: dict,
    timescales: Sequence[float],
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
    extra_features: ExtraFeatures | None = None,
    max_noise: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """The rule ``u = d exp(a tanh(o_1)) + b tanh(o_2) [+ c tanh(o_3) eps]`` of
    ``meta_params``.

    Args:
        meta_params: ``{"layers": [...]}`` of the MLP (traced or not).
        timescales: momentum timescales (``k`` of them).
        max_log_scale, max_additive: the bounds ``a`` and ``b``.
        extra_features: further per-parameter inputs appended after the base ones
            (:mod:`.open_optimizer`'s dormancy and depth).
        max_noise: with a value ``c``, a third output scales standard normal noise ``eps``
            drawn from the ``key`` extra argument (required then).

    Returns:
        A transformation whose ``update(grads, state, params, *, progress, key=None)`` maps
        gradients to ``u`` (same pytree), state :class:`LearnedOptState`.
    """
    adam = optax.scale_by_adam(b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS)
    timescales = tuple(float(t) for t in timescales)

    def init(params) -> LearnedOptState:
        zeros = tuple(jax.tree.map(jnp.zeros_like, params) for _ in timescales)
        return LearnedOptState(adam.init(params), zeros)

    def update(grads, state: LearnedOptState, params=None, *, progress=None, key=None,
               **extra_args):
        del extra_args
        if progress is None:
            raise ValueError("a learned optimiser's update needs the extra argument "
                             "progress (the fraction of training done, in [0, 1])")
        if max_noise is not None and key is None:
            raise ValueError("a stochastic learned optimiser's update needs the extra "
                             "argument key (a PRNG key per step)")
        direction, adam_state = adam.update(grads, state.adam, params)
        momenta = tuple(
            jax.tree.map(lambda m, g, beta=beta: beta * m + (1.0 - beta) * g, ms, grads)
            for beta, ms in zip(timescales, state.momenta, strict=True)
        )
        progress = jnp.asarray(progress, jnp.float32)
        features = base_features(grads, adam_state, direction, momenta, progress)
        if extra_features is not None:
            extra = extra_features(grads, adam_state, params)
            features = jax.tree.map(lambda f, e: jnp.concatenate([f, e], axis=-1),
                                    features, extra)
        leaves, treedef = jax.tree.flatten(direction)
        feature_leaves = treedef.flatten_up_to(features)
        noise_keys = (jax.random.split(key, len(leaves)) if max_noise is not None
                      else [None] * len(leaves))
        out = []
        for d, f, noise_key in zip(leaves, feature_leaves, noise_keys, strict=True):
            o = apply_mlp(meta_params, f)
            u = d * jnp.exp(max_log_scale * jnp.tanh(o[..., 0])) + max_additive * jnp.tanh(
                o[..., 1])
            if max_noise is not None:
                eps = jax.random.normal(noise_key, d.shape, d.dtype)
                u = u + max_noise * jnp.tanh(o[..., 2]) * eps
            out.append(u)
        return treedef.unflatten(out), LearnedOptState(adam_state, momenta)

    return optax.GradientTransformationExtraArgs(init, update)


def rule_term(name: str, hidden_sizes: Sequence[int], timescales: Sequence[float],
              max_log_scale: float, max_additive: float,
              extra_features: ExtraFeatures | None = None, num_extra: int = 0,
              max_noise: float | None = None) -> OptimizerTerm:
    """The optimiser term ``name`` of a :func:`learned_rule` (options checked): its MLP has
    ``num_features(timescales, num_extra)`` inputs and 2 outputs, 3 with ``max_noise``."""
    hidden, scales = check_options(hidden_sizes, timescales, max_log_scale, max_additive)
    max_log_scale, max_additive = float(max_log_scale), float(max_additive)
    outputs = 2 if max_noise is None else 3

    def init(key: jax.Array) -> dict:
        return init_rule(key, hidden, num_features(scales, num_extra), outputs)

    def transformation(meta_params: dict) -> optax.GradientTransformationExtraArgs:
        return learned_rule(meta_params, scales, max_log_scale, max_additive,
                            extra_features=extra_features, max_noise=max_noise)

    return OptimizerTerm(name, init, transformation)


def learned_optimizer_term(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    timescales: Sequence[float] = DEFAULT_TIMESCALES,
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
) -> OptimizerTerm:
    """The optimiser term of :func:`make_learned_optimizer` (options checked)."""
    return rule_term("learned_optimizer", hidden_sizes, timescales, max_log_scale,
                     max_additive)


@register_objective("learned_optimizer", slots=("optimizer",), baselines=("ppo",))
def make_learned_optimizer(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    timescales: Sequence[float] = DEFAULT_TIMESCALES,
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
) -> Objective:
    """A learned per-parameter update rule starting at Adam (see the module docstring)."""
    return Objective(optimizer=learned_optimizer_term(hidden_sizes, timescales,
                                                      max_log_scale, max_additive))
