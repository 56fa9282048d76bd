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
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

# Run settings read only between steps (by the run-directory layer), never when tracing.
IO_RUN_FIELDS = ("output_dir", "progress", "checkpoint_every", "keep_checkpoints",
                 "trackers", "max_invalid_generations")
KEPT = 32  # programs kept, the least recently used dropped first

_PROGRAMS: OrderedDict[tuple, Any] = OrderedDict()


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
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    program = _PROGRAMS[key] = build()
    while len(_PROGRAMS) > KEPT:
        _PROGRAMS.popitem(last=False)
    return program


def strong_types(tree: Any) -> Any:
    """``tree`` without weak types (what a checkpoint restores), so that a carried state's
    avals never change between steps and its program compiles once."""
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), tree)
