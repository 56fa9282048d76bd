"""Tests of the XLand-MiniGrid, Craftax, NAVIX and Jumanji environments of the adapter
(:mod:`inner_loops.jax_envs`).

Each family is stepped by one jitted, vmapped rollout of a random policy, built once per
module (per id for Jumanji); the tests read its arrays: shapes and finiteness, how episodes
end (termination vs. truncation, the fresh start after an end), and the random policy's
return, which PPO must beat on MiniGrid-Empty-5x5, on NAVIX's Empty-5x5, on Jumanji's
SlidingTilePuzzle (whose dense reward pays for tiles put in place) and on Craftax-Classic with
episodes of 32 steps. Craftax's learning check is the dearest here: its step compiles slowly
(world generation, its reset, much less so: 2.5 of the random rollout's 17 CPU-s of compile)
and runs slowly, drawing a fresh world for every step of every copy (PPO's presampled
resets). It compares PPO with its own untrained first update rather than with a random
rollout of its 32-step episodes, and is compiled at the learning checks' XLA settings:
8 + 46 CPU-s to trace and compile, 15 to run, against 10 + 28 and 79 at the suite's.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _xla import LEARNING_COMPILER_OPTIONS

from inner_loops import PPOConfig, make_env, make_train, make_vec_env
from inner_loops.envs import EnvNoise
from inner_loops.jax_envs import craftax_ids, jumanji_ids, navix_ids, xminigrid_ids

pytest.importorskip("xminigrid")
pytest.importorskip("craftax")
pytest.importorskip("navix")
pytest.importorskip("jumanji")

XMINIGRID_ID = "xminigrid/MiniGrid-Empty-5x5"
CRAFTAX_ID = "craftax/Craftax-Classic-Symbolic-v1"
XMINIGRID_TIME_LIMIT = 30
CRAFTAX_TIME_LIMIT = 12
NUM_ENVS = 32
NUM_STEPS = 90
GAMMA = jnp.asarray(0.99)
# The 7 x 7 view of MiniGrid, each cell one-hot over 13 tiles and 12 colours.
XMINIGRID_OBS_SIZE = 7 * 7 * (13 + 12)
CRAFTAX_OBS_SIZE = 1345
NAVIX_ID = "navix/Navix-Empty-5x5-v0"
NAVIX_TIME_LIMIT = 30
# The whole 5 x 5 grid, each cell's entity (11 kinds), colour (6) and state (4) one-hot.
NAVIX_OBS_SIZE = 5 * 5 * (11 + 6 + 4)
# Maze: walls, the agent's and the target's cells one-hot, over 10 x 10 cells; Snake: its
# 12 x 12 grid of 5 feature maps; SlidingTilePuzzle: each of 5 x 5 cells' tile one-hot.
JUMANJI_OBS_SIZES = {"jumanji/Maze-v0": 3 * 10 * 10, "jumanji/Snake-v1": 12 * 12 * 5,
                     "jumanji/SlidingTilePuzzle-v0": 5 * 5 * 25}
# Each task's random rollout: (time limit, copies, steps). Maze and Snake cut episodes at 6
# steps, so that a few steps see the limit; SlidingTilePuzzle has its learning check's
# 32-step episodes, whose random return PPO must beat (a random policy never solves it, so
# every episode runs into the limit).
JUMANJI_ROLLOUTS = {"jumanji/Maze-v0": (6, 8, 24), "jumanji/Snake-v1": (6, 8, 24),
                    "jumanji/SlidingTilePuzzle-v0": (32, 64, 64)}


def episode_returns(reward: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Returns of the episodes that ended in ``reward, done [T, N]`` (started at ``t = 0``)."""
    returns, running = [], np.zeros(reward.shape[1])
    for t in range(reward.shape[0]):
        running = running + reward[t]
        returns.extend(running[done[t]])
        running = np.where(done[t], 0.0, running)
    return np.asarray(returns)


