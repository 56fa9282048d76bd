"""The inner-loop contract: ``train`` = ``init`` + ``advance`` in segments, bit for bit;
populations that are advanced in segments, edited between them (copy a member, change one
member's hyperparameters), checkpointed with orbax and continued.

One TINY config per action space; every jitted function is built once per module and
called with one signature (a second one compiles it again: 3 to 7 CPU-s per PPO program),
the hyperparameters always as arguments.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _typed_states import counting_traces
from _xla import EXACT_COMPILER_OPTIONS

from inner_loops import (
    PPOConfig,
    advance_population,
    copy_member,
    init_population,
    make_learner,
    select_members,
    set_member,
    stack_hyperparams,
    train_population,
)

# compile at XLA's lowest backend optimisation level: these tests check semantics
FAST_COMPILE = EXACT_COMPILER_OPTIONS

CONFIGS = {
    "discrete": PPOConfig(num_envs=2, num_steps=8, total_timesteps=64, update_epochs=2,
                          num_minibatches=2, hidden_sizes=(8,)),
    "continuous": PPOConfig(env_id="Pendulum-v1", num_envs=2, num_steps=8,
                            total_timesteps=64, update_epochs=2, num_minibatches=2,
                            hidden_sizes=(8,), normalize_obs=True, normalize_reward=True),
}
SEGMENT = 2  # of 4 updates
POPULATION = 3


def jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def programs(request):
    learner = make_learner(CONFIGS[request.param])
    assert learner.num_updates == 2 * SEGMENT
    return {
        "learner": learner,
        "train": jit(learner.train),
        "init": jit(learner.init),
        "advance": jit(advance := counting_traces(
            functools.partial(learner.advance, num_updates=SEGMENT))),
        "traced_advance": advance,  # its .traces: how often JAX traced it
    }


def assert_trees_equal(a, b, exact=True):
    leaves_a, leaves_b = jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if exact:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def concat(first, second):
    return jax.tree.map(lambda x, y: np.concatenate([x, y], axis=-1), jax.device_get(first),
                        jax.device_get(second))


def test_train_equals_init_then_advance_in_segments(programs):
    key = jax.random.PRNGKey(7)
    # the config's own values, passed as arguments as a population passes its members'
    hypers = programs["learner"].default_hypers
    whole = programs["train"](key, None, hypers)
    state = programs["init"](key, None, hypers)
    assert int(state.update_count) == 0
    state, first = programs["advance"](state, None, hypers)
    state, second = programs["advance"](state, None, hypers)
    assert int(state.update_count) == 2 * SEGMENT
    assert_trees_equal(concat(first, second), whole)
    # a fresh state is typed as an advanced one: one compiled advance served both
    assert programs["traced_advance"].traces == 1
    # annealing read the update counter: the second segment continued the decay
    rates = concat(first, second)["learning_rate"]
    np.testing.assert_allclose(rates, 2.5e-4 * (1 - np.arange(4) / 4), rtol=1e-6)


def test_unjitted_advance_checks_the_segment_length(programs):
    learner = programs["learner"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_updates"):
            learner.advance(None, num_updates=bad)


@pytest.fixture(scope="module")
def population_programs(programs):
    learner = programs["learner"]
    return {
        "train": jit(functools.partial(train_population, learner.train)),
        "init": jit(functools.partial(init_population, learner)),
        "advance": jit(functools.partial(advance_population, learner, num_updates=SEGMENT)),
    }


def varied_hypers(learner):
    config = learner.config
    return stack_hyperparams([config.replace(learning_rate=lr).hyperparams()
                              for lr in (1e-3, 3e-3, 1e-2)])


def test_population_in_segments_equals_one_call(programs, population_programs):
    learner = programs["learner"]
    keys = jax.random.split(jax.random.PRNGKey(3), POPULATION)
    hypers = varied_hypers(learner)
    whole = population_programs["train"](keys, None, hypers)
    states = population_programs["init"](keys, None, hypers)
    states, first = population_programs["advance"](states, None, hypers)
    states, second = population_programs["advance"](states, None, hypers)
    assert_trees_equal(concat(first, second), whole)
    assert states.update_count.tolist() == [2 * SEGMENT] * POPULATION


def test_a_copied_member_continues_as_its_source(programs, population_programs):
    """PBT's exploit step: member 2 becomes a copy of member 0 (state and hyperparameters)
    and then trains exactly as member 0 does."""
    learner = programs["learner"]
    keys = jax.random.split(jax.random.PRNGKey(5), POPULATION)
    hypers = varied_hypers(learner)
    states = population_programs["init"](keys, None, hypers)
    states, _ = population_programs["advance"](states, None, hypers)
    # jitted: one program, rather than one gather compiled for each shape of leaf
    copy = jax.jit(copy_member, static_argnames=("source", "target"))
    states, hypers = copy((states, hypers), source=0, target=2)
    states, metrics = population_programs["advance"](states, None, hypers)
    metrics = jax.device_get(metrics)
    for name, values in metrics.items():
        np.testing.assert_array_equal(values[2], values[0], err_msg=name)
    host_states = jax.device_get(states)
    assert_trees_equal(jax.tree.map(lambda x: x[2], host_states),
                       jax.tree.map(lambda x: x[0], host_states))
    # and as the source continues when advanced alone: taken out in a program, which keeps
    # the state's types as they are (a copy through the host would drop JAX's weak types
    # and compile the single-agent advance once more)
    member = jax.jit(lambda tree, index: jax.tree.map(lambda x: x[index], tree))
    state, hyper = member((states, hypers), 0)
    _, alone_metrics = programs["advance"](state, None, hyper)
    assert np.isfinite(alone_metrics["value_loss"]).all()


def test_changing_one_members_hyperparameters_changes_only_that_member(programs,
                                                                      population_programs):
    learner = programs["learner"]
    keys = jax.random.split(jax.random.PRNGKey(9), POPULATION)
    hypers = varied_hypers(learner)
    states = population_programs["init"](keys, None, hypers)
    states, _ = population_programs["advance"](states, None, hypers)
    faster = set_member(hypers, 1, learner.config.replace(learning_rate=0.05).hyperparams())
    np.testing.assert_allclose(faster.learning_rate, [1e-3, 0.05, 1e-2], rtol=1e-6)
    _, base = population_programs["advance"](states, None, hypers)
    _, changed = population_programs["advance"](states, None, faster)
    base, changed = jax.device_get((base, changed))
    for member in (0, 2):
        np.testing.assert_array_equal(changed["value_loss"][member], base["value_loss"][member])
    assert not np.array_equal(changed["learning_rate"][1], base["learning_rate"][1])


def test_a_population_state_survives_an_orbax_round_trip(programs, population_programs,
                                                         tmp_path):
    """Save mid-training, restore into the state's structure, continue: same agents."""
    learner = programs["learner"]
    keys = jax.random.split(jax.random.PRNGKey(13), POPULATION)
    hypers = varied_hypers(learner)
    states = population_programs["init"](keys, None, hypers)
    states, _ = population_programs["advance"](states, None, hypers)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "population", states)
        checkpointer.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, states)
        restored = checkpointer.restore(tmp_path / "population", abstract)
    assert_trees_equal(restored, states)
    _, expected = population_programs["advance"](states, None, hypers)
    # Orbax gives the arrays back committed to a device and without JAX's weak types (some
    # of PPO's counters are weakly typed), so this compiles the advance program once more:
    # what a resumed run does, and what is checked here.
    _, resumed = population_programs["advance"](restored, None, hypers)
    assert_trees_equal(resumed, expected)


def test_states_have_a_leading_agent_axis(programs, population_programs):
    keys = jax.random.split(jax.random.PRNGKey(0), POPULATION)
    hypers = varied_hypers(programs["learner"])
    states = population_programs["init"](keys, None, hypers)
    single = programs["init"](keys[0], None, jax.tree.map(lambda x: x[0], hypers))
    for many, one in zip(jax.tree.leaves(states), jax.tree.leaves(single), strict=True):
        assert many.shape == (POPULATION, *one.shape)
    select = jax.jit(select_members)  # one program, not one gather per shape of leaf
    chosen = select(states, jnp.array([1, 1, 0]))
    assert_trees_equal(select(chosen, jnp.array([0])), select(states, jnp.array([1])))
