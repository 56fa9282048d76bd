"""TD3 on the inner-loop contract: ``build(config, objective) -> Learner``.

Twin Delayed DDPG (Fujimoto et al. 2018): a deterministic tanh actor, two critics whose
minimum forms the target (clipped double Q-learning), target policy smoothing (clipped
Gaussian noise on the target actor's action) and delayed actor updates (one actor step, and
one Polyak step of every target network, per ``policy_delay`` critic steps). The update
loop, action scaling and twin critics are shared with SAC
(:mod:`inner_loops.continuous_control`).

The critics' TD loss fills the objective's ``"value"`` slot with ``LossInputs(values=
Q_i(s, a) [B], targets=r + gamma (1 - terminated) min_j Q'_j(s', a') [B])`` for each critic
(the two losses summed), ``a' = clip(mu'(s') + clip(target_noise * eps, ±noise_clip), ±1)``
in the unit action box; by default ``0.5 (Q - y)^2``. The actor minimises
``-mean Q_1(s, mu(s))``.

**Delayed updates under vmap.** One update's ``gradient_steps`` are a scan over
``gradient_steps / policy_delay`` blocks, each a scan of ``policy_delay`` critic steps
followed by one actor step and the target updates (so ``policy_delay`` must divide
``gradient_steps``). The actor's gradient is computed only when it is applied: a
``lax.cond`` on the step number would become a select under ``vmap`` and compute it at
every step.

Shape-setting settings live in :class:`TD3Config` and are static; the numeric ones in
:class:`Hyperparams` are traced, so a population can give every member its own learning
rates, discount, Polyak rate and exploration and smoothing noise.
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
    first_q,
    init_twin_critic,
    make_env_for,
    min_q,
    twin_critic_loss,
    twin_q,
)
from inner_loops.learner import Learner
from inner_loops.networks import DeterministicActor, QNetwork
from inner_loops.objective import Objective
from inner_loops.registry import register_algorithm
from inner_loops.validation import check_non_negative, check_positive_int


class Hyperparams(NamedTuple):
    """Numeric TD3 hyperparameters; each a ``[]`` array (or ``[P]`` for a population).
    The noise scales are in the unit action box (a fraction of half the action range)."""

    actor_learning_rate: jax.Array
    critic_learning_rate: jax.Array
    gamma: jax.Array
    tau: jax.Array
    exploration_noise: jax.Array
    target_noise: jax.Array
    noise_clip: jax.Array


@dataclass(frozen=True)
class TD3Config(ContinuousControlConfig):
    """Settings of one TD3 agent: those of
    :class:`~inner_loops.continuous_control.ContinuousControlConfig` and the ones below.

    The defaults are for Pendulum-v1 within 2e4 environment steps (see the README for the
    returns they reach); fastpbrl's TD3 uses learning rates 3e-4, tau 0.005, noise 0.1 /
    0.2 / 0.5 and delay 2 on MuJoCo.

    Attributes:
        policy_delay: critic steps per actor step (and per target-network update); must
            divide ``gradient_steps``.
        exploration_noise: default of the traced standard deviation of the Gaussian noise
            added to the actor's action while collecting (unit action box).
        target_noise: default of the traced standard deviation of the target policy
            smoothing noise.
        noise_clip: default of the traced bound of that noise.
    """

    gamma: float = 0.98
    policy_delay: int = 2
    exploration_noise: float = 0.1
    target_noise: float = 0.2
    noise_clip: float = 0.5

    hyperparams_class: ClassVar[type] = Hyperparams

    def __post_init__(self):
        super().__post_init__()
        check_positive_int("policy_delay", self.policy_delay)
        if self.gradient_steps % self.policy_delay:
            raise ValueError(f"policy_delay: {self.policy_delay} does not divide "
                             f"gradient_steps = {self.gradient_steps} (every update runs whole "
                             "blocks of policy_delay critic steps and one actor step)")
        for name in ("exploration_noise", "target_noise", "noise_clip"):
            check_non_negative(name, getattr(self, name))


@struct.dataclass
class TD3Nets:
    """TD3's networks (parameters), target networks and Adam states; the critics' leaves
    have a leading axis of 2 (twin critics)."""

    actor: Any
    critic: Any
    target_actor: Any
    target_critic: Any
    actor_opt: Any
    critic_opt: Any


def make_networks(config: TD3Config, obs_ndim: int, action_dim: int,
                  ) -> tuple[DeterministicActor, QNetwork]:
    """TD3's actor and (one) critic module."""
    return continuous_control.make_networks(config, DeterministicActor, obs_ndim, action_dim)


