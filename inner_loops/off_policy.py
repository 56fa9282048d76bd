"""Pieces every off-policy learner (DQN, TD3, SAC) shares, none specific to one of them.

- :class:`Transition` and :func:`example_transition`: what a replay buffer stores.
- :func:`collect`: ``num_steps`` steps of ``N`` environments under any acting function,
  every transition added to the replay buffer, finished episodes summarised. A step that
  ended by truncation (time limit) is stored with ``terminated = False`` and the final
  observation it reached (not the auto-reset one) as ``next_obs``, so its TD target
  bootstraps from where the episode was cut; a terminated step does not bootstrap.
- :func:`td_target`, :func:`polyak_update`, :func:`periodic_update`: targets and target
  networks, with traced rates so every member of a population has its own.
- :func:`uniform_actions`: the warm-up policy.
- :func:`evaluate_policy`: deterministic episodes (greedy or mean action) of a fixed policy,
  reported as ``eval_return`` / ``eval_length`` beside the training ``episode_return``.

Everything is a pure function of arrays, so it runs inside ``jit`` and ``vmap`` over agents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from inner_loops import replay
from inner_loops.envs import Env, EnvSpec, VecEnv, VecEnvState

# (obs [N, *obs_shape], noise for one step) -> actions [N] int32 or [N, A] float32
ActFn = Callable[[jax.Array, Any], jax.Array]


class UpdateSchedule:
    """How an off-policy config's budget divides into updates, and the checks that it fits,
    shared by every off-policy config class (which defines ``num_envs``,
    ``train_frequency``, ``total_timesteps``, ``learning_starts``, ``batch_size`` and
    ``buffer_size``)."""

    @property
    def steps_per_update(self) -> int:
        """Environment steps one agent takes per update."""
        return self.num_envs * self.train_frequency

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.steps_per_update

    @property
    def steps_per_agent(self) -> int:
        """Environment steps one agent actually takes (whole updates only)."""
        return self.num_updates * self.steps_per_update

    @property
    def warmup_updates(self) -> int:
        """Updates that only collect: the first update with gradient steps is the first
        after which the buffer holds ``learning_starts`` transitions."""
        return -(-self.learning_starts // self.steps_per_update) - 1

    def check_schedule(self) -> None:
        """The budget, buffer, batch and warm-up fit together; a ``ValueError`` names the
        field that does not."""
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size: {self.batch_size} is larger than the replay "
                             f"capacity (buffer_size = {self.buffer_size})")
        if self.num_envs > self.buffer_size:
            raise ValueError(f"buffer_size: {self.buffer_size} is smaller than one step of "
                             f"num_envs = {self.num_envs} environments")
        if self.learning_starts < self.batch_size:
            raise ValueError(f"learning_starts: {self.learning_starts} is less than one batch "
                             f"(batch_size = {self.batch_size}); the first gradient step "
                             "needs that many transitions")
        if self.total_timesteps < self.steps_per_update:
            raise ValueError(f"total_timesteps: {self.total_timesteps} is less than one "
                             f"update (num_envs * train_frequency = {self.steps_per_update})")
        if self.learning_starts > self.steps_per_agent - self.steps_per_update:
            raise ValueError(
                f"learning_starts: {self.learning_starts} leaves no update with gradient steps "
                f"within total_timesteps = {self.total_timesteps} (the last update starts "
                f"after {self.steps_per_agent - self.steps_per_update} steps)")


class Transition(NamedTuple):
    """One environment step as stored for replay (each field gains ``[n]`` / ``[capacity]``
    leading axes in batches and buffers).

    Attributes:
        obs: ``[*obs_shape]`` float32 observation the action was taken in.
        action: ``[]`` int32 (discrete) or ``[A]`` float32, the action the environment got.
        reward: ``[]`` float32.
        next_obs: ``[*obs_shape]`` float32 observation the step reached, before any reset.
        terminated: ``[]`` bool, the step reached a terminal state: its target does not
            bootstrap. A truncated step has ``False`` here and bootstraps from ``next_obs``.
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminated: jax.Array


def example_transition(spec: EnvSpec) -> Transition:
    """One transition of environment ``spec`` as ``jax.ShapeDtypeStruct`` s (for
    :func:`inner_loops.replay.init` and memory figures; nothing is allocated)."""
    obs = jax.ShapeDtypeStruct(spec.obs_shape, jnp.float32)
    if spec.discrete:
        action = jax.ShapeDtypeStruct((), jnp.int32)
    else:
        action = jax.ShapeDtypeStruct((spec.action_dim,), jnp.float32)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    return Transition(obs, action, scalar, obs, jax.ShapeDtypeStruct((), jnp.bool_))


