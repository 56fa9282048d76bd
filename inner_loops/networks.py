"""Actor-critic networks: separate MLPs for the policy and the value, orthogonal init.

The actor outputs the parameters of a categorical distribution (discrete actions) or of a
diagonal Gaussian with a state-independent log standard deviation (continuous actions).
Distributions are represented by their raw parameters and handled by the small pure
functions below, so everything stays a plain array under ``vmap``.

The off-policy continuous-control learners (TD3, SAC) use the networks at the end of the
module: a deterministic tanh actor, a tanh-squashed Gaussian actor with its log-probability
correction, and a Q-network over an observation and an action. They all work in the *unit*
action box ``[-1, 1]^A``; :mod:`inner_loops.continuous_control` maps it to the
environment's bounds.

Every network takes a ``precision`` (one of :data:`~inner_loops.linear.PRECISIONS`) for
the operands of its matrix products; parameters and outputs are float32 either way. It also
takes a ``matmul`` (one of :data:`~inner_loops.linear.MATMULS`): how those products are
arranged, ``"cpu"`` (the default, :mod:`inner_loops.linear`'s arrangement for XLA's CPU
backend), ``"xla"`` (plain ``dot_general``) or ``"auto"`` (by backend,
:func:`~inner_loops.linear.resolve_matmul`); a learner passes its config's choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.linear import dot_general_for

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


def _dense(features: int, scale: float, precision: str, matmul: str) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=nn.initializers.orthogonal(scale),
        bias_init=nn.initializers.zeros,
        dot_general=dot_general_for(precision, matmul),
    )


class MLP(nn.Module):
    """Hidden layers with orthogonal(sqrt 2) init, then a linear head of ``out_scale``.

    ``precision`` (see :mod:`inner_loops.linear`) sets the operands of the matrix products
    and ``matmul`` their arrangement; parameters and outputs are float32 either way.
    """

    hidden_sizes: Sequence[int]
    out_features: int
    out_scale: float
    activation: str = "tanh"
    precision: str = "float32"
    matmul: str = "cpu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        for width in self.hidden_sizes:
            x = act(_dense(width, np.sqrt(2.0), self.precision, self.matmul)(x))
        return _dense(self.out_features, self.out_scale, self.precision, self.matmul)(x)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a flattened observation.

    ``__call__(obs [..., *obs_shape]) -> (logits_or_mean [..., A], log_std [A], value [...])``.
    For discrete actions ``logits_or_mean`` are logits and ``log_std`` is unused zeros; for
    continuous actions it is the Gaussian mean and ``log_std`` a learned parameter.
    :meth:`value` runs the critic alone.
    """

    action_dim: int
    discrete: bool
    obs_ndim: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    precision: str = "float32"
    matmul: str = "cpu"

    def setup(self):
        self.actor = MLP(self.hidden_sizes, self.action_dim, 0.01, self.activation,
                         self.precision, self.matmul)
        self.critic = MLP(self.hidden_sizes, 1, 1.0, self.activation, self.precision,
                          self.matmul)
        if not self.discrete:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def _flatten(self, obs: jax.Array) -> jax.Array:
        batch_shape = obs.shape[: obs.ndim - self.obs_ndim]
        return obs.reshape(*batch_shape, -1)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        x = self._flatten(obs)
        log_std = jnp.zeros((self.action_dim,)) if self.discrete else self.log_std
        return self.actor(x), log_std, self.critic(x)[..., 0]

    def value(self, obs: jax.Array) -> jax.Array:
        return self.critic(self._flatten(obs))[..., 0]


def action_noise(key, discrete: bool, shape: tuple[int, ...]) -> jax.Array:
    """The noise :func:`action_from_noise` turns into actions, for logits or means of
    ``shape`` ``[..., A]``: standard Gumbel (discrete) or standard normal (continuous).

    Drawing a whole rollout's noise at once keeps the random draws out of the step loop.
    """
    if discrete:
        return jax.random.gumbel(key, shape)
    return jax.random.normal(key, shape)


def action_from_noise(noise, discrete: bool, logits_or_mean, log_std):
    """Actions and their log-probabilities from :func:`action_noise`.

    A categorical sample is the argmax of logits plus Gumbel noise (as in
    :func:`jax.random.categorical`); a Gaussian one is ``mean + std * noise``.
    Shapes: ``[..., A] -> (action [...] (discrete) or [..., A] (continuous), log_prob [...])``.
    """
    if discrete:
        action = jnp.argmax(logits_or_mean + noise, axis=-1)
    else:
        action = logits_or_mean + jnp.exp(log_std) * noise
    return action, log_prob(discrete, logits_or_mean, log_std, action)


