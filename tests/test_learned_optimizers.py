"""The optimiser slot and the learned optimisers (``learned_optimizer``, ``open_optimizer``):
Adam at initialisation, exact PPO training, jit + vmap, resumption, errors, and a short
evolution on a planted problem."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from inner_loops import ppo, registry
from inner_loops.dqn import DQNConfig
from inner_loops.objective import Objective
from metarl.evolve.config import ESConfig
from metarl.evolve.strategies import ask_search, build_strategy, init_search, tell_search
from metarl.objectives import get_objective, make_objective
from metarl.objectives.open_optimizer import dormancy, layer_positions

OPTIMIZERS = ("learned_optimizer", "open_optimizer")
# 8 updates of a 4 x 16 batch, two epochs of two minibatches: a second or two per compile
TINY = ppo.PPOConfig(num_envs=4, num_steps=16, total_timesteps=512, hidden_sizes=(8,),
                     update_epochs=2, num_minibatches=2)


def nested_params():
    """A nested parameter pytree like a two-tower network, plus a 0-d leaf."""
    key = jax.random.PRNGKey(3)
    shapes = {"actor": {"Dense_0": {"kernel": (3, 5), "bias": (5,)},
                        "Dense_1": {"kernel": (5, 2), "bias": (2,)}},
              "critic": {"Dense_0": {"kernel": (3, 5), "bias": (5,)}},
              "scale": ()}
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([jax.random.normal(k, s) for k, s in zip(keys, leaves,
                                                                        strict=True)])


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_at_initialisation_the_rule_is_adam_bit_for_bit(name):
    """Five steps of fixed gradients (scales 1e-2 to 1e2) on a nested pytree, in one jitted
    scan: identical to ``scale_by_adam(eps=1e-5)`` (array_equal: exact up to the sign of
    a zero)."""
    objective = make_objective(name)
    meta_params = objective.init(jax.random.PRNGKey(0))
    adam = optax.scale_by_adam(eps=1e-5)
    params = nested_params()

    @jax.jit
    def both(meta_params):
        rule = objective.optimizer_transformation(meta_params)

        def step(states, n):
            state, adam_state = states
            grads = jax.tree.map(lambda p: jnp.sin(p * (n + 1.0)) * 10.0 ** (n - 2.0), params)
            updates, state = rule.update(grads, state, params, progress=n / 5.0,
                                         key=jax.random.PRNGKey(n.astype(jnp.int32)))
            reference, adam_state = adam.update(grads, adam_state, params)
            return (state, adam_state), (updates, reference)

        _, outputs = jax.lax.scan(step, (rule.init(params), adam.init(params)),
                                  jnp.arange(5.0))
        return outputs

    got, expected = both(meta_params)
    assert_trees_equal(got, expected)


def test_slot_keeps_old_meta_parameters_and_adds_its_own():
    """Without the slot the meta-parameters are ``{"policy", "value"}`` as before; with it an
    ``"optimizer"`` entry is added and the loss terms' draws do not change."""
    assert set(make_objective("ppo").init(jax.random.PRNGKey(0))) == {"policy", "value"}
    distance = make_objective("value_distance", hidden_sizes=[4])
    meta_params = make_objective("learned_optimizer").init(jax.random.PRNGKey(0))
    assert set(meta_params) == {"policy", "value", "optimizer"}
    assert meta_params["optimizer"]["layers"][-1]["w"].shape == (16, 2)
    combined = Objective(value=distance.value, optimizer=make_objective("open_optimizer").optimizer)
    assert_trees_equal(combined.init(jax.random.PRNGKey(1))["value"],
                       distance.init(jax.random.PRNGKey(1))["value"])
    assert combined.slots == ("value", "optimizer")
    assert combined.name == "default+value_distance+open_optimizer"


@pytest.fixture(scope="module")
def learners():
    """``{name: (learner, jit(advance))}`` for Adam (``None``) and both learned optimisers,
    built once so that the tests share their compiled programs."""
    built = {}
    for name in (None, *OPTIMIZERS):  # open_optimizer's advance is only used under vmap
        learner = ppo.build(TINY, None if name is None else make_objective(name))
        built[name] = (learner, jax.jit(learner.advance, static_argnums=3))
    return built