@struct.dataclass
class EpisodeStats:
    """Return and length so far of each environment's unfinished episode, ``[N]`` each."""

    running_return: jax.Array
    running_length: jax.Array

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeStats:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.float32))


class EpisodeSummary(NamedTuple):
    """Episodes finished during a stretch of steps: ``count``, and the sums of their
    returns and lengths (``[]`` each; the sums are 0 when none finished)."""

    count: jax.Array
    return_sum: jax.Array
    length_sum: jax.Array

    def mean_return(self, previous: jax.Array) -> jax.Array:
        """Mean return of the finished episodes, or ``previous`` when none finished."""
        return jnp.where(self.count > 0, self.return_sum / jnp.maximum(self.count, 1),
                         previous)

    def mean_length(self, previous: jax.Array) -> jax.Array:
        """Mean length of the finished episodes, or ``previous`` when none finished."""
        return jnp.where(self.count > 0, self.length_sum / jnp.maximum(self.count, 1),
                         previous)


def update_metrics(diagnostics: dict[str, jax.Array], finished: EpisodeSummary,
                   last_return: jax.Array, last_length: jax.Array, learning: jax.Array,
                   **extra: jax.Array) -> dict[str, jax.Array]:
    """The metrics of one off-policy update: the learning step's ``diagnostics`` (``[]``
    each), ``finite`` (all of them finite), the episodes finished during the update
    (``episode_return`` and ``episode_length``: their means, or ``last_return`` /
    ``last_length`` when none finished; ``episodes``: how many), ``learning`` (whether the
    update took gradient steps) and the algorithm's ``extra`` metrics."""
    return {**diagnostics,
            "finite": jnp.all(jnp.isfinite(jnp.stack(list(diagnostics.values())))),
            "episode_return": finished.mean_return(last_return),
            "episode_length": finished.mean_length(last_length),
            "episodes": finished.count, **extra, "learning": learning}


@struct.dataclass
class Actors:
    """The acting side of an off-policy agent: ``N`` environments mid-episode.

    Attributes:
        env_state: their :class:`~inner_loops.envs.VecEnvState`.
        obs: ``[N, *obs_shape]`` current observations.
        episodes: their unfinished episodes' running returns and lengths.
    """

    env_state: VecEnvState
    obs: jax.Array
    episodes: EpisodeStats


def reset_actors(vec_env: VecEnv, key: jax.Array) -> Actors:
    """``N`` environments at the start of an episode."""
    obs, env_state = vec_env.reset(key)
    return Actors(env_state, obs, EpisodeStats.zeros(vec_env.num_envs))


def collect(vec_env: VecEnv, act: ActFn, actors: Actors, buffer: replay.ReplayBuffer,
            key: jax.Array, num_steps: int, action_noise: Any = None,
            ) -> tuple[Actors, replay.ReplayBuffer, EpisodeSummary]:
    """Step ``N`` environments ``num_steps`` times with ``act`` and store every transition.

    Args:
        vec_env: the environments (without reward normalisation: stored rewards must not
            change meaning as statistics move).
        act: ``(obs [N, ...], noise) -> actions`` for one step; its actions are what the
            environments get and what is stored, so clip continuous actions inside it.
        actors: where the environments are.
        buffer: the agent's replay buffer; ``N`` transitions are added per step.
        key: randomness of the environments (dynamics and fresh episode starts, drawn in
            one batch up front).
        num_steps: static number of steps.
        action_noise: a pytree whose leaves have a leading ``[num_steps]`` axis; slice ``t``
            is ``act``'s ``noise`` at step ``t`` (draw it in one batch: per-step random
            draws are slow on the CPU). ``None`` gives ``act`` ``None``.

    Returns ``(actors, buffer, summary)`` with the episodes finished in these steps.
    """
    env_noise = vec_env.presample(key, num_steps)

    def step(carry, noise):
        actors, buffer = carry
        action_noise_t, env_noise_t = noise
        actions = act(actors.obs, action_noise_t)
        result = vec_env.step(None, actors.env_state, actions, jnp.float32(1.0), env_noise_t)
        transition = Transition(actors.obs, actions, result.reward, result.final_obs,
                                result.terminated)
        buffer = replay.add(buffer, transition)
        done = jnp.logical_or(result.terminated, result.truncated)
        running_return = actors.episodes.running_return + result.raw_reward
        running_length = actors.episodes.running_length + 1.0
        finished = EpisodeSummary(
            done.sum(dtype=jnp.int32),
            jnp.sum(jnp.where(done, running_return, 0.0)),
            jnp.sum(jnp.where(done, running_length, 0.0)),
        )
        episodes = EpisodeStats(jnp.where(done, 0.0, running_return),
                                jnp.where(done, 0.0, running_length))
        return (Actors(result.state, result.obs, episodes), buffer), finished

    (actors, buffer), finished = jax.lax.scan(step, (actors, buffer),
                                              (action_noise, env_noise))
    summary = EpisodeSummary(*(x.sum(axis=0) for x in finished))
    return actors, buffer, summary


