"""CEM-RL (Pourchot & Sigaud 2019): the cross-entropy method over TD3 actors, half of which
take gradient steps against one shared critic; one jitted function per generation.

The population is a diagonal Gaussian over an actor's flattened parameters (:mod:`.cem`),
with ONE twin critic (and its targets) and ONE replay buffer shared by every actor
(:mod:`.shared_critic`). One generation, all inside one ``jax.jit``:

1. **ask**: ``P`` actors drawn around the CEM mean in antithetic pairs;
2. **gradient steps**: the first ``K = round(rl_fraction * P)`` of them (the RL actors)
   take TD3 steps against the shared critic, which trains at the same time on the shared
   buffer: ``gradient_steps`` critic steps (each on ``K`` batches, one per RL actor, with
   that actor's target policy), one step of every RL actor per ``policy_delay`` of them.
   Each RL actor starts the generation with its target copied from itself and a fresh Adam
   state (as in the paper's code). Nothing is trained until the buffer holds
   ``inner.learning_starts`` transitions;
3. **evaluation**: every actor -- the RL ones after their steps -- runs
   ``episodes_per_member`` episodes from fresh starts, ``eval_max_steps`` steps each
   (deterministic unless ``collect_noise``); every transition goes into the shared buffer,
   and an actor's fitness is the mean return of its episodes (the return so far for an
   episode the step limit cut). An actor that chose a non-finite action gets fitness NaN,
   which ranks last; the environment got the middle of the action box instead;
4. **tell**: the distribution moves to the elites of the (gradient-updated) actors;
5. the new mean actor runs ``inner.eval_episodes`` deterministic episodes: the run's
   reported return (not stored, not counted in the environment steps).

Environment steps per generation: ``P * episodes_per_member * eval_max_steps``.
:func:`train_cem_rl` runs ``generations`` of them and keeps a history per generation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from inner_loops import replay
from inner_loops.off_policy import example_transition
from inner_loops.td3 import TD3Config
from inner_loops.validation import (
    check_in_range,
    check_non_negative,
    check_positive_int,
)
from metarl.population import cem
from metarl.population.cem import CEMConfig, CEMState
from metarl.population.shared_critic import (
    CriticState,
    SharedCriticTD3,
    StepDiagnostics,
    check_td3,
)


def _default_inner() -> TD3Config:
    return TD3Config(env_id="Pendulum-v1")


@dataclass(frozen=True)
class CEMRLConfig:
    """Settings of a CEM-RL run.

    Of ``inner`` (a :class:`~inner_loops.td3.TD3Config`) CEM-RL reads the environment
    (``env_id``, ``env_params``, ``eval_max_steps``), the networks, the replay settings
    (``buffer_size`` -- the shared buffer's capacity --, ``batch_size``, ``learning_starts``
    -- transitions in the shared buffer before the first gradient step), ``td_loss``,
    ``policy_delay``, ``eval_episodes`` (of the mean actor) and the traced hyperparameters
    except ``exploration_noise``; its per-agent budget and update structure
    (``total_timesteps``, ``num_envs``, ``train_frequency``, ``gradient_steps``) do not
    apply.

    Attributes:
        inner: the TD3 settings (another algorithm's config is refused).
        population_size: actors per generation; even (antithetic pairs).
        num_elites: actors the distribution moves to, at most ``population_size``.
        rl_fraction: the share of actors taking gradient steps, in ``[0, 1]`` (``0``: plain
            CEM over actors; the paper uses one half).
        generations: generations of the run.
        episodes_per_member: evaluation episodes per actor and generation (in parallel).
        gradient_steps: critic steps per generation (each RL actor steps once per
            ``inner.policy_delay`` of them); ``None``: the environment steps of one
            generation, as the paper trains as many steps as the last evaluation took.
        collect_noise: standard deviation of Gaussian noise on the evaluated actors'
            actions (unit action box); ``0`` as in the paper (the population explores).
        max_grad_norm: each RL actor's gradient is clipped to this global norm (``0``: not
            clipped).
        init_std, extra_noise_init, extra_noise_end, extra_noise_decay: the cross-entropy
            method's (see :class:`~metarl.population.cem.CEMConfig`); the paper's
            ``1e-3``, ``1e-3``, ``1e-5``, ``0.95`` by default.
    """

    inner: TD3Config = field(default_factory=_default_inner)
    population_size: int = 10
    num_elites: int = 5
    rl_fraction: float = 0.5
    generations: int = 20
    episodes_per_member: int = 1
    gradient_steps: int | None = None
    collect_noise: float = 0.0
    max_grad_norm: float = 0.0
    init_std: float = 1e-3
    extra_noise_init: float = 1e-3
    extra_noise_end: float = 1e-5
    extra_noise_decay: float = 0.95

    def __post_init__(self):
        check_td3("cem_rl.inner", self.inner)
        try:
            _ = self.cem  # CEMConfig checks its fields
        except ValueError as error:
            raise ValueError(f"cem_rl.{str(error).removeprefix('cem.')}") from None
        check_in_range("cem_rl.rl_fraction", self.rl_fraction, 0.0, 1.0)
        if self.rl_fraction > 0 and self.num_rl_actors == 0:
            raise ValueError(
                f"cem_rl.rl_fraction: {self.rl_fraction} of population_size "
                f"{self.population_size} rounds to no RL actor; use 0 for plain CEM or a "
                "larger fraction")
        check_positive_int("cem_rl.generations", self.generations)
        check_positive_int("cem_rl.episodes_per_member", self.episodes_per_member)
        if self.gradient_steps is not None:
            check_positive_int("cem_rl.gradient_steps", self.gradient_steps)
            if self.gradient_steps % self.inner.policy_delay:
                raise ValueError(
                    f"cem_rl.gradient_steps: {self.gradient_steps} is not a multiple of "
                    f"inner.policy_delay = {self.inner.policy_delay}")
        check_non_negative("cem_rl.collect_noise", self.collect_noise)
        check_non_negative("cem_rl.max_grad_norm", self.max_grad_norm)

    @property
    def cem(self) -> CEMConfig:
        """The cross-entropy method's settings."""
        return CEMConfig(self.population_size, self.num_elites, self.init_std,
                         self.extra_noise_init, self.extra_noise_end, self.extra_noise_decay)

    @property
    def num_rl_actors(self) -> int:
        """``K``: actors taking gradient steps each generation (the first ``K`` drawn)."""
        return int(round(self.rl_fraction * self.population_size))

    def replace(self, **changes) -> CEMRLConfig:
        return dataclasses.replace(self, **changes)