def log_prob(discrete: bool, logits_or_mean, log_std, action) -> jax.Array:
    """Log-probability of ``action`` under the policy. Returns shape ``[...]``."""
    if discrete:
        log_probs = jax.nn.log_softmax(logits_or_mean)
        return jnp.take_along_axis(log_probs, action[..., None].astype(jnp.int32), -1)[..., 0]
    z = (action - logits_or_mean) * jnp.exp(-log_std)
    per_dim = -0.5 * jnp.square(z) - log_std - 0.5 * jnp.log(2.0 * jnp.pi)
    return jnp.sum(per_dim, axis=-1)


def entropy(discrete: bool, logits_or_mean, log_std) -> jax.Array:
    """Entropy of the policy distribution. Returns shape ``[...]``."""
    if discrete:
        log_probs = jax.nn.log_softmax(logits_or_mean)
        return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    per_dim = 0.5 + 0.5 * jnp.log(2.0 * jnp.pi) + log_std
    return jnp.broadcast_to(jnp.sum(per_dim), logits_or_mean.shape[:-1])


# ------------------------------------------------------ continuous control (TD3, SAC)

# Bounds of a squashed Gaussian actor's log standard deviation (the head's output is mapped
# smoothly into them with a tanh, as CleanRL's SAC does).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def flatten_obs(obs: jax.Array, obs_ndim: int) -> jax.Array:
    """``obs [..., *obs_shape] -> [..., prod(obs_shape)]`` (the last ``obs_ndim`` axes)."""
    batch_shape = obs.shape[: obs.ndim - obs_ndim]
    return obs.reshape(*batch_shape, -1)


class DeterministicActor(nn.Module):
    """TD3's policy: ``obs [..., *obs_shape] -> tanh(MLP(obs)) [..., A]`` in ``[-1, 1]``.

    The head starts small (orthogonal, scale 0.01), so the first actions are near the middle
    of the action box."""

    action_dim: int
    obs_ndim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    precision: str = "float32"
    matmul: str = "cpu"

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        mlp = MLP(self.hidden_sizes, self.action_dim, 0.01, self.activation, self.precision,
                  self.matmul)
        return jnp.tanh(mlp(flatten_obs(obs, self.obs_ndim)))


class SquashedGaussianActor(nn.Module):
    """SAC's policy: ``obs -> (mean [..., A], log_std [..., A])`` of a Gaussian over the
    pre-squash action ``u``; the action is ``tanh(u)`` (see :func:`squashed_gaussian`).
    ``log_std`` depends on the observation and lies in ``[LOG_STD_MIN, LOG_STD_MAX]``."""

    action_dim: int
    obs_ndim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    precision: str = "float32"
    matmul: str = "cpu"

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = MLP(self.hidden_sizes, 2 * self.action_dim, 0.01, self.activation,
                  self.precision, self.matmul)(flatten_obs(obs, self.obs_ndim))
        mean, raw_log_std = jnp.split(out, 2, axis=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw_log_std) + 1)
        return mean, log_std


class QNetwork(nn.Module):
    """A critic ``(obs [..., *obs_shape], action [..., A]) -> Q [...]``: an MLP over the
    flattened observation concatenated with the (unit-box) action."""

    obs_ndim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    precision: str = "float32"
    matmul: str = "cpu"

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([flatten_obs(obs, self.obs_ndim), action], axis=-1)
        return MLP(self.hidden_sizes, 1, 1.0, self.activation, self.precision,
                   self.matmul)(x)[..., 0]


def squashed_gaussian(mean: jax.Array, log_std: jax.Array, noise: jax.Array,
                      ) -> tuple[jax.Array, jax.Array]:
    """A reparameterised sample of a tanh-squashed diagonal Gaussian and its log-density.

    ``u = mean + exp(log_std) * noise`` (``noise`` standard normal), ``a = tanh(u)``, and
    ``log p(a) = log N(u; mean, std) - sum_i log(1 - tanh(u_i)^2)`` (the change of variables
    through tanh), with ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))`` computed
    stably for large ``|u|``. Shapes: ``[..., A] -> (action [..., A] in (-1, 1), log_prob
    [...])``. Gradients flow to ``mean`` and ``log_std`` (the reparameterisation trick).
    """
    u = mean + jnp.exp(log_std) * noise
    gaussian = jnp.sum(-0.5 * jnp.square(noise) - log_std - 0.5 * jnp.log(2.0 * jnp.pi),
                       axis=-1)
    correction = jnp.sum(2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u)), axis=-1)
    return jnp.tanh(u), gaussian - correction


