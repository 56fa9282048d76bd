"""Orbax checkpoints of a run: save every k steps, keep a few, read them back or say why not.

A checkpoint at step ``s`` (generations or segments completed) holds two items:

- ``state``: the run's whole state pytree (for evolution the
  :class:`~metarl.evolve.generation.EvolutionState`), saved with ``StandardSave``;
- ``meta``: JSON with the resolved config, every step's summary line so far
  (``history``) and the events recorded in the run (``events``).

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save leaves an incomplete directory that is never restored.

**Retention** is this module's, not orbax's: after each save the latest ``keep``
checkpoints are kept, plus the one whose step scored best (the ``best_fitness`` of its
summary line), and the others are deleted. The scores come from the history saved in
the checkpoints, so the rule holds across resumes (orbax's own preservation policies lose
their metrics when a run is resumed and then keep every checkpoint).

**Reading back** (:meth:`RunCheckpointer.read_meta`, :meth:`RunCheckpointer.restore_state`)
raises :class:`DamagedCheckpoint` for a checkpoint whose files are missing, truncated or
unreadable, and :class:`~metarl.runs.layout.CheckpointError` for one that reads back but
does not fit the config; :mod:`metarl.runs.resume` decides what to do with either.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from metarl.runs.layout import (
    CHECKPOINT_DIR,
    DAMAGED_DIR,
    CheckpointError,
    DiskFullError,
    is_disk_full,
)

TMP_MARKER = "orbax-checkpoint-tmp"
# A failed save's writer threads can go on creating files for a while on a loaded machine:
# its half-written directory counts as gone once it has stayed absent this many checks in a
# row, PARTIAL_SAVE_POLL_SECONDS apart, or when PARTIAL_SAVE_DEADLINE_SECONDS have passed.
PARTIAL_SAVE_QUIET_CHECKS = 3
PARTIAL_SAVE_POLL_SECONDS = 0.1
PARTIAL_SAVE_DEADLINE_SECONDS = 10.0


class DamagedCheckpoint(Exception):
    """A checkpoint's files are missing, truncated or unreadable."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"checkpoint {step}: {reason}")
        self.step, self.reason = step, reason


def _placed_like(restored: Any, template: Any) -> Any:
    """``restored`` committed to a device only where ``template`` is.

    Orbax places every restored array on its template's device and commits it there. A fresh
    state is not committed (it lives on the default device), and ``jax.jit`` keys its
    compiled programs on whether arguments are committed, so a run resumed in the process
    that started it would compile its step a second time for the same computation.
    """
    if (isinstance(template, jax.Array) and not template.committed
            and isinstance(restored, jax.Array) and restored.committed
            and not jax.dtypes.issubdtype(restored.dtype, jax.dtypes.prng_key)):
        return jax.device_put(np.asarray(restored))
    return restored


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else type(error).__name__
    return f"{type(error).__name__}: {message[:200]}"


