"""Run kind "pbt": population-based training from an experiment file, in a run directory.

An experiment file of this kind has four parts:

.. code-block:: toml

    kind = "pbt"
    name = "pbt_ppo_cartpole"
    [inner]                  # one algorithm (ppo, dqn, td3, sac) and its config's fields
    algorithm = "ppo"
    env_id = "CartPole-v1"
    [pbt]                    # PBTConfig: population, segment length, fractions, explore
    population_size = 8
    segment_updates = 4
    [pbt.priors.learning_rate]   # a Prior per explored hyperparameter
    low = 1e-4
    high = 1e-2
    log = true
    [run]                    # RunConfig: seed, chunk_size, checkpoint_every (segments), ...

The budget is the inner config's ``total_timesteps`` per member; ``pbt.segment_updates``
must divide its updates. The run writes the directory layout of :mod:`metarl.runs.layout`
with the guarantees of :mod:`metarl.runs` (one writer, atomic files, config change rules,
damaged checkpoints skipped); ``metrics.jsonl`` has one line per segment (returns, every
member's fitness and hyperparameters, the exploit step that followed), each checkpoint the
whole population (states, hyperparameters, key, segment index) so that a resumed run
continues bit for bit. Start, continue and read runs back through :mod:`metarl.kinds`;
:func:`plot_pbt_run` draws one and :func:`evaluate_pbt_run` evaluates its final members.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metarl.config import (
    ConfigError,
    RunConfig,
    build_table,
    default_inner_config,
    inner_to_dict,
    plain,
    refuse_tables,
    single_inner,
)
from metarl.population.pbt import (
    PBTConfig,
    initial_population,
    lineage,
    make_segment,
    segment_record,
)
from metarl.population.priors import Prior, hyperparameter_fields
from metarl.programs import program_key, shared_program
from metarl.runs import engine
from metarl.runs.engine import RunKind, SteppedRun, finite_stat
from metarl.runs.evaluations import digest, saved_evaluation

KIND = "pbt"
STEP_KEY = "segment"

__all__ = ["RUN_KIND", "PBTExperimentConfig", "PBTRunResult", "evaluate_pbt_run",
           "pbt_config_from_dict", "plot_pbt_run"]


# --------------------------------------------------------------------------------------
# the experiment config


@dataclass(frozen=True)
class PBTExperimentConfig:
    """A population-based training experiment (``kind = "pbt"``).

    Attributes:
        name: used for the run directory.
        description: free text.
        inner: one algorithm config (a registered config class, e.g.
            :class:`~inner_loops.sac.SACConfig`); its ``total_timesteps`` is each member's
            budget and its values are the hyperparameters of fields without a prior.
        pbt: see :class:`~metarl.population.pbt.PBTConfig`.
        run: see :class:`~metarl.config.RunConfig`; ``checkpoint_every`` counts segments,
            and ``max_invalid_generations`` stops the run after that many segments in a row
            in which every member's losses went non-finite.
    """

    name: str = "pbt"
    description: str = ""
    inner: Any = field(default_factory=default_inner_config)
    pbt: PBTConfig = field(default_factory=PBTConfig)
    run: RunConfig = field(default_factory=RunConfig)

    kind = KIND  # not a field: what ``to_dict`` writes and the dispatch reads

    def __post_init__(self):
        from inner_loops.registry import algorithm_of

        try:
            algorithm_of(self.inner)
        except ValueError as error:
            raise ConfigError(f"inner: {error}") from None
        hyper_fields = hyperparameter_fields(self.inner)
        for name, prior in self.pbt.priors.items():
            if name not in hyper_fields:
                raise ConfigError(
                    f"pbt.priors.{name}: not a traced hyperparameter of "
                    f"{algorithm_of(self.inner).name}; allowed: {', '.join(hyper_fields)}")
            for bound in ("low", "high"):
                try:
                    self.inner.replace(**{name: getattr(prior, bound)})
                except ValueError as error:
                    raise ConfigError(f"pbt.priors.{name}.{bound}: {getattr(prior, bound)} "
                                      f"is not a valid {name} ({error})") from None
        if not self.pbt.copy_buffer and not hasattr(self.inner, "buffer_size"):
            raise ConfigError(
                f"pbt.copy_buffer: false keeps each member's own replay buffer, and "
                f"{algorithm_of(self.inner).name} has none (only dqn, td3 and sac do)")
        updates = self.inner.num_updates
        if updates < 1:
            raise ConfigError("inner.total_timesteps: the budget holds no whole update")
        if updates % self.pbt.segment_updates:
            raise ConfigError(
                f"pbt.segment_updates: {self.pbt.segment_updates} does not divide the "
                f"{updates} updates of the budget (inner.total_timesteps = "
                f"{self.inner.total_timesteps})")

    @property
    def num_segments(self) -> int:
        return self.inner.num_updates // self.pbt.segment_updates

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form that :func:`pbt_config_from_dict` reads back to an equal config."""
        pbt = {f.name: getattr(self.pbt, f.name) for f in dataclasses.fields(self.pbt)}
        pbt["priors"] = {name: dataclasses.asdict(prior)
                         for name, prior in sorted(self.pbt.priors.items())}
        return plain({"kind": KIND, "name": self.name, "description": self.description,
                      "inner": inner_to_dict(self.inner), "pbt": pbt,
                      "run": dataclasses.asdict(self.run)})

    def replace(self, **changes) -> PBTExperimentConfig:
        return dataclasses.replace(self, **changes)


