"""Run kind "evolve": start, continue and read back meta-evolution runs.

A run directory holds the files of :mod:`metarl.runs.layout` (config, config history,
metrics, status, lock, checkpoints, evaluations, plots) and, for evolution::

    best_meta_params.msgpack   best candidate so far (flax msgpack)
    mean_meta_params.msgpack   current centre of the search distribution

:func:`evolve` starts a run, :func:`resume` continues one by the rules of
:mod:`metarl.runs.resume` (from its newest usable checkpoint, or from the beginning when it
never reached one), :func:`load_run` reads one back for evaluation and plots. Both
:func:`evolve` and :func:`resume` hold the directory's lock while they write
(:mod:`metarl.runs.lock`), and stop with :class:`RunStopped` when every candidate has been
invalid for ``run.max_invalid_generations`` generations in a row.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization
from tqdm.auto import tqdm

from metarl import distributed
from metarl.config import (
    ConfigError,
    ExperimentConfig,
    config_from_dict,
    read_config_data,
    upgrade_saved_config,
)
from metarl.evolution import Evolution, EvolutionState
from metarl.runs import config_history
from metarl.runs import start as runs_start
from metarl.runs.checkpoint import DamagedCheckpoint, RunCheckpointer
from metarl.runs.layout import (
    CONFIG_FILE,
    METRICS_FILE,
    CheckpointError,
    RunError,
    RunStopped,
    atomic_write,
    now,
    read_metrics,
    remove_stale_temporaries,
    write_json,
    write_metrics,
    write_status,
)
from metarl.runs.lock import hold_run_lock
from metarl.runs.resume import find_resume_point, notify
from metarl.runs.start import started_run
from metarl.sharding import num_shards
from metarl.trackers import RunTrackers, check_trackers

BEST_FILE = "best_meta_params.msgpack"
MEAN_FILE = "mean_meta_params.msgpack"
# what may change when a run continues: the budget, and where its metrics are sent
BUDGET_FIELDS = ("es.generations", "run.trackers")

__all__ = [
    "BEST_FILE", "CONFIG_FILE", "MEAN_FILE", "METRICS_FILE", "CheckpointError", "RunError",
    "RunResult", "RunStopped", "evolve", "load_meta_params", "load_run", "new_run_dir",
    "read_metrics", "read_run_config", "resume", "save_meta_params",
]


@dataclass
class RunResult:
    """What a finished (or interrupted) call to :func:`evolve` / :func:`resume` leaves."""

    run_dir: Path
    config: ExperimentConfig
    evolution: Evolution
    state: EvolutionState
    history: list[dict[str, Any]] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)  # drawn at the end for the trackers

    @property
    def best_meta_params(self):
        return jax.device_get(self.state.best_meta_params)

    @property
    def mean_meta_params(self):
        return jax.device_get(self.evolution.mean_meta_params(self.state))


def save_meta_params(path: str | Path, meta_params) -> None:
    """Write meta-parameters (a pytree of arrays) as flax msgpack, atomically."""
    arrays = jax.tree.map(np.asarray, jax.device_get(meta_params))
    atomic_write(Path(path), serialization.msgpack_serialize(
        serialization.to_state_dict(arrays)
    ))


def load_meta_params(path: str | Path, template=None):
    """Read meta-parameters written by :func:`save_meta_params`.

    With a ``template`` (e.g. ``objective.init(key)``) the result has its exact structure;
    without one, lists come back as dicts keyed ``"0"``, ``"1"``, ...
    """
    path = Path(path)
    if not path.is_file():
        raise RunError(f"no meta-parameters file at {path}")
    raw = serialization.msgpack_restore(path.read_bytes())
    if template is None:
        return raw
    return serialization.from_state_dict(template, raw)


def new_run_dir(config: ExperimentConfig) -> Path:
    """A fresh directory ``<output_dir>/<name>-<timestamp>`` (suffixed if it exists)."""
    return runs_start.new_run_dir(config.run.output_dir, config.name)


def normalized_config(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config in today's form (defaults filled in, old spellings upgraded), so that
    comparing two configs finds only real differences."""
    data = upgrade_saved_config(data)
    try:
        return config_from_dict(data).to_dict()
    except ConfigError:
        return data


