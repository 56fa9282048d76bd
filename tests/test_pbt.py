"""Population-based training: priors, exploit and explore against hand-computed cases, a
PBT that finds the best hyperparameter of a stand-in learner, and real PPO segments whose
copied members continue as their sources."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import PPOConfig, make_learner
from metarl.population import priors as priors_lib
from metarl.population.pbt import (
    PBTConfig,
    exploit_and_explore,
    initial_population,
    lineage,
    make_segment,
    train_pbt,
)
from metarl.population.priors import Prior


class Hypers(NamedTuple):
    learning_rate: jax.Array
    gamma: jax.Array


def hypers_of(learning_rates, gammas=None):
    learning_rates = jnp.asarray(learning_rates, jnp.float32)
    gammas = jnp.full_like(learning_rates, 0.99) if gammas is None else jnp.asarray(gammas)
    return Hypers(learning_rates, gammas)


def test_priors_sample_inside_their_bounds_and_log_priors_spread_over_decades():
    prior = Prior(1e-5, 1e-1, log=True)
    draws = np.asarray(prior.sample(jax.random.PRNGKey(0), (4000,)))
    assert draws.min() >= 1e-5 and draws.max() <= 1e-1
    # log-uniform: a quarter of the draws in each decade
    per_decade = np.histogram(np.log10(draws), bins=[-5, -4, -3, -2, -1])[0] / draws.size
    np.testing.assert_allclose(per_decade, 0.25, atol=0.03)
    uniform = np.asarray(Prior(0.9, 1.0).sample(jax.random.PRNGKey(1), (4000,)))
    assert 0.9 <= uniform.min() and uniform.max() <= 1.0
    assert abs(np.median(uniform) - 0.95) < 0.01


def test_perturb_multiplies_by_the_factors_and_clips_to_the_bounds():
    priors = {"learning_rate": Prior(1e-4, 1e-2, log=True)}
    hypers = hypers_of([1e-3] * 64 + [9e-3] * 64)
    perturbed = priors_lib.perturb(jax.random.PRNGKey(0), priors, hypers, (0.8, 1.2))
    ratios = np.asarray(perturbed.learning_rate[:64], np.float64) / 1e-3
    assert set(np.round(ratios, 4).tolist()) == {0.8, 1.2}
    high = np.asarray(perturbed.learning_rate[64:], np.float64)
    assert set(np.round(high / 9e-3, 4).tolist()) == {0.8, round(1e-2 / 9e-3, 4)}  # clipped
    np.testing.assert_array_equal(perturbed.gamma, hypers.gamma)  # no prior: unchanged


@pytest.mark.parametrize(("prior", "message"), [
    (dict(low=1.0, high=1.0), "low: must be below high"),
    (dict(low=0.0, high=1.0, log=True), "log-uniform prior needs low > 0"),
    (dict(low=float("nan"), high=1.0), "low: must be a finite number"),
])
def test_bad_priors_name_the_problem(prior, message):
    with pytest.raises(ValueError, match=message):
        Prior(**prior)


@pytest.mark.parametrize(("changes", "message"), [
    ({"exploit_fraction": 0.6}, r"pbt.exploit_fraction: must lie in \(0, 0.5\]"),
    ({"exploit_fraction": 0.0}, r"pbt.exploit_fraction: must lie in \(0, 0.5\]"),
    ({"population_size": 3, "exploit_fraction": 0.25}, "pbt.population_size: 3 members"),
    ({"explore": "mutate"}, "pbt.explore: got 'mutate'; allowed: perturb, resample"),
    ({"segment_updates": 0}, "pbt.segment_updates: must be a positive integer"),
])
def test_bad_pbt_configs_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        PBTConfig(**changes)


def test_a_prior_for_a_missing_hyperparameter_is_named():
    with pytest.raises(ValueError, match="priors: no hyperparameter named lr; allowed: "
                                         "learning_rate, gamma"):
        priors_lib.sample(jax.random.PRNGKey(0), {"lr": Prior(1e-4, 1e-2)}, hypers_of([1e-3]))


def test_the_bottom_copies_the_top_whole_and_explores():
    """Fitness [1, 5, 3, NaN, 4, 0, 2, 6] with a quarter exploited: members 5 (0) and 3 (NaN)
    are the bottom two, members 7 (6) and 1 (5) the top two."""
    config = PBTConfig(population_size=8, exploit_fraction=0.25,
                       priors={"learning_rate": Prior(1e-5, 1.0, log=True)})
    fitness = jnp.array([1.0, 5.0, 3.0, jnp.nan, 4.0, 0.0, 2.0, 6.0])
    states = {"weights": jnp.arange(8.0)[:, None] * jnp.ones((8, 3)),
              "step": jnp.arange(8, dtype=jnp.int32)}
    hypers = hypers_of(jnp.arange(1, 9) * 1e-3, jnp.linspace(0.9, 0.97, 8))
    new_states, new_hypers, record = exploit_and_explore(jax.random.PRNGKey(3), fitness,
                                                         states, hypers, config)
    source, replaced = np.asarray(record.source), np.asarray(record.replaced)
    assert replaced.tolist() == [False, False, False, True, False, True, False, False]
    kept = ~replaced
    assert (source[kept] == np.arange(8)[kept]).all()
    assert set(source[replaced]) <= {1, 7}
    # whole states copied, leaf by leaf
    np.testing.assert_array_equal(new_states["step"], source)
    np.testing.assert_array_equal(new_states["weights"][:, 0], source.astype(np.float32))
    # kept members keep their hyperparameters; replaced ones take their source's, perturbed
    lr, old_lr = np.asarray(new_hypers.learning_rate), np.asarray(hypers.learning_rate)
    np.testing.assert_array_equal(lr[kept], old_lr[kept])
    for member in np.flatnonzero(replaced):
        ratio = lr[member] / old_lr[source[member]]
        assert round(float(ratio), 4) in (0.8, 1.2)
        np.testing.assert_array_equal(new_hypers.gamma[member], hypers.gamma[source[member]])
    # exploit=False changes nothing
    same_states, same_hypers, none = exploit_and_explore(jax.random.PRNGKey(3), fitness, states,
                                                         hypers, config, exploit=False)
    assert not np.asarray(none.replaced).any()
    np.testing.assert_array_equal(same_hypers.learning_rate, hypers.learning_rate)
    np.testing.assert_array_equal(same_states["step"], states["step"])


def exploit_sources(fitness, keys=range(24), population=None, fraction=0.5):
    """``(replaced, {member: set of sources})`` of exploit steps with ``keys``, checking on
    the way that every record is truthful: kept members keep their state and
    hyperparameters, replaced ones hold their source's state and explored hyperparameters."""
    fitness = jnp.asarray(fitness, jnp.float32)
    size = population or fitness.shape[0]
    config = PBTConfig(population_size=size, exploit_fraction=fraction,
                       priors={"learning_rate": Prior(1e-5, 1.0, log=True)})
    states = {"weights": jnp.arange(size, dtype=jnp.float32)[:, None] * jnp.ones((size, 2))}
    hypers = hypers_of(jnp.arange(1, size + 1) * 1e-3)
    replaced_sets, sources = set(), {}
    for seed in keys:
        new_states, new_hypers, record = exploit_and_explore(
            jax.random.PRNGKey(seed), fitness, states, hypers, config)
        source, replaced = np.asarray(record.source), np.asarray(record.replaced)
        replaced_sets.add(tuple(np.flatnonzero(replaced).tolist()))
        np.testing.assert_array_equal(source[~replaced], np.flatnonzero(~replaced))
        np.testing.assert_array_equal(new_states["weights"][:, 0], source.astype(np.float32))
        lr, old_lr = np.asarray(new_hypers.learning_rate), np.asarray(hypers.learning_rate)
        np.testing.assert_array_equal(lr[~replaced], old_lr[~replaced])
        assert not np.isin(lr[replaced], old_lr[replaced]).any()  # explored, not kept
        for member in np.flatnonzero(replaced):
            sources.setdefault(int(member), set()).add(int(source[member]))
    assert len(replaced_sets) == 1  # who is replaced does not depend on the key
    return list(replaced_sets.pop()), sources


