"""Tests of DQN, :mod:`inner_loops.dqn`.

- Learning: a small config (3e4 environment steps, 64-64 units) on CartPole-v1, 4 seeds in
  one ``jit(vmap)``, greedy evaluation episodes at the end: median return >= 150, every seed
  above 2.5 times a random policy's. (What the default config reaches:
  ``benchmarks/studies/default_configs_learn.py``.)
- Probes: on every discrete probe environment the learned Q-values come out within a
  tolerance of the exact ones (including bootstrapping through a time limit).
- The contract: ``train`` equals ``init`` + ``advance`` in segments bit for bit; a vmapped
  population with per-member hyperparameters equals its members trained one by one, and
  trained in chunks equals one vmap; a state saved with orbax mid-training and restored
  continues as the uninterrupted run; the warm-up, epsilon and target-update schedules
  follow the update counter. (Sharded over 4 devices: ``tests/test_sharding.py``.)
- Mixed precision: with ``precision = "bfloat16"`` a tiny agent trains with finite metrics
  and float32 parameters, and its Q-values are within 1 % of float32's on the same
  parameters.
- Learned losses: an objective filling only the ``"value"`` slot trains DQN, from an
  experiment table too (``[inner] algorithm = "dqn"``) through a generation of evolution.
- Bad input, from a config or an experiment table: each a ``ValueError`` naming the field
  (a batch larger than the buffer, a warm-up shorter than one batch, continuous actions, an
  objective that does not fit DQN, ...).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _precision import assert_close_to_float32, assert_learned_in_float32, train_briefly
from _typed_states import counting_traces
from _xla import EXACT_COMPILER_OPTIONS, LEARNING_COMPILER_OPTIONS

from inner_loops import make_learner, stack_hyperparams, train_population
from inner_loops.dqn import DQNConfig, epsilon_at, make_q_network
from inner_loops.objective import LossTerm, Objective, huber, ppo_clip
from inner_loops.population import agent_state_bytes, check_population_memory
from inner_loops.probe_envs import PROBES, exact_q
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.objectives import register_objective

FAST_COMPILE = EXACT_COMPILER_OPTIONS
# Where no program's results must equal another's bit for bit (the probes, mixed
# precision, the populations): the suite's own settings, XLA's older code generation, which
# compiles a probe's program in 2.0 CPU-s instead of 3.7 with the default one.
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


def quick_jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=QUICK_COMPILE, **kwargs)


# ------------------------------------------------------------------------- learning

LEARNING_SEEDS = 4
# Smaller than the default config (which benchmarks/studies/default_configs_learn.py measures): 3e4
# steps, 64-64 units, 64 gradient steps per update of 256 steps. Over 20 seeds
# (PRNGKey(0..4), 4 each) every greedy return was between 158 and 445, medians of 4 between
# 208 and 333; with 32-32 units one seed of 4 ended at 44.
CARTPOLE = {"total_timesteps": 30_000, "buffer_size": 30_000, "hidden_sizes": (64, 64),
            "gradient_steps": 64, "target_update_interval": 64}
RANDOM_RETURN = 22.4  # a uniformly random policy on CartPole-v1, over 1e4 episodes
# Level 1 without XLA's fusion emitters: 7 s of compile CPU instead of 11, and it runs about
# as fast (4-5 s). It trains in this process: a subprocess costs some 4 CPU-s to start
# Python and JAX, and would overlap nothing, this test coming first.
LEARNING_COMPILE = {**LEARNING_COMPILER_OPTIONS, "xla_cpu_use_fusion_emitters": False}
LEARNING_TIMEOUT = 600  # seconds


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT, method="thread")
def test_cartpole_greedy_return_with_a_small_config():
    """A small config (``CARTPOLE``: 3e4 steps, 64-64 units) learns CartPole-v1: the median
    greedy return over 4 seeds is at least 150 and every seed's above 2.5 times a random
    policy's (about 22), after a warm-up that acted as a random policy does."""
    learner = make_learner(DQNConfig(**CARTPOLE))

    def run(key):
        train_key, eval_key = jax.random.split(key)
        state, metrics = learner.advance(learner.init(train_key))
        return metrics, learner.evaluate(state, eval_key)

    keys = jax.random.split(jax.random.PRNGKey(0), LEARNING_SEEDS)
    metrics, evaluation = jax.device_get(
        jax.jit(jax.vmap(run), compiler_options=LEARNING_COMPILE)(keys))
    metrics = {**metrics, **evaluation}
    greedy = metrics["eval_return"]
    print(f"DQN CartPole-v1 greedy return per seed: {greedy}; median {np.median(greedy)}")
    assert metrics["finite"].all()
    assert np.median(greedy) >= 150.0, greedy
    assert np.all(greedy > 2.5 * RANDOM_RETURN), greedy
    np.testing.assert_array_equal(metrics["eval_return"], metrics["eval_length"])
    # The warm-up (the first 4 updates, 1024 >= learning_starts steps) acts uniformly at
    # random: its ~40 episodes per seed average about a random policy's return (22.4 over
    # 1e4 episodes, 11.8 standard deviation, so about 2 for a mean of 40; those finished
    # within 128 steps are a little shorter), whatever the seed; and epsilon then decays
    # to its floor as configured.
    config = DQNConfig(**CARTPOLE)
    warmup = config.warmup_updates + 1
    assert warmup == 4
    episodes = metrics["episodes"][:, :warmup]
    returns = np.where(episodes > 0, metrics["episode_return"][:, :warmup], 0.0)
    warmup_means = (returns * episodes).sum(axis=1) / episodes.sum(axis=1)
    assert np.all(episodes.sum(axis=1) >= 30), episodes
    assert np.all((warmup_means > 15.0) & (warmup_means < 30.0)), warmup_means
    epsilon = metrics["epsilon"]
    assert np.all(epsilon[:, :warmup] == 1.0)
    assert np.all(np.diff(epsilon, axis=1) <= 0.0)
    np.testing.assert_allclose(epsilon[:, -1], config.epsilon_end, rtol=1e-5)