def build(config: TD3Config, objective: Objective | None = None) -> Learner:
    """The TD3 :class:`~inner_loops.learner.Learner` of ``config`` and ``objective``.

    Args:
        config: static settings.
        objective: fills the ``"value"`` slot (the critics' TD loss) or leaves it to
            ``td_loss``.

    Raises ``ValueError`` naming ``env_id`` when the environment does not exist or its
    actions are discrete, and ``eval_max_steps`` when it has no time limit to evaluate by;
    ``MemoryError`` when one agent's replay buffer would not fit.

    Metrics (each ``[num_updates]``, besides those of
    :func:`~inner_loops.continuous_control.build_learner`): ``critic_loss`` (the sum over
    both critics), ``q_mean`` (of the first critic on the batch) and ``actor_loss``, means
    over the update's steps.
    """
    objective = (objective or Objective()).with_defaults(value=default_td_loss(config))
    vec_env, eval_max_steps = make_env_for(config, "td3")
    spec = vec_env.spec
    scale = ActionScale.of(spec)
    actor, critic = make_networks(config, len(spec.obs_shape), spec.action_dim)
    delay = config.policy_delay
    blocks = config.gradient_steps // delay

    def init_nets(key, obs, hypers) -> TD3Nets:
        del hypers
        actor_key, critic_key = jax.random.split(key)
        actor_params = actor.init(actor_key, obs)
        critic_params = init_twin_critic(critic, critic_key, obs, actor.apply(actor_params, obs))
        return TD3Nets(actor_params, critic_params, actor_params, critic_params,
                       ADAM.init(actor_params), ADAM.init(critic_params))

    def explore(nets: TD3Nets, obs, normal, hypers):
        action = actor.apply(nets.actor, obs) + hypers.exploration_noise * normal
        return jnp.clip(action, -1.0, 1.0)

    def deterministic(nets: TD3Nets, obs):
        return actor.apply(nets.actor, obs)

    def critic_loss_fn(critic_params, nets: TD3Nets, batch, smoothing, meta_params, hypers,
                       progress):
        noise = jnp.clip(hypers.target_noise * smoothing, -hypers.noise_clip, hypers.noise_clip)
        next_action = jnp.clip(actor.apply(nets.target_actor, batch.next_obs) + noise, -1.0, 1.0)
        next_q = min_q(twin_q(critic, nets.target_critic, batch.next_obs, next_action))
        targets = off_policy.td_target(batch.reward, next_q, batch.terminated, hypers.gamma)
        q = twin_q(critic, critic_params, batch.obs, scale.to_unit(batch.action))
        loss = twin_critic_loss(objective, meta_params, q, jax.lax.stop_gradient(targets),
                                progress)
        return loss, {"critic_loss": loss, "q_mean": jnp.mean(q[0])}

    def actor_loss_fn(actor_params, critic_params, obs):
        return -jnp.mean(first_q(critic, critic_params, obs, actor.apply(actor_params, obs)))

    def learn(nets: TD3Nets, buffer, meta_params, hypers, progress, key):
        index_key, noise_key = jax.random.split(key)
        indices = replay.sample_index_batches(buffer, index_key, config.gradient_steps,
                                              config.batch_size)
        smoothing = jax.random.normal(noise_key, (config.gradient_steps, config.batch_size,
                                                  spec.action_dim))
        indices = indices.reshape(blocks, delay, config.batch_size)
        smoothing = smoothing.reshape(blocks, delay, *smoothing.shape[1:])

        def block(nets: TD3Nets, inputs):
            block_indices, block_smoothing = inputs

            def critic_step(carry, step_inputs):
                critic_params, critic_opt = carry
                step_indices, step_smoothing = step_inputs
                batch = replay.gather(buffer, step_indices)
                grads, diagnostics = jax.grad(critic_loss_fn, has_aux=True)(
                    critic_params, nets, batch, step_smoothing, meta_params, hypers, progress)
                critic_params, critic_opt = adam_step(critic_params, critic_opt, grads,
                                                      hypers.critic_learning_rate)
                return (critic_params, critic_opt), diagnostics

            (critic_params, critic_opt), diagnostics = jax.lax.scan(
                critic_step, (nets.critic, nets.critic_opt), (block_indices, block_smoothing))
            # the actor step uses the block's last batch, as TD3 uses the batch of the
            # critic step it follows
            obs = replay.gather(buffer, block_indices[-1]).obs
            actor_loss, grads = jax.value_and_grad(actor_loss_fn)(nets.actor, critic_params, obs)
            actor_params, actor_opt = adam_step(nets.actor, nets.actor_opt, grads,
                                                hypers.actor_learning_rate)
            nets = TD3Nets(
                actor=actor_params,
                critic=critic_params,
                target_actor=off_policy.polyak_update(nets.target_actor, actor_params,
                                                      hypers.tau),
                target_critic=off_policy.polyak_update(nets.target_critic, critic_params,
                                                       hypers.tau),
                actor_opt=actor_opt,
                critic_opt=critic_opt,
            )
            diagnostics = {name: value.mean() for name, value in diagnostics.items()}
            return nets, {**diagnostics, "actor_loss": actor_loss}

        nets, diagnostics = jax.lax.scan(block, nets, (indices, smoothing))
        return nets, {name: value.mean() for name, value in diagnostics.items()}

    algorithm = Algorithm("td3", init_nets, explore, deterministic, learn,
                          ("critic_loss", "q_mean", "actor_loss"))
    return build_learner(config, objective, vec_env, eval_max_steps, algorithm)


register_algorithm(
    "td3", TD3Config, build, slots=("value",),
    description="TD3: twin critics, target policy smoothing, delayed actor updates "
                "(continuous actions)",
)
