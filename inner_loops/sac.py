"""SAC on the inner-loop contract: ``build(config, objective) -> Learner``.

Soft Actor-Critic (Haarnoja et al. 2018, with the automatic temperature of the 2019
version): a tanh-squashed Gaussian actor (the log-density corrected for the tanh, see
:func:`~inner_loops.networks.squashed_gaussian`), two critics whose minimum forms the soft
target, Polyak-averaged target critics, and a temperature ``alpha`` tuned so that the
policy's entropy tracks ``target_entropy = target_entropy_scale * (-|A|)``. The update
loop, action scaling and twin critics are shared with TD3
(:mod:`inner_loops.continuous_control`).

Each gradient step, on one batch:

1. critics: the objective's ``"value"`` slot with ``LossInputs(values=Q_i(s, a) [B],
   targets=r + gamma (1 - terminated) (min_j Q'_j(s', a') - alpha log pi(a'|s')) [B])``
   for each critic (summed), ``a' ~ pi(.|s')``; by default ``0.5 (Q - y)^2``;
2. actor: ``mean(alpha log pi(a|s) - min_j Q_j(s, a))``, ``a ~ pi(.|s)`` reparameterised,
   against the critics just updated;
3. temperature: ``-mean(log_alpha (log pi(a|s) + target_entropy))`` (gradient to
   ``log_alpha`` only), as Stable-Baselines3 does;
4. the target critics move ``tau`` of the way to the critics.

Log-densities are those of the unit-box action (``tanh(u)``); the affine map to the
environment's bounds only shifts them by a constant, so the entropy target is the same for
every action range.

Shape-setting settings live in :class:`SACConfig` and are static; the numeric ones in
:class:`Hyperparams` are traced, so a population can give every member its own learning
rates, discount, Polyak rate, target-entropy scale and initial temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from inner_loops import continuous_control, off_policy, replay
from inner_loops.continuous_control import (
    ADAM,
    ActionScale,
    Algorithm,
    ContinuousControlConfig,
    adam_step,
    build_learner,
    default_td_loss,
    init_twin_critic,
    make_env_for,
    min_q,
    twin_critic_loss,
    twin_q,
)
from inner_loops.learner import Learner
from inner_loops.networks import QNetwork, SquashedGaussianActor, squashed_gaussian
from inner_loops.objective import Objective
from inner_loops.registry import register_algorithm
from inner_loops.validation import check_finite, check_positive


class Hyperparams(NamedTuple):
    """Numeric SAC hyperparameters; each a ``[]`` array (or ``[P]`` for a population)."""

    actor_learning_rate: jax.Array
    critic_learning_rate: jax.Array
    alpha_learning_rate: jax.Array
    gamma: jax.Array
    tau: jax.Array
    target_entropy_scale: jax.Array
    init_alpha: jax.Array


@dataclass(frozen=True)
class SACConfig(ContinuousControlConfig):
    """Settings of one SAC agent: those of
    :class:`~inner_loops.continuous_control.ContinuousControlConfig` and the ones below.

    The defaults are for Pendulum-v1 within 2e4 environment steps (see the README for the
    returns they reach); fastpbrl's SAC uses learning rates 3e-4, tau 0.005 and target
    entropy ``-|A|`` on MuJoCo.

    Attributes:
        alpha_learning_rate: default of the traced step size of the temperature's Adam.
        target_entropy_scale: default of the traced scale of the entropy target
            ``target_entropy_scale * (-|A|)``.
        init_alpha: default of the traced initial temperature (``> 0``).
    """

    alpha_learning_rate: float = 1e-3
    target_entropy_scale: float = 1.0
    init_alpha: float = 1.0

    hyperparams_class: ClassVar[type] = Hyperparams

    def __post_init__(self):
        super().__post_init__()
        check_positive("alpha_learning_rate", self.alpha_learning_rate)
        check_finite("target_entropy_scale", self.target_entropy_scale)
        check_positive("init_alpha", self.init_alpha)


@struct.dataclass
class SACNets:
    """SAC's networks (parameters), target critics, temperature and Adam states; the
    critics' leaves have a leading axis of 2 (twin critics)."""

    actor: Any
    critic: Any
    target_critic: Any
    log_alpha: jax.Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any


def make_networks(config: SACConfig, obs_ndim: int, action_dim: int,
                  ) -> tuple[SquashedGaussianActor, QNetwork]:
    """SAC's actor and (one) critic module."""
    return continuous_control.make_networks(config, SquashedGaussianActor, obs_ndim, action_dim)