def _build_pbt(data: Any) -> PBTConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"pbt: expected a table, got {data!r}")
    priors = data.get("priors", {})
    if not isinstance(priors, dict):
        raise ConfigError(f"pbt.priors: expected a table of tables, got {priors!r}")
    built = {name: build_table(Prior, spec, f"pbt.priors.{name}")
             for name, spec in priors.items()}
    try:
        return build_table(PBTConfig, {**data, "priors": built}, "pbt")
    except ConfigError as error:  # PBTConfig's own messages already name pbt.<field>
        raise ConfigError(str(error).replace("pbt.pbt.", "pbt.")) from None


def pbt_config_from_dict(data: dict[str, Any]) -> PBTExperimentConfig:
    """Build and validate a :class:`PBTExperimentConfig` from plain data (``kind`` is
    optional here; if present it must say ``"pbt"``)."""
    data = dict(data)
    kind = data.pop("kind", KIND)
    if kind != KIND:
        raise ConfigError(f"kind: expected {KIND!r} here, got {kind!r}")
    refuse_tables(data, KIND, ("inner", "pbt"))
    kwargs: dict[str, Any] = {}
    if "pbt" in data:
        kwargs["pbt"] = _build_pbt(data.pop("pbt"))
    if "run" in data:
        kwargs["run"] = build_table(RunConfig, data.pop("run"), "run")
    if "inner" in data:
        kwargs["inner"] = single_inner(data.pop("inner"), KIND)
    return build_table(PBTExperimentConfig, {**data, **kwargs}, "")


# --------------------------------------------------------------------------------------
# the population and its segments


