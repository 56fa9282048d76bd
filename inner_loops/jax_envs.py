"""XLand-MiniGrid, Craftax, NAVIX and Jumanji as environments of the adapter
(:mod:`inner_loops.envs`).

Each package is an optional extra, imported only when one of its ids is made:

- ``xminigrid/<name>``: an XLand-MiniGrid environment ported from MiniGrid
  (``xminigrid/MiniGrid-Empty-5x5``, ``xminigrid/MiniGrid-DoorKey-8x8``, ...), from
  ``pip install "metarl[xminigrid]"``. Its observation, a ``[V, V, 2]`` grid of (tile, colour)
  ids seen by the agent, becomes a float32 vector ``[V * V * (13 + 12)]``: each cell's tile and
  colour one-hot. ``env_params`` may set ``max_steps`` (the time limit) and ``view_size``.
- ``xminigrid/<XLand id>/<benchmark>``: an XLand-MiniGrid layout whose every episode draws its
  task (goal, rules, objects) from one of xminigrid's benchmarks
  (``xminigrid/XLand-MiniGrid-R1-9x9/trivial-21k``). metarl reads the benchmark from
  xminigrid's data folder (``XLAND_MINIGRID_DATA``, by default ``~/.xland_minigrid``) and
  never downloads it: ``xminigrid.load_benchmark(name)`` does, from Hugging Face.
  ``env_params`` may also split the benchmark's rulesets into two disjoint parts, so that
  one experiment trains on one part and holds out the other (:func:`ruleset_split`):
  ``train_rulesets = true`` draws from the training part only, ``test_rulesets = true``
  from the rest; ``train_fraction`` (default 0.8) is the training part's share and
  ``split_seed`` (default 0) picks the fixed order the split is made in. Neither flag
  (the default): every ruleset, as before.
- ``craftax/Craftax-Classic-Symbolic-v1``: Craftax-Classic with its symbolic observation,
  a float32 vector ``[1345]``, from ``pip install "metarl[craftax]"``. ``env_params`` may set
  the scalar fields of its ``EnvParams`` (``max_timesteps``, ``day_length``, ...). Dying or
  walking into lava terminates an episode; reaching ``max_timesteps`` truncates it.
- ``navix/<name>``: any environment of NAVIX's registry (``navix/Navix-Empty-5x5-v0``,
  ``navix/Navix-DoorKey-8x8-v0``, ...), from ``pip install "metarl[navix]"``, with NAVIX's
  fully observable symbolic observation, a ``[H, W, 3]`` grid of (entity, colour, state)
  ids, as a float32 vector ``[H * W * (11 + 6 + 4)]``: each id one-hot. Its own
  termination (goal, lava, a hit by an obstacle) terminates an episode; ``max_steps``
  (``env_params``, default 100 as in ``navix.make``) truncates it.
- ``jumanji/<name>`` for three single-agent Jumanji tasks with four discrete actions, from
  ``pip install "metarl[jumanji]"``; each observation becomes a float32 vector:
  ``Maze-v0`` ``[3 * 10 * 10]`` (walls, the agent's cell one-hot, the target's cell one-hot),
  ``Snake-v1`` ``[12 * 12 * 5]`` (its feature maps) and ``SlidingTilePuzzle-v0``
  ``[5 * 5 * 25]`` (each cell's tile one-hot). Jumanji ends episodes at its time limit as
  terminations; here the task's own end (target reached, snake dead, puzzle solved)
  terminates, and ``time_limit`` (``env_params``, default the task's: 100, 4000, 500)
  truncates. Action masks are not given to the agent.

All work with jax < 0.10 (tested with jax 0.9.2, xminigrid 0.9.3, craftax 1.6.1, navix 0.7.4
and jumanji 1.1.2).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.env_spec import (
    Env,
    EnvParamPairs,
    EnvSpec,
    auto_reset,
    integer_param,
    with_overrides,
)

XMINIGRID_PREFIX = "xminigrid/"
CRAFTAX_PREFIX = "craftax/"
CRAFTAX_IDS = ("Craftax-Classic-Symbolic-v1",)
XMINIGRID_PARAMS = ("max_steps", "view_size")
# the env_params of an XLand benchmark's ruleset split (ruleset_split)
XLAND_SPLIT_PARAMS = ("train_rulesets", "test_rulesets", "train_fraction", "split_seed")
DEFAULT_TRAIN_FRACTION = 0.8
DEFAULT_SPLIT_SEED = 0
NAVIX_PREFIX = "navix/"
NAVIX_PARAMS = ("max_steps",)
JUMANJI_PREFIX = "jumanji/"
JUMANJI_IDS = ("Maze-v0", "Snake-v1", "SlidingTilePuzzle-v0")
JUMANJI_PARAMS = ("time_limit",)
# NAVIX's symbolic ids: entities 0-10 (unknown, floor, wall, ..., player), colours 0-5, and
# states 0-3 (a player's direction; a door open, closed or locked).
NAVIX_ENTITIES, NAVIX_COLOURS, NAVIX_STATES = 11, 6, 4
# Largest int32: a time limit Craftax and Jumanji never reach, for telling a true end of an
# episode (death, a goal) from running out of time.
_NO_TIME_LIMIT = 2**31 - 1


class MissingEnvPackageError(ImportError, ValueError):
    """An environment's optional package is not installed (a ``ValueError`` too, like every
    other bad ``env_id``)."""


def _import(package: str, env_id: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise MissingEnvPackageError(
            f"env_id: {env_id} needs the {package} package; install it with "
            f'pip install "metarl[{package}]" (a version that works with jax < 0.10)'
        ) from error


def xminigrid_ids() -> list[str]:
    """The ``xminigrid/`` ids :func:`inner_loops.envs.make_env` accepts: the MiniGrid ones,
    and each XLand one with each benchmark found in xminigrid's data folder (none when the
    package is missing)."""
    try:
        import xminigrid
        from xminigrid import benchmarks
    except ImportError:
        return []
    names = xminigrid.registered_environments()
    found = [name for name in benchmarks.registered_benchmarks() if os.path.exists(
        os.path.join(benchmarks.DATA_PATH, benchmarks.NAME2HFFILENAME[name]))]
    return ([XMINIGRID_PREFIX + name for name in names if name.startswith("MiniGrid-")]
            + [f"{XMINIGRID_PREFIX}{name}/{benchmark}" for name in names
               if name.startswith("XLand-") for benchmark in found])


def craftax_ids() -> list[str]:
    """The ``craftax/`` ids :func:`inner_loops.envs.make_env` accepts (none when the package
    is missing)."""
    if importlib.util.find_spec("craftax") is None:
        return []
    return [CRAFTAX_PREFIX + name for name in CRAFTAX_IDS]


def navix_ids() -> list[str]:
    """The ``navix/`` ids :func:`inner_loops.envs.make_env` accepts: NAVIX's whole registry
    (none when the package is missing)."""
    try:
        import navix
    except ImportError:
        return []
    return [NAVIX_PREFIX + name for name in sorted(navix.registry())]


def jumanji_ids() -> list[str]:
    """The ``jumanji/`` ids :func:`inner_loops.envs.make_env` accepts (none when the package
    is missing)."""
    if importlib.util.find_spec("jumanji") is None:
        return []
    return [JUMANJI_PREFIX + name for name in JUMANJI_IDS]


@functools.cache
def make_xminigrid_env(env_id: str, env_params: EnvParamPairs = ()) -> Env:
    """The adapter's :class:`Env` for ``xminigrid/<name>``; observations ``[V * V * 25]``."""
    xminigrid = _import("xminigrid", env_id)
    from xminigrid.core.constants import NUM_COLORS, NUM_TILES

    name, _, benchmark_name = env_id[len(XMINIGRID_PREFIX):].partition("/")
    if name not in xminigrid.registered_environments():
        raise ValueError(f"env_id: unknown environment {env_id!r}; allowed: "
                         f"{', '.join(xminigrid_ids())}, or xminigrid/XLand-MiniGrid-<layout>"
                         "/<benchmark> (see xminigrid.registered_environments() and "
                         "xminigrid.registered_benchmarks())")
    benchmark = rulesets = None
    xland = name.startswith("XLand-MiniGrid")
    if not xland and benchmark_name:
        raise ValueError(f"env_id: {env_id}: only XLand-MiniGrid environments take a "
                         "benchmark; the MiniGrid ones have their own goal")
    allowed = XMINIGRID_PARAMS + (XLAND_SPLIT_PARAMS if xland else ())
    overrides, split = {}, {}
    for param, value in env_params:
        if param not in allowed:
            raise ValueError(f"env_params.{param}: {env_id} has no such parameter; allowed: "
                             f"{', '.join(allowed)}")
        if param in XLAND_SPLIT_PARAMS:
            split[param] = value
        else:
            overrides[param] = integer_param(param, value, minimum=1)
    part = _split_part(split)
    if xland:
        benchmark = _load_benchmark(env_id, benchmark_name)
        if part is not None:
            rulesets = jnp.asarray(ruleset_split(
                benchmark.num_rulesets(), part,
                split.get("train_fraction", DEFAULT_TRAIN_FRACTION),
                split.get("split_seed", DEFAULT_SPLIT_SEED)), jnp.int32)
    env, params = xminigrid.make(name, **overrides)
    view = int(params.view_size)
    spec = EnvSpec(env_id, (view * view * (NUM_TILES + NUM_COLORS),), True,
                   int(env.num_actions(params)), max_episode_steps=int(params.max_steps))

    def observe(grid):
        # Tile and colour ids name categories, not amounts: one-hot keeps a key (7) as far
        # from a door (8-10) as from a wall (2), where scaling the ids would make them close.
        tiles = jax.nn.one_hot(grid[..., 0], NUM_TILES, dtype=jnp.float32)
        colours = jax.nn.one_hot(grid[..., 1], NUM_COLORS, dtype=jnp.float32)
        return jnp.concatenate([tiles, colours], axis=-1).reshape(-1)

    def reset(key):
        if benchmark is None:
            timestep = env.reset(params, key)
        else:
            # every episode draws its task (goal, rules, objects) from the benchmark
            ruleset_key, key = jax.random.split(key)
            if rulesets is None:
                ruleset = benchmark.sample_ruleset(ruleset_key)
            else:  # uniformly from one part of the split
                index = jax.random.randint(ruleset_key, (), 0, rulesets.shape[0])
                ruleset = benchmark.get_ruleset(rulesets[index])
            timestep = env.reset(params.replace(ruleset=ruleset), key)
        return observe(timestep.observation), timestep

    def step(key, state, action, fresh=None):
        if fresh is None:
            fresh = reset(key)
        # the goal and rules of an episode live in its state; params only set sizes and limits
        timestep = env.step(params, state, action)
        # xminigrid ends an episode with step_type LAST; its discount is 0 only when the
        # goal was reached, and 1 when the step limit cut the episode short.
        ended = timestep.last()
        terminated = jnp.logical_and(ended, timestep.discount == 0.0)
        truncated = jnp.logical_and(ended, jnp.logical_not(terminated))
        return auto_reset(fresh, observe(timestep.observation), timestep, timestep.reward,
                          terminated, truncated)

    return Env(spec, reset, step)


