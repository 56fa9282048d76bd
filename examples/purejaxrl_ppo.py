"""PPO in one file, PureJaxRL style, trained with a discovered objective loaded from a file.

Everything here is plain JAX, flax, optax and gymnax; from metarl it takes one function,
``load_objective``, which reads an exported discovery (a ``.npz`` file, a run directory or a
zoo name such as ``zoo:value_distance_blog``) and returns plain JAX functions. Using one
changes one line of the loss (see ``ppo_loss``):

- a learned value distance ``d(x)`` replaces PPO's clipped squared error:
  ``value_loss = jnp.mean(value_distance(values - targets))``;
- a learned drift ``drift(ratio, advantage)`` (LPO) replaces PPO's clip:
  ``policy_loss = -jnp.mean(ratio * advantages - drift(ratio, advantages))``.

Run it::

    python examples/purejaxrl_ppo.py                                  # plain PPO
    python examples/purejaxrl_ppo.py --objective zoo:value_distance_blog
    python examples/purejaxrl_ppo.py --objective zoo:lpo_cpu --seeds 8

Environment, rollout, advantage estimation and update are one ``jax.jit``, ``vmap``-ed over
seeds. Episodes that end by the time limit (truncation) are bootstrapped from the value of
their final observation; episodes that end by failure (termination) are not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

# PureJaxRL's CartPole-v1 settings.
CONFIG = {
    "env_id": "CartPole-v1",
    "num_envs": 4,
    "num_steps": 128,
    "total_timesteps": 500_000,
    "update_epochs": 4,
    "num_minibatches": 4,
    "hidden_sizes": (64, 64),
    "learning_rate": 2.5e-4,
    "anneal_lr": True,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
}


class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy's logits ``[..., A]`` and the value ``[...]``."""

    action_dim: int
    hidden_sizes: tuple[int, ...] = (64, 64)

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        def torso(x):
            for width in self.hidden_sizes:
                x = nn.tanh(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                                     bias_init=nn.initializers.zeros)(x))
            return x

        logits = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01),
                          bias_init=nn.initializers.zeros)(torso(obs))
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0),
                         bias_init=nn.initializers.zeros)(torso(obs))
        return logits, value[..., 0]


class Batch(NamedTuple):
    """Transitions of one rollout, ``[T, N, ...]`` (or ``[B, ...]`` once flattened)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantages: jax.Array
    targets: jax.Array


def ppo_loss(network: ActorCritic, params, batch: Batch, config: dict[str, Any],
             value_distance: Callable | None = None, drift: Callable | None = None
             ) -> jax.Array:
    """PPO's loss on a ``[B]`` minibatch: policy loss + vf_coef * value loss - ent_coef *
    entropy. ``value_distance`` and ``drift`` are discovered functions (``None``: PPO's own)."""
    logits, values = network.apply(params, batch.obs)
    log_probs = jax.nn.log_softmax(logits)
    new_log_prob = jnp.take_along_axis(log_probs, batch.action[..., None], axis=-1)[..., 0]
    ratio = jnp.exp(new_log_prob - batch.log_prob)
    advantages = (batch.advantages - batch.advantages.mean()) / (batch.advantages.std() + 1e-8)
    eps = config["clip_eps"]

    if drift is None:
        policy_loss = -jnp.mean(jnp.minimum(ratio * advantages,
                                            jnp.clip(ratio, 1 - eps, 1 + eps) * advantages))
    else:  # the one line a discovered drift changes
        policy_loss = -jnp.mean(ratio * advantages - drift(ratio, advantages))

    if value_distance is None:
        clipped = batch.value + jnp.clip(values - batch.value, -eps, eps)
        value_loss = 0.5 * jnp.mean(jnp.maximum(jnp.square(values - batch.targets),
                                                jnp.square(clipped - batch.targets)))
    else:  # the one line a discovered value distance changes
        value_loss = jnp.mean(value_distance(values - batch.targets))

    entropy = -jnp.mean(jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1))
    return policy_loss + config["vf_coef"] * value_loss - config["ent_coef"] * entropy


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """Advantages and targets ``[T, N]`` by generalised advantage estimation.

    ``next_values [T, N]`` is the value of the next observation (of the final observation
    where an episode ended); ``terminated`` cuts the bootstrap, ``done`` cuts the trace.
    """
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values

    def backward(carry, step):
        delta, is_done = step
        carry = delta + gamma * lam * (1.0 - is_done) * carry
        return carry, carry

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, done),
                                 reverse=True)
    return advantages, advantages + values


