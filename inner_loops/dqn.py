"""DQN on the inner-loop contract: ``build(config, objective) -> Learner``.

One *update* of the contract is ``train_frequency`` steps of ``num_envs`` environments under
an epsilon-greedy policy, every transition added to the agent's replay buffer, followed by
``gradient_steps`` gradient steps on batches drawn from it (none during the warm-up, the
first ``learning_starts`` environment steps, which act uniformly at random). The critic's
TD loss fills the objective's ``"value"`` slot with ``LossInputs(values=Q(s, a) [B],
targets=r + gamma (1 - terminated) Q_target(s', a*) [B])``; by default L2,
``0.5 (q - t)^2`` (or Huber with ``td_loss = "huber"``). ``a*`` is the target network's
argmax, or the online network's with ``double_dqn``. A step cut by the time limit
bootstraps from the observation it reached; a terminated one does not (see
:mod:`inner_loops.off_policy`).

Schedules read ``state.update_count``: epsilon decays linearly from ``epsilon_start`` to
``epsilon_end`` over the first ``exploration_fraction`` of the budget's updates, and the
target network moves every ``target_update_interval`` gradient steps by ``tau`` (``1``: a
hard copy), counted from the update counter, so training in segments changes nothing.

Shape-setting settings (environment, capacity, batch, widths, steps and gradient steps per
update) live in :class:`DQNConfig` and are static; the numeric ones in :class:`Hyperparams`
are traced, so a population can give every member its own learning rate, discount, Polyak
rate and epsilon range (Adam runs at unit step size and each member scales its updates).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from inner_loops import networks, off_policy, replay
from inner_loops.envs import EnvParamPairs, EnvSpec, VecEnv, env_param_pairs, make_vec_env
from inner_loops.learner import Learner
from inner_loops.linear import PRECISIONS
from inner_loops.objective import LossInputs, Objective, huber, squared_error
from inner_loops.registry import register_algorithm
from inner_loops.validation import (
    check_choice,
    check_in_range,
    check_positive,
    check_positive_int,
    check_widths,
)

TD_LOSSES = ("l2", "huber")


@dataclass(frozen=True)
class DQNConfig(off_policy.UpdateSchedule):
    """Settings of one DQN agent. The defaults are for CartPole-v1 within 1e5 environment
    steps: one update collects 256 steps (8 environments x 32) and then takes 128 gradient
    steps on batches of 64 against a target network copied once per update (hard update),
    with epsilon decaying over the first 16% of the budget (close to the RL Baselines3
    Zoo's CartPole settings), the L2 TD loss and a learning rate decaying to zero.
    ``benchmarks/studies/default_configs_learn.py`` measures them (8 seeds: median greedy return
    500, IQM 494; ``docs/results/default_configs_learn.json``). Measured earlier over eight
    sets of 8 seeds (``PRNGKey(0..7)``, 10 greedy episodes per
    agent), the median was 500 in every set and 59 of the 64 agents returned at least
    400 (the others 399, 365, 289, 266 and 117). Without the decay the medians of the first six
    sets were 500, 368, 500, 500, 277 and 479 (32 of 48 agents at least 400: a greedy
    policy often collapses late, to returns near 100), and with Huber instead of L2 (no
    decay) 194 and 500 on the first two.

    Building a config checks every field but builds no environment; checks that need the
    environment (does ``env_id`` exist, are its actions discrete) run when the learner is
    built and name the field too.

    Attributes:
        env_id: a gymnax id with discrete actions (``CartPole-v1``, ``Acrobot-v1``,
            ``Breakout-MinAtar``, ...) or a discrete probe (``probe/<name>-discrete``).
        env_params: overrides of the environment's parameters (see :mod:`inner_loops.envs`).
        num_envs: parallel environments per agent.
        train_frequency: steps of every environment per update (before its gradient steps).
        gradient_steps: gradient steps per update.
        total_timesteps: environment steps per agent over the whole run.
        buffer_size: replay capacity in transitions.
        batch_size: transitions per gradient step, drawn uniformly from the buffer.
        learning_starts: environment steps of uniformly random acting before the first
            gradient step; at least one batch.
        target_update_interval: gradient steps between target-network updates.
        double_dqn: pick the next action with the online network, value it with the
            target network (van Hasselt et al. 2016).
        anneal_lr: decay the learning rate linearly to zero over training (by the update
            counter), which settles the greedy policy at the end of the budget (on by
            default: without it a good CartPole policy often collapses late).
        td_loss: the default ``"value"`` slot: ``"l2"`` (``0.5 x^2``) or ``"huber"``
            (threshold 1).
        hidden_sizes, activation: the Q-network MLP.
        precision: operands of the Q-network's matrix products (online and target),
            ``"float32"`` or ``"bfloat16"`` (float32 results; parameters, optimiser state,
            replay buffer and losses stay float32); see :mod:`inner_loops.linear`.
        eval_episodes: episodes of :meth:`~inner_loops.learner.Learner.evaluate`.
        eval_max_steps: their step limit (default: the environment's time limit).
        learning_rate, gamma, tau, epsilon_start, epsilon_end, exploration_fraction,
        max_grad_norm: defaults of the traced :class:`Hyperparams`.
    """

    env_id: str = "CartPole-v1"
    env_params: EnvParamPairs = ()
    num_envs: int = 8
    train_frequency: int = 32
    gradient_steps: int = 128
    total_timesteps: int = 100_000
    buffer_size: int = 100_000
    batch_size: int = 64
    learning_starts: int = 1_000
    target_update_interval: int = 128
    double_dqn: bool = True
    anneal_lr: bool = True
    td_loss: str = "l2"
    hidden_sizes: tuple[int, ...] = (128, 128)
    activation: str = "relu"
    precision: str = "float32"
    eval_episodes: int = 10
    eval_max_steps: int | None = None
    learning_rate: float = 5e-4
    gamma: float = 0.99
    tau: float = 1.0
    epsilon_start: float = 1.0
    epsilon_end: float = 0.04
    exploration_fraction: float = 0.16
    max_grad_norm: float = 10.0

    def __post_init__(self):
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValueError(f"env_id: expected an environment id, got {self.env_id!r}")
        object.__setattr__(self, "hidden_sizes", check_widths("hidden_sizes", self.hidden_sizes))
        for name in ("num_envs", "train_frequency", "gradient_steps", "total_timesteps",
                     "buffer_size", "batch_size", "learning_starts", "target_update_interval",
                     "eval_episodes"):
            check_positive_int(name, getattr(self, name))
        if self.eval_max_steps is not None:
            check_positive_int("eval_max_steps", self.eval_max_steps)
        for name in ("double_dqn", "anneal_lr"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        check_choice("td_loss", self.td_loss, TD_LOSSES)
        check_choice("activation", self.activation, networks.ACTIVATIONS)
        check_choice("precision", self.precision, PRECISIONS)
        self.check_schedule()
        for name in ("gamma", "epsilon_start", "epsilon_end", "exploration_fraction"):
            check_in_range(name, getattr(self, name), 0.0, 1.0)
        check_in_range("tau", self.tau, 0.0, 1.0, low_open=True)
        for name in ("learning_rate", "max_grad_norm"):
            check_positive(name, getattr(self, name))
        object.__setattr__(self, "env_params", env_param_pairs(self.env_params))

    def hyperparams(self) -> Hyperparams:
        """The numeric hyperparameters of this config as traced-ready float32 scalars."""
        return Hyperparams(**{f: jnp.float32(getattr(self, f)) for f in Hyperparams._fields})

    def replace(self, **changes) -> DQNConfig:
        return dataclasses.replace(self, **changes)


class Hyperparams(NamedTuple):
    """Numeric DQN hyperparameters; each a ``[]`` array (or ``[P]`` for a population)."""

    learning_rate: jax.Array
    gamma: jax.Array
    tau: jax.Array
    epsilon_start: jax.Array
    epsilon_end: jax.Array
    exploration_fraction: jax.Array
    max_grad_norm: jax.Array


@struct.dataclass
class DQNState:
    """Everything one DQN agent carries from update to update.

    Attributes:
        params: online Q-network parameters.
        target_params: target Q-network parameters.
        opt_state: Adam's state (with the gradient clip's).
        buffer: the agent's :class:`~inner_loops.replay.ReplayBuffer` of
            :class:`~inner_loops.off_policy.Transition` s.
        actors: its environments mid-episode.
        last_return: ``[]`` mean return of the episodes finished most recently (NaN before
            the first), what an update without finished episodes reports.
        last_length: ``[]`` their mean length.
        key: PRNG key of the next update.
        update_count: ``[]`` int32 updates done; every schedule reads it.
    """

    params: Any
    target_params: Any
    opt_state: Any
    buffer: replay.ReplayBuffer
    actors: off_policy.Actors
    last_return: jax.Array
    last_length: jax.Array
    key: jax.Array
    update_count: jax.Array


class QNetwork(nn.Module):
    """``obs [..., *obs_shape] -> Q [..., num_actions]``: an MLP over the flattened
    observation (its last ``obs_ndim`` axes), its products in ``precision``."""

    num_actions: int
    obs_ndim: int
    hidden_sizes: tuple[int, ...]
    activation: str
    precision: str = "float32"

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        mlp = networks.MLP(self.hidden_sizes, self.num_actions, 1.0, self.activation,
                           self.precision)
        return mlp(networks.flatten_obs(obs, self.obs_ndim))


def make_q_network(config: DQNConfig, spec: EnvSpec) -> QNetwork:
    """The Q-network of ``config`` for environment ``spec``: ``network.apply(state.params,
    obs [..., *obs_shape]) -> Q [..., num_actions]``."""
    return QNetwork(spec.action_dim, len(spec.obs_shape), config.hidden_sizes,
                    config.activation, config.precision)


def epsilon_at(update_count: jax.Array, hypers: Hyperparams, config: DQNConfig) -> jax.Array:
    """Epsilon of update ``update_count``: ``1`` while the update's steps start within the
    first ``learning_starts`` (the warm-up acts uniformly at random), else linear from
    ``epsilon_start`` to ``epsilon_end`` over ``exploration_fraction`` of the budget's
    updates (counted from the start of training), then ``epsilon_end``."""
    decay_updates = jnp.maximum(hypers.exploration_fraction * config.num_updates, 1.0)
    fraction = jnp.clip(update_count / decay_updates, 0.0, 1.0)
    epsilon = hypers.epsilon_start + fraction * (hypers.epsilon_end - hypers.epsilon_start)
    warming_up = update_count * config.steps_per_update < config.learning_starts
    return jnp.where(warming_up, 1.0, epsilon)


def _optimizer(hypers: Hyperparams) -> optax.GradientTransformation:
    """Clip by global norm, then Adam at unit step size (each member scales its updates by
    its own traced learning rate)."""
    return optax.chain(optax.clip_by_global_norm(hypers.max_grad_norm), optax.scale_by_adam())


class ExplorationNoise(NamedTuple):
    """Epsilon-greedy draws of one update, ``[train_frequency, num_envs]`` each: a uniform
    number (explore when below epsilon) and a uniformly random action."""

    uniform: jax.Array
    random_action: jax.Array


@dataclass(frozen=True, eq=False)
class DQNParts:
    """What :func:`build` makes once per config, and every piece of an update reads.

    Attributes:
        config: the static settings.
        objective: the ``"value"`` loss (the TD loss), ``td_loss``'s default filled in.
        vec_env: the agent's ``num_envs`` environments.
        network: the Q-network (:func:`make_q_network`), online and target alike.
        example: one :class:`~inner_loops.off_policy.Transition`, the replay buffer's
            layout.
        eval_max_steps: the step limit of an evaluation episode.
    """

    config: DQNConfig
    objective: Objective
    vec_env: VecEnv
    network: QNetwork
    example: off_policy.Transition
    eval_max_steps: int


def init_state(parts: DQNParts, key: jax.Array, meta_params, hypers: Hyperparams) -> DQNState:
    """A fresh agent: reset environments, an empty buffer, the target a copy of the online
    network."""
    del meta_params
    key, init_key, reset_key = jax.random.split(key, 3)
    actors = off_policy.reset_actors(parts.vec_env, reset_key)
    params = parts.network.init(init_key, actors.obs)
    nan = jnp.full((), jnp.nan, jnp.float32)
    return DQNState(
        params=params,
        target_params=params,
        opt_state=_optimizer(hypers).init(params),
        buffer=replay.init(parts.config.buffer_size, parts.example),
        actors=actors,
        last_return=nan,
        last_length=nan,
        key=key,
        update_count=jnp.zeros((), jnp.int32),
    )


def q_loss(parts: DQNParts, params, target_params, meta_params, hypers: Hyperparams,
           progress: jax.Array, batch: off_policy.Transition):
    """The objective's TD loss on a ``[B]`` batch of transitions.

    Returns ``(loss [], {"td_loss": [], "q_mean": []})``.
    """
    network = parts.network
    q_all = network.apply(params, batch.obs)
    q = jnp.take_along_axis(q_all, batch.action[:, None], axis=-1)[:, 0]
    next_q_target = network.apply(target_params, batch.next_obs)
    if parts.config.double_dqn:
        next_action = jnp.argmax(network.apply(params, batch.next_obs), axis=-1)
        next_value = jnp.take_along_axis(next_q_target, next_action[:, None], axis=-1)[:, 0]
    else:
        next_value = jnp.max(next_q_target, axis=-1)
    targets = off_policy.td_target(batch.reward, next_value, batch.terminated, hypers.gamma)
    inputs = LossInputs(values=q, targets=jax.lax.stop_gradient(targets), progress=progress)
    loss = parts.objective.value_loss(meta_params, inputs)
    return loss, {"td_loss": loss, "q_mean": jnp.mean(q)}


def learn(parts: DQNParts, state: DQNState, meta_params, hypers: Hyperparams,
          key: jax.Array):
    """``gradient_steps`` gradient steps on batches from ``state.buffer``.

    Returns ``((params, target_params, opt_state), diagnostics)``, the diagnostics of
    :func:`q_loss` as means over the steps (``[]`` each).
    """
    config = parts.config
    optimizer = _optimizer(hypers)
    progress = state.update_count / config.num_updates
    learning_rate = hypers.learning_rate
    if config.anneal_lr:
        learning_rate = learning_rate * (1.0 - progress)
    # gradient steps taken before this update, so target updates follow the counter
    done_before = (state.update_count - config.warmup_updates) * config.gradient_steps
    loss_grad = jax.grad(functools.partial(q_loss, parts), has_aux=True)

    def gradient_step(carry, inputs):
        params, target_params, opt_state = carry
        step_key, index = inputs
        batch = replay.sample(state.buffer, step_key, config.batch_size)
        grads, diagnostics = loss_grad(params, target_params, meta_params, hypers, progress,
                                       batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: -learning_rate * u, updates)
        params = optax.apply_updates(params, updates)
        target_params = off_policy.periodic_update(
            target_params, params, hypers.tau, done_before + index + 1,
            config.target_update_interval)
        return (params, target_params, opt_state), diagnostics

    (params, target_params, opt_state), diagnostics = jax.lax.scan(
        gradient_step, (state.params, state.target_params, state.opt_state),
        (jax.random.split(key, config.gradient_steps),
         jnp.arange(config.gradient_steps, dtype=jnp.int32)),
    )
    return (params, target_params, opt_state), {k: v.mean() for k, v in diagnostics.items()}


def skip_learning(parts: DQNParts, state: DQNState, meta_params, hypers: Hyperparams,
                  key: jax.Array):
    """What :func:`learn` returns during the warm-up: the state's networks unchanged, zero
    diagnostics."""
    del parts, meta_params, hypers, key
    zero = jnp.zeros((), jnp.float32)
    return (state.params, state.target_params, state.opt_state), {"td_loss": zero,
                                                                  "q_mean": zero}


def collect_epsilon_greedy(parts: DQNParts, state: DQNState, epsilon: jax.Array,
                           uniform_key: jax.Array, action_key: jax.Array,
                           collect_key: jax.Array):
    """``train_frequency`` steps of the ``num_envs`` environments, acting epsilon-greedily
    on ``state.params``, every transition added to ``state.buffer``.

    Returns ``(actors, buffer, finished)`` as :func:`~inner_loops.off_policy.collect`.
    """
    config, network = parts.config, parts.network
    shape = (config.train_frequency, config.num_envs)
    noise = ExplorationNoise(
        jax.random.uniform(uniform_key, shape),
        off_policy.uniform_actions(action_key, parts.vec_env.spec, shape),
    )
    params = state.params

    def act(obs, noise: ExplorationNoise):
        greedy = jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32)
        return jnp.where(noise.uniform < epsilon, noise.random_action, greedy)

    return off_policy.collect(parts.vec_env, act, state.actors, state.buffer, collect_key,
                              config.train_frequency, noise)


def update(parts: DQNParts, meta_params, hypers: Hyperparams, state: DQNState, _=None):
    """One DQN update: collect, then learn (or skip during the warm-up). Returns
    ``(state, summary)`` with ``[]`` metrics (the ``lax.scan`` body of :func:`advance`)."""
    key, uniform_key, action_key, collect_key, learn_key = jax.random.split(state.key, 5)
    epsilon = epsilon_at(state.update_count, hypers, parts.config)
    actors, buffer, finished = collect_epsilon_greedy(parts, state, epsilon, uniform_key,
                                                      action_key, collect_key)
    state = state.replace(actors=actors, buffer=buffer)
    learning = state.update_count >= parts.config.warmup_updates
    (params, target_params, opt_state), diagnostics = jax.lax.cond(
        learning, functools.partial(learn, parts), functools.partial(skip_learning, parts),
        state, meta_params, hypers, learn_key)
    summary = off_policy.update_metrics(diagnostics, finished, state.last_return,
                                        state.last_length, learning, epsilon=epsilon)
    state = state.replace(
        params=params, target_params=target_params, opt_state=opt_state,
        last_return=summary["episode_return"], last_length=summary["episode_length"],
        key=key, update_count=state.update_count + 1,
    )
    return state, summary


def advance(parts: DQNParts, state: DQNState, meta_params, hypers: Hyperparams,
            num_updates: int) -> tuple[DQNState, dict[str, jax.Array]]:
    """``num_updates`` updates in one ``lax.scan``; metrics ``[num_updates]`` each."""
    return jax.lax.scan(functools.partial(update, parts, meta_params, hypers), state, None,
                        length=num_updates)


def evaluate(parts: DQNParts, state: DQNState, key: jax.Array) -> dict[str, jax.Array]:
    """``eval_episodes`` greedy episodes of ``state.params``: ``eval_return`` and
    ``eval_length``, ``[]`` each."""
    def greedy(obs):
        return jnp.argmax(parts.network.apply(state.params, obs), axis=-1).astype(jnp.int32)

    evaluation = off_policy.evaluate_policy(parts.vec_env.env, greedy, key,
                                            parts.config.eval_episodes, parts.eval_max_steps)
    return evaluation._asdict()


def build(config: DQNConfig, objective: Objective | None = None) -> Learner:
    """The DQN :class:`~inner_loops.learner.Learner` of ``config`` and ``objective``.

    Args:
        config: static settings.
        objective: fills the ``"value"`` slot (the TD loss) or leaves it to ``td_loss``.

    Raises ``ValueError`` naming ``env_id`` or ``env_params`` when the environment does not
    exist or its actions are continuous, and ``eval_max_steps`` when the environment has no
    time limit to evaluate by; ``MemoryError`` when one agent's replay buffer would not fit.

    Metrics (each ``[num_updates]``): ``episode_return`` and ``episode_length`` of the
    epsilon-greedy training episodes (mean over those finished during the update, carried
    forward when none finished, NaN before the first), ``episodes`` (finished during the
    update), ``td_loss`` and ``q_mean`` (means over the update's gradient steps; 0 during
    the warm-up), ``epsilon``, ``learning`` (the update took gradient steps) and ``finite``.
    ``Learner.evaluate(state, key)`` runs ``eval_episodes`` greedy episodes: ``eval_return``
    and ``eval_length``.
    """
    default_term = squared_error() if config.td_loss == "l2" else huber()
    objective = (objective or Objective()).with_defaults(value=default_term)
    vec_env = make_vec_env(config.env_id, config.num_envs, env_params=config.env_params)
    spec = vec_env.spec
    if not spec.discrete:
        raise ValueError(f"env_id: DQN needs discrete actions but {config.env_id} has "
                         f"continuous ones (use td3 or sac)")
    eval_max_steps = config.eval_max_steps or spec.max_episode_steps
    if eval_max_steps is None:
        raise ValueError(f"eval_max_steps: {config.env_id} has no time limit; set how many "
                         "steps an evaluation episode may last")
    example = off_policy.example_transition(spec)
    replay.check_buffer_memory(1, config.buffer_size, example)
    parts = DQNParts(config, objective, vec_env, make_q_network(config, spec), example,
                     eval_max_steps)
    return Learner(
        algorithm="dqn",
        config=config,
        objective=objective,
        spec=spec,
        num_updates=config.num_updates,
        steps_per_update=config.steps_per_update,
        init_fn=functools.partial(init_state, parts),
        advance_fn=functools.partial(advance, parts),
        default_meta_params=objective.init(jax.random.PRNGKey(0)),
        default_hypers=config.hyperparams(),
        evaluate_fn=functools.partial(evaluate, parts),
    )


register_algorithm(
    "dqn", DQNConfig, build, slots=("value",),
    description="DQN: replay, epsilon-greedy, (double) Q-learning with Huber/L2 TD loss",
)