def random_rollout(env_id: str, env_params: dict, num_envs: int,
                   num_steps: int) -> dict[str, np.ndarray]:
    """A random policy on ``num_envs`` copies of ``env_id`` for ``num_steps`` steps, in one
    jitted program: arrays ``[num_steps, num_envs, ...]``, plus ``first_obs [num_envs, obs]``."""
    vec_env = make_vec_env(env_id, num_envs, env_params=env_params)

    @jax.jit
    def run(key):
        reset_key, key = jax.random.split(key)
        first_obs, state = vec_env.reset(reset_key)

        def body(state, step_key):
            action_key, env_key = jax.random.split(step_key)
            actions = jax.random.randint(action_key, (num_envs,), 0, vec_env.spec.action_dim)
            out = vec_env.step(env_key, state, actions, GAMMA)
            return out.state, {"obs": out.obs, "reward": out.raw_reward,
                               "terminated": out.terminated, "truncated": out.truncated,
                               "final_obs": out.final_obs}

        _, out = jax.lax.scan(body, state, jax.random.split(key, num_steps))
        return {**out, "first_obs": first_obs}

    return jax.device_get(run(jax.random.PRNGKey(0)))


def episode_lengths(terminated: np.ndarray, truncated: np.ndarray) -> tuple[np.ndarray, ...]:
    """Lengths of the episodes that ended by termination and by truncation in
    ``terminated, truncated [T, N]`` (each copy started at ``t = 0``)."""
    by_termination, by_truncation = [], []
    for n in range(terminated.shape[1]):
        ends = np.flatnonzero(terminated[:, n] | truncated[:, n])
        lengths = np.diff(np.concatenate([[-1], ends]))
        by_termination.append(lengths[terminated[ends, n]])
        by_truncation.append(lengths[truncated[ends, n]])
    return np.concatenate(by_termination), np.concatenate(by_truncation)


def ppo_returns(env_id: str, env_params: dict, learning_rate: float,
                total_timesteps: int = 8192, compiler_options=None) -> tuple[float, float]:
    """``(first, final)`` of a tiny PPO run (key 0): the mean episode return of its first
    update (the untrained policy, whose head starts at 0.01 of the usual scale, so within a
    percent of uniform) and over its last two updates. 16 copies, 32-step rollouts, one
    hidden layer of 32 units, gamma 0.95. Compiled at the suite's XLA settings unless
    ``compiler_options`` are given."""
    config = PPOConfig(env_id=env_id, env_params=env_params, num_envs=16, num_steps=32,
                       total_timesteps=total_timesteps, hidden_sizes=(32,),
                       learning_rate=learning_rate, gamma=0.95)
    key = jax.random.PRNGKey(0)
    train = jax.jit(make_train(config))
    if compiler_options is not None:
        train = train.lower(key).compile(compiler_options)
    returns = jax.device_get(train(key))["episode_return"]
    return float(returns[0]), float(np.mean(returns[-2:]))


@pytest.fixture(scope="module")
def xminigrid_rollout() -> dict[str, np.ndarray]:
    """A random policy on ``NUM_ENVS`` copies of MiniGrid-Empty-5x5 for ``NUM_STEPS`` steps."""
    return random_rollout(XMINIGRID_ID, {"max_steps": XMINIGRID_TIME_LIMIT}, NUM_ENVS,
                          NUM_STEPS)


@pytest.fixture(scope="module")
def navix_rollout() -> dict[str, np.ndarray]:
    """A random policy on ``NUM_ENVS`` copies of NAVIX's Empty-5x5 for ``NUM_STEPS`` steps."""
    return random_rollout(NAVIX_ID, {"max_steps": NAVIX_TIME_LIMIT}, NUM_ENVS, NUM_STEPS)


@functools.cache
def jumanji_random_rollout(env_id: str) -> dict[str, np.ndarray]:
    """A random policy on Jumanji's ``env_id`` as ``JUMANJI_ROLLOUTS`` says, made once for
    the tests of its stepping and its learning check."""
    time_limit, num_envs, num_steps = JUMANJI_ROLLOUTS[env_id]
    return random_rollout(env_id, {"time_limit": time_limit}, num_envs, num_steps)


@pytest.fixture(scope="module", params=list(JUMANJI_OBS_SIZES))
def jumanji_rollout(request) -> tuple[str, dict[str, np.ndarray]]:
    """``(env_id, rollout)``: :func:`jumanji_random_rollout` of each Jumanji task."""
    return request.param, jumanji_random_rollout(request.param)


