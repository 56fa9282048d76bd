"""Meta-gradient discovery: the learned objective's meta-parameters follow the gradient of
how well agents do after training under it (``[meta] method = "metagradient"``).

This is the other way of meta-learning a loss (Xu et al. 2018; Oh et al. 2020, LPG;
DiscoRL): instead of scoring perturbed candidates by whole training runs (evolution), every
step backpropagates through a few of the agents' own updates under the learned loss to an
objective of the updated agents, and takes one optimiser step on the meta-parameters.

**One meta-step** (:meth:`MetaGradient.meta_step`, one ``jit``), for each of ``A`` agents:

1. an agent whose lifetime is over (``meta.lifetime`` updates; staggered at the start,
   see :class:`~metarl.evolve.metagradient_config.MetaGradientConfig`), or whose
   parameters are no longer finite, is replaced by a fresh one;
2. :meth:`~MetaGradient.unroll`: ``K = meta.unroll`` PPO updates (rollout, GAE, epochs of
   minibatch steps) under the current meta-parameters ``theta``, through
   :meth:`inner_loops.learner.Learner.advance`; each update is rematerialised in the
   backward pass (``meta.remat``). The rollouts are data: PPO's
   ``stop_rollout_gradient`` keeps their log-probabilities, values and targets, and the
   environment, out of the derivative (``meta.rollout_gradient`` puts them back);
3. :meth:`~MetaGradient.validation_batch`: fresh rollouts of the updated agent
   (``meta.validation_rollouts``), their advantages and lambda-returns computed with its
   own critic and held fixed (their steps move the agent's environments on, as an
   update's would);
4. :meth:`~MetaGradient.meta_loss` of the updated parameters on that rollout
   (``meta.objective``): PPO's objective at ratio 1, which is the policy gradient, plus the
   critic's squared error and the entropy bonus, or parts of it;
5. the gradient of 4 with respect to ``theta`` through 2.

The gradients are ``vmap``-ed over agents (chunked and sharded over devices as an
evolution's population is, :func:`metarl.sharding.shard_population`) and averaged over the
agents whose losses and gradients stayed finite; the average is clipped by global norm
(``meta.max_grad_norm``) and one optax step (``meta.optimizer``, ``meta.learning_rate``)
updates ``theta``. The agents carry on to the next step.

**Differentiating PPO's update.** PPO's optimiser is Adam, whose ``sqrt`` of the second
moment has an infinite derivative where a gradient is exactly zero (a critic with
``vf_coef = 0``, a dead unit): times zero that is NaN. The agents here therefore train with
Adam whose square root is taken of ``nu + 1e-16`` (optax's ``eps_root``, put in the
objective's optimiser slot, :func:`differentiable_adam`): it differs from PPO's Adam only
where ``nu < ~1e-9``, and has a finite derivative everywhere. PPO's gradient-norm clip and
learning-rate schedule are unchanged. Objectives that fill the optimiser slot themselves
are not supported.

**What counts.** A step trains ``A * (K + R)`` rollouts of the ``[inner]`` batch size
(:attr:`MetaGradient.agent_steps_per_step`): the ``K`` updates' and the ``R`` validation
rollouts'. Each agent's *fitness* in a step is the ``fitness.metric`` of its returns over
its ``K`` updates; agents of every age are mixed, so these say how the population trains
under the current ``theta``, not what a fresh agent would reach. ``metarl evaluate`` trains
fresh agents from scratch on held-out seeds, as for an evolved objective.

**The start.** ``theta`` starts where an evolution of the same ``run.seed`` starts
(:func:`metarl.evolve.generation.search_start`), plus ``meta.init_noise``
(:func:`metagradient_start`). A start where the learned loss's gradient with respect to
``theta`` is zero for every input (LPO's drift with ``ppo_init`` or ``zero_init`` is
``relu(0 - 1e-4) = 0`` everywhere) gives a meta-gradient of exactly zero: such a start is
refused unless ``meta.init_noise > 0``.

Shapes: ``A`` agents, ``K`` updates per unroll, ``T x N`` a rollout (steps x environments).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

from inner_loops import networks, ppo
from inner_loops.learner import strong_types
from inner_loops.objective import OPTIMIZER_SLOT, LossInputs, OptimizerTerm, no_meta_params
from inner_loops.population import broadcast_to_population
from metarl.config import ConfigError
from metarl.evolve.config import ExperimentConfig
from metarl.evolve.fitness import run_return
from metarl.evolve.generation import build_learner, search_start
from metarl.evolve.metagradient_config import MetaGradientConfig
from metarl.programs import program_key, shared_program
from metarl.sharding import put_replicated, replicate, run_mesh, shard_population

# optax's eps_root: Adam's sqrt is taken of nu + EPS_ROOT so its derivative stays finite at
# nu = 0; in float32 the sum equals nu for nu above ~1e-9, so agents train as with Adam
EPS_ROOT = 1e-16
# folded into the run's carried key to draw meta.init_noise
NOISE_STREAM = 0x6E6F_6973


def differentiable_adam(eps_root: float = EPS_ROOT) -> OptimizerTerm:
    """PPO's Adam (:func:`inner_loops.ppo.adam`) with ``eps_root`` (``1e-16``) as a fixed
    optimiser slot (no meta-parameters): differentiable where a gradient is exactly zero
    (module docstring)."""

    def transformation(meta_params):
        del meta_params
        return optax.with_extra_args_support(ppo.adam(eps_root=eps_root))

    return OptimizerTerm("adam_eps_root", no_meta_params, transformation)


def metagradient_start(objective, config: ExperimentConfig):
    """The meta-parameters a meta-gradient run of ``config`` starts at: an evolution's start
    (:func:`~metarl.evolve.generation.search_start` of ``run.seed``) plus
    ``meta.init_noise`` times standard normal noise drawn from the run's carried key."""
    start = search_start(objective, config.run.seed)
    if config.meta.init_noise == 0:
        return start
    flat, unravel = ravel_pytree(start)
    carried = jax.random.split(jax.random.PRNGKey(config.run.seed), 3)[0]
    noise = jax.random.normal(jax.random.fold_in(carried, NOISE_STREAM), flat.shape,
                              flat.dtype)
    return unravel(flat + config.meta.init_noise * noise)