# ---------------------------------------------------------------------------- probes

PROBE_GAMMA = 0.5
PROBE_TOLERANCE = 0.05


@pytest.mark.parametrize("name", sorted(n for n, probe in PROBES.items() if probe.noise is None))
def test_probe_q_values_are_exact(name):
    """Acting uniformly at random (Q-learning is off-policy, so every action's value is
    learned), the Q-values of every visited observation and action come out within
    ``PROBE_TOLERANCE`` of the exact ones (on every noiseless probe: the noisy one is
    tests/test_known_answers.py's task)."""
    env_id = f"probe/{name}-discrete"
    config = DQNConfig(env_id=env_id, num_envs=4, train_frequency=1, gradient_steps=4,
                       total_timesteps=3200, buffer_size=256, batch_size=32,
                       learning_starts=64, target_update_interval=1, hidden_sizes=(16,),
                       learning_rate=3e-3, gamma=PROBE_GAMMA, tau=0.1, epsilon_start=1.0,
                       epsilon_end=1.0)
    learner = make_learner(config)
    state, metrics = quick_jit(lambda key: learner.advance(learner.init(key)))(
        jax.random.PRNGKey(0))
    assert bool(metrics["finite"].all())
    obs = np.array(PROBES[name].observations, np.float32)[:, None]
    q = np.asarray(make_q_network(config, learner.spec).apply(state.params, obs))
    exact = np.stack([exact_q(env_id, obs, np.full(len(obs), a), PROBE_GAMMA)
                      for a in (0, 1)], axis=-1)
    np.testing.assert_allclose(q, exact, atol=PROBE_TOLERANCE)


# -------------------------------------------------------------------------- contract

TINY = DQNConfig(num_envs=2, train_frequency=2, gradient_steps=2, total_timesteps=64,
                 buffer_size=32, batch_size=8, learning_starts=16, target_update_interval=2,
                 tau=1.0, hidden_sizes=(8,), epsilon_end=0.05, exploration_fraction=0.5,
                 eval_episodes=2, eval_max_steps=20)
SEGMENT = 5  # of 16 updates: segments that do not line up with the warm-up
POPULATION = 3


