"""What an environment is to the learners: its static facts, one step's result, and the
pair of pure functions every environment of the adapter (:mod:`inner_loops.envs`), of the
optional JAX packages (:mod:`inner_loops.jax_envs`) and every probe task
(:mod:`inner_loops.probe_envs`) is made of; and the helpers those adapters share to read
``env_params`` and to reset ended episodes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PROBE_PREFIX = "probe/"  # ids of the probe tasks of inner_loops.probe_envs

# (name, value) pairs sorted by name: the hashable form of an ``env_params`` mapping
EnvParamPairs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class EnvSpec:
    """Static facts about an environment that set array shapes.

    Attributes:
        env_id: the id it was made from.
        obs_shape: shape of one observation.
        discrete: whether actions are integers in ``[0, num_actions)``.
        action_dim: number of discrete actions, or the size of a continuous action vector.
        action_low, action_high: bounds of continuous actions (``None`` when discrete).
        max_episode_steps: the time limit of an episode, when the environment has one.
    """

    env_id: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    max_episode_steps: int | None = None


class EnvStep(NamedTuple):
    """What one step of one environment returns (see :mod:`inner_loops.envs`).

    Attributes:
        obs: the next observation (a fresh episode's first one where the episode ended).
        state: the next state (likewise reset where the episode ended).
        reward: ``[]`` float32.
        terminated: ``[]`` the episode reached a terminal state (no bootstrap).
        truncated: ``[]`` the episode hit its time limit without terminating (bootstrap
            from ``final_obs``).
        final_obs: the observation the step reached, before any reset.
    """

    obs: jax.Array
    state: Any
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array


@dataclass(frozen=True)
class Env:
    """A single environment as two pure functions (see :mod:`inner_loops.envs`)."""

    spec: EnvSpec
    reset: Any
    step: Any


def integer_param(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (``2.0`` is fine, ``2.5`` and ``True`` are not)."""
    if (isinstance(value, bool) or not float(value).is_integer()
            or (minimum is not None and value < minimum)):
        wanted = "a positive integer" if minimum == 1 else "an integer"
        raise ValueError(f"env_params.{name}: expected {wanted}, got {value!r}")
    return int(value)


def with_overrides(env_id: str, params: Any, pairs: EnvParamPairs) -> Any:
    """``params`` (an environment's struct dataclass: gymnax's, Craftax's) with the scalar fields
    named in ``pairs`` replaced, each checked against the type of its default."""
    scalars = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
               if isinstance(getattr(params, f.name), bool | int | float)}
    changes = {}
    for name, value in pairs:
        if name not in scalars:
            raise ValueError(
                f"env_params.{name}: {env_id} has no such scalar parameter; allowed: "
                f"{', '.join(scalars)}"
            )
        default = scalars[name]
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"env_params.{name}: expected true or false, got {value!r}")
        elif isinstance(default, int):
            value = integer_param(name, value)
        elif isinstance(value, bool):
            raise ValueError(f"env_params.{name}: expected a number, got {value!r}")
        else:
            value = float(value)
        changes[name] = value
    return params.replace(**changes)


def auto_reset(fresh: Any, final_obs: jax.Array, next_state: Any, reward: jax.Array,
               terminated: jax.Array, truncated: jax.Array) -> EnvStep:
    """One step's :class:`EnvStep`, episodes reset automatically.

    Where the episode ended (``terminated`` or ``truncated``, ``[]`` bools) the next
    observation and state are ``fresh``'s, a new episode's ``(obs, state)``; elsewhere
    they are ``final_obs`` (``[obs]``, what the step reached, kept in the result for
    bootstrapping) and ``next_state``. ``reward`` becomes ``[]`` float32.
    """
    ended = jnp.logical_or(terminated, truncated)
    obs, state = jax.tree.map(lambda a, b: jnp.where(ended, a, b), fresh,
                              (final_obs, next_state))
    return EnvStep(obs, state, jnp.asarray(reward, jnp.float32), terminated, truncated,
                   final_obs)
