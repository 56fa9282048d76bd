"""Tests of TD3 and SAC, :mod:`inner_loops.td3` and :mod:`inner_loops.sac` (and what they
share, :mod:`inner_loops.continuous_control`).

- Learning: small agents (1e4 environment steps, 32-32 networks, batches of 64) on
  Pendulum-v1, 4 seeds one after another in one ``jit``, deterministic evaluation episodes
  at the end: median above -600, best above -200; a small SAC agent on a brax environment
  beats a random policy. (What the default configs reach:
  ``benchmarks/studies/default_configs_learn.py``.)
- Probes: on continuous probe environments the learned Q-values come out within a tolerance
  of the exact ones (including bootstrapping through a time limit, and not through a
  termination), and the actor finds the best action.
- Pieces: the squashed Gaussian's log-density against a numerical change of variables, the
  action scaling, the delayed actor steps.
- The contract: a vmapped population with per-member hyperparameters equals its members
  trained one by one in segments; chunked equals unchunked; a population checkpointed mid-
  training with orbax and resumed equals the uninterrupted run. (Sharding over devices is
  checked on PPO and DQN in ``tests/test_sharding.py``; it wraps every learner alike.)
- Mixed precision: with ``precision = "bfloat16"`` tiny agents train with finite metrics
  and float32 parameters, and the actor's outputs and both critics' Q-values are within
  1 % of float32's on the same parameters.
- Bad input: each a ``ValueError`` naming the field.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _precision import assert_close_to_float32, assert_learned_in_float32, train_briefly
from _typed_states import counting_traces
from _xla import LEARNING_COMPILER_OPTIONS

from inner_loops import make_learner, stack_hyperparams, train_population
from inner_loops import sac as sac_module
from inner_loops import td3 as td3_module
from inner_loops.continuous_control import ActionScale
from inner_loops.envs import EnvSpec
from inner_loops.networks import squashed_gaussian
from inner_loops.objective import Objective, ppo_clip
from inner_loops.probe_envs import best_action, exact_q
from inner_loops.sac import SACConfig
from inner_loops.td3 import TD3Config
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.kinds import load_experiment

FAST_COMPILE = {"xla_backend_optimization_level": 0}
CONFIGS = {"td3": TD3Config, "sac": SACConfig}
MODULES = {"td3": td3_module, "sac": sac_module}


def jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


def assert_trees_equal(a, b, exact=True):
    leaves_a, leaves_b = jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if exact:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            # vmapped matrix products may round differently in the last bits
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------- learning

LEARNING_SEEDS = 4
# Smaller than the defaults (which benchmarks/studies/default_configs_learn.py measures): half the
# steps, batches of 64, 32-32 networks. Over 20 seeds (PRNGKey(0..4), 4 each, as this
# run trains them) the medians of 4 were between -170 and -146 (TD3) and -176 and -142
# (SAC), the best of 4 always above -151. Every SAC agent ended between -213 and -132; 17
# TD3 agents between -192 and -118, 3 stuck at -413, -573 and -827: the median's bound
# holds with two of four stuck.
PENDULUM = {"total_timesteps": 10_000, "buffer_size": 10_000, "batch_size": 64,
            "actor_hidden_sizes": (32, 32), "critic_hidden_sizes": (32, 32)}
PENDULUM_MEDIAN_ABOVE = -600.0
PENDULUM_BEST_ABOVE = -200.0
# A uniformly random policy's mean return on Pendulum-v1 is about -1246 (tests/test_ppo.py)
# and on brax/inverted_pendulum with episodes of at most 100 steps 22.4 (64 episodes,
# measured with this adapter; the reward is 1 per step until the pole falls).
BRAX_ENV = "brax/inverted_pendulum"
BRAX_RANDOM_RETURN = 22.4
BRAX = {"env_id": BRAX_ENV, "env_params": {"episode_length": 100}, "num_envs": 4,
        "train_frequency": 8, "gradient_steps": 32, "total_timesteps": 4096,
        "buffer_size": 4096, "batch_size": 64, "learning_starts": 512,
        "actor_hidden_sizes": (32, 32), "critic_hidden_sizes": (32, 32)}
# Over 7 seeds (PRNGKey(0) and 6 of PRNGKey(1)) the mean return of the last training
# episodes was at least 97.
BRAX_SEEDS = 1
BRAX_LAST_UPDATES = 32  # the last quarter of its 128 updates: 256 steps per environment
# Compiling is most of this cost. XLA's older code generation (no fusion emitters) compiles
# TD3's program in 7 s of CPU instead of 13 at level 1, and it runs as fast; the brax
# program compiles in half the time at level 0 (16 s instead of 32 with evaluation), where
# its short run costs 2 s more. They train in this process: a subprocess costs some 4 CPU-s
# to start Python and JAX, and would overlap nothing, these tests coming first.
PENDULUM_COMPILE = {**LEARNING_COMPILER_OPTIONS, "xla_cpu_use_fusion_emitters": False}
BRAX_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
LEARNING_TIMEOUT = 600  # seconds


def train_seeds(config, seeds: int, compiler_options: dict,
                evaluate: bool) -> dict[str, np.ndarray]:
    """``seeds`` agents of ``config`` (keys split from ``PRNGKey(0)``) trained over their
    budget in one program, then, when ``evaluate``, their deterministic evaluation
    episodes: metrics ``[seeds, num_updates]`` and ``eval_return``, ``eval_length``
    ``[seeds]``, on the host.

    One seed after another (``lax.map``): a vmap's batched scans take longer to trace and
    to compile (SAC: 17 s of CPU instead of 10), and agents this small run no faster
    vmapped."""
    learner = make_learner(config)

    def run(key):
        train_key, eval_key = jax.random.split(key)
        state, metrics = learner.advance(learner.init(train_key))
        return metrics, learner.evaluate(state, eval_key) if evaluate else {}

    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    train = jax.jit(lambda keys: jax.lax.map(run, keys), compiler_options=compiler_options)
    metrics, evaluation = jax.device_get(train(keys))
    return {**metrics, **evaluation}


@pytest.fixture(scope="module")
def pendulum_learned():
    """:func:`train_seeds` of TD3's and SAC's ``PENDULUM`` agents, by algorithm."""
    return {algorithm: train_seeds(config(**PENDULUM), LEARNING_SEEDS, PENDULUM_COMPILE,
                                   evaluate=True)
            for algorithm, config in CONFIGS.items()}


@pytest.fixture(scope="module")
def brax_learned():
    """:func:`train_seeds` of the ``BRAX`` agent, without evaluation episodes: tracing and
    compiling brax's step a second time would cost about 12 s, and the exploring policy's
    own episodes show what it learned."""
    return train_seeds(SACConfig(**BRAX), BRAX_SEEDS, BRAX_COMPILE, evaluate=False)


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT, method="thread")
@pytest.mark.parametrize("algorithm", ["td3", "sac"])
def test_small_config_learns_pendulum(pendulum_learned, algorithm):
    """Small agents (``PENDULUM``: 1e4 steps, 32-32 networks, batches of 64) learn
    Pendulum-v1: over 4 seeds the median deterministic return is above -600 and the best
    above -200 (a random policy: about -1246; published CPU references at 2e4 steps: about
    -200), after a warm-up that acted as a random policy does."""
    learned = pendulum_learned[algorithm]
    evaluation = learned["eval_return"]
    print(f"{algorithm} Pendulum-v1 deterministic return per seed: {np.round(evaluation, 1)}; "
          f"median {np.median(evaluation):.1f}, best {evaluation.max():.1f}")
    assert learned["finite"].all()
    assert np.median(evaluation) > PENDULUM_MEDIAN_ABOVE, evaluation
    assert evaluation.max() > PENDULUM_BEST_ABOVE, evaluation
    # the first training episodes (200 steps of 4 environments: 25 updates) are the
    # warm-up's random policy's
    warmup = CONFIGS[algorithm](**PENDULUM).warmup_updates
    assert warmup == 31
    first = learned["episode_return"][:, warmup]
    assert np.all(first < -900.0), first


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT, method="thread")
def test_sac_learns_a_brax_environment(brax_learned):
    """A small SAC agent on brax's inverted pendulum (episodes of at most 100 steps, 4096
    steps): finite metrics, and the exploring policy's episodes over the last quarter of
    training return on average more than 2.5 times a random policy's."""
    assert brax_learned["finite"].all()
    episodes = brax_learned["episodes"][:, -BRAX_LAST_UPDATES:]
    returns = np.where(episodes > 0, brax_learned["episode_return"][:, -BRAX_LAST_UPDATES:],
                       0)
    late_means = (returns * episodes).sum(axis=1) / episodes.sum(axis=1)
    print(f"SAC {BRAX_ENV} mean return of the last training episodes per seed: {late_means}")
    # each of the 4 environments finishes at least 2 episodes in those 256 steps
    assert np.all(episodes.sum(axis=1) >= 8), episodes
    assert np.all(late_means > 2.5 * BRAX_RANDOM_RETURN), late_means


