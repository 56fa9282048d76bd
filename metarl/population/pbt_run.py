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
whole population (states, hyperparameters, key, segment index) so that :func:`resume_pbt`
continues bit for bit. :func:`run_pbt` starts a run, :func:`resume_pbt` continues one,
:func:`load_pbt_run` reads one back, :func:`plot_pbt_run` draws it and
:func:`evaluate_pbt_run` evaluates its final members.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metarl import distributed
from metarl.config import (
    ConfigError,
    RunConfig,
    _build,
    _build_inner,
    _coerce,
    _plain,
    apply_overrides,
    default_inner_config,
    read_config_data,
    upgrade_saved_config,
)
from metarl.population.pbt import (
    PBTConfig,
    initial_population,
    lineage,
    make_segment,
    segment_record,
)
from metarl.population.priors import Prior
from metarl.runs import config_history
from metarl.runs import start as runs_start
from metarl.runs.checkpoint import DamagedCheckpoint, RunCheckpointer, score_of_line
from metarl.runs.evaluations import find_same, save_record
from metarl.runs.layout import (
    CONFIG_FILE,
    PLOTS_DIR,
    CheckpointError,
    RunError,
    RunStopped,
    now,
    read_metrics,
    remove_stale_temporaries,
    write_metrics,
    write_status,
)
from metarl.runs.lock import hold_run_lock
from metarl.runs.resume import find_resume_point, notify
from metarl.runs.start import started_run

KIND = "pbt"
STEP_KEY = "segment"
BUDGET_FIELDS = ()  # the budget (inner.total_timesteps) sets schedules: it may not change

__all__ = ["PBTExperimentConfig", "PBTRunResult", "evaluate_pbt_run", "load_pbt_config",
           "load_pbt_run", "pbt_config_from_dict", "plot_pbt_run", "resume_pbt", "run_pbt"]


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
        hyper_fields = _hyperparameter_fields(self.inner)
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
        from inner_loops.registry import algorithm_of

        inner = {"algorithm": algorithm_of(self.inner).name,
                 **dataclasses.asdict(self.inner), "env_params": dict(self.inner.env_params)}
        pbt = {f.name: getattr(self.pbt, f.name) for f in dataclasses.fields(self.pbt)}
        pbt["priors"] = {name: dataclasses.asdict(prior)
                         for name, prior in sorted(self.pbt.priors.items())}
        return _plain({"kind": KIND, "name": self.name, "description": self.description,
                       "inner": inner, "pbt": pbt, "run": dataclasses.asdict(self.run)})

    def replace(self, **changes) -> PBTExperimentConfig:
        return dataclasses.replace(self, **changes)


def _hyperparameter_fields(inner) -> tuple[str, ...]:
    """The traced hyperparameters of ``inner``'s algorithm, read off its ``Hyperparams``
    class (building them would start JAX)."""
    cls = getattr(type(inner), "hyperparams_class", None)
    if cls is None:
        cls = getattr(sys.modules[type(inner).__module__], "Hyperparams", None)
    return tuple(getattr(cls, "_fields", ()))


def _build_pbt(data: Any) -> PBTConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"pbt: expected a table, got {data!r}")
    data = dict(data)
    priors = data.pop("priors", {})
    if not isinstance(priors, dict):
        raise ConfigError(f"pbt.priors: expected a table of tables, got {priors!r}")
    built = {name: _build(Prior, spec, f"pbt.priors.{name}") for name, spec in priors.items()}
    names = [f.name for f in dataclasses.fields(PBTConfig)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"pbt.{unknown[0]}: unknown field; allowed: {', '.join(names)}")
    hints = {"population_size": int, "segment_updates": int, "fitness_window": int,
             "exploit_fraction": float, "explore": str, "perturb_factors": tuple[float, ...],
             "reseed_copies": bool}
    kwargs = {name: _coerce(f"pbt.{name}", value, hints[name]) for name, value in data.items()}
    try:
        return PBTConfig(**kwargs, priors=built)
    except ValueError as error:  # PBTConfig's messages already name pbt.<field>
        raise ConfigError(str(error)) from None