@struct.dataclass
class CEMRLState:
    """Everything a CEM-RL run carries from generation to generation.

    Attributes:
        cem: the search distribution over flat actor parameters ``[D]``.
        critic: the shared twin critic, its targets and Adam state.
        buffer: the shared replay buffer.
        key: PRNG key of the next generation.
        env_steps: ``[]`` int32 environment steps taken so far (mean-actor evaluations
            excluded).
    """

    cem: CEMState
    critic: CriticState
    buffer: replay.ReplayBuffer
    key: jax.Array
    env_steps: jax.Array


@dataclass(frozen=True, eq=False)
class CEMRL:
    """A CEM-RL run's pure functions for one config: :meth:`init` and :meth:`generation`
    (jit it, or use :meth:`jit_generation`). Build with :func:`make_cem_rl`."""

    config: CEMRLConfig
    parts: SharedCriticTD3
    num_params: int
    unravel: Any

    @property
    def steps_per_generation(self) -> int:
        """Environment steps of one generation's evaluations."""
        return (self.config.population_size * self.config.episodes_per_member
                * self.parts.eval_max_steps)

    @property
    def gradient_steps(self) -> int:
        """Critic steps per generation (a multiple of ``policy_delay``)."""
        if self.config.gradient_steps is not None:
            return self.config.gradient_steps
        delay = self.config.inner.policy_delay
        return max(delay, self.steps_per_generation // delay * delay)

    def hyperparams(self) -> Any:
        """TD3's traced hyperparameters of ``config.inner`` (shared by the population)."""
        return self.config.inner.hyperparams()

    def init(self, key: jax.Array) -> CEMRLState:
        """The distribution centred on a freshly initialised actor, a fresh critic and an
        empty buffer."""
        actor_key, critic_key, key = jax.random.split(key, 3)
        mean = self.parts.flatten(self.parts.init_actor(actor_key))
        spec = self.parts.spec
        return CEMRLState(
            cem=cem.init(mean, self.config.cem),
            critic=self.parts.init_critic(critic_key),
            buffer=replay.init(self.config.inner.buffer_size, example_transition(spec)),
            key=key,
            env_steps=jnp.zeros((), jnp.int32),
        )

    def mean_actor(self, state: CEMRLState) -> Any:
        """The actor at the distribution's mean (the run's result)."""
        return self.unravel(state.cem.mean)

    def train_rl_actors(self, state: CEMRLState, actors: Any, hypers: Any, key: jax.Array
                        ) -> tuple[CriticState, Any, StepDiagnostics, jax.Array]:
        """Step 2 of a generation: the first ``K`` of ``actors`` (leaves ``[P, ...]``) take
        ``gradient_steps`` TD3 steps against the shared critic, which trains with them, on
        ``state.buffer`` -- once it holds ``inner.learning_starts`` transitions. Returns
        ``(critic, actors, diagnostics, learning)``; the other actors are unchanged."""
        config, parts, count = self.config, self.parts, self.config.num_rl_actors
        if count == 0:
            return state.critic, actors, StepDiagnostics.zeros(), jnp.zeros((), jnp.bool_)
        progress = state.cem.generation / config.generations

        def learn(critic, actors):
            group = parts.start_group(jax.tree.map(lambda a: a[:count], actors))
            critic, group, diagnostics = parts.gradient_steps(
                critic, group, state.buffer, hypers, key, self.gradient_steps, progress)
            actors = jax.tree.map(lambda a, g: a.at[:count].set(g), actors, group.params)
            return critic, actors, diagnostics

        def skip(critic, actors):
            return critic, actors, StepDiagnostics.zeros()

        learning = state.buffer.size >= config.inner.learning_starts
        critic, actors, diagnostics = jax.lax.cond(learning, learn, skip, state.critic, actors)
        return critic, actors, diagnostics, learning

    def evaluate_members(self, actors: Any, buffer: replay.ReplayBuffer, key: jax.Array
                         ) -> tuple[replay.ReplayBuffer, jax.Array]:
        """Step 3 of a generation: every actor (leaves ``[P, ...]``) runs
        ``episodes_per_member`` episodes from fresh starts, their transitions stored in
        ``buffer``. Returns ``(buffer, fitness [P])``: the mean return of each actor's
        episodes (the return so far of one the step limit cut), NaN for an actor that chose
        a non-finite action."""
        parts = self.parts
        reset_key, collect_key = jax.random.split(key)
        envs = parts.reset(reset_key)
        envs, buffer, totals = parts.collect(actors, envs, buffer, collect_key,
                                             parts.eval_max_steps,
                                             jnp.float32(self.config.collect_noise))
        episode_return = jnp.where(totals.count > 0, totals.first_return,
                                   envs.episodes.running_return)
        valid = parts.per_member(totals.valid).all(axis=1)
        fitness = jnp.where(valid, parts.per_member(episode_return).mean(axis=1), jnp.nan)
        return buffer, fitness

    def generation(self, state: CEMRLState, hypers: Any = None
                   ) -> tuple[CEMRLState, dict[str, jax.Array]]:
        """One generation (see the module docstring).

        Metrics: ``fitness [P]``, ``rl_actor [P]`` (bool: took gradient steps; none
        before the buffer holds ``learning_starts`` transitions),
        ``learning []`` (gradient steps were taken), ``mean_return []`` (the new mean
        actor's), ``env_steps []`` (after this generation), and the gradient steps'
        :class:`~metarl.population.shared_critic.StepDiagnostics` (zeros when none).
        """
        config = self.config
        hypers = self.hyperparams() if hypers is None else hypers
        key, ask_key, rl_key, fitness_key, eval_key = jax.random.split(state.key, 5)
        actors = jax.vmap(self.unravel)(cem.ask(ask_key, state.cem, config.cem))
        critic, actors, diagnostics, learning = self.train_rl_actors(state, actors, hypers,
                                                                      rl_key)
        buffer, fitness = self.evaluate_members(actors, state.buffer, fitness_key)
        told = cem.tell(jax.vmap(self.parts.flatten)(actors), fitness, state.cem, config.cem)
        mean_return = self.parts.evaluate(self.unravel(told.mean), eval_key,
                                          config.inner.eval_episodes)
        env_steps = state.env_steps + self.steps_per_generation
        state = CEMRLState(cem=told, critic=critic, buffer=buffer, key=key, env_steps=env_steps)
        metrics = {
            "fitness": fitness,
            "rl_actor": (jnp.arange(config.population_size) < config.num_rl_actors) & learning,
            "learning": learning,
            "mean_return": mean_return,
            "env_steps": env_steps,
            **diagnostics._asdict(),
        }
        return state, metrics

    def jit_generation(self, compiler_options: dict | None = None):
        """``jax.jit(generation)``; ``compiler_options`` go to ``jax.jit``."""
        return jax.jit(self.generation, compiler_options=compiler_options)


def make_cem_rl(config: CEMRLConfig) -> CEMRL:
    """The :class:`CEMRL` of ``config``; builds the environment (``ValueError`` naming
    ``inner.env_id`` or ``inner.eval_max_steps`` when it does not suit)."""
    try:
        parts = SharedCriticTD3.build(config.inner, config.population_size,
                                      config.episodes_per_member, config.max_grad_norm)
    except ValueError as error:
        raise ValueError(f"cem_rl.inner.{error}") from None
    num_params, unravel = parts.ravel()
    return CEMRL(config, parts, num_params, unravel)


@dataclass(frozen=True)
class CEMRLResult:
    """A finished CEM-RL run.

    Attributes:
        state: the final :class:`CEMRLState`.
        history: one dict per generation (see :func:`generation_record`).
        run: the :class:`CEMRL` that ran (``run.mean_actor(state)`` is the result).
    """

    state: CEMRLState
    history: list[dict[str, Any]]
    run: CEMRL

    @property
    def mean_actor(self) -> Any:
        return self.run.mean_actor(self.state)


def generation_record(metrics: dict[str, jax.Array], num_elites: int) -> dict[str, Any]:
    """One generation of :attr:`CEMRLResult.history` as plain Python values:
    ``fitness [P]``, ``rl_actor [P]``, ``mean_fitness`` / ``elite_fitness`` /
    ``best_fitness`` (over valid actors; the elites are the ``num_elites`` best),
    ``rl_fitness`` and ``cem_fitness`` (mean over the RL actors and over the others; NaN
    when there are none), ``mean_return`` (the mean actor's), ``env_steps``, ``learning``
    and the gradient steps' diagnostics."""
    metrics = jax.device_get(metrics)
    fitness = np.asarray(metrics["fitness"], np.float64)
    rl_actor = np.asarray(metrics["rl_actor"], bool)
    ranked = np.sort(np.where(np.isnan(fitness), -np.inf, fitness))[::-1][:num_elites]
    ranked = ranked[np.isfinite(ranked)]

    def mean(values):
        values = values[~np.isnan(values)]
        return float(values.mean()) if values.size else float("nan")

    record = {
        "fitness": [float(f) for f in fitness],
        "rl_actor": [bool(r) for r in rl_actor],
        "mean_fitness": mean(fitness),
        "elite_fitness": float(ranked.mean()) if ranked.size else float("nan"),
        "best_fitness": float(np.nanmax(fitness)) if np.any(~np.isnan(fitness))
        else float("nan"),
        "rl_fitness": mean(fitness[rl_actor]),
        "cem_fitness": mean(fitness[~rl_actor]),
        "mean_return": float(metrics["mean_return"]),
        "env_steps": int(metrics["env_steps"]),
        "learning": bool(metrics["learning"]),
    }
    for name in StepDiagnostics._fields:
        value = metrics[name]
        record[name] = int(value) if name.startswith("skipped") else float(value)
    return record


def train_cem_rl(config: CEMRLConfig, key: jax.Array, hypers: Any = None,
                 compiler_options: dict | None = None, callback=None) -> CEMRLResult:
    """Run CEM-RL for ``config.generations`` generations from ``key``.

    Args:
        config: the run's settings.
        key: PRNG key.
        hypers: TD3's traced hyperparameters (default: ``config.inner``'s).
        compiler_options: passed to ``jax.jit`` (tests use fast, unoptimised compiles).
        callback: called with each generation's record as it completes.

    Returns a :class:`CEMRLResult`; one compilation serves every generation.
    """
    run = make_cem_rl(config)
    hypers = run.hyperparams() if hypers is None else hypers
    state = jax.jit(run.init)(key)
    generation = run.jit_generation(compiler_options)
    history = []
    for _ in range(config.generations):
        state, metrics = generation(state, hypers)
        record = generation_record(metrics, config.num_elites)
        history.append(record)
        if callback is not None:
            callback(record)
    return CEMRLResult(state, history, run)
