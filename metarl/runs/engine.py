"""The one engine every run kind runs on: meta-evolution's generations, PBT's segments,
CEM-RL's generations and DvD's segments are all steps of a *program* in a run directory.

A run kind describes itself with a :class:`RunKind` and builds a :class:`Program` from its
config (its ``build`` is a subclass of it: a kind whose program lacks a required part is
refused when the kind is defined). A program has:

- ``config``: the experiment config (``name``, ``run`` -- a
  :class:`~metarl.config.RunConfig` --, ``to_dict()``);
- ``steps``: the steps of the budget;
- ``init() -> state``: the state (a pytree of arrays) before the first step;
- ``completed(state) -> int``: the steps ``state`` has done;
- ``step(state) -> (state, record)``: one jitted step and what its line is made from;
- ``agent_steps_per_step``: environment steps of the whole population in one step;
- ``summary(step, record) -> line``: the line of ``metrics.jsonl`` for the step (it holds
  the kind's ``valid_key`` -- whether each member, or the population, stayed valid -- and
  its ``score_key``); the engine adds the running best of the score
  (``best_so_far_key``, unless the line has it), ``agent_steps`` (the total so far, unless
  the line has it), ``seconds``, ``agent_steps_per_second`` and ``time``;
- ``postfix(line) -> dict``: what the progress bar shows beside the step count;

and parts a program may leave to :class:`Program`'s defaults:

- ``template() -> state``: a state of the right structure to restore a checkpoint into,
  where ``init()`` does more work than that needs (default: ``init()``);
- ``after_step(run_dir, state, primary)``: files the kind keeps beside the checkpoints,
  written after every step (called on every process; only the ``primary`` one writes;
  default: none);
- ``mesh``: the devices the population is sharded over (default ``None``: one device); a
  run resumed on another number of devices than its lines record is warned about.

This module gives every kind the guarantees of :mod:`metarl.runs` (one writer, atomic
files, config change rules, damaged checkpoints skipped, a stop after
``run.max_invalid_generations`` invalid steps in a row, a clean stop on a time limit or a
signal (:mod:`metarl.runs.stopping`), trackers): :func:`start_run`
starts a run, :func:`resume_run` continues one bit for bit from its newest usable
checkpoint (with a longer budget, for kinds whose budget shapes no schedule) and
:func:`load_run` reads one back. Each checkpoint holds the whole state, so a resumed run
equals the uninterrupted one.

**The host work of a step runs beside the next step.** Once step ``k`` is computed, the
engine makes its line (``program.summary``) and calls ``after_step``; then it starts step
``k + 1`` (:func:`metarl.runs.stopping.start_step`: a worker thread dispatches it and waits
for it) and, while that computes, appends step ``k``'s line to ``metrics.jsonl``, logs it to
the trackers and saves its checkpoint when one is due (:meth:`RunLedger.write`); only then
does it wait for step ``k + 1``. Steps donate no buffers, so state ``k`` stays readable
while ``k + 1`` computes; every file is written as before (atomically, the checkpoint
committed only when complete), so a kill at any moment still resumes exactly, and a stop
writes step ``k``'s files before it saves and exits. A multi-process run keeps the two in
turn (its checkpoint saves synchronise the processes, and must not interleave with a
step's collectives); :func:`overlaps_host_work` says which.

What one run directory records of a step is a :class:`RunLedger`. There is one training
loop, :func:`train_jointly`: a :class:`JointProgram` advances several runs with one step
(replicated evolution, :mod:`metarl.evolve.replicated`), each run keeping its ledger and
writing its own directory exactly as it would alone; a run trained alone
(:func:`train_member`, which :func:`start_run` and :func:`resume_run` call) is the one-member
case, its program the joint program of itself. :func:`prepare_resume` is everything a
resume does before it trains, so that a joint program can continue several runs at once.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl import distributed
from metarl.config import ConfigError, read_config_data, upgrade_saved_config
from metarl.objectives.sources import with_source_folder
from metarl.runs import config_history, stopping
from metarl.runs import start as runs_start
from metarl.runs.checkpoint import DamagedCheckpoint, RunCheckpointer, score_of_line
from metarl.runs.layout import (
    CONFIG_FILE,
    METRICS_FILE,
    PLOTS_DIR,
    CheckpointError,
    RunError,
    RunInterrupted,
    RunStopped,
    append_metrics,
    now,
    read_metrics,
    remove_stale_temporaries,
    write_json,
    write_metrics,
    write_status,
)
from metarl.runs.lock import hold_run_lock
from metarl.runs.replicates import is_replicated
from metarl.runs.resume import ResumePoint, find_resume_point, notify
from metarl.runs.start import started_run

TRACKERS_FIELD = "run.trackers"  # where a run's metrics go: may change when it continues


class Program(abc.ABC):
    """What a run kind builds from its config and the engine runs, one step at a time (the
    module doc says what each part is). Its methods without a default are abstract, so a
    subclass lacking one cannot be a kind's ``build`` (:class:`RunKind` refuses it);
    :data:`REQUIRED_ATTRIBUTES` are set by the subclass (often in ``__init__``) and checked
    when :meth:`RunKind.make_program` builds one. ``template``, ``after_step`` and ``mesh``
    have defaults."""

    REQUIRED_ATTRIBUTES = ("config", "steps", "agent_steps_per_step")
    config: Any
    steps: int
    agent_steps_per_step: int
    mesh: Any = None  # the devices the population is sharded over (None: one device)

    @abc.abstractmethod
    def init(self) -> Any:
        """The state before the first step."""

    @abc.abstractmethod
    def completed(self, state) -> int:
        """The steps ``state`` has done."""

    @abc.abstractmethod
    def step(self, state) -> tuple[Any, dict[str, Any]]:
        """One step: the state after it and the record its line is made from."""

    @abc.abstractmethod
    def summary(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of ``step`` (before the engine's fields)."""

    @abc.abstractmethod
    def postfix(self, line: dict[str, Any]) -> dict[str, Any]:
        """What the progress bar shows beside the step count."""

    def template(self) -> Any:
        """A state of the right structure to restore a checkpoint into."""
        return self.init()

    def after_step(self, run_dir: Path, state, primary: bool) -> None:
        """Files kept beside the checkpoints after every step (none by default)."""
        del run_dir, state, primary