def td_target(reward: jax.Array, next_value: jax.Array, terminated: jax.Array,
              gamma: jax.Array) -> jax.Array:
    """One-step TD target ``r + gamma * (1 - terminated) * V(next_obs)``, shapes ``[B]``."""
    return reward + gamma * (1.0 - terminated.astype(reward.dtype)) * next_value


def polyak_update(target: Any, online: Any, tau: jax.Array) -> Any:
    """Target parameters moved ``tau`` of the way to the online ones (``tau = 1``: a copy)."""
    return jax.tree.map(lambda t, o: t + tau * (o - t), target, online)


def periodic_update(target: Any, online: Any, tau: jax.Array, update_count: jax.Array,
                    period: int) -> Any:
    """:func:`polyak_update` on every ``period``-th gradient step (``update_count`` counts
    them, so the schedule survives training in segments), else ``target`` unchanged. A hard
    update every ``period`` steps is ``tau = 1``; Polyak averaging every step is
    ``period = 1``. Uses ``where``, not ``cond``: under ``vmap`` both would run anyway."""
    moved = polyak_update(target, online, tau)
    due = (update_count % period) == 0
    return jax.tree.map(lambda m, t: jnp.where(due, m, t), moved, target)


def uniform_actions(key: jax.Array, spec: EnvSpec, shape: tuple[int, ...]) -> jax.Array:
    """Actions drawn uniformly: ``shape`` int32 in ``[0, action_dim)`` (discrete) or
    ``[*shape, A]`` float32 within the action bounds (continuous)."""
    if spec.discrete:
        return jax.random.randint(key, shape, 0, spec.action_dim, dtype=jnp.int32)
    low = jnp.asarray(spec.action_low, jnp.float32)
    high = jnp.asarray(spec.action_high, jnp.float32)
    return jax.random.uniform(key, (*shape, spec.action_dim), jnp.float32, low, high)


class Evaluation(NamedTuple):
    """Deterministic episodes of one policy: ``eval_return`` and ``eval_length`` are the
    means over the episodes (``[]`` each)."""

    eval_return: jax.Array
    eval_length: jax.Array


def evaluate_policy(env: Env, act: Callable[[jax.Array], jax.Array], key: jax.Array,
                    num_episodes: int, max_steps: int) -> Evaluation:
    """Run ``num_episodes`` episodes of ``env`` side by side with the deterministic policy
    ``act(obs [num_episodes, ...]) -> actions`` for at most ``max_steps`` steps each.

    Each environment counts only its first episode; one still running after ``max_steps``
    counts with its return so far (set ``max_steps`` to the time limit,
    ``spec.max_episode_steps``, to see whole episodes). ``key`` draws the starts and any
    randomness of the dynamics; the policy itself adds none.
    """
    reset_key, step_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))
    # Ended episodes are frozen, so their resets are never looked at: hand the step the
    # first starts as "fresh" ones instead of drawing new ones every step.
    fresh = (obs, state)
    step_keys = jax.random.split(step_key, (max_steps, num_episodes))

    def step(carry, keys):
        obs, state, running, total, length = carry
        actions = act(obs)
        result = jax.vmap(env.step)(keys, state, actions, fresh)
        total = total + jnp.where(running, result.reward, 0.0)
        length = length + running.astype(jnp.float32)
        running = jnp.logical_and(
            running, jnp.logical_not(jnp.logical_or(result.terminated, result.truncated)))
        return (result.obs, result.state, running, total, length), None

    zeros = jnp.zeros(num_episodes, jnp.float32)
    carry = (obs, state, jnp.ones(num_episodes, jnp.bool_), zeros, zeros)
    (_, _, _, total, length), _ = jax.lax.scan(step, carry, step_keys)
    return Evaluation(total.mean(), length.mean())