def advance(learners, name, num_updates, meta_params=None, state=None):
    learner, advance_fn = learners[name]
    meta_params = learner.default_meta_params if meta_params is None else meta_params
    if state is None:
        state = learner.init(jax.random.PRNGKey(0), meta_params, learner.default_hypers)
    return advance_fn(state, meta_params, learner.default_hypers, num_updates)


def assert_close_to_adam(state, metrics, adam_state, adam_metrics):
    """The same episodes (exactly), parameters and losses equal to float rounding."""
    for field in ("episode_return", "episode_length", "episodes"):
        np.testing.assert_array_equal(metrics[field], adam_metrics[field])
    for x, y in zip(jax.tree.leaves((state.params, metrics)),
                    jax.tree.leaves((adam_state.params, adam_metrics)), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_ppo_with_a_learned_optimizer_at_initialisation_trains_as_adam(learners):
    """Eight PPO updates with ``learned_optimizer`` at initialisation against Adam. Measured:
    parameters within 5e-10 and most metrics bit-identical; XLA compiles the two programs'
    update arithmetic differently (fusion, fused multiply-adds), so losses that cancel
    (the surrogate's mean, ``approx_kl``) differ in their last bits. The rule's own output
    is Adam's bit for bit (the test above)."""
    adam_state, adam_metrics = advance(learners, None, 8)
    state, metrics = advance(learners, "learned_optimizer", 8)
    assert_close_to_adam(state, metrics, adam_state, adam_metrics)


def test_open_optimizer_trains_under_vmap_resumes_exactly_and_starts_at_adam(learners):
    """``open_optimizer`` with two meta-parameter sets in one ``jit(vmap(advance))``:
    the one at initialisation trains as Adam (to rounding), the perturbed one (with learned
    noise) differently and finitely; and ``advance(init, 4)`` then ``advance(..., 4)``
    equals ``advance(init, 8)`` bit for bit, so the rule's state lives in the agent's."""
    learner, _ = learners["open_optimizer"]
    base = learner.default_meta_params
    perturbed = jax.tree.map(
        lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(7), x.shape), base)
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), base, perturbed)
    hypers = learner.default_hypers
    states = jax.jit(jax.vmap(learner.init, in_axes=(None, 0, None)))(
        jax.random.PRNGKey(0), both, hypers)
    advance_all = jax.jit(jax.vmap(learner.advance, in_axes=(0, 0, None, None)),
                          static_argnums=3)
    whole, whole_metrics = advance_all(states, both, hypers, 8)
    first, first_metrics = advance_all(states, both, hypers, 4)
    rest, rest_metrics = advance_all(first, both, hypers, 4)
    assert_trees_equal(rest, whole)
    assert_trees_equal(jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1),
                                    first_metrics, rest_metrics), whole_metrics)

    losses = np.asarray(whole_metrics["policy_loss"])
    assert losses.shape == (2, TINY.num_updates)
    assert np.all(np.asarray(whole_metrics["finite"]))
    assert not np.array_equal(losses[0], losses[1])
    adam_state, adam_metrics = advance(learners, None, 8)
    assert_close_to_adam(jax.tree.map(lambda x: x[0], whole),
                         jax.tree.map(lambda x: x[0], whole_metrics), adam_state, adam_metrics)


@pytest.mark.parametrize(("options", "message"), [
    ({"hidden_sizes": []}, "hidden_sizes: expected a non-empty list of positive integers"),
    ({"hidden_sizes": [16, 0]}, "hidden_sizes: expected a non-empty list"),
    ({"hidden_sizes": 16}, "hidden_sizes: expected a list of layer widths"),
    ({"timescales": [0.9, 1.0]}, "timescales: every momentum timescale must lie in (0, 1)"),
    ({"timescales": [0.0]}, "timescales: every momentum timescale must lie in (0, 1)"),
    ({"timescales": ["fast"]}, "timescales: expected a list of numbers"),
    ({"max_log_scale": -1.0}, "max_log_scale: must be a positive finite number"),
    ({"max_additive": float("inf")}, "max_additive: must be a positive finite number"),
])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_bad_options_give_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_objective(name, **options)


