"""Tests of the objectives in :mod:`metarl.objectives`: hand-computed losses, the drift
constraints (non-negative, zero with zero gradient at r = 1), the value distance's d(0) = 0,
the registry, and that every objective runs under ``jit`` and ``vmap`` over meta-parameters.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inner_loops.objective import LossInputs, clipped_l2, ppo_clip, ppo_clip_surrogate
from metarl.objectives import (
    available_objectives,
    dpo,
    get_objective,
    lpo,
    make_objective,
    register_objective,
    ta_lpo,
    value_distance,
)
from metarl.objectives.registry import _REGISTRY

EXPECTED_NAMES = ["dpo", "huber", "l2", "lpo", "ppo", "ta_lpo", "value_distance"]
N = 16  # samples per hypothesis example (fixed, so jitted functions compile once)
HYPOTHESIS = settings(max_examples=25, deadline=None)


def make_inputs(
    ratio=(1.0,),
    advantages=(0.0,),
    values=(0.0,),
    old_values=(0.0,),
    targets=(0.0,),
    clip_eps=0.2,
    progress=0.0,
) -> LossInputs:
    ratio = np.asarray(ratio, np.float32)
    return LossInputs(
        ratio=jnp.asarray(ratio),
        log_ratio=jnp.asarray(np.log(ratio)),
        advantages=jnp.asarray(advantages, jnp.float32),
        values=jnp.asarray(values, jnp.float32),
        old_values=jnp.asarray(old_values, jnp.float32),
        targets=jnp.asarray(targets, jnp.float32),
        clip_eps=jnp.asarray(clip_eps, jnp.float32),
        progress=jnp.asarray(progress, jnp.float32),
    )


def random_inputs(seed: int, batch=32, clip_eps=0.2, progress=0.3) -> LossInputs:
    """A random minibatch (numpy's generator: cheaper than compiling jax.random per shape)."""
    rng = np.random.default_rng(seed)
    log_ratio = (0.3 * rng.standard_normal(batch)).astype(np.float32)
    normal = lambda: jnp.asarray(rng.standard_normal(batch), jnp.float32)
    return LossInputs(
        ratio=jnp.asarray(np.exp(log_ratio)),
        log_ratio=jnp.asarray(log_ratio),
        advantages=normal(),
        values=normal(),
        old_values=normal(),
        targets=normal(),
        clip_eps=jnp.float32(clip_eps),
        progress=jnp.float32(progress),
    )


def random_drift_params(module, seed: int, scale: float, hidden_sizes=(128,)) -> dict:
    """Policy meta-parameters of an (ta_)lpo objective from ``init(PRNGKey(seed))`` (random
    output layer: ``ppo_init=False``), every weight multiplied by ``scale``."""
    objective = make_objective(module.__name__.rsplit(".", 1)[1], hidden_sizes=hidden_sizes)
    params = objective.policy.init(jax.random.PRNGKey(seed))
    return jax.tree.map(lambda w: scale * w, params)


@functools.cache
def _init_cached(name: str, frozen_kwargs: tuple, seed: int) -> dict:
    return make_objective(name, **dict(frozen_kwargs)).init(jax.random.PRNGKey(seed))


def _init(name: str, seed: int = 0, **kwargs) -> dict:
    """``make_objective(name, **kwargs).init(PRNGKey(seed))``, computed once per arguments."""
    return _init_cached(name, tuple(sorted(kwargs.items())), seed)


_distance = jax.jit(value_distance.value_distance, static_argnums=2)


def _drift_fn(module, ppo_init):
    """Jitted ``(params, r, A, eps, p) -> (drift(r), drift(1), d drift / d r at 1)``."""

    def drift(params, ratio, advantage, clip_eps, progress):
        return module.drift(params, ratio, advantage, clip_eps, progress, ppo_init=ppo_init)

    def check(params, ratio, advantage, clip_eps, progress):
        ones = jnp.ones_like(ratio)
        # Each sample's drift depends on its own ratio only, so the gradient of the sum is
        # the per-sample derivative d drift / d r.
        d_dr = jax.grad(lambda r: drift(params, r, advantage, clip_eps, progress).sum())(ones)
        return (
            drift(params, ratio, advantage, clip_eps, progress),
            drift(params, ones, advantage, clip_eps, progress),
            d_dr,
        )

    return jax.jit(check)


DRIFT_FNS = {
    (module.__name__, ppo_init): _drift_fn(module, ppo_init)
    for module in (lpo, ta_lpo)
    for ppo_init in (False, True)
}


@functools.cache
def _jitted_policy_loss(name: str, **kwargs):
    """One jitted policy loss per objective (``clip_eps``, ``progress`` are traced inputs)."""
    return jax.jit(make_objective(name, **kwargs).policy_loss)


# ---------------------------------------------------------------- hand-computed losses


def as_ppo_trains(objective):
    """``objective`` with PPO's own losses in the slots it leaves empty, as PPO trains it."""
    return objective.with_defaults(policy=ppo_clip(), value=clipped_l2())


def test_ppo_policy_loss_hand_computed():
    # r A and clip(r, 0.8, 1.2) A per sample; the surrogate takes the minimum:
    # (0.5, 1):  min(0.5, 0.8)   = 0.5
    # (1.0, -1): min(-1, -1)     = -1
    # (1.5, 2):  min(3.0, 2.4)   = 2.4
    # (0.7, -2): min(-1.4, -1.6) = -1.6       -> mean 0.075, loss -0.075
    inputs = make_inputs(ratio=[0.5, 1.0, 1.5, 0.7], advantages=[1.0, -1.0, 2.0, -2.0])
    objective = make_objective("ppo")
    loss = objective.policy_loss(objective.init(jax.random.PRNGKey(0)), inputs)
    np.testing.assert_allclose(loss, -0.075, rtol=1e-6)
    assert make_objective("l2").policy is None  # PPO keeps its own surrogate
    assert as_ppo_trains(make_objective("l2")).policy_loss({"policy": {}}, inputs) == loss


def test_value_losses_hand_computed():
    # values [1, 2], old values [0.5, 2.1], targets [2, 4], eps 0.2
    # unclipped errors^2: [1, 4]; clipped values [0.7, 2.0] -> errors^2 [1.69, 4]
    # clipped L2 = 0.5 * mean(max) = 0.5 * (1.69 + 4) / 2 = 1.4225
    # plain L2   = 0.5 * (1 + 4) / 2 = 1.25
    inputs = make_inputs(values=[1.0, 2.0], old_values=[0.5, 2.1], targets=[2.0, 4.0])
    np.testing.assert_allclose(make_objective("ppo").value_loss({"value": {}}, inputs), 1.4225)
    np.testing.assert_allclose(make_objective("l2").value_loss({"value": {}}, inputs), 1.25)
    # The drift objectives leave the value slot to PPO, which keeps its clipped value loss.
    for name in ("lpo", "ta_lpo", "dpo"):
        objective = make_objective(name)
        assert objective.value is None
        assert objective.init(jax.random.PRNGKey(1))["value"] == {}
        np.testing.assert_allclose(as_ppo_trains(objective).value_loss({"value": {}}, inputs),
                                   1.4225)


def test_dpo_hand_computed():
    ratio = [1.5, 0.5, 0.5, 2.0, 1.3]
    advantages = [2.0, -1.0, 1.0, -1.0, 0.0]
    alpha, beta = 2.0, 0.6
    u_pos = (1.5 - 1.0) * 2.0  # A >= 0 uses (r - 1) A = 1
    u_neg = math.log(0.5) * -1.0  # A < 0 uses log(r) A = log 2
    expected_drift = [
        u_pos - alpha * math.tanh(u_pos / alpha),  # 1 - 2 tanh(0.5) ~ 0.0758
        u_neg - beta * math.tanh(u_neg / beta),  # ~ 0.1997
        0.0,  # A > 0, r < 1: (r - 1) A < 0 -> relu gives 0
        0.0,  # A < 0, r > 1: log(r) A < 0 -> 0
        0.0,  # A = 0
    ]
    assert expected_drift[0] == pytest.approx(0.0757656854, abs=1e-9)
    np.testing.assert_allclose(
        dpo.drift(jnp.array(ratio), jnp.array(advantages)), expected_drift, atol=1e-6
    )
    r_times_a = [3.0, -0.5, 0.5, -2.0, 0.0]
    expected_loss = -np.mean(np.array(r_times_a) - np.array(expected_drift))
    objective = make_objective("dpo")
    inputs = make_inputs(ratio=ratio, advantages=advantages)
    np.testing.assert_allclose(
        objective.policy_loss({"policy": {}}, inputs), expected_loss, rtol=1e-5
    )
    # Other alpha, beta through the registry's kwargs.
    alpha, beta = 1.0, 0.3
    other = make_objective("dpo", alpha=alpha, beta=beta)
    drift_other = [
        u_pos - alpha * math.tanh(u_pos / alpha),
        u_neg - beta * math.tanh(u_neg / beta),
        0.0,
        0.0,
        0.0,
    ]
    np.testing.assert_allclose(
        other.policy_loss({"policy": {}}, inputs),
        -np.mean(np.array(r_times_a) - np.array(drift_other)),
        rtol=1e-5,
    )


def test_lpo_features_hand_computed():
    log2 = math.log(2.0)
    features = lpo.lpo_features(
        jnp.array([2.0]), jnp.array([log2]), jnp.array([3.0]), jnp.array([0.5])
    )
    expected = [1.0, 1.0, log2, log2**2, 3.0, 3.0, 3 * log2, 3 * log2**2]
    np.testing.assert_allclose(features[0], expected, rtol=1e-6)
    ta_features = ta_lpo.ta_lpo_features(
        jnp.array([2.0]), jnp.array([log2]), jnp.array([3.0]), jnp.array([0.5])
    )
    np.testing.assert_allclose(ta_features[0], expected + [0.5 * e for e in expected], rtol=1e-6)


def test_ppo_drift_is_ppo_clip():
    inputs = random_inputs(3, batch=N)
    ratio, advantages = inputs.ratio**2, 3.0 * inputs.advantages
    for eps in (0.1, 0.2, 0.3):
        ppo_drift = np.asarray(lpo.ppo_drift(ratio, advantages, eps))
        assert np.all(ppo_drift >= 0) and np.any(ppo_drift > 0)
        np.testing.assert_allclose(
            ppo_drift, ratio * advantages - ppo_clip_surrogate(ratio, advantages, eps), atol=1e-6
        )
        assert np.all(np.asarray(lpo.ppo_drift(jnp.ones(N), advantages, eps)) == 0)


@pytest.mark.parametrize("name", ["lpo", "ta_lpo"])
@pytest.mark.parametrize("clip_eps", [0.1, 0.2, 0.3])
def test_lpo_ppo_init_equals_ppo_clip(name, clip_eps):
    inputs = random_inputs(5, batch=N, clip_eps=clip_eps, progress=0.7)
    expected = _jitted_policy_loss("ppo")({"policy": {}}, inputs)
    policy_loss = _jitted_policy_loss(name, ppo_init=True)
    # Its initial meta-parameters have a zero output layer ...
    meta = _init(name, ppo_init=True)
    assert not np.any(np.asarray(meta["policy"]["layers"][-1]["w"]))
    # ... and a network with all weights zero gives the same loss (up to float32 rounding:
    # rA - relu((r - clip r)A) and min(rA, clip(r)A) round differently).
    zero = jax.tree.map(jnp.zeros_like, meta)
    for params in (meta, zero):
        np.testing.assert_allclose(policy_loss(params, inputs), expected, atol=1e-6)
    # A non-zero learned part adds a non-negative drift: the loss can only increase.
    random = {"policy": random_drift_params(lpo if name == "lpo" else ta_lpo, 0, 3.0), "value": {}}
    assert policy_loss(random, inputs) >= expected - 1e-6
    # Without ppo_init the zero network gives the unpenalised surrogate -mean(r A).
    np.testing.assert_allclose(
        _jitted_policy_loss(name)(zero, inputs),
        -np.mean(np.asarray(inputs.ratio) * np.asarray(inputs.advantages)),
        rtol=1e-5,
    )


@pytest.mark.parametrize("name", ["lpo", "ta_lpo"])
def test_lpo_zero_init_starts_at_the_unpenalised_surrogate(name):
    inputs = random_inputs(6, batch=N, clip_eps=0.2, progress=0.3)
    meta = _init(name, zero_init=True)
    assert not np.any(np.asarray(meta["policy"]["layers"][-1]["w"]))
    assert np.any(np.asarray(meta["policy"]["layers"][0]["w"]))  # hidden layers are random
    np.testing.assert_allclose(
        _jitted_policy_loss(name, zero_init=True)(meta, inputs),
        -np.mean(np.asarray(inputs.ratio) * np.asarray(inputs.advantages)), rtol=1e-5)


def test_lpo_loss_matches_drift_function():
    meta = {"policy": random_drift_params(ta_lpo, 7, 3.0), "value": {}}
    inputs = random_inputs(8, batch=N, progress=0.4)
    check = DRIFT_FNS[ta_lpo.__name__, False]
    drift = np.asarray(check(meta["policy"], inputs.ratio, inputs.advantages, 0.2, 0.4)[0])
    assert np.any(drift > 0)
    np.testing.assert_allclose(
        _jitted_policy_loss("ta_lpo")(meta, inputs),
        -np.mean(np.asarray(inputs.ratio) * np.asarray(inputs.advantages) - drift),
        rtol=1e-5,
    )


@pytest.mark.parametrize("form", ["scaled_l2", "even_scaled_l2", "l2_residual"])
def test_value_distance_init_equals_l2(form):
    objective = make_objective("value_distance", form=form)
    meta = _init("value_distance", form=form)
    value_loss = jax.jit(objective.value_loss)
    l2_loss = jax.jit(make_objective("l2").value_loss)
    for seed in range(3):
        inputs = random_inputs(seed, batch=N)
        # equal up to float32 rounding of the fused reduction
        np.testing.assert_allclose(value_loss(meta, inputs), l2_loss(meta, inputs), rtol=1e-6)
    x = np.linspace(-3.0, 3.0, 60, dtype=np.float32).reshape(5, 12)
    np.testing.assert_array_equal(_distance(meta["value"], x, form), 0.5 * x * x)
    # Changing the output layer moves it away from L2.
    moved = jax.tree.map(lambda w: w + 0.1, meta["value"])
    assert not np.allclose(_distance(moved, x, form), 0.5 * x * x)


def test_scaled_l2_rescales_large_errors_by_the_saturated_network():
    meta = _init("value_distance", hidden_sizes=(4,))["value"]
    # a unit that saturates for large |x| and an output weight of log(0.1): far from zero
    # the distance becomes 0.1 * 0.5 x^2 (a 10x smaller value loss), at zero it stays 0.
    meta["layers"][0]["w"] = jnp.array([[10.0, 0.0, 0.0, 0.0]])
    meta["layers"][1]["w"] = jnp.array([[np.log(0.1)], [0.0], [0.0], [0.0]], jnp.float32)
    x = np.array([-50.0, 0.0, 50.0], np.float32)
    d = np.asarray(_distance(meta, x, "scaled_l2"))
    # x < 0: tanh -> -1, g = -log(0.1)... the unit is odd, so the two sides scale inversely
    np.testing.assert_allclose(d, [0.5 * 2500 * 10.0, 0.0, 0.5 * 2500 * 0.1], rtol=1e-5)


def test_even_scaled_l2_weights_both_signs_alike():
    """``even_scaled_l2`` is ``scaled_l2`` of ``|x|``: even in ``x``, equal to it for
    ``x >= 0``, and its objective's loss is the mean distance."""
    meta = _init("value_distance", hidden_sizes=(4,), form="even_scaled_l2")["value"]
    meta = jax.tree.map(lambda w: w + 0.3, meta)  # output layer and biases off zero
    x = np.linspace(0.0, 30.0, 61, dtype=np.float32)
    even = np.asarray(_distance(meta, x, "even_scaled_l2"))
    np.testing.assert_array_equal(np.asarray(_distance(meta, -x, "even_scaled_l2")), even)
    np.testing.assert_allclose(even, np.asarray(_distance(meta, x, "scaled_l2")), rtol=1e-6)
    assert not np.allclose(even, 0.5 * x * x)
    objective = make_objective("value_distance", hidden_sizes=(4,), form="even_scaled_l2")
    inputs = random_inputs(3, batch=N)
    errors = np.asarray(inputs.values) - np.asarray(inputs.targets)
    np.testing.assert_allclose(
        jax.jit(objective.value_loss)({"policy": {}, "value": meta}, inputs),
        np.mean(np.asarray(_distance(meta, errors, "even_scaled_l2"))), rtol=1e-5)


def test_value_distance_loss_is_mean_distance():
    objective = make_objective("value_distance", hidden_sizes=(8,), form="raw")
    meta = _init("value_distance", hidden_sizes=(8,), form="raw")
    shapes = jax.tree.map(np.shape, meta["value"])
    assert shapes == {"layers": [{"w": (1, 8), "b": (8,)}, {"w": (8, 1), "b": (1,)}]}
    inputs = random_inputs(11, batch=N)
    errors = np.asarray(inputs.values) - np.asarray(inputs.targets)
    d = np.asarray(_distance(meta["value"], errors, "raw"))
    np.testing.assert_allclose(jax.jit(objective.value_loss)(meta, inputs), np.mean(d), rtol=1e-5)
    assert np.std(d) > 0  # a random network is not the zero function


def test_value_distance_rejects_an_unknown_form():
    with pytest.raises(ValueError, match="form: got 'cubic'"):
        make_objective("value_distance", form="cubic")


# ---------------------------------------------------------------- drift constraints

ratios = st.lists(st.floats(0.01, 10.0), min_size=N, max_size=N)
advantages = st.lists(st.floats(-10.0, 10.0), min_size=N, max_size=N)
seeds = st.integers(0, 2**16)
scales = st.sampled_from([0.5, 1.0, 3.0, 10.0, 30.0])


def check_drift_constraints(module, params, ratio, advantage, clip_eps, progress, ppo_init):
    check = DRIFT_FNS[(module.__name__, ppo_init)]
    ratio = np.asarray(ratio, np.float32)
    advantage = np.asarray(advantage, np.float32)
    drift, at_one, d_dr = map(np.asarray, check(params, ratio, advantage, clip_eps, progress))
    assert drift.shape == (N,)
    assert np.all(np.isfinite(drift))
    assert np.all(drift >= 0.0)
    assert np.all(at_one == 0.0)
    assert np.all(d_dr == 0.0)


@HYPOTHESIS
@given(
    seed=seeds,
    scale=scales,
    ratio=ratios,
    advantage=advantages,
    ppo_init=st.booleans(),
    clip_eps=st.sampled_from([0.1, 0.2, 0.3]),
)
def test_lpo_drift_constraints(seed, scale, ratio, advantage, ppo_init, clip_eps):
    params = random_drift_params(lpo, seed, scale)
    check_drift_constraints(lpo, params, ratio, advantage, clip_eps, 0.0, ppo_init)


@HYPOTHESIS
@given(
    seed=seeds,
    scale=scales,
    ratio=ratios,
    advantage=advantages,
    ppo_init=st.booleans(),
    progress=st.floats(0.0, 1.0),
)
def test_ta_lpo_drift_constraints(seed, scale, ratio, advantage, ppo_init, progress):
    params = random_drift_params(ta_lpo, seed, scale)
    for p in (progress, 0.0, 0.5, 1.0):
        check_drift_constraints(ta_lpo, params, ratio, advantage, 0.2, p, ppo_init)


@pytest.mark.parametrize("module", [lpo, ta_lpo])
def test_drift_constraints_deeper_network(module):
    params = random_drift_params(module, seed=12, scale=5.0, hidden_sizes=(32, 16))
    assert [layer["w"].shape[1] for layer in params["layers"]] == [32, 16, 1]
    assert all(set(layer) == {"w"} for layer in params["layers"])  # no biases
    ratio = np.exp(np.linspace(-4.0, 2.0, 101, dtype=np.float32))[:, None]
    advantage = np.linspace(-5.0, 5.0, 11, dtype=np.float32)

    @jax.jit
    def evaluate(progress):
        drift = lambda r, a: module.drift(params, r, a, progress=progress)
        d_dr = jax.vmap(jax.grad(drift), in_axes=(None, 0))(jnp.float32(1.0), advantage)
        return drift(ratio, advantage[None, :]), drift(1.0, advantage), d_dr

    for progress in (0.0, 0.3, 1.0):
        grid, at_one, d_dr = map(np.asarray, evaluate(progress))
        assert grid.shape == (101, 11)
        assert np.all(grid >= 0) and np.any(grid > 0)
        assert np.all(at_one == 0) and np.all(d_dr == 0)


def test_ta_lpo_depends_on_progress():
    params = random_drift_params(ta_lpo, seed=13, scale=3.0)
    lpo_params = random_drift_params(lpo, seed=13, scale=3.0)
    ratio = np.exp(np.linspace(-1.0, 1.0, 21, dtype=np.float32))[:, None]
    advantage = np.linspace(-2.0, 2.0, 9, dtype=np.float32)[None, :]
    # Broadcasting a progress grid: [3, 1, 1] x [21, 1] x [1, 9] -> [3, 21, 9].
    progress = np.array([0.0, 0.5, 1.0], np.float32)[:, None, None]

    @jax.jit
    def evaluate():
        return (
            ta_lpo.drift(params, ratio, advantage, progress=progress),
            ta_lpo.drift(params, ratio, advantage, progress=1.0),
            lpo.drift(lpo_params, ratio, advantage, progress=progress),
        )

    grid, late, lpo_grid = map(np.asarray, evaluate())
    assert grid.shape == lpo_grid.shape == (3, 21, 9)
    assert not np.allclose(grid[0], grid[2])
    np.testing.assert_allclose(grid[2], late, rtol=1e-5, atol=1e-6)
    # LPO ignores progress (equal up to rounding of matmuls at different batch positions).
    np.testing.assert_allclose(lpo_grid[0], lpo_grid[2], rtol=1e-5, atol=1e-6)


_dpo_value = jax.jit(dpo.drift)
_dpo_grad = jax.jit(jax.grad(lambda r, a, alpha, beta: dpo.drift(r, a, alpha, beta).sum()))


@HYPOTHESIS
@given(ratio=ratios, advantage=advantages, alpha=st.floats(0.1, 5.0), beta=st.floats(0.1, 5.0))
def test_dpo_drift_constraints(ratio, advantage, alpha, beta):
    ratio = np.asarray(ratio, np.float32)
    advantage = np.asarray(advantage, np.float32)
    drift = np.asarray(_dpo_value(ratio, advantage, alpha, beta))
    assert np.all(np.isfinite(drift)) and np.all(drift >= 0)
    ones = np.ones(N, np.float32)
    assert np.all(np.asarray(_dpo_value(ones, advantage, alpha, beta)) == 0)
    assert np.all(np.asarray(_dpo_grad(ones, advantage, alpha, beta)) == 0)


# ---------------------------------------------------------------- value distance


def _randomised_distance_params(seed: int, scale: float) -> dict:
    """Random weights and biases everywhere (including the output layer), times ``scale``."""
    rng = np.random.default_rng(seed)
    params = _init("value_distance", form="raw")["value"]
    return jax.tree.map(
        lambda w: jnp.asarray(scale * rng.standard_normal(w.shape), jnp.float32), params
    )


@HYPOTHESIS
@given(seed=seeds, scale=scales, form=st.sampled_from(["scaled_l2", "l2_residual", "raw"]))
def test_value_distance_zero_at_zero(seed, scale, form):
    params = _randomised_distance_params(seed, scale)
    assert _distance(params, np.float32(0.0), form) == 0
    # Zeros inside a batch of non-zero errors are exactly zero too, for any batch shape.
    x = np.random.default_rng(seed).standard_normal((5, 12)).astype(np.float32)
    x[:, ::3] = 0.0
    d = np.asarray(_distance(params, x, form))
    assert d.shape == (5, 12)
    assert np.all(d[:, ::3] == 0)
    assert np.any(d != 0)  # (saturated tanh units can make d(x) = 0 elsewhere too)


# ---------------------------------------------------------------- registry


def test_available_objectives():
    assert set(EXPECTED_NAMES) <= set(available_objectives())
    assert available_objectives() == sorted(available_objectives())


def test_unknown_name_lists_available():
    with pytest.raises(ValueError, match="no_such_objective") as info:
        make_objective("no_such_objective")
    for name in EXPECTED_NAMES:
        assert name in str(info.value)


def test_bad_keyword_is_named():
    with pytest.raises(ValueError, match="hiden_sizes"):
        make_objective("lpo", hiden_sizes=(64,))
    with pytest.raises(ValueError, match="ppo_init"):
        make_objective("dpo", ppo_init=True)
    with pytest.raises(ValueError, match="alpha"):
        make_objective("ppo", alpha=1.0)


def test_register_new_objective():
    name = "_test_only_objective"

    @register_objective(name, slots=("policy", "value"), algorithms=("ppo",),
                        baselines=("ppo",))
    def factory(scale: float = 1.0):
        return make_objective("ppo")

    try:
        assert name in available_objectives()
        objective = make_objective(name, scale=2.0)
        assert objective.name == name and objective.algorithms == ("ppo",)
        assert get_objective(name).baselines == ("ppo",)
        with pytest.raises(ValueError, match="already registered"):

            @register_objective(name, slots=("value",))
            def other_factory():
                return make_objective("l2")
    finally:
        _REGISTRY.pop(name, None)
    assert name not in available_objectives()


def test_a_factory_must_fill_the_slots_it_declares():
    name = "_test_wrong_slots"
    register_objective(name, slots=("value",))(lambda: make_objective("ppo"))
    try:
        with pytest.raises(ValueError, match=r"declares slots \['value'\] but its factory "
                                             r"filled \['policy', 'value'\]"):
            make_objective(name)
    finally:
        _REGISTRY.pop(name, None)
    with pytest.raises(ValueError, match="slots must be a non-empty subset"):
        register_objective(name, slots=("critic",))


# PPO and its recurrent variant share the loss code, so a policy objective fits both
PPO_FAMILY = ("ppo", "recurrent_ppo")
# what each shipped objective declares: slots, algorithms (None: any with its slots), baselines
DECLARATIONS = {
    "ppo": (("policy", "value"), PPO_FAMILY, ()),
    "l2": (("value",), None, ("ppo",)),
    "value_distance": (("value",), None, ("ppo", "l2", "huber")),
    "huber": (("value",), None, ("l2",)),
    "lpo": (("policy",), PPO_FAMILY, ("ppo", "dpo")),
    "ta_lpo": (("policy",), PPO_FAMILY, ("ppo", "dpo")),
    "dpo": (("policy",), PPO_FAMILY, ("ppo",)),
}


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_shipped_objectives_declare_what_they_fill_and_fit(name):
    declared = get_objective(name)
    slots, algorithms, baselines = DECLARATIONS[name]
    assert (declared.slots, declared.algorithms, declared.baselines) == (
        slots, algorithms, baselines)
    objective = make_objective(name)
    assert objective.slots == slots and objective.name == name
    assert declared.fits("ppo", ("policy", "value"))
    # an algorithm with only a critic slot (as off-policy learners have)
    assert declared.fits("some_critic", ("value",)) == (slots == ("value",)
                                                         and algorithms is None)
    assert all(baseline in available_objectives() for baseline in baselines)


# the shipped objectives (other test modules register stand-ins of their own)
VARIANTS = [(name, {}) for name in EXPECTED_NAMES] + [
    ("lpo", {"ppo_init": True, "hidden_sizes": (16, 16)}),
]


@pytest.mark.parametrize(("name", "kwargs"), VARIANTS, ids=lambda v: str(v))
def test_jit_vmap_over_meta_params(name, kwargs):
    objective = as_ppo_trains(make_objective(name, **kwargs))
    population, batch = 4, N
    inputs = random_inputs(1, batch=batch)

    def total(log_ratio, values, m):
        x = inputs._replace(ratio=jnp.exp(log_ratio), log_ratio=log_ratio, values=values)
        return objective.policy_loss(m, x) + objective.value_loss(m, x)

    @jax.jit
    def evaluate(keys, inputs):
        """What evolution does: init a population, then evaluate every member's losses."""
        meta = jax.vmap(objective.init)(keys)

        # The member index keeps vmap well-defined for objectives without meta-parameters.
        def member(m, index):
            del index
            # The inner loop differentiates the losses through log ratio and values.
            grads = jax.grad(total, argnums=(0, 1))(inputs.log_ratio, inputs.values, m)
            return objective.policy_loss(m, inputs), objective.value_loss(m, inputs), grads

        return meta, jax.vmap(member)(meta, jnp.arange(keys.shape[0]))

    keys = jax.random.split(jax.random.PRNGKey(0), population)
    meta, (policy_losses, value_losses, grads) = evaluate(keys, inputs)
    assert set(meta) == {"policy", "value"}
    for leaf in jax.tree.leaves(meta):
        assert leaf.dtype == jnp.float32 and leaf.shape[0] == population
    assert policy_losses.shape == value_losses.shape == (population,)
    assert np.all(np.isfinite(policy_losses)) and np.all(np.isfinite(value_losses))
    for g in grads:
        assert g.shape == (population, batch) and np.all(np.isfinite(g))
    if jax.tree.leaves(meta):
        # Different keys give different members.
        assert any(not np.array_equal(w[0], w[1]) for w in jax.tree.leaves(meta))

    # init is deterministic given the key.
    meta_again, _ = evaluate(keys, inputs)
    jax.tree.map(np.testing.assert_array_equal, meta, meta_again)