@struct.dataclass
class MetaGradientState:
    """Everything a meta-gradient run carries from step to step (checkpointed whole).

    Attributes:
        meta_params: ``theta``, the objective's meta-parameters.
        opt_state: the meta-optimiser's state.
        agents: the ``A`` PPO agents (:class:`~inner_loops.ppo.PPOState`, leading axis
            ``[A]``).
        lifetimes: ``[A]`` int32, the update count at which each agent is next replaced.
        key: ``[2]`` PRNG key of the next step.
        generation: ``[]`` int32, meta-steps done.
    """

    meta_params: Any
    opt_state: Any
    agents: Any
    lifetimes: jax.Array
    key: jax.Array
    generation: jax.Array


class ValidationBatch(NamedTuple):
    """The fresh rollout an updated agent is scored on, every field ``[T, N, ...]`` and held
    fixed (no gradient): observations, actions, their log-probabilities under the updated
    policy, advantages (normalised over the batch when the ``[inner]`` config normalises
    them) and lambda-returns."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    advantages: jax.Array
    targets: jax.Array


class MetaGradient:
    """A meta-gradient experiment: what is static for a run, and pure ``init`` /
    ``meta_step`` (module docstring); ``step`` is the jitted ``meta_step``, one compiled
    program for every :class:`MetaGradient` of an equal config in a process.

    ``mesh`` (a :class:`jax.sharding.Mesh`) shards the agents over its devices, as an
    evolution's population; by default one over every device when ``run.shard`` is true.
    A one-device mesh is dropped.
    """

    def __init__(self, config: ExperimentConfig, mesh=None):
        meta = config.meta
        if not isinstance(meta, MetaGradientConfig):
            raise ConfigError(f"meta.method: {meta.method!r} runs an evolution "
                              "(metarl.evolve.generation.Evolution), not meta-gradients")
        self.config, self.meta = config, meta
        self.mesh = run_mesh(config.run.shard, mesh)
        self.objective = config.objective.build()
        if self.objective.optimizer is not None:
            raise ConfigError(f"objective.name: {config.objective.name!r} fills the "
                              "optimizer slot; meta-gradients differentiate through PPO's "
                              "own Adam, so they take loss objectives only (e.g. "
                              "value_distance, lpo, ta_lpo)")
        self.template = self.objective.init(jax.random.PRNGKey(0))
        if ravel_pytree(self.template)[0].size == 0:
            raise ConfigError(f"objective.name: {config.objective.name!r} has no "
                              "meta-parameters to learn; choose a learned objective such as "
                              "value_distance, lpo or ta_lpo")
        inner = config.inner[0]
        build_learner(inner, self.objective)  # the environment and objective, fields named
        for index, held_out in enumerate(config.held_out):
            build_learner(held_out, self.objective, f"held_out[{index}]"
                          if len(config.held_out) > 1 else "held_out")
        parts = ppo.make_parts(inner, dataclasses.replace(self.objective,
                                                          optimizer=differentiable_adam()))
        self.parts = dataclasses.replace(parts, stop_rollout_gradient=not meta.rollout_gradient)
        self.learner = ppo.learner_from_parts("ppo", self.parts, ppo.init_state, ppo.update)
        # the fresh rollouts' targets as an update computes them (ppo.collect_batch); final
        # observations valued in the rollout's steps are valued after it instead, the same
        # values (as the validation batch was always computed)
        self.validation_parts = (self.parts if inner.final_values != "in_rollout" else
                                 dataclasses.replace(self.parts, config=inner.replace(
                                     final_values="batched")))
        self.lifetime = self._lifetime()
        self.first_lifetimes = first_lifetimes(self.lifetime, meta.unroll, meta.agents,
                                               meta.stagger)
        self.optimizer = meta_optimizer(meta)
        if meta.init_noise == 0:
            check_not_flat(self.parts.objective,
                           self.inner_meta(search_start(self.objective, config.run.seed)),
                           config.objective.name)
        # one program for every budget and seed (neither enters it): a run resumed with
        # more steps, or another meta-seed of the experiment, compiles nothing new
        key = program_key(config.replace(held_out=(), meta=dataclasses.replace(meta, steps=1),
                                         run=dataclasses.replace(config.run, seed=0)), mesh)
        self.step = shared_program((*key, "metagradient step"), lambda: jax.jit(self.meta_step))
        self._init = shared_program((*key, "metagradient init"), lambda: jax.jit(self.initial))

    def _lifetime(self) -> int:
        budget, unroll = self.learner.num_updates, self.meta.unroll
        lifetime = self.meta.lifetime or budget
        if lifetime > budget:
            raise ConfigError(f"meta.lifetime: {lifetime} updates exceed the [inner] budget "
                              f"of {budget} updates (total_timesteps / (num_envs * "
                              "num_steps)), past which PPO's schedules do not run")
        if lifetime % unroll:
            raise ConfigError(f"meta.unroll: {unroll} does not divide the agents' lifetime "
                              f"of {lifetime} updates (the [inner] budget unless "
                              "meta.lifetime says otherwise); choose a divisor")
        return lifetime

    @property
    def agent_steps_per_step(self) -> int:
        """Environment steps of one meta-step: ``A`` agents times ``K`` updates' rollouts
        and ``meta.validation_rollouts``, each of the ``[inner]`` batch size."""
        rollouts = self.meta.unroll + self.meta.validation_rollouts
        return self.meta.agents * rollouts * self.learner.steps_per_update

    @staticmethod
    def inner_meta(meta_params):
        """``theta`` as the agents' learner takes it: with the (empty) entry of the
        :func:`differentiable_adam` optimiser slot."""
        return {**meta_params, OPTIMIZER_SLOT: {}}

    def init(self, key: jax.Array | None = None) -> MetaGradientState:
        """The state before the first step: ``theta`` at :func:`metagradient_start` (the
        run's seed; ``key`` replaces the seed's key for everything but that start), the
        optimiser's state and ``A`` fresh agents with their first lifetimes."""
        if key is None:
            key = jax.random.PRNGKey(self.config.run.seed)
        start = metagradient_start(self.objective, self.config)
        state = self._init(key, start)
        if self.mesh is not None:  # the placement every step returns: one compiled program
            state = put_replicated(state, self.mesh)
        return state

    def initial(self, key: jax.Array, start) -> MetaGradientState:
        """:meth:`init`'s computation (pure; jitted there): the agents from the first of
        ``key``'s three keys (an evolution's carried key; its start is the second)."""
        carried = jax.random.split(key, 3)[0]
        key, agents_key = jax.random.split(carried)
        start = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), start)
        agents = self.fresh_agents(agents_key, start)
        return strong_types(MetaGradientState(
            meta_params=start,
            opt_state=self.optimizer.init(start),
            agents=agents,
            lifetimes=jnp.asarray(self.first_lifetimes, jnp.int32),
            key=key,
            generation=jnp.int32(0),
        ))

    def fresh_agents(self, key: jax.Array, meta_params):
        """``A`` new agents (leading axis ``[A]``) from ``key``."""
        keys = jax.random.split(key, self.meta.agents)
        return jax.vmap(self.learner.init, in_axes=(0, None, None))(
            keys, self.inner_meta(meta_params), self.learner.default_hypers)

    def unroll(self, meta_params, agent, hypers):
        """``K`` updates of one agent under ``meta_params`` (differentiable in them):
        ``(agent, metrics)`` with the update's metrics ``[K]`` each."""
        inner = self.inner_meta(meta_params)

        def one_update(state, _):
            state, metrics = self.learner.advance(state, inner, hypers, 1)
            return state, jax.tree.map(lambda x: x[0], metrics)

        if self.meta.remat:
            one_update = jax.checkpoint(one_update)
        return jax.lax.scan(one_update, agent, None, length=self.meta.unroll)

    def validation_batch(self, agent, hypers, key: jax.Array):
        """Fresh rollouts of ``agent`` (its current policy and critic) from its
        environments, ``meta.validation_rollouts`` of the ``[inner]`` length one after the
        other, held fixed: ``(batch, agent)``, the :class:`ValidationBatch` (``[R * T, N,
        ...]``) and the agent with its environments moved on by the rollouts."""
        parts = self.validation_parts
        frozen = agent.replace(params=jax.lax.stop_gradient(agent.params))

        def one_rollout(state, rollout_key):
            action_key, env_key = jax.random.split(rollout_key)
            carry, _, collected = ppo.collect_batch(parts, hypers, state, action_key, env_key)
            state = state.replace(env_state=carry.env_state, obs=carry.obs,
                                  episodes=carry.episodes)
            return state, ValidationBatch(collected.obs, collected.action, collected.log_prob,
                                          collected.advantages, collected.targets)

        keys = (key[None] if self.meta.validation_rollouts == 1
                else jax.random.split(key, self.meta.validation_rollouts))
        frozen, batch = jax.lax.scan(one_rollout, frozen, keys)
        batch = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), batch)
        if parts.config.normalize_advantages:  # over the whole batch, not per minibatch
            batch = batch._replace(advantages=ppo.standardize_advantages(batch.advantages))
        moved = agent.replace(env_state=frozen.env_state, obs=frozen.obs,
                              episodes=frozen.episodes)
        return jax.lax.stop_gradient(batch), moved

    def meta_loss(self, params, batch: ValidationBatch, hypers) -> jax.Array:
        """``[]`` the meta-objective (``meta.objective``, to minimise) of the agent
        parameters ``params`` on ``batch``: with ``ratio = pi(a|s) / pi_batch(a|s)`` (1 at
        the parameters that collected the batch), ``policy = -mean(ratio * A)``,
        ``value = 0.5 mean((V(s) - G)^2)`` against the lambda-returns ``G`` and the
        policy's mean entropy ``H``: ``actor_critic`` is ``policy + vf_coef value -
        ent_coef H``, ``policy`` is ``policy - ent_coef H`` and ``value_error`` is
        ``value``."""
        network, discrete = self.parts.network, self.parts.discrete
        logits_or_mean, log_std, values = network.apply(params, batch.obs)
        log_prob = networks.log_prob(discrete, logits_or_mean, log_std, batch.action)
        policy = -jnp.mean(jnp.exp(log_prob - batch.log_prob) * batch.advantages)
        value = 0.5 * jnp.mean(jnp.square(values - batch.targets))
        entropy = jnp.mean(networks.entropy(discrete, logits_or_mean, log_std))
        if self.meta.objective == "value_error":
            return value
        if self.meta.objective == "policy":
            return policy - hypers.ent_coef * entropy
        return policy + hypers.vf_coef * value - hypers.ent_coef * entropy

    def agent_meta_gradient(self, meta_params, agent, hypers, key: jax.Array):
        """One agent's part of a step: ``(gradient, agent, metrics, loss)``, the gradient
        of :meth:`meta_loss` after :meth:`unroll` with respect to ``meta_params``, the
        agent after its updates and validation rollout, its updates' metrics ``[K]`` and
        the loss ``[]``."""

        def objective(theta):
            trained, metrics = self.unroll(theta, agent, hypers)
            batch, moved = self.validation_batch(trained, hypers, key)
            return self.meta_loss(trained.params, batch, hypers), (moved, metrics)

        (loss, (agent, metrics)), gradient = jax.value_and_grad(objective, has_aux=True)(
            meta_params)
        return gradient, agent, metrics, loss

    def meta_step(self, state: MetaGradientState) -> tuple[MetaGradientState, dict]:
        """One meta-gradient step of every agent (module docstring). Pure; jit it.

        Metrics: ``returns`` ``[A]`` (each agent's fitness metric over its ``K`` updates,
        NaN where it finished no episode), ``valid`` ``[A]`` (its losses and gradient
        were finite: only those enter the mean), ``meta_loss`` (mean over the valid
        agents), ``meta_grad_norm`` (of that mean, before clipping), ``restarted`` (agents
        replaced at the start of the step) and ``ages`` ``[A]`` (updates each agent has
        done after the step)."""
        agents_count = self.meta.agents
        key, restart_key, step_key = jax.random.split(state.key, 3)
        fresh = self.fresh_agents(restart_key, state.meta_params)
        due = (state.agents.update_count >= state.lifetimes) | ~_finite_rows(
            state.agents.params)
        agents = jax.tree.map(lambda new, old: _where_rows(due, new, old), fresh,
                              state.agents)
        lifetimes = jnp.where(due, self.lifetime, state.lifetimes).astype(jnp.int32)
        gradients, agents, metrics, losses = shard_population(
            self.agent_meta_gradient,
            (broadcast_to_population(state.meta_params, agents_count), agents,
             broadcast_to_population(self.learner.default_hypers, agents_count),
             jax.random.split(step_key, agents_count)),
            self.mesh, self.config.run.chunk_size, replicate_output=False)
        valid = (jnp.all(metrics["finite"], axis=-1) & jnp.isfinite(losses)
                 & _finite_rows(gradients))
        count = jnp.sum(valid)
        gradient = jax.tree.map(
            lambda g: jnp.sum(_where_rows(valid, g, jnp.zeros_like(g)), axis=0)
            / jnp.maximum(count, 1), gradients)
        updates, opt_state = self.optimizer.update(gradient, state.opt_state,
                                                   state.meta_params)
        stepped = optax.apply_updates(state.meta_params, updates)
        keep = count == 0  # no agent gave a gradient: nothing moves
        meta_params = jax.tree.map(lambda old, new: jnp.where(keep, old, new),
                                   state.meta_params, stepped)
        opt_state = jax.tree.map(lambda old, new: jnp.where(keep, old, new),
                                 state.opt_state, opt_state)
        # strong types: a resumed run's restored state must compile to the same program
        state = strong_types(MetaGradientState(meta_params=meta_params, opt_state=opt_state,
                                          agents=agents, lifetimes=lifetimes, key=key,
                                          generation=state.generation + 1))
        report = {
            "returns": run_return(metrics, self.config.fitness),
            "valid": valid,
            "meta_loss": jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(count, 1),
            "meta_grad_norm": optax.global_norm(gradient),
            "restarted": jnp.sum(due),
            "ages": agents.update_count,
        }
        if self.mesh is not None:
            state, report = replicate((state, report), self.mesh)
        return state, report


