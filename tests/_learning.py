"""Long learning checks in subprocesses: start one when its test module starts, so it trains
on the second core while the module's other tests compile; read its metrics when needed.

A worker is a Python source text run as ``python -c WORKER OUT_NPZ SEEDS``: it trains
``SEEDS`` agents and saves their metrics (a dict of arrays) with ``np.savez(OUT_NPZ, ...)``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _xla import learning_env


def start_learning_run(worker: str, folder: Path, seeds: int) -> subprocess.Popen:
    """Start ``worker`` for ``seeds`` agents; its stderr goes to ``folder/stderr.txt``."""
    with open(folder / "stderr.txt", "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", worker, str(folder / "metrics.npz"), str(seeds)],
            stdout=subprocess.DEVNULL, stderr=stderr, env=learning_env(),
        )


def stop_learning_run(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def learning_metrics(process: subprocess.Popen, folder: Path, timeout: float,
                     what: str) -> dict[str, np.ndarray]:
    """Wait for the run (failing the test after ``timeout`` seconds, or when it fails)
    and return its saved metrics."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_learning_run(process)
        pytest.fail(f"{what} did not finish within {timeout} s")
    assert process.returncode == 0, (folder / "stderr.txt").read_text()[-4000:]
    with np.load(folder / "metrics.npz") as data:
        return {name: data[name] for name in data.files}


def start_first(request, fixture: str, marker: str) -> None:
    """In a module-scoped autouse fixture: request ``fixture`` (which starts the run) at
    the start of the module when a test whose name contains ``marker`` is selected."""
    if any(item.module is request.module and marker in item.name
           for item in request.session.items):
        request.getfixturevalue(fixture)
