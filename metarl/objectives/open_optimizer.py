"""An OPEN-style learned optimiser: :mod:`.learned_optimizer` plus dormancy, layer position
and learned stochasticity.

After Goldie et al., "Can Learned Optimization Make Reinforcement Learning Less
Difficult?" (NeurIPS 2024, OPEN), whose update rule targets RL's non-stationarity
(training progress), loss of plasticity (dormant neurons) and exploration (a learned,
stochastic part of the update). This module is written for metarl's optimiser slot; it is
not OPEN's code.

**Update.** With ``d`` Adam's direction (``scale_by_adam(eps=1e-5)``) and ``o`` the MLP's
three outputs (output layer zero at initialisation):

    u = d * exp(a * tanh(o_1)) + b * tanh(o_2) + c * tanh(o_3) * eps,   eps ~ N(0, 1)

with ``a = max_log_scale`` (3), ``b = max_additive`` (1) and ``c = max_noise`` (1), so
``|u - noise| <= e^a |d| + b`` and the noise's standard deviation is at most ``c``
learning-rate units. At initialisation ``o = 0``: ``tanh(0) = 0`` multiplies the noise, so
the update equals Adam's bit for bit (up to the sign of a zero). ``eps`` is drawn from the
``key`` the algorithm passes to every ``update`` (PPO derives it from the agent's own key,
which its state carries, so a resumed run draws the same noise).

**Inputs.** Per parameter, those of :mod:`.learned_optimizer` (normalised gradient,
momenta at each timescale, Adam's direction, progress), and two more:

* *dormancy* (per unit, shared by the parameters that feed it): OPEN measures a neuron's
  dormancy as the ratio of its mean absolute activation to its layer's mean. An optax
  update sees no activations, so this module uses a **gradient-based proxy**: for a leaf of
  shape ``[..., units]`` (a kernel ``[in, out]`` or a bias ``[out]``), unit ``j``'s
  activity is the mean of ``|mu|`` (Adam's first moment, the smoothed gradient) over the
  parameters feeding it, ``a_j = mean_i |mu_ij|``, and its input is ``a_j / mean_j a_j``
  (1 for an average unit, near 0 for a unit whose gradients vanished: a dead ReLU or a
  saturated tanh, since ``dL/dW_ij = x_i delta_j``), clipped to ``[0, 10]``. A 0-d leaf
  has dormancy 1. Kernel and bias of one layer are measured separately.
* *layer position* (per layer, i.e. per leaf): the relative depth in ``[0, 1]`` of the
  module a leaf belongs to among its siblings. A leaf's module is its parent in the
  parameter pytree (``actor/Dense_1`` for ``actor/Dense_1/kernel``); modules sharing a
  parent (a tower, ``actor``) are ordered by name, numbers compared as numbers
  (``Dense_2 < Dense_10``), and the ``i``-th of ``n`` gets ``i / (n - 1)`` (0 when
  ``n = 1``). So in PPO's actor-critic each tower's input layer has 0 and its output
  layer 1.

**State**: that of :mod:`.learned_optimizer` (Adam's state and the momenta); the noise
needs no state of its own, since its key comes with each update.

**Figure** (``metarl plot RUN``, :func:`update_grid`): as :mod:`.learned_optimizer`'s (the
update against the normalised gradient, a line per previous momentum, a panel per
progress), with the two further inputs held at an average unit of a middle layer:
dormancy 1 and layer position 0.5 (``DRAWN_DORMANCY``, ``DRAWN_LAYER_POSITION``; the hidden
layer of a two-hidden-layer tower). A band of ± one standard deviation of the learned noise
surrounds each line where the noise is not zero.

Meta-parameters: ``{"policy": {}, "value": {}, "optimizer": {"layers": [{"w": [F, h1],
"b": [h1]}, ..., {"w": [hL, 3], "b": [3]}]}}`` with ``F = k + 5`` for ``k`` timescales.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from inner_loops.objective import Objective, OptimizerTerm
from metarl.objectives import learned_optimizer
from metarl.objectives.learned_optimizer import (
    DEFAULT_HIDDEN_SIZES,
    DEFAULT_MAX_ADDITIVE,
    DEFAULT_MAX_LOG_SCALE,
    DEFAULT_TIMESCALES,
    DRAWN_MOMENTA,
    DRAWN_PROGRESSES,
    UpdateGrid,
    check_bound,
    rule_options,
    rule_term,
    update_figures,
)
from metarl.objectives.registry import RunFigureRequest, register_objective

DEFAULT_MAX_NOISE = 1.0
DORMANCY_CLIP = 10.0
NUM_EXTRA_INPUTS = 2  # dormancy, layer position
# The further inputs in the figure of the rule: an average unit of a middle layer.
DRAWN_DORMANCY = 1.0
DRAWN_LAYER_POSITION = 0.5


def _natural_key(name: str) -> tuple:
    """Sort key comparing digit runs as numbers: ``Dense_2`` before ``Dense_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _entry_name(entry: Any) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def layer_positions(tree: Any) -> list[float]:
    """Relative depth in ``[0, 1]`` of every leaf of ``tree`` (in flattening order): the
    position of its module (its parent) among the modules sharing the module's parent."""
    paths = [tuple(_entry_name(e) for e in path)
             for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    siblings: dict[tuple, set[str]] = {}
    for path in paths:
        module = path[:-1]
        if module:
            siblings.setdefault(module[:-1], set()).add(module[-1])
    positions = []
    for path in paths:
        module = path[:-1]
        if not module:
            positions.append(0.0)
            continue
        names = sorted(siblings[module[:-1]], key=_natural_key)
        count = len(names)
        positions.append(names.index(module[-1]) / (count - 1) if count > 1 else 0.0)
    return positions


def dormancy(mu: jax.Array) -> jax.Array:
    """The gradient-based dormancy proxy of each unit (last axis), broadcast back to
    ``mu``'s shape ``[..., units]``: ``mean_i |mu_ij| / mean_j mean_i |mu_ij|``, clipped
    to ``[0, DORMANCY_CLIP]``; ones for a 0-d leaf."""
    if mu.ndim == 0:
        return jnp.ones_like(mu)
    activity = jnp.mean(jnp.abs(mu), axis=tuple(range(mu.ndim - 1)))
    ratio = activity / (jnp.mean(activity) + 1e-12)
    return jnp.broadcast_to(jnp.clip(ratio, 0.0, DORMANCY_CLIP), mu.shape)


def open_features(grads: Any, adam_state: optax.ScaleByAdamState, params: Any) -> Any:
    """Per leaf ``[*shape, 2]``: dormancy proxy and layer position of each parameter."""
    del params
    leaves, treedef = jax.tree.flatten(grads)
    mus = treedef.flatten_up_to(adam_state.mu)
    positions = layer_positions(grads)
    out = [jnp.stack([dormancy(mu), jnp.full(g.shape, position, g.dtype)], axis=-1)
           for g, mu, position in zip(leaves, mus, positions, strict=True)]
    return treedef.unflatten(out)


def open_optimizer_term(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    timescales: Sequence[float] = DEFAULT_TIMESCALES,
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
    max_noise: float = DEFAULT_MAX_NOISE,
) -> OptimizerTerm:
    """The optimiser term of :func:`make_open_optimizer` (options checked)."""
    return rule_term("open_optimizer", hidden_sizes, timescales, max_log_scale, max_additive,
                     extra_features=open_features, num_extra=NUM_EXTRA_INPUTS,
                     max_noise=check_bound("max_noise", max_noise))


def update_grid(
    meta_params: dict,
    gradients: Any = None,
    momenta: Sequence[float] = DRAWN_MOMENTA,
    progresses: Sequence[float] = DRAWN_PROGRESSES,
    *,
    dormancy: float = DRAWN_DORMANCY,
    layer_position: float = DRAWN_LAYER_POSITION,
    max_noise: float = DEFAULT_MAX_NOISE,
    **rule_options: Any,
) -> UpdateGrid:
    """The rule on the grid its figure draws (pure JAX), with dormancy and layer position
    held at ``dormancy`` and ``layer_position``: :func:`.learned_optimizer.update_grid`
    with these as its extra inputs and the noise bound ``max_noise``; ``rule_options`` are
    :func:`.learned_optimizer.update_at`'s (timescales and bounds)."""
    return learned_optimizer.update_grid(
        meta_params, gradients, momenta, progresses,
        extra_inputs=(dormancy, layer_position), max_noise=max_noise, **rule_options)


def _figures(request: RunFigureRequest) -> dict[str, Any]:
    """The learned update of every candidate against Adam's, with its noise band."""
    options = rule_options(request.options)
    max_noise = float(request.options.get("max_noise", DEFAULT_MAX_NOISE))
    return update_figures(
        request, lambda params: update_grid(params, max_noise=max_noise, **options),
        inputs_note=f"; dormancy {DRAWN_DORMANCY:g}, layer position {DRAWN_LAYER_POSITION:g}")


def _portable(meta_params: dict, options: Mapping[str, Any]) -> dict:
    """The learned rule as the ``optax.GradientTransformationExtraArgs`` PPO uses (its
    ``update(grads, state, params, *, progress, key)``; ``key`` draws the learned noise)."""
    term = open_optimizer_term(**options)
    return {"optimizer": term.transformation(meta_params["optimizer"])}


@register_objective("open_optimizer", slots=("optimizer",), baselines=("ppo",),
                    plot=_figures, portable=_portable)
def make_open_optimizer(
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN_SIZES,
    timescales: Sequence[float] = DEFAULT_TIMESCALES,
    max_log_scale: float = DEFAULT_MAX_LOG_SCALE,
    max_additive: float = DEFAULT_MAX_ADDITIVE,
    max_noise: float = DEFAULT_MAX_NOISE,
) -> Objective:
    """An OPEN-style learned update rule (dormancy, depth, learned noise) starting at Adam."""
    return Objective(optimizer=open_optimizer_term(hidden_sizes, timescales, max_log_scale,
                                                   max_additive, max_noise))