# ---------------------------------------------------------------------------- probes

PROBE_GAMMA = 0.5
PROBE_TOLERANCE = 0.05
# action-dependent one-step probes, a two-step probe that terminates, one that truncates
PROBE_NAMES = ("observation_action", "discount", "bootstrap")
GRID = np.linspace(-0.8, 0.8, 5, dtype=np.float32)


def probe_config(algorithm: str, name: str):
    """Tiny agents that see every action: TD3 explores with wide noise; SAC keeps a broad
    policy with a fixed temperature of 1 on the one-step probes (whose targets have no soft
    term) and a negligible one where the target bootstraps."""
    common = dict(env_id=f"probe/{name}-continuous", num_envs=4, train_frequency=4,
                  gradient_steps=8, total_timesteps=4096, buffer_size=512, batch_size=64,
                  learning_starts=256, actor_hidden_sizes=(16,), critic_hidden_sizes=(32, 32),
                  actor_learning_rate=3e-3, critic_learning_rate=3e-3, gamma=PROBE_GAMMA,
                  tau=0.05)
    if algorithm == "td3":
        return TD3Config(**common, exploration_noise=1.0)
    one_step = name not in ("discount", "bootstrap")
    return SACConfig(**common, init_alpha=1.0 if one_step else 1e-4, alpha_learning_rate=1e-9)


