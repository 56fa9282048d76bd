"""The evosax strategies an ``[es]`` table can name, and how each is built.

:data:`STRATEGIES` holds every evosax 0.3 strategy that searches a fixed-size, real-valued
vector (the meta-parameters, flattened) with one search state, under its evosax class name;
:data:`EXCLUDED` names the others and says why each does not fit. Both are plain data, so
a config is checked (:func:`check_es_table`) without importing evosax, whose import runs a
JAX computation; :func:`build_strategy` imports it when a run is built.

What the common ``[es]`` settings mean for a strategy (its :class:`StrategySpec` says which
apply):

- ``sigma`` is ``std_init`` in the strategy's evosax params where they have one; where its
  constructor takes a ``std_schedule``, ``sigma``, ``sigma_decay`` and ``sigma_min`` build
  it (``sigma * sigma_decay**g``, floored at ``sigma_min``). A population strategy's
  first candidates are the objective's initialisation and draws ``sigma``-wide around it.
- ``learning_rate`` and ``learning_rate_decay`` build Adam where the constructor takes an
  ``optimizer``.
- ``fitness_shaping`` applies to the strategies that estimate a gradient from one
  generation's fitness values alone. The others keep evosax's own shaping, because their
  update depends on it. Recombination by rank weights: the CMA-ES and NES families, DES,
  SimpleES. Raw fitness compared across generations: hill climbing, annealing, iAMaLGaM,
  GLD, the GAs, DE, PSO. Features of a meta-learned network: the learned strategies.
- ``antithetic`` applies where the constructor takes ``use_antithetic_sampling``.

``[es] options`` sets the strategy's own settings: the scalar fields of its evosax
``default_params`` (``std_init`` excepted: that is ``sigma``), by field name, e.g.
``options = { c_std = 0.3 }`` for ``CMA_ES``. Constructor arguments other than the ones
above keep evosax's defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inner_loops.validation import check_choice
from metarl.config import ConfigError

DISTRIBUTION = "distribution"
POPULATION = "population"

_CMA = {"std_min": float, "std_max": float, "mu_eff": float, "c_mean": float,
        "c_std": float, "d_std": float, "c_c": float, "c_1": float, "c_mu": float,
        "chi_n": float}
_AMALGAM = {"eta_std": float, "eta_shift": float, "eta_avs_inc": float,
            "eta_avs_dec": float, "nis_max_gens": int, "delta_ams": float,
            "theta_sdr": float, "c_mult_init": float}


@dataclass(frozen=True)
class StrategySpec:
    """One evosax strategy and which ``[es]`` settings reach it.

    Attributes:
        family: ``distribution`` (a search distribution with a mean) or ``population``
            (a population of ``C`` solutions with their last fitness).
        summary: what it is, in a few words.
        options: the names of ``[es] options`` it reads -> their type (``float``, ``int``
            or ``bool``): the scalar fields of its ``default_params`` but ``std_init``.
        std_init: ``sigma`` sets ``std_init`` in its params.
        std_schedule: ``sigma``, ``sigma_decay``, ``sigma_min`` build its ``std_schedule``.
        optimizer: ``learning_rate`` and ``learning_rate_decay`` build its optimizer.
        shaping: ``fitness_shaping`` replaces evosax's shaping function.
        antithetic: ``antithetic`` switches its mirrored sampling.
        mirrors: it always samples mirrored pairs, so the population must be even.
        min_population: the smallest population it runs with.
        truncated: it estimates from truncated unrolls (:mod:`metarl.evolve.truncation`):
            the only strategies ``es.truncations > 1`` takes, their evosax ``T`` and ``K``
            set from it.
    """

    family: str
    summary: str
    options: dict[str, type] = field(default_factory=dict)
    std_init: bool = False
    std_schedule: bool = False
    optimizer: bool = False
    shaping: bool = False
    antithetic: bool = False
    mirrors: bool = False
    min_population: int = 2
    truncated: bool = False


def _gradient(summary: str, **more) -> StrategySpec:
    """A distribution strategy that steps its mean with an optimizer along a gradient
    estimated from mirrored pairs."""
    return StrategySpec(DISTRIBUTION, summary, std_schedule=True, optimizer=True,
                        shaping=True, mirrors=True, **more)


def _ranked(summary: str, options: dict[str, type], **more) -> StrategySpec:
    """A distribution strategy that recombines by rank weights and adapts its own step."""
    return StrategySpec(DISTRIBUTION, summary, options, std_init=True, **more)


STRATEGIES: dict[str, StrategySpec] = {
    # the five metarl has always offered, first: an unknown name lists them first
    "Open_ES": StrategySpec(DISTRIBUTION, "OpenAI-ES: gradient from Gaussian samples",
                            std_schedule=True, optimizer=True, shaping=True,
                            antithetic=True, mirrors=True),
    "SNES": _ranked("separable natural ES", {"lr_std_init": float}, optimizer=True),
    "CMA_ES": _ranked("covariance matrix adaptation", _CMA),
    "Sep_CMA_ES": _ranked("CMA-ES with a diagonal covariance", _CMA),
    "PGPE": StrategySpec(DISTRIBUTION, "parameter-exploring policy gradients",
                         {"std_lr": float, "std_max_change": float}, std_init=True,
                         optimizer=True, shaping=True, mirrors=True),
    "ARS": _gradient("augmented random search: the best pairs only", std_init=True),
    "ASEBO": _gradient("ES in an adaptive subspace of past gradients (d x d matrices)",
                       options={"grad_decay": float}),
    "CMAAnchoredLES": StrategySpec(DISTRIBUTION, "separable CMA-ES with meta-learned "
                                   "gates (weights bundled with evosax)", std_init=True),
    "CR_FM_NES": _ranked("cost-reduced fast-moving natural ES", {
        "mu_eff": float, "c_std": float, "c_c": float, "c1": float, "chi_n": float,
        "h_inv": float, "alpha_dist": float, "lr_mean": float, "lr_move_std": float,
        "lr_stag_std": float, "lr_conv_std": float, "lr_B": float}, mirrors=True),
    "DiscoveredES": _ranked("discovered ES (meta-learned recombination weights)",
                            {"lr_std": float}, optimizer=True),
    "PersistentES": _gradient("persistent ES: truncated unrolls, perturbations "
                              "accumulated over the unroll (es.truncations)", truncated=True),
    "NoiseReuseES": _gradient("noise-reuse ES: truncated unrolls, one perturbation per "
                              "unroll (es.truncations)", truncated=True),
    "ESMC": _gradient("ES with meta-loss clipping against the mean's own fitness",
                      min_population=4),
    "EvoTF_ES": StrategySpec(DISTRIBUTION, "evolution transformer (weights bundled with "
                             "evosax; a context of 100 generations x C x d features)",
                             {"lr_mean": float, "lr_std": float}, std_init=True,
                             antithetic=True),
    "GradientlessDescent": StrategySpec(
        DISTRIBUTION, "best of samples on decaying radii (no sigma: set the radii)",
        {"radius_min": float, "radius_max": float, "radius_decay": float}),
    "HillClimbing": StrategySpec(DISTRIBUTION, "Gaussian hill climbing: keeps the best",
                                 std_schedule=True),
    "iAMaLGaM_Full": StrategySpec(DISTRIBUTION, "incremental AMaLGaM, full covariance",
                                  _AMALGAM, std_schedule=True),
    "iAMaLGaM_Univariate": StrategySpec(DISTRIBUTION, "incremental AMaLGaM, diagonal "
                                        "covariance", _AMALGAM, std_schedule=True),
    "LearnedES": StrategySpec(DISTRIBUTION, "learned ES (weights bundled with evosax)",
                              std_init=True),
    "LM_MA_ES": _ranked("limited-memory matrix adaptation ES (C <= 2 d)", {
        name: kind for name, kind in _CMA.items() if name != "c_c"}),
    "MA_ES": _ranked("matrix adaptation ES", _CMA),
    "Rm_ES": _ranked("rank-m ES", {**_CMA, "T": int, "q_star": float}),
    "SimpleES": _ranked("Gaussian ES: elite mean and spread", {"c_std": float},
                        optimizer=True),
    "SimulatedAnnealing": StrategySpec(
        DISTRIBUTION, "annealing on the generation's best (temperature in raw fitness "
        "units)", {"temperature_init": float, "temperature_limit": float,
                   "temperature_decay": float, "boltzmann_constant": float},
        std_schedule=True),
    "xNES": _ranked("exponential natural ES (d x d matrices)",
                    {"lr_std_init": float, "lr_B": float}, optimizer=True),
    "DifferentialEvolution": StrategySpec(
        POPULATION, "differential evolution", {
            "elitism": bool, "crossover_rate": float, "differential_weight": float,
            "differential_weight_min": float, "differential_weight_max": float},
        min_population=4),
    "GESMR_GA": StrategySpec(POPULATION, "GA with group elite selection of mutation rates",
                             {"std_min": float, "std_max": float, "std_meta": float},
                             std_init=True),
    "LearnedGA": StrategySpec(POPULATION, "learned GA (weights bundled with evosax)",
                              {"crossover_rate": float}, std_init=True),
    "MR15_GA": StrategySpec(POPULATION, "GA with the 1/5 success rule",
                            {"std_min": float, "std_max": float, "std_ratio": float},
                            std_init=True),
    "PSO": StrategySpec(POPULATION, "particle swarm", {
        "inertia_coeff": float, "cognitive_coeff": float, "social_coeff": float}),
    "SAMR_GA": StrategySpec(POPULATION, "GA with self-adapted mutation rates", {
        "std_min": float, "std_max": float, "std_meta": float, "std_best_limit": float},
        std_init=True),
    "SimpleGA": StrategySpec(POPULATION, "truncation selection, crossover, mutation",
                             {"crossover_rate": float}, std_schedule=True),
}
"""Every strategy ``[es] strategy`` accepts, by evosax class name."""

EXCLUDED: dict[str, str] = {
    "GuidedES": "samples along surrogate gradients written into its state before each "
                "ask; a training run gives none",
    "RandomSearch": "samples from a user function over a bounded domain; meta-parameters "
                    "have no bounds, and HillClimbing searches around a point",
    "SV_CMA_ES": "Stein variational: K search distributions with K means at once, where a "
                 "run keeps one mean (checkpoints, mean_meta_params)",
    "SV_Open_ES": "as SV_CMA_ES",
    "DiffusionEvolution": "denoises its first population as pure noise on a schedule fixed "
                          "in advance to a number of generations, rather than searching "
                          "around the objective's initialisation; more generations on "
                          "resume would leave the schedule",
}
"""Every other evosax 0.3 strategy -> why it is not offered."""


def available_strategies() -> tuple[str, ...]:
    """The names ``[es] strategy`` accepts (evosax class names), the long-standing five
    first."""
    return tuple(STRATEGIES)


def check_strategy(strategy: Any) -> str:
    """``strategy`` if it is offered; else a :class:`~metarl.config.ConfigError` naming
    ``es.strategy`` that lists every name (and, for an excluded one, says why)."""
    if isinstance(strategy, str) and strategy in EXCLUDED:
        raise ConfigError(f"es.strategy: {strategy} is not offered: {EXCLUDED[strategy]}; "
                          f"allowed: {', '.join(STRATEGIES)}")
    return check_choice("es.strategy", strategy, STRATEGIES, ConfigError)


def check_es_table(strategy: str, population_size: int, antithetic: bool,
                   options: Any) -> dict[str, Any]:
    """Check what the ``[es]`` table asks of the offered ``strategy``; return ``options``
    with each value as its field's type (ints of float fields become floats).

    Raises :class:`~metarl.config.ConfigError` naming the field: a population that the
    strategy cannot sample (odd where it mirrors, too small), an unknown option key (the
    error lists the strategy's keys), an option value of the wrong type or not finite.
    """
    spec = STRATEGIES[strategy]
    if (spec.mirrors or (spec.antithetic and antithetic)) and population_size % 2:
        raise ConfigError(
            f"es.population_size: {strategy} samples antithetic pairs, so the "
            f"population must be even; got {population_size}")
    if population_size < spec.min_population:
        raise ConfigError(f"es.population_size: {strategy} needs at least "
                          f"{spec.min_population} candidates; got {population_size}")
    if not isinstance(options, dict):
        raise ConfigError(f"es.options: expected a table, got {options!r}")
    checked = {}
    for key, value in options.items():
        path = f"es.options.{key}"
        if key not in spec.options:
            allowed = ", ".join(spec.options) or "none"
            hint = " (that is es.sigma)" if key == "std_init" else ""
            raise ConfigError(f"{path}: not a setting of {strategy}{hint}; allowed: "
                              f"{allowed}")
        checked[key] = _check_value(path, value, spec.options[key])
    return checked


def _check_value(path: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number, got {value!r}")
    return float(value)


def _fitness_shaping_fn(name: str):
    from evosax.core import fitness_shaping

    return {
        "centered_rank": fitness_shaping.centered_rank_fitness_shaping_fn,
        "standardize": fitness_shaping.standardize_fitness_shaping_fn,
        "raw": fitness_shaping.identity_fitness_shaping_fn,
    }[name]


def build_strategy(config: Any, template: Any) -> tuple[Any, Any]:
    """The evosax strategy ``config.strategy`` (an :class:`~metarl.evolve.config.ESConfig`)
    for meta-parameters shaped like ``template``, and its params.

    Returns ``(strategy, params)``: the common settings reach the strategy as its
    :class:`StrategySpec` says (module docstring), and ``config.options`` replace fields of
    its ``default_params``, each as the type of the value it replaces.
    """
    # imported here: importing evosax runs a JAX computation, which would fix the CPU
    # device count before metarl could choose it
    import jax.numpy as jnp
    import optax
    from evosax import algorithms

    spec = STRATEGIES.get(config.strategy)
    if spec is None:  # ESConfig validates the name; this guards programmatic misuse
        raise ConfigError(f"es.strategy: unknown strategy {config.strategy!r}")
    kwargs: dict[str, Any] = {}
    if spec.optimizer:
        kwargs["optimizer"] = optax.adam(optax.exponential_decay(
            config.learning_rate, transition_steps=1, decay_rate=config.learning_rate_decay))
    if spec.std_schedule:
        # optax reads end_value as a ceiling when decay_rate >= 1: no decay, no floor
        # (and a strong float32: a weak-typed one would recompile the generation)
        kwargs["std_schedule"] = (_constant(config.sigma)
                                  if config.sigma_decay == 1.0 else optax.exponential_decay(
            config.sigma, transition_steps=1, decay_rate=config.sigma_decay,
            end_value=config.sigma_min))
    if spec.shaping:
        kwargs["fitness_shaping_fn"] = _fitness_shaping_fn(config.fitness_shaping)
    if spec.antithetic:
        kwargs["use_antithetic_sampling"] = config.antithetic
    strategy = getattr(algorithms, config.strategy)(config.population_size, template,
                                                    **kwargs)
    if config.strategy == "LM_MA_ES" and config.population_size > 2 * strategy.num_dims:
        # its first path's rate C / d must stay <= 2, else sqrt(c (2 - c)) is NaN
        raise ConfigError(f"es.population_size: LM_MA_ES takes at most twice as many "
                          f"candidates as meta-parameters ({strategy.num_dims}); got "
                          f"{config.population_size}")
    params = strategy.default_params
    if spec.truncated:  # evosax counts K per tell up to T: here one truncation per tell
        params = params.replace(T=config.truncations, K=1)
    if spec.std_init:
        params = params.replace(std_init=jnp.float32(config.sigma))
    if config.options:
        params = params.replace(**{key: _like(getattr(params, key), value)
                                   for key, value in config.options.items()})
    return strategy, params


def _constant(value: float):
    """A schedule that is ``value`` at every step, as a float32 array."""
    import jax.numpy as jnp

    return lambda count: jnp.full((), value, jnp.float32)


def _like(default: Any, value: Any) -> Any:
    """``value`` as the type of the params field it replaces: an array of its dtype, or
    the Python scalar type."""
    import jax.numpy as jnp

    if hasattr(default, "dtype"):
        return jnp.asarray(value, dtype=default.dtype)
    return type(default)(value)


def init_search(config: Any, strategy: Any, params: Any, key: Any, mean: Any) -> Any:
    """The strategy's first state around the meta-parameters ``mean`` (a pytree).

    A distribution strategy starts its mean there. A population strategy is held
    ``C`` first candidates: ``mean`` itself and ``C - 1`` draws of
    ``mean + sigma * N(0, I)``, with fitness ``+inf`` until the first generation has
    evaluated them (:func:`ask_search`, :func:`tell_search`)."""
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    if STRATEGIES[config.strategy].family == DISTRIBUTION:
        return strategy.init(key, mean, params)
    noise_key, init_key = jax.random.split(key)
    flat, unravel = ravel_pytree(mean)
    size = config.population_size
    noise = jax.random.normal(noise_key, (size, flat.size), flat.dtype).at[0].set(0.0)
    population = jax.vmap(unravel)(flat + config.sigma * noise)
    fitness = jnp.full((size,), jnp.inf, jnp.float32)
    return strategy.init(init_key, population, fitness, params)


def ask_search(config: Any, strategy: Any, params: Any, key: Any, es_state: Any,
               generation: Any) -> tuple[Any, Any]:
    """``(population, es_state)``: the strategy's ``C`` candidates (leading axis ``[C]``)
    and its state after the ask. At ``generation`` 0 a population strategy's candidates
    are the first ones :func:`init_search` drew: evosax starts such a strategy from an
    evaluated population. Traceable."""
    if STRATEGIES[config.strategy].family == DISTRIBUTION:
        return strategy.ask(key, es_state, params)
    import jax

    return jax.lax.cond(generation == 0,
                        lambda: (strategy.get_population(es_state), es_state),
                        lambda: _same_types(strategy.ask(key, es_state, params),
                                            (strategy.get_population(es_state), es_state)))


def tell_search(config: Any, strategy: Any, params: Any, key: Any, population: Any,
                fitness: Any, es_state: Any, generation: Any) -> Any:
    """The strategy's state after it is told ``fitness [C]`` (evosax's sign: lower is
    better) of ``population``. At ``generation`` 0 a population strategy starts afresh
    from these evaluated candidates (evosax's ``init``). Traceable."""
    if STRATEGIES[config.strategy].family == DISTRIBUTION:
        return strategy.tell(key, population, fitness, es_state, params)[0]
    import jax

    return jax.lax.cond(
        generation == 0,
        lambda: _same_types(strategy.init(key, population, fitness, params), es_state),
        lambda: _same_types(strategy.tell(key, population, fitness, es_state, params)[0],
                            es_state))


def _same_types(tree: Any, like: Any) -> Any:
    """``tree`` with every leaf of its counterpart's dtype in ``like`` (and no weak
    types), so that both branches of a ``cond`` and every generation's state agree."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda x, y: jnp.asarray(x, dtype=jnp.asarray(y).dtype), tree, like)


def search_centre(config: Any, strategy: Any, es_state: Any) -> Any:
    """The meta-parameters at the centre of the search: a distribution strategy's mean,
    or a population strategy's best solution by the fitness it keeps."""
    if STRATEGIES[config.strategy].family == DISTRIBUTION:
        return strategy.get_mean(es_state)
    return strategy.get_best_solution(es_state)
