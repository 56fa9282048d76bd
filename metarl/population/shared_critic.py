"""TD3 actors that share one twin critic and one replay buffer: what CEM-RL and DvD share.

CEM-RL (:mod:`.cem_rl`) and DvD (:mod:`.dvd`) both train a population of deterministic TD3
actors against **one** twin critic (with its target networks and Adam state) fed by **one**
replay buffer that every actor's transitions go into. This module builds those pieces from
TD3's public parts (:func:`inner_loops.td3.make_networks`, the twin critics, action scaling
and unit-step Adam of :mod:`inner_loops.continuous_control`, :mod:`inner_loops.replay`), so
TD3 itself is untouched:

- :class:`SharedCriticTD3`: the networks, action scaling and ``M x E`` environments (``E``
  per actor) of a :class:`~inner_loops.td3.TD3Config`.
- :meth:`SharedCriticTD3.collect`: ``num_steps`` steps of every actor's environments, all
  transitions into the shared buffer, episodes summarised per environment. An action that
  is not finite is replaced by the middle of the action box before the environment gets it
  (so the buffer never holds a NaN) and the environment's episodes are marked invalid.
- :meth:`SharedCriticTD3.gradient_steps`: ``S`` gradient steps of the shared critic and
  ``K`` actors. At every step each actor ``k`` draws its own batch ``b_k``; the critic
  minimises the mean over ``k`` of TD3's twin TD loss with actor ``k``'s *target* policy
  (clipped double Q, target policy smoothing) on ``b_k`` -- one batch of ``K x B``
  transitions. Every ``policy_delay`` critic steps every actor takes one step on
  ``-mean_b Q_1(s, mu_k(s))`` over its batch (DvD adds ``-weight * log_det_diversity`` of all
  actors' actions on a shared batch of states), and the target networks move by Polyak
  averaging, as in :mod:`inner_loops.td3`.
- Finite by construction: each actor's gradient is clipped to ``max_grad_norm`` (its own
  global norm), and a step whose loss or gradient is not finite is *skipped* -- that actor's
  (or the critic's) parameters and Adam state are kept -- and counted in the diagnostics.

Shapes: ``M`` actors in the population, ``K`` of them taking gradient steps, ``E``
environments per actor, ``B`` batch size, ``A`` action dimensions, ``D`` actor parameters.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from inner_loops import off_policy, replay
from inner_loops.continuous_control import (
    ADAM,
    ActionScale,
    adam_step,
    default_td_loss,
    first_q,
    init_twin_critic,
    make_env_for,
    twin_critic_loss,
    twin_q,
)
from inner_loops.envs import VecEnv
from inner_loops.objective import Objective
from inner_loops.td3 import TD3Config, make_networks
from metarl.population.diversity import log_det_diversity


def check_td3(path: str, inner: Any) -> TD3Config:
    """``inner`` if it is a :class:`~inner_loops.td3.TD3Config`, else a ``ValueError``
    naming ``path`` and the algorithm given (CEM-RL and DvD train TD3 actors)."""
    if isinstance(inner, TD3Config):
        return inner
    from inner_loops import registry

    try:
        name = repr(registry.algorithm_of(inner).name)
    except ValueError:
        name = type(inner).__name__
    raise ValueError(f"{path}: needs a TD3 config (algorithm 'td3': a population of "
                     f"deterministic actors sharing one twin critic), got {name}")


@struct.dataclass
class CriticState:
    """The shared twin critic: parameters, target parameters (leaves ``[2, ...]``) and its
    Adam state."""

    params: Any
    target: Any
    opt: Any


@struct.dataclass
class ActorGroup:
    """``K`` actors that take gradient steps: parameters, target parameters and Adam states,
    every leaf ``[K, ...]``."""

    params: Any
    target: Any
    opt: Any


class EpisodeTotals(NamedTuple):
    """Episodes finished during one :meth:`SharedCriticTD3.collect`, per environment ``[N]``.

    Attributes:
        count: episodes finished.
        return_sum: the sum of their returns (0 when none finished).
        first_return: the return of the first one (NaN when none finished).
        valid: every action the environment's actor chose was finite.
    """

    count: jax.Array
    return_sum: jax.Array
    first_return: jax.Array
    valid: jax.Array


class StepDiagnostics(NamedTuple):
    """What :meth:`SharedCriticTD3.gradient_steps` did, ``[]`` each.

    Attributes:
        critic_loss: mean over the steps of the twin TD loss (both critics summed).
        q_mean: mean first-critic value on the batches.
        actor_loss: mean over actor steps and actors of ``-mean Q_1(s, mu_k(s))``.
        diversity: mean over actor steps of the log-det diversity of the actors' actions
            (0 without a diversity term).
        skipped_critic_steps: critic steps skipped for a non-finite loss or gradient.
        skipped_actor_steps: actor steps skipped (summed over actors), likewise.
    """

    critic_loss: jax.Array
    q_mean: jax.Array
    actor_loss: jax.Array
    diversity: jax.Array
    skipped_critic_steps: jax.Array
    skipped_actor_steps: jax.Array

    @classmethod
    def zeros(cls) -> StepDiagnostics:
        zero = jnp.zeros((), jnp.float32)
        return cls(zero, zero, zero, zero, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


@dataclass(frozen=True)
class Diversity:
    """DvD's term in the actors' joint loss: ``-weight * log_det_diversity(actions of all
    actors on num_states states, length_scale, jitter)`` (see :mod:`.diversity`)."""

    num_states: int
    length_scale: float = 1.0
    jitter: float = 1e-4


def clip_and_check(grads: Any, max_grad_norm: float) -> tuple[Any, jax.Array]:
    """``grads`` (one network's) scaled to global norm at most ``max_grad_norm`` (``0``:
    unclipped) and whether they were finite (``[]`` bool)."""
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    finite = jnp.isfinite(norm)
    if max_grad_norm > 0:
        factor = jnp.minimum(1.0, max_grad_norm / jnp.maximum(norm, 1e-12))
        grads = jax.tree.map(lambda g: g * factor, grads)
    return grads, finite


def keep_unless(ok: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``ok``, else ``old``, leaf by leaf (``ok`` ``[]`` or ``[K]`` against
    leaves ``[K, ...]``)."""
    def choose(n, o):
        mask = jnp.reshape(ok, ok.shape + (1,) * (n.ndim - ok.ndim))
        return jnp.where(mask, n, o)

    return jax.tree.map(choose, new, old)