@pytest.mark.parametrize("name", PROBE_NAMES)
@pytest.mark.parametrize("algorithm", ["td3", "sac"])
def test_probe_q_values_are_exact(algorithm, name):
    """The learned Q(s, a) of both critics are within ``PROBE_TOLERANCE`` of the exact ones
    at every observation the probe visits and over a grid of actions (Q does not depend on
    the action in ``discount`` and ``bootstrap``; there SAC's is read at its own actions);
    TD3's actor finds the best action of ``observation_action``."""
    config = probe_config(algorithm, name)
    learner = make_learner(config)
    state, metrics = jit(lambda key: learner.advance(learner.init(key)))(jax.random.PRNGKey(0))
    assert bool(metrics["finite"].all())
    module = MODULES[algorithm]
    actor, critic = module.make_networks(config, 1, 1)
    obs = np.array([[-1.0], [1.0]] if name == "observation_action" else [[0.0], [1.0]],
                   np.float32)
    if name == "bootstrap":
        obs = obs[:1]
    actions = np.broadcast_to(GRID[None, :, None], (len(obs), len(GRID), 1))
    if algorithm == "sac" and name in ("discount", "bootstrap"):
        mean, _ = actor.apply(state.nets.actor, obs)
        actions = np.asarray(jnp.tanh(mean))[:, None, :]
    obs_grid = np.broadcast_to(obs[:, None, :], actions.shape[:2] + (1,))
    flat_obs, flat_actions = obs_grid.reshape(-1, 1), actions.reshape(-1, 1)
    exact = exact_q(config.env_id, flat_obs, flat_actions, PROBE_GAMMA)
    for index in range(2):
        params = jax.tree.map(lambda p, i=index: p[i], state.nets.critic)
        q = np.asarray(critic.apply(params, flat_obs, flat_actions))
        np.testing.assert_allclose(q, exact, atol=PROBE_TOLERANCE,
                                   err_msg=f"critic {index}: {flat_obs[:, 0]} {flat_actions[:, 0]}")
    if algorithm == "td3" and name == "observation_action":
        chosen = np.asarray(actor.apply(state.nets.actor, obs))
        np.testing.assert_allclose(chosen, best_action(config.env_id, obs), atol=0.1)


