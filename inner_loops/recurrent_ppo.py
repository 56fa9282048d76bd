"""Recurrent PPO: PPO with a GRU core, for partially observed tasks.

The actor-critic is :class:`~inner_loops.networks.RecurrentActorCritic`: a GRU cell of
``gru_size`` units reads each observation, and separate actor and critic MLPs read its
hidden state. Each environment's hidden state ``[H]`` is part of the agent's state: zeroed
where an episode starts (the previous step ended one), carried from step to step, across
rollouts and across ``advance`` calls, so ``train`` equals ``init`` then ``advance`` in
segments, bit for bit.

An update is PPO's (:mod:`inner_loops.ppo`): a rollout of ``T = num_steps`` steps of
``N = num_envs`` environments, GAE, and ``update_epochs`` passes of minibatch gradient steps,
with PPO's loss slots (``"policy"``, ``"value"``) and optimiser slot filled the same way.
What differs is the batch: a minibatch is ``N / num_minibatches`` whole environments'
sequences ``[T, N / num_minibatches]``, never single steps, and the loss re-runs the GRU over
each sequence from the hidden state the rollout started from, resetting where the rollout
did. The value an episode's truncated final observation bootstraps from is the critic after
one more cell step from the hidden state of the episode's last step.

:class:`RecurrentPPOConfig` is :class:`~inner_loops.ppo.PPOConfig` plus ``gru_size``; its
``num_minibatches`` must divide ``num_envs``. The numeric hyperparameters are PPO's
:class:`~inner_loops.ppo.Hyperparams`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from inner_loops import networks, ppo
from inner_loops.envs import EnvSpec, VecEnvState
from inner_loops.learner import Learner
from inner_loops.linear import resolve_matmul
from inner_loops.objective import Objective
from inner_loops.ppo import EpisodeStats, Hyperparams, PPOConfig, PPOParts, Transition
from inner_loops.registry import register_algorithm
from inner_loops.validation import check_positive_int


@dataclass(frozen=True)
class RecurrentPPOConfig(PPOConfig):
    """Settings of one recurrent PPO agent: every field of
    :class:`~inner_loops.ppo.PPOConfig` (same defaults, same checks), plus:

    Attributes:
        gru_size: units of the GRU core (the hidden state of one environment is
            ``[gru_size]``); ``hidden_sizes`` are then the widths of the actor and critic
            MLPs on top of it.

    ``num_minibatches`` must divide ``num_envs``: a minibatch holds whole environments'
    rollout sequences. Two of PPO's choices have one value here, and others are refused:
    ``shuffle = "sort"`` (whole environments are shuffled, by
    :func:`~inner_loops.ppo.shuffled_indices`) and ``final_values = "batched"`` (a truncated
    episode's final observation is valued after the rollout, one cell step from the hidden
    state of its last step). ``env_resets`` and ``matmul`` act as in PPO.
    """

    gru_size: int = 64

    def __post_init__(self):
        check_positive_int("gru_size", self.gru_size)
        # PPO's alternatives are written for a batch of single steps; accepting them here
        # would record a choice that does not act
        for name, only, why in (
                ("shuffle", "sort", "its minibatches are whole environments' sequences, "
                                    "ordered by one packed sort"),
                ("final_values", "batched", "it values each final observation after the "
                                            "rollout, from the GRU state of the episode's "
                                            "last step")):
            if getattr(self, name) != only:
                raise ValueError(f"{name}: got {getattr(self, name)!r}; recurrent PPO allows "
                                 f"only {only!r} ({why})")
        for name in ("num_envs", "num_minibatches"):
            check_positive_int(name, getattr(self, name))
        if self.num_envs % self.num_minibatches:
            divisors = [d for d in range(1, self.num_envs + 1) if self.num_envs % d == 0]
            raise ValueError(
                f"num_minibatches: {self.num_minibatches} does not divide num_envs = "
                f"{self.num_envs} (a minibatch holds whole sequences of environments); "
                f"allowed: {', '.join(map(str, divisors))}"
            )
        super().__post_init__()

    @property
    def envs_per_minibatch(self) -> int:
        return self.num_envs // self.num_minibatches


@struct.dataclass
class RecurrentPPOState:
    """Everything one recurrent PPO agent carries from update to update.

    :class:`~inner_loops.ppo.PPOState`'s fields, plus:

    Attributes:
        hidden: ``[N, H]`` the GRU's hidden state after the last observation each
            environment read (before any reset for the current one).
        starts: ``[N]`` bool, the current observation begins an episode (the hidden state
            is zeroed before reading it); all true after ``init``.
    """

    params: Any
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array
    hidden: jax.Array
    starts: jax.Array
    episodes: EpisodeStats
    last_return: jax.Array
    last_length: jax.Array
    key: jax.Array
    update_count: jax.Array


class RecurrentCarry(NamedTuple):
    """What one environment step of the rollout hands to the next."""

    params: Any
    env_state: Any
    obs: jax.Array
    hidden: jax.Array
    starts: jax.Array
    episodes: EpisodeStats


class SequenceBatch(NamedTuple):
    """What the loss reads of whole sequences: ``hidden [N, H]`` at the rollout's start,
    and ``[T, N, ...]`` steps (``starts``, ``obs``, ``action``, ``log_prob``, ``value``,
    ``advantages``, ``targets``); a minibatch has ``N / num_minibatches`` in place of
    ``N``."""

    hidden: jax.Array
    starts: jax.Array
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantages: jax.Array
    targets: jax.Array


def make_network(config: RecurrentPPOConfig, spec: EnvSpec) -> networks.RecurrentActorCritic:
    """The recurrent actor-critic of ``config`` for environment ``spec``."""
    return networks.RecurrentActorCritic(
        action_dim=spec.action_dim,
        discrete=spec.discrete,
        obs_ndim=len(spec.obs_shape),
        gru_size=config.gru_size,
        hidden_sizes=config.hidden_sizes,
        activation=config.activation,
        precision=config.precision,
        matmul=resolve_matmul(config.matmul),
    )


def init_state(parts: PPOParts, key: jax.Array, meta_params,
               hypers: Hyperparams) -> RecurrentPPOState:
    """A fresh agent: reset environments, new parameters, zero hidden states."""
    config = parts.config
    key, init_key, reset_key = jax.random.split(key, 3)
    obs, env_state = parts.vec_env.reset(reset_key)
    hidden = jnp.zeros((config.num_envs, config.gru_size), jnp.float32)
    starts = jnp.ones(config.num_envs, jnp.bool_)
    params = parts.network.init(init_key, hidden, obs, starts)
    nan = jnp.full((), jnp.nan, jnp.float32)
    return RecurrentPPOState(
        params=params,
        opt_state=ppo.init_optimizer(parts, params, meta_params, hypers),
        env_state=env_state,
        obs=obs,
        hidden=hidden,
        starts=starts,
        episodes=EpisodeStats(jnp.zeros(config.num_envs), jnp.zeros(config.num_envs)),
        last_return=nan,
        last_length=nan,
        key=key,
        update_count=jnp.zeros((), jnp.int32),
    )


def rollout_step(parts: PPOParts, hypers: Hyperparams, carry: RecurrentCarry, noise):
    """One step of the ``N`` environments under the current policy.

    Returns the next carry and ``(Transition, EpisodeEnds, starts [N], hidden [N, H])`` of
    this step: whether its observation began an episode, and the hidden state after it.
    """
    params, env_state, obs, hidden, starts, episodes = carry
    action_noise, env_noise = noise
    hidden, (logits_or_mean, log_std, value) = parts.network.apply(params, hidden, obs, starts)
    action, log_prob = networks.action_from_noise(action_noise, parts.discrete,
                                                  logits_or_mean, log_std)
    step, done, episodes, finished = ppo.step_environments(parts, hypers, env_state, episodes,
                                                           action, env_noise)
    transition = Transition(obs, action, log_prob, value, step.reward, step.terminated,
                            done, step.final_obs)
    carry = RecurrentCarry(params, step.state, step.obs, hidden, done, episodes)
    return carry, (transition, finished, starts, hidden)


def collect_rollout(parts: PPOParts, hypers: Hyperparams, state: RecurrentPPOState,
                    action_key: jax.Array, env_key: jax.Array):
    """``T = num_steps`` steps of the ``N`` environments from ``state``.

    Returns ``(carry, rollout, finished, starts, hiddens)``: the :class:`RecurrentCarry`
    after the last step, the :class:`~inner_loops.ppo.Transition` s ``[T, N, ...]``, the
    :class:`~inner_loops.ppo.EpisodeEnds` ``[T, N]``, ``starts [T, N]`` and the hidden
    states after each step ``[T, N, H]``.
    """
    config = parts.config
    noise = (
        networks.action_noise(action_key, parts.discrete,
                              (config.num_steps, config.num_envs, parts.vec_env.spec.action_dim)),
        parts.vec_env.presample(env_key, config.num_steps),
    )
    carry = RecurrentCarry(state.params, state.env_state, state.obs, state.hidden,
                           state.starts, state.episodes)
    with jax.named_scope("rollout"):
        carry, (rollout, finished, starts, hiddens) = jax.lax.scan(
            functools.partial(rollout_step, parts, hypers), carry, noise)
    return carry, rollout, finished, starts, hiddens


def split_into_sequences(config: RecurrentPPOConfig, batch: SequenceBatch,
                         key: jax.Array) -> SequenceBatch:
    """``batch``'s environments shuffled and cut into ``num_minibatches`` groups: ``hidden
    [M, N / M, H]`` and steps ``[M, T, N / M, ...]`` (``M = num_minibatches``)."""
    order = ppo.shuffled_indices(key, config.num_envs)
    groups = (config.num_minibatches, config.envs_per_minibatch)

    def steps(x):  # [T, N, ...] -> [M, T, N / M, ...]
        x = x[:, order].reshape(config.num_steps, *groups, *x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    hidden = batch.hidden[order].reshape(*groups, *batch.hidden.shape[1:])
    return SequenceBatch(hidden, *map(steps, batch[1:]))


def sequence_loss(parts: PPOParts, params, meta_params, hypers: Hyperparams,
                  progress: jax.Array, minibatch: SequenceBatch):
    """PPO's loss (:func:`~inner_loops.ppo.policy_value_loss`) on whole sequences
    ``[T, B]``, the GRU re-run over each from ``minibatch.hidden [B, H]``."""
    _, (logits_or_mean, log_std, values) = networks.unroll(
        parts.network, params, minibatch.hidden, minibatch.obs, minibatch.starts)
    return ppo.policy_value_loss(parts, meta_params, hypers, progress, minibatch,
                                 logits_or_mean, log_std, values)


def update(parts: PPOParts, meta_params, hypers: Hyperparams, state: RecurrentPPOState,
           _=None):
    """One update: rollout, GAE, epochs of sequence-minibatch steps. Returns
    ``(state, summary)`` (the ``lax.scan`` body of :func:`advance`)."""
    config, network = parts.config, parts.network
    key, action_key, env_key, epoch_key = jax.random.split(state.key, 4)
    carry, rollout, finished, starts, hiddens = collect_rollout(parts, hypers, state,
                                                                action_key, env_key)
    with jax.named_scope("gae"):
        # the hidden state after step t continues its episode into final_obs[t]
        next_values = network.apply(state.params, hiddens, rollout.final_obs,
                                    method=network.value_step)
        advantages, targets = ppo.compute_gae(
            rollout.reward, rollout.value, next_values, rollout.terminated,
            rollout.done, hypers.gamma, hypers.gae_lambda,
        )
    progress = state.update_count / config.num_updates
    learning_rate = hypers.learning_rate
    if config.anneal_lr:
        learning_rate = learning_rate * (1.0 - progress)
    batch = SequenceBatch(state.hidden, starts, rollout.obs, rollout.action, rollout.log_prob,
                          rollout.value, advantages, targets)
    params, opt_state, diagnostics = ppo.train_epochs(
        parts, meta_params, hypers, progress, learning_rate, state.params, state.opt_state,
        batch, epoch_key, loss_fn=sequence_loss,
        into_minibatches=functools.partial(split_into_sequences, config),
    )
    summary = ppo.summarise(diagnostics, finished, state, learning_rate)
    state = RecurrentPPOState(
        params=params, opt_state=opt_state, env_state=carry.env_state, obs=carry.obs,
        hidden=carry.hidden, starts=carry.starts, episodes=carry.episodes,
        last_return=summary["episode_return"], last_length=summary["episode_length"],
        key=key, update_count=state.update_count + 1,
    )
    return state, summary


def build(config: RecurrentPPOConfig, objective: Objective | None = None) -> Learner:
    """The recurrent PPO :class:`~inner_loops.learner.Learner` of ``config`` and
    ``objective``: slots, errors and metrics are PPO's (see :func:`inner_loops.ppo.build`).
    """
    return ppo.learner_from_parts("recurrent_ppo", ppo.make_parts(config, objective, make_network),
                                  init_state, update)


register_algorithm(
    "recurrent_ppo", RecurrentPPOConfig, build, slots=("policy", "value", "optimizer"),
    description="recurrent PPO: a GRU core, hidden states carried across rollouts; "
                "minibatches of whole sequences",
)