def test_tied_members_are_not_replaced():
    # everyone at CartPole's maximum: nobody copies anybody
    assert exploit_sources([500.0] * 8, fraction=0.25) == ([], {})
    # one member below the rest: it copies one of the top two (members 6, 7 by rank); the
    # other bottom member (0, tied with the donors) is kept
    replaced, sources = exploit_sources([500, 500, 480, 500, 500, 500, 500, 500],
                                        fraction=0.25)
    assert replaced == [2] and sources == {2: {6, 7}}


def test_a_candidate_copies_only_donors_that_beat_it():
    """Fitness [2, 1, 2, 3], half exploited: candidates 1 (1) and 0 (2), donors 2 (2) and
    3 (3). Member 1 draws either donor; member 0 is beaten by member 3 only."""
    replaced, sources = exploit_sources([2.0, 1.0, 2.0, 3.0])
    assert replaced == [0, 1] and sources == {0: {3}, 1: {2, 3}}


def test_nan_members_copy_finite_donors_and_an_all_nan_population_stays():
    # NaN ranks as -inf: candidates 0 and 2, donors 1 (1) and 3 (2), both finite
    replaced, sources = exploit_sources([math.nan, 1.0, math.nan, 2.0])
    assert replaced == [0, 2] and sources == {0: {1, 3}, 2: {1, 3}}
    # candidates 0 and 1 (NaN), donors 2 (NaN, beats nobody) and 3 (5)
    replaced, sources = exploit_sources([math.nan, math.nan, math.nan, 5.0])
    assert replaced == [0, 1] and sources == {0: {3}, 1: {3}}
    assert exploit_sources([math.nan] * 4) == ([], {})


