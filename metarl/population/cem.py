"""The cross-entropy method of CEM-RL: a diagonal Gaussian over a flat parameter vector.

One generation: :func:`ask` draws ``P`` members in antithetic pairs (``mean ± std * z``),
the caller scores them (CEM-RL first lets half of them take gradient steps, then evaluates
everyone and may hand the changed members back), and :func:`tell` moves the distribution to
the ``E`` best: the mean becomes their weighted mean, with weights ``log((E + 1) / i)`` for
rank ``i = 1..E`` normalised to sum to one, and the variance their weighted squared
deviation from the *old* mean plus an extra noise that keeps the search from collapsing.
The extra noise decays geometrically from ``extra_noise_init`` towards
``extra_noise_end`` (``noise <- decay * noise + (1 - decay) * end``).

evosax's distribution-based strategies cover the ask/tell shape but none combines
mirrored sampling, log-rank elite weights and an additive decaying noise floor in its
covariance update, so this small module does, with everything a pure function of arrays.

Shapes: ``D`` parameters, ``P`` members (even), ``E`` elites.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import struct

from inner_loops.validation import check_finite, check_in_range, check_positive_int


@dataclass(frozen=True)
class CEMConfig:
    """Settings of the cross-entropy method.

    Attributes:
        population_size: members per generation; even (antithetic pairs).
        num_elites: members the distribution moves to, ``1 <= E <= P``.
        init_std: initial standard deviation of every parameter.
        extra_noise_init, extra_noise_end: variance added per parameter at the first
            generation and the value it decays to.
        extra_noise_decay: the decay factor per generation, in ``[0, 1]``.
    """

    population_size: int = 10
    num_elites: int = 5
    init_std: float = 1e-3
    extra_noise_init: float = 1e-3
    extra_noise_end: float = 1e-5
    extra_noise_decay: float = 0.95

    def __post_init__(self):
        check_positive_int("cem.population_size", self.population_size)
        check_positive_int("cem.num_elites", self.num_elites)
        if self.population_size % 2:
            raise ValueError(f"cem.population_size: must be even (antithetic pairs), got "
                             f"{self.population_size}")
        if self.num_elites > self.population_size:
            raise ValueError(f"cem.num_elites: {self.num_elites} elites need at least as many "
                             f"members; population_size is {self.population_size}")
        for name in ("init_std", "extra_noise_init", "extra_noise_end"):
            value = getattr(self, name)
            check_finite(f"cem.{name}", value)
            if value < 0:
                raise ValueError(f"cem.{name}: must be non-negative, got {value}")
        check_in_range("cem.extra_noise_decay", self.extra_noise_decay, 0.0, 1.0)


@struct.dataclass
class CEMState:
    """The search distribution.

    Attributes:
        mean: ``[D]``.
        variance: ``[D]`` per-parameter variance.
        extra_noise: ``[]`` the variance floor added at the next :func:`tell`.
        generation: ``[]`` int32 generations told.
    """

    mean: jax.Array
    variance: jax.Array
    extra_noise: jax.Array
    generation: jax.Array


def elite_weights(num_elites: int) -> jax.Array:
    """``[E]`` weights ``log((E + 1) / i)``, ``i = 1..E``, normalised to sum to one."""
    ranks = jnp.arange(1, num_elites + 1, dtype=jnp.float32)
    weights = jnp.log((num_elites + 1) / ranks)
    return weights / jnp.sum(weights)


def init(mean: jax.Array, config: CEMConfig) -> CEMState:
    """The distribution centred on ``mean [D]`` with ``config.init_std``."""
    mean = jnp.asarray(mean, jnp.float32)
    return CEMState(
        mean=mean,
        variance=jnp.full_like(mean, config.init_std ** 2),
        extra_noise=jnp.float32(config.extra_noise_init),
        generation=jnp.zeros((), jnp.int32),
    )


def ask(key: jax.Array, state: CEMState, config: CEMConfig) -> jax.Array:
    """``[P, D]`` members: rows ``i`` and ``i + P/2`` are ``mean + std z_i`` and
    ``mean - std z_i``."""
    half = config.population_size // 2
    noise = jax.random.normal(key, (half, state.mean.shape[0]))
    noise = jnp.concatenate([noise, -noise])
    return state.mean + jnp.sqrt(state.variance) * noise


def tell(members: jax.Array, fitness: jax.Array, state: CEMState,
         config: CEMConfig) -> CEMState:
    """Move the distribution to the elites of ``members [P, D]`` by ``fitness [P]``
    (higher is better; NaN ranks last)."""
    score = jnp.where(jnp.isnan(fitness), -jnp.inf, fitness)
    elites = members[jnp.argsort(-score, stable=True)[: config.num_elites]]
    weights = elite_weights(config.num_elites)
    mean = weights @ elites
    variance = weights @ jnp.square(elites - state.mean) + state.extra_noise
    decay = config.extra_noise_decay
    extra_noise = decay * state.extra_noise + (1.0 - decay) * config.extra_noise_end
    return CEMState(mean=mean, variance=variance, extra_noise=extra_noise,
                    generation=state.generation + 1)

