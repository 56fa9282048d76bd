"""The meta-gradient (:mod:`metarl.evolve.metagradient`) trains and scores its agents with
PPO's own pipeline (:mod:`inner_loops.ppo`), not a copy of it, so the two cannot drift apart.

- An update of the meta-gradient's agents (its :meth:`~MetaGradient.unroll`) is PPO's update
  (:func:`inner_loops.ppo.build`) bit for bit, from the same agent, meta-parameters and
  key, once the one deliberate difference is taken out: the meta-gradient's Adam adds
  ``eps_root`` under its square root (:func:`~metarl.evolve.metagradient.differentiable_adam`)
  so that its derivative stays finite. With it the two agree to float rounding.
- Its validation batch is PPO's batch (:func:`inner_loops.ppo.collect_batch`) of the same
  rollout, its advantages standardised by PPO's :func:`~inner_loops.ppo.standardize_advantages`
  over the whole batch, and both code paths call PPO's :func:`~inner_loops.ppo.compute_gae`
  and :func:`~inner_loops.ppo.standardize_advantages` (counted while they are traced).

The environments' time limit of 3 steps makes episodes end by truncation inside each
rollout, so the targets bootstrap from final observations (``final_values``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import ppo
from metarl.evolve import metagradient
from metarl.evolve.config import config_from_dict
from metarl.evolve.metagradient import EPS_ROOT, MetaGradient

# hidden_sizes [6] is used by no other test: a MetaGradient built with a patched optimiser
# shares its compiled programs (metarl.programs.shared_program) only with equal configs
INNER = {"num_envs": 4, "num_steps": 8, "total_timesteps": 128, "update_epochs": 2,
         "num_minibatches": 2, "hidden_sizes": [6], "learning_rate": 0.05,
         "env_params": {"max_steps_in_episode": 3}}
EXPERIMENTS = {
    "discrete_value_distance": {
        "objective": {"name": "value_distance",
                      "options": {"hidden_sizes": [4], "form": "even_scaled_l2"}},
        "inner": {**INNER, "env_id": "CartPole-v1"},
        "meta": {"method": "metagradient", "agents": 2, "unroll": 2, "init_noise": 0.1},
        "run": {"progress": False},
    },
    "continuous_lpo_in_rollout": {
        "objective": {"name": "lpo", "options": {"hidden_sizes": [4]}},
        "inner": {**INNER, "env_id": "Pendulum-v1", "final_values": "in_rollout",
                  "anneal_lr": False},
        "meta": {"method": "metagradient", "agents": 2, "unroll": 2, "init_noise": 0.1},
        "run": {"progress": False},
    },
}


def build(name: str, eps_root: float | None = None) -> MetaGradient:
    """The meta-gradient of ``EXPERIMENTS[name]``; its agents' Adam with ``eps_root`` when
    given (the engine's own ``EPS_ROOT`` otherwise)."""
    if eps_root is None:
        return MetaGradient(config_from_dict(EXPERIMENTS[name]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metagradient, "differentiable_adam",
                      functools.partial(metagradient.differentiable_adam, eps_root=eps_root))
        return MetaGradient(config_from_dict(EXPERIMENTS[name]))


def first_agent(engine: MetaGradient):
    """``(theta, agent, hypers)``: the start and the first of the engine's fresh agents."""
    state = engine.init()
    return (state.meta_params, jax.tree.map(lambda x: x[0], state.agents),
            engine.learner.default_hypers)


def ppo_updates(engine: MetaGradient, theta, agent, hypers):
    """``meta.unroll`` updates of PPO itself (its Adam, the objective's losses) from
    ``agent``: ``(agent, metrics)``, the metrics ``[K]`` each."""
    learner = ppo.build(engine.config.inner[0], engine.objective)
    return jax.jit(learner.advance, static_argnums=3)(agent, theta, hypers, engine.meta.unroll)


def meta_updates(engine: MetaGradient, theta, agent, hypers):
    """The meta-gradient's unroll of ``agent``: ``(agent, metrics)``, the metrics ``[K]``
    each."""
    return jax.jit(engine.unroll)(theta, agent, hypers)


def leaves_equal(a, b) -> list[str]:
    """Paths of the leaves of ``a`` and ``b`` that are not bit-identical."""
    flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
    flat_b = jax.tree.leaves(b)
    assert len(flat_a) == len(flat_b)
    return [jax.tree_util.keystr(path) for (path, x), y in zip(flat_a, flat_b, strict=True)
            if not np.array_equal(np.asarray(x), np.asarray(y))]


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_the_meta_gradients_update_is_ppos_update_bit_for_bit(name):
    engine = build(name, eps_root=0.0)
    theta, agent, hypers = first_agent(engine)
    mine, mine_metrics = meta_updates(engine, theta, agent, hypers)
    own, own_metrics = ppo_updates(engine, theta, agent, hypers)
    assert int(own.update_count) == 2 and bool(np.all(own_metrics["finite"]))
    # the updates moved the agent (a comparison of two unmoved agents would prove nothing)
    assert leaves_equal(own.params, agent.params)
    assert np.all(own_metrics["episodes"] > 0)  # episodes ended by the time limit
    assert leaves_equal(mine, own) == []
    assert leaves_equal(mine_metrics, own_metrics) == []


def test_with_eps_root_the_update_is_ppos_to_rounding():
    """The engine's own Adam (``eps_root = EPS_ROOT``) differs from PPO's only where a
    second moment is below ~1e-9: the parameters after an update agree closely."""
    assert EPS_ROOT > 0
    engine = build("discrete_value_distance")
    theta, agent, hypers = first_agent(engine)
    mine, _ = meta_updates(engine, theta, agent, hypers)
    own, _ = ppo_updates(engine, theta, agent, hypers)
    for x, y in zip(jax.tree.leaves(mine.params), jax.tree.leaves(own.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_the_validation_batch_is_ppos_batch_of_the_same_rollout():
    engine = build("discrete_value_distance")
    theta, agent, hypers = first_agent(engine)
    del theta
    key = jax.random.PRNGKey(5)
    batch, moved = jax.jit(engine.validation_batch)(agent, hypers, key)
    # one validation rollout (meta.validation_rollouts = 1) draws from split(key)
    parts = ppo.make_parts(engine.config.inner[0], engine.objective)
    carry, _, own = jax.jit(functools.partial(ppo.collect_batch, parts))(
        hypers, agent, *jax.random.split(key))
    assert engine.config.inner[0].normalize_advantages
    for field in ("obs", "action", "log_prob", "targets"):  # [R * T, N, ...], R = 1
        np.testing.assert_array_equal(getattr(batch, field), getattr(own, field), field)
    np.testing.assert_array_equal(batch.advantages, ppo.standardize_advantages(own.advantages))
    assert float(jnp.std(batch.advantages)) == pytest.approx(1.0, abs=1e-4)
    assert leaves_equal(moved.env_state, carry.env_state) == []
    np.testing.assert_array_equal(moved.obs, carry.obs)


def counting(monkeypatch, name: str) -> list:
    """Replace ``ppo.<name>`` by a wrapper that records each call (then calls it)."""
    calls, original = [], getattr(ppo, name)

    def wrapper(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(ppo, name, wrapper)
    return calls


def test_both_call_ppos_gae_and_standardisation(monkeypatch):
    engine = build("discrete_value_distance")
    theta, agent, hypers = first_agent(engine)
    gae = counting(monkeypatch, "compute_gae")
    standardize = counting(monkeypatch, "standardize_advantages")

    def traced(function, *args) -> tuple[int, int]:
        """How many calls of each ``function`` makes while traced (a scan's body may be
        traced more than once)."""
        before = len(gae), len(standardize)
        jax.eval_shape(function, *args)
        return len(gae) - before[0], len(standardize) - before[1]

    # the validation batch: one rollout's GAE, its advantages standardised as one batch
    assert traced(engine.validation_batch, agent, hypers, jax.random.PRNGKey(0)) == (1, 1)
    # the meta-gradient's updates and PPO's own: GAE of the rollout, standardised in the loss
    assert min(traced(engine.unroll, theta, agent, hypers)) >= 1
    learner = ppo.build(engine.config.inner[0], engine.objective)
    assert min(traced(functools.partial(learner.advance, num_updates=1), agent, theta,
                      hypers)) >= 1


def test_rollout_targets_and_standardisation_by_hand():
    """The hand-computed GAE of ``tests/test_ppo.py::test_gae_hand_computed`` through
    :func:`~inner_loops.ppo.rollout_targets` (final observations valued in the rollout),
    then standardised: step 0 truncated bootstraps from its final value 4.0, step 2
    terminated ignores its 9.0."""
    parts = ppo.make_parts(ppo.PPOConfig(num_envs=1, num_steps=3, total_timesteps=3,
                                         num_minibatches=1, final_values="in_rollout"))
    hypers = parts.config.hyperparams()._replace(gamma=jnp.float32(0.9),
                                                 gae_lambda=jnp.float32(0.5))
    column = functools.partial(jnp.asarray, dtype=jnp.float32)
    rollout = ppo.Transition(
        obs=None, action=None, log_prob=None, value=column([[0.5], [1.0], [1.5]]),
        reward=column([[1.0], [2.0], [3.0]]), terminated=jnp.asarray([[False], [False], [True]]),
        done=jnp.asarray([[True], [False], [True]]), final_obs=None)
    advantages, targets = ppo.rollout_targets(parts, hypers, None, rollout,
                                              column([[4.0], [1.5], [9.0]]), None)
    np.testing.assert_allclose(advantages[:, 0], [4.1, 3.025, 1.5], rtol=1e-6)
    np.testing.assert_allclose(targets[:, 0], [4.6, 4.025, 3.0], rtol=1e-6)
    # mean 2.875; std sqrt((1.225^2 + 0.15^2 + 1.375^2) / 3) = sqrt(1.1379167) = 1.0667318
    np.testing.assert_allclose(ppo.standardize_advantages(advantages)[:, 0],
                               np.array([1.225, 0.15, -1.375]) / (1.0667318 + 1e-8),
                               rtol=1e-5)