@pytest.fixture(scope="module")
def craftax_rollout() -> dict[str, np.ndarray]:
    """A random policy on two copies of Craftax-Classic for ``2 * CRAFTAX_TIME_LIMIT`` steps;
    copy 0's player is killed (health set to 0) before step 5. Every ending episode restarts
    from the first reset, so the program compiles Craftax's world generation once."""
    num_envs, num_steps = 2, 2 * CRAFTAX_TIME_LIMIT
    vec_env = make_vec_env(CRAFTAX_ID, num_envs,
                           env_params={"max_timesteps": CRAFTAX_TIME_LIMIT})

    @jax.jit
    def run(key):
        reset_key, key = jax.random.split(key)
        first_obs, state = vec_env.reset(reset_key)
        fresh_state = state.env_state

        def body(state, inputs):
            step_key, t = inputs
            action_key, env_key = jax.random.split(step_key)
            kill = jnp.logical_and(t == 5, jnp.arange(num_envs) == 0)
            env_state = state.env_state
            env_state = env_state.replace(
                player_health=jnp.where(kill, 0, env_state.player_health))
            state = state.replace(env_state=env_state)
            actions = jax.random.randint(action_key, (num_envs,), 0, vec_env.spec.action_dim)
            noise = EnvNoise(jax.random.split(env_key, num_envs), first_obs, fresh_state)
            out = vec_env.step(env_key, state, actions, GAMMA, noise)
            return out.state, {"obs": out.obs, "reward": out.raw_reward,
                               "terminated": out.terminated, "truncated": out.truncated}

        _, out = jax.lax.scan(body, state,
                              (jax.random.split(key, num_steps), jnp.arange(num_steps)))
        return {**out, "first_obs": first_obs}

    return jax.device_get(run(jax.random.PRNGKey(0)))


# --------------------------------------------------------------------------- ids and specs


def test_specs_and_ids():
    spec = make_env(XMINIGRID_ID, {"max_steps": XMINIGRID_TIME_LIMIT}).spec
    assert spec.obs_shape == (XMINIGRID_OBS_SIZE,)
    assert (spec.discrete, spec.action_dim, spec.max_episode_steps) == (
        True, 6, XMINIGRID_TIME_LIMIT)
    spec = make_env(CRAFTAX_ID).spec
    assert spec.obs_shape == (CRAFTAX_OBS_SIZE,)
    assert (spec.discrete, spec.action_dim, spec.max_episode_steps) == (True, 17, 10000)
    # available_envs() adds these lists to gymnax's and brax's (whose import costs 1.5 CPU-s)
    assert XMINIGRID_ID in xminigrid_ids() and "xminigrid/MiniGrid-DoorKey-8x8" in xminigrid_ids()
    assert not any("XLand" in env_id for env_id in xminigrid_ids())
    assert craftax_ids() == [CRAFTAX_ID]
    spec = make_env(NAVIX_ID).spec
    assert spec.obs_shape == (NAVIX_OBS_SIZE,)
    # left, right, forward, pick up, drop, toggle, done; navix.make's time limit
    assert (spec.discrete, spec.action_dim, spec.max_episode_steps) == (True, 7, 100)
    assert make_env("navix/Navix-DoorKey-8x8-v0").spec.obs_shape == (8 * 8 * 21,)
    assert NAVIX_ID in navix_ids() and "navix/Navix-FourRooms-v0" in navix_ids()
    # Up, right, down, left; each task's own time limit
    for (env_id, size), time_limit in zip(JUMANJI_OBS_SIZES.items(), (100, 4000, 500),
                                          strict=True):
        spec = make_env(env_id).spec
        assert spec.obs_shape == (size,)
        assert (spec.discrete, spec.action_dim, spec.max_episode_steps) == (
            True, 4, time_limit)
    assert jumanji_ids() == list(JUMANJI_OBS_SIZES)


@pytest.mark.parametrize("env_id, message", [
    ("xminigrid/MiniGrid-Nowhere", "xminigrid/MiniGrid-Empty-5x5"),
    ("xminigrid/XLand-MiniGrid-R1-9x9", "trivial-21k, small-1m"),
    ("xminigrid/XLand-MiniGrid-R1-9x9/no-such-benchmark", "trivial-21k, small-1m"),
    ("xminigrid/MiniGrid-Empty-5x5/trivial-21k", "only XLand-MiniGrid"),
    ("craftax/Craftax-Classic-Pixels-v1", "pixel observations"),
    ("navix/Navix-Nowhere-v0", "navix/Navix-Empty-5x5-v0"),
    ("navix/Navix-Empty-5x5", "navix/Navix-Empty-5x5-v0"),
    ("jumanji/Cleaner-v0", "jumanji/Maze-v0, jumanji/Snake-v1, jumanji/SlidingTilePuzzle-v0"),
    ("jumanji/Tetris-v0", "multi-agent tasks"),
])
def test_unsupported_ids_say_what_is_allowed(env_id, message):
    with pytest.raises(ValueError, match=message):
        make_env(env_id)