@pytest.fixture(scope="module")
def tiny():
    """Each program compiled once for the module: ``init`` returns its state typed as
    ``advance`` returns it and orbax restores it, and every call passes the
    hyperparameters (traced) rather than ``None`` (the config's, as constants), which the
    population's members need."""
    learner = make_learner(TINY)
    assert (learner.num_updates, TINY.warmup_updates) == (16, 3)
    return {
        "learner": learner,
        "hypers": TINY.hyperparams(),
        "train": jit(learner.train),
        "init": jit(learner.init),
        "advance": jit(advance := counting_traces(
            functools.partial(learner.advance, num_updates=SEGMENT))),
        "traced_advance": advance,  # its .traces: how often JAX traced it
        "rest": jit(functools.partial(learner.advance, num_updates=16 - 2 * SEGMENT)),
        # the populations are compared within a tolerance only: the quicker code generation
        # (their results differed from the default's by at most 6e-8 in td_loss)
        "population": quick_jit(functools.partial(train_population, learner.train,
                                                  chunk_size=POPULATION)),
        # one agent per chunk: a chunk size that leaves a remainder compiles the agents'
        # training twice, for the chunks and for the remainder (8.5 s to compile, not 3.2);
        # map_in_chunks' remainder, the same for every learner, is tests/test_population.py's
        "chunked": quick_jit(functools.partial(train_population, learner.train,
                                               chunk_size=1)),
        "evaluate": quick_jit(learner.evaluate),
    }


def assert_trees_equal(a, b):
    leaves_a, leaves_b = jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_train_equals_init_then_advance_in_segments(tiny):
    key, hypers = jax.random.PRNGKey(7), tiny["hypers"]
    whole = tiny["train"](key, None, hypers)
    state = tiny["init"](key, None, hypers)
    parts = []
    for program in ("advance", "advance", "rest"):
        state, metrics = tiny[program](state, None, hypers)
        parts.append(jax.device_get(metrics))
    assert int(state.update_count) == 16
    joined = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
    assert_trees_equal(joined, whole)
    whole = jax.device_get(whole)
    # warm-up: 3 updates only collect (12 steps < learning_starts = 16 after the 4th)
    assert whole["learning"].tolist() == [False] * 3 + [True] * 13
    assert np.all(whole["td_loss"][:3] == 0) and np.all(whole["td_loss"][3:] > 0)
    assert whole["finite"].all()
    # hard updates every 2 gradient steps, 2 per update: the target is the online network
    assert_trees_equal(state.target_params, state.params)
    assert int(state.buffer.size) == 32  # 64 steps into 32 slots


def test_epsilon_follows_the_update_counter(tiny):
    whole = jax.device_get(tiny["train"](jax.random.PRNGKey(1), None, tiny["hypers"]))
    # uniform while an update starts within the first 16 steps (updates 0-3), then linear
    # from 1.0 to 0.05 over half of the 16 updates
    expected = [1.0] * 4 + [1.0 + min(u / 8, 1.0) * (0.05 - 1.0) for u in range(4, 16)]
    np.testing.assert_allclose(whole["epsilon"], expected, rtol=1e-6)
    # decaying over 0.5 x 16 = 8 updates from 0.5 to 0.1: 0.3 at 4, 0.2 at 6
    hypers = TINY.replace(epsilon_start=0.5, epsilon_end=0.1).hyperparams()
    values = [float(epsilon_at(jnp.int32(u), hypers, TINY)) for u in (3, 4, 6, 9)]
    np.testing.assert_allclose(values, [1.0, 0.3, 0.2, 0.1], rtol=1e-6)


def member_hypers():
    return [TINY.replace(learning_rate=lr, gamma=gamma, tau=tau, epsilon_end=eps).hyperparams()
            for lr, gamma, tau, eps in ((1e-3, 0.99, 1.0, 0.05), (3e-3, 0.9, 0.5, 0.2),
                                        (1e-2, 0.5, 0.1, 0.0))]


def test_population_equals_members_trained_one_by_one(tiny):
    keys = jax.random.split(jax.random.PRNGKey(3), POPULATION)
    hypers = member_hypers()
    together = jax.device_get(tiny["population"](keys, None, stack_hyperparams(hypers)))
    for member in range(POPULATION):
        alone = jax.device_get(tiny["train"](keys[member], None, hypers[member]))
        for name, values in alone.items():
            # vmapped matrix products (and the population's code generation) may round
            # differently in the last bit
            np.testing.assert_allclose(together[name][member], values, rtol=1e-5, atol=1e-6,
                                       err_msg=name)
    # the members really differ: their own epsilon ranges and losses
    assert together["epsilon"][:, -1].tolist() == pytest.approx([0.05, 0.2, 0.0])
    assert not np.allclose(together["td_loss"][0], together["td_loss"][1])