def make_train(config: dict[str, Any], value_distance: Callable | None = None,
               drift: Callable | None = None) -> Callable[[jax.Array], dict[str, jax.Array]]:
    """``train(key) -> {"episode_return": [U]}``: one agent's whole training run.

    ``episode_return[u]`` is the mean return of the episodes that ended during update ``u``
    (carried forward from the last update where none ended; NaN before the first).
    """
    env, env_params = gymnax.make(config["env_id"])
    num_envs, num_steps = config["num_envs"], config["num_steps"]
    num_updates = config["total_timesteps"] // (num_envs * num_steps)
    minibatch_size = num_envs * num_steps // config["num_minibatches"]
    network = ActorCritic(env.action_space(env_params).n, tuple(config["hidden_sizes"]))

    def learning_rate(count):
        progress = count // (config["num_minibatches"] * config["update_epochs"]) / num_updates
        return config["learning_rate"] * (1.0 - progress if config["anneal_lr"] else 1.0)

    optimizer = optax.chain(optax.clip_by_global_norm(config["max_grad_norm"]),
                            optax.adam(learning_rate, eps=1e-5))
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    loss_and_grad = jax.value_and_grad(
        lambda params, batch: ppo_loss(network, params, batch, config, value_distance, drift))

    def train(key: jax.Array) -> dict[str, jax.Array]:
        key, init_key, reset_key = jax.random.split(key, 3)
        obs, env_state = reset(jax.random.split(reset_key, num_envs), env_params)
        params = network.init(init_key, obs)
        opt_state = optimizer.init(params)
        returns_so_far = jnp.zeros(num_envs)

        def env_step(carry, step_key):
            params, env_state, obs, returns_so_far = carry
            action_key, step_key = jax.random.split(step_key)
            logits, value = network.apply(params, obs)
            action = jax.random.categorical(action_key, logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
            next_obs, env_state, reward, terminated, truncated, info = step(
                jax.random.split(step_key, num_envs), env_state, action, env_params)
            done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
            _, final_value = network.apply(params, info["final_observation"])
            returns_so_far = returns_so_far + reward
            record = (obs, action, log_prob, value, reward, terminated.astype(jnp.float32),
                      done, final_value, returns_so_far * done)
            return (params, env_state, next_obs, returns_so_far * (1.0 - done)), record

        def update(carry, update_key):
            params, opt_state, env_state, obs, returns_so_far, last_return = carry
            rollout_key, shuffle_key = jax.random.split(update_key)
            (_, env_state, obs, returns_so_far), rollout = jax.lax.scan(
                env_step, (params, env_state, obs, returns_so_far),
                jax.random.split(rollout_key, num_steps))
            (obs_t, action, log_prob, value, reward, terminated, done, final_value,
             ended_returns) = rollout
            _, last_value = network.apply(params, obs)
            following = jnp.concatenate([value[1:], last_value[None]])
            next_values = jnp.where(done > 0, final_value, following)
            advantages, targets = gae(reward, value, next_values, terminated, done,
                                      config["gamma"], config["gae_lambda"])
            batch = Batch(obs_t, action, log_prob, value, advantages, targets)
            batch = jax.tree.map(lambda x: x.reshape(num_envs * num_steps, *x.shape[2:]), batch)

            def epoch(carry, epoch_key):
                order = jax.random.permutation(epoch_key, num_envs * num_steps)
                minibatches = jax.tree.map(
                    lambda x: x[order].reshape(-1, minibatch_size, *x.shape[1:]), batch)

                def minibatch_step(carry, minibatch):
                    params, opt_state = carry
                    _, grads = loss_and_grad(params, minibatch)
                    updates, opt_state = optimizer.update(grads, opt_state, params)
                    return (optax.apply_updates(params, updates), opt_state), None

                return jax.lax.scan(minibatch_step, carry, minibatches)[0], None

            (params, opt_state), _ = jax.lax.scan(
                epoch, (params, opt_state), jax.random.split(shuffle_key,
                                                             config["update_epochs"]))
            episodes = done.sum()
            mean_return = jnp.where(episodes > 0, ended_returns.sum() / jnp.maximum(episodes, 1),
                                    last_return)
            return (params, opt_state, env_state, obs, returns_so_far, mean_return), mean_return

        carry = (params, opt_state, env_state, obs, returns_so_far, jnp.float32(jnp.nan))
        _, episode_return = jax.lax.scan(update, carry, jax.random.split(key, num_updates))
        return {"episode_return": episode_return}

    return train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objective", help="an exported discovery: a .npz file, a run "
                        "directory or zoo:NAME (default: PPO's own losses)")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--total-timesteps", type=int, default=CONFIG["total_timesteps"])
    args = parser.parse_args()
    config = {**CONFIG, "total_timesteps": args.total_timesteps}
    value_distance = drift = None
    if args.objective:
        from metarl import load_objective

        discovery = load_objective(args.objective)
        value_distance, drift = discovery.value, discovery.policy
    train = jax.jit(jax.vmap(make_train(config, value_distance, drift)))
    returns = train(jax.random.split(jax.random.PRNGKey(0), args.seeds))["episode_return"]
    mean_over_training = np.nanmean(np.asarray(returns), axis=1)
    final = np.asarray(returns)[:, -1]
    print("mean return over training, per seed:", [round(float(r), 1) for r in mean_over_training])
    print("final return, per seed:", [round(float(r), 1) for r in final])


if __name__ == "__main__":
    main()