@pytest.mark.parametrize("env_id, env_params, message", [
    (XMINIGRID_ID, {"height": 6}, "allowed: max_steps, view_size"),
    (XMINIGRID_ID, {"max_steps": 0}, "positive integer"),
    (CRAFTAX_ID, {"gravity": 1.0}, "max_timesteps"),
    (NAVIX_ID, {"height": 6}, "allowed: max_steps"),
    (NAVIX_ID, {"max_steps": 2.5}, "positive integer"),
    ("jumanji/Maze-v0", {"max_steps": 10}, "allowed: time_limit"),
    ("jumanji/Snake-v1", {"time_limit": 0}, "positive integer"),
])
def test_bad_env_params_name_the_parameter(env_id, env_params, message):
    with pytest.raises(ValueError, match=message):
        make_env(env_id, env_params)


def test_packages_load_lazily_and_a_missing_one_names_its_extra():
    # one subprocess for both checks: a fresh interpreter costs a second or two of CPU
    packages = {"craftax": CRAFTAX_ID, "navix": NAVIX_ID, "jumanji": "jumanji/Maze-v0"}
    # what gymnax imports for drawing alone is imported on first use only
    code = ("import sys, metarl, inner_loops; inner_loops.make_env('CartPole-v1')\n"
            "print(sorted({'xminigrid', 'craftax', 'navix', 'jumanji', 'seaborn', 'pandas',"
            " 'matplotlib.pyplot'} & set(sys.modules)))\n"
            f"for package, env_id in {packages!r}.items():\n"
            "    sys.modules[package] = None\n"
            "    try:\n        inner_loops.make_env(env_id)\n"
            "    except ValueError as error:\n        print(error)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    imported, *errors = out.stdout.splitlines()
    assert imported == "[]"
    assert len(errors) == len(packages)
    for package, error in zip(packages, errors, strict=True):
        assert f'pip install "metarl[{package}]"' in error


def test_a_module_deferred_while_gymnax_imports_is_the_real_one_on_first_use():
    from inner_loops.envs import _ImportedOnFirstUse

    stand_in = _ImportedOnFirstUse("colorsys")
    assert stand_in.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert stand_in.rgb_to_hsv is __import__("colorsys").rgb_to_hsv


# --------------------------------------------------------------------------- xminigrid


def test_xminigrid_observations_are_one_hot_cells(xminigrid_rollout):
    obs = xminigrid_rollout["obs"]
    assert obs.shape == (NUM_STEPS, NUM_ENVS, XMINIGRID_OBS_SIZE)
    assert obs.dtype == np.float32
    cells = obs.reshape(NUM_STEPS, NUM_ENVS, 7 * 7, 13 + 12)
    # one tile and one colour per cell
    np.testing.assert_array_equal(cells[..., :13].sum(-1), 1.0)
    np.testing.assert_array_equal(cells[..., 13:].sum(-1), 1.0)


def assert_goal_terminates_and_the_limit_truncates(out, time_limit):
    """A random rollout ``out`` of a goal task: each step ends its episode one way at most,
    both ways happen, the time limit truncates at exactly ``time_limit`` steps and the goal
    ends episodes sooner."""
    terminated, truncated = out["terminated"], out["truncated"]
    assert np.isfinite(out["reward"]).all()
    assert not (terminated & truncated).any()
    assert terminated.any() and truncated.any()
    by_termination, by_truncation = episode_lengths(terminated, truncated)
    np.testing.assert_array_equal(by_truncation, time_limit)
    assert (by_termination < time_limit).all()


def test_xminigrid_goal_terminates_and_the_step_limit_truncates(xminigrid_rollout):
    assert_goal_terminates_and_the_limit_truncates(xminigrid_rollout, XMINIGRID_TIME_LIMIT)
    # only reaching the goal pays (1 - 0.9 * steps / limit), and it ends the episode
    np.testing.assert_array_equal(xminigrid_rollout["reward"] > 0,
                                  xminigrid_rollout["terminated"])


@pytest.mark.parametrize("rollout", ["xminigrid_rollout", "navix_rollout"])
def test_ended_episodes_restart_with_final_obs_kept(rollout, request):
    out = request.getfixturevalue(rollout)
    done = out["terminated"] | out["truncated"]
    # an Empty layout (xminigrid's and NAVIX's) always starts in the same corner, facing the
    # same way
    np.testing.assert_array_equal(out["obs"][done], np.broadcast_to(
        out["first_obs"][0], out["obs"][done].shape))
    np.testing.assert_array_equal(out["obs"][~done], out["final_obs"][~done])
    reached = out["terminated"]  # the goal is never where an episode starts
    assert (out["obs"][reached] != out["final_obs"][reached]).any(axis=-1).all()


def test_ppo_beats_a_random_policy_on_minigrid_empty(xminigrid_rollout):
    """Calibration (this config, keys 0-5, jax 0.9.2 and the suite's XLA flags on the CPU):
    mean episode return over the last two updates 0.83, 0.82, 0.81, 0.81, 0.85, 0.85 after
    8192 steps (0.95 is the best possible); a random policy's 0.028-0.038 (keys 0-2, 64
    copies for 400 steps: 9% of its episodes reach the goal within 30 steps)."""
    random_return = episode_returns(
        xminigrid_rollout["reward"],
        xminigrid_rollout["terminated"] | xminigrid_rollout["truncated"]).mean()
    assert random_return < 0.1
    _, final = ppo_returns(XMINIGRID_ID, {"max_steps": XMINIGRID_TIME_LIMIT}, 2.5e-3)
    assert final > max(0.4, 5 * random_return), (final, random_return)


def write_stand_in_benchmark(folder, name: str, tiles: list[np.ndarray]) -> None:
    """A stand-in for xminigrid's benchmark ``name`` (whose real file needs a download) in
    ``folder``: one ruleset per tile of ``tiles``, "hold that tile", the tile placed in the
    room at reset, no rules."""
    from xminigrid import benchmarks
    from xminigrid.core.goals import AgentHoldGoal
    from xminigrid.core.rules import EmptyRule

    benchmarks.save_bz2_pickle({
        "goals": np.stack([np.asarray(AgentHoldGoal(tile=tile).encode()) for tile in tiles]),
        "rules": np.stack([np.asarray(EmptyRule().encode())[None]] * len(tiles)),
        "init_tiles": np.stack([tile[None] for tile in tiles]),
        "num_rules": np.zeros(len(tiles), np.uint8),
    }, str(folder / benchmarks.NAME2HFFILENAME[name]))


def drawn_goals(env_id: str, env_params: dict, copies: int) -> tuple[np.ndarray, ...]:
    """``(goals, grids)`` of ``copies`` fresh episodes of ``env_id``: each one's goal
    encoding and its first grid."""
    vec_env = make_vec_env(env_id, copies, env_params=env_params)

    @jax.jit
    def reset(key):
        start = vec_env.reset(key)[1].env_state.state
        return start.goal_encoding, start.grid

    return jax.device_get(reset(jax.random.PRNGKey(0)))


def test_xland_episodes_draw_their_tasks_from_a_benchmark(tmp_path, monkeypatch):
    """A two-task stand-in for xminigrid's trivial-21k file (which needs a download): hold
    the red ball, or hold the blue square; each placed in the room at reset."""
    from xminigrid import benchmarks
    from xminigrid.core.constants import TILES_REGISTRY, Colors, Tiles

    env_id = "xminigrid/XLand-MiniGrid-R1-9x9/trivial-21k"
    monkeypatch.setattr(benchmarks, "DATA_PATH", str(tmp_path))
    with pytest.raises(ValueError, match="xminigrid.load_benchmark"):
        make_env(env_id)
    tiles = [np.asarray(TILES_REGISTRY[Tiles.BALL, Colors.RED]),
             np.asarray(TILES_REGISTRY[Tiles.SQUARE, Colors.BLUE])]
    write_stand_in_benchmark(tmp_path, "trivial-21k", tiles)
    assert env_id in xminigrid_ids()
    vec_env = make_vec_env(env_id, 16)
    # XLand's view is 5 x 5 cells
    assert vec_env.spec.obs_shape == (5 * 5 * (13 + 12),)

    @jax.jit
    def reset_and_step(key):
        obs, state = vec_env.reset(key)
        out = vec_env.step(key, state, jnp.zeros(16, jnp.int32), GAMMA)
        start = state.env_state.state
        return start.goal_encoding, start.grid, out.obs, out.terminated

    goals, grids, next_obs, terminated = jax.device_get(reset_and_step(jax.random.PRNGKey(0)))
    assert np.isfinite(next_obs).all() and not terminated.any()
    # each copy's task is one of the two, and both are drawn
    held = goals[:, 1:3]
    assert {tuple(tile) for tile in held} == {tuple(tile) for tile in tiles}
    # the object to hold lies in the room
    for tile, grid in zip(held, grids, strict=True):
        assert (grid == tile).all(axis=-1).sum() == 1


def test_xland_rulesets_split_into_disjoint_train_and_test_parts(tmp_path, monkeypatch):
    """A ten-task stand-in (five objects in two colours) split 8 / 2 by the fixed order of
    :func:`~inner_loops.jax_envs.ruleset_split`: episodes of the train part draw only its
    tasks, those of the test part only the others, and every task of each part is drawn."""
    from xminigrid import benchmarks
    from xminigrid.core.constants import TILES_REGISTRY, Colors, Tiles

    from inner_loops.jax_envs import ruleset_split

    monkeypatch.setattr(benchmarks, "DATA_PATH", str(tmp_path))
    tiles = [np.asarray(TILES_REGISTRY[tile, colour])
             for tile in (Tiles.BALL, Tiles.SQUARE, Tiles.PYRAMID, Tiles.KEY, Tiles.STAR)
             for colour in (Colors.RED, Colors.BLUE)]
    write_stand_in_benchmark(tmp_path, "small-1m", tiles)
    env_id = "xminigrid/XLand-MiniGrid-R1-9x9/small-1m"
    parts = {part: ruleset_split(len(tiles), part) for part in ("train", "test")}
    assert [len(parts["train"]), len(parts["test"])] == [8, 2]
    assert not set(parts["train"]) & set(parts["test"])
    assert sorted([*parts["train"], *parts["test"]]) == list(range(len(tiles)))
    # a fixed order: the same split every time, another for another split_seed
    np.testing.assert_array_equal(ruleset_split(len(tiles), "train"), parts["train"])
    assert list(ruleset_split(len(tiles), "train", split_seed=1)) != list(parts["train"])
    assert len(ruleset_split(len(tiles), "test", train_fraction=0.5)) == 5
    for part, flag in (("train", "train_rulesets"), ("test", "test_rulesets")):
        goals, _ = drawn_goals(env_id, {flag: True}, 64)
        held = {tuple(tile) for tile in goals[:, 1:3]}
        assert held == {tuple(tiles[i]) for i in parts[part]}, part
    goals, _ = drawn_goals(env_id, {}, 64)  # no split: every ruleset
    assert {tuple(tile) for tile in goals[:, 1:3]} == {tuple(tile) for tile in tiles}


@pytest.mark.parametrize("env_params, message", [
    ({"train_rulesets": True, "test_rulesets": True}, "env_params.test_rulesets: .*not both"),
    ({"test_rulesets": 1}, "env_params.test_rulesets: expected true or false"),
    ({"train_fraction": 0.5}, "env_params.train_fraction: only with"),
    ({"split_seed": 2}, "env_params.split_seed: only with"),
    ({"train_rulesets": True, "train_fraction": 1.0}, "env_params.train_fraction: expected a "
                                                      "number strictly between 0 and 1"),
    ({"test_rulesets": True, "train_fraction": 0.01}, "env_params.train_fraction: .*empty"),
    ({"test_rulesets": True, "split_seed": -1}, "env_params.split_seed"),
])
def test_bad_xland_split_params_name_the_parameter(tmp_path, monkeypatch, env_params, message):
    from xminigrid import benchmarks
    from xminigrid.core.constants import TILES_REGISTRY, Colors, Tiles

    monkeypatch.setattr(benchmarks, "DATA_PATH", str(tmp_path))
    write_stand_in_benchmark(tmp_path, "medium-1m", [
        np.asarray(TILES_REGISTRY[Tiles.BALL, colour]) for colour in (Colors.RED, Colors.BLUE)])
    with pytest.raises(ValueError, match=message):
        make_env("xminigrid/XLand-MiniGrid-R1-9x9/medium-1m", env_params)


def test_an_xland_split_trains_on_one_part_and_holds_out_the_other():
    """In an experiment the two parts are two tasks of one env_id: labelled apart, and a
    bad split named by the entry's path when the learners are built."""
    from metarl.config import ConfigError
    from metarl.evolve.config import config_from_dict
    from metarl.evolve.generation import build_learner

    env_id = "xminigrid/XLand-MiniGrid-R1-9x9/trivial-21k"
    config = config_from_dict({
        "inner": {"env_id": env_id, "env_params": {"train_rulesets": True}},
        "held_out": {"env_id": env_id, "env_params": {"test_rulesets": True,
                                                      "train_fraction": 0.5}}})
    assert config.task_labels == (f"{env_id}[train_rulesets=true]",)
    assert config.held_out_labels == (f"{env_id}[test_rulesets=true,train_fraction=0.5]",)
    with pytest.raises(ConfigError, match="held_out.env_params.train_fraction"):
        build_learner(config.held_out[0].replace(env_params={"train_fraction": 0.5}),
                      path="held_out")


# --------------------------------------------------------------------------- craftax


def test_craftax_steps_under_jit_and_vmap(craftax_rollout):
    out = craftax_rollout
    assert out["obs"].shape == (2 * CRAFTAX_TIME_LIMIT, 2, CRAFTAX_OBS_SIZE)
    assert out["obs"].dtype == np.float32
    assert np.isfinite(out["obs"]).all() and np.isfinite(out["reward"]).all()
    assert ((out["obs"] >= 0) & (out["obs"] <= 1)).all()


def test_craftax_death_terminates_and_the_time_limit_truncates(craftax_rollout):
    terminated, truncated = craftax_rollout["terminated"], craftax_rollout["truncated"]
    # copy 0 dies at step 5 and restarts; copy 1 runs into the limit twice
    np.testing.assert_array_equal(np.flatnonzero(terminated[:, 0]), [5])
    np.testing.assert_array_equal(np.flatnonzero(truncated[:, 0]), [5 + CRAFTAX_TIME_LIMIT])
    assert not terminated[:, 1].any()
    np.testing.assert_array_equal(np.flatnonzero(truncated[:, 1]),
                                  [CRAFTAX_TIME_LIMIT - 1, 2 * CRAFTAX_TIME_LIMIT - 1])
    np.testing.assert_array_equal(craftax_rollout["obs"][5, 0],
                                  craftax_rollout["first_obs"][0])


def test_ppo_beats_a_random_policy_on_craftax_classic():
    """Calibration (episodes of 32 steps, 12288 steps of training, keys 0-5, jax 0.9.2 on
    the CPU, the same to the digit with the suite's XLA flags and with
    LEARNING_COMPILER_OPTIONS): mean episode return over the last two updates 2.00, 1.92,
    1.86, 2.02, 2.12, 2.06; over the first update 0.22, 0.44, 0.42, 0.33, 0.52, 0.74. A
    uniformly random policy's is 0.43 +- 0.04 (256 episodes of 64 copies): the first
    achievements (collect wood, a sapling, place a table) pay 1 each."""
    first, final = ppo_returns(CRAFTAX_ID, {"max_timesteps": 32}, 3e-3, total_timesteps=12288,
                               compiler_options=LEARNING_COMPILER_OPTIONS)
    assert first < 1.0, first
    assert final > max(1.2, 2 * first), (final, first)


# --------------------------------------------------------------------------- navix


def test_navix_observations_are_one_hot_cells(navix_rollout):
    obs = navix_rollout["obs"]
    assert obs.shape == (NUM_STEPS, NUM_ENVS, NAVIX_OBS_SIZE)
    assert obs.dtype == np.float32
    cells = obs.reshape(NUM_STEPS, NUM_ENVS, 5 * 5, 11 + 6 + 4)
    # one entity, one colour and one state per cell
    for part in (cells[..., :11], cells[..., 11:17], cells[..., 17:]):
        np.testing.assert_array_equal(part.sum(-1), 1.0)
    # the grid is seen whole: one player, one goal, and walls all round
    entities = cells[..., :11].argmax(-1)
    np.testing.assert_array_equal((entities == 10).sum(-1), 1)
    np.testing.assert_array_equal((entities == 8).sum(-1), 1)
    np.testing.assert_array_equal((entities == 2).sum(-1), 16)


def test_navix_goal_terminates_and_the_step_limit_truncates(navix_rollout):
    assert_goal_terminates_and_the_limit_truncates(navix_rollout, NAVIX_TIME_LIMIT)
    # only reaching the goal pays (1), and it ends the episode
    np.testing.assert_array_equal(navix_rollout["reward"],
                                  navix_rollout["terminated"].astype(np.float32))


def test_ppo_beats_a_random_policy_on_navix_empty(navix_rollout):
    """Calibration (this config, keys 0-5, jax 0.9.2 and the suite's XLA flags on the CPU):
    mean episode return over the last two updates 0.90, 0.71, 0.55, 0.87, 0.60, 0.95 after
    8192 steps (1 is the best possible: NAVIX pays 1 for the goal however late); a random
    policy's 0.064-0.082 (keys 0-2, 64 copies for 400 steps). NAVIX's seven actions make
    the goal rarer by chance than in xminigrid, hence the larger learning rate."""
    random_return = episode_returns(
        navix_rollout["reward"], navix_rollout["terminated"] | navix_rollout["truncated"]).mean()
    assert random_return < 0.15
    _, final = ppo_returns(NAVIX_ID, {"max_steps": NAVIX_TIME_LIMIT}, 5e-3)
    assert final > max(0.4, 4 * random_return), (final, random_return)


# --------------------------------------------------------------------------- jumanji


def test_jumanji_tasks_step_under_jit_and_vmap(jumanji_rollout):
    env_id, out = jumanji_rollout
    _, num_envs, num_steps = JUMANJI_ROLLOUTS[env_id]
    shape = (num_steps, num_envs, JUMANJI_OBS_SIZES[env_id])
    assert out["obs"].shape == out["final_obs"].shape == shape
    assert out["obs"].dtype == np.float32
    assert np.isfinite(out["obs"]).all() and np.isfinite(out["reward"]).all()
    assert ((out["obs"] >= 0) & (out["obs"] <= 1)).all()
    assert out["reward"].dtype == np.float32


def test_jumanji_time_limit_truncates_and_the_task_terminates(jumanji_rollout):
    """Jumanji itself reports its time limit as a termination; here it truncates."""
    env_id, out = jumanji_rollout
    terminated, truncated = out["terminated"], out["truncated"]
    assert not (terminated & truncated).any()
    by_termination, by_truncation = episode_lengths(terminated, truncated)
    assert by_truncation.size > 0
    time_limit = JUMANJI_ROLLOUTS[env_id][0]
    np.testing.assert_array_equal(by_truncation, time_limit)
    assert (by_termination <= time_limit).all()
    done = terminated | truncated
    np.testing.assert_array_equal(out["obs"][~done], out["final_obs"][~done])
    if env_id == "jumanji/Maze-v0":
        # reaching the target alone pays (1) and ends the episode
        np.testing.assert_array_equal(out["reward"], terminated.astype(np.float32))
        # every episode draws a new maze
        walls = slice(0, 100)
        assert (out["obs"][done][:, walls] != out["final_obs"][done][:, walls]).any(-1).all()
    if env_id == "jumanji/Snake-v1":
        # a random snake soon runs into a wall: the episode ends there, with no bootstrap
        assert terminated.any()


def test_ppo_beats_a_random_policy_on_the_sliding_tile_puzzle():
    """Calibration (episodes of 32 steps, 16384 steps of training, keys 0-5, jax 0.9.2 and
    the suite's XLA flags on the CPU): mean episode return over the last two updates 1.25,
    1.00, 1.41, 0.81, 1.19, 0.94; a random policy's -0.33 (key 0, 64 copies for 64 steps;
    -0.30 +- 0.11 over 256 episodes). The dense reward pays +1 for each tile moved into its
    place and -1 for each moved out of it. The random rollout is the one the stepping tests
    read."""
    env_id = "jumanji/SlidingTilePuzzle-v0"
    env_params = {"time_limit": JUMANJI_ROLLOUTS[env_id][0]}
    rollout = jumanji_random_rollout(env_id)
    random_return = episode_returns(
        rollout["reward"], rollout["terminated"] | rollout["truncated"]).mean()
    assert random_return < 0.2
    _, final = ppo_returns(env_id, env_params, 3e-3, total_timesteps=16384)
    assert final > max(0.5, random_return + 0.5), (final, random_return)
