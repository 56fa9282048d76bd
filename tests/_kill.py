"""SIGKILL a ``metarl`` command in the middle of a checkpoint save (see _kill_worker.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
from _subprocess_env import jax_cache_env

KILL_WORKER = Path(__file__).parent / "_kill_worker.py"
PAUSE_WITHIN = "METARL_TEST_PAUSE_WITHIN"  # read by the worker


def kill_inside_save(step: int, args: list[str], timeout: float = 300,
                     within: str | None = None) -> None:
    """Start ``metarl run ARGS`` in a subprocess (``ARGS`` with or without ``run`` first),
    wait until it is inside the save of checkpoint ``step`` (of the directory named
    ``within``, e.g. one seed of a joint run, when given), and SIGKILL it."""
    env = {**os.environ, **jax_cache_env(), "JAX_NUM_CPU_DEVICES": str(jax.device_count()),
           "PYTHONUNBUFFERED": "1", PAUSE_WITHIN: within or ""}
    process = subprocess.Popen([sys.executable, str(KILL_WORKER), str(step), *args], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + timeout
        line = ""
        while "PAUSED_IN_SAVE" not in line:
            assert process.poll() is None and time.monotonic() < deadline, "no pause"
            line = process.stdout.readline()
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