class PBTProgram(engine.Program):
    """The learner, mesh and jitted segment of one pbt config (built once per process): the
    program :mod:`~metarl.runs.engine` runs, one segment per step."""

    def __init__(self, config: PBTExperimentConfig, mesh=None):
        from inner_loops.registry import make_learner
        from metarl.sharding import run_mesh

        self.config = config
        self.mesh = run_mesh(config.run.shard, mesh)

        def build():
            try:
                learner = make_learner(config.inner)
            except ValueError as error:
                raise ConfigError(f"inner.{error}" if ":" in str(error) else
                                  f"inner: {error}") from None
            pbt, chunk_size = config.pbt, config.run.chunk_size
            return (learner, make_segment(learner, pbt, chunk_size, mesh),
                    jax.jit(lambda key: initial_population(learner, pbt, key, chunk_size,
                                                           mesh)))

        # traced and compiled once for every program of an equal config in a process
        self.learner, self.segment, self._initial_population = shared_program(
            program_key(config, KIND, mesh), build)
        self.segments = self.steps = config.num_segments
        self.steps_per_segment = self.agent_steps_per_step = (
            config.pbt.population_size * config.pbt.segment_updates
            * self.learner.steps_per_update)

    def init(self) -> dict[str, Any]:
        """The run's state before its first segment: ``states``, ``hypers``, ``key`` (the
        key the segments' keys are split from) and ``segment`` (segments completed)."""
        init_key, key = jax.random.split(jax.random.PRNGKey(self.config.run.seed))
        states, hypers = self._initial_population(init_key)
        state = {"states": states, "hypers": hypers, "key": key,
                 "segment": jnp.zeros((), jnp.int32)}
        if self.mesh is not None:  # where every segment leaves them (one compilation)
            from metarl.sharding import put_replicated

            state.update(put_replicated({"key": key, "segment": state["segment"]}, self.mesh))
        return state

    @staticmethod
    def completed(state: dict[str, Any]) -> int:
        return int(state["segment"])

    def step(self, state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """One segment (no exploit after the last); returns the new state and the
        segment's record (:func:`~metarl.population.pbt.segment_record`) plus the members'
        finiteness."""
        index = int(state["segment"])
        keys = jax.random.split(state["key"], self.segments)
        states, hypers, metrics, fitness, record = self.segment(
            state["states"], state["hypers"], keys[index],
            jnp.asarray(index < self.segments - 1))
        line = segment_record(state["hypers"], metrics, fitness, record)
        line["finite"] = [bool(f) for f in np.asarray(jax.device_get(
            jnp.all(metrics["finite"], axis=-1)))]
        return ({"states": states, "hypers": hypers, "key": state["key"],
                 "segment": state["segment"] + 1}, line)

    def summary(self, segment: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of ``segment``: returns, every member's fitness and
        hyperparameters, the exploit step that followed."""
        from metarl.sharding import num_shards

        fitness = np.asarray(record["fitness"], np.float64)
        updates = segment * self.config.pbt.segment_updates
        return {
            STEP_KEY: segment,
            "updates": updates,
            "steps_per_member": updates * self.learner.steps_per_update,
            "agent_steps": segment * self.steps_per_segment,
            "best_return": finite_stat(np.max, fitness),
            "median_return": finite_stat(np.median, fitness),
            "mean_return": finite_stat(np.mean, fitness),
            "best_member": int(np.nanargmax(np.where(np.isnan(fitness), -np.inf, fitness))),
            **record,
            "exploited": [int(m) for m in np.flatnonzero(record["replaced"])],
            "steps_per_update": self.learner.steps_per_update,
            "devices": num_shards(self.mesh),
        }

    @staticmethod
    def postfix(line: dict[str, Any]) -> dict[str, str]:
        rate = line["agent_steps_per_second"]
        return {"best": f"{line['best_return']:.4g}", "median": f"{line['median_return']:.4g}",
                "steps_per_s": f"{rate:.3g}" if rate else "-"}


@dataclass
class PBTRunResult(SteppedRun):
    """What starting, continuing or reading back a pbt run leaves (:mod:`metarl.kinds`).

    Attributes:
        run_dir: the run directory.
        config: its config.
        program: learner, mesh and jitted segment (:class:`PBTProgram`).
        state: ``states``, ``hypers`` (the population), ``key`` and ``segment``.
        history: one line of ``metrics.jsonl`` per segment.
    """

    @property
    def states(self):
        return self.state["states"]

    @property
    def hypers(self):
        return self.state["hypers"]

    @property
    def best_member(self) -> int:
        """The member with the best fitness in the last segment."""
        return int(np.nanargmax(np.asarray(self.history[-1]["fitness"], np.float64)))


# --------------------------------------------------------------------------------------
# plots and evaluation


def plot_pbt_run(run_dir: str | Path) -> list[Path]:
    """Write ``plots/pbt.png`` (every member's return and hyperparameter schedule, exploit
    events, the winning lineage) from ``metrics.jsonl``; returns the paths written."""
    from metarl.figures.population import plot_pbt

    def draw(config, history):
        algorithm = type(config.inner).__name__.removesuffix("Config")
        best = int(np.nanargmax(np.asarray(history[-1]["fitness"], np.float64)))
        return plot_pbt(history, lineage(history, best),
                        steps_per_update=history[-1].get("steps_per_update"),
                        title=f"{config.name}: PBT of {config.pbt.population_size} "
                              f"{algorithm} members on {config.inner.env_id}, "
                              f"{len(history)} segments")

    return RUN_KIND.plot_history(run_dir, "pbt.png", draw)


def evaluate_pbt_run(run_dir: str | Path, eval_seed: int = 10_007,
                     rerun: bool = False) -> dict[str, Any]:
    """Evaluate the members of a pbt run's newest checkpoint.

    Where the algorithm has a deterministic evaluation (DQN, TD3, SAC:
    ``Learner.evaluate``), every member plays ``inner.eval_episodes`` greedy / mean-action
    episodes; otherwise (PPO) the report holds each member's training return over the last
    segment (``fitness``). Saved as ``evaluations/<n>.json``; an identical evaluation
    (same checkpoint, same seed) is reused unless ``rerun``.
    """
    run_dir = Path(run_dir)
    run = engine.load_run(RUN_KIND, run_dir)
    learner = run.program.learner
    last = run.history[-1]
    segment = int(run.state["segment"])
    method = "deterministic" if learner.evaluate_fn is not None else "training_return"
    spec = {"kind": KIND, "segment": segment, "eval_seed": eval_seed, "method": method,
            "checkpoint_digest": digest(last["fitness"], last["hypers"], segment)}

    def compute() -> dict[str, Any]:
        size = run.config.pbt.population_size
        if method == "deterministic":
            keys = jax.random.split(jax.random.PRNGKey(eval_seed), size)
            metrics = jax.jit(jax.vmap(learner.evaluate))(run.states, keys)
            scores = [float(v) for v in np.asarray(jax.device_get(metrics["eval_return"]))]
        else:
            scores = [float(v) for v in last["fitness"]]
        hypers = jax.device_get(run.hypers)._asdict()
        members = [{"member": m, "return": scores[m],
                    "training_return": float(last["fitness"][m]),
                    "hypers": {name: float(np.asarray(values)[m])
                               for name, values in hypers.items()},
                    "lineage": lineage(run.history, m)} for m in range(size)]
        return {
            "kind": KIND, "method": method, "segment": segment, "eval_seed": eval_seed,
            "episodes": getattr(run.config.inner, "eval_episodes", None) if method ==
            "deterministic" else None,
            "best_member": int(np.nanargmax(np.where(np.isfinite(scores), scores, -np.inf))),
            "mean": finite_stat(np.mean, scores),
            "median": finite_stat(np.median, scores),
            "members": members,
        }

    return saved_evaluation(run_dir, spec, compute, rerun)


def format_pbt_evaluation(report: dict[str, Any]) -> str:
    """Plain-text table of the members, best first."""
    what = ("deterministic return" if report["method"] == "deterministic"
            else "training return (last segment)")
    members = report["members"]
    names = [name for name in (members[0]["hypers"] if members else [])
             if len({m["hypers"][name] for m in members}) > 1]  # those the members vary in
    deterministic = report["method"] == "deterministic"
    rows = [("member", what, *(["training return"] if deterministic else []), *names)]
    ranked = sorted(members, key=lambda m: -np.nan_to_num(m["return"], nan=-np.inf))
    for member in ranked:
        rows.append((str(member["member"]), f"{member['return']:.2f}",
                     *([f"{member['training_return']:.2f}"] if deterministic else []),
                     *(f"{member['hypers'][n]:.4g}" for n in names)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    note = "" if report["method"] == "deterministic" else (
        "\n(this algorithm has no deterministic evaluation: the scores are each member's "
        "training return over the last segment)")
    return "\n".join(lines) + note


def describe_pbt_segment(line: dict[str, Any]) -> str:
    return (f"segments: {line['segment']}  agent-steps: {line['agent_steps']:,}  last "
            f"segment's returns: best {line['best_return']:.4g} (member "
            f"{line['best_member']}), median {line['median_return']:.4g}")


RUN_KIND = RunKind(
    name=KIND, step_key=STEP_KEY, from_dict=pbt_config_from_dict, build=PBTProgram,
    result=PBTRunResult, plot=plot_pbt_run, evaluate=evaluate_pbt_run,
    format_evaluation=format_pbt_evaluation, describe=describe_pbt_segment,
    advice="Check the priors' bounds and the [inner] settings")
