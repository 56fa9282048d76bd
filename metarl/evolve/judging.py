"""What every judgement of an objective shares: the names of its rows, which rows are
judged against which, and the plain-text tables reports print."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EVOLVED", "START", "TUNED", "comparison_pairs", "evaluation_figure_path",
           "held_out_scores", "save_evaluation_figure", "text_table"]

EVOLVED = "evolved"
START = "start"  # the search's starting point (``start=True``)
TUNED = " (tuned)"


def comparison_pairs(objectives: Sequence[str]) -> list[tuple[str, str]]:
    """Which objectives evaluated on one environment are judged against which:
    ``(evolved, baseline)`` pairs, in the order the objectives come.

    ``"evolved"`` against every other objective whose name does not end in ``" (tuned)"``,
    and, when there is an ``"evolved (tuned)"``, that one against every other objective
    whose name ends in ``" (tuned)"`` (each tuned with the same budget)."""
    names = list(dict.fromkeys(objectives))
    pairs = []
    if EVOLVED in names:
        pairs += [(EVOLVED, name) for name in names
                  if name != EVOLVED and not name.endswith(TUNED)]
    tuned = EVOLVED + TUNED
    if tuned in names:
        pairs += [(tuned, name) for name in names if name != tuned and name.endswith(TUNED)]
    return pairs


def text_table(rows: list[tuple[str, ...]]) -> str:
    """``rows`` (the first a header) as aligned columns, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def held_out_scores(result: Mapping[str, Any]) -> np.ndarray:
    """``[S]`` scores of one saved result (an :class:`ObjectiveResult` as a dict, from a
    record of any version): its ``returns``, with the seeds it marks invalid set to NaN."""
    scores = np.asarray([np.nan if r is None else r for r in result.get("returns") or []],
                        np.float64)
    valid = result.get("valid")
    if valid is not None and len(valid) == scores.size:
        scores[~np.asarray(valid, bool)] = np.nan
    return scores


def evaluation_figure_path(run_dir: str | Path, prefix: str, record_id: Any) -> Path:
    """Where a figure of evaluation ``record_id`` is saved: ``plots/<prefix>_<id>.png``."""
    from metarl.runs.layout import PLOTS_DIR

    return Path(run_dir) / PLOTS_DIR / f"{prefix}_{record_id}.png"


def save_evaluation_figure(fig, run_dir: str | Path, prefix: str, record_id: Any) -> Path:
    """Save ``fig`` (a matplotlib figure) at :func:`evaluation_figure_path` as a palette
    PNG and return the path."""
    from metarl.figures.style import save_png

    path = evaluation_figure_path(run_dir, prefix, record_id)
    path.parent.mkdir(exist_ok=True)
    return save_png(fig, path)