# ---------------------------------------------------------------------------- pieces


def test_squashed_gaussian_log_density_is_a_change_of_variables():
    """log p(a) of a = tanh(u) is the Gaussian's log density of u minus log|da/du|, checked
    against a histogram of samples, and stays finite where tanh saturates."""
    mean, log_std = jnp.array([[0.3, -1.0]]), jnp.array([[0.0, -0.5]])
    noise = jax.random.normal(jax.random.PRNGKey(0), (200_000, 2))
    action, log_prob = squashed_gaussian(mean, log_std, noise)
    assert action.shape == (200_000, 2) and log_prob.shape == (200_000,)
    u = mean + jnp.exp(log_std) * noise
    normal = jax.scipy.stats.norm.logpdf(u, mean, jnp.exp(log_std)).sum(-1)
    expected = normal - jnp.log(1.0 - jnp.tanh(u) ** 2).sum(-1)
    np.testing.assert_allclose(log_prob, expected, rtol=2e-3, atol=2e-3)
    # the density of the first coordinate against a histogram of the samples
    counts, edges = np.histogram(np.asarray(action[:, 0]), bins=40, range=(-0.95, 0.95))
    centres = 0.5 * (edges[1:] + edges[:-1])
    u0 = np.arctanh(centres)
    density = (np.exp(-0.5 * (u0 - 0.3) ** 2) / np.sqrt(2 * np.pi)) / (1 - centres ** 2)
    np.testing.assert_allclose(counts / (len(action) * (edges[1] - edges[0])), density,
                               rtol=0.1, atol=0.02)
    _, extreme = squashed_gaussian(jnp.array([[30.0]]), jnp.array([[-5.0]]),
                                   jnp.zeros((1, 1)))
    assert np.isfinite(extreme).all()


def test_action_scale_maps_the_unit_box_to_the_bounds():
    spec = EnvSpec("x", (3,), False, 2, (-2.0, 0.0), (2.0, 1.0))
    scale = ActionScale.of(spec)
    unit = jnp.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(scale.to_env(unit), [[-2.0, 0.0], [0.0, 0.5], [2.0, 1.0]])
    np.testing.assert_allclose(scale.to_unit(scale.to_env(unit)), unit, atol=1e-6)


def test_td3_runs_one_actor_step_per_policy_delay_critic_steps():
    """The update's jaxpr: a scan over gradient_steps / policy_delay blocks, each holding a
    scan of policy_delay critic steps; the actor's gradient is outside the inner scan."""
    config = TD3Config(env_id="probe/constant-continuous", num_envs=1, train_frequency=1,
                       gradient_steps=6, policy_delay=3, total_timesteps=64, buffer_size=64,
                       batch_size=4, learning_starts=8, actor_hidden_sizes=(4,),
                       critic_hidden_sizes=(4,))
    learner = make_learner(config)
    # shapes only: running init op by op compiled some 60 small programs
    state = jax.eval_shape(learner.init, jax.random.PRNGKey(0))
    jaxpr = jax.make_jaxpr(lambda s: learner.advance(s, num_updates=1))(state)

    def sub_jaxprs(value):
        if isinstance(value, jax.extend.core.ClosedJaxpr):
            yield value.jaxpr
        elif isinstance(value, jax.extend.core.Jaxpr):
            yield value
        elif isinstance(value, tuple | list):
            for item in value:
                yield from sub_jaxprs(item)

    def scan_nests(jaxpr, outer=()):
        """The lengths of the scans enclosing each scan, outermost first, with its own."""
        for eqn in jaxpr.eqns:
            inner = outer
            if eqn.primitive.name == "scan":
                inner = (*outer, eqn.params["length"])
                yield inner
            for value in eqn.params.values():
                for sub in sub_jaxprs(value):
                    yield from scan_nests(sub, inner)

    nests = set(scan_nests(jaxpr.jaxpr))
    # the update scan (1), its blocks (2) and in each block the critic steps (3)
    assert (1, 2, 3) in nests, nests


