"""Orbax checkpoints of evolution runs: save every k generations, restore, resume.

A checkpoint at step ``g`` (generations completed) holds two items:

- ``state``: the whole :class:`~metarl.evolution.EvolutionState` (ES state, random key,
  generation counter, best meta-parameters so far, baselines), saved with
  ``StandardSave``;
- ``meta``: JSON with the resolved config and every generation's summary metrics so far.

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save leaves an incomplete directory that is never restored; this module
warns about such leftovers. The last ``keep`` checkpoints are kept, plus the one whose
generation scored the best fitness.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import AnyPreservationPolicy, BestN, LatestN

CHECKPOINT_DIR = "checkpoints"
_TMP_MARKER = "orbax-checkpoint-tmp"


class CheckpointError(RuntimeError):
    """A run cannot be restored (missing, incomplete or incompatible with its config)."""


def _quiet_orbax() -> None:
    logging.getLogger("absl").setLevel(logging.WARNING)


def _path_name(path) -> str:
    """``a/b/0`` for a pytree path, whether it walks dataclass fields, dict keys or lists."""
    parts = []
    for entry in path:
        for attribute in ("name", "key", "idx"):
            if hasattr(entry, attribute):
                parts.append(str(getattr(entry, attribute)))
                break
    return "/".join(parts)


class RunCheckpointer:
    """Saves and restores the checkpoints of one run directory."""

    def __init__(self, run_dir: str | Path, keep: int = 3):
        _quiet_orbax()
        self.directory = Path(run_dir).resolve() / CHECKPOINT_DIR
        self._warn_incomplete()
        policy = AnyPreservationPolicy(
            [
                LatestN(n=keep),
                BestN(get_metric_fn=lambda m: m["generation_best_fitness"], n=1),
            ]
        )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy,
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

    def _warn_incomplete(self) -> None:
        if not self.directory.is_dir():
            return
        leftovers = sorted(p.name for p in self.directory.iterdir() if _TMP_MARKER in p.name)
        if leftovers:
            warnings.warn(
                f"skipping incomplete checkpoint(s) in {self.directory}: {', '.join(leftovers)} "
                "(a save was interrupted); resuming from the last complete one",
                stacklevel=3,
            )

    def latest_generation(self) -> int | None:
        return self.manager.latest_step()

    def all_generations(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, generation: int, state: Any, meta: dict[str, Any],
             generation_best_fitness: float) -> None:
        """Save ``state`` and ``meta`` as checkpoint ``generation`` (blocking, atomic)."""
        self.manager.save(
            generation,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            metrics={"generation_best_fitness": float(generation_best_fitness)},
        )
        self.manager.wait_until_finished()

    def restore(self, template_state: Any, generation: int | None = None
                ) -> tuple[int, Any, dict[str, Any]]:
        """Restore ``(generation, state, meta)``; the latest complete one by default.

        ``template_state`` fixes the structure, shapes and dtypes; a checkpoint that does not
        match them (for example after the config changed) raises :class:`CheckpointError`.
        """
        if generation is None:
            generation = self.latest_generation()
        if generation is None:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        self._check_compatible(generation, template_state)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template_state)
        restored = self.manager.restore(
            generation,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return generation, restored["state"], restored["meta"]

    def _check_compatible(self, generation: int, template_state: Any) -> None:
        saved = self.manager.item_metadata(generation)["state"]
        saved_leaves = jax.tree_util.tree_leaves_with_path(saved)
        wanted_leaves = jax.tree_util.tree_leaves_with_path(template_state)
        saved_shapes = {_path_name(p): tuple(m.shape) for p, m in saved_leaves}
        for path, leaf in wanted_leaves:
            name = _path_name(path)
            shape = tuple(np.shape(leaf))
            if name not in saved_shapes:
                raise CheckpointError(
                    f"checkpoint {generation} has no entry {name}: the run's config no longer "
                    "matches what was saved"
                )
            if saved_shapes[name] != shape:
                raise CheckpointError(
                    f"checkpoint {generation}: {name} was saved with shape {saved_shapes[name]} "
                    f"but the config now gives {shape}; the run's config no longer matches "
                    "what was saved"
                )
        if len(saved_shapes) != len(wanted_leaves):
            raise CheckpointError(
                f"checkpoint {generation} holds {len(saved_shapes)} arrays but the config "
                f"gives {len(wanted_leaves)}; the run's config no longer matches what was saved"
            )

    def close(self) -> None:
        self.manager.close()