def test_resample_draws_replaced_members_from_the_prior():
    config = PBTConfig(population_size=4, exploit_fraction=0.5, explore="resample",
                       priors={"gamma": Prior(0.5, 0.6)})
    hypers = hypers_of([1e-3] * 4, [0.99] * 4)
    _, new_hypers, record = exploit_and_explore(jax.random.PRNGKey(0), jnp.arange(4.0),
                                                jnp.arange(4), hypers, config)
    gamma = np.asarray(new_hypers.gamma)
    replaced = np.asarray(record.replaced)
    assert replaced.tolist() == [True, True, False, False]
    assert ((0.5 <= gamma[replaced]) & (gamma[replaced] <= 0.6)).all()
    np.testing.assert_allclose(gamma[~replaced], 0.99, rtol=1e-6)


# --------------------------------------------------------------------------------------
# a stand-in learner whose return says how close log10(learning rate) is to -3


BEST_LOG_LR = -3.0
UPDATES = 60


class StandInState(NamedTuple):
    total: jax.Array
    update_count: jax.Array


def stand_in_learner():
    """The PPO learner's record with ``init``/``advance`` replaced: every update returns
    ``-(log10(lr) + 3)^2`` plus a little noise from the state."""
    learner = make_learner(PPOConfig(num_envs=1, num_steps=8, total_timesteps=8 * UPDATES,
                                     update_epochs=1, num_minibatches=1))

    def init(key, meta_params, hypers):
        return StandInState(jnp.float32(0.0), jnp.int32(0))

    def advance(state, meta_params, hypers, num_updates):
        score = -jnp.square(jnp.log10(hypers.learning_rate) - BEST_LOG_LR)
        returns = jnp.full((num_updates,), score)
        return (StandInState(state.total + score * num_updates,
                             state.update_count + num_updates),
                {"episode_return": returns, "finite": jnp.ones((num_updates,), bool)})

    return dataclasses.replace(learner, init_fn=init, advance_fn=advance)


