"""The run-directory layer that every run kind (evolve, pbt, cem_rl, dvd) shares.

One module per job:

- :mod:`~metarl.runs.layout`: the files of a run directory, atomic writes, the errors
  (:class:`RunError`, exit code 2; :class:`RunStopped`, exit code 3;
  :class:`RunInterrupted`, exit code 4);
- :mod:`~metarl.runs.lock`: one writer per directory (``flock``, released by the OS);
- :mod:`~metarl.runs.config_history`: the saved config against the current one, and the
  record of accepted changes;
- :mod:`~metarl.runs.checkpoint`: orbax checkpoints, retention that holds across resumes,
  damaged checkpoints told apart from incompatible ones;
- :mod:`~metarl.runs.start`: a new run's directory, created and locked the same way for
  every run kind;
- :mod:`~metarl.runs.resume`: the rules by which a run continues;
- :mod:`~metarl.runs.meta_params`: the meta-parameter files beside the checkpoints;
- :mod:`~metarl.runs.evaluations`: evaluations that accumulate instead of replacing each
  other;
- :mod:`~metarl.runs.trackers`: a run's metrics and figures sent to TensorBoard or W&B;
- :mod:`~metarl.runs.listing`: ``metarl runs``;
- :mod:`~metarl.runs.stopping`: a time limit and the signals that stop a run cleanly;
- :mod:`~metarl.runs.archive`: a run directory packed into one file and unpacked
  (``metarl pack`` / ``metarl unpack``);
- :mod:`~metarl.runs.replicates`: a parent directory of runs started and continued together
  (replicated evolution);
- :mod:`~metarl.runs.engine`: the loop every kind runs on (steps, metrics, checkpoints,
  trackers, the stop after invalid steps), its start, resume and read-back, and the loop of
  several runs advanced by one joint program.

Importing this package starts no JAX computation (nor does :mod:`~metarl.runs.listing`).
"""

from metarl.runs.layout import (
    CheckpointError,
    DiskFullError,
    RunError,
    RunInterrupted,
    RunStopped,
    atomic_write,
    read_metrics,
)
from metarl.runs.lock import RunLockedError, acquire, lock_holder

__all__ = [
    "CheckpointError",
    "DiskFullError",
    "RunError",
    "RunInterrupted",
    "RunLockedError",
    "RunStopped",
    "acquire",
    "atomic_write",
    "lock_holder",
    "read_metrics",
]