# -------------------------------------------------------------------------- contract

TINY = {
    "td3": TD3Config(num_envs=2, train_frequency=2, gradient_steps=4, policy_delay=2,
                     total_timesteps=64, buffer_size=32, batch_size=8, learning_starts=16,
                     actor_hidden_sizes=(8,), critic_hidden_sizes=(8,), eval_episodes=2,
                     eval_max_steps=10),
    "sac": SACConfig(num_envs=2, train_frequency=2, gradient_steps=2, total_timesteps=64,
                     buffer_size=32, batch_size=8, learning_starts=16,
                     actor_hidden_sizes=(8,), critic_hidden_sizes=(8,), eval_episodes=2,
                     eval_max_steps=10),
}
SEGMENT = 8  # of 16 updates, the first 3 of which only collect
POPULATION = 3


def member_hypers(algorithm: str):
    config = TINY[algorithm]
    if algorithm == "td3":
        changes = [dict(actor_learning_rate=1e-3, critic_learning_rate=1e-3, gamma=0.99,
                        tau=0.005, exploration_noise=0.1, target_noise=0.2, noise_clip=0.5),
                   dict(actor_learning_rate=3e-3, critic_learning_rate=1e-2, gamma=0.9,
                        tau=0.05, exploration_noise=0.3, target_noise=0.1, noise_clip=0.2),
                   dict(actor_learning_rate=1e-4, critic_learning_rate=3e-4, gamma=0.5,
                        tau=0.5, exploration_noise=0.0, target_noise=0.0, noise_clip=0.0)]
    else:
        changes = [dict(actor_learning_rate=1e-3, critic_learning_rate=1e-3,
                        alpha_learning_rate=1e-3, gamma=0.99, tau=0.005,
                        target_entropy_scale=1.0, init_alpha=1.0),
                   dict(actor_learning_rate=3e-3, critic_learning_rate=1e-2,
                        alpha_learning_rate=1e-2, gamma=0.9, tau=0.05,
                        target_entropy_scale=0.5, init_alpha=0.2),
                   dict(actor_learning_rate=1e-4, critic_learning_rate=3e-4,
                        alpha_learning_rate=1e-4, gamma=0.5, tau=0.5,
                        target_entropy_scale=-1.0, init_alpha=0.05)]
    return [config.replace(**c).hyperparams() for c in changes]


@pytest.fixture(scope="module", params=["td3", "sac"])
def tiny(request):
    """Each program compiled once for the module: ``init`` returns its state typed as
    ``advance`` returns it, and every call passes the hyperparameters (traced) rather than
    ``None`` (the config's, as constants)."""
    algorithm = request.param
    learner = make_learner(TINY[algorithm])
    assert (learner.num_updates, TINY[algorithm].warmup_updates) == (2 * SEGMENT, 3)
    return {
        "algorithm": algorithm,
        "learner": learner,
        "hypers": TINY[algorithm].hyperparams(),
        "init": jit(learner.init),
        "advance": jit(advance := counting_traces(
            functools.partial(learner.advance, num_updates=SEGMENT))),
        "traced_advance": advance,  # its .traces: how often JAX traced it
        "population": jit(functools.partial(train_population, learner.train,
                                            chunk_size=POPULATION)),
        # one agent per chunk: a chunk size that leaves a remainder compiles the agents'
        # training twice, for the chunks and for the remainder (map_in_chunks' remainder,
        # the same for every learner, is tests/test_population.py's)
        "chunked": jit(functools.partial(train_population, learner.train, chunk_size=1)),
    }


