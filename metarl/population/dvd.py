"""DvD-TD3 (Parker-Holder et al. 2020): a population of TD3 actors trained to be diverse,
with one shared critic and replay buffer; one jitted function per segment.

``M`` deterministic TD3 actors act in their own environments (``inner.num_envs`` each,
with TD3's exploration noise) and store every transition in ONE shared buffer; ONE twin
critic learns from it (:mod:`.shared_critic`). The actors minimise a *joint* loss

    sum_m -mean_b Q_1(s_mb, mu_m(s_mb))  -  weight * log det(K + jitter I),

``K_ij = exp(-d_ij / (2 length_scale^2))`` with ``d_ij`` the mean squared difference of
actors ``i`` and ``j``'s actions on a shared batch of ``embedding_states`` states from the
buffer (:func:`~metarl.population.diversity.log_det_diversity`): the log-determinant is
largest when the actors act differently, so the term pushes their behaviours apart.

The weight changes during training in one of three ways (``weight_schedule``):

- ``"bandit"`` (the paper's): Thompson sampling over ``bandit_weights`` (``{0, 0.5}`` by
  default). Each arm has a Beta(1, 1) prior; at the end of every segment the arm played
  gets reward 1 if the population's best return (the best member's mean episode return
  over the segment) exceeds the previous segment's, else 0, and the next segment plays the
  arm whose Beta sample is largest. Diversity is thus kept while it helps the return.
- ``"constant"``: ``weight`` throughout.
- ``"linear"``: from ``weight`` at the start to ``final_weight`` at the end of the budget,
  per update (explore diverse behaviours early, then exploit).

It stays finite: the kernel has ``jitter`` on its diagonal (the log-determinant is finite
and its gradient zero for identical members), each actor's gradient is clipped to
``max_grad_norm``, and a step whose loss or gradient is not finite is skipped -- the
parameters and Adam state are kept -- and counted (``skipped_actor_steps``,
``skipped_critic_steps``); ``finite`` in the history says whether every parameter is
finite. NaNs never reach the parameters.

:func:`train_dvd` runs the budget of ``inner`` (``total_timesteps`` per member) in segments
of ``segment_updates`` updates and keeps a history per segment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from inner_loops import off_policy, replay
from inner_loops.learner import strong_types
from inner_loops.td3 import TD3Config
from inner_loops.validation import (
    check_choice,
    check_non_negative,
    check_positive,
    check_positive_int,
)
from metarl.population.diversity import log_det_diversity
from metarl.population.shared_critic import (
    ActorGroup,
    CriticState,
    Diversity,
    SharedCriticTD3,
    StepDiagnostics,
    check_td3,
)

WEIGHT_SCHEDULES = ("bandit", "constant", "linear")


def _default_inner() -> TD3Config:
    return TD3Config(env_id="Pendulum-v1")


@dataclass(frozen=True)
class DvDConfig:
    """Settings of a DvD-TD3 run.

    ``inner`` (a :class:`~inner_loops.td3.TD3Config`) sets everything TD3 has, per member:
    its environments (``num_envs`` each), budget (``total_timesteps`` each), update
    structure (``train_frequency``, ``gradient_steps`` -- critic steps per update, each on
    one batch per member), warm-up, networks and traced hyperparameters. ``buffer_size`` is
    the capacity of the one shared buffer, which receives ``population_size`` times as many
    transitions as one TD3 agent's.

    Attributes:
        inner: the TD3 settings (another algorithm's config is refused).
        population_size: actors, at least 2.
        segment_updates: updates per segment (one jitted call; the bandit plays one arm per
            segment); must divide ``inner``'s number of updates.
        weight_schedule: ``"bandit"``, ``"constant"`` or ``"linear"`` (module docstring).
        bandit_weights: the bandit's arms, the candidate weights.
        weight: the constant weight, or the linear schedule's first.
        final_weight: the linear schedule's last weight.
        embedding_states: states (drawn from the shared buffer at every actor step) whose
            actions make up each actor's behaviour for the kernel.
        length_scale: the RBF kernel's length scale, in the unit action box.
        jitter: added to the kernel's diagonal; ``> 0`` keeps the log-determinant finite
            when members coincide (``0`` is allowed, to see a non-finite step skipped).
        max_grad_norm: each actor's gradient is clipped to this global norm (``0``: not
            clipped).
    """

    inner: TD3Config = field(default_factory=_default_inner)
    population_size: int = 5
    segment_updates: int = 25
    weight_schedule: str = "bandit"
    bandit_weights: tuple[float, ...] = (0.0, 0.5)
    weight: float = 0.5
    final_weight: float = 0.0
    embedding_states: int = 20
    length_scale: float = 1.0
    jitter: float = 1e-4
    max_grad_norm: float = 10.0

    def __post_init__(self):
        check_td3("dvd.inner", self.inner)
        check_positive_int("dvd.population_size", self.population_size)
        if self.population_size < 2:
            raise ValueError(f"dvd.population_size: diversity needs at least 2 members, got "
                             f"{self.population_size}")
        check_positive_int("dvd.segment_updates", self.segment_updates)
        if self.inner.num_updates % self.segment_updates:
            raise ValueError(
                f"dvd.segment_updates: {self.segment_updates} does not divide the "
                f"{self.inner.num_updates} updates of inner's budget (total_timesteps "
                f"{self.inner.total_timesteps} / {self.inner.steps_per_update} per update)")
        check_choice("dvd.weight_schedule", self.weight_schedule, WEIGHT_SCHEDULES)
        weights = tuple(self.bandit_weights)
        if not weights:
            raise ValueError("dvd.bandit_weights: give at least one candidate weight")
        for index, value in enumerate(weights):
            check_non_negative(f"dvd.bandit_weights[{index}]", value)
        object.__setattr__(self, "bandit_weights", tuple(float(w) for w in weights))
        check_non_negative("dvd.weight", self.weight)
        check_non_negative("dvd.final_weight", self.final_weight)
        check_positive_int("dvd.embedding_states", self.embedding_states)
        check_positive("dvd.length_scale", self.length_scale)
        check_non_negative("dvd.jitter", self.jitter)
        check_non_negative("dvd.max_grad_norm", self.max_grad_norm)
        if self.inner.num_envs * self.population_size > self.inner.buffer_size:
            raise ValueError(
                f"dvd.inner.buffer_size: {self.inner.buffer_size} is smaller than one step "
                f"of the population's {self.population_size} x {self.inner.num_envs} "
                "environments")

    @property
    def num_segments(self) -> int:
        return self.inner.num_updates // self.segment_updates

    @property
    def diversity(self) -> Diversity:
        return Diversity(self.embedding_states, self.length_scale, self.jitter)

    def replace(self, **changes) -> DvDConfig:
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- bandit


@struct.dataclass
class BanditState:
    """Thompson sampling over candidate weights with Beta-Bernoulli arms.

    Attributes:
        weights: ``[K]`` the arms' candidate weights (data, not constants of the compiled
            program, so runs that differ only in them share one compilation).
        alpha, beta: ``[K]`` Beta parameters (1 + successes, 1 + failures) of each arm.
        arm: ``[]`` int32 the arm being played.
        previous: ``[]`` the score the next one is compared with (NaN before the first).
    """

    weights: jax.Array
    alpha: jax.Array
    beta: jax.Array
    arm: jax.Array
    previous: jax.Array


def bandit_select(key: jax.Array, alpha: jax.Array, beta: jax.Array) -> jax.Array:
    """``[]`` int32 the arm whose Beta(alpha, beta) sample is largest."""
    return jnp.argmax(jax.random.beta(key, alpha, beta)).astype(jnp.int32)


def bandit_init(key: jax.Array, weights: Any) -> BanditState:
    """Arms for the candidate ``weights [K]``: uniform Beta(1, 1) priors and a first arm
    drawn from them."""
    weights = jnp.asarray(weights, jnp.float32)
    ones = jnp.ones(weights.shape, jnp.float32)
    return BanditState(weights, ones, ones, bandit_select(key, ones, ones),
                       jnp.full((), jnp.nan, jnp.float32))


def bandit_step(key: jax.Array, bandit: BanditState, score: jax.Array) -> tuple[BanditState,
                                                                                jax.Array]:
    """Reward the arm played with ``score > previous`` (nothing when either is NaN), then
    draw the next arm. Returns ``(bandit, reward)`` with ``reward`` ``[]`` float32 1, 0 or
    NaN (not rewarded)."""
    known = jnp.isfinite(score) & jnp.isfinite(bandit.previous)
    success = (score > bandit.previous).astype(jnp.float32)
    played = jax.nn.one_hot(bandit.arm, bandit.alpha.shape[0], dtype=jnp.float32)
    alpha = bandit.alpha + jnp.where(known, success, 0.0) * played
    beta = bandit.beta + jnp.where(known, 1.0 - success, 0.0) * played
    previous = jnp.where(jnp.isfinite(score), score, bandit.previous)
    bandit = BanditState(bandit.weights, alpha, beta, bandit_select(key, alpha, beta),
                         previous)
    return bandit, jnp.where(known, success, jnp.nan)


# --------------------------------------------------------------------------- the run


@struct.dataclass
class DvDState:
    """Everything a DvD run carries from update to update.

    Attributes:
        actors: the ``M`` actors, their targets and Adam states (leaves ``[M, ...]``).
        critic: the shared twin critic.
        buffer: the shared replay buffer.
        envs: the ``M x inner.num_envs`` environments mid-episode.
        last_return: ``[M]`` each member's mean return of the episodes it finished most
            recently (NaN before the first).
        bandit: the weight bandit (played arm unused by the other schedules).
        key: PRNG key of the next update.
        update_count: ``[]`` int32 updates done.
    """

    actors: ActorGroup
    critic: CriticState
    buffer: replay.ReplayBuffer
    envs: off_policy.Actors
    last_return: jax.Array
    bandit: BanditState
    key: jax.Array
    update_count: jax.Array


@dataclass(frozen=True, eq=False)
class DvD:
    """A DvD run's pure functions for one config: :meth:`init`, :meth:`segment` (jit it, or
    use :meth:`jit_segment`) and :meth:`diversity`. Build with :func:`make_dvd`."""

    config: DvDConfig
    parts: SharedCriticTD3

    @property
    def steps_per_update(self) -> int:
        """Environment steps of the whole population per update."""
        return self.config.population_size * self.config.inner.steps_per_update

    def hyperparams(self) -> Any:
        """TD3's traced hyperparameters of ``config.inner`` (shared by the population)."""
        return self.config.inner.hyperparams()

    def init(self, key: jax.Array) -> DvDState:
        """Independently initialised actors, a fresh critic, an empty buffer."""
        actor_key, critic_key, env_key, bandit_key, key = jax.random.split(key, 5)
        params = self.parts.init_actors(actor_key, self.config.population_size)
        return strong_types(DvDState(
            actors=self.parts.start_group(params),
            critic=self.parts.init_critic(critic_key),
            buffer=replay.init(self.config.inner.buffer_size,
                               off_policy.example_transition(self.parts.spec)),
            envs=self.parts.reset(env_key),
            last_return=jnp.full(self.config.population_size, jnp.nan, jnp.float32),
            bandit=bandit_init(bandit_key, self.config.bandit_weights),
            key=key,
            update_count=jnp.zeros((), jnp.int32),
        ))

    def weight(self, state: DvDState) -> jax.Array:
        """``[]`` the diversity weight of the next update."""
        config = self.config
        if config.weight_schedule == "bandit":
            return state.bandit.weights[state.bandit.arm]
        if config.weight_schedule == "constant":
            return jnp.float32(config.weight)
        progress = state.update_count / config.inner.num_updates
        return jnp.float32(config.weight + (config.final_weight - config.weight) * progress)

    def diversity(self, params: Any, obs: jax.Array) -> jax.Array:
        """``[]`` the log-det diversity of actors ``params`` (leaves ``[M, ...]``) on
        states ``obs [B, ...]``, with the run's kernel settings."""
        return log_det_diversity(self.parts.actions(params, obs), self.config.length_scale,
                                 self.config.jitter)

    def update(self, state: DvDState, hypers: Any) -> tuple[DvDState, dict[str, jax.Array]]:
        """One update: ``inner.train_frequency`` steps of every member's environments, then
        ``inner.gradient_steps`` critic steps and the actors' joint steps (after the
        warm-up)."""
        config, parts, inner = self.config, self.parts, self.config.inner
        key, collect_key, learn_key = jax.random.split(state.key, 3)
        warmup = state.update_count * inner.steps_per_update < inner.learning_starts
        envs, buffer, totals = parts.collect(state.actors.params, state.envs, state.buffer,
                                             collect_key, inner.train_frequency,
                                             hypers.exploration_noise, warmup)
        count = parts.per_member(totals.count).sum(axis=1)
        return_sum = parts.per_member(totals.return_sum).sum(axis=1)
        last_return = jnp.where(count > 0, return_sum / jnp.maximum(count, 1),
                                state.last_return)
        weight = self.weight(state)
        learning = state.update_count >= inner.warmup_updates
        progress = state.update_count / inner.num_updates

        def learn(critic, actors):
            return parts.gradient_steps(critic, actors, buffer, hypers, learn_key,
                                        inner.gradient_steps, progress, config.diversity,
                                        weight)

        def skip(critic, actors):
            return critic, actors, StepDiagnostics.zeros()

        critic, actors, diagnostics = jax.lax.cond(learning, learn, skip, state.critic,
                                                   state.actors)
        state = state.replace(actors=actors, critic=critic, buffer=buffer, envs=envs,
                              last_return=last_return, key=key,
                              update_count=state.update_count + 1)
        metrics = {
            "episode_return": last_return,
            "weight": weight,
            "learning": learning,
            "nonfinite_actions": jnp.sum(~totals.valid, dtype=jnp.int32),
            **diagnostics._asdict(),
        }
        return state, metrics

    def segment(self, state: DvDState, hypers: Any = None
                ) -> tuple[DvDState, dict[str, jax.Array]]:
        """``segment_updates`` updates, then the bandit's reward and next arm.

        Metrics: ``returns [M]`` (each member's mean episode return over the segment),
        ``best_return``, ``mean_return``, ``weight`` (mean over the segment's updates),
        ``arm`` and ``reward`` (the bandit's; NaN when not rewarded), ``alpha`` / ``beta``
        ``[K]`` after the reward, ``diversity`` (log-det of the actors' actions on
        ``embedding_states`` states from the buffer, at the segment's end),
        ``train_diversity`` (mean over the segment's actor steps; NaN when the segment
        took none), the summed
        ``skipped_actor_steps`` / ``skipped_critic_steps`` / ``nonfinite_actions`` (per
        update, the environments whose actor chose a non-finite action),
        ``finite`` (every parameter is finite) and ``env_steps``.
        """
        config = self.config
        hypers = self.hyperparams() if hypers is None else hypers
        arm = state.bandit.arm
        state, metrics = jax.lax.scan(lambda s, _: self.update(s, hypers), state, None,
                                      length=config.segment_updates)
        returns = jnp.nanmean(metrics["episode_return"], axis=0)
        has_return = jnp.any(jnp.isfinite(returns))
        best = jnp.where(has_return, jnp.nanmax(jnp.where(jnp.isfinite(returns), returns,
                                                          -jnp.inf)), jnp.nan)
        key, bandit_key, diversity_key = jax.random.split(state.key, 3)
        bandit, reward = state.bandit, jnp.full((), jnp.nan, jnp.float32)
        if config.weight_schedule == "bandit":
            bandit, reward = bandit_step(bandit_key, state.bandit, best)
        indices = replay.sample_indices(state.buffer, diversity_key, config.embedding_states)
        obs = replay.gather(state.buffer, indices).obs
        params_finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in
                                           jax.tree.leaves((state.actors, state.critic))]))
        learned = jnp.maximum(jnp.sum(metrics["learning"]), 1)
        state = state.replace(bandit=bandit, key=key)
        summary = {
            "returns": returns,
            "best_return": best,
            "mean_return": jnp.nanmean(returns),
            "weight": jnp.mean(metrics["weight"]),
            "arm": arm,
            "reward": reward,
            "alpha": bandit.alpha,
            "beta": bandit.beta,
            "diversity": self.diversity(state.actors.params, obs),
            "train_diversity": jnp.where(jnp.any(metrics["learning"]),
                                         jnp.sum(metrics["diversity"]) / learned, jnp.nan),
            "critic_loss": jnp.sum(metrics["critic_loss"]) / learned,
            "actor_loss": jnp.sum(metrics["actor_loss"]) / learned,
            "skipped_actor_steps": jnp.sum(metrics["skipped_actor_steps"]),
            "skipped_critic_steps": jnp.sum(metrics["skipped_critic_steps"]),
            "nonfinite_actions": jnp.sum(metrics["nonfinite_actions"]),
            "finite": params_finite,
            "env_steps": state.update_count * self.steps_per_update,
        }
        return state, summary

    def jit_segment(self, compiler_options: dict | None = None):
        """``jax.jit(segment)``; ``compiler_options`` go to ``jax.jit``."""
        return jax.jit(self.segment, compiler_options=compiler_options)

    def evaluate(self, state: DvDState, key: jax.Array, episodes: int | None = None
                 ) -> jax.Array:
        """``[M]`` mean return of each member's deterministic episodes
        (``inner.eval_episodes`` by default)."""
        episodes = self.config.inner.eval_episodes if episodes is None else episodes
        keys = jax.random.split(key, self.config.population_size)
        return jax.vmap(lambda p, k: self.parts.evaluate(p, k, episodes))(
            state.actors.params, keys)