def first_lifetimes(lifetime: int, unroll: int, agents: int, stagger: str) -> np.ndarray:
    """``[A]`` the update count at which each agent is first replaced: the whole
    ``lifetime`` for every agent without stagger; with ``"uniform"``, agent ``i`` after
    ``ceil((i + 1) U / A)`` of the lifetime's ``U = lifetime / unroll`` unrolls, so that
    after one lifetime the agents' ages are spread evenly over it."""
    unrolls = lifetime // unroll
    if stagger == "none":
        return np.full(agents, lifetime, np.int32)
    first = [math.ceil((i + 1) * unrolls / agents) for i in range(agents)]
    return np.asarray(first, np.int32) * unroll


def meta_optimizer(meta) -> optax.GradientTransformation:
    """``meta.max_grad_norm`` clipping (none at 0), then Adam or SGD at
    ``meta.learning_rate``."""
    step = (optax.adam(meta.learning_rate) if meta.optimizer == "adam"
            else optax.sgd(meta.learning_rate))
    if meta.max_grad_norm == 0:
        return step
    return optax.chain(optax.clip_by_global_norm(meta.max_grad_norm), step)


def check_not_flat(objective, meta_params, name: str, samples: int = 256) -> None:
    """A :class:`~metarl.config.ConfigError` naming ``meta.init_noise`` when the gradient
    of ``objective``'s policy and value losses with respect to ``meta_params`` is exactly
    zero on ``samples`` random inputs: a start whose meta-gradient is zero."""
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    log_ratio = 0.3 * jax.random.normal(keys[0], (samples,))
    inputs = LossInputs(
        ratio=jnp.exp(log_ratio), log_ratio=log_ratio,
        advantages=jax.random.normal(keys[1], (samples,)),
        values=jax.random.normal(keys[2], (samples,)),
        old_values=jax.random.normal(keys[3], (samples,)),
        targets=jax.random.normal(keys[4], (samples,)),
        clip_eps=jnp.float32(0.2), progress=jnp.float32(0.5))

    def loss(theta):
        return objective.policy_loss(theta, inputs) + objective.value_loss(theta, inputs)

    gradient = ravel_pytree(jax.grad(loss)(meta_params))[0]
    if not bool(jnp.any(gradient != 0)):
        raise ConfigError(
            f"meta.init_noise: the loss of objective {name!r} has a gradient of exactly zero "
            "with respect to its meta-parameters at the start (e.g. LPO's drift with "
            "ppo_init or zero_init is relu(0 - 1e-4) = 0 for every input), so a "
            "meta-gradient could never move it; start from a perturbed point with "
            "meta.init_noise > 0 (e.g. 0.1)")


def _finite_rows(tree) -> jax.Array:
    """``[A]``: whether every float entry of agent ``i`` of ``tree`` (leading axis
    ``[A]``) is finite."""
    rows = [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
            for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(rows), axis=0)


def _where_rows(mask: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """``new`` where ``mask [A]`` else ``old``, row by row of the leading axis."""
    return jnp.where(mask.reshape(-1, *[1] * (new.ndim - 1)), new, old)