def segmented(tiny, key, hypers):
    """One agent: init, then two segments; returns ``(state after the first, metrics)``."""
    state = tiny["init"](key, None, hypers)
    first_state, first = tiny["advance"](state, None, hypers)
    _, second = tiny["advance"](first_state, None, hypers)
    joined = jax.tree.map(lambda x, y: np.concatenate([x, y]), jax.device_get(first),
                          jax.device_get(second))
    return first_state, joined


def test_population_equals_members_trained_one_by_one_in_segments(tiny):
    """A vmapped population with per-member hyperparameters equals each member trained
    alone, in two segments (so ``train`` also equals ``init`` + ``advance`` in segments)."""
    keys = jax.random.split(jax.random.PRNGKey(3), POPULATION)
    hypers = member_hypers(tiny["algorithm"])
    together = jax.device_get(tiny["population"](keys, None, stack_hyperparams(hypers)))
    for member in range(POPULATION):
        _, alone = segmented(tiny, keys[member], hypers[member])
        for name, values in alone.items():
            np.testing.assert_allclose(together[name][member], values, rtol=1e-4, atol=1e-5,
                                       err_msg=f"member {member}: {name}")
    assert together["learning"][0].tolist() == [False] * 3 + [True] * 13
    assert np.all(together["critic_loss"][:, :3] == 0)
    assert np.all(together["critic_loss"][:, 3:] > 0)
    assert together["finite"].all()
    # the members really differ
    assert not np.allclose(together["critic_loss"][0], together["critic_loss"][1])
    if tiny["algorithm"] == "sac":
        np.testing.assert_allclose(together["alpha"][:, 3], [1.0, 0.2, 0.05], rtol=0.05)


def test_chunked_population_equals_one_vmap(tiny):
    """One agent at a time (a ``lax.map`` over chunks of one) gives the agents of one
    ``vmap`` over all three."""
    keys = jax.random.split(jax.random.PRNGKey(4), POPULATION)
    hypers = stack_hyperparams(member_hypers(tiny["algorithm"]))
    whole = tiny["population"](keys, None, hypers)
    chunked = tiny["chunked"](keys, None, hypers)
    assert_trees_equal(chunked, whole, exact=False)


def test_checkpoint_and_resume_equals_an_uninterrupted_run(tiny, tmp_path):
    """Save an agent mid-training with orbax (replay buffer, networks, optimisers,
    environments, key), restore it into a fresh process's template and continue: the same
    metrics and state as without the interruption."""
    key = jax.random.PRNGKey(5)
    hypers = member_hypers(tiny["algorithm"])[1]
    middle, uninterrupted = segmented(tiny, key, hypers)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "agent", middle)
        checkpointer.wait_until_finished()
        template = jax.eval_shape(lambda: tiny["learner"].init(key, None, hypers))
        restored = checkpointer.restore(tmp_path / "agent", template)
    # to the host: orbax places the arrays on a device explicitly ("committed"), and jit
    # compiles a function again for committed arguments
    restored = jax.device_get(restored)
    assert_trees_equal(restored, middle)
    assert int(restored.buffer.size) == 32 and int(restored.update_count) == SEGMENT
    _, resumed = tiny["advance"](restored, None, hypers)
    resumed = jax.device_get(resumed)
    for name, values in resumed.items():
        np.testing.assert_array_equal(values, uninterrupted[name][SEGMENT:], err_msg=name)
    # a fresh, an advanced and a restored state are typed alike: one compiled advance
    assert tiny["traced_advance"].traces == 1