def make_dvd(config: DvDConfig) -> DvD:
    """The :class:`DvD` of ``config``; builds the environment (``ValueError`` naming
    ``dvd.inner.env_id`` or ``dvd.inner.eval_max_steps`` when it does not suit)."""
    try:
        parts = SharedCriticTD3.build(config.inner, config.population_size,
                                      config.inner.num_envs, config.max_grad_norm)
    except ValueError as error:
        raise ValueError(f"dvd.inner.{error}") from None
    return DvD(config, parts)


@dataclass(frozen=True)
class DvDResult:
    """A finished DvD run.

    Attributes:
        state: the final :class:`DvDState`.
        history: one dict per segment (see :func:`segment_record`).
        run: the :class:`DvD` that ran.
    """

    state: DvDState
    history: list[dict[str, Any]]
    run: DvD


def segment_record(metrics: dict[str, jax.Array]) -> dict[str, Any]:
    """One segment of :attr:`DvDResult.history` as plain Python values (the metrics of
    :meth:`DvD.segment`)."""
    metrics = jax.device_get(metrics)
    record = {}
    for name, value in metrics.items():
        value = np.asarray(value)
        if value.ndim:
            record[name] = [float(v) for v in value]
        elif value.dtype == np.bool_:
            record[name] = bool(value)
        elif np.issubdtype(value.dtype, np.integer):
            record[name] = int(value)
        else:
            record[name] = float(value)
    return record


def train_dvd(config: DvDConfig, key: jax.Array, hypers: Any = None,
              compiler_options: dict | None = None, callback=None) -> DvDResult:
    """Train a DvD population over ``config.inner``'s budget from ``key``.

    Args:
        config: the run's settings.
        key: PRNG key.
        hypers: TD3's traced hyperparameters (default: ``config.inner``'s).
        compiler_options: passed to ``jax.jit``.
        callback: called with each segment's record as it completes.

    Returns a :class:`DvDResult`; one compilation serves every segment.
    """
    run = make_dvd(config)
    hypers = run.hyperparams() if hypers is None else hypers
    state = jax.jit(run.init)(key)
    segment = run.jit_segment(compiler_options)
    history = []
    for _ in range(config.num_segments):
        state, metrics = segment(state, hypers)
        record = segment_record(metrics)
        history.append(record)
        if callback is not None:
            callback(record)
    return DvDResult(state, history, run)