@dataclass(frozen=True, eq=False)
class SharedCriticTD3:
    """TD3's networks and environments for ``num_members`` actors with ``envs_per_member``
    environments each, sharing one critic and one buffer (see the module docstring).

    Build it with :meth:`build`; every method is a pure function of arrays.
    """

    config: TD3Config
    num_members: int
    envs_per_member: int
    vec_env: VecEnv
    eval_max_steps: int
    scale: ActionScale
    actor: Any
    critic: Any
    objective: Objective
    max_grad_norm: float = 0.0

    @classmethod
    def build(cls, config: TD3Config, num_members: int, envs_per_member: int,
              max_grad_norm: float = 0.0) -> SharedCriticTD3:
        """The pieces for ``config``'s environment and networks. Raises ``ValueError``
        naming ``env_id`` (no such environment, discrete actions) or ``eval_max_steps``
        (no time limit), and ``MemoryError`` when the shared buffer would not fit."""
        vec_env, eval_max_steps = make_env_for(config, "td3")
        vec_env = dataclasses.replace(vec_env, num_envs=num_members * envs_per_member)
        spec = vec_env.spec
        replay.check_buffer_memory(1, config.buffer_size, off_policy.example_transition(spec))
        actor, critic = make_networks(config, len(spec.obs_shape), spec.action_dim)
        objective = Objective().with_defaults(value=default_td_loss(config))
        return cls(config, num_members, envs_per_member, vec_env, eval_max_steps,
                   ActionScale.of(spec), actor, critic, objective, max_grad_norm)

    @property
    def spec(self):
        return self.vec_env.spec

    @property
    def num_envs(self) -> int:
        return self.num_members * self.envs_per_member

    # ----------------------------------------------------------------------- networks

    def example_obs(self) -> jax.Array:
        return jnp.zeros((1, *self.spec.obs_shape), jnp.float32)

    def init_actor(self, key: jax.Array) -> Any:
        """One actor's parameters."""
        return self.actor.init(key, self.example_obs())

    def init_actors(self, key: jax.Array, count: int) -> Any:
        """``count`` independently initialised actors, leaves ``[count, ...]``."""
        return jax.vmap(self.init_actor)(jax.random.split(key, count))

    def init_critic(self, key: jax.Array) -> CriticState:
        obs = self.example_obs()
        action = jnp.zeros((1, self.spec.action_dim), jnp.float32)
        params = init_twin_critic(self.critic, key, obs, action)
        return CriticState(params, params, ADAM.init(params))

    def ravel(self) -> tuple[int, Any]:
        """``(D, unravel)``: an actor's parameter count and the map from a flat ``[D]``
        vector back to its parameters (the inverse of :meth:`flatten`). Known from shapes
        alone: nothing is computed."""
        shapes = jax.eval_shape(self.init_actor, jax.random.PRNGKey(0))
        leaves, treedef = jax.tree.flatten(shapes)
        sizes = [math.prod(leaf.shape) for leaf in leaves]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]

        def unravel(flat: jax.Array) -> Any:
            parts = [flat[o:o + n].reshape(leaf.shape).astype(leaf.dtype)
                     for o, n, leaf in zip(offsets, sizes, leaves, strict=True)]
            return jax.tree.unflatten(treedef, parts)

        return sum(sizes), unravel

    def flatten(self, params: Any) -> jax.Array:
        """One actor's parameters as a flat ``[D]`` float32 vector (leaves in tree order)."""
        return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32)
                                for leaf in jax.tree.leaves(params)])

    def actions(self, params: Any, obs: jax.Array) -> jax.Array:
        """Unit-box actions of actors ``params [M, ...]`` on shared states ``obs [B, ...]``:
        ``[M, B, A]``."""
        return jax.vmap(self.actor.apply, in_axes=(0, None))(params, obs)

    def start_group(self, params: Any) -> ActorGroup:
        """Actors about to take gradient steps: targets copied from ``params [K, ...]``
        and fresh Adam states (as CEM-RL resets each sampled actor's optimiser)."""
        return ActorGroup(params, params, jax.vmap(ADAM.init)(params))

    # ---------------------------------------------------------------------- acting

    def reset(self, key: jax.Array) -> off_policy.Actors:
        """All ``M x E`` environments at the start of an episode (actor ``m`` owns rows
        ``m E .. (m + 1) E - 1``)."""
        return off_policy.reset_actors(self.vec_env, key)

    def collect(self, params: Any, envs: off_policy.Actors, buffer: replay.ReplayBuffer,
                key: jax.Array, num_steps: int, noise_scale: jax.Array,
                warmup: jax.Array | bool = False,
                ) -> tuple[off_policy.Actors, replay.ReplayBuffer, EpisodeTotals]:
        """``num_steps`` steps of every actor's environments, every transition stored.

        Args:
            params: the ``M`` actors, leaves ``[M, ...]``.
            envs: the environments mid-episode.
            buffer: the shared buffer; ``M x E`` transitions are added per step.
            key: randomness of the environments and the action noise.
            num_steps: static.
            noise_scale: standard deviation of the Gaussian noise added to each action in
                the unit box (``0``: the deterministic policy).
            warmup: uniformly random actions instead of the actors'.

        Returns ``(envs, buffer, totals)`` with :class:`EpisodeTotals` per environment.
        """
        members, per_member, action_dim = self.num_members, self.envs_per_member, \
            self.spec.action_dim
        env_key, normal_key, uniform_key = jax.random.split(key, 3)
        env_noise = self.vec_env.presample(env_key, num_steps)
        shape = (num_steps, members, per_member, action_dim)
        normal = jax.random.normal(normal_key, shape)
        uniform = jax.random.uniform(uniform_key, shape, minval=-1.0, maxval=1.0)
        num_envs = self.num_envs

        def step(carry, inputs):
            envs, buffer, totals = carry
            env_noise_t, normal_t, uniform_t = inputs
            obs = envs.obs.reshape(members, per_member, *envs.obs.shape[1:])
            unit = jax.vmap(self.actor.apply)(params, obs)
            unit = jnp.clip(unit + noise_scale * normal_t, -1.0, 1.0)
            unit = jnp.where(warmup, uniform_t, unit)
            finite = jnp.all(jnp.isfinite(unit), axis=-1).reshape(num_envs)
            unit = unit.reshape(num_envs, action_dim)
            action = self.scale.to_env(jnp.where(finite[:, None], unit, 0.0))
            result = self.vec_env.step(None, envs.env_state, action, jnp.float32(1.0),
                                       env_noise_t)
            buffer = replay.add(buffer, off_policy.Transition(
                envs.obs, action, result.reward, result.final_obs, result.terminated))
            done = jnp.logical_or(result.terminated, result.truncated)
            running = envs.episodes.running_return + result.raw_reward
            length = envs.episodes.running_length + 1.0
            totals = EpisodeTotals(
                count=totals.count + done.astype(jnp.int32),
                return_sum=totals.return_sum + jnp.where(done, running, 0.0),
                first_return=jnp.where(done & jnp.isnan(totals.first_return), running,
                                       totals.first_return),
                valid=totals.valid & finite,
            )
            episodes = off_policy.EpisodeStats(jnp.where(done, 0.0, running),
                                               jnp.where(done, 0.0, length))
            return (off_policy.Actors(result.state, result.obs, episodes), buffer, totals), None

        totals = EpisodeTotals(jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs, jnp.float32),
                               jnp.full(num_envs, jnp.nan, jnp.float32),
                               jnp.ones(num_envs, jnp.bool_))
        (envs, buffer, totals), _ = jax.lax.scan(step, (envs, buffer, totals),
                                                 (env_noise, normal, uniform))
        return envs, buffer, totals

    def per_member(self, values: jax.Array) -> jax.Array:
        """``[M x E] -> [M, E]``: an environment-wise quantity grouped by actor."""
        return values.reshape(self.num_members, self.envs_per_member)

    def evaluate(self, params: Any, key: jax.Array, num_episodes: int) -> jax.Array:
        """``[]`` mean return of ``num_episodes`` deterministic episodes of one actor
        (not stored, not counted as training steps)."""
        def policy(obs):
            return self.scale.to_env(self.actor.apply(params, obs))

        return off_policy.evaluate_policy(self.vec_env.env, policy, key, num_episodes,
                                          self.eval_max_steps).eval_return

    # ------------------------------------------------------------------ gradient steps

    def critic_loss(self, critic_params: Any, critic_target: Any, target_actors: Any,
                    batch: off_policy.Transition, smoothing: jax.Array, hypers: Any,
                    progress: jax.Array) -> tuple[jax.Array, jax.Array]:
        """TD3's twin TD loss averaged over ``K`` actors: ``batch`` leaves ``[K, B, ...]``,
        ``smoothing [K, B, A]`` standard normal, ``target_actors`` leaves ``[K, ...]``.
        Returns ``(loss, q_mean)``."""
        noise = jnp.clip(hypers.target_noise * smoothing, -hypers.noise_clip, hypers.noise_clip)
        next_action = jax.vmap(self.actor.apply)(target_actors, batch.next_obs)
        next_action = jnp.clip(next_action + noise, -1.0, 1.0)
        flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), batch)
        next_action = next_action.reshape(-1, next_action.shape[-1])
        next_q = jnp.min(twin_q(self.critic, critic_target, flat.next_obs, next_action), axis=0)
        targets = off_policy.td_target(flat.reward, next_q, flat.terminated, hypers.gamma)
        q = twin_q(self.critic, critic_params, flat.obs, self.scale.to_unit(flat.action))
        loss = twin_critic_loss(self.objective, self.objective.init(jax.random.PRNGKey(0)), q,
                                jax.lax.stop_gradient(targets), progress)
        return loss, jnp.mean(q[0])

    def actor_loss(self, params: Any, critic_params: Any, obs: jax.Array,
                   diversity_obs: jax.Array | None, weight: jax.Array,
                   diversity: Diversity | None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """The actors' joint loss ``sum_k -mean_b Q_1(s_kb, mu_k(s_kb)) - weight *
        log_det_diversity(mu_1..K(diversity_obs))`` for ``params`` leaves ``[K, ...]``,
        ``obs [K, B, ...]``. Returns ``(loss, (per-actor TD3 loss [K], log-det []))``."""
        def td3_loss(p, o):
            return -jnp.mean(first_q(self.critic, critic_params, o, self.actor.apply(p, o)))

        per_actor = jax.vmap(td3_loss)(params, obs)
        loss = jnp.sum(per_actor)
        if diversity is None:
            return loss, (per_actor, jnp.zeros((), jnp.float32))
        log_det = log_det_diversity(self.actions(params, diversity_obs), diversity.length_scale,
                                    diversity.jitter)
        return loss - weight * log_det, (per_actor, log_det)

    def gradient_steps(self, critic: CriticState, group: ActorGroup,
                       buffer: replay.ReplayBuffer, hypers: Any, key: jax.Array,
                       num_steps: int, progress: jax.Array | float = 0.0,
                       diversity: Diversity | None = None,
                       weight: jax.Array | float = 0.0,
                       ) -> tuple[CriticState, ActorGroup, StepDiagnostics]:
        """``num_steps`` critic steps and ``num_steps / policy_delay`` steps of every actor
        in ``group`` (see the module docstring); ``policy_delay`` must divide
        ``num_steps``. ``hypers`` is TD3's :class:`~inner_loops.td3.Hyperparams` (``[]``
        each, shared by the population)."""
        config = self.config
        delay = config.policy_delay
        if num_steps % delay:
            raise ValueError(f"gradient_steps: {num_steps} is not a multiple of policy_delay "
                             f"= {delay}")
        blocks = num_steps // delay
        count = jax.tree.leaves(group.params)[0].shape[0]
        batch, action_dim = config.batch_size, self.spec.action_dim
        index_key, noise_key, diversity_key = jax.random.split(key, 3)
        indices = replay.sample_index_batches(buffer, index_key, num_steps * count, batch)
        indices = indices.reshape(blocks, delay, count, batch)
        smoothing = jax.random.normal(noise_key, (blocks, delay, count, batch, action_dim))
        num_states = diversity.num_states if diversity is not None else 1
        diversity_indices = replay.sample_index_batches(buffer, diversity_key, blocks,
                                                        num_states)
        objective_progress = jnp.asarray(progress, jnp.float32)
        weight = jnp.asarray(weight, jnp.float32)
        max_norm = self.max_grad_norm

        def critic_step(carry, inputs):
            critic, group = carry
            step_indices, step_smoothing = inputs
            sample = replay.gather(buffer, step_indices)
            (loss, q_mean), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
                critic.params, critic.target, group.target, sample, step_smoothing, hypers,
                objective_progress)
            _, finite = clip_and_check(grads, 0.0)
            ok = finite & jnp.isfinite(loss)
            params, opt = adam_step(critic.params, critic.opt, grads,
                                    hypers.critic_learning_rate)
            params, opt = keep_unless(ok, (params, opt), (critic.params, critic.opt))
            critic = critic.replace(params=params, opt=opt)
            return (critic, group), (loss, q_mean, jnp.logical_not(ok))

        def block(carry, inputs):
            block_indices, block_smoothing, block_diversity = inputs
            (critic, group), (losses, q_means, critic_skipped) = jax.lax.scan(
                critic_step, carry, (block_indices, block_smoothing))
            # the actors step on the block's last batches, as TD3's actor uses the batch of
            # the critic step it follows
            obs = replay.gather(buffer, block_indices[-1]).obs
            diversity_obs = replay.gather(buffer, block_diversity).obs
            (_, (per_actor, log_det)), grads = jax.value_and_grad(
                self.actor_loss, has_aux=True)(group.params, critic.params, obs, diversity_obs,
                                               weight, diversity)
            grads, finite = jax.vmap(lambda g: clip_and_check(g, max_norm))(grads)
            ok = finite & jnp.isfinite(per_actor) & jnp.isfinite(log_det)
            params, opt = jax.vmap(adam_step, in_axes=(0, 0, 0, None))(
                group.params, group.opt, grads, hypers.actor_learning_rate)
            params, opt = keep_unless(ok, (params, opt), (group.params, group.opt))
            group = ActorGroup(params, off_policy.polyak_update(group.target, params, hypers.tau),
                               opt)
            critic = critic.replace(target=off_policy.polyak_update(critic.target, critic.params,
                                                                    hypers.tau))
            outputs = (losses.mean(), q_means.mean(), jnp.mean(per_actor), log_det,
                       critic_skipped.sum(dtype=jnp.int32),
                       jnp.logical_not(ok).sum(dtype=jnp.int32))
            return (critic, group), outputs

        (critic, group), outputs = jax.lax.scan(block, (critic, group),
                                                (indices, smoothing, diversity_indices))
        losses, q_means, actor_losses, log_dets, critic_skipped, actor_skipped = outputs
        return critic, group, StepDiagnostics(
            critic_loss=losses.mean(), q_mean=q_means.mean(), actor_loss=actor_losses.mean(),
            diversity=log_dets.mean(), skipped_critic_steps=critic_skipped.sum(),
            skipped_actor_steps=actor_skipped.sum())
