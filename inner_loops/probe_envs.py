"""Probe environments: tiny tasks whose exact Q-values are known, for testing learners.

Each probe isolates one thing a value learner must get right (after Andy Jones' "debugging
RL" probes). They are ordinary environments of the adapter: :func:`inner_loops.envs.make_env`
builds ``probe/<name>-discrete`` and ``probe/<name>-continuous`` like any gymnax id, so a
learner trains on them through its usual code path.

Every probe has a one-dimensional observation ``[1]`` float32. Discrete variants have two
actions ``{0, 1}``; continuous variants one action in ``[-1, 1]`` (the probe clips it).
Below, ``s`` is the observation's value, ``a`` the action and ``gamma`` the learner's
discount; the exact ``Q(s, a)`` is what a critic should converge to (:func:`exact_q`
computes it):

============================  ==========================  ====================================
probe (episode)               reward                      exact ``Q(s, a)``
============================  ==========================  ====================================
``constant`` (1 step)         ``1``                       ``1``
``observation`` (1 step,      ``s``                       ``s``
s = ±1 at random)
``action`` (1 step, s = 0)    discrete: ``+1`` if a = 1   discrete: ``Q(0, 0) = -1``,
                              else ``-1``; continuous:    ``Q(0, 1) = +1``; continuous:
                              ``-(a - 0.5)^2``            ``-(a - 0.5)^2`` (best: a = 0.5)
``observation_action``        discrete: ``+1`` if         discrete: ``+1`` for the matching
(1 step, s = ±1 at random)    a = (s > 0) else ``-1``;    action, ``-1`` for the other;
                              continuous:                 continuous: ``-(a - 0.5 s)^2``
                              ``-(a - 0.5 s)^2``          (best: a = 0.5 s)
``discount`` (2 steps:        ``0`` at s = 0, ``1`` at    ``Q(0, a) = gamma``, ``Q(1, a) = 1``
s = 0 then s = 1)             s = 1, then terminates
``bootstrap`` (s = 0,         ``1`` every step            ``1 / (1 - gamma)``: a time limit is
truncated after every step,                               not a terminal state, so the target
never terminates)                                         bootstraps from the final observation
``observation_action_``       ``observation_action``'s    ``observation_action``'s: the noise
``outliers`` (1 step,         plus noise: ``±100``        has mean 0, so the expected reward
s = ±1 at random)             (``OUTLIER``) with          is the noiseless one (discrete:
                              probability 0.025 each      ``+1`` for the matching action,
                              (``OUTLIER_RATE = 0.05``    ``-1`` for the other)
                              in all), else ``0``
============================  ==========================  ====================================

One more probe needs memory and has no ``exact_q`` of its observation:
``probe/memory-<delay>`` (discrete only; ``delay >= 1``, e.g. ``probe/memory-2``) shows a
cue ``s = ±1`` at random at its first step, then ``delay`` blank observations ``s = 0``; the
action taken at the last blank step earns ``+1`` if it matches the cue (action 1 for
``+1``, action 0 for ``-1``), else ``-1``, and the episode terminates (every other step
earns ``0``). A feed-forward policy sees the same blank observation whatever the cue, so its
expected return is ``0``; one that remembers the cue earns ``1``. It is not among
:func:`probe_ids` (the probes with an exact ``Q``); :func:`memory_probe_id` names it.

All one-step probes and ``discount`` end by *termination* (no bootstrap from the last
step); ``bootstrap`` ends only by *truncation*, so a learner that mistakes a time limit for
termination learns ``Q = 1`` there instead of ``1 / (1 - gamma)``.

``observation_action_outliers`` is the one noisy probe, a task on which the shape of a value
loss decides by design: its reward noise is symmetric and heavy-tailed (rare, huge, zero
mean, variance ``OUTLIER_RATE * OUTLIER^2 = 500``), so the median of a reward equals its
mean and a distance with bounded gradients (Huber) learns the same ``Q`` as L2 but is not
thrown about by the outliers. With DQN, Huber earns a clearly higher return there than L2
(``tests/test_known_answers.py``, where evolution must rediscover that); on the noiseless
probes every distance that has its minimum at zero learns the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.env_spec import PROBE_PREFIX, Env, EnvSpec, auto_reset

VARIANTS = ("discrete", "continuous")
# Best continuous action of ``action`` (and ``observation_action`` at s = +1).
ACTION_TARGET = 0.5
# The reward noise of ``observation_action_outliers``: +-OUTLIER, each sign with probability
# OUTLIER_RATE / 2, else 0.
OUTLIER = 100.0
OUTLIER_RATE = 0.05


class ProbeState(NamedTuple):
    """``obs [1]`` float32 and ``t []`` int32, the step within the episode."""

    obs: jax.Array
    t: jax.Array


@dataclass(frozen=True)
class Probe:
    """One probe's rules (see the module docstring's table).

    Attributes:
        name: ``constant``, ``observation``, ...
        random_sign: the first observation is ``±1`` at random (else ``0``).
        episode_steps: steps in an episode.
        terminates: the episode ends by termination (else by truncation).
        reward: ``(s [], t [], action, discrete) -> []`` reward.
        observations: the observation values the probe visits (for tests).
        noise: ``key -> []`` zero-mean noise added to every reward (``None``: none), drawn
            from a key of its own, so the exact ``Q`` is that of the noiseless reward.
    """

    name: str
    random_sign: bool
    episode_steps: int
    terminates: bool
    reward: Callable[[jax.Array, jax.Array, jax.Array, bool], jax.Array]
    observations: tuple[float, ...]
    noise: Callable[[jax.Array], jax.Array] | None = None


def _signed(action: jax.Array) -> jax.Array:
    """``+1`` for discrete action 1, ``-1`` for action 0."""
    return 2.0 * action.astype(jnp.float32) - 1.0


def _action_reward(s, t, action, discrete):
    del s, t
    if discrete:
        return _signed(action)
    return -jnp.square(action[0] - ACTION_TARGET)


def _observation_action_reward(s, t, action, discrete):
    del t
    if discrete:
        return _signed(action) * s
    return -jnp.square(action[0] - ACTION_TARGET * s)


def outlier_noise(key: jax.Array) -> jax.Array:
    """``[]`` float32: ``±OUTLIER`` with probability ``OUTLIER_RATE / 2`` each, else ``0``
    (mean 0, median 0, variance ``OUTLIER_RATE * OUTLIER^2``)."""
    hit_key, sign_key = jax.random.split(key)
    sign = jnp.where(jax.random.bernoulli(sign_key), 1.0, -1.0)
    return jnp.where(jax.random.bernoulli(hit_key, OUTLIER_RATE), OUTLIER * sign, 0.0)


PROBES = {
    probe.name: probe
    for probe in (
        Probe("constant", False, 1, True, lambda s, t, a, d: jnp.float32(1.0), (0.0,)),
        Probe("observation", True, 1, True, lambda s, t, a, d: s, (-1.0, 1.0)),
        Probe("action", False, 1, True, _action_reward, (0.0,)),
        Probe("observation_action", True, 1, True, _observation_action_reward, (-1.0, 1.0)),
        Probe("discount", False, 2, True, lambda s, t, a, d: t.astype(jnp.float32),
              (0.0, 1.0)),
        Probe("bootstrap", False, 1, False, lambda s, t, a, d: jnp.float32(1.0), (0.0,)),
        Probe("observation_action_outliers", True, 1, True, _observation_action_reward,
              (-1.0, 1.0), outlier_noise),
    )
}
# probes whose noiseless reward is observation_action's
_OBSERVATION_ACTION = ("observation_action", "observation_action_outliers")


MEMORY = "memory"


class MemoryState(NamedTuple):
    """``cue []`` float32 (``±1``) and ``t []`` int32, the step within the episode."""

    cue: jax.Array
    t: jax.Array


def memory_probe_id(delay: int | str) -> str:
    """The id of the memory probe with ``delay`` blank steps (see the module docstring)."""
    return f"{PROBE_PREFIX}{MEMORY}-{delay}"


def _memory_delay(env_id: str) -> int | None:
    """``delay`` of ``probe/memory-<delay>``; ``None`` for any other id."""
    prefix = f"{PROBE_PREFIX}{MEMORY}-"
    if not env_id.startswith(prefix):
        return None
    delay = env_id[len(prefix):]
    if not (delay.isascii() and delay.isdigit()) or delay != str(int(delay)) or int(delay) < 1:
        raise ValueError(f"env_id: {env_id!r}: the memory probe's delay must be a positive "
                         f"integer, e.g. {memory_probe_id(2)}")
    return int(delay)


def make_memory_env(delay: int) -> Env:
    """The :class:`~inner_loops.envs.Env` of ``probe/memory-<delay>`` (discrete, obs ``[1]``,
    ``delay + 1`` steps an episode)."""
    spec = EnvSpec(memory_probe_id(delay), (1,), True, 2, max_episode_steps=delay + 1)

    def observe(state):
        return jnp.where(state.t == 0, state.cue, 0.0)[None].astype(jnp.float32)

    def reset(key):
        state = MemoryState(jnp.where(jax.random.bernoulli(key), 1.0, -1.0),
                            jnp.zeros((), jnp.int32))
        return observe(state), state

    def step(key, state, action, fresh=None):
        if fresh is None:
            fresh = reset(key)
        ended = state.t >= delay
        reward = jnp.where(ended, _signed(action) * state.cue, 0.0).astype(jnp.float32)
        reached = MemoryState(state.cue, state.t + 1)
        return auto_reset(fresh, observe(reached), reached, reward, ended,
                          jnp.zeros((), jnp.bool_))

    return Env(spec, reset, step)


def probe_ids() -> list[str]:
    """Every probe id with an exact ``Q`` (all but the memory probes), each of which
    :func:`inner_loops.envs.make_env` accepts."""
    return [f"{PROBE_PREFIX}{name}-{variant}" for name in PROBES for variant in VARIANTS]


def parse_probe_id(env_id: str) -> tuple[Probe, bool]:
    """``(probe, discrete)`` of ``probe/<name>-<variant>``; ``ValueError`` lists the ids."""
    name, _, variant = env_id[len(PROBE_PREFIX):].rpartition("-")
    if not env_id.startswith(PROBE_PREFIX) or name not in PROBES or variant not in VARIANTS:
        raise ValueError(f"env_id: unknown probe {env_id!r}; allowed: {', '.join(probe_ids())}"
                         f", {memory_probe_id('<delay>')}")
    return PROBES[name], variant == "discrete"


def make_probe_env(env_id: str, env_params: tuple = ()) -> Env:
    """The :class:`~inner_loops.envs.Env` of probe ``env_id`` (no parameters to set)."""
    delay = _memory_delay(env_id)
    if delay is None:
        probe, discrete = parse_probe_id(env_id)
    if env_params:
        raise ValueError(f"env_params.{env_params[0][0]}: {env_id} has no parameters")
    if delay is not None:
        return make_memory_env(delay)
    if discrete:
        spec = EnvSpec(env_id, (1,), True, 2, max_episode_steps=probe.episode_steps)
    else:
        spec = EnvSpec(env_id, (1,), False, 1, (-1.0,), (1.0,),
                       max_episode_steps=probe.episode_steps)

    def reset(key):
        if probe.random_sign:
            s = jnp.where(jax.random.bernoulli(key), 1.0, -1.0)
        else:
            s = jnp.float32(0.0)
        obs = jnp.full((1,), s, jnp.float32)
        return obs, ProbeState(obs, jnp.zeros((), jnp.int32))

    def step(key, state, action, fresh=None):
        if probe.noise is not None:  # the noiseless probes keep their key as it was
            key, noise_key = jax.random.split(key)
        if fresh is None:
            fresh = reset(key)
        if not discrete:
            action = jnp.clip(action, -1.0, 1.0)
        reward = jnp.asarray(probe.reward(state.obs[0], state.t, action, discrete), jnp.float32)
        if probe.noise is not None:
            reward = reward + probe.noise(noise_key).astype(jnp.float32)
        t = state.t + 1
        ended = t >= probe.episode_steps
        terminated = jnp.logical_and(ended, probe.terminates)
        truncated = jnp.logical_and(ended, not probe.terminates)
        # ``discount`` moves from s = 0 to s = 1; the other probes keep their observation.
        final_obs = state.obs + 1.0 if probe.name == "discount" else state.obs
        return auto_reset(fresh, final_obs, ProbeState(final_obs, t), reward, terminated,
                          truncated)

    return Env(spec, reset, step)


def exact_q(env_id: str, obs: np.ndarray, action: np.ndarray, gamma: float) -> np.ndarray:
    """The exact ``Q(s, a)`` of probe ``env_id`` (the module docstring's table); for the
    noisy probe that of its expected (noiseless) reward.

    Args:
        obs: ``[B, 1]`` observations the probe visits.
        action: ``[B]`` integers (discrete) or ``[B, 1]`` floats in ``[-1, 1]``.
        gamma: the discount the learner uses.

    Returns ``[B]`` float64.
    """
    probe, discrete = parse_probe_id(env_id)
    s = np.asarray(obs, np.float64)[:, 0]
    a = np.asarray(action, np.float64)
    if probe.name in ("constant", "observation"):
        return np.ones_like(s) if probe.name == "constant" else s
    if probe.name == "discount":
        return np.where(s > 0.5, 1.0, gamma)
    if probe.name == "bootstrap":
        return np.full_like(s, 1.0 / (1.0 - gamma))
    if discrete:
        signed = 2.0 * a - 1.0
        return signed if probe.name == "action" else signed * s
    target = ACTION_TARGET if probe.name == "action" else ACTION_TARGET * s
    return -np.square(np.clip(a[:, 0], -1.0, 1.0) - target)


def best_action(env_id: str, obs: np.ndarray) -> np.ndarray:
    """An action of highest exact Q for each of ``obs [B, 1]``: ``[B]`` integers (discrete)
    or ``[B, 1]`` floats. Where every action is equally good it is action ``0`` / ``0.0``."""
    probe, discrete = parse_probe_id(env_id)
    s = np.asarray(obs, np.float64)[:, 0]
    if probe.name == "action":
        best = np.ones_like(s) if discrete else np.full_like(s, ACTION_TARGET)
    elif probe.name in _OBSERVATION_ACTION:
        best = (s > 0).astype(np.float64) if discrete else ACTION_TARGET * s
    else:
        best = np.zeros_like(s)
    return best.astype(np.int32) if discrete else best[:, None].astype(np.float32)