def test_chunked_population_equals_unchunked(tiny):
    """One agent at a time (a ``lax.map`` over chunks of one) gives the agents of one
    ``vmap`` over all three."""
    keys = jax.random.split(jax.random.PRNGKey(4), POPULATION)
    hypers = stack_hyperparams(member_hypers())
    whole = jax.device_get(tiny["population"](keys, None, hypers))
    chunked = jax.device_get(tiny["chunked"](keys, None, hypers))
    assert set(chunked) == set(whole)
    for name, values in whole.items():
        assert chunked[name].shape == values.shape == (POPULATION, 16), name
        # a vmap of 1 may round its matrix products differently from a vmap of 3
        np.testing.assert_allclose(chunked[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


def test_checkpoint_and_resume_mid_training_equals_an_uninterrupted_run(tiny, tmp_path):
    """Stop after 5 of 16 updates (mid-exploration, learning started), save the whole state
    (replay buffer, optimiser, environments, key, counter) with orbax, restore it into the
    state's structure and train on: the same agent as one uninterrupted ``train``."""
    key, hypers = jax.random.PRNGKey(11), tiny["hypers"]
    whole = jax.device_get(tiny["train"](key, None, hypers))
    state, first = tiny["advance"](tiny["init"](key, None, hypers), None, hypers)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "agent", state)
        checkpointer.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = checkpointer.restore(tmp_path / "agent", abstract)
    # to the host: orbax places the arrays on a device explicitly ("committed"), and jit
    # compiles a function again for committed arguments
    restored = jax.device_get(restored)
    assert_trees_equal(restored, state)
    assert int(restored.update_count) == SEGMENT and int(restored.buffer.size) == 20
    del state
    restored, second = tiny["advance"](restored, None, hypers)
    restored, third = tiny["rest"](restored, None, hypers)
    resumed = jax.tree.map(lambda *xs: np.concatenate(xs),
                           *jax.device_get([first, second, third]))
    assert_trees_equal(resumed, whole)
    assert int(restored.update_count) == 16
    # a fresh, an advanced and a restored state are typed alike: one compiled advance
    assert tiny["traced_advance"].traces == 1


def test_evaluate_runs_greedy_episodes(tiny):
    state = tiny["init"](jax.random.PRNGKey(0), None, tiny["hypers"])
    evaluation = jax.device_get(tiny["evaluate"](state, jax.random.PRNGKey(1)))
    assert set(evaluation) == {"eval_return", "eval_length"}
    # CartPole pays 1 per step; the cap is eval_max_steps = 20
    assert evaluation["eval_return"] == evaluation["eval_length"]
    assert 1.0 <= evaluation["eval_return"] <= 20.0


# ------------------------------------------------------------------- mixed precision

# hidden layers wider than linear.SMALL_WIDTH, so the 16x16 product takes bfloat16 operands
BFLOAT16 = TINY.replace(hidden_sizes=(16, 16), precision="bfloat16")


@pytest.fixture(scope="module")
def bfloat16_trained():
    return train_briefly(BFLOAT16, quick_jit)


def test_bfloat16_trains_with_float32_parameters(bfloat16_trained):
    _, state, metrics = bfloat16_trained
    assert_learned_in_float32((state.params, state.target_params, state.opt_state), metrics,
                              "td_loss")


def test_bfloat16_q_values_are_close_to_float32s(bfloat16_trained):
    """The online network's Q-values over the replay buffer's observations, with bfloat16
    operands and in float32, on the same trained parameters."""
    learner, state, _ = bfloat16_trained
    obs = state.buffer.storage.obs
    q = {precision: quick_jit(make_q_network(BFLOAT16.replace(precision=precision),
                                             learner.spec).apply)(state.params, obs)
         for precision in ("bfloat16", "float32")}
    assert q["float32"].shape == (BFLOAT16.buffer_size, 2)
    assert_close_to_float32(q["bfloat16"], q["float32"])


# ------------------------------------------------------------------- learned losses


def _scaled_l2(meta_params, inputs):
    return 0.5 * jnp.mean(jnp.square(inputs.values - inputs.targets)) * jnp.exp(
        meta_params["log_scale"][0])


@register_objective("test_value_only_scaled_l2", slots=("value",))
def _value_only_objective() -> Objective:
    """A learnable scale of the L2 TD loss: fills only the ``"value"`` slot."""
    return Objective(value=LossTerm("scaled_l2", lambda key: {"log_scale": jnp.zeros(1)},
                                    _scaled_l2))


def test_an_objective_with_a_policy_term_does_not_fit_dqn():
    with pytest.raises(ValueError, match="does not fit algorithm 'dqn'.*policy"):
        make_learner(TINY, Objective(policy=ppo_clip()))


def test_experiment_table_builds_dqn_and_evolves_a_value_loss(tmp_path):
    """``[inner] algorithm = "dqn"`` with a value-only learned objective: one generation of
    evolution trains DQN agents and scores every candidate."""
    from metarl.kinds import start

    inner = {"algorithm": "dqn", "num_envs": 2, "train_frequency": 2, "gradient_steps": 1,
             "total_timesteps": 64, "buffer_size": 32, "batch_size": 8, "learning_starts": 16,
             "hidden_sizes": [8]}
    config = config_from_dict({
        "objective": {"name": "test_value_only_scaled_l2"},
        "inner": inner,
        "es": {"population_size": 2, "generations": 1},
        "fitness": {"seeds_per_candidate": 2},
        "run": {"progress": False},
    })
    assert isinstance(config.inner[0], DQNConfig) and config.inner[0].batch_size == 8
    result = start(config, tmp_path / "run")
    line = result.history[0]
    assert np.isfinite(line["mean_fitness"]), line
    with pytest.raises(ConfigError, match=r"inner.batch_size: 64 is larger than the replay"):
        config_from_dict({"objective": {"name": "test_value_only_scaled_l2"},
                          "inner": {**inner, "batch_size": 64}})


def test_the_dqn_value_distance_experiment_loads_and_validates():
    """``experiments/value_distance_dqn_cartpole.toml``: the learned value distance in DQN's
    ``"value"`` slot on CartPole, CPU-sized, compared with the L2 and Huber baselines. Its
    learner builds (environment, objective and algorithm fit) without compiling."""
    from metarl.evolve.evaluate import default_baselines
    from metarl.evolve.generation import build_learner
    from metarl.kinds import load_experiment

    path = Path(__file__).parents[1] / "experiments" / "value_distance_dqn_cartpole.toml"
    config = load_experiment(path)
    assert config.name == path.stem
    assert config_from_dict(config.to_dict()) == config
    [inner] = config.inner
    assert isinstance(inner, DQNConfig) and inner.env_id == "CartPole-v1"
    assert config.objective.name == "value_distance"
    learner = build_learner(inner, config.objective.build())
    assert learner.algorithm == "dqn" and learner.objective.slots == ("value",)
    assert default_baselines(config.objective.name, inner) == ["l2", "huber"]
    # CPU-sized: a generation trains 16 agents of at most 5e4 steps
    assert config.es.population_size * config.fitness.seeds_per_candidate <= 16
    assert learner.steps_per_agent <= 50_000 and config.es.generations <= 5


# ------------------------------------------------------------------------ bad input

# (changes to the defaults, the field the error must name, words it must contain)
BAD_CONFIGS = [
    ({"batch_size": 512, "buffer_size": 256}, "batch_size", ["512", "buffer_size = 256"]),
    ({"learning_starts": 32, "batch_size": 64}, "learning_starts", ["one batch", "64"]),
    ({"learning_starts": 100_000}, "learning_starts", ["total_timesteps"]),
    ({"buffer_size": 4, "batch_size": 2}, "buffer_size", ["num_envs = 8"]),
    ({"total_timesteps": 200}, "total_timesteps", ["num_envs * train_frequency = 256"]),
    ({"td_loss": "l1"}, "td_loss", ["l2", "huber"]),
    ({"activation": "gelu"}, "activation", ["tanh", "relu"]),
    ({"precision": "float16"}, "precision", ["'float16'", "float32", "bfloat16"]),
    ({"tau": 0.0}, "tau", ["(0, 1]"]),
    ({"gamma": 1.5}, "gamma", ["[0, 1]"]),
    ({"epsilon_end": -0.1}, "epsilon_end", ["[0, 1]"]),
    ({"learning_rate": 0.0}, "learning_rate", ["positive"]),
    ({"gradient_steps": 0}, "gradient_steps", ["positive integer"]),
    ({"target_update_interval": 1.5}, "target_update_interval", ["positive integer"]),
    ({"double_dqn": "yes"}, "double_dqn", ["true or false"]),
    ({"eval_max_steps": 0}, "eval_max_steps", ["positive integer"]),
    ({"hidden_sizes": (64, 0)}, "hidden_sizes", ["positive"]),
    ({"env_id": "Pendulum-v1"}, "env_id", ["discrete", "Pendulum-v1", "td3 or sac"]),
    ({"env_id": "probe/action-continuous"}, "env_id", ["discrete"]),
    ({"env_id": "CartPole-v9"}, "env_id", ["CartPole-v1", "probe/constant-discrete"]),
    ({"buffer_size": 10**12, "learning_starts": 1000}, "replay buffers", ["smaller capacity"]),
]


@pytest.mark.parametrize(
    ("changes", "field", "words"), BAD_CONFIGS,
    ids=[",".join(f"{k}={v}" for k, v in changes.items()) for changes, _, _ in BAD_CONFIGS],
)
def test_bad_config_names_the_field(changes, field, words):
    with pytest.raises((ValueError, MemoryError)) as info:
        make_learner(DQNConfig(**changes))
    message = str(info.value)
    assert message.startswith(f"{field}"), message
    for word in words:
        assert word in message, message


# an experiment table with [inner] algorithm = "dqn": (changes, ConfigError message start)
BAD_TABLES = [
    ({"objective": {"name": "lpo"}}, "objective.name: objective 'lpo' does not fit algorithm "
     "'dqn': it fills the policy loss slot(s), which dqn does not have (its slots: value)"),
    ({"objective": {"name": "ppo"}}, "objective.name: objective 'ppo' does not fit algorithm "
     "'dqn'"),
    ({"inner": {"env_id": "Pendulum-v1"}}, "inner.env_id: DQN needs discrete actions but "
     "Pendulum-v1 has continuous ones"),
    ({"inner": {"env_id": "MountainCarContinuous-v0"}}, "inner.env_id: DQN needs discrete"),
    ({"inner": {"batch_size": 512, "buffer_size": 256}},
     "inner.batch_size: 512 is larger than the replay capacity (buffer_size = 256)"),
    ({"inner": {"learning_starts": 63}},
     "inner.learning_starts: 63 is less than one batch (batch_size = 64)"),
    ({"inner": {"num_steps": 128}}, "inner.num_steps: unknown field"),
    ({"inner": {"precision": "fp16"}},
     "inner.precision: got 'fp16'; allowed: float32, bfloat16"),
]


@pytest.mark.parametrize(("changes", "message"), BAD_TABLES,
                         ids=[message.split(":")[0] + f"-{i}"
                              for i, (_, message) in enumerate(BAD_TABLES)])
def test_bad_experiment_tables_for_dqn_name_the_field(changes, message):
    """From an experiment file, loading checks the config's own values and building the
    learner (before any training) what needs the environment or the objective."""
    from metarl.evolve.generation import build_learner

    data = {"objective": {"name": "value_distance"}, **changes,
            "inner": {"algorithm": "dqn", **changes.get("inner", {})}}
    with pytest.raises(ConfigError) as info:
        config = config_from_dict(data)
        build_learner(config.inner[0], config.objective.build())
    assert str(info.value).startswith(message), str(info.value)


def test_an_objective_for_other_algorithms_only_does_not_fit_dqn():
    """A value-only objective that lists only PPO among its algorithms."""
    objective = dataclasses.replace(Objective(value=huber()), algorithms=("ppo",))
    with pytest.raises(ValueError, match="does not fit algorithm 'dqn': it applies to ppo only"):
        make_learner(TINY, objective)


def test_population_memory_is_known_before_allocating(tiny, compilations):
    """A DQN agent's state is dominated by its buffer (32 CartPole transitions of 41 bytes
    here); the check counts the agents one device holds at once and names the options."""
    learner = tiny["learner"]
    before = compilations.count()
    per_agent = agent_state_bytes(learner)
    assert compilations.count() == before  # shapes only
    assert 32 * 41 < per_agent < 32 * 41 + 20_000
    assert check_population_memory(learner, 64, chunk_size=8, available=10**9) == 8 * per_agent
    assert check_population_memory(learner, 64, chunk_size=64, num_devices=4,
                                   available=10**9) == 16 * per_agent
    with pytest.raises(MemoryError) as info:
        check_population_memory(learner, 64, chunk_size=64, available=20 * per_agent)
    message = str(info.value)
    for words in ("64 agents at once", "buffer_size", "chunk_size (at most 16 agents",
                  "more devices"):
        assert words in message, message
