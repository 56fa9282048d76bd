"""DvD's diversity of a population: the log-determinant of an RBF kernel over the members'
actions on a shared batch of states.

Members whose actions differ span a well-conditioned kernel matrix (log-determinant near
zero, its largest value); members that act alike make it nearly singular (a very negative
log-determinant). Maximising it pushes the members' behaviours apart. A small ``jitter`` on
the diagonal keeps the determinant positive when members coincide, so the value and its
gradient stay finite; for identical members the gradient is exactly zero (the kernel is
flat where distances vanish), so they separate only through their other losses and noise.

Shapes: ``M`` members, ``B`` states, ``A`` action dimensions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def squared_distances(actions: jax.Array) -> jax.Array:
    """``[M, M]`` mean squared difference between the members' actions ``[M, B, A]`` (or
    any ``[M, ...]``): the mean over the batch keeps the scale independent of ``B``."""
    flat = actions.reshape(actions.shape[0], -1)
    difference = flat[:, None, :] - flat[None, :, :]
    return jnp.mean(jnp.square(difference), axis=-1)


def rbf_kernel(actions: jax.Array, length_scale: float | jax.Array = 1.0) -> jax.Array:
    """``[M, M]`` kernel ``exp(-d_ij / (2 length_scale^2))`` of :func:`squared_distances`."""
    return jnp.exp(-squared_distances(actions) / (2.0 * jnp.square(length_scale)))


def log_det_diversity(actions: jax.Array, length_scale: float | jax.Array = 1.0,
                      jitter: float = 1e-4) -> jax.Array:
    """``[]`` log-determinant of ``rbf_kernel(actions) + jitter * I``, through its Cholesky
    factor; at most ``M * log(1 + jitter)`` (members infinitely far apart)."""
    kernel = rbf_kernel(actions, length_scale)
    kernel = kernel + jitter * jnp.eye(kernel.shape[0], dtype=kernel.dtype)
    factor = jnp.linalg.cholesky(kernel)
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(factor)))