def test_pbt_finds_the_best_learning_rate_of_a_stand_in():
    learner = stand_in_learner()
    config = PBTConfig(population_size=16, segment_updates=3, exploit_fraction=0.25,
                       priors={"learning_rate": Prior(1e-6, 1.0, log=True)})
    result = train_pbt(learner, config, jax.random.PRNGKey(0), chunk_size=16)
    assert len(result.history) == UPDATES // 3
    first = np.log10(result.history[0]["hypers"]["learning_rate"])
    last = np.log10(np.asarray(result.hypers.learning_rate))
    assert np.median(np.abs(last - BEST_LOG_LR)) < 0.3
    assert np.median(np.abs(last - BEST_LOG_LR)) < 0.5 * np.median(np.abs(first - BEST_LOG_LR))
    assert not any(result.history[-1]["replaced"])  # no exploit after the last segment
    # every member's lineage walks back through real sources to segment 0
    chain = lineage(result.history, int(np.argmax(result.history[-1]["fitness"])))
    assert len(chain) == len(result.history) and all(0 <= m < 16 for m in chain)


# --------------------------------------------------------------------------------------
# real PPO agents


@pytest.fixture(scope="module")
def ppo_population():
    """Four tiny PPO agents drawn from a learning-rate prior, built (and their initial
    population compiled) once for the tests below: ``(learner, config, states, hypers)``."""
    learner = make_learner(PPOConfig(num_envs=2, num_steps=8, total_timesteps=2 * 8 * 4,
                                     update_epochs=1, num_minibatches=1, hidden_sizes=(8,)))
    config = PBTConfig(population_size=4, segment_updates=2, exploit_fraction=0.25,
                       priors={"learning_rate": Prior(1e-4, 1e-2, log=True)})
    states, hypers = initial_population(learner, config, jax.random.PRNGKey(0), chunk_size=4)
    return learner, config, states, hypers


def test_ppo_segments_copy_members_that_continue_as_their_sources(ppo_population):
    learner, config, states, hypers = ppo_population
    assert len({float(x) for x in hypers.learning_rate}) == 4  # drawn from the prior
    segment = make_segment(learner, config, chunk_size=4)
    after, new_hypers, metrics, fitness, record = segment(states, hypers, jax.random.PRNGKey(1),
                                                          jnp.asarray(True))
    assert metrics["episode_return"].shape == (4, 2)
    target = int(np.flatnonzero(np.asarray(record.replaced))[0])
    source = int(record.source[target])
    # the target now holds the state the source reached in this segment
    reference, kept_hypers, _, _, _ = segment(states, hypers, jax.random.PRNGKey(1),
                                              jnp.asarray(False))
    np.testing.assert_array_equal(kept_hypers.learning_rate, hypers.learning_rate)
    for got, want in zip(jax.tree.leaves(after), jax.tree.leaves(reference), strict=True):
        np.testing.assert_array_equal(np.asarray(got)[target], np.asarray(want)[source])
    ratio = float(new_hypers.learning_rate[target]) / float(hypers.learning_rate[source])
    clipped = float(new_hypers.learning_rate[target]) in (np.float32(1e-4), np.float32(1e-2))
    assert clipped or any(math.isclose(ratio, f, rel_tol=1e-5) for f in (0.8, 1.2))


