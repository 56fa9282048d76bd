"""PPO on the inner-loop contract: ``build(config, objective) -> Learner``.

``init(key, meta_params, hypers)`` builds the environments, the networks and the optimiser
state of one agent (:class:`PPOState`); ``advance(state, meta_params, hypers, k)`` runs ``k``
PPO updates in a single ``lax.scan``: rollout, GAE, ``update_epochs`` passes of minibatch
gradient steps. It returns per-update summaries (never per-step buffers), so
``jit(vmap(learner.train))`` trains a whole population at once. See
:mod:`inner_loops.learner` for the contract.

Shape-setting settings (env, batch sizes, network widths) live in :class:`PPOConfig` and are
static. Numeric hyperparameters live in :class:`Hyperparams`: traced arrays, so a population
can vary them under ``vmap``. The losses come from an :class:`~inner_loops.objective.Objective`
filling the ``"policy"`` and ``"value"`` slots; empty slots get PPO's clipped surrogate and
clipped value loss. An objective may also fill the ``"optimizer"`` slot
(:class:`~inner_loops.objective.OptimizerTerm`): its update rule then replaces
``scale_by_adam`` between PPO's global-norm clip and its ``-learning_rate * u`` step (see
:func:`_optimizer`); without it every update is bit-identical to Adam's PPO.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from inner_loops import networks
from inner_loops.envs import (
    EnvParamPairs,
    EnvSpec,
    VecEnv,
    VecEnvState,
    env_param_pairs,
    make_vec_env,
)
from inner_loops.learner import Learner
from inner_loops.linear import MATMULS, PRECISIONS, resolve_matmul
from inner_loops.objective import LossInputs, Objective, clipped_l2, ppo_clip
from inner_loops.registry import register_algorithm
from inner_loops.validation import (
    check_choice,
    check_in_range,
    check_non_negative,
    check_positive,
    check_positive_int,
    check_widths,
)

POLICIES = ("auto", "categorical", "gaussian")
SHUFFLES = ("sort", "permutation")
FINAL_VALUES = ("batched", "in_rollout", "none")
ENV_RESETS = ("auto", "presampled", "in_step")
ADAM_EPS = 1e-5  # Adam's eps in PPO's optimiser (:func:`adam`), as in CleanRL and PureJaxRL
ADVANTAGE_EPS = 1e-8  # added to the advantages' std by :func:`standardize_advantages`


@dataclass(frozen=True)
class PPOConfig:
    """Settings of one PPO agent. Defaults are PureJaxRL's CartPole-v1 settings.

    Building a config checks every field but builds no environment and starts no JAX
    computation; checks that need the environment (does ``env_id`` exist, does ``policy``
    fit its actions) run when the learner is built, and name the field too.

    Attributes:
        env_id: gymnax id (``CartPole-v1``, ``Breakout-MinAtar``, ...), ``brax/<name>``,
            ``xminigrid/<name>``, ``craftax/Craftax-Classic-Symbolic-v1``, ``navix/<name>``
            or ``jumanji/<name>`` (see :mod:`inner_loops.envs`).
        env_params: overrides of the environment's parameters, e.g.
            ``{"max_steps_in_episode": 200}`` (see :mod:`inner_loops.envs`); a mapping is
            stored as sorted ``(name, value)`` pairs. Default: none.
        num_envs: parallel environments per agent.
        num_steps: rollout length per environment per update.
        total_timesteps: environment steps per agent over the whole run.
        update_epochs: passes over each rollout batch.
        num_minibatches: minibatches per pass; must divide ``num_envs * num_steps``.
        hidden_sizes: widths of the hidden layers of both actor and critic.
        activation: ``"tanh"`` or ``"relu"``.
        precision: operands of the networks' matrix products, ``"float32"`` or
            ``"bfloat16"`` (float32 results; parameters, optimiser state and losses stay
            float32); see :mod:`inner_loops.linear`.
        policy: ``"auto"`` (from the action space), ``"categorical"`` or ``"gaussian"``.
        anneal_lr: decay the learning rate linearly to zero over training (by the update
            counter in the agent's state, so training in segments anneals the same way).
        normalize_obs: running mean/std observation normalisation (continuous control).
        normalize_reward: scale rewards by the running std of the discounted return.
        normalize_advantages: standardise advantages per minibatch.
        learning_rate, gamma, gae_lambda, clip_eps, ent_coef, vf_coef, max_grad_norm:
            defaults of the traced :class:`Hyperparams`.
        shuffle: how each epoch orders the batch into minibatches: ``"sort"`` (one sort of
            random keys with the indices packed in, :func:`shuffled_indices`) or
            ``"permutation"`` (``jax.random.permutation``, as PureJaxRL's ``ppo.py``). Both
            draw a uniformly random order; they draw different ones from the same key.
        final_values: how the observations that end episodes are valued for the targets of
            truncated episodes: ``"batched"`` (kept in a ``[T, N, *obs_shape]`` buffer and
            valued in one pass after the rollout), ``"in_rollout"`` (valued in each rollout
            step, no buffer: the same targets) or ``"none"`` (not valued: an episode cut by
            its time limit is treated as terminated, as PureJaxRL's ``ppo.py`` does; this
            changes the targets wherever a time limit ends an episode).
        env_resets: where the fresh episode starts that replace ending episodes are drawn:
            ``"presampled"`` (a whole rollout's in one batch before it, the
            :meth:`~inner_loops.envs.VecEnv.presample` buffer), ``"in_step"`` (each step
            draws its own, as gymnax's ``step`` does) or ``"auto"`` (presampled on a CPU,
            in-step elsewhere; see :func:`resolve_env_resets`). The two draw different
            starts from the same key.
        matmul: how the networks' dense products are arranged: ``"cpu"``
            (:mod:`inner_loops.linear`'s arrangement for XLA's CPU backend: narrow products
            unrolled, narrow outputs column by column, a transposed copy before each weight
            gradient), ``"xla"`` (one plain ``lax.dot_general`` each, flax's default) or
            ``"auto"`` (``"cpu"`` on a CPU, ``"xla"`` elsewhere; see
            :func:`~inner_loops.linear.resolve_matmul`). The same products: results agree
            to float rounding.
    """

    env_id: str = "CartPole-v1"
    env_params: EnvParamPairs = ()
    num_envs: int = 4
    num_steps: int = 128
    total_timesteps: int = 500_000
    update_epochs: int = 4
    num_minibatches: int = 4
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    precision: str = "float32"
    policy: str = "auto"
    anneal_lr: bool = True
    normalize_obs: bool = False
    normalize_reward: bool = False
    normalize_advantages: bool = True
    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    shuffle: str = "sort"
    final_values: str = "batched"
    env_resets: str = "auto"
    matmul: str = "auto"

    def __post_init__(self):
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValueError(f"env_id: expected an environment id, got {self.env_id!r}")
        object.__setattr__(self, "hidden_sizes", check_widths("hidden_sizes", self.hidden_sizes))
        for name in ("num_envs", "num_steps", "total_timesteps", "update_epochs",
                     "num_minibatches"):
            check_positive_int(name, getattr(self, name))
        check_choice("activation", self.activation, networks.ACTIVATIONS)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("policy", self.policy, POLICIES)
        check_choice("shuffle", self.shuffle, SHUFFLES)
        check_choice("final_values", self.final_values, FINAL_VALUES)
        check_choice("env_resets", self.env_resets, ENV_RESETS)
        check_choice("matmul", self.matmul, MATMULS)
        if self.batch_size % self.num_minibatches:
            divisors = [d for d in range(1, self.batch_size + 1) if self.batch_size % d == 0]
            raise ValueError(
                f"num_minibatches: {self.num_minibatches} does not divide the batch of "
                f"num_envs * num_steps = {self.batch_size}; allowed: "
                f"{', '.join(map(str, divisors[:24]))}{' ...' if len(divisors) > 24 else ''}"
            )
        if self.total_timesteps < self.batch_size:
            raise ValueError(
                f"total_timesteps: {self.total_timesteps} is less than one batch "
                f"(num_envs * num_steps = {self.batch_size})"
            )
        for name in ("gamma", "gae_lambda"):
            check_in_range(name, getattr(self, name), 0.0, 1.0)
        for name in ("learning_rate", "clip_eps", "max_grad_norm"):
            check_positive(name, getattr(self, name))
        for name in ("ent_coef", "vf_coef"):
            check_non_negative(name, getattr(self, name))
        object.__setattr__(self, "env_params", env_param_pairs(self.env_params))

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def steps_per_agent(self) -> int:
        """Environment steps one agent actually takes (whole updates only)."""
        return self.num_updates * self.batch_size

    def hyperparams(self) -> Hyperparams:
        """The numeric hyperparameters of this config as traced-ready float32 scalars."""
        return Hyperparams(**{f: jnp.float32(getattr(self, f)) for f in Hyperparams._fields})

    def replace(self, **changes) -> PPOConfig:
        return dataclasses.replace(self, **changes)


class Hyperparams(NamedTuple):
    """Numeric PPO hyperparameters; each a ``[]`` array (or ``[P]`` for a population)."""

    learning_rate: jax.Array
    gamma: jax.Array
    gae_lambda: jax.Array
    clip_eps: jax.Array
    ent_coef: jax.Array
    vf_coef: jax.Array
    max_grad_norm: jax.Array


class Transition(NamedTuple):
    """One rollout step of ``N`` environments (stacked to ``[T, N, ...]`` by the scan)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array


class Minibatch(NamedTuple):
    """What the loss reads of ``B`` shuffled transitions (each field ``[B, ...]``)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantages: jax.Array
    targets: jax.Array


@struct.dataclass
class EpisodeStats:
    """Running returns of unfinished episodes, per environment ``[N]``."""

    running_return: jax.Array
    running_length: jax.Array


class EpisodeEnds(NamedTuple):
    """Per rollout step ``[T, N]``: which episodes ended and their return and length."""

    done: jax.Array
    returns: jax.Array
    lengths: jax.Array


class RolloutCarry(NamedTuple):
    """What one environment step of the rollout hands to the next."""

    params: Any
    env_state: Any
    obs: jax.Array
    episodes: EpisodeStats


@struct.dataclass
class PPOState:
    """Everything one PPO agent carries from update to update (the contract's state).

    Attributes:
        params: actor-critic parameters.
        opt_state: Adam's state (with the gradient clip's), or the objective's update
            rule's state when it fills the optimiser slot.
        env_state: the :class:`~inner_loops.envs.VecEnvState` of ``N`` environments,
            including the observation and reward normalisers.
        obs: ``[N, *obs_shape]`` current observations.
        episodes: returns and lengths of the unfinished episodes ``[N]``.
        last_return: ``[]`` mean return of the episodes finished most recently (NaN before
            the first), what an update without finished episodes reports.
        last_length: ``[]`` their mean length.
        key: PRNG key of the next update.
        update_count: ``[]`` int32 updates done; annealing reads it.
    """

    params: Any
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array
    episodes: EpisodeStats
    last_return: jax.Array
    last_length: jax.Array
    key: jax.Array
    update_count: jax.Array


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    done: jax.Array,
    gamma: jax.Array,
    gae_lambda: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over a rollout, all arrays ``[T, N]``.

    ``next_values[t]`` is the value of the observation reached by step ``t`` *before* any
    auto-reset. A terminated step does not bootstrap (``terminated``); any episode end
    (``done``: terminated or truncated) stops the advantage from flowing across episodes,
    so a truncated step bootstraps from its final observation only.

    Returns ``(advantages [T, N], value_targets [T, N])``.
    """
    not_terminated = 1.0 - terminated.astype(values.dtype)
    not_done = 1.0 - done.astype(values.dtype)
    deltas = rewards + gamma * next_values * not_terminated - values

    def backward(gae, step):
        delta, continues = step
        gae = delta + gamma * gae_lambda * continues * gae
        return gae, gae

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(values[0]), (deltas, not_done), reverse=True
    )
    return advantages, advantages + values


def standardize_advantages(advantages: jax.Array) -> jax.Array:
    """``advantages`` (any shape, e.g. a ``[B]`` minibatch) standardised over all their
    entries: ``(A - mean(A)) / (std(A) + ADVANTAGE_EPS)``, same shape. PPO's loss applies it
    per minibatch when ``normalize_advantages`` is set."""
    return (advantages - advantages.mean()) / (advantages.std() + ADVANTAGE_EPS)


def adam(eps_root: float = 0.0) -> optax.GradientTransformation:
    """PPO's Adam at unit step size: ``optax.scale_by_adam`` with ``eps = ADAM_EPS``.

    ``eps_root`` (optax's; 0 in PPO) is added to the second moment inside the square root:
    a positive one keeps Adam's derivative finite where a gradient is exactly zero, for
    those that differentiate through PPO's updates (:mod:`metarl.evolve.metagradient`).
    """
    return optax.scale_by_adam(eps=ADAM_EPS, eps_root=eps_root)


def _optimizer(hypers: Hyperparams, objective: Objective | None = None,
               meta_params=None) -> optax.GradientTransformation:
    """Clip by global norm, then :func:`adam` at unit step size (the learning rate is applied
    per update, so annealing and per-agent rates stay traced).

    When ``objective`` fills the optimiser slot its update rule, built from
    ``meta_params["optimizer"]`` (traced), replaces ``scale_by_adam``; the chain then takes
    the extra arguments ``progress`` and ``key`` in ``update``.
    """
    learned = objective is not None and objective.optimizer is not None
    rule = objective.optimizer_transformation(meta_params) if learned else adam()
    return optax.chain(optax.clip_by_global_norm(hypers.max_grad_norm), rule)


def init_optimizer(parts: PPOParts, params, meta_params, hypers: Hyperparams):
    """The optimiser state (of :func:`_optimizer`) a fresh agent with ``params`` starts
    from."""
    return _optimizer(hypers, parts.objective, meta_params).init(params)


def _check_policy_fits(config: PPOConfig, discrete: bool) -> None:
    if discrete and config.policy == "gaussian":
        raise ValueError(
            f"policy: 'gaussian' needs continuous actions but {config.env_id} is discrete; "
            "allowed here: auto, categorical"
        )
    if not discrete and config.policy == "categorical":
        raise ValueError(
            f"policy: 'categorical' needs discrete actions but {config.env_id} is "
            "continuous; allowed here: auto, gaussian"
        )


@dataclass(frozen=True, eq=False)
class PPOParts:
    """What :func:`build` makes once per config, and every piece of an update reads.

    Attributes:
        config: the static settings.
        objective: the ``"policy"`` and ``"value"`` losses, PPO's defaults filled in.
        vec_env: the agent's ``N`` environments, with their normalisers.
        network: the actor-critic: ``network.apply(params, obs [..., *obs_shape]) ->
            (logits_or_mean [..., A], log_std [A], value [...])`` (for recurrent PPO the
            :class:`~inner_loops.networks.RecurrentActorCritic`, which also reads and
            returns a hidden state).
        action_low, action_high: ``[A]`` bounds continuous actions are clipped to before
            they reach the environment; ``None`` for discrete actions.
        stop_rollout_gradient: for a meta-gradient that differentiates through
            :func:`update`: what the rollout produces (transitions, environment states,
            GAE advantages and targets) is data, with no gradient back to the parameters
            that collected it, so none flows through the environment. It changes no value
            an update computes (default ``False``: the plain update).
    """

    config: PPOConfig
    objective: Objective
    vec_env: VecEnv
    network: networks.ActorCritic
    action_low: jax.Array | None
    action_high: jax.Array | None
    stop_rollout_gradient: bool = False

    @property
    def discrete(self) -> bool:
        return self.vec_env.spec.discrete


def make_network(config: PPOConfig, spec: EnvSpec) -> networks.ActorCritic:
    """The actor-critic of ``config`` for environment ``spec`` (``matmul`` resolved for
    this backend)."""
    return networks.ActorCritic(
        action_dim=spec.action_dim,
        discrete=spec.discrete,
        obs_ndim=len(spec.obs_shape),
        hidden_sizes=config.hidden_sizes,
        activation=config.activation,
        precision=config.precision,
        matmul=resolve_matmul(config.matmul),
    )


def init_state(parts: PPOParts, key: jax.Array, meta_params, hypers: Hyperparams) -> PPOState:
    """A fresh agent: reset environments, new network parameters, zeroed bookkeeping."""
    num_envs = parts.config.num_envs
    key, init_key, reset_key = jax.random.split(key, 3)
    obs, env_state = parts.vec_env.reset(reset_key)
    params = parts.network.init(init_key, obs)
    nan = jnp.full((), jnp.nan, jnp.float32)
    return PPOState(
        params=params,
        opt_state=init_optimizer(parts, params, meta_params, hypers),
        env_state=env_state,
        obs=obs,
        episodes=EpisodeStats(jnp.zeros(num_envs), jnp.zeros(num_envs)),
        last_return=nan,
        last_length=nan,
        key=key,
        update_count=jnp.zeros((), jnp.int32),
    )


def ppo_loss(parts: PPOParts, params, meta_params, hypers: Hyperparams, progress: jax.Array,
             minibatch: Minibatch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The objective's policy and value losses on a ``[B]`` minibatch, less the entropy bonus.

    Returns ``(total [], diagnostics)``: ``policy_loss``, ``value_loss``, ``entropy``,
    ``approx_kl`` and ``clip_fraction``, each ``[]``.
    """
    logits_or_mean, log_std, values = parts.network.apply(params, minibatch.obs)
    return policy_value_loss(parts, meta_params, hypers, progress, minibatch, logits_or_mean,
                             log_std, values)


def policy_value_loss(parts: PPOParts, meta_params, hypers: Hyperparams, progress: jax.Array,
                      minibatch: Minibatch, logits_or_mean: jax.Array, log_std: jax.Array,
                      values: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """:func:`ppo_loss` from the network's outputs on ``minibatch.obs``: ``logits_or_mean
    [..., A]``, ``log_std [A]`` and ``values [...]``, where ``[...]`` is the minibatch's
    shape (``[B]`` for PPO, ``[T, B]`` for whole sequences); every mean runs over all of it.
    """
    config, objective, discrete = parts.config, parts.objective, parts.discrete
    new_log_prob = networks.log_prob(discrete, logits_or_mean, log_std, minibatch.action)
    log_ratio = new_log_prob - minibatch.log_prob
    advantages = minibatch.advantages
    ratio = jnp.exp(log_ratio)
    if config.normalize_advantages:
        advantages = standardize_advantages(advantages)
    inputs = LossInputs(
        ratio=ratio,
        log_ratio=log_ratio,
        advantages=advantages,
        values=values,
        old_values=minibatch.value,
        targets=minibatch.targets,
        clip_eps=hypers.clip_eps,
        progress=progress,
    )
    policy_loss = objective.policy_loss(meta_params, inputs)
    value_loss = objective.value_loss(meta_params, inputs)
    entropy = jnp.mean(networks.entropy(discrete, logits_or_mean, log_std))
    total = policy_loss + hypers.vf_coef * value_loss - hypers.ent_coef * entropy
    diagnostics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clip_fraction": jnp.mean(jnp.abs(ratio - 1.0) > hypers.clip_eps),
    }
    return total, diagnostics


# The named scopes ("rollout", "gae", "shuffle", "loss", "optimiser") label the compiled
# program's operations for profiling (benchmarks/profile_ppo.py); they do not change what
# is computed.


def rollout_step(parts: PPOParts, hypers: Hyperparams, carry: RolloutCarry, noise):
    """One step of the ``N`` environments under the current policy.

    ``noise`` is ``(action noise [N, A], the environments' presampled noise for this
    step)``. Returns the next carry and ``(Transition, EpisodeEnds)`` of this step, each
    field ``[N, ...]``.
    """
    params, env_state, obs, episodes = carry
    action_noise, env_noise = noise
    logits_or_mean, log_std, value = parts.network.apply(params, obs)
    action, log_prob = networks.action_from_noise(action_noise, parts.discrete,
                                                  logits_or_mean, log_std)
    step, done, episodes, finished = step_environments(parts, hypers, env_state, episodes,
                                                       action, env_noise)
    transition = Transition(obs, action, log_prob, value, step.reward, step.terminated,
                            done, step.final_obs)
    return RolloutCarry(params, step.state, step.obs, episodes), (transition, finished)


def step_environments(parts: PPOParts, hypers: Hyperparams, env_state: VecEnvState,
                      episodes: EpisodeStats, action: jax.Array, env_noise):
    """Step the ``N`` environments with the policy's ``action`` (``[N]`` or ``[N, A]``,
    clipped to the action bounds here) and this step's presampled ``env_noise``.

    Returns ``(step, done [N], episodes, finished)``: the
    :class:`~inner_loops.envs.VecEnvStep`, which episodes ended, the running
    :class:`EpisodeStats` after the step and this step's :class:`EpisodeEnds`.
    """
    env_action = (action if parts.discrete
                  else jnp.clip(action, parts.action_low, parts.action_high))
    step = parts.vec_env.step(None, env_state, env_action, hypers.gamma, env_noise)
    done = jnp.logical_or(step.terminated, step.truncated)
    running_return = episodes.running_return + step.raw_reward
    running_length = episodes.running_length + 1
    finished = EpisodeEnds(done, running_return, running_length)
    episodes = EpisodeStats(
        jnp.where(done, 0.0, running_return), jnp.where(done, 0.0, running_length)
    )
    return step, done, episodes, finished


def _rollout_step_valued(parts: PPOParts, hypers: Hyperparams, carry: RolloutCarry, noise):
    """:func:`rollout_step` for ``final_values`` other than ``"batched"``: no final
    observation leaves the step. With ``"in_rollout"`` the step values it instead (``[N]``),
    with ``"none"`` nothing is kept of it."""
    carry, (transition, finished) = rollout_step(parts, hypers, carry, noise)
    final_value = None
    if parts.config.final_values == "in_rollout":
        final_value = parts.network.apply(carry.params, transition.final_obs,
                                          method=parts.network.value)
    return carry, (transition._replace(final_obs=None), finished, final_value)


def _rollout(parts: PPOParts, hypers: Hyperparams, state: PPOState, action_key: jax.Array,
             env_key: jax.Array):
    """``T = num_steps`` steps of the ``N`` environments from ``state``.

    Returns ``(carry, rollout, finished, final_values)``: the :class:`RolloutCarry` after the
    last step, the :class:`Transition` s ``[T, N, ...]``, the :class:`EpisodeEnds` ``[T, N]``
    and, when ``final_values`` is ``"in_rollout"``, the ``[T, N]`` values of the final
    observations (``None`` otherwise). ``rollout.final_obs`` is ``None`` unless
    ``final_values`` is ``"batched"``.
    """
    config = parts.config
    # every random draw of the rollout is made here, in a few batched calls
    noise = (
        networks.action_noise(action_key, parts.discrete,
                              (config.num_steps, config.num_envs, parts.vec_env.spec.action_dim)),
        parts.vec_env.presample(env_key, config.num_steps),
    )
    start = RolloutCarry(state.params, state.env_state, state.obs, state.episodes)
    with jax.named_scope("rollout"):
        if config.final_values == "batched":
            carry, (rollout, finished) = jax.lax.scan(
                functools.partial(rollout_step, parts, hypers), start, noise)
            return carry, rollout, finished, None
        carry, (rollout, finished, final_values) = jax.lax.scan(
            functools.partial(_rollout_step_valued, parts, hypers), start, noise)
    return carry, rollout, finished, final_values


def collect_batch(parts: PPOParts, hypers: Hyperparams, state: PPOState,
                  action_key: jax.Array, env_key: jax.Array):
    """PPO's batch pipeline: one rollout of ``T = num_steps`` steps of the ``N`` environments
    from ``state`` (its policy and critic, ``state.params``), and its advantages and value
    targets (:func:`rollout_targets`).

    Returns ``(carry, finished, batch)``: the :class:`RolloutCarry` after the last step, the
    :class:`EpisodeEnds` ``[T, N]`` and the :class:`Minibatch` the loss reads, every field
    ``[T, N, ...]``. Its advantages are not standardised yet (:func:`standardize_advantages`
    does that per minibatch, in the loss).
    """
    carry, rollout, finished, final_values = _rollout(parts, hypers, state, action_key,
                                                      env_key)
    with jax.named_scope("gae"):
        advantages, targets = rollout_targets(parts, hypers, state.params, rollout,
                                              final_values, carry.obs)
    # only what the loss reads is shuffled into minibatches
    batch = Minibatch(rollout.obs, rollout.action, rollout.log_prob, rollout.value,
                      advantages, targets)
    return carry, finished, batch


def rollout_targets(parts: PPOParts, hypers: Hyperparams, params, rollout: Transition,
                    final_values, last_obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(advantages [T, N], value_targets [T, N])`` of a rollout ``[T, N, ...]``:
    :func:`compute_gae` (``hypers.gamma``, ``hypers.gae_lambda``) of :func:`next_values`
    valued with ``params``, so a time-limit truncation bootstraps from its final
    observation as ``final_values`` says. ``final_values`` is the ``[T, N]`` of
    ``"in_rollout"`` (``None`` otherwise), ``last_obs`` ``[N, ...]`` the observations after
    the last step."""
    values_after, terminated = next_values(parts, params, rollout, final_values, last_obs)
    return compute_gae(rollout.reward, rollout.value, values_after, terminated, rollout.done,
                       hypers.gamma, hypers.gae_lambda)


def next_values(parts: PPOParts, params, rollout: Transition, final_values,
                last_obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(next_values [T, N], terminated [T, N])`` that :func:`compute_gae` reads, by
    ``final_values``: the value of each step's final observation (``"batched"``: valued
    here in one pass; ``"in_rollout"``: as valued in the steps) with the episodes'
    terminations; or, with ``"none"``, the next step's value (``last_obs``' after the last
    step) with every episode end counted as a termination, so nothing bootstraps across a
    time limit (PureJaxRL's targets)."""
    choice, network = parts.config.final_values, parts.network
    if choice == "batched":
        return (network.apply(params, rollout.final_obs, method=network.value),
                rollout.terminated)
    if choice == "in_rollout":
        return final_values, rollout.terminated
    last = network.apply(params, last_obs, method=network.value)
    return jnp.concatenate([rollout.value[1:], last[None]]), rollout.done


def shuffle_into_minibatches(config: PPOConfig, batch: Minibatch, key: jax.Array) -> Minibatch:
    """``batch`` (fields ``[T, N, ...]``) flattened, shuffled and cut into
    ``[num_minibatches, minibatch_size, ...]``."""
    flat = jax.tree.map(lambda x: x.reshape(config.batch_size, *x.shape[2:]), batch)
    if config.shuffle == "permutation":
        order = jax.random.permutation(key, config.batch_size)
    else:
        order = shuffled_indices(key, config.batch_size)
    return jax.tree.map(
        lambda x: x[order].reshape(config.num_minibatches, -1, *x.shape[1:]), flat
    )


def train_epochs(parts: PPOParts, meta_params, hypers: Hyperparams, progress: jax.Array,
                 learning_rate: jax.Array, params, opt_state, batch: Minibatch,
                 key: jax.Array, loss_fn=ppo_loss, into_minibatches=None):
    """``update_epochs`` passes over ``batch`` (fields ``[T, N, ...]``), each freshly
    shuffled, one gradient step per minibatch.

    Returns ``(params, opt_state, diagnostics)``, each diagnostic of :func:`ppo_loss`
    ``[update_epochs, num_minibatches]``.

    ``loss_fn`` (signature of :func:`ppo_loss`) and ``into_minibatches`` (``(batch, key) ->
    minibatches`` with a leading ``[num_minibatches]`` axis; default
    :func:`shuffle_into_minibatches`) let a learner with another batch layout (whole
    sequences, :mod:`inner_loops.recurrent_ppo`) share the optimiser steps.

    With a learned update rule (the objective's optimiser slot) each minibatch step also
    passes ``progress`` and a key of its own, ``split(fold_in(permutation_key, 1))``, to
    the rule; with Adam nothing of this is computed and no random draw changes.
    """
    config = parts.config
    optimizer = _optimizer(hypers, parts.objective, meta_params)
    learned = parts.objective.optimizer is not None
    loss_grad = jax.grad(functools.partial(loss_fn, parts), has_aux=True)
    if into_minibatches is None:
        into_minibatches = functools.partial(shuffle_into_minibatches, config)

    def minibatch_step(carry, xs):
        params, opt_state = carry
        minibatch, step_key = xs if learned else (xs, None)
        with jax.named_scope("loss"):
            grads, diagnostics = loss_grad(params, meta_params, hypers, progress, minibatch)
        with jax.named_scope("optimiser"):
            if learned:
                updates, opt_state = optimizer.update(grads, opt_state, params,
                                                      progress=progress, key=step_key)
            else:
                updates, opt_state = optimizer.update(grads, opt_state, params)
            updates = jax.tree.map(lambda u: -learning_rate * u, updates)
            params = optax.apply_updates(params, updates)
        return (params, opt_state), diagnostics

    def epoch(carry, permutation_key):
        with jax.named_scope("shuffle"):
            minibatches = into_minibatches(batch, permutation_key)
        if learned:
            step_keys = jax.random.split(jax.random.fold_in(permutation_key, 1),
                                         config.num_minibatches)
            return jax.lax.scan(minibatch_step, carry, (minibatches, step_keys))
        return jax.lax.scan(minibatch_step, carry, minibatches)

    (params, opt_state), diagnostics = jax.lax.scan(
        epoch, (params, opt_state), jax.random.split(key, config.update_epochs)
    )
    return params, opt_state, diagnostics


def summarise(diagnostics: dict[str, jax.Array], finished: EpisodeEnds, state: PPOState,
              learning_rate: jax.Array) -> dict[str, jax.Array]:
    """The update's metrics, each ``[]``, from the ``[update_epochs, num_minibatches]``
    loss diagnostics and the rollout's ``[T, N]`` episode ends (see :func:`build`)."""
    done, returns, lengths = finished.done, finished.returns, finished.lengths
    count = done.sum()
    mean_return = jnp.where(
        count > 0, jnp.sum(jnp.where(done, returns, 0.0)) / jnp.maximum(count, 1),
        state.last_return,
    )
    mean_length = jnp.where(
        count > 0, jnp.sum(jnp.where(done, lengths, 0.0)) / jnp.maximum(count, 1),
        state.last_length,
    )
    summary = {k: v.mean() for k, v in diagnostics.items()}
    summary["finite"] = jnp.all(
        jnp.stack([jnp.all(jnp.isfinite(v)) for v in diagnostics.values()])
    )
    summary.update(
        episode_return=mean_return,
        episode_length=mean_length,
        episodes=count,
        learning_rate=learning_rate,
    )
    return summary


def update(parts: PPOParts, meta_params, hypers: Hyperparams, state: PPOState, _=None):
    """One PPO update: rollout, GAE, epochs of minibatch steps. Returns ``(state, summary)``
    (the ``lax.scan`` body of :func:`advance`)."""
    config = parts.config
    key, action_key, env_key, epoch_key = jax.random.split(state.key, 4)
    collector = (state.replace(params=jax.lax.stop_gradient(state.params))
                 if parts.stop_rollout_gradient else state)
    carry, finished, batch = collect_batch(parts, hypers, collector, action_key, env_key)
    progress = state.update_count / config.num_updates
    learning_rate = hypers.learning_rate
    if config.anneal_lr:
        learning_rate = learning_rate * (1.0 - progress)
    params, opt_state, diagnostics = train_epochs(
        parts, meta_params, hypers, progress, learning_rate, state.params, state.opt_state,
        batch, epoch_key,
    )
    summary = summarise(diagnostics, finished, state, learning_rate)
    state = PPOState(
        params=params, opt_state=opt_state, env_state=carry.env_state, obs=carry.obs,
        episodes=carry.episodes, last_return=summary["episode_return"],
        last_length=summary["episode_length"], key=key,
        update_count=state.update_count + 1,
    )
    return state, summary


def scan_updates(update_fn, parts: PPOParts, state, meta_params, hypers: Hyperparams,
                 num_updates: int):
    """``num_updates`` calls of ``update_fn(parts, meta_params, hypers, state, _) ->
    (state, summary)`` in one ``lax.scan``; metrics ``[num_updates]`` each."""
    return jax.lax.scan(functools.partial(update_fn, parts, meta_params, hypers), state, None,
                        length=num_updates)


def advance(parts: PPOParts, state: PPOState, meta_params, hypers: Hyperparams,
            num_updates: int) -> tuple[PPOState, dict[str, jax.Array]]:
    """``num_updates`` updates in one ``lax.scan``; metrics ``[num_updates]`` each."""
    return scan_updates(update, parts, state, meta_params, hypers, num_updates)


def learner_from_parts(algorithm: str, parts: PPOParts, init_fn, update_fn) -> Learner:
    """The :class:`~inner_loops.learner.Learner` named ``algorithm`` over ``parts``: agents
    start as ``init_fn(parts, key, meta_params, hypers)`` and move by ``update_fn`` (as
    :func:`update`); PPO and recurrent PPO differ only in these two."""
    config = parts.config
    return Learner(
        algorithm=algorithm,
        config=config,
        objective=parts.objective,
        spec=parts.vec_env.spec,
        num_updates=config.num_updates,
        steps_per_update=config.batch_size,
        init_fn=functools.partial(init_fn, parts),
        advance_fn=functools.partial(scan_updates, update_fn, parts),
        default_meta_params=parts.objective.init(jax.random.PRNGKey(0)),
        default_hypers=config.hyperparams(),
    )


def build(config: PPOConfig, objective: Objective | None = None) -> Learner:
    """The PPO :class:`~inner_loops.learner.Learner` of ``config`` and ``objective``.

    Args:
        config: static settings (shapes, environment).
        objective: losses for the ``"policy"`` and ``"value"`` slots; empty slots (and
            ``None``) get PPO's clipped surrogate and clipped value loss. Its
            ``"optimizer"`` slot, when filled, replaces Adam (see :func:`_optimizer`).

    Raises ``ValueError`` naming ``env_id``, ``env_params`` or ``policy`` when the
    environment does not exist or does not fit.

    Metrics (each ``[num_updates]``): ``episode_return`` and ``episode_length`` (mean over
    episodes finished during the update, carried forward when none finished, NaN before
    the first), ``episodes`` (finished during the update), ``policy_loss``, ``value_loss``,
    ``entropy``, ``approx_kl``, ``clip_fraction`` (means over the update's minibatches),
    ``learning_rate`` and ``finite`` (every loss of the update was finite).
    """
    return learner_from_parts("ppo", make_parts(config, objective), init_state, update)


def make_parts(config: PPOConfig, objective: Objective | None = None,
               network_fn=make_network) -> PPOParts:
    """The :class:`PPOParts` of ``config``: ``objective`` with PPO's default losses in its
    empty slots, the environments, and ``network_fn(config, spec)`` as the network.

    Raises ``ValueError`` naming ``env_id``, ``env_params`` or ``policy`` when the
    environment does not exist or does not fit.
    """
    objective = (objective or Objective()).with_defaults(policy=ppo_clip(), value=clipped_l2())
    vec_env = make_vec_env(
        config.env_id, config.num_envs, config.normalize_obs, config.normalize_reward,
        config.env_params, resolve_env_resets(config.env_resets) == "presampled",
    )
    spec = vec_env.spec
    _check_policy_fits(config, spec.discrete)
    if spec.discrete:
        action_low = action_high = None
    else:
        action_low = jnp.asarray(spec.action_low, jnp.float32)
        action_high = jnp.asarray(spec.action_high, jnp.float32)
    return PPOParts(config, objective, vec_env, network_fn(config, spec), action_low,
                    action_high)


def resolve_env_resets(choice: str, backend: str | None = None) -> str:
    """What ``env_resets = choice`` means on ``backend`` (default ``jax.default_backend()``):
    ``"presampled"`` or ``"in_step"``.

    ``"auto"`` is ``"presampled"`` on a CPU: XLA's CPU backend runs every threefry draw as a
    small loop of its own, so drawing a rollout's fresh starts in one batch before the step
    loop costs far less than drawing them step by step (:mod:`inner_loops.envs`). Elsewhere
    it is ``"in_step"``: on a GPU a step's draws are a few fused kernels, while presampled
    starts are a ``[T, N, ...]`` buffer of whole environment states (MinAtar's hold 10x10
    grids) written before and read during every rollout; drawing them in the step, as
    gymnax and PureJaxRL's ``ppo.py`` do, leaves that memory traffic out.
    """
    if choice != "auto":
        return choice
    return "presampled" if (backend or jax.default_backend()) == "cpu" else "in_step"


def make_train(config: PPOConfig, objective: Objective | None = None):
    """``train(key, meta_params=None, hypers=None) -> metrics`` of :func:`build`: a pure,
    unjitted function, so callers compose ``jit`` and ``vmap``."""
    return build(config, objective).train


# Up to 2**12 indices the packed sort below leaves >= 20 random bits per key.
_PACKED_SHUFFLE_MAX_BITS = 12


def shuffled_indices(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random permutation of ``range(n)``, ``[n]`` int32.

    ``jax.random.permutation`` sorts random keys together with the indices, a two-operand
    sort that XLA's CPU backend runs much slower than a sort of one ``uint32`` array.
    For ``n <= 4096`` the index is packed into the low bits of its random key, so one
    single-operand sort does it; keys that tie in their (at least 20) random bits keep index
    order, an expected ``n**2 / 2**21`` pairs (0.1 for ``n = 512``). Larger ``n`` use
    ``jax.random.permutation``.
    """
    bits = max(1, (n - 1).bit_length())
    if bits > _PACKED_SHUFFLE_MAX_BITS:
        return jax.random.permutation(key, n)
    random_bits = jax.random.bits(key, (n,), jnp.uint32)
    packed = (random_bits << bits) | jnp.arange(n, dtype=jnp.uint32)
    return (jnp.sort(packed) & ((1 << bits) - 1)).astype(jnp.int32)


register_algorithm(
    "ppo", PPOConfig, build, slots=("policy", "value", "optimizer"),
    description="PPO (PureJaxRL-style): clipped surrogate, GAE, minibatch epochs",
)