def _split_part(split: dict[str, Any]) -> str | None:
    """Which part of an XLand benchmark the ``env_params`` of a split (``split``: the
    :data:`XLAND_SPLIT_PARAMS` given) draw from: ``"train"``, ``"test"``, or ``None`` for
    every ruleset; raises ``ValueError`` naming the parameter when they do not fit."""
    for flag in ("train_rulesets", "test_rulesets"):
        if flag in split and not isinstance(split[flag], bool):
            raise ValueError(f"env_params.{flag}: expected true or false, got {split[flag]!r}")
    train, test = split.get("train_rulesets", False), split.get("test_rulesets", False)
    if train and test:
        raise ValueError("env_params.test_rulesets: a task draws from one part of the split; "
                         "set train_rulesets or test_rulesets, not both (two [[inner]] or "
                         "[[held_out]] entries take the two parts)")
    if not (train or test):
        for param in ("train_fraction", "split_seed"):
            if param in split:
                raise ValueError(f"env_params.{param}: only with train_rulesets = true or "
                                 "test_rulesets = true (without either, every ruleset is "
                                 "drawn)")
        return None
    fraction = split.get("train_fraction", DEFAULT_TRAIN_FRACTION)
    if isinstance(fraction, bool) or not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"env_params.train_fraction: expected a number strictly between 0 "
                         f"and 1, got {fraction!r}")
    seed = split.get("split_seed", DEFAULT_SPLIT_SEED)
    if isinstance(seed, bool) or not float(seed).is_integer() or not 0 <= seed < 2**32:
        raise ValueError(f"env_params.split_seed: expected an integer from 0 to 2**32 - 1, "
                         f"got {seed!r}")
    return "train" if train else "test"