def test_plot_pbt_draws_returns_schedules_exploits_and_the_winning_lineage():
    from metarl.figures.population import plot_pbt

    learner = stand_in_learner()
    config = PBTConfig(population_size=8, segment_updates=6, exploit_fraction=0.25,
                       priors={"learning_rate": Prior(1e-6, 1.0, log=True)})
    result = train_pbt(learner, config, jax.random.PRNGKey(1), chunk_size=8)
    best = int(np.nanargmax(result.history[-1]["fitness"]))
    chain = lineage(result.history, best)
    fig = plot_pbt(result.history, chain, steps_per_update=8)
    returns_ax, lr_ax = [ax for ax in fig.axes if ax.get_ylabel()]
    # the bold line is the lineage's returns: each segment's from the member it ran in
    expected = np.concatenate([np.asarray(record["returns"][m], np.float64)
                               for record, m in zip(result.history, chain, strict=True)])
    np.testing.assert_allclose(returns_ax.lines[-1].get_ydata(), expected)
    with pytest.raises(ValueError, match="lineage"):
        plot_pbt(result.history, chain[1:])
    assert returns_ax.get_ylabel() == "episode return" and lr_ax.get_ylabel() == "learning_rate"
    assert lr_ax.get_yscale() == "log"  # the prior spans six decades
    # one line per member plus the bold lineage, in both panels
    assert len(returns_ax.lines) == len(lr_ax.lines) == 8 + 1
    exploits = sum(sum(record["replaced"]) for record in result.history)
    assert sum(len(c.get_offsets()) for c in lr_ax.collections) == exploits == 2 * 9
    assert lr_ax.get_xlabel() == "environment steps per member"


def test_reseeded_copies_take_their_source_state_with_a_key_of_their_own(ppo_population):
    _, config, states, hypers = ppo_population
    fitness = jnp.array([3.0, 0.0, 2.0, 5.0])  # member 1 copies member 3
    plain, _, record = exploit_and_explore(jax.random.PRNGKey(1), fitness, states, hypers,
                                           config)
    reseeded, _, same_record = exploit_and_explore(
        jax.random.PRNGKey(1), fitness, states, hypers,
        dataclasses.replace(config, reseed_copies=True))
    assert np.asarray(record.source).tolist() == [0, 3, 2, 3]
    np.testing.assert_array_equal(record.source, same_record.source)
    np.testing.assert_array_equal(plain.key[1], states.key[3])  # an exact copy ...
    assert not np.array_equal(reseeded.key[1], states.key[3])  # ... or one with its own key
    np.testing.assert_array_equal(np.delete(reseeded.key, 1, 0), np.delete(plain.key, 1, 0))
    for got, want in zip(jax.tree.leaves(reseeded.replace(key=plain.key)),
                         jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(got, want)


def test_copies_keep_their_own_replay_buffer_when_told_to():
    """Fitness [0, 3, 1, 2], half exploited: member 0 copies member 1 and member 2 copies
    member 3, or the other way round; with ``copy_buffer = False`` they keep their own
    buffers (and everything else comes from the source)."""
    from inner_loops.replay import ReplayBuffer

    members = jnp.arange(4.0)
    states = {"params": members[:, None] * jnp.ones((4, 2)),
              "buffer": ReplayBuffer(storage={"obs": members[:, None] * jnp.ones((4, 5))},
                                     position=jnp.arange(4, dtype=jnp.int32),
                                     size=jnp.arange(4, dtype=jnp.int32) + 10)}
    fitness = jnp.array([0.0, 3.0, 1.0, 2.0])
    hypers = hypers_of(jnp.full(4, 1e-3))
    for copy_buffer in (True, False):
        config = PBTConfig(population_size=4, exploit_fraction=0.5, copy_buffer=copy_buffer)
        new, _, record = exploit_and_explore(jax.random.PRNGKey(0), fitness, states, hypers,
                                             config)
        source = np.asarray(record.source)
        assert np.asarray(record.replaced).tolist() == [True, False, True, False]
        np.testing.assert_array_equal(new["params"][:, 0], source.astype(np.float32))
        owner = source if copy_buffer else np.arange(4)
        np.testing.assert_array_equal(new["buffer"].storage["obs"][:, 0], owner)
        np.testing.assert_array_equal(new["buffer"].position, owner)
        np.testing.assert_array_equal(new["buffer"].size, owner + 10)
    with pytest.raises(ValueError, match=r"pbt\.copy_buffer: false needs a learner with a "
                                         r"replay buffer"):
        exploit_and_explore(jax.random.PRNGKey(0), fitness, {"params": states["params"]},
                            hypers, PBTConfig(population_size=4, exploit_fraction=0.5,
                                              copy_buffer=False))
