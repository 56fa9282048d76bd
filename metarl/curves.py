"""Learning curves as records keep them: downsampled, rounded, and one row to a line.

A held-out evaluation or a sweep trains agents for hundreds to thousands of updates, and a
record that kept every update of every seed at full precision ran to megabytes. What the
record's verdicts and tables use (each seed's score, its mean and intervals) is computed
from the full curves before they are saved; the saved curves are only drawn. So they are
kept at :data:`MAX_POINTS` evenly spaced updates (the first and the last always among
them) and :data:`SIGNIFICANT_DIGITS` significant digits, with the 1-based update number of
each kept point in ``curve_updates`` beside them, which puts a figure's x positions where
they were. Records written before this have full curves and no ``curve_updates``: their
points are updates ``1..U`` (:func:`curve_updates`), so both kinds read the same way.

:func:`compact_curves` is what every writer of curves calls; :func:`record_text` writes a
record as indented JSON with each list of numbers on one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["CURVE_UPDATES", "MAX_POINTS", "SIGNIFICANT_DIGITS", "compact_curves",
           "compact_result", "curve_updates", "kept_updates", "record_text"]

MAX_POINTS = 80
SIGNIFICANT_DIGITS = 5
CURVE_UPDATES = "curve_updates"


def kept_updates(num_updates: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """``[K]`` 0-based indices of the updates a curve of ``num_updates`` keeps: all of them
    up to ``max_points``, else ``max_points`` evenly spaced ones from the first to the
    last."""
    if max_points < 2:
        raise ValueError(f"max_points: need at least 2 (the first and last update), "
                         f"got {max_points}")
    if num_updates <= max_points:
        return np.arange(num_updates)
    return np.unique(np.round(np.linspace(0, num_updates - 1, max_points)).astype(int))


def _rounded(value: float, digits: int) -> float | int | None:
    if value is None or math.isnan(value):
        return None
    rounded = float(f"{value:.{digits}g}")
    # 103 rather than 103.0: episode returns are whole numbers half of the time
    return int(rounded) if rounded.is_integer() and abs(rounded) < 1e15 else rounded


def compact_curves(curves, updates: Sequence[int] | None = None,
                   max_points: int = MAX_POINTS, digits: int = SIGNIFICANT_DIGITS
                   ) -> dict[str, list]:
    """The curves a record keeps: ``curves [S, U]`` (NaN or None where no episode had
    finished) -> ``{"curves": [S, K], "curve_updates": [K]}``, the points at
    :func:`kept_updates` rounded to ``digits`` significant digits (NaN as None, a whole
    number as an int), and the 1-based update number of each. ``updates`` gives the update
    numbers of ``curves``' columns where they are already a selection (a compacted
    record), else ``1..U``.
    Compacting compacted curves returns them unchanged."""
    values = np.asarray([[np.nan if v is None else v for v in row] for row in curves],
                        np.float64)
    if values.size == 0:
        return {"curves": [list(row) for row in curves], CURVE_UPDATES: []}
    numbers = (np.arange(1, values.shape[1] + 1) if updates is None
               else np.asarray(updates, np.int64))
    if numbers.shape != values.shape[1:]:
        raise ValueError(f"compact_curves: {numbers.size} update numbers for curves of "
                         f"{values.shape[1]} points")
    kept = kept_updates(values.shape[1], max_points)
    return {"curves": [[_rounded(v, digits) for v in row] for row in values[:, kept].tolist()],
            CURVE_UPDATES: [int(n) for n in numbers[kept]]}


def compact_result(result: Mapping[str, Any], max_points: int = MAX_POINTS,
                   digits: int = SIGNIFICANT_DIGITS) -> dict[str, Any]:
    """A saved result (a dict with ``curves [S, U]``, full or compacted) with its curves
    compacted (:func:`compact_curves`) and every other entry as it was."""
    compact = compact_curves(result["curves"], result.get(CURVE_UPDATES), max_points, digits)
    return {**result, **compact}


def curve_updates(result: Mapping[str, Any]) -> np.ndarray:
    """``[K]`` 1-based update number of each point of a saved result's ``curves [S, K]``:
    its ``curve_updates``, or ``1..K`` for a record with full curves."""
    saved = result.get(CURVE_UPDATES)
    if saved is not None:
        return np.asarray(saved, np.int64)
    curves = result.get("curves") or []
    return np.arange(1, (len(curves[0]) if curves else 0) + 1)


def _key(key: Any) -> str:
    return json.dumps(key if isinstance(key, str) else json.dumps(key) if key is None
                      or isinstance(key, bool) else str(key))


def record_text(data: Any, indent: int = 1) -> str:
    """``data`` as JSON indented by ``indent`` per level (as ``json.dumps(data,
    indent=indent)``), except that a list or dict holding no list or dict is written on
    one line, without spaces after commas: a curve of 80 points is one line, not 80.
    Ends with a newline; reads back with ``json.loads`` to the same data."""

    def dump(value: Any, depth: int) -> str:
        inner, outer = " " * (indent * (depth + 1)), " " * (indent * depth)
        nested = isinstance(value, (list, tuple, dict)) and any(
            isinstance(v, (list, tuple, dict))
            for v in (value.values() if isinstance(value, dict) else value))
        if not nested:
            return json.dumps(value, separators=(",", ":"))
        if isinstance(value, dict):
            items = [f"{inner}{_key(k)}: {dump(v, depth + 1)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + f"\n{outer}}}"
        items = [f"{inner}{dump(v, depth + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{outer}]"

    return dump(data, 0) + "\n"