_MASK64 = (1 << 64) - 1


def _splitmix64(values: Any) -> Any:
    """SplitMix64's output function (Steele, Lea & Flood 2014) of ``values`` (uint64
    numpy array): a fixed, well-mixed hash, the same on every platform and version."""
    z = (values + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_MASK64)
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(_MASK64)
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(_MASK64)
    return z ^ (z >> np.uint64(31))


def ruleset_split(num_rulesets: int, part: str, train_fraction: float = DEFAULT_TRAIN_FRACTION,
                  split_seed: int = DEFAULT_SPLIT_SEED) -> Any:
    """The indices (ascending, int64 numpy) of one part of a benchmark of ``num_rulesets``
    rulesets split in two disjoint parts.

    The rulesets are put in a fixed order, by the SplitMix64 hash of ``split_seed * 2^32 +
    index`` (ties, which need a collision of 64-bit hashes, by index): the first
    ``round(train_fraction * num_rulesets)`` of that order are the ``"train"`` part, the
    rest the ``"test"`` part. The order depends on ``split_seed`` and the indices alone,
    computed in numpy's exact integer arithmetic, so it is the same on every machine and
    for every version of JAX and NumPy; another ``split_seed`` gives another split.

    Raises ``ValueError`` naming ``env_params.train_fraction`` when either part would be
    empty.
    """
    size = round(train_fraction * num_rulesets)
    if not 0 < size < num_rulesets:
        raise ValueError(f"env_params.train_fraction: {train_fraction} of {num_rulesets} "
                         f"rulesets leaves a part of the split empty")
    index = np.arange(num_rulesets, dtype=np.uint64)
    order = np.lexsort((index, _splitmix64((np.uint64(int(split_seed)) << np.uint64(32))
                                           + index)))
    chosen = order[:size] if part == "train" else order[size:]
    return np.sort(chosen).astype(np.int64)


