"""What the off-policy continuous-control learners (TD3, SAC) share.

- :class:`ContinuousControlConfig`: the settings both have (environment, replay, update
  structure, networks, learning rates, discount, Polyak rate), checked field by field.
- :class:`ActionScale`: networks act in the unit box ``[-1, 1]^A``; the environment gets
  ``low + (u + 1) (high - low) / 2``, and stored actions are mapped back before a critic
  sees them, so the learners work unchanged on Pendulum's ``[-2, 2]`` and brax's ``[-1, 1]``.
- :func:`make_networks`: an actor and a critic module with the config's widths,
  activation and ``precision`` (the operands of their matrix products, float32 or
  bfloat16; see :mod:`inner_loops.linear`), shared by the networks and their targets.
- Twin critics: two :class:`~inner_loops.networks.QNetwork` s with their parameters stacked
  on a leading axis of 2 (:func:`init_twin_critic`, :func:`twin_q`), evaluated in one
  batched product; targets take their minimum (clipped double Q-learning).
- :func:`twin_critic_loss`: the critics' TD loss goes through the objective's ``"value"``
  slot, ``LossInputs(values=Q_i(s, a) [B], targets=y [B], progress)`` for each critic, the
  two losses summed; by default ``0.5 (Q - y)^2`` (``td_loss = "l2"``) or Huber.
- :func:`adam_step`: Adam at unit step size, its update scaled by a traced learning rate,
  so every member of a population has its own (fastpbrl's arrangement).
- :func:`build_learner`: the update loop both run, on the contract of
  :mod:`inner_loops.learner`. One *update* collects ``train_frequency`` steps of
  ``num_envs`` environments (uniformly random actions while the update starts within the
  first ``learning_starts`` steps, the exploring policy after), adds them to the agent's
  replay buffer, then runs the algorithm's ``gradient_steps`` gradient steps (none until
  the buffer holds ``learning_starts`` transitions). A step cut by the time limit
  bootstraps from the observation it reached; a terminated one does not
  (:mod:`inner_loops.off_policy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from inner_loops import networks, off_policy, replay
from inner_loops.envs import EnvParamPairs, EnvSpec, VecEnv, env_param_pairs, make_vec_env
from inner_loops.learner import Learner
from inner_loops.linear import PRECISIONS
from inner_loops.objective import LossInputs, LossTerm, Objective, huber, squared_error
from inner_loops.validation import (
    check_choice,
    check_in_range,
    check_positive,
    check_positive_int,
    check_widths,
)

TD_LOSSES = ("l2", "huber")


@dataclass(frozen=True)
class ContinuousControlConfig(off_policy.UpdateSchedule):
    """Settings TD3 and SAC share (each algorithm's config adds its own and sets its
    defaults; see :class:`~inner_loops.td3.TD3Config` and
    :class:`~inner_loops.sac.SACConfig`).

    The defaults are sized for Pendulum-v1 within 2e4 environment steps on a CPU: one update
    collects 32 steps (4 environments x 8) and then takes 32 gradient steps (one per
    environment step, as the RL Baselines3 Zoo's Pendulum settings do) on batches of 128,
    after 1000 steps of uniformly random actions; networks of 64-64 ReLU units; Adam at
    1e-3 (the Zoo's Pendulum rate). Public MuJoCo settings (fastpbrl: 256-256 units,
    batch 256, learning rates 3e-4) are for experiment files and accelerators. Their
    returns are measured by ``benchmarks/studies/default_configs_learn.py``
    (``docs/results/default_configs_learn.json``).

    Building a config checks every field but builds no environment; checks that need the
    environment (does ``env_id`` exist, are its actions continuous) run when the learner is
    built and name the field too.

    Attributes:
        env_id: a gymnax id with continuous actions (``Pendulum-v1``,
            ``MountainCarContinuous-v0``), a brax one (``brax/hopper``) or a continuous probe
            (``probe/<name>-continuous``).
        env_params: overrides of the environment's parameters (see :mod:`inner_loops.envs`;
            brax takes ``episode_length``).
        num_envs: parallel environments per agent.
        train_frequency: steps of every environment per update (before its gradient steps).
        gradient_steps: gradient steps per update; ``num_envs * train_frequency`` of them
            is one gradient step per environment step.
        total_timesteps: environment steps per agent over the whole run.
        buffer_size: replay capacity in transitions.
        batch_size: transitions per gradient step, drawn uniformly from the buffer.
        learning_starts: environment steps of uniformly random acting before the first
            gradient step; at least one batch.
        td_loss: the critics' default ``"value"`` slot: ``"l2"`` (``0.5 x^2``) or
            ``"huber"`` (threshold 1).
        actor_hidden_sizes, critic_hidden_sizes, activation: the MLPs.
        precision: operands of every network's matrix products (actor, twin critics and
            their targets), ``"float32"`` or ``"bfloat16"`` (float32 results; parameters,
            optimiser states, replay buffer and losses stay float32); see
            :mod:`inner_loops.linear`.
        eval_episodes: episodes of :meth:`~inner_loops.learner.Learner.evaluate`.
        eval_max_steps: their step limit (default: the environment's time limit).
        actor_learning_rate, critic_learning_rate, gamma, tau: defaults of the traced
            hyperparameters (Adam's step sizes, the discount and the Polyak rate of the
            target networks).
    """

    env_id: str = "Pendulum-v1"
    env_params: EnvParamPairs = ()
    num_envs: int = 4
    train_frequency: int = 8
    gradient_steps: int = 32
    total_timesteps: int = 20_000
    buffer_size: int = 20_000
    batch_size: int = 128
    learning_starts: int = 1_000
    td_loss: str = "l2"
    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    critic_hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    precision: str = "float32"
    eval_episodes: int = 10
    eval_max_steps: int | None = None
    actor_learning_rate: float = 1e-3
    critic_learning_rate: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005

    # the algorithm's traced hyperparameters: a NamedTuple class whose fields are fields of
    # the config (set by each algorithm's config)
    hyperparams_class: ClassVar[type | None] = None

    def __post_init__(self):
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValueError(f"env_id: expected an environment id, got {self.env_id!r}")
        for name in ("actor_hidden_sizes", "critic_hidden_sizes"):
            object.__setattr__(self, name, check_widths(name, getattr(self, name)))
        for name in ("num_envs", "train_frequency", "gradient_steps", "total_timesteps",
                     "buffer_size", "batch_size", "learning_starts", "eval_episodes"):
            check_positive_int(name, getattr(self, name))
        if self.eval_max_steps is not None:
            check_positive_int("eval_max_steps", self.eval_max_steps)
        check_choice("td_loss", self.td_loss, TD_LOSSES)
        check_choice("activation", self.activation, networks.ACTIVATIONS)
        check_choice("precision", self.precision, PRECISIONS)
        self.check_schedule()
        check_in_range("gamma", self.gamma, 0.0, 1.0)
        check_in_range("tau", self.tau, 0.0, 1.0, low_open=True)
        for name in ("actor_learning_rate", "critic_learning_rate"):
            check_positive(name, getattr(self, name))
        object.__setattr__(self, "env_params", env_param_pairs(self.env_params))

    def hyperparams(self) -> Any:
        """The numeric hyperparameters of this config as traced-ready float32 scalars (the
        algorithm's ``Hyperparams`` NamedTuple)."""
        cls = self.hyperparams_class
        return cls(**{f: jnp.float32(getattr(self, f)) for f in cls._fields})

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class ActionScale:
    """The affine map between the unit box ``[-1, 1]^A`` the networks act in and the
    environment's action bounds ``[low, high]`` (static float32 arrays ``[A]``)."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, spec: EnvSpec) -> ActionScale:
        return cls(np.asarray(spec.action_low, np.float32),
                   np.asarray(spec.action_high, np.float32))

    def to_env(self, unit: jax.Array) -> jax.Array:
        """``[..., A]`` unit-box actions -> the environment's bounds."""
        return self.low + 0.5 * (unit + 1.0) * (self.high - self.low)

    def to_unit(self, action: jax.Array) -> jax.Array:
        """``[..., A]`` environment actions -> the unit box (inverse of :meth:`to_env`)."""
        return 2.0 * (action - self.low) / (self.high - self.low) - 1.0


def check_continuous(spec: EnvSpec, env_id: str, algorithm: str) -> None:
    """``ValueError`` naming ``env_id`` when the environment's actions are discrete."""
    if spec.discrete:
        raise ValueError(f"env_id: {algorithm} needs continuous actions but {env_id} has "
                         f"{spec.action_dim} discrete ones (use dqn)")
    if not (np.all(np.isfinite(spec.action_low)) and np.all(np.isfinite(spec.action_high))):
        raise ValueError(f"env_id: {algorithm} needs bounded actions but {env_id} has bounds "
                         f"{spec.action_low} .. {spec.action_high}")


# -------------------------------------------------------------------------- networks


def make_networks(config: ContinuousControlConfig, actor_class: type[nn.Module],
                  obs_ndim: int, action_dim: int) -> tuple[nn.Module, networks.QNetwork]:
    """The algorithm's actor (an ``actor_class`` module) and (one) critic module, with the
    widths, activation and precision of ``config``; target networks apply the same modules
    to their own parameters."""
    actor = actor_class(action_dim, obs_ndim, config.actor_hidden_sizes, config.activation,
                        config.precision)
    critic = networks.QNetwork(obs_ndim, config.critic_hidden_sizes, config.activation,
                               config.precision)
    return actor, critic


# --------------------------------------------------------------------------- critics


def init_twin_critic(critic: networks.QNetwork, key: jax.Array, obs: jax.Array,
                     action: jax.Array) -> Any:
    """Parameters of two independently initialised critics, stacked: every leaf ``[2, ...]``."""
    return jax.vmap(lambda k: critic.init(k, obs, action))(jax.random.split(key, 2))


def twin_q(critic: networks.QNetwork, params: Any, obs: jax.Array,
           action: jax.Array) -> jax.Array:
    """Both critics' ``Q(obs, action)``: ``[B, ...] -> [2, B]``."""
    return jax.vmap(critic.apply, in_axes=(0, None, None))(params, obs, action)


def min_q(q: jax.Array) -> jax.Array:
    """The twin critics' minimum, ``[2, B] -> [B]``, as ``jnp.minimum(q[0], q[1])``.

    Not ``jnp.min(q, axis=0)``: the gradient of a reduction divides by the number of
    entries equal to the minimum, and XLA may recompute ``q`` with different rounding (it
    did at ``xla_backend_optimization_level=0``), leaving none equal and a NaN gradient."""
    return jnp.minimum(q[0], q[1])


def first_q(critic: networks.QNetwork, params: Any, obs: jax.Array,
            action: jax.Array) -> jax.Array:
    """The first critic's ``Q(obs, action)`` alone (TD3's actor loss): ``[B]``."""
    return critic.apply(jax.tree.map(lambda p: p[0], params), obs, action)


def twin_critic_loss(objective: Objective, meta_params: Any, q: jax.Array,
                     targets: jax.Array, progress: jax.Array) -> jax.Array:
    """The sum over the twin critics of the objective's ``"value"`` loss of ``q [2, B]``
    against the (already stop-gradient) TD ``targets [B]``."""
    return sum(objective.value_loss(meta_params,
                                    LossInputs(values=q[i], targets=targets, progress=progress))
               for i in range(q.shape[0]))


def default_td_loss(config: ContinuousControlConfig) -> LossTerm:
    """The ``"value"`` term ``td_loss`` names."""
    return squared_error() if config.td_loss == "l2" else huber()


# ------------------------------------------------------------------------ optimiser

ADAM = optax.scale_by_adam()


def adam_step(params: Any, opt_state: Any, grads: Any, learning_rate: jax.Array,
              ) -> tuple[Any, Any]:
    """One Adam step of size ``learning_rate`` (a traced scalar): Adam at unit step size,
    its update scaled by ``-learning_rate``."""
    updates, opt_state = ADAM.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - learning_rate * u, params, updates)
    return params, opt_state


# ------------------------------------------------------------------------- the loop


@struct.dataclass
class OffPolicyState:
    """Everything one TD3 or SAC agent carries from update to update.

    Attributes:
        nets: the algorithm's networks, target networks and optimiser states
            (:class:`~inner_loops.td3.TD3Nets` or :class:`~inner_loops.sac.SACNets`).
        buffer: the agent's :class:`~inner_loops.replay.ReplayBuffer` of
            :class:`~inner_loops.off_policy.Transition` s (actions in the environment's
            bounds, as the environment got them).
        actors: its environments mid-episode.
        last_return: ``[]`` mean return of the episodes finished most recently (NaN before
            the first), what an update without finished episodes reports.
        last_length: ``[]`` their mean length.
        key: PRNG key of the next update.
        update_count: ``[]`` int32 updates done; the warm-up and ``progress`` read it.
    """

    nets: Any
    buffer: replay.ReplayBuffer
    actors: off_policy.Actors
    last_return: jax.Array
    last_length: jax.Array
    key: jax.Array
    update_count: jax.Array


class Exploration(NamedTuple):
    """The random draws of one update's acting, ``[train_frequency, num_envs, A]`` each:
    standard normal noise for the exploring policy, and uniform unit-box actions for the
    warm-up."""

    normal: jax.Array
    uniform: jax.Array


@dataclass(frozen=True)
class Algorithm:
    """The parts of an algorithm :func:`build_learner` runs (all pure functions).

    Attributes:
        name: the registered name (``"td3"``, ``"sac"``).
        init_nets: ``(key, obs [N, ...], hypers) -> nets``.
        explore: ``(nets, obs [N, ...], normal [N, A], hypers) -> [N, A]`` unit-box actions
            of the exploring policy given standard normal noise.
        deterministic: ``(nets, obs [N, ...]) -> [N, A]`` unit-box actions of the
            evaluation policy (no noise).
        learn: ``(nets, buffer, meta_params, hypers, progress [], key) -> (nets,
            diagnostics)``: one update's ``gradient_steps`` gradient steps; diagnostics is
            a dict of ``[]`` float32 means.
        diagnostics: the names of ``learn``'s diagnostics (reported as 0 during the warm-up).
    """

    name: str
    init_nets: Callable[..., Any]
    explore: Callable[..., jax.Array]
    deterministic: Callable[..., jax.Array]
    learn: Callable[..., tuple[Any, dict[str, jax.Array]]]
    diagnostics: tuple[str, ...]


def make_env_for(config: ContinuousControlConfig, algorithm: str) -> tuple[VecEnv, int]:
    """The learner's environments and its evaluation step limit; ``ValueError`` naming the
    field when the environment does not suit (see :func:`check_continuous`)."""
    vec_env = make_vec_env(config.env_id, config.num_envs, env_params=config.env_params)
    check_continuous(vec_env.spec, config.env_id, algorithm)
    eval_max_steps = config.eval_max_steps or vec_env.spec.max_episode_steps
    if eval_max_steps is None:
        raise ValueError(f"eval_max_steps: {config.env_id} has no time limit; set how many "
                         "steps an evaluation episode may last")
    return vec_env, eval_max_steps


def build_learner(config: ContinuousControlConfig, objective: Objective, vec_env: VecEnv,
                  eval_max_steps: int, algorithm: Algorithm) -> Learner:
    """The :class:`~inner_loops.learner.Learner` running ``algorithm``'s parts in the shared
    update loop (see the module docstring).

    Metrics (each ``[num_updates]``): ``episode_return`` and ``episode_length`` of the
    exploring training episodes (mean over those finished during the update, carried
    forward when none finished, NaN before the first), ``episodes`` (finished during the
    update), the algorithm's diagnostics (0 during the warm-up), ``learning`` (the update
    took gradient steps) and ``finite``. ``Learner.evaluate(state, key)`` runs
    ``eval_episodes`` episodes of the deterministic policy: ``eval_return`` and
    ``eval_length``.
    """
    spec = vec_env.spec
    scale = ActionScale.of(spec)
    example = off_policy.example_transition(spec)
    replay.check_buffer_memory(1, config.buffer_size, example)
    num_envs, num_steps, action_dim = config.num_envs, config.train_frequency, spec.action_dim
    total_updates = config.num_updates

    def init(key, meta_params, hypers) -> OffPolicyState:
        del meta_params
        key, init_key, reset_key = jax.random.split(key, 3)
        actors = off_policy.reset_actors(vec_env, reset_key)
        nan = jnp.full((), jnp.nan, jnp.float32)
        return OffPolicyState(
            nets=algorithm.init_nets(init_key, actors.obs, hypers),
            buffer=replay.init(config.buffer_size, example),
            actors=actors,
            last_return=nan,
            last_length=nan,
            key=key,
            update_count=jnp.zeros((), jnp.int32),
        )

    def learn(state: OffPolicyState, meta_params, hypers, key):
        progress = state.update_count / total_updates
        return algorithm.learn(state.nets, state.buffer, meta_params, hypers, progress, key)

    def skip(state: OffPolicyState, meta_params, hypers, key):
        del meta_params, hypers, key
        zero = jnp.zeros((), jnp.float32)
        return state.nets, {name: zero for name in algorithm.diagnostics}

    def advance(state: OffPolicyState, meta_params, hypers, num_updates: int):
        def update(state: OffPolicyState, _):
            key, normal_key, uniform_key, collect_key, learn_key = jax.random.split(state.key, 5)
            shape = (num_steps, num_envs, action_dim)
            noise = Exploration(jax.random.normal(normal_key, shape),
                                jax.random.uniform(uniform_key, shape, minval=-1.0, maxval=1.0))
            warming_up = state.update_count * config.steps_per_update < config.learning_starts
            nets = state.nets

            def act(obs, noise: Exploration):
                policy = algorithm.explore(nets, obs, noise.normal, hypers)
                return scale.to_env(jnp.where(warming_up, noise.uniform, policy))

            actors, buffer, finished = off_policy.collect(
                vec_env, act, state.actors, state.buffer, collect_key, num_steps, noise)
            state = state.replace(actors=actors, buffer=buffer)
            learning = state.update_count >= config.warmup_updates
            # Under vmap a cond whose predicate differs per member becomes a select (both
            # branches run); members of one population share the warm-up, and on one agent
            # the warm-up's updates skip the gradient steps.
            nets, diagnostics = jax.lax.cond(learning, learn, skip, state, meta_params,
                                             hypers, learn_key)
            summary = off_policy.update_metrics(diagnostics, finished, state.last_return,
                                                state.last_length, learning)
            state = state.replace(nets=nets, last_return=summary["episode_return"],
                                  last_length=summary["episode_length"], key=key,
                                  update_count=state.update_count + 1)
            return state, summary

        return jax.lax.scan(update, state, None, length=num_updates)

    def evaluate(state: OffPolicyState, key):
        def policy(obs):
            return scale.to_env(algorithm.deterministic(state.nets, obs))

        evaluation = off_policy.evaluate_policy(vec_env.env, policy, key,
                                                config.eval_episodes, eval_max_steps)
        return evaluation._asdict()

    return Learner(
        algorithm=algorithm.name,
        config=config,
        objective=objective,
        spec=spec,
        num_updates=total_updates,
        steps_per_update=config.steps_per_update,
        init_fn=init,
        advance_fn=advance,
        default_meta_params=objective.init(jax.random.PRNGKey(0)),
        default_hypers=config.hyperparams(),
        evaluate_fn=evaluate,
    )