def test_evaluate_runs_the_deterministic_policy(tiny):
    evaluate = jax.jit(tiny["learner"].evaluate)
    state = tiny["init"](jax.random.PRNGKey(0), None, tiny["hypers"])
    first = jax.device_get(evaluate(state, jax.random.PRNGKey(1)))
    assert set(first) == {"eval_return", "eval_length"}
    assert first["eval_length"] == 10  # Pendulum runs to eval_max_steps
    assert -17 * 10 <= first["eval_return"] < 0  # Pendulum's reward lies in [-16.3, 0]


@pytest.mark.parametrize("env_id", ["MountainCarContinuous-v0"])
@pytest.mark.parametrize("algorithm", ["td3", "sac"])
def test_other_continuous_environments_trace(algorithm, env_id):
    """The whole update and the evaluation trace (shapes only, nothing compiles) on
    gymnax's other continuous task (brax trains in the learning run)."""
    config = CONFIGS[algorithm](env_id=env_id, num_envs=2, train_frequency=2,
                                gradient_steps=2, total_timesteps=64, buffer_size=32,
                                batch_size=8, learning_starts=16, eval_episodes=2,
                                eval_max_steps=4)
    learner = make_learner(config)
    state = jax.eval_shape(learner.init, jax.random.PRNGKey(0))
    _, metrics = jax.eval_shape(lambda s: learner.advance(s, num_updates=2), state)
    assert metrics["episode_return"].shape == (2,)
    evaluation = jax.eval_shape(learner.evaluate, state, jax.random.PRNGKey(1))
    assert evaluation["eval_return"].shape == ()
    assert state.buffer.storage.action.shape == (32, learner.spec.action_dim)


# ------------------------------------------------------------------- mixed precision


def bfloat16_config(algorithm: str):
    """TINY with hidden layers wider than linear.SMALL_WIDTH, so the 16x16 products of the
    actor and the critics take bfloat16 operands."""
    return TINY[algorithm].replace(actor_hidden_sizes=(16, 16), critic_hidden_sizes=(16, 16),
                                   precision="bfloat16")


@pytest.fixture(scope="module", params=["td3", "sac"])
def bfloat16_trained(request):
    return request.param, *train_briefly(bfloat16_config(request.param), jit)


def test_bfloat16_trains_with_float32_parameters(bfloat16_trained):
    _, _, state, metrics = bfloat16_trained
    # networks, targets, Adam states (and SAC's temperature)
    assert_learned_in_float32(state.nets, metrics, "critic_loss")


def test_bfloat16_outputs_are_close_to_float32s(bfloat16_trained):
    """The actor's outputs and both critics' Q-values over the replay buffer's observations
    and actions, with bfloat16 operands and in float32, on the same trained parameters."""
    algorithm, learner, state, _ = bfloat16_trained
    config = bfloat16_config(algorithm)
    obs = state.buffer.storage.obs
    actions = ActionScale.of(learner.spec).to_unit(state.buffer.storage.action)
    outputs = {}
    for precision in ("bfloat16", "float32"):
        actor, critic = MODULES[algorithm].make_networks(config.replace(precision=precision),
                                                         1, 1)
        outputs[precision] = jit(lambda nets, actor=actor, critic=critic: (
            actor.apply(nets.actor, obs),
            jax.vmap(critic.apply, in_axes=(0, None, None))(nets.critic, obs, actions),
        ))(state.nets)
    leaves = jax.tree.leaves(outputs["float32"])
    assert leaves[-1].shape == (2, config.buffer_size)  # both critics
    for low, full in zip(jax.tree.leaves(outputs["bfloat16"]), leaves, strict=True):
        assert_close_to_float32(low, full)


# ------------------------------------------------------------------- learned losses


def test_the_value_distance_experiment_loads():
    config = load_experiment(Path(__file__).resolve().parents[1]
                         / "experiments" / "value_distance_td3_pendulum.toml")
    [inner] = config.inner
    assert isinstance(inner, TD3Config) and inner.env_id == "Pendulum-v1"
    assert config.objective.name == "value_distance"
    make_learner(inner, config.objective.build())  # the objective fits TD3


