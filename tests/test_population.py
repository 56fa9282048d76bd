"""Tests of training populations: ``vmap`` over keys, meta-parameters and hyperparameters
gives the same agents as separate runs, chunking does not change results, new values do not
recompile, and a vmapped train finishes for several population sizes (in a subprocess, so a
hang fails the test instead of freezing the run).

Everything uses one TINY config and a small objective with two scalar meta-parameters, so
the module compiles three programs: one agent, the population, the chunked population.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import (
    Hyperparams,
    LossTerm,
    Objective,
    PPOConfig,
    broadcast_to_population,
    make_train,
    stack_hyperparams,
    train_population,
)
from inner_loops.objective import ppo_clip_surrogate

TINY = PPOConfig(
    num_envs=2, num_steps=8, total_timesteps=64, update_epochs=2, num_minibatches=2,
    hidden_sizes=(8,),
)
POPULATION = 8
CHUNK = 3  # 8 = 3 + 3 + 2: exercises the remainder
# vmap batches the same float32 operations; allow only rounding-level differences.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

# These tests check semantics (batching, chunking, tracing), not speed: compile at XLA's
# lowest backend optimisation level, which compiles them faster. All of them use the same
# level, since the level changes float rounding slightly.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

HANG_GUARD = Path(__file__).with_name("_hang_guard.py")
# the sizes that never returned under jax 0.10.2: 3 with this PPO, 2 with PureJaxRL's (which
# also hung at 16; one size more costs a whole compilation and tells nothing new)
HANG_GUARD_SIZES = (2, 3)
HANG_GUARD_TIMEOUT = 240  # seconds; generous, for a shared and busy CPU


def _weighted_clip_loss(meta_params, inputs):
    return -meta_params["weight"] * jnp.mean(
        ppo_clip_surrogate(inputs.ratio, inputs.advantages, inputs.clip_eps)
    )


def _scaled_l2_loss(meta_params, inputs):
    return jnp.exp(meta_params["log_scale"]) * 0.5 * jnp.mean(
        jnp.square(inputs.values - inputs.targets)
    )


# A learned-loss stand-in: one scalar meta-parameter per term, PPO at the defaults.
OBJECTIVE = Objective(
    policy=LossTerm("weighted_clip", lambda key: {"weight": jnp.float32(1.0)},
                    _weighted_clip_loss),
    value=LossTerm("scaled_l2", lambda key: {"log_scale": jnp.float32(0.0)}, _scaled_l2_loss),
)


@pytest.fixture(scope="module")
def train():
    return make_train(TINY, OBJECTIVE)


@pytest.fixture(scope="module")
def single(train):
    """One agent: ``(key, meta_params, hypers) -> metrics``, compiled once."""
    return jax.jit(train, compiler_options=FAST_COMPILE)


@pytest.fixture(scope="module")
def population(train):
    """``(keys, meta_params, hypers, chunk_size="auto") -> metrics [P, U]``."""
    return jax.jit(functools.partial(train_population, train), static_argnames="chunk_size",
                   compiler_options=FAST_COMPILE)


@pytest.fixture(scope="module")
def defaults():
    return OBJECTIVE.init(jax.random.PRNGKey(0)), TINY.hyperparams()


def varied_meta_params():
    return {
        "policy": {"weight": jnp.linspace(0.25, 2.0, POPULATION)},
        "value": {"log_scale": jnp.linspace(-2.0, 1.0, POPULATION)},
    }


def varied_hyperparams() -> Hyperparams:
    rates = np.geomspace(1e-4, 3e-2, POPULATION)
    return stack_hyperparams([TINY.replace(learning_rate=float(lr)).hyperparams()
                              for lr in rates])


def row(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def assert_rows_match_single_runs(single, metrics, keys, meta_params, hypers):
    metrics = jax.device_get(metrics)
    for i in range(POPULATION):
        expected = jax.device_get(single(keys[i], row(meta_params, i), row(hypers, i)))
        for name in metrics:
            np.testing.assert_allclose(
                metrics[name][i], expected[name], **TOLERANCE, err_msg=f"agent {i}: {name}"
            )


def assert_rows_differ(metrics, name="policy_loss"):
    rows = np.asarray(metrics[name])
    for i in range(1, POPULATION):
        assert not np.allclose(rows[i], rows[0], rtol=1e-3, atol=1e-6), (name, i)


def test_helpers_shape_a_population(defaults):
    meta_params, hypers = defaults
    stacked = broadcast_to_population(meta_params, POPULATION)
    assert stacked["policy"]["weight"].shape == (POPULATION,)
    assert stacked["value"]["log_scale"].shape == (POPULATION,)
    many = broadcast_to_population(hypers, POPULATION)
    assert isinstance(many, Hyperparams)
    assert all(x.shape == (POPULATION,) for x in many)
    np.testing.assert_allclose(many.gamma, np.full(POPULATION, 0.99), rtol=1e-6)
    rates = varied_hyperparams().learning_rate
    assert rates.shape == (POPULATION,) and rates.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(rates)[[0, -1]], [1e-4, 3e-2], rtol=1e-5)


def test_vmap_over_keys_equals_single_runs(single, population, defaults):
    meta_params, hypers = defaults
    keys = jax.random.split(jax.random.PRNGKey(7), POPULATION)
    meta_b = broadcast_to_population(meta_params, POPULATION)
    hypers_b = broadcast_to_population(hypers, POPULATION)
    metrics = population(keys, meta_b, hypers_b)
    assert all(v.shape == (POPULATION, TINY.num_updates) for v in metrics.values())
    assert bool(np.all(metrics["finite"]))
    assert_rows_differ(metrics)
    assert_rows_match_single_runs(single, metrics, keys, meta_b, hypers_b)


def test_vmap_over_meta_params_equals_single_runs(single, population, defaults):
    """Same seed for every agent: only the meta-parameters of the loss differ."""
    _, hypers = defaults
    keys = broadcast_to_population(jax.random.PRNGKey(7), POPULATION)
    meta_params = varied_meta_params()
    hypers_b = broadcast_to_population(hypers, POPULATION)
    metrics = population(keys, meta_params, hypers_b)
    assert_rows_differ(metrics, "value_loss")
    assert_rows_match_single_runs(single, metrics, keys, meta_params, hypers_b)


def test_vmap_over_hyperparams_equals_single_runs(single, population, defaults):
    """Same seed for every agent: only the learning rate differs."""
    meta_params, _ = defaults
    keys = broadcast_to_population(jax.random.PRNGKey(7), POPULATION)
    meta_b = broadcast_to_population(meta_params, POPULATION)
    hypers = varied_hyperparams()
    metrics = population(keys, meta_b, hypers)
    assert_rows_differ(metrics)
    progress = np.arange(TINY.num_updates) / TINY.num_updates
    np.testing.assert_allclose(
        metrics["learning_rate"], np.asarray(hypers.learning_rate)[:, None] * (1 - progress),
        rtol=1e-5,
    )
    # The first rollout precedes any update, so it is the same for every learning rate.
    np.testing.assert_allclose(metrics["episode_return"][:, 0], metrics["episode_return"][0, 0])
    assert_rows_match_single_runs(single, metrics, keys, meta_b, hypers)


def test_chunked_population_equals_unchunked(population):
    keys = jax.random.split(jax.random.PRNGKey(11), POPULATION)
    meta_params, hypers = varied_meta_params(), varied_hyperparams()
    whole = jax.device_get(population(keys, meta_params, hypers))
    chunked = jax.device_get(population(keys, meta_params, hypers, chunk_size=CHUNK))
    assert set(chunked) == set(whole)
    for name in whole:
        assert chunked[name].shape == (POPULATION, TINY.num_updates)
        np.testing.assert_allclose(chunked[name], whole[name], **TOLERANCE, err_msg=name)
    assert_rows_differ(whole)


def test_chunk_size_must_be_positive(train, defaults):
    meta_params, hypers = defaults
    keys = jax.random.split(jax.random.PRNGKey(0), POPULATION)
    with pytest.raises(ValueError, match="chunk_size"):
        train_population(
            train, keys, broadcast_to_population(meta_params, POPULATION),
            broadcast_to_population(hypers, POPULATION), chunk_size=0,
        )


def test_new_values_do_not_recompile(single, defaults, compilations):
    """Keys, meta-parameters and hyperparameters are traced: new values reuse the program."""
    meta_params, hypers = defaults
    keys = [jax.random.PRNGKey(seed) for seed in (3, 4, 5)]  # made before counting
    other_meta = {"policy": {"weight": jnp.float32(0.5)}, "value": {"log_scale": jnp.float32(1.0)}}
    other_hypers = hypers._replace(learning_rate=jnp.float32(1e-2), gamma=jnp.float32(0.9),
                                   clip_eps=jnp.float32(0.1))
    jax.block_until_ready(single(keys[0], meta_params, hypers))  # compiled (or reused)
    before = compilations.count()
    first = single(keys[1], other_meta, hypers)
    second = single(keys[2], meta_params, other_hypers)
    jax.block_until_ready((first, second))
    assert compilations.count() == before
    assert not np.allclose(first["value_loss"], second["value_loss"])


# ------------------------------------------------------------------------- hang guard


@pytest.fixture(scope="module", autouse=True)
def hang_guard_process(request):
    """Start the hang guard at the beginning of this module, so that it runs alongside the
    other population tests; the test below collects it. Not started when deselected."""
    wanted = any(item.name == "test_vmapped_train_finishes_for_every_population_size"
                 and item.module is request.module for item in request.session.items)
    if not wanted:
        yield None
        return
    process = subprocess.Popen(
        [sys.executable, str(HANG_GUARD), *map(str, HANG_GUARD_SIZES)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    started = time.monotonic()
    yield process, started
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.mark.timeout(HANG_GUARD_TIMEOUT + 60)
def test_vmapped_train_finishes_for_every_population_size(hang_guard_process):
    process, started = hang_guard_process
    remaining = HANG_GUARD_TIMEOUT - (time.monotonic() - started)
    try:
        stdout, stderr = process.communicate(timeout=max(remaining, 1.0))
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(
            f"vmapped train did not finish within {HANG_GUARD_TIMEOUT} s (a hang, as under "
            f"jax 0.10.2?). Finished so far:\n{stdout}\n{stderr[-2000:]}"
        )
    assert process.returncode == 0, stderr[-4000:]
    lines = [line for line in stdout.splitlines() if line.startswith("size=")]
    results = {}
    for line in lines:
        fields = dict(part.split("=", 1) for part in line.split())
        results[int(fields["size"])] = fields
    assert sorted(results) == sorted(HANG_GUARD_SIZES), stdout
    for size, fields in results.items():
        assert fields["finite"] == "True", (size, fields)
        assert np.isfinite(float(fields["value_loss"])), (size, fields)
    assert stdout.rstrip().endswith("done"), stdout