def _load_benchmark(env_id: str, benchmark_name: str) -> Any:
    """The xminigrid benchmark (a distribution of rulesets) named in ``env_id``, read from
    xminigrid's data folder; metarl never downloads it."""
    from xminigrid import benchmarks

    names = benchmarks.registered_benchmarks()
    if benchmark_name not in names:
        raise ValueError(
            f"env_id: {env_id}: XLand-MiniGrid environments take their goal and rules from a "
            f"benchmark: name one as xminigrid/<XLand id>/<benchmark>, with <benchmark> one "
            f"of {', '.join(names)}"
        )
    path = os.path.join(benchmarks.DATA_PATH, benchmarks.NAME2HFFILENAME[benchmark_name])
    if not os.path.exists(path):
        raise ValueError(
            f"env_id: {env_id}: benchmark {benchmark_name} is not in {benchmarks.DATA_PATH}; "
            "xminigrid downloads it from Hugging Face: run python -c \"import xminigrid; "
            f"xminigrid.load_benchmark('{benchmark_name}')\" on a machine with internet "
            "access (set XLAND_MINIGRID_DATA to choose the folder)"
        )
    return jax.tree.map(jnp.asarray, benchmarks.load_benchmark_from_path(path))


def _supported_name(env_id: str, prefix: str, supported: Sequence[str], why: str) -> str:
    """The name after ``prefix`` in ``env_id``, when it is one of ``supported``; else a
    ``ValueError`` listing them and saying ``why`` the family's other tasks are left out."""
    name = env_id[len(prefix):]
    if name not in supported:
        raise ValueError(f"env_id: unknown or unsupported environment {env_id!r}; allowed: "
                         f"{', '.join(prefix + n for n in supported)} ({why})")
    return name


