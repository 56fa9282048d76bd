"""What every figure shares: one colour per role, figures built without pyplot, the
mean-and-interval bands drawn over seeds, and PNGs saved as palette images."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

# One colour per role, the same in every figure.
CANDIDATE_COLOURS = ("C0", "C1", "C4", "C5", "C6", "C8", "C9")
BASELINE_COLOURS = {"ppo": "C3", "l2": "C1", "dpo": "C2"}
SEQUENTIAL_CMAP = "viridis"
DPI = 110  # of every PNG the library saves
PALETTE_COLOURS = 256
SMOOTH_FIELD_SHARE = 0.2


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` × ``height`` inches with constrained layout, made without
    pyplot: nothing is shown and no GUI backend is needed (save it with ``savefig``)."""
    return Figure(figsize=(width, height), layout="constrained")


def save_png(fig: Figure, path: str | Path, dpi: int = DPI) -> Path:
    """Save ``fig`` at ``path`` as a palette PNG (:func:`palette_png`) of ``dpi`` pixels
    per inch; returns the path."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    Path(path).write_bytes(palette_png(buffer.getvalue()))
    return Path(path)


def palette_png(png: bytes) -> bytes:
    """A PNG's bytes as a palette image of :data:`PALETTE_COLOURS` colours, at its dpi: no
    visible change for a line plot, about a quarter of the bytes. The colours are chosen
    by Pillow's octree quantiser, which keeps the few saturated line colours that its
    median cut merges away, and set without dithering; where that moves more than
    :data:`SMOOTH_FIELD_SHARE` of the pixels (a smooth colour map, which the octree's
    coarse colour cube would show in bands), by the median cut. A palette image, or one
    with see-through pixels (which the palette would lose), comes back unchanged."""
    image = Image.open(io.BytesIO(png))
    see_through = "A" in image.getbands() and image.getchannel("A").getextrema()[0] < 255
    if image.mode == "P" or see_through:
        return png
    dpi = image.info.get("dpi")
    rgb = image.convert("RGB")
    palette = rgb.quantize(PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE,
                           dither=Image.Dither.NONE)
    moved = np.abs(np.asarray(palette.convert("RGB"), np.int16)
                   - np.asarray(rgb, np.int16)).max(axis=-1) > 4
    if moved.mean() > SMOOTH_FIELD_SHARE:
        palette = rgb.quantize(PALETTE_COLOURS, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    palette.save(buffer, "PNG", optimize=True, **({"dpi": dpi} if dpi else {}))
    return buffer.getvalue()


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