def pbt_config_from_dict(data: dict[str, Any]) -> PBTExperimentConfig:
    """Build and validate a :class:`PBTExperimentConfig` from plain data (``kind`` is
    optional here; if present it must say ``"pbt"``)."""
    data = dict(data)
    kind = data.pop("kind", KIND)
    if kind != KIND:
        raise ConfigError(f"kind: expected {KIND!r} here, got {kind!r}")
    kwargs: dict[str, Any] = {}
    if "pbt" in data:
        kwargs["pbt"] = _build_pbt(data.pop("pbt"))
    if "run" in data:
        kwargs["run"] = _build(RunConfig, data.pop("run"), "run")
    if "inner" in data:
        inner = data.pop("inner")
        if isinstance(inner, list):
            if len(inner) != 1:
                raise ConfigError(f"inner: a pbt experiment trains one algorithm on one "
                                  f"environment; got {len(inner)} [[inner]] tables")
            inner = inner[0]
        kwargs["inner"] = _build_inner(inner, "inner")
    for name in ("es", "fitness", "objective"):
        if name in data:
            raise ConfigError(f"{name}: a pbt experiment has no [{name}] table (it has "
                              "[inner], [pbt] and [run])")
    return _build(PBTExperimentConfig, {**data, **kwargs}, "")


def load_pbt_config(path: str | Path, overrides: list[str] | None = None
                    ) -> PBTExperimentConfig:
    """Load, override (``--set`` style) and validate a pbt experiment file."""
    return pbt_config_from_dict(apply_overrides(read_config_data(path), overrides or []))


def normalized_config(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config with defaults filled in, so comparing two finds only real changes."""
    data = upgrade_saved_config(data)
    try:
        return pbt_config_from_dict(data).to_dict()
    except ConfigError:
        return data


def read_pbt_config(run_dir: str | Path) -> PBTExperimentConfig:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise RunError(f"{run_dir} is not a metarl run: it has no {CONFIG_FILE}")
    return pbt_config_from_dict(upgrade_saved_config(read_config_data(run_dir / CONFIG_FILE)))


# --------------------------------------------------------------------------------------
# the population and its segments


class PBTProgram:
    """The learner, mesh and jitted segment of one pbt config (built once per process)."""

    def __init__(self, config: PBTExperimentConfig, mesh=None):
        from inner_loops.registry import make_learner
        from metarl.sharding import population_mesh

        self.config = config
        try:
            self.learner = make_learner(config.inner)
        except ValueError as error:
            raise ConfigError(f"inner.{error}" if ":" in str(error) else
                              f"inner: {error}") from None
        if mesh is None and config.run.shard:
            mesh = population_mesh()
        if mesh is not None and mesh.devices.size == 1:
            mesh = None  # one device: exactly the unsharded program
        self.mesh = mesh
        self.segments = config.num_segments
        self.segment = make_segment(self.learner, config.pbt, config.run.chunk_size, mesh)
        self.steps_per_segment = (config.pbt.population_size * config.pbt.segment_updates
                                  * self.learner.steps_per_update)

    def init(self) -> dict[str, Any]:
        """The run's state before its first segment: ``states``, ``hypers``, ``key`` (the
        key the segments' keys are split from) and ``segment`` (segments completed)."""
        init_key, key = jax.random.split(jax.random.PRNGKey(self.config.run.seed))
        states, hypers = initial_population(self.learner, self.config.pbt, init_key,
                                            self.config.run.chunk_size, self.mesh)
        state = {"states": states, "hypers": hypers, "key": key,
                 "segment": jnp.zeros((), jnp.int32)}
        if self.mesh is not None:  # where every segment leaves them (one compilation)
            from metarl.sharding import put_replicated

            state.update(put_replicated({"key": key, "segment": state["segment"]}, self.mesh))
        return state

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


@dataclass
class PBTRunResult:
    """What :func:`run_pbt` / :func:`resume_pbt` / :func:`load_pbt_run` leave.

    Attributes:
        run_dir: the run directory.
        config: its config.
        program: learner, mesh and jitted segment.
        state: ``states``, ``hypers`` (the population), ``key`` and ``segment``.
        history: one line of ``metrics.jsonl`` per segment.
    """

    run_dir: Path
    config: PBTExperimentConfig
    program: PBTProgram
    state: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)

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


