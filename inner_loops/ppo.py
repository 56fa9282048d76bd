"""PPO as one pure, jittable function: ``make_train(config, objective) -> train``.

``train(key, meta_params, hypers)`` builds the environments, the networks and the
optimiser, and runs ``num_updates`` PPO updates in a single ``lax.scan``: rollout, GAE,
``update_epochs`` passes of minibatch gradient steps. It returns per-update summaries
(never per-step buffers), so ``jit(vmap(train))`` trains a whole population at once.

Shape-setting settings (env, batch sizes, network widths) live in :class:`PPOConfig` and are
static. Numeric hyperparameters live in :class:`Hyperparams`: traced arrays, so a population
can vary them under ``vmap``. The losses come from an :class:`~inner_loops.objective.Objective`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from inner_loops import networks
from inner_loops.envs import EnvParamPairs, env_param_pairs, make_env, make_vec_env
from inner_loops.objective import LossInputs, Objective, ppo_objective

POLICIES = ("auto", "categorical", "gaussian")


@dataclass(frozen=True)
class PPOConfig:
    """Settings of one PPO agent. Defaults are PureJaxRL's CartPole-v1 settings.

    Attributes:
        env_id: gymnax id (``CartPole-v1``, ``Breakout-MinAtar``, ...) or ``brax/<name>``.
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
        policy: ``"auto"`` (from the action space), ``"categorical"`` or ``"gaussian"``.
        anneal_lr: decay the learning rate linearly to zero over training.
        normalize_obs: running mean/std observation normalisation (continuous control).
        normalize_reward: scale rewards by the running std of the discounted return.
        normalize_advantages: standardise advantages per minibatch.
        learning_rate, gamma, gae_lambda, clip_eps, ent_coef, vf_coef, max_grad_norm:
            defaults of the traced :class:`Hyperparams`.
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

    def __post_init__(self):
        widths = tuple(self.hidden_sizes)
        if not all(isinstance(h, int) and not isinstance(h, bool) for h in widths):
            raise ValueError(f"hidden_sizes: widths must be integers, got {self.hidden_sizes}")
        object.__setattr__(self, "hidden_sizes", widths)
        for name in ("num_envs", "num_steps", "total_timesteps", "update_epochs",
                     "num_minibatches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if any(h < 1 for h in self.hidden_sizes):
            raise ValueError(f"hidden_sizes: widths must be positive, got {self.hidden_sizes}")
        if self.activation not in networks.ACTIVATIONS:
            raise ValueError(
                f"activation: got {self.activation!r}; allowed: {', '.join(networks.ACTIVATIONS)}"
            )
        if self.policy not in POLICIES:
            raise ValueError(f"policy: got {self.policy!r}; allowed: {', '.join(POLICIES)}")
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
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must lie in [0, 1], got {getattr(self, name)}")
        for name in ("learning_rate", "clip_eps", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("ent_coef", "vf_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        object.__setattr__(self, "env_params", env_param_pairs(self.env_params))
        # raises ValueError naming env_id, or the parameter, if unknown
        spec = make_env(self.env_id, self.env_params).spec
        if spec.discrete and self.policy == "gaussian":
            raise ValueError(
                f"policy: 'gaussian' needs continuous actions but {self.env_id} is discrete; "
                "allowed here: auto, categorical"
            )
        if not spec.discrete and self.policy == "categorical":
            raise ValueError(
                f"policy: 'categorical' needs discrete actions but {self.env_id} is continuous; "
                "allowed here: auto, gaussian"
            )

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


def make_train(config: PPOConfig, objective: Objective | None = None):
    """Build ``train(key, meta_params=None, hypers=None) -> metrics``.

    Args:
        config: static settings (shapes, environment).
        objective: policy and value losses; standard PPO when ``None``.

    The returned ``train`` is pure and unjitted, so callers compose ``jit`` and ``vmap``:

    - ``key``: ``[2]`` PRNG key (or a typed key ``[]``).
    - ``meta_params``: the objective's meta-parameters; ``objective.init(PRNGKey(0))`` when
      ``None``.
    - ``hypers``: :class:`Hyperparams`; ``config.hyperparams()`` when ``None``.

    Returns a dict of ``[num_updates]`` arrays: ``episode_return`` and ``episode_length``
    (mean over episodes finished during the update, carried forward when none finished, NaN
    before the first), ``episodes`` (finished during the update), ``policy_loss``,
    ``value_loss``, ``entropy``, ``approx_kl``, ``clip_fraction`` (means over the update's
    minibatches), ``learning_rate`` and ``finite`` (every loss of the update was finite).
    """
    objective = objective if objective is not None else ppo_objective()
    vec_env = make_vec_env(
        config.env_id, config.num_envs, config.normalize_obs, config.normalize_reward,
        config.env_params,
    )
    spec = vec_env.spec
    discrete = spec.discrete
    network = networks.ActorCritic(
        action_dim=spec.action_dim,
        discrete=discrete,
        obs_ndim=len(spec.obs_shape),
        hidden_sizes=config.hidden_sizes,
        activation=config.activation,
    )
    if discrete:
        action_low = action_high = None
    else:
        action_low = jnp.asarray(spec.action_low, jnp.float32)
        action_high = jnp.asarray(spec.action_high, jnp.float32)
    num_updates = config.num_updates
    num_envs, num_steps = config.num_envs, config.num_steps
    default_meta_params = objective.init(jax.random.PRNGKey(0))

    def loss_fn(params, meta_params, hypers, progress, minibatch: Minibatch):
        logits_or_mean, log_std, values = network.apply(params, minibatch.obs)
        new_log_prob = networks.log_prob(discrete, logits_or_mean, log_std, minibatch.action)
        log_ratio = new_log_prob - minibatch.log_prob
        advantages = minibatch.advantages
        ratio = jnp.exp(log_ratio)
        if config.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
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

    def train(key, meta_params=None, hypers=None):
        meta_params = default_meta_params if meta_params is None else meta_params
        hypers = config.hyperparams() if hypers is None else hypers
        optimizer = optax.chain(
            optax.clip_by_global_norm(hypers.max_grad_norm), optax.scale_by_adam(eps=1e-5)
        )
        key, init_key, reset_key = jax.random.split(key, 3)
        obs, env_state = vec_env.reset(reset_key)
        params = network.init(init_key, obs)
        opt_state = optimizer.init(params)
        episodes = EpisodeStats(jnp.zeros(num_envs), jnp.zeros(num_envs))
        nan = jnp.full((), jnp.nan, jnp.float32)

        def env_step(carry, noise):
            params, env_state, obs, episodes = carry
            action_noise, env_noise = noise
            logits_or_mean, log_std, value = network.apply(params, obs)
            action, log_prob = networks.action_from_noise(action_noise, discrete,
                                                          logits_or_mean, log_std)
            env_action = action if discrete else jnp.clip(action, action_low, action_high)
            next_obs, env_state, reward, terminated, truncated, final_obs, raw_reward = (
                vec_env.step(None, env_state, env_action, hypers.gamma, env_noise)
            )
            done = jnp.logical_or(terminated, truncated)
            running_return = episodes.running_return + raw_reward
            running_length = episodes.running_length + 1
            finished = (done, running_return, running_length)
            episodes = EpisodeStats(
                jnp.where(done, 0.0, running_return), jnp.where(done, 0.0, running_length)
            )
            transition = Transition(obs, action, log_prob, value, reward, terminated, done,
                                    final_obs)
            return (params, env_state, next_obs, episodes), (transition, finished)

        def update(carry, update_index):
            params, opt_state, env_state, obs, episodes, last_return, last_length, key = carry
            key, action_key, env_key, epoch_key = jax.random.split(key, 4)
            # every random draw of the rollout is made here, in a few batched calls
            noise = (
                networks.action_noise(action_key, discrete,
                                      (num_steps, num_envs, spec.action_dim)),
                vec_env.presample(env_key, num_steps),
            )
            (_, env_state, obs, episodes), (rollout, finished) = jax.lax.scan(
                env_step, (params, env_state, obs, episodes), noise
            )
            next_values = network.apply(params, rollout.final_obs, method=network.value)
            advantages, targets = compute_gae(
                rollout.reward, rollout.value, next_values, rollout.terminated, rollout.done,
                hypers.gamma, hypers.gae_lambda,
            )
            progress = update_index / num_updates
            learning_rate = hypers.learning_rate
            if config.anneal_lr:
                learning_rate = learning_rate * (1.0 - progress)

            def minibatch_step(carry, minibatch):
                params, opt_state = carry
                grads, diagnostics = jax.grad(loss_fn, has_aux=True)(
                    params, meta_params, hypers, progress, minibatch
                )
                updates, opt_state = optimizer.update(grads, opt_state, params)
                updates = jax.tree.map(lambda u: -learning_rate * u, updates)
                return (optax.apply_updates(params, updates), opt_state), diagnostics

            # only what the loss reads is shuffled into minibatches
            batch = Minibatch(rollout.obs, rollout.action, rollout.log_prob, rollout.value,
                              advantages, targets)

            def epoch(carry, permutation_key):
                flat = jax.tree.map(lambda x: x.reshape(config.batch_size, *x.shape[2:]), batch)
                order = shuffled_indices(permutation_key, config.batch_size)
                minibatches = jax.tree.map(
                    lambda x: x[order].reshape(config.num_minibatches, -1, *x.shape[1:]), flat
                )
                return jax.lax.scan(minibatch_step, carry, minibatches)

            (params, opt_state), diagnostics = jax.lax.scan(
                epoch, (params, opt_state), jax.random.split(epoch_key, config.update_epochs)
            )
            done, returns, lengths = finished
            count = done.sum()
            mean_return = jnp.where(
                count > 0, jnp.sum(jnp.where(done, returns, 0.0)) / jnp.maximum(count, 1),
                last_return,
            )
            mean_length = jnp.where(
                count > 0, jnp.sum(jnp.where(done, lengths, 0.0)) / jnp.maximum(count, 1),
                last_length,
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
            carry = (params, opt_state, env_state, obs, episodes, mean_return, mean_length, key)
            return carry, summary

        carry = (params, opt_state, env_state, obs, episodes, nan, nan, key)
        _, metrics = jax.lax.scan(update, carry, jnp.arange(num_updates))
        return metrics

    return train


# Up to 2**12 indices the packed sort below leaves >= 20 random bits per key.
_PACKED_SHUFFLE_MAX_BITS = 12


def shuffled_indices(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random permutation of ``range(n)``, ``[n]`` int32.

    ``jax.random.permutation`` sorts random keys together with the indices, a two-operand
    sort that XLA's CPU backend runs about 4x slower than a sort of one ``uint32`` array.
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


def stack_hyperparams(hypers: list[Hyperparams]) -> Hyperparams:
    """Stack per-agent hyperparameters into ``[P]`` arrays."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *hypers)


def broadcast_to_population(tree: Any, population_size: int) -> Any:
    """Repeat every leaf of ``tree`` along a new leading axis of ``population_size``."""
    return jax.tree.map(
        lambda x: jnp.broadcast_to(jnp.asarray(x), (population_size, *jnp.shape(x))), tree
    )


def train_population(train, keys, meta_params, hypers, chunk_size: int | None = None):
    """Train ``P`` agents: every argument has a leading population axis ``[P, ...]``.

    With ``chunk_size`` smaller than ``P``, agents are trained ``chunk_size`` at a time
    (``lax.map`` over vmapped chunks, the remainder in one smaller chunk), which bounds
    memory by the chunk instead of the population. Returns metrics ``[P, num_updates]``.
    """
    population_size = jax.tree.leaves(keys)[0].shape[0]
    args = (keys, meta_params, hypers)
    if chunk_size is None or chunk_size >= population_size:
        return jax.vmap(train)(*args)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size}")
    return jax.lax.map(lambda a: train(*a), args, batch_size=chunk_size)
