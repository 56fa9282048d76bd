"""What every figure shares: one colour per role, figures built without pyplot, and the
mean-and-interval bands drawn over seeds."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

# One colour per role, the same in every figure.
CANDIDATE_COLOURS = ("C0", "C1", "C4", "C5", "C6", "C8", "C9")
BASELINE_COLOURS = {"ppo": "C3", "l2": "C1", "dpo": "C2"}
SEQUENTIAL_CMAP = "viridis"


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` × ``height`` inches with constrained layout, made without
    pyplot: nothing is shown and no GUI backend is needed (save it with ``savefig``)."""
    return Figure(figsize=(width, height), layout="constrained")


def as_float_array(values) -> np.ndarray:
    """``values`` (a NumPy or JAX array, a list with ``None`` for missing entries) as
    float64 with NaN where an entry is missing."""
    if isinstance(values, list | tuple):
        values = [[np.nan if v is None else v for v in row] if isinstance(row, list | tuple)
                  else (np.nan if row is None else row) for row in values]
    return np.asarray(values, np.float64)


def mean_ci(curves: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, ...]:
    """Per-column mean over seeds and a Student-t confidence interval, ignoring NaN:
    ``curves [S, U] -> (mean, low, high)``, each ``[U]``."""
    from scipy import stats

    count = np.sum(np.isfinite(curves), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(np.where(count[None] > 0, curves, 0.0), axis=0)
        mean = np.where(count > 0, mean, np.nan)
        std = np.nanstd(np.where(count[None] > 1, curves, 0.0), axis=0, ddof=1)
        half = stats.t.ppf(0.5 + confidence / 2, np.maximum(count - 1, 1)) * std / np.sqrt(count)
    half = np.where(count > 1, half, 0.0)
    return mean, mean - half, mean + half