def build(config: SACConfig, objective: Objective | None = None) -> Learner:
    """The SAC :class:`~inner_loops.learner.Learner` of ``config`` and ``objective``.

    Args:
        config: static settings.
        objective: fills the ``"value"`` slot (the critics' TD loss) or leaves it to
            ``td_loss``.

    Raises ``ValueError`` naming ``env_id`` when the environment does not exist or its
    actions are discrete, and ``eval_max_steps`` when it has no time limit to evaluate by;
    ``MemoryError`` when one agent's replay buffer would not fit.

    Metrics (each ``[num_updates]``, besides those of
    :func:`~inner_loops.continuous_control.build_learner`): ``critic_loss`` (the sum over
    both critics), ``q_mean`` (of the first critic on the batch), ``actor_loss``,
    ``alpha`` (the temperature after each step) and ``entropy`` (``-mean log pi(a|s)`` of
    the actions the actor step sampled), means over the update's gradient steps.
    ``Learner.evaluate`` acts with the mean action ``tanh(mean)``.
    """
    objective = (objective or Objective()).with_defaults(value=default_td_loss(config))
    vec_env, eval_max_steps = make_env_for(config, "sac")
    spec = vec_env.spec
    scale = ActionScale.of(spec)
    actor, critic = make_networks(config, len(spec.obs_shape), spec.action_dim)
    action_dim = spec.action_dim

    def init_nets(key, obs, hypers) -> SACNets:
        actor_key, critic_key = jax.random.split(key)
        actor_params = actor.init(actor_key, obs)
        critic_params = init_twin_critic(critic, critic_key, obs,
                                         jnp.zeros((obs.shape[0], action_dim), jnp.float32))
        log_alpha = jnp.log(jnp.asarray(hypers.init_alpha, jnp.float32))
        return SACNets(actor_params, critic_params, critic_params, log_alpha,
                       ADAM.init(actor_params), ADAM.init(critic_params), ADAM.init(log_alpha))

    def explore(nets: SACNets, obs, normal, hypers):
        del hypers
        mean, log_std = actor.apply(nets.actor, obs)
        return squashed_gaussian(mean, log_std, normal)[0]

    def deterministic(nets: SACNets, obs):
        return jnp.tanh(actor.apply(nets.actor, obs)[0])

    def sample_policy(actor_params, obs, noise):
        mean, log_std = actor.apply(actor_params, obs)
        return squashed_gaussian(mean, log_std, noise)

    def critic_loss_fn(critic_params, nets: SACNets, batch, noise, meta_params, hypers,
                       progress):
        alpha = jnp.exp(nets.log_alpha)
        next_action, next_log_prob = sample_policy(nets.actor, batch.next_obs, noise)
        next_q = min_q(twin_q(critic, nets.target_critic, batch.next_obs, next_action))
        soft_value = next_q - alpha * next_log_prob
        targets = off_policy.td_target(batch.reward, soft_value, batch.terminated, hypers.gamma)
        q = twin_q(critic, critic_params, batch.obs, scale.to_unit(batch.action))
        loss = twin_critic_loss(objective, meta_params, q, jax.lax.stop_gradient(targets),
                                progress)
        return loss, {"critic_loss": loss, "q_mean": jnp.mean(q[0])}

    def actor_loss_fn(actor_params, critic_params, alpha, obs, noise):
        action, log_prob = sample_policy(actor_params, obs, noise)
        q = min_q(twin_q(critic, critic_params, obs, action))
        return jnp.mean(alpha * log_prob - q), log_prob

    def alpha_loss_fn(log_alpha, log_prob, target_entropy):
        return -jnp.mean(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))

    def learn(nets: SACNets, buffer, meta_params, hypers, progress, key):
        index_key, noise_key = jax.random.split(key)
        indices = replay.sample_index_batches(buffer, index_key, config.gradient_steps,
                                              config.batch_size)
        # per step: the next action of the critics' target, the action of the actor step
        noise = jax.random.normal(noise_key, (config.gradient_steps, 2, config.batch_size,
                                              action_dim))
        target_entropy = -hypers.target_entropy_scale * action_dim

        def gradient_step(nets: SACNets, inputs):
            step_indices, step_noise = inputs
            batch = replay.gather(buffer, step_indices)
            grads, diagnostics = jax.grad(critic_loss_fn, has_aux=True)(
                nets.critic, nets, batch, step_noise[0], meta_params, hypers, progress)
            critic_params, critic_opt = adam_step(nets.critic, nets.critic_opt, grads,
                                                  hypers.critic_learning_rate)
            alpha = jnp.exp(nets.log_alpha)
            (actor_loss, log_prob), grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
                nets.actor, critic_params, alpha, batch.obs, step_noise[1])
            actor_params, actor_opt = adam_step(nets.actor, nets.actor_opt, grads,
                                                hypers.actor_learning_rate)
            grad = jax.grad(alpha_loss_fn)(nets.log_alpha, log_prob, target_entropy)
            log_alpha, alpha_opt = adam_step(nets.log_alpha, nets.alpha_opt, grad,
                                             hypers.alpha_learning_rate)
            nets = SACNets(
                actor=actor_params,
                critic=critic_params,
                target_critic=off_policy.polyak_update(nets.target_critic, critic_params,
                                                       hypers.tau),
                log_alpha=log_alpha,
                actor_opt=actor_opt,
                critic_opt=critic_opt,
                alpha_opt=alpha_opt,
            )
            return nets, {**diagnostics, "actor_loss": actor_loss,
                          "alpha": jnp.exp(log_alpha), "entropy": -jnp.mean(log_prob)}

        nets, diagnostics = jax.lax.scan(gradient_step, nets, (indices, noise))
        return nets, {name: value.mean() for name, value in diagnostics.items()}

    algorithm = Algorithm("sac", init_nets, explore, deterministic, learn,
                          ("critic_loss", "q_mean", "actor_loss", "alpha", "entropy"))
    return build_learner(config, objective, vec_env, eval_max_steps, algorithm)


register_algorithm(
    "sac", SACConfig, build, slots=("value",),
    description="SAC: twin critics, tanh-squashed Gaussian actor, automatic entropy tuning "
                "(continuous actions)",
)