class JointProgram(abc.ABC):
    """A program over the states of several runs together, one step of it a step of each
    (:func:`train_jointly`); ``agent_steps_per_step`` (set by the subclass) counts them all."""

    agent_steps_per_step: int

    @abc.abstractmethod
    def combine(self, states: list) -> Any:
        """The members' states as one joint state."""

    @abc.abstractmethod
    def step(self, joint_state) -> tuple[Any, dict[str, Any]]:
        """One step of every member: the joint state after it and its record."""

    @abc.abstractmethod
    def split(self, joint_state, record: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
        """Each member's state and record (what its program's ``summary`` reads), in
        order."""


class _Alone(JointProgram):
    """One run's program as the joint program of that run alone."""

    def __init__(self, program: Program):
        self.program = program
        self.agent_steps_per_step = program.agent_steps_per_step

    def combine(self, states: list) -> Any:
        (state,) = states
        return state

    def step(self, joint_state) -> tuple[Any, dict[str, Any]]:
        return self.program.step(joint_state)

    def split(self, joint_state, record: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
        return [(joint_state, record)]


@dataclass(frozen=True)
class RunKind:
    """Everything the toolkit needs to know of a run kind: how its experiment files read,
    how it runs (this module), and how its runs are drawn and evaluated
    (:mod:`metarl.kinds` dispatches to these).

    Attributes:
        name: the kind (``kind`` of its experiment files), e.g. ``"pbt"``.
        step_key: the name of a step in ``metrics.jsonl`` and the checkpoints
            (``"segment"``, ``"generation"``).
        from_dict: plain data (an experiment file's, or a run's ``config.json``) -> the
            validated config (:class:`~metarl.config.ConfigError` naming a bad field).
        build: the kind's :class:`Program` subclass, ``build(config, mesh)`` (a kind
            whose program is not one, or lacks a part, is refused here: ``TypeError``).
        result: the class of what a run returns (a :class:`SteppedRun`).
        plot: ``run_dir -> [paths]``: draws the run into its ``plots/``.
        describe: ``line -> str``: a run's last ``metrics.jsonl`` line in a line, for the
            command line (:meth:`describe_run`).
        evaluate: ``(run_dir, **options) -> report``, saved under ``evaluations/``; every
            kind takes ``eval_seed`` and ``rerun``, and its own options besides (``evolve``:
            :func:`metarl.evolve.evaluate.evaluate_run`).
        format_evaluation: ``report -> str``: the report as a table.
        score_key: the field of a step's line that ranks checkpoints (the best is kept).
        best_so_far_key: the field that holds the running best of ``score_key``.
        valid_key: the field that says whether the step was valid (a bool, or one per
            member: valid when any is).
        budget_field: the config field that holds the number of steps, when a run may be
            continued past it (``"es.generations"``); ``None`` when the budget also shapes
            schedules inside the run, so that a longer run is another experiment.
        command: the command that starts a run of this kind (named in the lock).
        invalid: what an invalid step means, for the stop message.
        advice: what to check when the run stops itself.
        record_sources: ``(config, run_dir) -> (config as the run records it, {path inside
            run_dir: file})``: files the config reads from outside (a user's objective
            module), copied into a new run directory so that every later command, in any
            process or on another machine, finds them; ``None``: the kind reads none.
    """

    name: str
    step_key: str
    from_dict: Callable[[dict[str, Any]], Any]
    build: type[Program]
    result: type
    plot: Callable[[Path], list[Path]]
    describe: Callable[[dict[str, Any]], str]
    evaluate: Callable[..., dict[str, Any]]
    format_evaluation: Callable[[dict[str, Any]], str]
    score_key: str = "best_return"
    best_so_far_key: str = "best_return_so_far"
    valid_key: str = "finite"
    budget_field: str | None = None
    command: str = "metarl run"
    invalid: str = "every member's losses were non-finite"
    advice: str = "Check the [inner] settings"
    record_sources: Callable[[Any, Path], tuple[Any, dict[str, Path]]] | None = None

    def __post_init__(self):
        build = self.build
        if not (isinstance(build, type) and issubclass(build, Program)):
            raise TypeError(f"run kind {self.name!r}: build must be a subclass of "
                            f"metarl.runs.engine.Program, not {build!r}")
        if inspect.isabstract(build):
            missing = ", ".join(sorted(build.__abstractmethods__))
            raise TypeError(f"run kind {self.name!r}: its program {build.__name__} lacks "
                            f"{missing} (metarl.runs.engine.Program)")

    def make_program(self, config, mesh=None) -> Program:
        """The kind's program of ``config`` (``build(config, mesh)``, which checks the
        config), refused (``TypeError``) when it lacks an attribute a program has."""
        program = self.build(config, mesh)
        missing = [name for name in Program.REQUIRED_ATTRIBUTES if not hasattr(program, name)]
        if missing:
            raise TypeError(f"run kind {self.name!r}: its program {type(program).__name__} "
                            f"lacks {', '.join(missing)} (metarl.runs.engine.Program)")
        return program

    @property
    def budget_fields(self) -> tuple[str, ...]:
        """Config fields allowed to differ when a run continues."""
        return (TRACKERS_FIELD,) + ((self.budget_field,) if self.budget_field else ())

    def read_config(self, run_dir: str | Path):
        """The validated config of the run in ``run_dir`` (its ``config.json``)."""
        return read_config(run_dir, self.from_dict)

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
        from metarl.figures.style import save_png

        return [save_png(draw(config, history), out / filename)]

    def normalize(self, data: dict[str, Any]) -> dict[str, Any]:
        """A saved config with defaults filled in, so comparing two finds only real
        changes (the data as it is when it no longer validates)."""
        data = upgrade_saved_config(data)
        try:
            return self.from_dict(data).to_dict()
        except ConfigError:
            return data


def read_config(run_dir: str | Path, from_dict: Callable[[dict[str, Any]], Any]):
    """The validated config of the run in ``run_dir``: its ``config.json``, brought to
    today's form (:func:`~metarl.config.upgrade_saved_config`) and built by ``from_dict``
    (a :class:`~metarl.runs.layout.RunError` when the directory or its config is missing)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise RunError(f"{run_dir} is not a metarl run: it has no {CONFIG_FILE}")
    data = upgrade_saved_config(read_config_data(run_dir / CONFIG_FILE))
    return from_dict(with_source_folder(data, run_dir))  # its objective's copied module


@dataclass
class SteppedRun:
    """What :func:`start_run` / :func:`resume_run` / :func:`load_run` return.

    Attributes:
        run_dir: the run directory.
        config: its config.
        program: the program that ran (learner, jitted step, ...).
        state: the state after the last completed step.
        history: one line of ``metrics.jsonl`` per step.
        plots: the figures drawn at the end for the run's trackers (none without them).
    """

    run_dir: Path
    config: Any
    program: Program
    state: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)


def finite_stat(fn, values) -> float:
    """``fn`` over the finite entries of ``values`` (NaN when there are none)."""
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return float(fn(finite)) if finite.size else math.nan


def _invalid_streak(history: list[dict[str, Any]], valid_key: str) -> int:
    """Steps in a row, newest first, in which no member stayed valid."""
    streak = 0
    for line in reversed(history):
        valid = line.get(valid_key, True)
        if any(valid) if isinstance(valid, list) else valid:
            break
        streak += 1
    return streak


def _checkpointer(kind: RunKind, run_dir: Path, config) -> RunCheckpointer:
    return RunCheckpointer(run_dir, keep=config.run.keep_checkpoints, step_key=kind.step_key,
                           score=lambda line: score_of_line(line, kind.score_key))


def _devices(program: Program) -> int:
    from metarl.sharding import num_shards

    return num_shards(program.mesh)


def current_backend() -> dict[str, str]:
    """What computes this process's steps: JAX's platform (``cpu``, ``gpu``, ``tpu``), the
    kind of its first device (``cpu``, ``NVIDIA H200``) and the JAX version. Kept in
    ``status.json`` and in every checkpoint (``meta["backend"]``)."""
    return {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
            "jax": jax.__version__}


def overlaps_host_work() -> bool:
    """Whether a step's host work (:meth:`RunLedger.write`) runs beside the next step: in a
    process of its own, yes; in a multi-process run no, since a checkpoint save synchronises
    the processes and must not interleave with the collectives of a step in flight."""
    return distributed.process_count() == 1


class RunLedger:
    """What one run directory records of each step it takes, the same for a run alone
    (:func:`train_member`) and for each run of a joint program (:func:`train_jointly`): the
    step's line in ``metrics.jsonl`` (the engine's fields added to the program's
    summary), the trackers, the program's ``after_step`` files, checkpoints every
    ``run.checkpoint_every`` steps and at the end, the stop after
    ``run.max_invalid_generations`` invalid steps in a row, and the status at the end.

    A step is recorded in two parts: :meth:`account` (its line, the invalid-step rule and
    ``after_step``, before the next step starts) and :meth:`write` (its line appended to
    ``metrics.jsonl``, the trackers, its checkpoint when due: the work that can run beside
    the next step); :meth:`record` does both.

    ``history`` and ``events`` are the run's lines so far (appended to in place); ``start``
    the steps its state has done (checkpointed, or none); ``stopper`` is told how long each
    checkpoint took. Close it with :meth:`close_checkpoints` (after a last :meth:`write`),
    then :meth:`finish` (which raises :class:`RunStopped` for a run that stopped itself),
    and :meth:`close_trackers` in any case; a run stopped by its time limit or a signal
    calls :meth:`interrupt` instead of :meth:`finish`.
    """

    def __init__(self, kind: RunKind, program: Program, run_dir: Path, history: list[dict],
                 events: list[dict], start: int, stopper: stopping.Stopper | None = None):
        from metarl.runs.trackers import RunTrackers

        self.kind, self.program, self.run_dir = kind, program, run_dir
        self.history, self.events = history, events
        self.config = program.config
        self.until = program.steps
        self.done_steps = start
        self.saved = start  # the newest step with a checkpoint (0: none is needed yet)
        self.stopper = stopper or stopping.Stopper()
        self.stopped: int | None = None
        self.primary = distributed.is_primary()  # only process 0 writes files
        self.limit = self.config.run.max_invalid_generations
        self.trackers = RunTrackers(self.config.run.trackers, run_dir, run_dir.name,
                                    self.config.to_dict(), self.primary)
        self.checkpointer = _checkpointer(kind, run_dir, self.config)
        self.pending = None  # the state of the accounted step whose files are not written
        # events in metrics.jsonl as this ledger wrote it (None: not written yet, so the
        # first write replaces the file whole: it may hold lines a killed process wrote)
        self.written_events: int | None = None

    @property
    def active(self) -> bool:
        """Whether the run has steps left to take (neither finished nor stopped)."""
        return self.stopped is None and self.done_steps < self.until

    @property
    def unsaved(self) -> bool:
        """Whether the last completed step has no checkpoint (``run.checkpoint_every``)."""
        return self.done_steps > self.saved

    def _save(self, step: int, state) -> None:
        # every process calls save: orbax synchronises them and process 0 writes
        started = self.stopper.clock()
        meta = {"config": self.config.to_dict(), "history": self.history,
                "events": self.events, "backend": current_backend()}
        self.checkpointer.save(step, state, meta)
        self.saved = step
        self.stopper.note_save(self.stopper.clock() - started)

    def record(self, state, record: dict[str, Any], seconds: float) -> dict[str, Any]:
        """Record the next step whole (:meth:`account`, then :meth:`write`). Returns its
        line."""
        line = self.account(state, record, seconds)
        self.write()
        return line

    def account(self, state, record: dict[str, Any], seconds: float) -> dict[str, Any]:
        """The first part of recording the next step: ``state`` after it and its ``record``
        (what ``program.summary`` reads), which took ``seconds``. Makes its line, adds it
        to the history, applies the invalid-step rule and calls ``after_step``; its files
        wait for :meth:`write`. Returns its line."""
        kind, program, history = self.kind, self.program, self.history
        step = self.done_steps + 1
        line = program.summary(step, record)
        if kind.best_so_far_key not in line:
            so_far = history[-1][kind.best_so_far_key] if history else -math.inf
            line[kind.best_so_far_key] = float(np.nanmax([so_far, line[kind.score_key]]))
        if "agent_steps" not in line:
            line["agent_steps"] = ((history[-1]["agent_steps"] if history else 0)
                                   + program.agent_steps_per_step)
        line["seconds"] = seconds
        line["agent_steps_per_second"] = (program.agent_steps_per_step / seconds
                                          if seconds > 0 else None)
        line["time"] = now()
        history.append(line)
        if self.limit and _invalid_streak(history, kind.valid_key) >= self.limit:
            self.stopped = step
        # after_step may compute with JAX: not beside a step
        program.after_step(self.run_dir, state, self.primary)
        self.done_steps = step
        self.pending = state
        return line

    def write(self) -> None:
        """The second part of recording the step :meth:`account` took last, if not done
        yet: its line appended to ``metrics.jsonl``, the trackers, and its checkpoint every
        ``run.checkpoint_every`` steps, at the end and at a stop. Nothing here computes
        with JAX (the checkpoint reads ready arrays), so it may run beside the next step."""
        if self.pending is None:
            return
        state, step, line = self.pending, self.done_steps, self.history[-1]
        if self.primary:
            if self.written_events == len(self.events):
                append_metrics(self.run_dir, line)
            else:
                write_metrics(self.run_dir, self.history, self.events,
                              step_key=self.kind.step_key)
                self.written_events = len(self.events)
        self.trackers.log(step, line)  # it keeps the numbers (metarl.runs.trackers.scalars)
        if step % self.config.run.checkpoint_every == 0 or step == self.until or self.stopped:
            self._save(step, state)
        self.pending = None

    def interrupt(self, state, reason: str, resume_dir: Path) -> str:
        """Stop the run after its last completed step, whose ``state`` is given: save that
        step's checkpoint if ``run.checkpoint_every`` skipped it, and record the stop
        (``reason``; ``metarl resume resume_dir`` continues it) in ``status.json``.
        Nothing here runs a JAX computation, so it does not wait behind a step in flight.
        Returns what became of the run, for the stop's message."""
        self.write()
        kind, done = self.kind, self.done_steps
        if self.unsaved:
            self._save(done, state)
        what = (f"checkpoint {done} saved" if done else
                f"no {kind.step_key} had completed")
        if self.primary:
            write_status(self.run_dir, "stopped", reason=reason,
                         **{"generation": done, kind.step_key: done},
                         message=f"stopped by {reason} after {kind.step_key} {done}; {what}",
                         resume=f"metarl resume {resume_dir}")
        return f"{kind.step_key} {done} ({what})"

    def close_checkpoints(self) -> None:
        self.checkpointer.close()

    def finish(self, figures: bool = True) -> list[Path]:
        """Write the final status (and, with trackers and ``figures``, draw and send the
        run's figures): returns the figures' paths, or raises :class:`RunStopped` naming the
        step at which the run stopped itself. The last step must be written
        (:meth:`write`) before the checkpoints are closed."""
        self.write()  # (already written where the checkpoints were closed since)
        kind, run_dir, until = self.kind, self.run_dir, self.until
        if self.stopped:
            stopped, limit = self.stopped, self.limit
            message = (
                f"stopped after {kind.step_key} {stopped}: {kind.invalid} in the last "
                f"{limit} {kind.step_key}s (run.max_invalid_generations = {limit}). Its "
                f"checkpoints are kept in {run_dir / 'checkpoints'}. {kind.advice}; "
                f"`metarl resume {run_dir}` continues it")
            if self.primary:
                write_status(run_dir, "stopped",
                             **{"generation": stopped, kind.step_key: stopped},
                             message=message)
            raise RunStopped(message)
        if self.primary:
            write_status(run_dir, "finished", **{"generation": until, kind.step_key: until},
                         budget=until)
        plots: list[Path] = []
        if self.trackers and figures:
            plots = kind.plot(run_dir)
            self.trackers.log_figures(until, plots)
        return plots

    def close_trackers(self) -> None:
        self.trackers.close()


def _progress_bar(kind: RunKind, ledgers: list[RunLedger], name: str):
    """The bar of the runs of ``ledgers``: the steps of one run, or of every run together."""
    from tqdm.auto import tqdm

    return tqdm(total=sum(ledger.until for ledger in ledgers),
                initial=sum(min(ledger.done_steps, ledger.until) for ledger in ledgers),
                desc=name if len(ledgers) == 1 else f"{name} ({len(ledgers)} runs)",
                unit=kind.step_key,
                disable=not (ledgers[0].config.run.progress and distributed.is_primary()),
                dynamic_ncols=True)


def _postfix(kind: RunKind, joint: JointProgram, ledgers: list[RunLedger],
             lines: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """What the bar shows after a step the active runs recorded as ``lines``: the steps
    and the program's postfix of the best line; with several runs, also how many still
    train and the joint step's rate."""
    steps = {kind.step_key: f"{min(ledger.done_steps for ledger in ledgers)}/"
                            f"{max(ledger.until for ledger in ledgers)}"}
    best = max(lines, key=lambda line: score_of_line(line, kind.score_key))
    shown = ledgers[0].program.postfix(best)
    if len(ledgers) == 1:
        return {**steps, **shown}
    rate = joint.agent_steps_per_step / seconds if seconds > 0 else math.nan
    return {**steps, "runs": sum(ledger.active for ledger in ledgers), **shown,
            "steps_per_s": f"{rate:.3g}"}


def _resume_dir(run_dirs: list[Path]) -> Path:
    """The directory ``metarl resume`` continues ``run_dirs`` from: the one run, or the
    parent of replicated runs that holds them all."""
    parents = {run_dir.parent for run_dir in run_dirs}
    if len(run_dirs) > 1 and len(parents) == 1 and is_replicated(next(iter(parents))):
        return next(iter(parents))
    return run_dirs[0]


def _interrupt(kind: RunKind, ledgers: list[RunLedger], states: list, reason: str,
               lost: int | None) -> None:
    """Stop the runs of ``ledgers`` (each after its last completed step, whose state is in
    ``states``) for ``reason``; ``lost`` is the step that was in flight and is abandoned.
    Runs that have finished or stopped themselves are closed as such. Raises
    :class:`RunInterrupted`."""
    resume_dir = _resume_dir([ledger.run_dir for ledger in ledgers])
    parts = []
    for ledger, state in zip(ledgers, states, strict=True):
        if ledger.active:
            what = ledger.interrupt(state, reason, resume_dir)
            parts.append(what if len(ledgers) == 1 else f"{ledger.run_dir.name}: {what}")
        else:
            with contextlib.suppress(RunStopped):  # its status says so already
                # no figures while a step is in flight: drawing one may compute behind it
                ledger.finish(figures=lost is None)
    in_flight = "" if lost is None else f"; {kind.step_key} {lost} was in flight and is lost"
    message = (f"stopped by {reason} after {', '.join(parts)}{in_flight}. "
               f"`metarl resume {resume_dir}` continues it")
    raise RunInterrupted(message, resume_dir, min(ledger.done_steps for ledger in ledgers),
                         abandoned=lost is not None)


@dataclass
class JointMember:
    """One run of a joint program (:func:`train_jointly`), or a run trained alone
    (:func:`train_member`): its directory, its own program (config, budget, ``summary``,
    ``after_step``, ``postfix``: the program of the run alone), its state and its lines so
    far."""

    run_dir: Path
    program: Program
    state: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def train_member(kind: RunKind, member: JointMember) -> SteppedRun:
    """Take ``member``'s remaining steps alone (as :func:`start_run` does, and
    :func:`resume_run` after :func:`prepare_resume`): :func:`train_jointly` with one
    member, its program the joint program of itself."""
    (run,) = train_jointly(kind, _Alone(member.program), [member],
                           member.program.config.name)
    return run


def train_jointly(kind: RunKind, joint: JointProgram, members: list[JointMember], name: str
                  ) -> list[SteppedRun]:
    """Advance the runs of ``members`` together, one step of ``joint`` for all of them at a
    time, each run recording its own steps as it would alone (:class:`RunLedger`: its
    metrics, checkpoints every ``run.checkpoint_every`` steps and at the end, files,
    trackers and status in its own directory). The one training loop of every run kind: a
    run alone is the one-member case (:func:`train_member`).

    Each step's host work runs beside the next step (module doc). Members may start at
    different steps and have different budgets: every step advances all of them, and a
    member records the step only while it has steps left (one that has finished, or stopped
    itself after ``run.max_invalid_generations`` invalid steps, is carried along
    unrecorded), so each member's steps are those it takes alone from its own state. Each
    line's ``seconds`` is the joint step's. Returns each member's :class:`SteppedRun`;
    :class:`RunStopped` is raised at the end, after every other member has finished, when
    any member stopped itself. A time limit or a signal (:mod:`metarl.runs.stopping`) stops
    every run after the same step, the last completed step checkpointed
    (:class:`RunInterrupted`, naming the directory that ``metarl resume`` continues: the
    run, or the parent of replicated runs).
    """
    stopper = stopping.current()
    ledgers = [RunLedger(kind, m.program, m.run_dir, m.history, m.events,
                         m.program.completed(m.state), stopper) for m in members]
    states = [m.state for m in members]
    bar = _progress_bar(kind, ledgers, name)
    stops, plots = [], [[] for _ in members]
    try:
        try:
            _take_steps(kind, joint, ledgers, states, stopper, bar)
            for ledger in ledgers:
                ledger.write()
        finally:
            bar.close()
            for ledger in ledgers:
                ledger.close_checkpoints()
        for index, ledger in enumerate(ledgers):
            try:
                plots[index] = ledger.finish()
            except RunStopped as stop:
                stops.append(str(stop))
    finally:
        for ledger in ledgers:
            ledger.close_trackers()
    if stops:
        raise RunStopped(" | ".join(stops))
    return [kind.result(m.run_dir, m.program.config, m.program, state, m.history, figures)
            for m, state, figures in zip(members, states, plots, strict=True)]


def _take_steps(kind: RunKind, joint: JointProgram, ledgers: list[RunLedger], states: list,
                stopper: stopping.Stopper, bar) -> None:
    """Step ``joint`` until no run of ``ledgers`` has steps left, ``states`` kept as each
    run's state after its last completed step. Each step's files are written beside the
    next step (:meth:`RunLedger.account`, then :meth:`RunLedger.write` once the next step
    is in flight), or in turn where :func:`overlaps_host_work` says no. Raises
    :class:`RunInterrupted` on a time limit or a signal."""
    overlap = overlaps_host_work()

    def unsaved() -> bool:
        return any(ledger.unsaved for ledger in ledgers if ledger.active)

    joint_state = (joint.combine(states) if any(ledger.active for ledger in ledgers)
                   else None)
    while any(ledger.active for ledger in ledgers):
        reason = stopper.before_step(unsaved())
        if reason is not None:
            _interrupt(kind, ledgers, states, reason, None)
        clock = stopper.clock()
        flight = stopping.start_step(lambda joint_state=joint_state: joint.step(joint_state))
        for ledger in ledgers:  # the previous step's files, while this one computes
            ledger.write()
        outcome = flight.wait(stopper, unsaved())
        if outcome.abandoned is not None:
            lost = 1 + min(ledger.done_steps for ledger in ledgers if ledger.active)
            _interrupt(kind, ledgers, states, outcome.abandoned, lost)
        joint_state, record = outcome.value
        lines = []
        for index, (state, member_record) in enumerate(joint.split(joint_state, record)):
            ledger = ledgers[index]
            if ledger.active:
                states[index] = state
                # in turn, the step's files are written now; beside the next step, then
                lines.append((ledger.account if overlap else ledger.record)(
                    state, member_record, outcome.seconds))
        stopper.note_cycle(stopper.clock() - clock)
        bar.set_postfix(_postfix(kind, joint, ledgers, lines, outcome.seconds), refresh=False)
        bar.update(len(lines))


def new_run_dir(config) -> Path:
    """A fresh directory ``<run.output_dir>/<name>-<timestamp>`` (suffixed if it exists)."""
    return runs_start.new_run_dir(config.run.output_dir, config.name)


def start_run(kind: RunKind, config, run_dir: str | Path | None = None, mesh=None
              ) -> SteppedRun:
    """Start a new run of ``config`` in ``run_dir`` (a fresh directory by default).

    Raises :class:`~metarl.runs.layout.RunError` if the directory holds another run or
    another process is writing it (or a tracker of ``run.trackers`` is not installed),
    :class:`~metarl.runs.layout.RunStopped` when the run stops itself, and
    :class:`~metarl.runs.layout.RunInterrupted` when a time limit or a signal stops it
    (:mod:`metarl.runs.stopping`).
    """
    from metarl.runs.trackers import check_trackers

    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    run_dir = Path(distributed.agree(str(run_dir)))  # process 0's clock names the directory
    files = {}
    if kind.record_sources is not None:
        config, files = kind.record_sources(config, run_dir)
    program = kind.make_program(config, mesh)  # checks the config before anything is written
    check_trackers(config.run.trackers)
    with started_run(run_dir, config.to_dict(),
                     command=f"{kind.command} --run-dir {run_dir}", normalize=kind.normalize,
                     budget_fields=kind.budget_fields, files=files, kind=kind.name,
                     budget=program.steps, backend=current_backend()):
        return train_member(kind, JointMember(run_dir, program, program.init()))


def _find_checkpoint(kind: RunKind, run_dir: Path, program: Program, *, accept: bool,
                     writer: bool):
    def validate(step: int, state, meta: dict[str, Any]) -> None:
        if program.completed(state) != step:
            raise DamagedCheckpoint(step, f"it holds {kind.step_key} "
                                          f"{program.completed(state)}")
        if not any(line.get(kind.step_key) == step for line in meta["history"]):
            raise DamagedCheckpoint(step, f"its history lacks that {kind.step_key}")

    checkpointer = _checkpointer(kind, run_dir, program.config)
    template = program.template()  # real arrays: their shardings are where the restore goes
    try:
        return find_resume_point(
            run_dir, checkpointer, template, config=program.config.to_dict(),
            normalize=kind.normalize, budget_fields=kind.budget_fields,
            accept_config_change=accept, writer=writer, validate=validate)
    finally:
        checkpointer.close()


def _replace_field(config, path: str, value):
    """``config`` with the dotted field ``path`` (e.g. ``"es.generations"``) set."""
    head, _, rest = path.partition(".")
    inner = _replace_field(getattr(config, head), rest, value) if rest else value
    return dataclasses.replace(config, **{head: inner})


def resume_run(kind: RunKind, run_dir: str | Path, steps: int | None = None,
               accept_config_change: bool = False, trackers: tuple[str, ...] | None = None,
               mesh=None) -> SteppedRun:
    """Continue a run from its newest usable checkpoint (:mod:`metarl.runs.resume`).

    A run that never reached a checkpoint starts from the beginning; a finished run is
    returned as it is, unless ``steps`` extends its budget: up to ``steps`` steps in total,
    for a kind with a ``budget_field`` (written to ``config.json`` and the config history;
    other kinds refuse it with :class:`~metarl.config.ConfigError`, their budget shaping
    schedules inside the run). If ``config.json`` differs from the config saved in the
    checkpoint in more than the budget and the trackers, the resume is refused
    (:class:`~metarl.runs.config_history.ConfigChangedError`) unless
    ``accept_config_change``, which records the change in ``metrics.jsonl`` and
    ``config_history.jsonl``. ``trackers`` replaces ``run.trackers`` from here on
    (recorded like a new budget). Nothing in the directory is overwritten before the
    checkpoint has been restored; damaged checkpoints are moved to
    ``damaged-checkpoints/``.
    """
    run_dir = Path(run_dir)
    check_resumable(kind, run_dir, steps, trackers)
    with hold_run_lock(run_dir, f"metarl resume {run_dir}"):
        return train_member(kind, prepare_resume(kind, run_dir, steps, accept_config_change,
                                                 trackers, mesh))


def check_resumable(kind: RunKind, run_dir: Path, steps: int | None = None,
                    trackers: tuple[str, ...] | None = None) -> None:
    """What :func:`resume_run` checks before it locks ``run_dir``: the directory and its
    config exist, ``steps`` is allowed for the kind, the trackers are installed."""
    from metarl.runs.trackers import check_trackers

    config = kind.read_config(run_dir)  # a missing directory or config, before locking
    if steps is not None and kind.budget_field is None:
        raise ConfigError(
            f"--generations: a {kind.name} run's budget also shapes its schedules "
            "(learning-rate annealing, exploration, noise decay), so it cannot be "
            "extended; start a new run to train longer")
    check_trackers(config.run.trackers if trackers is None else trackers)


def prepare_resume(kind: RunKind, run_dir: Path, steps: int | None = None,
                   accept_config_change: bool = False,
                   trackers: tuple[str, ...] | None = None, mesh=None) -> JointMember:
    """Everything :func:`resume_run` does before it trains, with ``run_dir``'s lock held
    by the caller: the program, the state of the newest usable checkpoint (or the initial
    state), the history and events up to it, the budget and trackers changed and recorded,
    ``metrics.jsonl`` and the status written. Returns them as a :class:`JointMember`
    (trained by :func:`train_member` alone, or by :func:`train_jointly` with others)."""
    config = kind.read_config(run_dir)
    program = kind.make_program(config, mesh)
    start = _restore_newest_checkpoint(kind, run_dir, program, accept_config_change)
    until = _budget_to_continue_to(kind, run_dir, program, steps, start)
    config, records = _change_budget_and_trackers(kind, program, config, until, trackers)
    if distributed.is_primary():
        remove_stale_temporaries(run_dir)
        _record_accepted_config_change(run_dir, start, config)
        _record_budget_and_trackers(run_dir, records, start.done, config)
        backend = _record_backend(run_dir, start)
        write_metrics(run_dir, start.history, start.events, step_key=kind.step_key)
        write_status(run_dir, "running", resumed=now(), kind=kind.name, budget=until,
                     backend=backend)
    _warn_if_devices_changed(run_dir, start.history, _devices(program))
    return JointMember(run_dir, program, start.state, start.history, start.events)


@dataclass
class _ResumeStart:
    """Where a resume starts: the steps done, the state, the lines and events up to it,
    and the checkpoint they were read from (``None``: the run starts from the beginning)."""

    done: int
    state: Any
    history: list[dict[str, Any]]
    events: list[dict[str, Any]]
    found: ResumePoint | None


def _restore_newest_checkpoint(kind: RunKind, run_dir: Path, program: Program,
                               accept_config_change: bool) -> _ResumeStart:
    """The newest usable checkpoint of ``run_dir`` restored (damaged ones skipped, a
    changed config refused unless accepted: :func:`_find_checkpoint`), its lines and events
    up to its step; the initial state when the run has none."""
    found = _find_checkpoint(kind, run_dir, program, accept=accept_config_change,
                             writer=True)
    if found is None:
        notify(f"{run_dir} has no complete checkpoint (the run stopped before its first "
               "one, so nothing was lost): starting it from the beginning")
        return _ResumeStart(0, program.init(), [], [], None)
    done = found.step
    history = [line for line in found.meta["history"] if line[kind.step_key] <= done]
    events = [event for event in found.meta.get("events", [])
              if event.get("after_step", 0) <= done]
    if found.skipped:
        notify(f"resuming {run_dir} from checkpoint {done}, the newest one that reads back")
    return _ResumeStart(done, found.state, history, events, found)


def _budget_to_continue_to(kind: RunKind, run_dir: Path, program: Program,
                           steps: int | None, start: _ResumeStart) -> int:
    """The steps the resumed run ends at (``steps``, or its budget): refused below those
    it has done; a run that has done them all is told it has nothing to continue."""
    until = program.steps if steps is None else steps
    done = start.done
    if until < done:
        raise RunError(f"generations: the run already has {done} {kind.step_key}s "
                       f"(> {until})")
    if done >= until and start.found is not None:
        extend = (f"`metarl resume {run_dir} --generations N` continues it to N"
                  if kind.budget_field else
                  f"the budget of a {kind.name} run shapes its schedules: start a new "
                  "run to train longer")
        notify(f"{run_dir} has finished its {until} {kind.step_key}s; nothing to "
               f"continue ({extend})")
    return until


def _change_budget_and_trackers(kind: RunKind, program: Program, config, until: int,
                                trackers: tuple[str, ...] | None
                                ) -> tuple[Any, list[tuple[str, str, Any, Any]]]:
    """``config`` with the new budget ``until`` and ``trackers`` (the program's too: neither
    shapes anything compiled), and the records of what changed: ``(record name, field,
    old, new)``."""
    records = []
    if kind.budget_field and until != program.steps:
        records.append(("budget", kind.budget_field, program.steps, until))
        config = _replace_field(config, kind.budget_field, until)
    if trackers is not None and tuple(trackers) != tuple(config.run.trackers):
        records.append(("trackers", TRACKERS_FIELD, list(config.run.trackers),
                        list(trackers)))
        config = _replace_field(config, TRACKERS_FIELD, tuple(trackers))
    if records:
        program.config, program.steps = config, until
    return config, records


def _record_accepted_config_change(run_dir: Path, start: _ResumeStart, config) -> None:
    """A config change the resume accepted, as an event of the run's lines and in
    ``config_history.jsonl``, and told."""
    found = start.found
    if found is None or not found.changes:
        return
    changes = config_history.change_record(found.changes)
    start.events.append({"event": "config_change", "after_step": start.done,
                         "time": now(), "changes": changes})
    config_history.record(run_dir, "config_change", after_step=start.done,
                          changes=changes, config=config.to_dict())
    notify(f"continuing with a changed config (accepted, recorded in {METRICS_FILE} and "
           f"{config_history.CONFIG_HISTORY_FILE}): "
           f"{config_history.format_changes(found.changes)}")


def _record_budget_and_trackers(run_dir: Path, records: list[tuple[str, str, Any, Any]],
                                done: int, config) -> None:
    """A new budget or trackers (:func:`_change_budget_and_trackers`) in
    ``config_history.jsonl`` and ``config.json``."""
    for record, path, old, new in records:
        config_history.record(run_dir, record, after_step=done,
                              changes=[{"field": path, "old": old, "new": new}])
    if records:
        write_json(run_dir / CONFIG_FILE, config.to_dict(), run_dir)


def _record_backend(run_dir: Path, start: _ResumeStart) -> dict[str, str]:
    """This process's backend (returned), and when the checkpoint was made on another one
    a ``backend_change`` event in the run's lines and a warning."""
    backend = current_backend()
    before = start.found.meta.get("backend") if start.found is not None else None
    if before is not None and before != backend:
        start.events.append({"event": "backend_change", "after_step": start.done,
                             "time": now(), "from": before, "to": backend})
        _warn_backend_changed(run_dir, before, backend)
    return backend


def _describe_backend(backend: dict[str, str]) -> str:
    return (f"{backend.get('platform', '?')} ({backend.get('device_kind', '?')}, jax "
            f"{backend.get('jax', '?')})")


def _warn_backend_changed(run_dir: Path, before: dict[str, str],
                          backend: dict[str, str]) -> None:
    """A run continued on another backend is warned about, not refused: another platform,
    device or XLA compiles other kernels, whose float rounding training amplifies, so the
    run goes on as a valid search that no longer repeats an uninterrupted one exactly --
    which is what moving a search between a GPU lease and a CPU is for. The change is
    recorded in ``metrics.jsonl`` (a ``backend_change`` event) so that nobody reads the run
    as one that would repeat itself."""
    warnings.warn(
        f"{run_dir} was checkpointed on {_describe_backend(before)} and resumes on "
        f"{_describe_backend(backend)}: from here on its numbers will differ from an "
        "uninterrupted run's (float rounding, which training amplifies); recorded as a "
        f"backend_change event in {METRICS_FILE}. To continue it exactly, resume it on "
        f"{before.get('platform', 'the same backend')}.",
        UserWarning, stacklevel=4,  # the caller of prepare_resume
    )


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


def load_run(kind: RunKind, run_dir: str | Path) -> SteppedRun:
    """Read a run back (newest usable checkpoint, config and history) without running or
    changing anything; damaged checkpoints are skipped with a warning."""
    run_dir = Path(run_dir)
    program = kind.make_program(kind.read_config(run_dir), None)
    found = _find_checkpoint(kind, run_dir, program, accept=True, writer=False)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {run_dir / 'checkpoints'}")
    return kind.result(run_dir, program.config, program, found.state,
                       list(found.meta["history"]))
