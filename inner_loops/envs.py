"""The one adapter over gymnax, brax, XLand-MiniGrid, Craftax, NAVIX and Jumanji.

Everything the PPO loop needs from an environment goes through :func:`make_env`, which
returns an :class:`Env` with the same pure interface for both libraries:

- ``reset(key) -> (obs, state)``
- ``step(key, state, action, fresh=None) -> EnvStep(obs, state, reward, terminated,
  truncated, final_obs)``

Episodes reset automatically. ``final_obs`` is the observation reached by the step, before
any reset, so value targets can bootstrap from it on truncation (time limit) but not on
termination. ``fresh`` is the ``(obs, state)`` an ending episode is replaced by; without it
the step draws one with ``reset``. Drawing the fresh starts of a whole rollout up front
(:meth:`VecEnv.presample`) takes every random draw of the adapter out of the per-step loop,
which matters on the CPU, where XLA runs each threefry draw as a small loop of its own.

:func:`make_vec_env` batches ``num_envs`` copies and optionally keeps running observation
and reward normalisation statistics (for continuous control).

Environment ids: any gymnax id (``CartPole-v1``, ``Breakout-MinAtar``, ...),
``brax/<name>`` for brax (``brax/ant``, ``brax/hopper``, ``brax/halfcheetah``, ...), or
``probe/<name>-<discrete|continuous>`` for the probe tasks of :mod:`inner_loops.probe_envs`,
whose exact Q-values are known, and, with their optional packages installed,
``xminigrid/<name>`` (``xminigrid/MiniGrid-Empty-5x5``, ...),
``craftax/Craftax-Classic-Symbolic-v1``, ``navix/<name>`` (``navix/Navix-Empty-5x5-v0``, ...)
and ``jumanji/Maze-v0``, ``jumanji/Snake-v1``, ``jumanji/SlidingTilePuzzle-v0`` (see
:mod:`inner_loops.jax_envs`).

Environment parameters: ``env_params`` overrides scalar fields of a gymnax environment's
default ``EnvParams`` (``{"max_steps_in_episode": 200}``, CartPole's ``"gravity"`` ...), set
as given: gymnax does not recompute fields derived from others (CartPole's ``total_mass``).
Brax environments take ``"episode_length"`` (default :data:`BRAX_EPISODE_LENGTH`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from inner_loops.env_spec import (
    PROBE_PREFIX,
    Env,
    EnvParamPairs,
    EnvSpec,
    EnvStep,
    auto_reset,
    integer_param,
    with_overrides,
)
from inner_loops.validation import check_finite

BRAX_PREFIX = "brax/"
BRAX_EPISODE_LENGTH = 1000


class VecEnvStep(NamedTuple):
    """One step of ``N`` environments: :class:`EnvStep` fields with a leading ``[N]`` axis
    (``state`` is the :class:`VecEnvState`), plus ``raw_reward [N]``, the reward before any
    normalisation (``reward`` is normalised when asked)."""

    obs: jax.Array
    state: Any
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    raw_reward: jax.Array


class _ImportedOnFirstUse(types.ModuleType):
    """Stands in for a module until one of its attributes is used, then imports it."""

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self.__name__), attribute)


# What gymnax imports only to draw (Pong's colours, Catch's and others' ``render``).
_DRAWING_MODULES = ("seaborn", "matplotlib.pyplot")


def _import_gymnax() -> types.ModuleType:
    """``gymnax``, without importing what it draws with until something draws.

    gymnax imports every environment it has, and some import seaborn (with scipy and
    pandas) or pyplot for their ``render`` alone: 1.2 of the 2.2 CPU-seconds a process
    spends importing metarl and making CartPole. Every run, evaluation and worker process
    starts by paying that, so while gymnax imports, each of :data:`_DRAWING_MODULES` not yet
    imported is a stand-in that imports the real module on first use; afterwards an
    ``import`` of it imports it as usual.
    """
    if "gymnax" in sys.modules:
        return sys.modules["gymnax"]
    deferred = [name for name in _DRAWING_MODULES if name not in sys.modules
                and importlib.util.find_spec(name) is not None]
    for name in deferred:
        sys.modules[name] = _ImportedOnFirstUse(name)
    try:
        import gymnax
    finally:
        for name in deferred:
            if isinstance(sys.modules.get(name), _ImportedOnFirstUse):
                del sys.modules[name]
    return gymnax


def available_envs() -> list[str]:
    """Every id :func:`make_env` accepts."""
    gymnax = _import_gymnax()

    from inner_loops.jax_envs import craftax_ids, jumanji_ids, navix_ids, xminigrid_ids
    from inner_loops.probe_envs import probe_ids

    return (list(gymnax.registered_envs) + [BRAX_PREFIX + name for name in _brax_names()]
            + probe_ids() + xminigrid_ids() + craftax_ids() + navix_ids() + jumanji_ids())


def _brax_names() -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from brax import envs as brax_envs

    return sorted(brax_envs._envs)


def env_param_pairs(env_params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
                    ) -> EnvParamPairs:
    """``env_params`` (a mapping or ``(name, value)`` pairs) as sorted, hashable pairs."""
    if env_params is None:
        return ()
    items = env_params.items() if isinstance(env_params, Mapping) else env_params
    try:
        pairs = [(name, value) for name, value in items]
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"env_params: expected a table of parameter names and values, got {env_params!r}"
        ) from error
    names = [name for name, _ in pairs]
    if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
        raise ValueError(f"env_params: names must be distinct strings, got {names}")
    for name, value in pairs:
        if not isinstance(value, bool | int | float):
            raise ValueError(f"env_params.{name}: expected a number or a boolean, got {value!r}")
        if isinstance(value, float):
            check_finite(f"env_params.{name}", value)
    return tuple(sorted(pairs))


def make_env(env_id: str, env_params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
             ) -> Env:
    """Build the environment named ``env_id`` with ``env_params`` overriding its defaults.

    Raises ``ValueError`` listing the valid ids, or the parameters the environment has, or
    naming the extra to install when the environment's optional package is missing.
    """
    if not isinstance(env_id, str):
        raise ValueError(f"env_id must be a string, got {env_id!r}")
    pairs = env_param_pairs(env_params)
    if env_id.startswith(BRAX_PREFIX):
        return _cached_brax_env(env_id, pairs)
    if env_id.startswith(PROBE_PREFIX):
        from inner_loops.probe_envs import make_probe_env

        return make_probe_env(env_id, pairs)
    from inner_loops import jax_envs

    if env_id.startswith(jax_envs.XMINIGRID_PREFIX):
        return jax_envs.make_xminigrid_env(env_id, pairs)
    if env_id.startswith(jax_envs.CRAFTAX_PREFIX):
        return jax_envs.make_craftax_env(env_id, pairs)
    if env_id.startswith(jax_envs.NAVIX_PREFIX):
        return jax_envs.make_navix_env(env_id, pairs)
    if env_id.startswith(jax_envs.JUMANJI_PREFIX):
        return jax_envs.make_jumanji_env(env_id, pairs)
    return _cached_gymnax_env(env_id, pairs)


@functools.cache
def _cached_gymnax_env(env_id: str, env_params: EnvParamPairs = ()) -> Env:
    gymnax = _import_gymnax()
    from gymnax.environments import spaces
    from gymnax.environments.environment import Environment

    if env_id not in gymnax.registered_envs:
        raise ValueError(
            f"env_id: unknown environment {env_id!r}; allowed: "
            f"{', '.join(available_envs())}"
        )
    env, params = gymnax.make(env_id)
    params = with_overrides(env_id, params, env_params)
    action_space = env.action_space(params)
    obs_shape = tuple(env.observation_space(params).shape)
    time_limit = getattr(params, "max_steps_in_episode", None)
    time_limit = None if time_limit is None else int(time_limit)
    if isinstance(action_space, spaces.Discrete):
        spec = EnvSpec(env_id, obs_shape, True, int(action_space.n),
                       max_episode_steps=time_limit)
    else:
        shape = tuple(action_space.shape) or (1,)
        # numpy, not jnp: building an environment starts no JAX computation
        low = np.broadcast_to(np.asarray(action_space.low, np.float32), shape)
        high = np.broadcast_to(np.asarray(action_space.high, np.float32), shape)
        spec = EnvSpec(
            env_id,
            obs_shape,
            False,
            int(shape[0]),
            tuple(float(x) for x in low.reshape(-1)),
            tuple(float(x) for x in high.reshape(-1)),
            time_limit,
        )
    scalar_action = not spec.discrete and tuple(action_space.shape) == ()
    # An env that overrides gymnax's auto-resetting ``step`` (bsuite's DeepSea carries
    # statistics across episodes) keeps it; it draws its own resets from ``key``.
    own_step = type(env).step is not Environment.step

    def reset(key):
        obs, state = env.reset(key, params)
        return obs.astype(jnp.float32), state

    def step(key, state, action, fresh=None):
        if scalar_action:
            action = action[0]
        if own_step:
            obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
            return EnvStep(obs.astype(jnp.float32), state, reward.astype(jnp.float32),
                           terminated.astype(jnp.bool_),
                           jnp.logical_and(truncated, jnp.logical_not(terminated)),
                           info["final_observation"].astype(jnp.float32))
        if fresh is None:
            key, reset_key = jax.random.split(key)
            fresh = reset(reset_key)
        # gymnax's own ``env.step`` draws the reset inside; stepping without it lets the
        # caller supply a presampled one. The time limit is gymnax's ``is_truncated``.
        final_obs, next_state, reward, terminated, _ = env.step_env(key, state, action, params)
        terminated = terminated.astype(jnp.bool_)
        truncated = jnp.logical_and(env.is_truncated(next_state, params),
                                    jnp.logical_not(terminated))
        return auto_reset(fresh, final_obs.astype(jnp.float32), next_state, reward,
                          terminated, truncated)

    return Env(spec, reset, step)


class BraxState(NamedTuple):
    env_state: Any
    steps: jax.Array  # [] steps taken in the current episode


@functools.cache
def _cached_brax_env(env_id: str, env_params: EnvParamPairs = ()) -> Env:
    name = env_id[len(BRAX_PREFIX) :]
    if name not in _brax_names():
        raise ValueError(
            f"env_id: unknown environment {env_id!r}; allowed: {', '.join(available_envs())}"
        )
    episode_length = BRAX_EPISODE_LENGTH
    for param, value in env_params:
        if param != "episode_length":
            raise ValueError(f"env_params.{param}: {env_id} has no such parameter; "
                             "allowed: episode_length")
        episode_length = integer_param(param, value, minimum=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from brax import envs as brax_envs

        env = brax_envs.get_environment(name, backend="positional")
    size = env.action_size
    spec = EnvSpec(env_id, (int(env.observation_size),), False, int(size), (-1.0,) * size,
                   (1.0,) * size, episode_length)

    def reset(key):
        env_state = env.reset(key)
        return env_state.obs, BraxState(env_state, jnp.zeros((), jnp.int32))

    def step(key, state, action, fresh=None):
        if fresh is None:
            fresh = reset(key)
        next_state = env.step(state.env_state, action)
        steps = state.steps + 1
        terminated = next_state.done > 0.5
        truncated = jnp.logical_and(steps >= episode_length, jnp.logical_not(terminated))
        return auto_reset(fresh, next_state.obs, BraxState(next_state, steps),
                          next_state.reward, terminated, truncated)

    return Env(spec, reset, step)


@struct.dataclass
class RunningStats:
    """Running mean and variance (parallel-update form) of a batch of arrays."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape: tuple[int, ...]) -> RunningStats:
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))

    def update(self, batch: jax.Array) -> RunningStats:
        """Fold in ``batch`` of shape ``[N, *shape]``."""
        batch_mean = jnp.mean(batch, axis=0)
        batch_var = jnp.var(batch, axis=0)
        batch_count = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count
        m2 = m2 + jnp.square(delta) * self.count * batch_count / total
        return RunningStats(mean, m2 / total, total)


