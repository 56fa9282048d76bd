"""Run kinds that train a population step by step -- PBT's segments, CEM-RL's generations,
DvD's segments -- in a run directory, all in the same way.

A run kind describes itself with a :class:`SteppedKind` and builds a *program* from its
config. The program has:

- ``config``: the experiment config (``name``, ``run`` -- a
  :class:`~metarl.config.RunConfig` --, ``to_dict()``);
- ``steps``: the steps of the budget;
- ``init() -> state``: the state (a pytree of arrays) before the first step;
- ``completed(state) -> int``: the steps ``state`` has done;
- ``step(state) -> (state, record)``: one jitted step and its record as plain data;
- ``agent_steps_per_step``: environment steps of the whole population in one step;
- ``summary(step, record) -> line``: the line of ``metrics.jsonl`` for the step (it holds
  ``finite`` -- whether each member, or the population, stayed valid -- and the kind's
  ``score_key``); the engine adds ``best_return_so_far`` (the running maximum of the
  score), ``seconds``, ``agent_steps_per_second`` and ``time``;
- ``postfix(line) -> dict``: what the progress bar shows beside the step count.

This module gives every such kind the guarantees of :mod:`metarl.runs` (one writer,
atomic files, config change rules, damaged checkpoints skipped, a stop after
``run.max_invalid_generations`` invalid steps in a row): :func:`start_run` starts a run,
:func:`resume_run` continues one bit for bit from its newest usable checkpoint and
:func:`load_run` reads one back. Each checkpoint holds the whole state, so a resumed run
equals the uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl import distributed
from metarl.config import ConfigError, read_config_data, upgrade_saved_config
from metarl.runs import config_history
from metarl.runs import start as runs_start
from metarl.runs.checkpoint import DamagedCheckpoint, RunCheckpointer, score_of_line
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


@dataclass(frozen=True)
class SteppedKind:
    """Everything the toolkit needs to know of a population run kind: how its experiment
    files read, how it runs (this module), and how its runs are drawn and evaluated
    (:mod:`metarl.kinds` dispatches to these).

    Attributes:
        name: the kind (``kind`` of its experiment files), e.g. ``"pbt"``.
        step_key: the name of a step in ``metrics.jsonl`` and the checkpoints
            (``"segment"``, ``"generation"``).
        from_dict: plain data (an experiment file's, or a run's ``config.json``) -> the
            validated config (:class:`~metarl.config.ConfigError` naming a bad field).
        build: ``(config, mesh) -> program`` (see the module docstring).
        result: the class of what a run returns (a :class:`SteppedRun`).
        plot: ``run_dir -> [paths]``: draws the run into its ``plots/``.
        evaluate: ``(run_dir, eval_seed, rerun) -> report`` (saved under ``evaluations/``).
        format_evaluation: ``report -> str``: the report as a table.
        describe: ``line -> str``: a run's last ``metrics.jsonl`` line in a line, for the
            command line (:meth:`describe_run`).
        score_key: the field of a step's line that ranks checkpoints (the best is kept).
        invalid: what an invalid step means, for the stop message.
        advice: what to check when the run stops itself.
    """

    name: str
    step_key: str
    from_dict: Callable[[dict[str, Any]], Any]
    build: Callable[[Any, Any], Any]
    result: type
    plot: Callable[[Path], list[Path]]
    evaluate: Callable[..., dict[str, Any]]
    format_evaluation: Callable[[dict[str, Any]], str]
    describe: Callable[[dict[str, Any]], str]
    score_key: str = "best_return"
    invalid: str = "every member's losses were non-finite"
    advice: str = "Check the [inner] settings"

    def read_config(self, run_dir: str | Path):
        """The validated config of the run in ``run_dir`` (its ``config.json``)."""
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise RunError(f"run directory not found: {run_dir}")
        if not (run_dir / CONFIG_FILE).is_file():
            raise RunError(f"{run_dir} is not a metarl run: it has no {CONFIG_FILE}")
        return self.from_dict(upgrade_saved_config(read_config_data(run_dir / CONFIG_FILE)))

    def describe_run(self, result: SteppedRun) -> str:
        """A finished run: its directory and, if it took a step, its last step."""
        text = f"run directory: {result.run_dir}"
        return text + (f"\n{self.describe(result.history[-1])}" if result.history else "")

    def plot_history(self, run_dir: str | Path, filename: str,
                     draw: Callable[[Any, list[dict[str, Any]]], Any]) -> list[Path]:
        """Save ``draw(config, history)`` (a matplotlib figure of the run's
        ``metrics.jsonl``) as ``plots/<filename>``; returns the paths written."""
        run_dir = Path(run_dir)
        config = self.read_config(run_dir)
        history = read_metrics(run_dir)
        if not history:
            raise RunError(f"{run_dir} has no finished {self.step_key} yet (metrics.jsonl "
                           "is empty)")
        out = run_dir / PLOTS_DIR
        out.mkdir(exist_ok=True)
        path = out / filename
        draw(config, history).savefig(path, dpi=110)
        return [path]

    def normalize(self, data: dict[str, Any]) -> dict[str, Any]:
        """A saved config with defaults filled in, so comparing two finds only real
        changes (the data as it is when it no longer validates)."""
        data = upgrade_saved_config(data)
        try:
            return self.from_dict(data).to_dict()
        except ConfigError:
            return data


@dataclass
class SteppedRun:
    """What :func:`start_run` / :func:`resume_run` / :func:`load_run` return.

    Attributes:
        run_dir: the run directory.
        config: its config.
        program: the program that ran (learner, jitted step, ...).
        state: the state after the last completed step.
        history: one line of ``metrics.jsonl`` per step.
    """

    run_dir: Path
    config: Any
    program: Any
    state: Any
    history: list[dict[str, Any]] = field(default_factory=list)


def _invalid_streak(history: list[dict[str, Any]]) -> int:
    """Steps in a row, newest first, in which no member stayed valid."""
    streak = 0
    for line in reversed(history):
        finite = line.get("finite", True)
        if any(finite) if isinstance(finite, list) else finite:
            break
        streak += 1
    return streak


def _checkpointer(kind: SteppedKind, run_dir: Path, config) -> RunCheckpointer:
    return RunCheckpointer(run_dir, keep=config.run.keep_checkpoints, step_key=kind.step_key,
                           score=lambda line: score_of_line(line, kind.score_key))


def _open_trackers(run_dir: Path, config) -> list:
    """The experiment trackers ``run.trackers`` names (:mod:`metarl.trackers`)."""
    names = tuple(getattr(config.run, "trackers", ()) or ())
    if not names:
        return []
    from metarl.trackers import TrackerError, open_trackers

    try:
        return open_trackers(names, run_dir, config.name, config.to_dict())
    except TrackerError as error:
        raise ConfigError(f"run.trackers: {error}") from None


def _train(kind: SteppedKind, program, state, run_dir: Path, history: list[dict],
           events: list[dict]) -> SteppedRun:
    """Take the program's remaining steps, writing metrics every step and checkpoints every
    ``run.checkpoint_every`` steps and at the end."""
    from tqdm.auto import tqdm

    config = program.config
    until = program.steps
    checkpointer = _checkpointer(kind, run_dir, config)
    start = program.completed(state)
    primary = distributed.is_primary()
    limit = config.run.max_invalid_generations
    bar = tqdm(total=until, initial=start, desc=config.name, unit=kind.step_key,
               disable=not (config.run.progress and primary), dynamic_ncols=True)
    trackers = _open_trackers(run_dir, config) if primary else []
    stopped = None
    try:
        for step in range(start + 1, until + 1):
            started = time.perf_counter()
            state, record = program.step(state)
            jax.block_until_ready(state)
            seconds = time.perf_counter() - started
            line = program.summary(step, record)
            so_far = history[-1]["best_return_so_far"] if history else -math.inf
            line["best_return_so_far"] = float(np.nanmax([so_far, line[kind.score_key]]))
            line["seconds"] = seconds
            line["agent_steps_per_second"] = (program.agent_steps_per_step / seconds
                                              if seconds > 0 else None)
            line["time"] = now()
            history.append(line)
            if limit and _invalid_streak(history) >= limit:
                stopped = step
            if primary:
                write_metrics(run_dir, history, events, step_key=kind.step_key)
                for tracker in trackers:  # it keeps the numbers (metarl.trackers.scalars)
                    tracker.log(step, line)
            if step % config.run.checkpoint_every == 0 or step == until or stopped:
                meta = {"config": config.to_dict(), "history": history, "events": events}
                checkpointer.save(step, state, meta)
            bar.set_postfix({kind.step_key: f"{step}/{until}", **program.postfix(line)},
                            refresh=False)
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
            f"stopped after {kind.step_key} {stopped}: {kind.invalid} in the last {limit} "
            f"{kind.step_key}s (run.max_invalid_generations = {limit}). Its checkpoints are "
            f"kept in {run_dir / 'checkpoints'}. {kind.advice}; `metarl resume {run_dir}` "
            "continues it")
        if primary:
            write_status(run_dir, "stopped", **{"generation": stopped, kind.step_key: stopped},
                         message=message)
        raise RunStopped(message)
    if primary:
        write_status(run_dir, "finished", **{"generation": until, kind.step_key: until},
                     budget=until)
    return kind.result(run_dir, config, program, state, history)


def new_run_dir(config) -> Path:
    """A fresh directory ``<run.output_dir>/<name>-<timestamp>`` (suffixed if it exists)."""
    return runs_start.new_run_dir(config.run.output_dir, config.name)


def start_run(kind: SteppedKind, config, run_dir: str | Path | None = None, mesh=None
              ) -> SteppedRun:
    """Start a new run of ``config`` in ``run_dir`` (a fresh directory by default).

    Raises :class:`~metarl.runs.layout.RunError` if the directory holds another run or
    another process is writing it, and :class:`~metarl.runs.layout.RunStopped` when the
    run stops itself.
    """
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    run_dir = Path(distributed.agree(str(run_dir)))
    program = kind.build(config, mesh)  # checks the config fully before anything is written
    with started_run(run_dir, config.to_dict(), command=f"metarl run --run-dir {run_dir}",
                     normalize=kind.normalize, budget_fields=(), kind=kind.name,
                     budget=program.steps):
        return _train(kind, program, program.init(), run_dir, [], [])


def _find_checkpoint(kind: SteppedKind, run_dir: Path, program, *, accept: bool,
                     writer: bool):
    def validate(step: int, state, meta: dict[str, Any]) -> None:
        if program.completed(state) != step:
            raise DamagedCheckpoint(step, f"it holds {kind.step_key} "
                                          f"{program.completed(state)}")
        if not any(line.get(kind.step_key) == step for line in meta["history"]):
            raise DamagedCheckpoint(step, f"its history lacks that {kind.step_key}")

    checkpointer = _checkpointer(kind, run_dir, program.config)
    template = program.init()  # real arrays: their shardings are where the restore goes
    try:
        return find_resume_point(
            run_dir, checkpointer, template, config=program.config.to_dict(),
            normalize=kind.normalize, budget_fields=(), accept_config_change=accept,
            writer=writer, validate=validate)
    finally:
        checkpointer.close()


def resume_run(kind: SteppedKind, run_dir: str | Path, accept_config_change: bool = False,
               mesh=None) -> SteppedRun:
    """Continue a run from its newest usable checkpoint (:mod:`metarl.runs.resume`).

    A run that never reached a checkpoint starts from the beginning; a finished run is
    returned as it is. The budget cannot be extended (it sets schedules inside the run:
    learning-rate annealing, exploration, noise decay), so a longer run is another
    experiment; changing it is refused like any other change unless
    ``accept_config_change``.
    """
    run_dir = Path(run_dir)
    kind.read_config(run_dir)  # a missing directory or config is reported before locking
    with hold_run_lock(run_dir, f"metarl resume {run_dir}"):
        config = kind.read_config(run_dir)
        program = kind.build(config, mesh)
        found = _find_checkpoint(kind, run_dir, program, accept=accept_config_change,
                                 writer=True)
        if found is None:
            notify(f"{run_dir} has no complete checkpoint (the run stopped before its first "
                   "one, so nothing was lost): starting it from the beginning")
            state, history, events = program.init(), [], []
        else:
            step, state = found.step, found.state
            history = [line for line in found.meta["history"] if line[kind.step_key] <= step]
            events = [event for event in found.meta.get("events", [])
                      if event.get("after_step", 0) <= step]
            if found.skipped:
                notify(f"resuming {run_dir} from checkpoint {step}, the newest one that "
                       "reads back")
            if step >= program.steps:
                notify(f"{run_dir} has finished its {program.steps} {kind.step_key}s; "
                       f"nothing to continue (the budget of a {kind.name} run shapes its "
                       "schedules: start a new run to train longer)")
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
            write_metrics(run_dir, history, events, step_key=kind.step_key)
            write_status(run_dir, "running", resumed=now(), kind=kind.name,
                         budget=program.steps)
        return _train(kind, program, state, run_dir, history, events)


def load_run(kind: SteppedKind, run_dir: str | Path) -> SteppedRun:
    """Read a run back (newest usable checkpoint, config and history) without running or
    changing anything; damaged checkpoints are skipped with a warning."""
    run_dir = Path(run_dir)
    program = kind.build(kind.read_config(run_dir), None)
    found = _find_checkpoint(kind, run_dir, program, accept=True, writer=False)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {run_dir / 'checkpoints'}")
    return kind.result(run_dir, program.config, program, found.state,
                       list(found.meta["history"]))


def finite_stat(fn, values) -> float:
    """``fn`` over the finite entries of ``values`` (NaN when there are none)."""
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return float(fn(finite)) if finite.size else math.nan


def saved_evaluation(run_dir: str | Path, spec: dict[str, Any],
                     compute: Callable[[], dict[str, Any]], rerun: bool = False
                     ) -> dict[str, Any]:
    """An evaluation of a run, kept as ``evaluations/<n>.json``.

    ``spec`` says what was evaluated (kind, checkpoint, seed, method); an earlier record
    with the same ``spec`` is returned as it is (``reused``) unless ``rerun``, when
    ``compute()`` makes the report again and replaces it. The report gets ``spec``,
    ``created``, ``path``, ``id``, ``reused`` and ``replaced``.
    """
    from metarl.runs.evaluations import find_same, save_record

    earlier = find_same(run_dir, spec)
    if earlier is not None and not rerun:
        return {**earlier, "reused": True}
    report = {"run_dir": str(run_dir), "created": now(), **compute(), "spec": spec}
    replace = earlier["path"] if earlier is not None and earlier["id"] != "legacy" else None
    path = save_record(run_dir, report, replace=replace)
    return {**report, "path": str(path), "id": int(path.stem), "reused": False,
            "replaced": replace is not None}


def digest(*values: Any) -> str:
    """A short fingerprint of plain-JSON ``values`` (e.g. a checkpoint's last line), for an
    evaluation's ``spec``."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(values).encode()).hexdigest()