def _stat(fn, values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(fn(finite)) if finite.size else math.nan


def _summary(segment: int, record: dict[str, Any], program: PBTProgram, seconds: float,
             best_so_far: float) -> dict[str, Any]:
    fitness = np.asarray(record["fitness"], np.float64)
    updates = segment * program.config.pbt.segment_updates
    from metarl.sharding import num_shards

    return {
        STEP_KEY: segment,
        "updates": updates,
        "steps_per_member": updates * program.learner.steps_per_update,
        "agent_steps": segment * program.steps_per_segment,
        "best_return": _stat(np.max, fitness),
        "median_return": _stat(np.median, fitness),
        "mean_return": _stat(np.mean, fitness),
        "best_return_so_far": float(np.nanmax([best_so_far, _stat(np.max, fitness)])),
        "best_member": int(np.nanargmax(np.where(np.isnan(fitness), -np.inf, fitness))),
        **record,
        "exploited": [int(m) for m in np.flatnonzero(record["replaced"])],
        "steps_per_update": program.learner.steps_per_update,
        "devices": num_shards(program.mesh),
        "seconds": seconds,
        "agent_steps_per_second": program.steps_per_segment / seconds if seconds > 0 else None,
    }


def _invalid_streak(history: list[dict[str, Any]]) -> int:
    streak = 0
    for line in reversed(history):
        if any(line.get("finite", [True])):
            break
        streak += 1
    return streak


def _score(line: dict[str, Any]) -> float:
    return score_of_line(line, "best_return")


def _checkpointer(run_dir: Path, config: PBTExperimentConfig) -> RunCheckpointer:
    return RunCheckpointer(run_dir, keep=config.run.keep_checkpoints, step_key=STEP_KEY,
                           score=_score)


def _run_segments(program: PBTProgram, state: dict[str, Any], run_dir: Path,
                  history: list[dict], events: list[dict]) -> PBTRunResult:
    from tqdm.auto import tqdm

    config = program.config
    until = program.segments
    checkpointer = _checkpointer(run_dir, config)
    start = int(state["segment"])
    primary = distributed.is_primary()
    limit = config.run.max_invalid_generations
    best_so_far = history[-1]["best_return_so_far"] if history else -math.inf
    bar = tqdm(total=until, initial=start, desc=config.name, unit="segment",
               disable=not (config.run.progress and primary), dynamic_ncols=True)
    trackers = _open_trackers(run_dir, config) if primary else []
    stopped = None
    try:
        for segment in range(start + 1, until + 1):
            started = time.perf_counter()
            state, record = program.step(state)
            jax.block_until_ready(state)
            seconds = time.perf_counter() - started
            line = _summary(segment, record, program, seconds, best_so_far)
            best_so_far = line["best_return_so_far"]
            history.append(line)
            if limit and _invalid_streak(history) >= limit:
                stopped = segment
            if primary:
                write_metrics(run_dir, history, events, step_key=STEP_KEY)
                for tracker in trackers:
                    tracker.log(segment, {k: v for k, v in line.items() if k != "returns"})
            if segment % config.run.checkpoint_every == 0 or segment == until or stopped:
                meta = {"config": config.to_dict(), "history": history, "events": events}
                checkpointer.save(segment, state, meta)
            rate = line["agent_steps_per_second"]
            bar.set_postfix(segment=f"{segment}/{until}", best=f"{line['best_return']:.4g}",
                            median=f"{line['median_return']:.4g}",
                            steps_per_s=f"{rate:.3g}" if rate else "-", refresh=False)
            bar.update(1)
            if stopped:
                break
    finally:
        bar.close()
        checkpointer.close()
        for tracker in trackers:
            tracker.close()
    if stopped:
        message = (
            f"stopped after segment {stopped}: every member's losses were non-finite in the "
            f"last {limit} segments (run.max_invalid_generations = {limit}). Its checkpoints "
            f"are kept in {run_dir / 'checkpoints'}. Check the priors' bounds and the "
            f"[inner] settings; `metarl resume {run_dir}` continues it")
        if primary:
            write_status(run_dir, "stopped", generation=stopped, segment=stopped,
                         message=message)
        raise RunStopped(message)
    if primary:
        write_status(run_dir, "finished", generation=until, segment=until, budget=until)
    return PBTRunResult(run_dir, config, program, state, history)


def _open_trackers(run_dir: Path, config: PBTExperimentConfig) -> list:
    """The experiment trackers ``run.trackers`` names (:mod:`metarl.trackers`), each sent
    every segment's summary; none when the run config has no such field or names none."""
    names = tuple(getattr(config.run, "trackers", ()) or ())
    if not names:
        return []
    from metarl.trackers import TrackerError, open_trackers

    try:
        return open_trackers(names, run_dir, config.name, config.to_dict())
    except TrackerError as error:
        raise ConfigError(f"run.trackers: {error}") from None


def new_run_dir(config: PBTExperimentConfig) -> Path:
    """A fresh directory ``<output_dir>/<name>-<timestamp>`` (suffixed if it exists)."""
    return runs_start.new_run_dir(config.run.output_dir, config.name)


def run_pbt(config: PBTExperimentConfig, run_dir: str | Path | None = None,
            mesh=None) -> PBTRunResult:
    """Start a new pbt run of ``config`` in ``run_dir`` (a fresh directory by default).

    Raises :class:`RunError` if the directory holds another run or another process is
    writing it, and :class:`RunStopped` when the run stops itself.
    """
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    run_dir = Path(distributed.agree(str(run_dir)))
    program = PBTProgram(config, mesh)  # checks the config fully before anything is written
    with started_run(run_dir, config.to_dict(), command=f"metarl run --run-dir {run_dir}",
                     normalize=normalized_config, budget_fields=BUDGET_FIELDS, kind=KIND,
                     budget=program.segments):
        return _run_segments(program, program.init(), run_dir, [], [])


def _check_segment(step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
    if int(state["segment"]) != step:
        raise DamagedCheckpoint(step, f"it holds segment {int(state['segment'])}")
    if not any(line.get(STEP_KEY) == step for line in meta["history"]):
        raise DamagedCheckpoint(step, "its history lacks that segment")


def _find_checkpoint(run_dir: Path, program: PBTProgram, *, accept: bool, writer: bool):
    checkpointer = _checkpointer(run_dir, program.config)
    template = program.init()  # real arrays: their shardings are where the restore goes
    try:
        return find_resume_point(
            run_dir, checkpointer, template, config=program.config.to_dict(),
            normalize=normalized_config, budget_fields=BUDGET_FIELDS,
            accept_config_change=accept, writer=writer, validate=_check_segment)
    finally:
        checkpointer.close()


def resume_pbt(run_dir: str | Path, accept_config_change: bool = False,
               mesh=None) -> PBTRunResult:
    """Continue a pbt run from its newest usable checkpoint (:mod:`metarl.runs.resume`).

    A run that never reached a checkpoint starts from the beginning; a finished run is
    returned as it is. The budget cannot be extended: ``inner.total_timesteps`` sets the
    members' schedules (learning-rate annealing, exploration, training progress), so a
    longer run is another experiment; changing it is refused like any other change unless
    ``accept_config_change``.
    """
    run_dir = Path(run_dir)
    read_pbt_config(run_dir)  # a missing directory or config is reported before locking
    with hold_run_lock(run_dir, f"metarl resume {run_dir}"):
        config = read_pbt_config(run_dir)
        program = PBTProgram(config, mesh)
        found = _find_checkpoint(run_dir, program, accept=accept_config_change, writer=True)
        if found is None:
            notify(f"{run_dir} has no complete checkpoint (the run stopped before its first "
                    "one, so nothing was lost): starting it from the beginning")
            state, history, events = program.init(), [], []
        else:
            step, state = found.step, found.state
            history = [line for line in found.meta["history"] if line[STEP_KEY] <= step]
            events = [event for event in found.meta.get("events", [])
                      if event.get("after_step", 0) <= step]
            if found.skipped:
                notify(f"resuming {run_dir} from checkpoint {step}, the newest one that "
                        "reads back")
            if step >= program.segments:
                notify(f"{run_dir} has finished its {program.segments} segments; nothing "
                        "to continue (a pbt run's budget, inner.total_timesteps, shapes its "
                        "members' schedules: start a new run to train longer)")
        if distributed.is_primary():
            remove_stale_temporaries(run_dir)
            if found is not None and found.changes:
                changes = config_history.change_record(found.changes)
                events.append({"event": "config_change", "after_step": found.step,
                               "time": now(), "changes": changes})
                config_history.record(run_dir, "config_change", after_step=found.step,
                                      changes=changes, config=config.to_dict())
                notify("continuing with a changed config (accepted, recorded): "
                        f"{config_history.format_changes(found.changes)}")
            write_metrics(run_dir, history, events, step_key=STEP_KEY)
            write_status(run_dir, "running", resumed=now(), kind=KIND,
                         budget=program.segments)
        return _run_segments(program, state, run_dir, history, events)


def load_pbt_run(run_dir: str | Path) -> PBTRunResult:
    """Read a pbt run back (newest usable checkpoint, config and history) without running
    or changing anything; damaged checkpoints are skipped with a warning."""
    run_dir = Path(run_dir)
    program = PBTProgram(read_pbt_config(run_dir))
    found = _find_checkpoint(run_dir, program, accept=True, writer=False)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {run_dir / 'checkpoints'}")
    return PBTRunResult(run_dir, program.config, program, found.state,
                        list(found.meta["history"]))


# --------------------------------------------------------------------------------------
# plots and evaluation


def plot_pbt_run(run_dir: str | Path) -> list[Path]:
    """Write ``plots/pbt.png`` (every member's return and hyperparameter schedule, exploit
    events, the winning lineage) from ``metrics.jsonl``; returns the paths written."""
    from metarl.plots import plot_pbt

    run_dir = Path(run_dir)
    config = read_pbt_config(run_dir)
    history = read_metrics(run_dir)
    if not history:
        raise RunError(f"{run_dir} has no finished segment yet (metrics.jsonl is empty)")
    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    algorithm = type(config.inner).__name__.removesuffix("Config")
    fig = plot_pbt(history, steps_per_update=history[-1].get("steps_per_update"),
                   title=f"{config.name}: PBT of {config.pbt.population_size} {algorithm} "
                         f"members on {config.inner.env_id}, {len(history)} segments")
    path = out / "pbt.png"
    fig.savefig(path, dpi=110)
    return [path]


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
    run = load_pbt_run(run_dir)
    learner = run.program.learner
    last = run.history[-1]
    segment = int(run.state["segment"])
    digest = hashlib.sha256(json.dumps(
        [last["fitness"], last["hypers"], segment]).encode()).hexdigest()
    method = "deterministic" if learner.evaluate_fn is not None else "training_return"
    spec = {"kind": KIND, "segment": segment, "eval_seed": eval_seed, "method": method,
            "checkpoint_digest": digest}
    earlier = find_same(run_dir, spec)
    if earlier is not None and not rerun:
        return {**earlier, "reused": True}
    size = run.config.pbt.population_size
    if method == "deterministic":
        keys = jax.random.split(jax.random.PRNGKey(eval_seed), size)
        metrics = jax.jit(jax.vmap(learner.evaluate))(run.states, keys)
        scores = [float(v) for v in np.asarray(jax.device_get(metrics["eval_return"]))]
    else:
        scores = [float(v) for v in last["fitness"]]
    hypers = jax.device_get(run.hypers)._asdict()
    members = [{"member": m, "return": scores[m], "training_return": float(last["fitness"][m]),
                "hypers": {name: float(np.asarray(values)[m]) for name, values in hypers.items()},
                "lineage": lineage(run.history, m)} for m in range(size)]
    finite = np.asarray([s for s in scores if math.isfinite(s)], np.float64)
    report = {
        "run_dir": str(run_dir), "created": now(), "kind": KIND, "method": method,
        "segment": segment, "eval_seed": eval_seed, "spec": spec,
        "episodes": getattr(run.config.inner, "eval_episodes", None) if method ==
        "deterministic" else None,
        "best_member": int(np.nanargmax(np.where(np.isfinite(scores), scores, -np.inf))),
        "mean": float(finite.mean()) if finite.size else math.nan,
        "median": float(np.median(finite)) if finite.size else math.nan,
        "members": members,
    }
    replace = earlier["path"] if earlier is not None and earlier["id"] != "legacy" else None
    path = save_record(run_dir, report, replace=replace)
    return {**report, "path": str(path), "id": int(path.stem), "reused": False,
            "replaced": replace is not None}


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
