"""Search spaces of hyperparameters: priors to sample from and bounds to stay within.

A :class:`Prior` covers one numeric hyperparameter of an algorithm's ``Hyperparams``
(``learning_rate``, ``gamma``, ...): uniform on ``[low, high]``, or log-uniform when ``log``
is set. :func:`sample` draws a whole population's values, :func:`perturb` multiplies values
by factors (which is a step on the log scale), and both keep every value inside its bounds.
Hyperparameters without a prior keep the value they have.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from inner_loops.validation import check_finite


@dataclass(frozen=True)
class Prior:
    """Where one hyperparameter may go.

    Attributes:
        low, high: bounds, ``low < high`` (both ``> 0`` when ``log``).
        log: sample log-uniformly (learning rates), else uniformly (discounts).
    """

    low: float
    high: float
    log: bool = False

    def __post_init__(self):
        check_finite("low", self.low)
        check_finite("high", self.high)
        if not self.low < self.high:
            raise ValueError(f"low: must be below high, got low={self.low} and high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"low: a log-uniform prior needs low > 0, got {self.low}")

    def sample(self, key: jax.Array, shape: Sequence[int]) -> jax.Array:
        """``shape`` float32 draws from the prior."""
        if self.log:
            draws = jax.random.uniform(key, shape, minval=math.log(self.low),
                                       maxval=math.log(self.high))
            return jnp.clip(jnp.exp(draws), self.low, self.high)
        return jax.random.uniform(key, shape, minval=self.low, maxval=self.high)

    def clip(self, values: jax.Array) -> jax.Array:
        return jnp.clip(values, self.low, self.high)


def hyperparameter_fields(inner: Any) -> tuple[str, ...]:
    """The traced hyperparameters of ``inner``'s algorithm (an inner config, e.g.
    :class:`~inner_loops.ppo.PPOConfig`), read off its ``Hyperparams`` class: the fields a
    prior may cover (building them would start JAX)."""
    cls = getattr(type(inner), "hyperparams_class", None)
    if cls is None:
        cls = getattr(sys.modules[type(inner).__module__], "Hyperparams", None)
    return tuple(getattr(cls, "_fields", ()))


def check_priors(priors: Mapping[str, Prior], hypers: Any) -> None:
    """Raise ``ValueError`` naming a prior for a field ``hypers`` (a NamedTuple) lacks."""
    fields = getattr(hypers, "_fields", ())
    unknown = sorted(set(priors) - set(fields))
    if unknown:
        raise ValueError(f"priors: no hyperparameter named {', '.join(unknown)}; "
                         f"allowed: {', '.join(fields)}")


def sample(key: jax.Array, priors: Mapping[str, Prior], hypers: Any) -> Any:
    """``hypers`` (``[P]`` arrays, a NamedTuple) with every field that has a prior drawn
    afresh from it, independently per member."""
    check_priors(priors, hypers)
    keys = dict(zip(sorted(priors), jax.random.split(key, max(len(priors), 1)), strict=False))
    return hypers._replace(**{
        name: prior.sample(keys[name], jnp.shape(getattr(hypers, name))).astype(
            jnp.asarray(getattr(hypers, name)).dtype)
        for name, prior in priors.items()
    })


def perturb(key: jax.Array, priors: Mapping[str, Prior], hypers: Any,
            factors: Sequence[float] = (0.8, 1.2)) -> Any:
    """``hypers`` with every field that has a prior multiplied by one of ``factors``
    (chosen uniformly, independently per member and field) and clipped to its bounds."""
    check_priors(priors, hypers)
    factors = jnp.asarray(factors, jnp.float32)
    keys = dict(zip(sorted(priors), jax.random.split(key, max(len(priors), 1)), strict=False))
    changed = {}
    for name, prior in priors.items():
        values = jnp.asarray(getattr(hypers, name))
        chosen = jax.random.choice(keys[name], factors, values.shape)
        changed[name] = prior.clip(values * chosen).astype(values.dtype)
    return hypers._replace(**changed)
