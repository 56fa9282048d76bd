"""Orbax checkpoints of runs; kept for the names that code written before
:mod:`metarl.runs` imports from here. The implementation is :mod:`metarl.runs.checkpoint`."""

from metarl.runs.checkpoint import RunCheckpointer, retained_steps
from metarl.runs.layout import CHECKPOINT_DIR, CheckpointError

__all__ = ["CHECKPOINT_DIR", "CheckpointError", "RunCheckpointer", "retained_steps"]