def _summary(generation: int, metrics: dict, state: EvolutionState, seconds: float,
             evolution: Evolution, total_steps: int) -> dict[str, Any]:
    metrics = jax.device_get(metrics)
    fitness = np.asarray(metrics["fitness"], np.float64)
    valid = np.asarray(metrics["valid"], bool)
    good = fitness[valid]
    steps = evolution.agent_steps_per_generation

    def stat(fn):
        return float(fn(good)) if good.size else math.nan

    return {
        "generation": generation,
        "fitness": [float(f) for f in fitness],
        "valid": [bool(v) for v in valid],
        "best_fitness": stat(np.max),
        "mean_fitness": stat(np.mean),
        "std_fitness": stat(np.std),
        "best_fitness_so_far": float(state.best_fitness),
        "invalid_candidates": int((~valid).sum()),
        "invalid_runs": int(metrics["invalid_runs"]),
        "mean_return": {
            inner.env_id: float(np.nanmean(metrics["returns"][:, e])) if valid.any() else None
            for e, inner in enumerate(evolution.config.inner)
        },
        "agent_steps": total_steps,
        "devices": num_shards(evolution.mesh),
        "seconds": seconds,
        "agent_steps_per_second": steps / seconds if seconds > 0 else None,
    }


def invalid_streak(history: list[dict[str, Any]]) -> int:
    """Generations at the end of ``history`` in which every candidate was invalid."""
    streak = 0
    for line in reversed(history):
        if any(line.get("valid", [True])):
            break
        streak += 1
    return streak


def _run_generations(evolution: Evolution, state: EvolutionState, run_dir: Path,
                     history: list[dict], events: list[dict], until: int) -> RunResult:
    config = evolution.config
    checkpointer = RunCheckpointer(run_dir, keep=config.run.keep_checkpoints)
    start = int(state.generation)
    primary = distributed.is_primary()  # only process 0 writes files and shows progress
    limit = config.run.max_invalid_generations
    trackers = RunTrackers(config.run.trackers, run_dir, run_dir.name, config.to_dict(),
                           primary)
    bar = tqdm(total=until, initial=start, desc=config.name, unit="gen",
               disable=not (config.run.progress and primary), dynamic_ncols=True)
    total_steps = history[-1]["agent_steps"] if history else 0
    stopped = None
    plots: list[Path] = []
    try:
        try:
            for generation in range(start + 1, until + 1):
                started = time.perf_counter()
                state, metrics = evolution.step(state)
                jax.block_until_ready(state)
                seconds = time.perf_counter() - started
                total_steps += evolution.agent_steps_per_generation
                line = _summary(generation, metrics, state, seconds, evolution, total_steps)
                history.append(line)
                trackers.log(generation, line)
                if limit and invalid_streak(history) >= limit:
                    stopped = generation
                mean = evolution.mean_meta_params(state)  # a JAX computation: every process
                if primary:
                    write_metrics(run_dir, history, events)
                    save_meta_params(run_dir / BEST_FILE, state.best_meta_params)
                    save_meta_params(run_dir / MEAN_FILE, mean)
                # every process calls save: orbax synchronises them and process 0 writes
                if (generation % config.run.checkpoint_every == 0 or generation == until
                        or stopped):
                    meta = {"config": config.to_dict(), "history": history, "events": events}
                    checkpointer.save(generation, state, meta)
                bar.update(1)
                bar.set_postfix(
                    best=f"{line['best_fitness']:.4g}",
                    mean=f"{line['mean_fitness']:.4g}",
                    steps_per_s=f"{line['agent_steps_per_second']:.3g}",
                    invalid=line["invalid_candidates"],
                )
                if stopped:
                    break
        finally:
            bar.close()
            checkpointer.close()
        if stopped:
            message = (
                f"stopped after generation {stopped}: every candidate was invalid (NaN or "
                f"infinite returns) in the last {limit} generations "
                f"(run.max_invalid_generations = {limit}). Its checkpoints are kept in "
                f"{run_dir / 'checkpoints'}. Check the config's settings (learning rates, "
                f"es.sigma, ...); `metarl resume {run_dir}` continues it"
            )
            if primary:
                write_status(run_dir, "stopped", generation=stopped, message=message)
            raise RunStopped(message)
        if primary:
            write_status(run_dir, "finished", generation=until)
        if trackers:
            from metarl.plots import plot_run

            plots = plot_run(run_dir)
            trackers.log_figures(until, plots)
    finally:
        trackers.close()
    return RunResult(run_dir, config, evolution, state, history, plots)


