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

**Figure** (``metarl plot RUN``, :func:`update_grid`). The rule is drawn as a function of
its inputs: the update ``u`` against the normalised gradient ``x = g / (sqrt(v_hat) + eps)``
in ``[-3, 3]``, one line per previous momentum ``m`` in ``{-1, 0, 1}`` (the momentum before
this step, in the same units), one panel per progress 0, 0.5 and 1, with Adam's direction at
the same inputs dashed. The inputs follow from ``(x, m)`` as in a step of the rule where
every timescale's momentum and Adam's first moment were ``m`` before the step (a steady
gradient history) and Adam's first-moment bias correction has run out (``1 - 0.9^t``
rounds to 1 in float32 after about 165 steps): momentum ``beta m + (1 - beta) x`` at each
timescale and Adam's direction ``d = 0.9 m + 0.1 x``. At initialisation every line lies on
Adam's.

Meta-parameters: ``{"policy": {}, "value": {}, "optimizer": {"layers": [{"w": [F, h1],
"b": [h1]}, ..., {"w": [hL, 2], "b": [2]}]}}``, float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from inner_loops.objective import Objective, OptimizerTerm
from inner_loops.ppo import ADAM_EPS
from metarl.objectives.mlp import apply_mlp, init_mlp
from metarl.objectives.registry import RunFigureRequest, register_objective

DEFAULT_HIDDEN_SIZES = (16,)
DEFAULT_TIMESCALES = (0.5, 0.9, 0.99)
ADAM_B1, ADAM_B2 = 0.9, 0.999  # optax's scale_by_adam defaults, which PPO's Adam keeps
FEATURE_CLIP = 10.0
DEFAULT_MAX_LOG_SCALE = 3.0
DEFAULT_MAX_ADDITIVE = 1.0
# The figure of the rule: normalised gradients on the x-axis, a line per previous momentum,
# a panel per training progress (see the module docstring).
DRAWN_GRADIENT_RANGE = (-3.0, 3.0)
DRAWN_MOMENTA = (-1.0, 0.0, 1.0)
DRAWN_PROGRESSES = (0.0, 0.5, 1.0)

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
        return stack_features(g * scale, [m * scale for m in ms], d, progress)

    return jax.tree.map(leaf, grads, adam_state.nu, direction, *momenta)


def stack_features(gradient: jax.Array, momenta: Sequence[jax.Array], direction: jax.Array,
                   progress: jax.Array) -> jax.Array:
    """The base inputs in the network's order, clipped to ``±FEATURE_CLIP``:
    ``[*shape, k + 3]`` from the normalised gradient, the ``k`` normalised momenta and
    Adam's direction (each ``[*shape]``) and ``progress`` (broadcast to ``shape``)."""
    columns = [gradient, *momenta, direction,
               jnp.broadcast_to(progress, gradient.shape).astype(gradient.dtype)]
    return jnp.clip(jnp.stack(columns, axis=-1), -FEATURE_CLIP, FEATURE_CLIP)


def rule_outputs(meta_params: dict, features: jax.Array, direction: jax.Array,
                 max_log_scale: float, max_additive: float) -> tuple[jax.Array, jax.Array]:
    """The rule's deterministic update ``d exp(a tanh(o_1)) + b tanh(o_2)`` and the MLP's
    outputs ``o``: ``features [..., F]`` and ``direction [...]`` -> ``([...], [..., 2 or 3])``."""
    o = apply_mlp(meta_params, features)
    u = direction * jnp.exp(max_log_scale * jnp.tanh(o[..., 0])) + max_additive * jnp.tanh(
        o[..., 1])
    return u, o


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
            u, o = rule_outputs(meta_params, f, d, max_log_scale, max_additive)
            if max_noise is not None:
                eps = jax.random.normal(noise_key, d.shape, d.dtype)
                u = u + max_noise * jnp.tanh(o[..., 2]) * eps
            out.append(u)
        return treedef.unflatten(out), LearnedOptState(adam_state, momenta)

    return optax.GradientTransformationExtraArgs(init, update)


class UpdateGrid(NamedTuple):
    """A rule evaluated on a grid of its inputs (:func:`update_grid`).

    Attributes:
        gradients: ``[N]`` normalised gradients ``x = g / (sqrt(v_hat) + eps)``.
        momenta: ``[M]`` previous momenta ``m``, in the same units.
        progresses: ``[P]`` training progress values.
        update: ``[P, M, N]`` the rule's update (without its noise).
        noise_std: ``[P, M, N]`` standard deviation of its learned noise (0 without noise).
        adam: ``[M, N]`` Adam's direction ``d = 0.9 m + 0.1 x`` at the same inputs.
    """

    gradients: jax.Array
    momenta: jax.Array
    progresses: jax.Array
    update: jax.Array
    noise_std: jax.Array
    adam: jax.Array