def test_an_objective_with_a_policy_term_does_not_fit():
    for config in (TINY["td3"], TINY["sac"]):
        with pytest.raises(ValueError, match="does not fit algorithm '(td3|sac)'.*policy"):
            make_learner(config, Objective(policy=ppo_clip()))


# ------------------------------------------------------------------------ bad input

# (algorithm, changes, the field the error must name, words it must contain)
BAD_CONFIGS = [
    ("td3", {"env_id": "CartPole-v1"}, "env_id", ["continuous", "CartPole-v1", "dqn"]),
    ("sac", {"env_id": "probe/action-discrete"}, "env_id", ["continuous"]),
    ("sac", {"env_id": "Pendulum-v9"}, "env_id", ["Pendulum-v1"]),
    ("td3", {"batch_size": 512, "buffer_size": 256, "learning_starts": 512}, "batch_size",
     ["512", "buffer_size = 256"]),
    ("sac", {"learning_starts": 32, "batch_size": 64}, "learning_starts",
     ["one batch", "64"]),
    ("td3", {"learning_starts": 20_000}, "learning_starts", ["total_timesteps"]),
    ("td3", {"policy_delay": 3}, "policy_delay", ["gradient_steps = 32"]),
    ("td3", {"policy_delay": 0}, "policy_delay", ["positive integer"]),
    ("td3", {"exploration_noise": -0.1}, "exploration_noise", [">= 0"]),
    ("sac", {"init_alpha": 0.0}, "init_alpha", ["positive"]),
    ("sac", {"alpha_learning_rate": -1.0}, "alpha_learning_rate", ["positive"]),
    ("sac", {"target_entropy_scale": float("nan")}, "target_entropy_scale", ["finite"]),
    ("td3", {"tau": 0.0}, "tau", ["(0, 1]"]),
    ("sac", {"gamma": 1.5}, "gamma", ["[0, 1]"]),
    ("td3", {"td_loss": "l1"}, "td_loss", ["l2", "huber"]),
    ("td3", {"precision": "float16"}, "precision", ["'float16'", "float32", "bfloat16"]),
    ("sac", {"precision": "half"}, "precision", ["'half'", "float32", "bfloat16"]),
    ("sac", {"actor_hidden_sizes": (64, 0)}, "actor_hidden_sizes", ["positive"]),
    ("sac", {"buffer_size": 10**12}, "replay buffers", ["smaller capacity"]),
]


@pytest.mark.parametrize(
    ("algorithm", "changes", "field", "words"), BAD_CONFIGS,
    ids=[f"{a}:" + ",".join(f"{k}={v}" for k, v in c.items()) for a, c, _, _ in BAD_CONFIGS],
)
def test_bad_config_names_the_field(algorithm, changes, field, words):
    with pytest.raises((ValueError, MemoryError)) as info:
        make_learner(CONFIGS[algorithm](**changes))
    message = str(info.value)
    assert message.startswith(f"{field}"), message
    for word in words:
        assert word in message, message


def test_experiment_table_selects_td3_and_sac_and_names_bad_fields():
    for algorithm, cls in CONFIGS.items():
        config = config_from_dict({"inner": {"algorithm": algorithm, "env_id": "Pendulum-v1",
                                             "batch_size": 64}})
        assert isinstance(config.inner[0], cls) and config.inner[0].batch_size == 64
    with pytest.raises(ConfigError, match=r"inner.batch_size: 64 is larger than the replay"):
        config_from_dict({"inner": {"algorithm": "sac", "batch_size": 64, "buffer_size": 32,
                                    "learning_starts": 64}})
    with pytest.raises(ConfigError, match=r"inner.policy_delay"):
        config_from_dict({"inner": {"algorithm": "sac", "policy_delay": 2}})
    config = config_from_dict({"inner": {"algorithm": "td3", "precision": "bfloat16"}})
    assert config.inner[0].precision == "bfloat16"
    with pytest.raises(ConfigError, match=r"inner.precision: got 'fp16'; allowed: float32, "
                                          r"bfloat16"):
        config_from_dict({"inner": {"algorithm": "sac", "precision": "fp16"}})