def _ignore_late_callbacks() -> None:
    """After a read of a damaged checkpoint fails, tensorstore still delivers callbacks to
    the event loop orbax ran it on, which is closed by then; each one ends as an
    "unraisable" ``RuntimeError('Event loop is closed')`` printed with its traceback.
    They mean nothing (the failure was reported once already), so they are dropped; every
    other unraisable exception reaches the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "_metarl_filter", False):
        return

    def hook(unraisable):
        if (unraisable.exc_type is RuntimeError
                and str(unraisable.exc_value) == "Event loop is closed"):
            return
        previous(unraisable)

    hook._metarl_filter = True
    sys.unraisablehook = hook


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
    """Silence orbax's and asyncio's own error logs while we read or write checkpoints:
    failures reach the user once, as our error or warning naming the checkpoint."""
    _ignore_late_callbacks()
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def path_name(path) -> str:
    """``a/b/0`` for a pytree path, whether it walks dataclass fields, dict keys or lists."""
    parts = []
    for entry in path:
        for attribute in ("name", "key", "idx"):
            if hasattr(entry, attribute):
                parts.append(str(getattr(entry, attribute)))
                break
    return "/".join(parts)


def retained_steps(steps: list[int], scores: dict[int, float], keep: int) -> set[int]:
    """The latest ``keep`` of ``steps`` plus the best-scoring one (the earliest of equals;
    steps without a finite score never count as best)."""
    steps = sorted(steps)
    kept = set(steps[-keep:]) if keep > 0 else set()
    scored = [(scores[s], -s) for s in steps if math.isfinite(scores.get(s, math.nan))]
    if scored:
        kept.add(-max(scored)[1])
    return kept


def score_of_line(line: dict[str, Any], score_key: str = "best_fitness") -> float:
    value = line.get(score_key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return value if math.isfinite(value) else -math.inf


class RunCheckpointer:
    """Saves, lists, reads back and prunes the checkpoints of one run directory."""

    def __init__(self, run_dir: str | Path, keep: int = 3, step_key: str = "generation",
                 score: Callable[[dict[str, Any]], float] = score_of_line):
        logging.getLogger("absl").setLevel(logging.WARNING)
        self.run_dir = Path(run_dir).resolve()
        self.directory = self.run_dir / CHECKPOINT_DIR
        self.keep, self.step_key, self.score = keep, step_key, score
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # retention is ours (retained_steps), see the module doc
            enable_async_checkpointing=False,
            create=True,
        )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
        )

    # ---- listing

    def latest_generation(self) -> int | None:
        return self.manager.latest_step()

    def all_generations(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def incomplete(self) -> list[Path]:
        """Temporary directories of interrupted saves."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if TMP_MARKER in p.name)

    # ---- saving

    def save(self, generation: int, state: Any, meta: dict[str, Any],
             generation_best_fitness: float | None = None) -> None:
        """Save ``state`` and ``meta`` as checkpoint ``generation`` (blocking, atomic), then
        prune old checkpoints. A full disk raises :class:`DiskFullError`; the checkpoints
        saved before stay as they were."""
        try:
            with quiet_orbax():
                self.manager.save(
                    generation,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                    ),
                )
                self.manager.wait_until_finished()
        except Exception as error:
            self._remove_partial_save(generation)
            previous = [s for s in self.all_generations() if s != generation]
            kept = (f"the last checkpoint ({previous[-1]}) is intact" if previous
                    else "no earlier checkpoint exists")
            if is_disk_full(error):
                raise DiskFullError(
                    f"disk full while saving checkpoint {generation} in {self.directory}; "
                    f"it was not written and {kept}. Free some space, then continue with "
                    f"`metarl resume {self.run_dir}`"
                ) from error
            if isinstance(error, OSError):
                raise CheckpointError(
                    f"could not save checkpoint {generation} in {self.directory} "
                    f"({_first_line(error)}); {kept}"
                ) from error
            raise
        scores = {int(line[self.step_key]): self.score(line)
                  for line in meta.get("history", []) if self.step_key in line}
        if generation_best_fitness is not None:
            scores[generation] = score_of_line({"s": generation_best_fitness}, "s")
        self.prune(scores)

    def prune(self, scores: dict[int, float]) -> None:
        """Delete every checkpoint that :func:`retained_steps` does not keep."""
        steps = self.all_generations()
        for step in sorted(set(steps) - retained_steps(steps, scores, self.keep)):
            with quiet_orbax():
                self.manager.delete(step)

    def _remove_partial_save(self, step: int) -> None:
        """Remove this process's own half-written save (it can never be restored, and on a
        full disk it holds the space the user needs)."""
        from metarl import distributed

        if not distributed.is_primary():
            return
        try:  # let orbax's writer threads stop first: they may still be adding files
            with quiet_orbax():
                self.manager.wait_until_finished()
        except Exception:  # noqa: BLE001 - the failed save's own error, reported by save()
            pass
        deadline = time.monotonic() + PARTIAL_SAVE_DEADLINE_SECONDS
        quiet = 0
        while quiet < PARTIAL_SAVE_QUIET_CHECKS and time.monotonic() < deadline:
            leftover = [path for path in self.incomplete()
                        if path.name.split(".")[0] == str(step)]
            quiet = 0 if leftover else quiet + 1
            for path in leftover:
                shutil.rmtree(path, ignore_errors=True)
            if quiet < PARTIAL_SAVE_QUIET_CHECKS:
                time.sleep(PARTIAL_SAVE_POLL_SECONDS)

    # ---- reading back

    def read_meta(self, step: int) -> dict[str, Any]:
        """The ``meta`` item of checkpoint ``step`` (:class:`DamagedCheckpoint` if it does
        not read back as the JSON object a run saves)."""
        try:
            with quiet_orbax():
                restored = self.manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = restored["meta"]
        except Exception as error:
            raise DamagedCheckpoint(step, f"its meta item does not read back "
                                          f"({_first_line(error)})") from error
        if not (isinstance(meta, dict) and isinstance(meta.get("config"), dict)
                and isinstance(meta.get("history"), list)):
            raise DamagedCheckpoint(step, "its meta item lacks the config or the history")
        return meta

    def check_compatible(self, step: int, template_state: Any) -> None:
        """Raise :class:`CheckpointError` if ``step``'s arrays do not have the structure and
        shapes of ``template_state`` (:class:`DamagedCheckpoint` if they cannot be read)."""
        try:
            with quiet_orbax():
                saved = self.manager.item_metadata(step)["state"]
        except Exception as error:
            raise DamagedCheckpoint(step, f"its state metadata does not read back "
                                          f"({_first_line(error)})") from error
        if saved is None:
            raise DamagedCheckpoint(step, "its state metadata is missing")
        saved_shapes = {path_name(p): tuple(m.shape)
                        for p, m in jax.tree_util.tree_leaves_with_path(saved)}
        wanted = jax.tree_util.tree_leaves_with_path(template_state)
        for path, leaf in wanted:
            name, shape = path_name(path), tuple(np.shape(leaf))
            if name not in saved_shapes:
                raise CheckpointError(
                    f"checkpoint {step} has no entry {name}: the run's config no longer "
                    "matches what was saved")
            if saved_shapes[name] != shape:
                raise CheckpointError(
                    f"checkpoint {step}: {name} was saved with shape {saved_shapes[name]} "
                    f"but the config now gives {shape}; the run's config no longer matches "
                    "what was saved")
        if len(saved_shapes) != len(wanted):
            raise CheckpointError(
                f"checkpoint {step} holds {len(saved_shapes)} arrays but the config gives "
                f"{len(wanted)}; the run's config no longer matches what was saved")

    def restore_state(self, step: int, template_state: Any) -> Any:
        """The ``state`` item of checkpoint ``step``, with ``template_state``'s structure,
        shapes and dtypes. Raises :class:`CheckpointError` when it does not fit the
        template and :class:`DamagedCheckpoint` when its files do not read back."""
        self.check_compatible(step, template_state)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template_state)
        try:
            with quiet_orbax():
                restored = self.manager.restore(
                    step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
            state = restored["state"]
            jax.block_until_ready(state)
        except Exception as error:
            raise DamagedCheckpoint(step, f"its arrays do not read back "
                                          f"({_first_line(error)})") from error
        return jax.tree.map(_placed_like, state, template_state)

    def restore(self, template_state: Any, generation: int | None = None
                ) -> tuple[int, Any, dict[str, Any]]:
        """Restore ``(step, state, meta)`` of one checkpoint, the latest by default, without
        falling back to older ones (:mod:`metarl.runs.resume` does that)."""
        if generation is None:
            generation = self.latest_generation()
        if generation is None:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        try:
            meta = self.read_meta(generation)
            state = self.restore_state(generation, template_state)
        except DamagedCheckpoint as damaged:
            raise CheckpointError(str(damaged)) from damaged
        return generation, state, meta

    def close(self) -> None:
        self.manager.close()


def move_aside(run_dir: Path, path: Path) -> Path:
    """Move ``path`` (a damaged or incomplete checkpoint) into ``damaged-checkpoints/``
    under a name not yet taken there; never deletes anything."""
    target_dir = run_dir / DAMAGED_DIR
    target_dir.mkdir(exist_ok=True)
    target, suffix = target_dir / path.name, 1
    while target.exists():
        target = target_dir / f"{path.name}-{suffix}"
        suffix += 1
    os.replace(path, target)
    return target