def update_at(
    meta_params: dict,
    gradient: Any,
    momentum: Any,
    progress: Any,
    *,
    timescales: Sequence[float] = DEFAULT_TIMESCALES,
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
    extra_inputs: Sequence[Any] = (),
    max_noise: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The rule's update for one step from a steady momentum, elementwise (pure JAX).

    Every timescale's momentum and Adam's first moment are ``momentum`` before the step and
    Adam's first-moment bias correction is 1 (the module docstring's figure), so the inputs
    are the normalised gradient ``x``, ``beta m + (1 - beta) x`` per timescale, Adam's
    direction ``d = 0.9 m + 0.1 x`` and ``progress``, then ``extra_inputs`` in order.

    Args:
        meta_params: the rule's ``{"layers": [...]}``.
        gradient, momentum, progress: ``x``, ``m`` and progress, broadcasting together (and
            with ``extra_inputs``) to a shape ``[...]``.
        timescales, max_log_scale, max_additive: the objective's options.
        extra_inputs: further per-parameter inputs (:mod:`.open_optimizer`'s dormancy and
            layer position), each broadcasting to ``[...]``.
        max_noise: the noise bound ``c`` of a stochastic rule (``None``: none).

    Returns:
        ``(update, noise_std, adam)``, each ``[...]``: the update without its noise, the
        noise's standard deviation ``c |tanh(o_3)|`` (zeros without noise) and ``d``.
    """
    x, m, p, *extra = (jnp.asarray(value, jnp.float32)
                       for value in (gradient, momentum, progress, *extra_inputs))
    shape = jnp.broadcast_shapes(*(value.shape for value in (x, m, p, *extra)))
    x, m = jnp.broadcast_to(x, shape), jnp.broadcast_to(m, shape)
    direction = ADAM_B1 * m + (1.0 - ADAM_B1) * x
    momenta = [beta * m + (1.0 - beta) * x for beta in timescales]
    features = stack_features(x, momenta, direction, p)
    if extra:
        extra = jnp.stack([jnp.broadcast_to(value, shape) for value in extra], axis=-1)
        features = jnp.concatenate([features, extra], axis=-1)
    update, o = rule_outputs(meta_params, features, direction, max_log_scale, max_additive)
    noise_std = (jnp.zeros_like(update) if max_noise is None
                 else max_noise * jnp.abs(jnp.tanh(o[..., 2])))
    return update, noise_std, direction


def update_grid(
    meta_params: dict,
    gradients: Any = None,
    momenta: Sequence[float] = DRAWN_MOMENTA,
    progresses: Sequence[float] = DRAWN_PROGRESSES,
    **rule_options: Any,
) -> UpdateGrid:
    """The rule on the grid its figure draws (pure JAX): :func:`update_at` at every
    progress x momentum x gradient.

    Args:
        meta_params: the rule's ``{"layers": [...]}``.
        gradients: ``[N]`` normalised gradients (default 121 points over
            ``DRAWN_GRADIENT_RANGE``).
        momenta: ``[M]`` previous momenta, one line each.
        progresses: ``[P]`` training progress values, one panel each.
        **rule_options: :func:`update_at`'s keyword arguments (the objective's options).
    """
    if gradients is None:
        gradients = jnp.linspace(*DRAWN_GRADIENT_RANGE, 121)
    x = jnp.asarray(gradients, jnp.float32)
    m = jnp.asarray(momenta, jnp.float32)
    p = jnp.asarray(progresses, jnp.float32)
    update, noise_std, adam = update_at(meta_params, x[None, None, :], m[None, :, None],
                                        p[:, None, None], **rule_options)
    return UpdateGrid(x, m, p, update, noise_std, adam[0])


def rule_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`update_at`'s keyword arguments from an experiment's objective options (the
    defaults where an option is not given)."""
    return {"timescales": tuple(float(t) for t in options.get("timescales",
                                                                DEFAULT_TIMESCALES)),
            "max_log_scale": float(options.get("max_log_scale", DEFAULT_MAX_LOG_SCALE)),
            "max_additive": float(options.get("max_additive", DEFAULT_MAX_ADDITIVE))}


def update_figures(request: RunFigureRequest, grid_of: Callable[[dict], UpdateGrid],
                   inputs_note: str = "") -> dict[str, Any]:
    """The ``plot`` hook of a learned optimiser: every candidate's update against the
    normalised gradient next to Adam's, in one figure (``learned_update``).

    Args:
        request: the run (see :class:`~metarl.objectives.registry.RunFigureRequest`).
        grid_of: ``optimizer meta-parameters -> UpdateGrid`` with the run's options.
        inputs_note: what the title says of inputs held fixed (``open_optimizer``'s).
    """
    if not request.candidates:
        return {}
    from metarl.figures.learned_optimizer import plot_run_updates  # matplotlib on demand

    grids = {request.label(which): grid_of(params["optimizer"])
             for which, params in request.candidates.items()}
    fig = plot_run_updates(
        grids, base_label="Adam",
        title=f"{request.run_name}: learned update vs Adam after {request.generation} "
              f"generations (lines: previous momentum m{inputs_note})")
    return {"learned_update": fig}


def _figures(request: RunFigureRequest) -> dict[str, Any]:
    """The learned update of every candidate against Adam's."""
    options = rule_options(request.options)
    return update_figures(request, lambda params: update_grid(params, **options))


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


def _portable(meta_params: dict, options: Mapping[str, Any]) -> dict:
    """The learned rule as the ``optax.GradientTransformationExtraArgs`` PPO uses (its
    ``update(grads, state, params, *, progress, key)``)."""
    term = learned_optimizer_term(**options)
    return {"optimizer": term.transformation(meta_params["optimizer"])}


@register_objective("learned_optimizer", slots=("optimizer",), baselines=("ppo",),
                    plot=_figures, portable=_portable)
def make_learned_optimizer(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    timescales: Sequence[float] = DEFAULT_TIMESCALES,
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
) -> Objective:
    """A learned per-parameter update rule starting at Adam (see the module docstring)."""
    return Objective(optimizer=learned_optimizer_term(hidden_sizes, timescales,
                                                      max_log_scale, max_additive))
