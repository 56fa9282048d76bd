"""Learned value distance: the critic regresses its targets under an evolved distance.

The value loss replaces PPO's squared error by a learned function of the scalar error
``x = value - target``, built from a small network ``g(x) = MLP(x) - MLP(0)`` (scalar to
scalar, default hidden sizes ``(64, 64)``, tanh; ``g(0) = 0`` for every parameter value):

    L_v = mean_i d(v_i - t_i)
    d(x) = 0.5 x^2 exp(g(x))        form="scaled_l2" (the default)
    d(x) = 0.5 x^2 exp(g(|x|))      form="even_scaled_l2"
    d(x) = 0.5 x^2 + g(x)           form="l2_residual"
    d(x) = g(x)                     form="raw"

Why ``scaled_l2`` is the default: a tanh network's output is bounded, so in the additive
forms the learned part cannot change how large errors are weighted — and in PPO with a
global gradient-norm clip the weight of large value errors is exactly what matters.
Scaling L2 by
``exp(g)`` lets evolution reshape small errors *and* rescale large ones, keeps ``d >= 0``
and ``d(0) = 0``, and, with the output layer starting at zero, starts from exactly L2
``0.5 mean((v - t)^2)``. ``l2_residual`` also starts at L2; ``raw`` starts at a random
network. There is no value clipping.

Why ``even_scaled_l2``: at that start (output layer zero, hidden biases zero, tanh odd) the
only first-order directions of ``g`` are the hidden units ``tanh(w x)``, odd functions of
``x``: an evolution strategy's first steps can weight over-estimates up and
under-estimates down (or the reverse) but not reweight large errors of both signs alike,
e.g. towards a bounded gradient as Huber's. That needs a hidden bias and an output weight to
move together, a second-order effect: on a task that rewards it, 6 generations of Open_ES
moved ``scaled_l2`` to asymmetric weights and gained nothing
(``tests/test_known_answers.py``). ``even_scaled_l2`` feeds ``|x|`` to the network, so
every direction is even: ``d(-x) = d(x)`` and ES moves the weight of large errors of either
sign from the first generation; it also starts at exactly L2.

With ``learn_scale=True`` the search also covers the loss's overall scale: a learned scalar
``s`` (starting at 0, so the initial loss is unchanged) multiplies every form,
``L_v = exp(s) mean_i d(v_i - t_i)``. ``g(0) = 0`` pins the weight of small errors to L2's,
so without ``s`` evolution cannot rescale the value loss as a whole, which is what PPO's
``vf_coef`` does for a baseline (and what ``metarl evaluate --tune`` tunes for L2).

The objective fills only the value slot, so it fits every algorithm with a critic: PPO keeps
its clipped surrogate, and off-policy critics regress their TD targets under ``d``.

Meta-parameters: ``{"policy": {}, "value": {"layers": [{"w": [1, h1], "b": [h1]}, ...,
{"w": [hL, 1], "b": [1]}]}}``, float32, and with ``learn_scale`` also ``"log_scale": []``
in ``"value"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.objective import LossInputs, LossTerm, Objective
from metarl.objectives.mlp import apply_mlp, init_mlp
from metarl.objectives.registry import register_objective

DEFAULT_HIDDEN_SIZES = (64, 64)
DEFAULT_FORM = "scaled_l2"
FORMS = (DEFAULT_FORM, "even_scaled_l2", "l2_residual", "raw")
SCALED_FORMS = (DEFAULT_FORM, "even_scaled_l2")  # d(x) = 0.5 x^2 times a learned weight
MAX_LOG_SCALE = 30.0  # exp(g) is capped so a wild candidate gives a huge loss, not inf


def init_value_distance(
    key: jax.Array,
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    form: str = DEFAULT_FORM,
    learn_scale: bool = False,
) -> dict:
    """Meta-parameters of the network ``1 -> hidden_sizes -> 1`` (tanh), and with
    ``learn_scale`` the overall log-scale ``"log_scale"`` (``[]``, zero).

    Except in the ``raw`` form the output layer is zero, so ``d(x) = 0.5 x^2`` initially.
    """
    _check_form(form)
    sizes = (1, *tuple(hidden_sizes), 1)
    params = init_mlp(key, sizes, use_bias=True, zero_last=form != "raw")
    if learn_scale:
        params["log_scale"] = jnp.zeros((), jnp.float32)
    return params


def overall_scale(meta_params: dict) -> jax.Array:
    """``exp(s)`` of the learned log-scale ``s`` (1 when the meta-parameters have none),
    with ``s`` clipped to ``±MAX_LOG_SCALE``."""
    if "log_scale" not in meta_params:
        return jnp.float32(1.0)
    return jnp.exp(jnp.clip(meta_params["log_scale"], -MAX_LOG_SCALE, MAX_LOG_SCALE))


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"form: got {form!r}; allowed: {', '.join(FORMS)}")


def learned_shape(meta_params: dict, x: jax.Array) -> jax.Array:
    """``g(x) = MLP(x) - MLP(0)`` elementwise over ``x [...]``, with ``g(0) = 0`` exactly."""
    x = jnp.asarray(x, jnp.float32)
    net = apply_mlp(meta_params, x[..., None])[..., 0]
    net_at_zero = apply_mlp(meta_params, jnp.zeros((1,), jnp.float32))[0]
    shape = net - net_at_zero
    # Batched matmuls may round MLP(0) differently from a lone MLP(0) (~1e-7); subtract that
    # residue where x == 0 so g(0) is exactly 0, through stop_gradient so g'(x) is unchanged.
    return shape - jax.lax.stop_gradient(jnp.where(x == 0.0, shape, 0.0))


def value_distance(meta_params: dict, x: jax.Array, form: str = DEFAULT_FORM) -> jax.Array:
    """The learned distance ``d`` applied elementwise.

    Args:
        meta_params: the value term's meta-parameters (``{"layers": [...]}``, with
            ``"log_scale"`` when the overall scale is learned).
        x: ``[...]`` errors ``value - target`` of any shape.
        form: ``scaled_l2``, ``even_scaled_l2``, ``l2_residual`` or ``raw`` (must match
            how it was built).

    Returns:
        ``[...]`` distances, same shape as ``x``, with ``d(0) = 0`` exactly.
    """
    _check_form(form)
    x = jnp.asarray(x, jnp.float32)
    return overall_scale(meta_params) * _unscaled_distance(meta_params, x, form)


def _unscaled_distance(meta_params: dict, x: jax.Array, form: str,
                       reduce: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """``d(x)`` of ``form`` without the overall scale ``exp(s)``: elementwise over the errors
    ``x [...]``, or with ``reduce`` (the loss's ``jnp.mean``) reduced term by term. Each form
    is ``0.5 x^2`` with its initial network."""
    reduce = reduce or (lambda values: values)
    shape = learned_shape(meta_params, jnp.abs(x) if form == "even_scaled_l2" else x)
    if form == "raw":
        return reduce(shape)
    if form == "l2_residual":
        return 0.5 * reduce(jnp.square(x)) + reduce(shape)
    return 0.5 * reduce(jnp.square(x) * jnp.exp(jnp.minimum(shape, MAX_LOG_SCALE)))


def value_distance_term(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES, form: str = DEFAULT_FORM,
    learn_scale: bool = False,
) -> LossTerm:
    """The value loss term ``mean(d(values - targets))`` (times ``exp(s)`` with
    ``learn_scale``)."""
    _check_form(form)
    if not isinstance(learn_scale, bool):
        raise ValueError(f"learn_scale: expected true or false, got {learn_scale!r}")
    hidden_sizes = tuple(int(h) for h in hidden_sizes)

    def init(key: jax.Array) -> dict:
        return init_value_distance(key, hidden_sizes, form, learn_scale)

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        errors = inputs.values - inputs.targets
        return overall_scale(meta_params) * _unscaled_distance(meta_params, errors, form,
                                                               jnp.mean)

    name = "value_distance" if form == DEFAULT_FORM else f"value_distance_{form}"
    return LossTerm(name, init, loss)


def distance_curves(meta_params_value_term: Any, x_range: tuple[float, float] = (-5.0, 5.0),
                    num_points: int = 401, form: str | None = None
                    ) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The learned distance and its derivative on a grid of errors, for drawing.

    Args:
        meta_params_value_term: the ``"value"`` meta-parameters (``{"layers": [...]}``),
            whole meta-parameters ``{"policy": ..., "value": ...}``, or ``{label: params}``
            of several candidates (e.g. ``{"mean": ..., "best": ...}``).
        x_range: range of ``value - target``.
        num_points: grid size.
        form: the objective's ``form`` (default :func:`value_distance`'s default).

    Returns:
        ``x [N]`` and ``{label: (d(x) [N], d'(x) [N])}`` (``d'`` from ``jax.grad``).
    """
    form = form or DEFAULT_FORM
    x = jnp.linspace(float(x_range[0]), float(x_range[1]), int(num_points), dtype=jnp.float32)
    curves = {}
    for label, params in _labelled(meta_params_value_term).items():
        def distance(v, params=params):
            return value_distance(params, v, form=form)

        curves[label] = (np.asarray(distance(x), np.float64),
                         np.asarray(jax.vmap(jax.grad(distance))(x), np.float64))
    return np.asarray(x, np.float64), curves


def _labelled(params: Any, default_label: str = "learned d(x)") -> dict[str, Any]:
    """``params`` or ``{label: params}`` (each a value term or whole meta-parameters) ->
    ``{label: value term}``."""
    def value_term(tree):
        if isinstance(tree, Mapping) and set(tree) == {"policy", "value"}:
            return tree["value"]
        return tree

    params = value_term(params)
    if not isinstance(params, Mapping) or "layers" in params:
        return {default_label: params}
    return {str(label): value_term(tree) for label, tree in params.items()}


def plot_learned_distance(meta_params_value_term: Any,
                          x_range: tuple[float, float] = (-5.0, 5.0), *,
                          form: str | None = None, num_points: int = 401,
                          title: str | None = None):
    """Learned value distances against L2 (:func:`metarl.figures.plot_value_distance`):
    ``d(x)``, its derivative and the weight relative to L2 (the deviation from L2 for the
    additive forms). Arguments as in :func:`distance_curves`; returns the figure."""
    from metarl.figures.value_distance import plot_value_distance  # matplotlib on demand

    form = form or DEFAULT_FORM
    x, curves = distance_curves(meta_params_value_term, x_range, num_points, form)
    return plot_value_distance(x, curves, relative=form in SCALED_FORMS, form=form,
                               title=title)


def _figures(request) -> dict:
    """The learned distance of every candidate against L2, in one figure."""
    if not request.candidates:
        return {}
    fig = plot_learned_distance(
        {request.label(which): params["value"] for which, params in request.candidates.items()},
        form=request.options.get("form"),
        title=f"{request.run_name}: learned value distance vs L2 "
              f"(after {request.generation} generations)",
    )
    return {"value_distance": fig}


def _portable(meta_params: dict, options: Mapping[str, Any]) -> dict:
    """The learned distance as a plain function ``d(x)`` of errors ``x = value - target``
    (``[...] -> [...]``, elementwise; the overall scale included with ``learn_scale``)."""
    form = options.get("form", DEFAULT_FORM)
    value_params = meta_params["value"]

    def distance(x: jax.Array) -> jax.Array:
        return value_distance(value_params, x, form)

    return {"value": distance}


@register_objective("value_distance", slots=("value",), baselines=("ppo", "l2", "huber"),
                    plot=_figures, portable=_portable)
def make_value_distance(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES, form: str = DEFAULT_FORM,
    learn_scale: bool = False,
) -> Objective:
    """A learned value distance as the critic's loss (see the module docstring)."""
    return Objective(value=value_distance_term(hidden_sizes, form, learn_scale))