def test_open_optimizer_checks_its_noise_bound():
    with pytest.raises(ValueError, match="max_noise: must be a positive finite number"):
        make_objective("open_optimizer", max_noise=0.0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_algorithm_without_the_slot_refuses_it_by_name(name):
    dqn = registry.get_algorithm("dqn")
    assert not get_objective(name).fits(dqn.name, dqn.slots)
    assert get_objective(name).fits("ppo", registry.get_algorithm("ppo").slots)
    with pytest.raises(ValueError, match=f"objective '{name}' does not fit algorithm 'dqn': "
                                         "it fills the optimizer slot"):
        registry.make_learner(DQNConfig(), make_objective(name))


def test_the_update_needs_progress_and_the_noise_a_key():
    params = nested_params()
    grads = jax.tree.map(jnp.ones_like, params)
    for name, missing in (("learned_optimizer", {}), ("open_optimizer", {"progress": 0.5})):
        objective = make_objective(name)
        rule = objective.optimizer_transformation(objective.init(jax.random.PRNGKey(0)))
        with pytest.raises(ValueError, match="needs the extra argument"):
            rule.update(grads, rule.init(params), params, **missing)


def test_open_inputs_layer_position_and_dormancy():
    assert layer_positions(nested_params()) == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    many = {f"Dense_{i}": {"kernel": jnp.zeros((1, 1))} for i in (0, 2, 10)}
    assert layer_positions(many) == [0.0, 1.0, 0.5]  # leaves in key order: 0, 10, 2
    mu = jnp.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])  # unit 1 gets no gradient
    np.testing.assert_allclose(dormancy(mu)[0], [1.0, 0.0, 2.0])


def test_short_evolution_on_a_planted_problem_improves_fitness():
    """A stand-in learner: 30 steps of the rule at a far too small learning rate on a
    quadratic. A larger learned step factor ``exp(3 tanh(o_1))`` is better by construction,
    and three generations of Open_ES raise the fitness (minus the final loss)."""
    objective = make_objective("learned_optimizer")
    curvature = jnp.array([1.0, 2.0, 4.0])
    start = {"w": jnp.array([1.0, -1.0, 0.5])}

    def fitness(meta_params):
        rule = objective.optimizer_transformation(meta_params)

        def step(carry, n):
            params, state = carry
            grads = jax.tree.map(lambda w: curvature * w, params)
            updates, state = rule.update(grads, state, params, progress=n / 30.0)
            return (jax.tree.map(lambda w, u: w - 1e-2 * u, params, updates), state), None

        (params, _), _ = jax.lax.scan(step, (start, rule.init(start)), jnp.arange(30.0))
        return -0.5 * jnp.sum(curvature * params["w"] ** 2)

    config = ESConfig(strategy="Open_ES", population_size=8, generations=3, sigma=0.1,
                      learning_rate=0.1)
    mean = objective.init(jax.random.PRNGKey(0))
    strategy, es_params = build_strategy(config, mean)
    es_state = init_search(config, strategy, es_params, jax.random.PRNGKey(1), mean)

    @jax.jit
    def generation(es_state, key, index):
        ask_key, tell_key = jax.random.split(key)
        population, es_state = ask_search(config, strategy, es_params, ask_key, es_state,
                                          index)
        values = jax.vmap(fitness)(population)
        return tell_search(config, strategy, es_params, tell_key, population, -values,
                           es_state, index), values

    initial = float(fitness(mean))
    for index in range(3):
        es_state, values = generation(es_state, jax.random.PRNGKey(10 + index), index)
    final = float(fitness(strategy.get_mean(es_state)))
    assert final > initial + 0.01 * abs(initial), (initial, final)
