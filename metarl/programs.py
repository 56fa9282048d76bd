"""Compiled programs shared by equal configs within a process.

A run kind builds its jitted programs (a generation, a PBT segment, an initialisation) from
its config. Built again for an equal config (a run resumed or evaluated in the process that
started it, a notebook cell run twice, many tests of one experiment), ``jax.jit`` of a new
function object traces, lowers and compiles everything again; on a CPU, tracing and
lowering a tiny PPO generation costs about as much as compiling it. :func:`shared_program`
hands out the program built the first time instead.

Only what can enter a traced program keys it (:func:`program_key`): the config without its
name and its I/O settings (directories, progress bar, checkpoint cadence and retention,
trackers, the invalid-generation limit), plus the mesh and whatever else the caller adds.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax

# Run settings read only between steps (by the run-directory layer), never when tracing.
IO_RUN_FIELDS = ("output_dir", "progress", "checkpoint_every", "keep_checkpoints",
                 "trackers", "max_invalid_generations")
KEPT = 32  # programs kept, the least recently used dropped first
# XLA's backend optimisation level of the programs that judge on a CPU (below)
JUDGING_CPU_LEVEL = 1

_PROGRAMS: OrderedDict[tuple, Any] = OrderedDict()
_LOCK = threading.RLock()


def program_key(config: Any, *extra: Hashable) -> tuple:
    """A hashable key of what ``config`` (a run kind's config, with ``to_dict()``) can put
    into a traced program, followed by ``extra`` (e.g. the mesh, a program's name)."""
    data = config.to_dict()
    data.pop("name", None)
    run = data.get("run")
    if isinstance(run, dict):
        for field in IO_RUN_FIELDS:
            run.pop(field, None)
    return (json.dumps(data, sort_keys=True, default=repr), *extra)


def shared_program(key: tuple, build: Callable[[], Any]) -> Any:
    """The program an earlier call built for an equal ``key``, or ``build()`` (kept for
    the next). ``build`` must make the same computation for every equal key."""
    with _LOCK:  # an evaluation trains several environments at once, in threads
        if key in _PROGRAMS:
            _PROGRAMS.move_to_end(key)
            return _PROGRAMS[key]
        program = _PROGRAMS[key] = build()
        while len(_PROGRAMS) > KEPT:
            _PROGRAMS.popitem(last=False)
        return program


def judging_compiler_options() -> dict[str, int] | None:
    """The XLA options of the programs that train agents to be judged or compared (an
    evaluation's held-out rows, tuning searches, curves across a knob, ``metarl sweep``).

    On a CPU: backend optimisation level :data:`JUDGING_CPU_LEVEL` instead of XLA's
    default 3. Measured on the 2-core CPU for PPO, DQN, TD3 and SAC, level 1 compiles
    1.5-1.7 times faster and trains as fast (``benchmarks/compile_time.py``); judging
    compiles a few programs per objective and environment, so compiling is a third to a
    half of its time. Results agree with level 3's to float rounding, not bit for bit,
    which is why evolution's own programs keep XLA's default: a run reproduces its records
    exactly. ``None`` (XLA's default) on other backends, and where ``XLA_FLAGS`` already
    names a level (the user's choice, or the test suite's). The training store keys its
    entries by this choice too (:func:`metarl.evolve.store.code_version`)."""
    if "--xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return None
    if jax.default_backend() != "cpu":
        return None
    return {"xla_backend_optimization_level": JUDGING_CPU_LEVEL}