@functools.cache
def make_craftax_env(env_id: str, env_params: EnvParamPairs = ()) -> Env:
    """The adapter's :class:`Env` for ``craftax/Craftax-Classic-Symbolic-v1``; observations
    ``[1345]``."""
    name = _supported_name(env_id, CRAFTAX_PREFIX, CRAFTAX_IDS,
                           "the pixel observations and full Craftax are not supported")
    _import("craftax", env_id)
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(name, auto_reset=False)
    params = with_overrides(env_id, env.default_params, env_params)
    # is_terminal counts reaching max_timesteps as game over; without the limit it is death.
    no_limit = params.replace(max_timesteps=_NO_TIME_LIMIT)
    spec = EnvSpec(env_id, tuple(env.observation_space(params).shape), True,
                   int(env.action_space(params).n),
                   max_episode_steps=int(params.max_timesteps))

    def reset(key):
        obs, state = env.reset_env(key, params)
        return obs.astype(jnp.float32), state

    def step(key, state, action, fresh=None):
        if fresh is None:
            key, reset_key = jax.random.split(key)
            fresh = reset(reset_key)
        final_obs, next_state, reward, done, _ = env.step_env(key, state, action, params)
        terminated = jnp.asarray(env.is_terminal(next_state, no_limit), jnp.bool_)
        truncated = jnp.logical_and(done, jnp.logical_not(terminated))
        return auto_reset(fresh, final_obs.astype(jnp.float32), next_state, reward,
                          terminated, truncated)

    return Env(spec, reset, step)


@functools.cache
def make_navix_env(env_id: str, env_params: EnvParamPairs = ()) -> Env:
    """The adapter's :class:`Env` for ``navix/<name>``; observations ``[H * W * 21]``."""
    navix = _import("navix", env_id)
    from navix import observations
    from navix.rendering.cache import RenderingCache

    name = env_id[len(NAVIX_PREFIX):]
    if name not in navix.registry():
        raise ValueError(f"env_id: unknown environment {env_id!r}; allowed: "
                         f"{', '.join(navix_ids())}")
    overrides = {}
    for param, value in env_params:
        if param not in NAVIX_PARAMS:
            raise ValueError(f"env_params.{param}: {env_id} has no such parameter; allowed: "
                             f"{', '.join(NAVIX_PARAMS)}")
        overrides[param] = integer_param(param, value, minimum=1)
    env = navix.make(name, observation_fn=observations.symbolic, **overrides)
    cell_size = NAVIX_ENTITIES + NAVIX_COLOURS + NAVIX_STATES
    spec = EnvSpec(env_id, (env.height * env.width * cell_size,), True, len(env.action_set),
                   max_episode_steps=int(env.max_steps))
    # NAVIX keeps a rendered tile of every cell in its state, for the pixel observations
    # alone; an empty one keeps each reset from drawing it and each step from carrying it.
    no_pixels = RenderingCache(patches=jnp.zeros((0,), jnp.uint8))

    def observe(grid):
        # ids name categories, as in xminigrid; an id outside its range (KeyCorridor's locked
        # door has state 254) one-hots to zeros, still unlike every id in range.
        grid = grid.astype(jnp.int32)
        return jnp.concatenate([
            jax.nn.one_hot(grid[..., 0], NAVIX_ENTITIES, dtype=jnp.float32),
            jax.nn.one_hot(grid[..., 1], NAVIX_COLOURS, dtype=jnp.float32),
            jax.nn.one_hot(grid[..., 2], NAVIX_STATES, dtype=jnp.float32),
        ], axis=-1).reshape(-1)

    def reset(key):
        timestep = env.reset(key, no_pixels)
        return observe(timestep.observation), timestep

    def step(key, state, action, fresh=None):
        if fresh is None:
            fresh = reset(key)
        # NAVIX's public step wraps this one in a lax.cond that resets an ended episode;
        # under vmap both branches would run every step, and ended episodes reset below.
        timestep = env._step(state, action)
        terminated = timestep.is_termination()
        truncated = timestep.is_truncation()
        return auto_reset(fresh, observe(timestep.observation), timestep, timestep.reward,
                          terminated, truncated)

    return Env(spec, reset, step)


