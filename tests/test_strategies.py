"""Every evosax strategy metarl offers runs inside the jitted generation; names and
``[es] options`` are checked like every other field, and the table agrees with evosax.

The generation trains no agent: the stand-in trainer of ``test_evolution`` scores a
candidate by its first meta-parameter (objective ``test_scalar``, 2 meta-parameters).
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from test_evolution import UPDATES, _score_is_first_meta_param, stand_in_learner

from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.generation import Evolution
from metarl.evolve.strategies import (
    EXCLUDED,
    POPULATION,
    STRATEGIES,
    available_strategies,
    build_strategy,
)

# XLA's cheapest code generation: a generation program per strategy compiles here, and
# what is checked is what each computes, not how fast it runs (about 3x less compile time)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                "xla_cpu_use_fusion_emitters": False}
# LM_MA_ES takes at most 2 d candidates, and test_scalar has d = 2
POPULATION_SIZE = {"LM_MA_ES": 4}


def _config(strategy="Open_ES", population=8, **es):
    return config_from_dict({
        "objective": {"name": "test_scalar"},
        "inner": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8,
                  "total_timesteps": 16 * UPDATES},
        "es": {"strategy": strategy, "population_size": population, "sigma": 0.3,
               "learning_rate": 0.1, "generations": 2, **es},
        "fitness": {"seeds_per_candidate": 1},
    })


def _evolution(strategy, population=8, **es):
    evolution = Evolution(_config(strategy, population, **es))
    evolution.learners = [stand_in_learner(evolution.learners[0], _score_is_first_meta_param)]
    evolution.step = jax.jit(evolution.generation, compiler_options=FAST_COMPILE)
    return evolution


def _flat(tree) -> np.ndarray:
    return np.asarray(ravel_pytree(tree)[0])


def _rows(population) -> np.ndarray:
    """``[C, d]``: each candidate of ``population`` (leading axis ``[C]``) flattened."""
    return np.asarray(jax.vmap(lambda member: ravel_pytree(member)[0])(population))


@pytest.mark.parametrize("strategy", available_strategies())
def test_every_strategy_runs_generations_in_one_compiled_program(strategy):
    evolution = _evolution(strategy, POPULATION_SIZE.get(strategy, 8))
    state = evolution.init(jax.random.PRNGKey(0))
    start = _flat(evolution.mean_meta_params(state))
    np.testing.assert_array_equal(start, _flat(state.best_meta_params))  # the objective's init
    population_based = STRATEGIES[strategy].family == POPULATION
    if population_based:  # the first candidates: the start and sigma-wide draws around it
        first = _rows(evolution.strategy.get_population(state.es_state))
        np.testing.assert_array_equal(first[0], start)
        assert np.all(np.std(first, axis=0) > 0.05)
    structure = jax.tree.structure(state)
    avals = jax.tree.leaves(jax.tree.map(jax.typeof, state))
    for generation in (1, 2):
        state, metrics = evolution.step(state)
        assert np.all(np.isfinite(metrics["fitness"]))
        centre = _flat(evolution.mean_meta_params(state))
        assert np.all(np.isfinite(centre))
        if population_based and generation == 1:  # restarted from the evaluated candidates
            np.testing.assert_array_equal(centre, _flat(state.best_meta_params))
        assert jax.tree.structure(state) == structure
        assert jax.tree.leaves(jax.tree.map(jax.typeof, state)) == avals
        assert int(state.generation) == generation
    assert evolution.step._cache_size() == 1


def test_an_unknown_strategy_lists_every_name_and_an_excluded_one_says_why():
    with pytest.raises(ConfigError, match=r"es\.strategy: got 'Nope_ES'; allowed: Open_ES, "
                                          r"SNES, .*DifferentialEvolution.*SimpleGA"):
        _config("Nope_ES")
    with pytest.raises(ConfigError, match=r"es\.strategy: GuidedES is not offered: .*"
                                          r"surrogate gradients.*; allowed: Open_ES"):
        _config("GuidedES")


@pytest.mark.parametrize(("strategy", "options", "message"), [
    ("CMA_ES", {"c_sigma": 0.3},
     r"es\.options\.c_sigma: not a setting of CMA_ES; allowed: std_min, std_max, .*c_std"),
    ("Open_ES", {"lr": 0.1}, r"es\.options\.lr: not a setting of Open_ES; allowed: none"),
    ("PGPE", {"std_init": 0.1}, r"es\.options\.std_init: .*\(that is es\.sigma\)"),
    ("CMA_ES", {"c_std": "big"}, r"es\.options\.c_std: expected a number, got 'big'"),
    ("CMA_ES", {"c_std": float("nan")}, r"es\.options\.c_std: must be a finite number"),
    ("iAMaLGaM_Full", {"nis_max_gens": 2.5}, r"es\.options\.nis_max_gens: expected an integer"),
    ("DifferentialEvolution", {"elitism": 1}, r"es\.options\.elitism: expected true or false"),
])
def test_options_are_checked_by_name_and_type(strategy, options, message):
    with pytest.raises(ConfigError, match=message):
        _config(strategy, options=options)


def test_populations_a_strategy_cannot_sample_are_refused():
    with pytest.raises(ConfigError, match=r"es\.population_size: ARS samples antithetic pairs"):
        _config("ARS", population=7)
    with pytest.raises(ConfigError, match=r"es\.population_size: EvoTF_ES samples antithetic"):
        _config("EvoTF_ES", population=7)
    _config("EvoTF_ES", population=7, antithetic=False)
    with pytest.raises(ConfigError, match=r"es\.population_size: ESMC needs at least 4"):
        _config("ESMC", population=2)
    with pytest.raises(ConfigError, match=r"es\.population_size: LM_MA_ES takes at most twice"):
        Evolution(_config("LM_MA_ES", population=6))


def test_options_reach_the_strategy_and_survive_the_saved_config():
    evolution = _evolution("CMA_ES", options={"c_std": 0.123, "std_max": 2})
    assert float(evolution.es_params.c_std) == pytest.approx(0.123)
    assert evolution.es_params.c_std.dtype == np.float32  # evosax's own dtype for it
    assert evolution.es_params.std_max == 2.0
    assert float(evolution.es_params.std_init) == pytest.approx(0.3)  # es.sigma
    config = evolution.config
    assert config_from_dict(config.to_dict()) == config
    params = Evolution(_config("DifferentialEvolution", options={"elitism": False})).es_params
    assert params.elitism is False


def test_sigma_without_decay_stays_sigma():
    """``sigma_decay = 1`` keeps ``sigma`` (optax would read the ``sigma_min`` floor of a
    decaying schedule as a ceiling there and sample at ``sigma_min``)."""
    for decay, expected in ((1.0, [0.3, 0.3]), (0.5, [0.3, 0.15])):
        strategy, _ = build_strategy(_config(sigma_decay=decay, sigma_min=0.01).es,
                                     {"scale": jnp.zeros(2)})
        assert [float(strategy.std_schedule(g)) for g in (0, 1)] == pytest.approx(expected)


def test_the_table_agrees_with_evosax():
    """Every evosax strategy is offered or excluded with a reason; each offered one's
    options are the scalar fields of its ``default_params`` but ``std_init`` (and a
    truncated strategy's ``T`` and ``K``, which ``es.truncations`` sets), and its
    constructor takes what its spec says the common settings build."""
    from evosax import algorithms

    evosax_names = {cls.__name__ for cls in algorithms.algorithms.values()}
    assert set(STRATEGIES) | set(EXCLUDED) == evosax_names
    assert not set(STRATEGIES) & set(EXCLUDED)
    template = {"w": jax.numpy.zeros(3)}
    for name, spec in STRATEGIES.items():
        cls = getattr(algorithms, name)
        arguments = inspect.signature(cls).parameters
        assert spec.optimizer == ("optimizer" in arguments), name
        assert spec.std_schedule == ("std_schedule" in arguments), name
        assert spec.antithetic == ("use_antithetic_sampling" in arguments), name
        family = (algorithms.population_based_algorithms
                  if spec.family == POPULATION else algorithms.distribution_based_algorithms)
        assert cls in family.values(), name
        params = cls(8, template).default_params
        set_here = {"T", "K"} if spec.truncated else set()  # from es.truncations
        scalars = {field: type(value) for field, value in vars(params).items()
                   if field != "std_init" and field not in set_here
                   and (isinstance(value, bool | int | float)
                        or getattr(value, "shape", None) == ())}
        assert set(spec.options) == set(scalars), name
        for field, kind in spec.options.items():
            if kind is not float:
                assert scalars[field] is kind, (name, field)
        assert spec.std_init == hasattr(params, "std_init"), name
