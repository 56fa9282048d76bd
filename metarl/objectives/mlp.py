"""A tiny pure-JAX multilayer perceptron shared by the learned objectives.

Parameters are a plain pytree ``{"layers": [{"w": [in, out], "b": [out]}, ...]}`` of float32
arrays (``"b"`` is absent when ``use_bias=False``), so that evolution strategies can flatten,
perturb and ``vmap`` over them without knowing anything about the network. The network is

    h_0 = x,   h_{k+1} = act(h_k W_k + b_k)  for hidden layers,   y = h_L W_L + b_L,

applied over the last axis of ``x`` (any leading batch shape). Weights are initialised with a
LeCun-like scaled normal, ``W ~ N(0, scale^2 / fan_in)``, which keeps pre-activations of order
one and gives an evolution strategy's fixed noise scale a sensible meaning in every layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp


def init_mlp(
    key: jax.Array,
    sizes: Sequence[int],
    *,
    use_bias: bool = True,
    zero_last: bool = False,
    scale: float = 1.0,
) -> dict:
    """Initialise an MLP deterministically from ``key``.

    Args:
        key: PRNG key.
        sizes: layer widths including input and output, e.g. ``(1, 64, 64, 1)``.
        use_bias: whether layers have a bias (initialised to zero).
        zero_last: initialise the output layer's weights (and bias) to exactly zero.
        scale: multiplier of the LeCun normal standard deviation ``1 / sqrt(fan_in)``.

    Returns:
        ``{"layers": [{"w": [sizes[k], sizes[k+1]], ("b": [sizes[k+1]])}, ...]}``, float32.
    """
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"an MLP needs at least two positive layer sizes, got {sizes}")
    shapes = list(zip(sizes[:-1], sizes[1:], strict=True))
    # One normal draw for all weights, cut into layers: cheaper to compile than one per layer.
    noise = jax.random.normal(key, (sum(i * o for i, o in shapes),), jnp.float32)
    layers = []
    start = 0
    for index, (fan_in, fan_out) in enumerate(shapes):
        is_last = index == len(shapes) - 1
        if is_last and zero_last:
            w = jnp.zeros((fan_in, fan_out), jnp.float32)
        else:
            std = scale / math.sqrt(fan_in)
            w = std * noise[start : start + fan_in * fan_out].reshape(fan_in, fan_out)
        start += fan_in * fan_out
        layer = {"w": w}
        if use_bias:
            layer["b"] = jnp.zeros((fan_out,), jnp.float32)
        layers.append(layer)
    return {"layers": layers}


def apply_mlp(
    params: dict,
    x: jax.Array,
    activation: Callable[[jax.Array], jax.Array] = jnp.tanh,
) -> jax.Array:
    """Apply the MLP over the last axis.

    Args:
        params: as returned by :func:`init_mlp`.
        x: ``[..., in]`` inputs.
        activation: nonlinearity of the hidden layers (the output layer is linear).

    Returns:
        ``[..., out]`` outputs.
    """
    layers = params["layers"]
    h = x
    for index, layer in enumerate(layers):
        h = h @ layer["w"]
        if "b" in layer:
            h = h + layer["b"]
        if index < len(layers) - 1:
            h = activation(h)
    return h