def _jumanji_observer(name: str, env: Any) -> tuple[Any, int]:
    """How a Jumanji task's observation becomes a float32 vector: ``(observe, size)``."""
    if name == "Maze-v0":
        rows, cols = env.observation_spec.walls.shape
        cells = rows * cols

        def observe(obs):
            agent = obs.agent_position.row * cols + obs.agent_position.col
            target = obs.target_position.row * cols + obs.target_position.col
            return jnp.concatenate([obs.walls.reshape(-1).astype(jnp.float32),
                                    jax.nn.one_hot(agent, cells, dtype=jnp.float32),
                                    jax.nn.one_hot(target, cells, dtype=jnp.float32)])

        return observe, 3 * cells
    if name == "Snake-v1":
        shape = env.observation_spec.grid.shape
        # body, head, tail, fruit and the body's order, each already in [0, 1]
        return (lambda obs: obs.grid.reshape(-1).astype(jnp.float32)), math.prod(shape)
    cells = math.prod(env.observation_spec.puzzle.shape)
    # tiles are numbered 0 (the gap) to cells - 1: names, not amounts
    return ((lambda obs: jax.nn.one_hot(obs.puzzle, cells, dtype=jnp.float32).reshape(-1)),
            cells * cells)


@functools.cache
def make_jumanji_env(env_id: str, env_params: EnvParamPairs = ()) -> Env:
    """The adapter's :class:`Env` for ``jumanji/<name>``, one of :data:`JUMANJI_IDS`;
    observations ``[300]`` (Maze), ``[720]`` (Snake), ``[625]`` (SlidingTilePuzzle)."""
    name = _supported_name(env_id, JUMANJI_PREFIX, JUMANJI_IDS,
                           "multi-agent tasks, tasks with several or continuous actions, and "
                           "those that rely on an action mask are not supported; see "
                           "docs/guides/inner-loops.md")
    jumanji = _import("jumanji", env_id)
    time_limit = None
    for param, value in env_params:
        if param not in JUMANJI_PARAMS:
            raise ValueError(f"env_params.{param}: {env_id} has no such parameter; allowed: "
                             f"{', '.join(JUMANJI_PARAMS)}")
        time_limit = integer_param(param, value, minimum=1)
    if time_limit is None:
        time_limit = int(jumanji.make(name).time_limit)
    # Jumanji reports reaching its time limit as a termination; with a limit it never
    # reaches, its every episode end is a true one, and the limit is counted here.
    env = jumanji.make(name, time_limit=_NO_TIME_LIMIT)
    observe, size = _jumanji_observer(name, env)
    spec = EnvSpec(env_id, (size,), True, int(env.action_spec.num_values),
                   max_episode_steps=time_limit)

    def reset(key):
        state, timestep = env.reset(key)
        return observe(timestep.observation), state

    def step(key, state, action, fresh=None):
        if fresh is None:
            fresh = reset(key)
        next_state, timestep = env.step(state, action)
        terminated = timestep.last()
        truncated = jnp.logical_and(next_state.step_count >= time_limit,
                                    jnp.logical_not(terminated))
        return auto_reset(fresh, observe(timestep.observation), next_state, timestep.reward,
                          terminated, truncated)

    return Env(spec, reset, step)
