"""What an environment is to the learners: its static facts, one step's result, and the
pair of pure functions every environment of the adapter (:mod:`inner_loops.envs`) and every
probe task (:mod:`inner_loops.probe_envs`) is made of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax

PROBE_PREFIX = "probe/"  # ids of the probe tasks of inner_loops.probe_envs


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
