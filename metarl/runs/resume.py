"""The rules by which a run continues from its run directory, for every run kind.

1. **Nothing to lose.** A directory with a config but no complete checkpoint (the run was
   killed while compiling or before its first save) starts again from the beginning, and
   says so (:func:`find_resume_point` returns ``None``).
2. **Newest usable checkpoint.** Checkpoints are tried newest first. One whose files are
   missing, truncated or unreadable is skipped with a warning naming it; a resume (the
   writer) moves it into ``damaged-checkpoints/``, never deleting it, where it is out of the
   way of later saves and of retention; a reader (plots, evaluation) only skips it.
   Directories of interrupted saves are skipped (and moved aside) the same way. If there
   were checkpoints and none reads back, that is one :class:`CheckpointError`.
3. **Same experiment.** The config the run continues with is compared with the one saved in
   the checkpoint; only the budget may differ, unless the change is accepted explicitly
   (:mod:`metarl.runs.config_history`).
4. **Fits the config.** A checkpoint whose arrays do not fit the config's shapes is refused
   with a :class:`CheckpointError` naming the array (after an accepted change that alters
   them); when the configs are equal, such a checkpoint is damaged instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metarl.runs.checkpoint import (
    TMP_MARKER,
    DamagedCheckpoint,
    RunCheckpointer,
    move_aside,
)
from metarl.runs.config_history import check_config_change, config_changes
from metarl.runs.layout import CONFIG_FILE, DAMAGED_DIR, CheckpointError, RunError, read_json


@dataclass
class ResumePoint:
    """The checkpoint a run continues from.

    Attributes:
        step: its step (generations completed).
        state: the restored state pytree.
        meta: its meta item (``config``, ``history``, ``events``).
        changes: config changes from the checkpoint's config to the run's, beyond the
            budget (only non-empty when they were accepted).
        skipped: ``(name, reason)`` of every checkpoint skipped on the way.
    """

    step: int
    state: Any
    meta: dict[str, Any]
    changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def had_checkpoints(run_dir: Path) -> bool:
    """Whether ``run_dir`` ever completed a checkpoint (one is there or was moved aside)."""
    for folder in (run_dir / "checkpoints", run_dir / DAMAGED_DIR):
        if folder.is_dir() and any(p.is_dir() and p.name.split("-")[0].isdigit()
                                   and TMP_MARKER not in p.name for p in folder.iterdir()):
            return True
    return False


def find_resume_point(
    run_dir: Path,
    checkpointer: RunCheckpointer,
    template_state: Any,
    *,
    config: dict[str, Any],
    normalize: Callable[[dict[str, Any]], dict[str, Any]],
    budget_fields: Iterable[str],
    accept_config_change: bool,
    writer: bool,
    validate: Callable[[int, Any, dict[str, Any]], None] | None = None,
) -> ResumePoint | None:
    """Apply the rules of this module to ``run_dir`` (see the module docstring).

    Args:
        run_dir: the run directory.
        checkpointer: reads its checkpoints (closed and rebuilt by the caller afterwards if
            ``writer`` moved anything: its list of steps is then stale).
        template_state: the state the run's config builds (structure, shapes, dtypes).
        config: the run's config as plain data (what ``config.json`` says).
        normalize: brings a saved config to today's form (defaults, spellings).
        budget_fields: field paths allowed to differ, e.g. ``("es.generations",)``.
        accept_config_change: continue although other fields differ.
        writer: move damaged and incomplete checkpoints into ``damaged-checkpoints/``
            (only the process holding the run's lock may).
        validate: extra check of a restored ``(step, state, meta)``; raises
            :class:`DamagedCheckpoint` when they disagree.

    Returns:
        The checkpoint to continue from, or ``None`` when the run never completed one.

    Raises:
        CheckpointError: there were checkpoints but none is usable, or the newest readable
            one does not fit the config.
        ConfigChangedError: the config changed beyond the budget and that was not accepted.
    """
    from metarl import distributed

    primary = distributed.is_primary()
    move = writer and primary
    skipped: list[tuple[str, str]] = []
    to_move: list[Path] = []

    incomplete = checkpointer.incomplete()
    if incomplete and primary:
        names = ", ".join(p.name for p in incomplete)
        where = f"; moved to {run_dir / DAMAGED_DIR}" if move else ""
        warnings.warn(f"skipping incomplete checkpoint(s) in {checkpointer.directory}: "
                      f"{names} (a save was interrupted){where}", UserWarning, stacklevel=3)
    to_move += incomplete if move else []

    found = None
    for step in sorted(checkpointer.all_generations(), reverse=True):
        try:
            meta = checkpointer.read_meta(step)
            changes = check_config_change(
                meta["config"], config, budget_fields=budget_fields,
                accept=accept_config_change, where=str(run_dir), normalize=normalize)
            try:
                state = checkpointer.restore_state(step, template_state)
            except CheckpointError as mismatch:
                same = not [c for c in config_changes(normalize(meta["config"]),
                                                      normalize(config))
                            if c[0] not in set(budget_fields)]
                if not same:
                    raise
                raise DamagedCheckpoint(step, str(mismatch).split(": ", 1)[-1]) from mismatch
            if validate is not None:
                validate(step, state, meta)
        except DamagedCheckpoint as damaged:
            skipped.append((str(step), damaged.reason))
            path = checkpointer.directory / str(step)
            if primary:
                where = f"; moved it to {run_dir / DAMAGED_DIR}" if move else ""
                warnings.warn(f"skipping damaged checkpoint {step} in {checkpointer.directory}"
                              f": {damaged.reason}{where}", UserWarning, stacklevel=3)
            if move:
                to_move.append(path)
            continue
        found = ResumePoint(step, state, meta, changes, skipped)
        break

    if to_move:
        for path in to_move:
            if path.exists():
                move_aside(run_dir, path)
    if writer:
        distributed.barrier("metarl-resume-moved-aside")

    if found is None and (skipped or had_checkpoints(run_dir)):
        reasons = "; ".join(f"{name}: {reason}" for name, reason in skipped)
        raise CheckpointError(
            f"{run_dir} has no usable checkpoint"
            + (f" ({reasons})" if reasons else "")
            + f"; the damaged ones are in {run_dir / DAMAGED_DIR}. To start over, start a "
            f"new run in another directory from its config, {run_dir / 'config.json'}"
        )
    return found


def notify(message: str) -> None:
    """Tell the user what a run is doing about its directory (process 0, on stderr)."""
    import sys

    from metarl import distributed

    if distributed.is_primary():
        print(f"metarl: {message}", file=sys.stderr, flush=True)


def check_fresh(run_dir: Path, config: dict[str, Any], *,
                normalize: Callable[[dict[str, Any]], dict[str, Any]],
                budget_fields: Iterable[str]) -> None:
    """Refuse to start a run of ``config`` (plain data) in a directory that holds a run,
    unless that run never reached a checkpoint and has this very config (then it starts
    again from the beginning: nothing is lost). ``normalize`` brings a saved config to
    today's form; ``budget_fields`` may differ."""
    if not (run_dir / CONFIG_FILE).exists():
        return
    if had_checkpoints(run_dir):
        raise RunError(f"{run_dir} already holds a run; continue it with `metarl resume "
                       f"{run_dir}` or choose another directory")
    try:
        saved = read_json(run_dir / CONFIG_FILE)
        if not isinstance(saved, dict):
            raise ValueError("config.json is not a table")
        changes = check_config_change(saved, config, budget_fields=budget_fields, accept=True,
                                      where=str(run_dir), normalize=normalize)
    except (RunError, ValueError):
        changes = [("config.json", "unreadable", "")]
    if changes:
        raise RunError(
            f"{run_dir} holds a run of another config that never reached its first "
            f"checkpoint (it differs in {', '.join(c[0] for c in changes)}). "
            f"`metarl resume {run_dir}` runs that config from the beginning; or choose "
            "another directory")
    notify(f"{run_dir} holds a run of this config that never reached its first checkpoint "
           "(nothing was lost); starting it from the beginning")
