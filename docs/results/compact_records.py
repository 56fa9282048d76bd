"""Compact the records and figures kept under docs/results; running it again changes nothing.

    python docs/results/compact_records.py [FOLDER ...]     (default: docs/results)

- Every JSON record holding learning curves (any dict whose ``curves`` is a list of
  per-seed rows: the results of evaluations and sweeps) has them compacted by
  :func:`metarl.curves.compact_result` (at most 80 evenly spaced updates, the first and
  last among them, with their numbers in ``curve_updates``; 5 significant digits) and is
  written again by :func:`metarl.curves.record_text`. Scores, statistics and verdicts were
  computed from the full curves when the record was made and are kept as they are: before
  a file is replaced, every value but the curves is checked to read back equal.
- Every PNG that is not yet a palette image is saved again as one of 256 colours without
  dithering, at its dpi (:func:`metarl.figures.style.palette_png`, what the library saves
  new figures with): no visible change for line plots, about a quarter of the bytes. One
  with see-through pixels is left as it is.

Records and figures written since then (``metarl evaluate``, ``metarl sweep``, ``metarl
plot``) are compact already; this is for the ones committed before, and for old run folders.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from metarl.curves import compact_result, record_text
from metarl.figures.style import palette_png

RESULTS = Path(__file__).resolve().parent


def _holds_curves(value: Any) -> bool:
    curves = value.get("curves") if isinstance(value, dict) else None
    return isinstance(curves, list) and all(isinstance(row, list) for row in curves)


def compacted(data: Any) -> Any:
    """``data`` with every dict that holds learning curves compacted."""
    if isinstance(data, dict):
        data = compact_result(data) if _holds_curves(data) else data
        return {key: compacted(value) for key, value in data.items()}
    if isinstance(data, list):
        return [compacted(value) for value in data]
    return data


def without_curves(data: Any) -> Any:
    """``data`` with the curves (and their update numbers) of every such dict left out."""
    if isinstance(data, dict):
        left_out = ("curves", "curve_updates") if _holds_curves(data) else ()
        return {key: without_curves(value) for key, value in data.items()
                if key not in left_out}
    if isinstance(data, list):
        return [without_curves(value) for value in data]
    return data


def holds_curves(data: Any) -> bool:
    """Whether any dict in ``data`` holds learning curves."""
    if isinstance(data, dict):
        return _holds_curves(data) or any(holds_curves(value) for value in data.values())
    return isinstance(data, list) and any(holds_curves(value) for value in data)


def compact_record(path: Path) -> bool:
    """Rewrite the JSON record ``path`` with compacted curves; whether it changed (a file
    without learning curves is left as it is)."""
    text = path.read_text()
    if '"curves"' not in text:
        return False
    data = json.loads(text)
    new = record_text(compacted(data))
    if new == text or not holds_curves(data):
        return False
    if json.dumps(without_curves(json.loads(new))) != json.dumps(without_curves(data)):
        raise RuntimeError(f"{path}: compacting its curves changed another value")
    path.write_text(new)
    return True


def compact_png(path: Path) -> bool:
    """Save the PNG ``path`` again as a palette image; whether it changed."""
    data = path.read_bytes()
    palette = palette_png(data)
    if palette == data:
        return False
    path.write_bytes(palette)
    return True


def main(folders: list[str]) -> int:
    changed = 0
    for folder in [Path(f) for f in folders] or [RESULTS]:
        for path in sorted(folder.rglob("*.json")):
            changed += compact_record(path)
        for path in sorted(folder.rglob("*.png")):
            changed += compact_png(path)
    print(f"compacted {changed} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