@struct.dataclass
class VecEnvState:
    """State of ``num_envs`` environments plus their normalisation statistics."""

    env_state: Any
    obs_stats: RunningStats
    return_stats: RunningStats
    discounted_return: jax.Array  # [N]


class EnvNoise(NamedTuple):
    """Every random draw of ``num_envs`` environments for one step (``[N, ...]`` each), or
    for a whole rollout (``[T, N, ...]``): the keys their dynamics may use and the fresh
    episode starts that replace the episodes that end (``None`` when each step draws its
    own from its key: :attr:`VecEnv.presample_resets` off)."""

    keys: jax.Array
    fresh_obs: jax.Array
    fresh_state: Any


@dataclass(frozen=True)
class VecEnv:
    """``num_envs`` copies of one environment, with optional normalisation.

    Observations are normalised by running mean/std and clipped to ±10; rewards are
    divided by the running std of the discounted return and clipped to ±10. Statistics
    are updated on every step, as in PureJaxRL's wrappers.

    ``presample_resets``: whether :meth:`presample` draws the fresh episode starts of a
    whole rollout up front (``True``) or leaves each step to draw its own from its key.
    """

    env: Env
    num_envs: int
    normalize_obs: bool = False
    normalize_reward: bool = False
    presample_resets: bool = True

    @property
    def spec(self) -> EnvSpec:
        return self.env.spec

    def reset(self, key: jax.Array) -> tuple[jax.Array, VecEnvState]:
        """Returns observations ``[N, *obs_shape]`` and the batched state."""
        obs, env_state = jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))
        state = VecEnvState(
            env_state,
            RunningStats.create(self.spec.obs_shape),
            RunningStats.create(()),
            jnp.zeros(self.num_envs),
        )
        state, obs = self._observe(state, obs)
        return obs, state

    def _observe(self, state: VecEnvState, obs: jax.Array) -> tuple[VecEnvState, jax.Array]:
        if not self.normalize_obs:
            return state, obs
        stats = state.obs_stats.update(obs)
        return state.replace(obs_stats=stats), self._normalise(stats, obs)

    @staticmethod
    def _normalise(stats: RunningStats, obs: jax.Array) -> jax.Array:
        return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + 1e-8), -10.0, 10.0)

    def presample(self, key: jax.Array, num_steps: int) -> EnvNoise:
        """All random draws for ``num_steps`` steps of every copy: :class:`EnvNoise` of
        ``[num_steps, N, ...]`` arrays, computed in one batch (feed slice ``t`` to
        :meth:`step` at step ``t``). Without ``presample_resets`` only the keys are drawn
        (``fresh_obs`` and ``fresh_state`` are ``None``): each step then draws the starts
        it needs from its key."""
        step_key, reset_key = jax.random.split(key)
        shape = (num_steps, self.num_envs)
        if not self.presample_resets:
            return EnvNoise(jax.random.split(step_key, shape), None, None)
        fresh_obs, fresh_state = jax.vmap(jax.vmap(self.env.reset))(
            jax.random.split(reset_key, shape)
        )
        return EnvNoise(jax.random.split(step_key, shape), fresh_obs, fresh_state)

    def step(self, key, state: VecEnvState, actions: jax.Array, gamma: jax.Array,
             noise: EnvNoise | None = None) -> VecEnvStep:
        """Step all copies with ``actions [N, ...]``.

        ``noise`` is one step's slice of :meth:`presample`; without it the random draws
        are made here from ``key`` (which is then the only randomness used). ``gamma``
        discounts the return whose running std scales rewards (``normalize_reward``).

        Returns a :class:`VecEnvStep`; ``reward`` is normalised when asked, ``raw_reward``
        never is (for logging episode returns).
        """
        if noise is None:
            keys, fresh = jax.random.split(key, self.num_envs), None
        elif noise.fresh_obs is None:  # presampled keys only: each step draws its resets
            keys, fresh = noise.keys, None
        else:
            keys, fresh = noise.keys, (noise.fresh_obs, noise.fresh_state)
        obs, env_state, raw_reward, terminated, truncated, final_obs = jax.vmap(self.env.step)(
            keys, state.env_state, actions, fresh
        )
        state = state.replace(env_state=env_state)
        if self.normalize_obs:
            state, obs = self._observe(state, obs)
            final_obs = self._normalise(state.obs_stats, final_obs)
        reward = raw_reward
        if self.normalize_reward:
            done = jnp.logical_or(terminated, truncated)
            discounted = state.discounted_return * gamma + raw_reward
            stats = state.return_stats.update(discounted)
            reward = jnp.clip(raw_reward / jnp.sqrt(stats.var + 1e-8), -10.0, 10.0)
            state = state.replace(
                return_stats=stats, discounted_return=jnp.where(done, 0.0, discounted)
            )
        return VecEnvStep(obs, state, reward, terminated, truncated, final_obs, raw_reward)


def make_vec_env(
    env_id: str, num_envs: int, normalize_obs: bool = False, normalize_reward: bool = False,
    env_params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    presample_resets: bool = True,
) -> VecEnv:
    """``num_envs`` copies of :func:`make_env` ``(env_id, env_params)``."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return VecEnv(make_env(env_id, env_params), num_envs, normalize_obs, normalize_reward,
                  presample_resets)