def _initial_state(evolution: Evolution) -> EvolutionState:
    config = evolution.config
    baselines = None
    if config.fitness.normalize_by_baseline and not config.fitness.baseline_returns:
        baselines = evolution.measure_baselines(jax.random.PRNGKey(config.run.seed + 1))
    return evolution.init(baselines=baselines)


def evolve(config: ExperimentConfig, run_dir: str | Path | None = None) -> RunResult:
    """Start a new run of ``config`` in ``run_dir`` (a fresh directory by default).

    Raises :class:`RunError` if the directory holds another run or another process is
    writing it, and :class:`RunStopped` when the run stops itself.
    """
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    run_dir = Path(distributed.agree(str(run_dir)))  # process 0's clock names the directory
    evolution = Evolution(config)  # checks the config fully before anything is written
    check_trackers(config.run.trackers)
    with started_run(run_dir, config.to_dict(), command=f"metarl evolve --run-dir {run_dir}",
                     normalize=normalized_config, budget_fields=BUDGET_FIELDS):
        state = _initial_state(evolution)
        return _run_generations(evolution, state, run_dir, [], [], config.es.generations)


def read_run_config(run_dir: str | Path) -> ExperimentConfig:
    """The resolved config a run was started with."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise RunError(f"{run_dir} is not a metarl run: it has no {CONFIG_FILE}")
    return config_from_dict(upgrade_saved_config(read_config_data(run_dir / CONFIG_FILE)))


def _check_generation(step: int, state: EvolutionState, meta: dict[str, Any]) -> None:
    if int(state.generation) != step:
        raise DamagedCheckpoint(step, f"it holds generation {int(state.generation)}")
    if not any(line.get("generation") == step for line in meta["history"]):
        raise DamagedCheckpoint(step, "its history lacks that generation")


def _find_checkpoint(run_dir: Path, evolution: Evolution, *, accept: bool, writer: bool):
    checkpointer = RunCheckpointer(run_dir, keep=evolution.config.run.keep_checkpoints)
    try:
        return find_resume_point(
            run_dir, checkpointer, evolution.init(), config=evolution.config.to_dict(),
            normalize=normalized_config, budget_fields=BUDGET_FIELDS,
            accept_config_change=accept, writer=writer, validate=_check_generation)
    finally:
        checkpointer.close()


def resume(run_dir: str | Path, generations: int | None = None,
           accept_config_change: bool = False,
           trackers: tuple[str, ...] | None = None) -> RunResult:
    """Continue ``run_dir`` from its newest usable checkpoint (:mod:`metarl.runs.resume`).

    Runs until ``generations`` generations are complete in total (the config's
    ``es.generations`` by default; a new budget is written to ``config.json`` and the config
    history). A run that never reached a checkpoint starts from the beginning. If
    ``config.json`` differs from the config saved in the checkpoint in more than the budget,
    the resume is refused (:class:`~metarl.runs.config_history.ConfigChangedError`) unless
    ``accept_config_change``, which records the change in ``metrics.jsonl`` and
    ``config_history.jsonl``. Nothing in the directory is overwritten before the checkpoint
    has been restored; damaged checkpoints are moved to ``damaged-checkpoints/``.
    ``trackers`` replaces ``run.trackers`` from here on (recorded like a new budget).
    """
    run_dir = Path(run_dir)
    read_run_config(run_dir)  # a missing directory or config is reported before locking
    with hold_run_lock(run_dir, f"metarl resume {run_dir}"):
        config = read_run_config(run_dir)
        evolution = Evolution(config)
        check_trackers(config.run.trackers if trackers is None else trackers)
        found = _find_checkpoint(run_dir, evolution, accept=accept_config_change, writer=True)
        if found is None:
            notify(f"{run_dir} has no complete checkpoint (the run stopped before its first "
                   "one, so nothing was lost): starting it from the beginning")
            generation, state, history, events = 0, _initial_state(evolution), [], []
        else:
            generation, state = found.step, found.state
            history = [line for line in found.meta["history"]
                       if line["generation"] <= generation]
            events = [event for event in found.meta.get("events", [])
                      if event.get("after_step", 0) <= generation]
            if found.skipped:
                notify(f"resuming {run_dir} from checkpoint {generation}, the newest one "
                       "that reads back")
        until = generations if generations is not None else config.es.generations
        if until < generation:
            raise RunError(f"generations: the run already has {generation} generations "
                           f"(> {until})")
        budget_change = until != config.es.generations
        if budget_change:
            old_budget = config.es.generations
            config = config.replace(es=dataclasses.replace(config.es, generations=until))
            evolution.config = config  # es.generations shapes nothing that was compiled
        tracker_change = trackers is not None and tuple(trackers) != config.run.trackers
        if tracker_change:
            old_trackers = list(config.run.trackers)
            config = config.replace(run=dataclasses.replace(config.run,
                                                            trackers=tuple(trackers)))
            evolution.config = config
        if distributed.is_primary():
            remove_stale_temporaries(run_dir)
            if found is not None and found.changes:
                changes = config_history.change_record(found.changes)
                events.append({"event": "config_change", "after_step": generation,
                               "time": now(), "changes": changes})
                config_history.record(run_dir, "config_change", after_step=generation,
                                      changes=changes, config=config.to_dict())
                notify(f"continuing with a changed config (accepted, recorded in "
                       f"{METRICS_FILE} and {config_history.CONFIG_HISTORY_FILE}): "
                       f"{config_history.format_changes(found.changes)}")
            if budget_change:
                config_history.record(run_dir, "budget", after_step=generation,
                                      changes=[{"field": "es.generations",
                                                "old": old_budget, "new": until}])
            if tracker_change:
                config_history.record(run_dir, "trackers", after_step=generation,
                                      changes=[{"field": "run.trackers", "old": old_trackers,
                                                "new": list(trackers)}])
            if budget_change or tracker_change:
                write_json(run_dir / CONFIG_FILE, config.to_dict(), run_dir)
            write_metrics(run_dir, history, events)
            write_status(run_dir, "running", resumed=now())
        _warn_if_devices_changed(run_dir, history, num_shards(evolution.mesh))
        return _run_generations(evolution, state, run_dir, history, events, until)


def _warn_if_devices_changed(run_dir: Path, history: list[dict], devices: int) -> None:
    """Sharded results agree across device counts only to float rounding, which training
    amplifies, so a run resumed on another count no longer repeats itself exactly."""
    before = history[-1].get("devices") if history else None
    if before is not None and before != devices:
        warnings.warn(
            f"{run_dir} ran on {before} device(s) and resumes on {devices}: it will match an "
            "uninterrupted run only to float rounding, which training amplifies. To continue "
            f"it exactly, resume on {before} device(s) (e.g. `metarl --cpu-devices {before} "
            "resume ...` on a CPU).",
            UserWarning, stacklevel=3,
        )


def load_run(run_dir: str | Path) -> RunResult:
    """Read a run back (newest usable checkpoint, config and metrics) without running or
    changing anything; damaged checkpoints are skipped with a warning."""
    run_dir = Path(run_dir)
    evolution = Evolution(read_run_config(run_dir))
    found = _find_checkpoint(run_dir, evolution, accept=True, writer=False)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {run_dir / 'checkpoints'}")
    return RunResult(run_dir, evolution.config, evolution, found.state,
                     list(found.meta["history"]))