# ------------------------------------------------------------- recurrent (recurrent PPO)


class GRUCell(nn.Module):
    """A gated recurrent unit: ``(hidden [..., H], x [..., D]) -> hidden [..., H]``.

    ``r = sigmoid(x W_r + h U_r + b_r)``, ``z = sigmoid(x W_z + h U_z + b_z)``,
    ``n = tanh(x W_n + b_n + r * (h U_n + c_n))`` and ``h' = (1 - z) * n + z * h``, with
    ``W = [W_r, W_z, W_n]`` the ``"input"`` layer's kernel (bias ``b``, LeCun-normal init)
    and ``U = [U_r, U_z, U_n]`` the ``"recurrent"`` layer's (bias ``c``, orthogonal init).
    """

    features: int
    precision: str = "float32"
    matmul: str = "cpu"

    @nn.compact
    def __call__(self, hidden: jax.Array, x: jax.Array) -> jax.Array:
        dot_general = dot_general_for(self.precision, self.matmul)
        from_input = nn.Dense(3 * self.features, bias_init=nn.initializers.zeros,
                              dot_general=dot_general, name="input")(x)
        from_hidden = nn.Dense(3 * self.features, kernel_init=nn.initializers.orthogonal(),
                               bias_init=nn.initializers.zeros, dot_general=dot_general,
                               name="recurrent")(hidden)
        x_r, x_z, x_n = jnp.split(from_input, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(from_hidden, 3, axis=-1)
        r = nn.sigmoid(x_r + h_r)
        z = nn.sigmoid(x_z + h_z)
        n = jnp.tanh(x_n + r * h_n)
        return (1.0 - z) * n + z * hidden


class RecurrentActorCritic(nn.Module):
    """A GRU core over the flattened observation, then separate actor and critic MLPs.

    ``__call__(hidden [..., H], obs [..., *obs_shape], start [...]) -> (hidden [..., H],
    (logits_or_mean [..., A], log_std [A], value [...]))`` is one step: the hidden state is
    zeroed where ``start`` (the observation begins an episode), the cell reads the
    observation, and the heads read the new hidden state, which is returned *before* any
    reset of the next step. :meth:`core` is the step without the heads, :meth:`heads` the
    heads alone, :meth:`value_step` the critic after one cell step without a reset (for the
    value of an episode's final observation). :func:`unroll` runs whole sequences.
    """

    action_dim: int
    discrete: bool
    obs_ndim: int
    gru_size: int = 64
    hidden_sizes: Sequence[int] = (64,)
    activation: str = "tanh"
    precision: str = "float32"
    matmul: str = "cpu"

    def setup(self):
        self.cell = GRUCell(self.gru_size, self.precision, self.matmul)
        self.actor = MLP(self.hidden_sizes, self.action_dim, 0.01, self.activation,
                         self.precision, self.matmul)
        self.critic = MLP(self.hidden_sizes, 1, 1.0, self.activation, self.precision,
                          self.matmul)
        if not self.discrete:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def core(self, hidden: jax.Array, obs: jax.Array, start: jax.Array) -> jax.Array:
        hidden = jnp.where(start[..., None], jnp.zeros_like(hidden), hidden)
        return self.cell(hidden, flatten_obs(obs, self.obs_ndim))

    def heads(self, hidden: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        log_std = jnp.zeros((self.action_dim,)) if self.discrete else self.log_std
        return self.actor(hidden), log_std, self.critic(hidden)[..., 0]

    def __call__(self, hidden: jax.Array, obs: jax.Array, start: jax.Array):
        hidden = self.core(hidden, obs, start)
        return hidden, self.heads(hidden)

    def value_step(self, hidden: jax.Array, obs: jax.Array) -> jax.Array:
        return self.critic(self.cell(hidden, flatten_obs(obs, self.obs_ndim)))[..., 0]


def unroll(network: RecurrentActorCritic, params, hidden: jax.Array, obs: jax.Array,
           starts: jax.Array):
    """``network`` over sequences from ``hidden [B, H]``: ``obs [T, B, *obs_shape]`` and
    ``starts [T, B]`` (reset the hidden state before step ``t``).

    Returns ``(hidden [B, H] after the last step, (logits_or_mean [T, B, A], log_std [A],
    value [T, B]))``; the heads run once over all ``T * B`` hidden states.
    """
    def step(hidden, inputs):
        hidden = network.apply(params, hidden, *inputs, method=network.core)
        return hidden, hidden

    last, hiddens = jax.lax.scan(step, hidden, (obs, starts))
    return last, network.apply(params, hiddens, method=network.heads)
