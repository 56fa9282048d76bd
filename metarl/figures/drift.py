"""Figures of drift functions ``D(r, A)``: the penalty LPO-style policy losses subtract
from ``r A``.

Every function takes drifts as callables ``drift_fn(ratio, advantage[, progress])`` that
broadcast NumPy arrays and return an array of drifts (e.g. the ``drift_fn`` of
:mod:`metarl.objectives.lpo`). A callable may carry a ``label`` (its name in titles and
legends) and ``uses_progress`` (whether its value depends on training progress). Reference
drifts (PPO's clip, DPO's closed form, ...) are passed in as ``{label: drift_fn}``: this
module knows no objective. Each returns a :class:`matplotlib.figure.Figure`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from metarl.figures.style import CANDIDATE_COLOURS, SEQUENTIAL_CMAP, new_figure

DriftFn = Callable[..., Any]  # (ratio [...], advantage [...], progress=0.0) -> drift [...]
# How reference drifts are drawn, in the order they are given.
REFERENCE_STYLES = ({"color": "black", "ls": "--", "lw": 1.5},
                    {"color": "C2", "ls": ":", "lw": 2.0},
                    {"color": "C7", "ls": "-.", "lw": 1.5})

def _ratio_grid(ratio_range: tuple[float, float], num: int, log_ratio: bool) -> np.ndarray:
    low, high = ratio_range
    if not 0 < low < high:
        raise ValueError(f"ratio_range: need 0 < low < high, got {ratio_range}")
    grid = np.geomspace(low, high, num) if log_ratio else np.linspace(low, high, num)
    # Make sure r = 1 itself is a grid point: every drift vanishes exactly there.
    if low < 1 < high:
        grid = np.unique(np.append(grid, 1.0))
    return grid


def _format_ratio_axis(ax, ratio_range: tuple[float, float], log_ratio: bool) -> None:
    ax.set_xlim(*ratio_range)
    if log_ratio:
        ax.set_xscale("log")
        candidates = (0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0)
        ticks = [t for t in candidates if ratio_range[0] <= t <= ratio_range[1]]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())  # log minor ticks cost much and say little


def _finish_drift_slice(ax, ratio_range: tuple[float, float], log_ratio: bool, ylabel: str,
                        title: str, ncol: int = 1) -> None:
    """Axes, labels and legend of one drift-over-ratio slice at a fixed advantage."""
    ax.axvline(1.0, color="0.7", lw=0.8, zorder=0)
    _format_ratio_axis(ax, ratio_range, log_ratio)
    ax.set_xlabel("probability ratio r")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=ncol)


def _evaluate_drift(drift_fn: DriftFn, ratio, advantage, progress=None) -> np.ndarray:
    ratio = np.asarray(ratio, np.float32)
    advantage = np.asarray(advantage, np.float32)
    if progress is None:
        return np.asarray(drift_fn(ratio, advantage), np.float64)
    return np.asarray(drift_fn(ratio, advantage, progress=np.float32(progress)), np.float64)


def _drift_name(drift_fn: DriftFn, label: str | None) -> str:
    if label is not None:
        return label
    return getattr(drift_fn, "label", None) or "drift"


def _styled(references: Mapping[str, DriftFn]) -> list[tuple[str, DriftFn, dict]]:
    return [(str(label), fn, REFERENCE_STYLES[i % len(REFERENCE_STYLES)])
            for i, (label, fn) in enumerate(references.items())]


def plot_drift(
    drift_fn: DriftFn,
    *,
    label: str | None = None,
    ratio_range: tuple[float, float] = (0.5, 2.0),
    advantage_range: tuple[float, float] = (-2.0, 2.0),
    log_ratio: bool = True,
    progress: float = 0.0,
    slice_advantages: Sequence[float] = (1.0, -1.0),
    references: Mapping[str, DriftFn] | None = None,
    clip_eps: float = 0.2,
    num_points: int = 201,
    title: str | None = None,
) -> Figure:
    """A drift ``D(r, A)`` as a heatmap over ratio × advantage, plus slices at fixed ``A``.

    The policy maximises ``r A - D(r, A)``: the drift is the penalty for moving the ratio
    ``r = π_new / π_old`` away from 1 when the advantage is ``A``. The heatmap marks ``r = 1``
    and PPO's clip range; each slice panel draws the drift at one advantage next to the
    ``references`` (e.g. PPO's clipping drift ``relu((r - clip(r, 1 ± ε)) A)`` and DPO's
    closed form: :func:`metarl.objectives.lpo.reference_drifts`).

    Args:
        drift_fn: ``(ratio, advantage[, progress=...]) -> drift``, broadcasting; e.g.
            :func:`metarl.objectives.lpo.drift_fn` of a run's ``"policy"`` meta-parameters,
            or :func:`metarl.objectives.dpo.drift_fn`.
        label: name of the drift in titles and legends (default: ``drift_fn.label``).
        ratio_range: the grid's range of ratios.
        advantage_range: the grid's range of advantages.
        log_ratio: space the ratios logarithmically (``r`` and ``1/r`` equally far from 1).
        progress: training progress passed to ``drift_fn`` (``ta_lpo``); ignored if
            ``drift_fn`` takes no ``progress``.
        slice_advantages: one slice panel per advantage value.
        references: ``{label: drift_fn}`` drawn in the slices (default none).
        clip_eps: PPO's clip range, marked on the heatmap.
        num_points: grid points per axis.
        title: figure title.
    """
    name = _drift_name(drift_fn, label)
    takes_progress = _takes_progress(drift_fn)
    progress_arg = progress if takes_progress else None

    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    advantages = np.linspace(advantage_range[0], advantage_range[1], num_points)
    grid = _evaluate_drift(drift_fn, ratios[None, :], advantages[:, None], progress_arg)

    fig = new_figure(5.6 + 4.2 * len(slice_advantages), 4.4)
    fig.get_layout_engine().set(w_pad=0.15)
    axes = fig.subplots(1, 1 + len(slice_advantages),
                        gridspec_kw={"width_ratios": [1.3] + [1.0] * len(slice_advantages)})
    axes = np.atleast_1d(axes)
    ax_map = axes[0]
    image = ax_map.pcolormesh(ratios, advantages, grid, shading="auto", cmap=SEQUENTIAL_CMAP,
                              norm=mcolors.Normalize(vmin=0.0, vmax=_upper(grid)))
    fig.colorbar(image, ax=ax_map, label="drift D(r, A)")
    ax_map.axvline(1.0, color="white", lw=1.0, label="r = 1")
    for bound in (1.0 - clip_eps, 1.0 + clip_eps):
        ax_map.axvline(bound, color="white", lw=1.0, ls="--",
                       label=f"PPO clip range 1 ± {clip_eps:g}" if bound < 1 else None)
    for a in slice_advantages:
        ax_map.axhline(a, color="white", lw=0.8, ls=":",
                       label="slices" if a == slice_advantages[0] else None)
    _format_ratio_axis(ax_map, ratio_range, log_ratio)
    ax_map.set_xlabel("probability ratio r = π_new / π_old" + (" (log scale)" if log_ratio else ""))
    ax_map.set_ylabel("advantage A")
    ax_map.set_title(name)
    ax_map.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize="small",
                  facecolor="0.35", labelcolor="white", framealpha=1.0)

    for ax, a in zip(axes[1:], slice_advantages, strict=True):
        ones = np.full_like(ratios, a)
        ax.plot(ratios, _evaluate_drift(drift_fn, ratios, ones, progress_arg), color="C0", lw=2.2,
                label=name)
        for ref_label, ref_fn, style in _styled(references or {}):
            ax.plot(ratios, _evaluate_drift(ref_fn, ratios, ones), label=ref_label, **style)
        _finish_drift_slice(ax, ratio_range, log_ratio, "drift D(r, A)", f"slice at A = {a:+g}")
    suffix = f" at training progress {progress:g}" if _uses_progress(drift_fn) else ""
    fig.suptitle(title or f"Drift over ratio × advantage{suffix}: the penalty subtracted from r·A")
    return fig


def plot_drift_comparison(
    drifts: Mapping[str, DriftFn],
    *,
    references: Mapping[str, DriftFn] | None = None,
    ratio_range: tuple[float, float] = (0.5, 2.0),
    advantage_range: tuple[float, float] = (-2.0, 2.0),
    log_ratio: bool = True,
    progress: float = 0.0,
    clip_eps: float = 0.2,
    num_points: int = 161,
    title: str | None = None,
) -> Figure:
    """Drifts side by side as heatmaps over ratio × advantage on one colour scale, followed
    by the reference drifts (PPO's clip, DPO's closed form), so shapes can be read against
    each other directly.

    Args:
        drifts: ``{label: drift_fn}``, e.g. ``{"evolved": lpo.drift_fn(params)}``; each
            ``drift_fn(ratio, advantage[, progress=...])`` broadcasting.
        references: ``{label: drift_fn}`` appended after ``drifts`` (default none).
        progress: training progress passed to drifts that take it.

    The other arguments are those of :func:`plot_drift`.
    """
    panels = [(str(label), fn, _takes_progress(fn)) for label, fn in drifts.items()]
    for label, fn in (references or {}).items():
        panels.append((str(label), fn, False))
    if not panels:
        raise ValueError("plot_drift_comparison: no drift to draw")
    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    advantages = np.linspace(advantage_range[0], advantage_range[1], num_points)
    grids = [_evaluate_drift(fn, ratios[None, :], advantages[:, None],
                             progress if takes else None)
             for _, fn, takes in panels]
    norm = mcolors.Normalize(vmin=0.0, vmax=max(_upper(g) for g in grids))
    fig = new_figure(max(3.6 * len(panels) + 1.0, 6.0), 4.0)
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    image = None
    for ax, (label, _, _), grid in zip(axes, panels, grids, strict=True):
        image = ax.pcolormesh(ratios, advantages, grid, shading="auto", cmap=SEQUENTIAL_CMAP,
                              norm=norm)
        ax.axvline(1.0, color="white", lw=0.8)
        for bound in (1.0 - clip_eps, 1.0 + clip_eps):
            ax.axvline(bound, color="white", lw=0.6, ls="--")
        ax.axhline(0.0, color="white", lw=0.6, ls=":")
        _format_ratio_axis(ax, ratio_range, log_ratio)
        ax.set_xlabel("ratio r" + (" (log scale)" if log_ratio else ""))
        ax.set_title(label, fontsize="medium")
    axes[0].set_ylabel("advantage A")
    fig.colorbar(image, ax=list(axes), label="drift D(r, A)", shrink=0.9, pad=0.01)
    fig.suptitle(title or "Drifts on one colour scale (white: r = 1, dashed: PPO's clip "
                          f"range 1 ± {clip_eps:g}, dotted: A = 0)")
    return fig


def plot_drift_slices(
    drifts: Mapping[str, DriftFn],
    *,
    references: Mapping[str, DriftFn] | None = None,
    ratio_range: tuple[float, float] = (0.5, 2.0),
    log_ratio: bool = True,
    slice_advantages: Sequence[float] = (1.0, -1.0),
    progress: float = 0.0,
    clip_eps: float = 0.2,
    num_points: int = 201,
    title: str | None = None,
) -> Figure:
    """Several drifts overlaid as slices at fixed advantages (one panel per advantage),
    with the reference drifts dashed and dotted: e.g. the search means of several runs.

    The other arguments are those of :func:`plot_drift`.

    Args:
        drifts: ``{label: drift_fn}``, one line each.
    """
    if not drifts:
        raise ValueError("plot_drift_slices: no drift to draw")
    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    fig = new_figure(4.6 * len(slice_advantages) + 0.6, 4.2)
    axes = np.atleast_1d(fig.subplots(1, len(slice_advantages)))
    for ax, a in zip(axes, slice_advantages, strict=True):
        ones = np.full_like(ratios, a)
        for index, (label, fn) in enumerate(drifts.items()):
            values = _evaluate_drift(fn, ratios, ones, progress if _takes_progress(fn) else None)
            ax.plot(ratios, values, color=CANDIDATE_COLOURS[index % len(CANDIDATE_COLOURS)],
                    lw=1.8, label=str(label))
        for ref_label, ref_fn, style in _styled(references or {}):
            ax.plot(ratios, _evaluate_drift(ref_fn, ratios, ones), label=ref_label, **style)
        _finish_drift_slice(ax, ratio_range, log_ratio, "drift D(r, A)",
                            f"slice at A = {a:+g}")
    fig.suptitle(title or f"{len(drifts)} drifts at fixed advantages")
    return fig


def _upper(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 1.0
    return top if top > 0 else 1.0


def _takes_progress(drift_fn: DriftFn) -> bool:
    """Whether ``drift_fn`` accepts a ``progress`` keyword."""
    try:
        parameters = inspect.signature(drift_fn).parameters
    except (TypeError, ValueError):
        return False
    return "progress" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def _uses_progress(drift_fn: DriftFn) -> bool:
    """Whether the drift's value depends on training progress (a
    :class:`~metarl.objectives.drift.DriftFunction` says so)."""
    marked = getattr(drift_fn, "uses_progress", None)
    return _takes_progress(drift_fn) if marked is None else bool(marked)


def plot_temporal_drift(
    drift_fn: DriftFn,
    progresses: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    *,
    label: str | None = None,
    ratio_range: tuple[float, float] = (0.5, 2.0),
    advantage_range: tuple[float, float] = (-2.0, 2.0),
    log_ratio: bool = True,
    slice_advantages: Sequence[float] = (1.0, -1.0),
    reference: DriftFn | None = None,
    num_points: int = 121,
    title: str | None = None,
) -> Figure:
    """A temporally-aware drift ``D(r, A, p)`` at several training-progress values ``p``.

    Top row: one heatmap per progress value, all on one colour scale (one colour bar).
    Bottom row: slices at fixed advantages, one line per progress value (colour = progress),
    with a ``reference`` drift (e.g. PPO's clip, which carries its ``label``) if given.

    The other arguments are those of :func:`plot_drift`.

    Args:
        drift_fn: ``(ratio, advantage, progress=...) -> drift``, e.g.
            :func:`metarl.objectives.ta_lpo.drift_fn` of a run's ``"policy"`` meta-parameters.
        progresses: training progress values ``n / N`` in ``[0, 1]``.
        reference: a drift drawn dashed in every slice, not scaled with the learned one.
    """
    if not progresses:
        raise ValueError("progresses: need at least one progress value")
    if not _takes_progress(drift_fn):
        raise ValueError("plot_temporal_drift: drift_fn must take a `progress` argument")
    name = _drift_name(drift_fn, label)
    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    advantages = np.linspace(advantage_range[0], advantage_range[1], num_points)
    grids = [_evaluate_drift(drift_fn, ratios[None, :], advantages[:, None], p)
             for p in progresses]
    norm = mcolors.Normalize(vmin=0.0, vmax=max(_upper(g) for g in grids))

    columns = len(progresses)
    fig = new_figure(max(3.0 * columns, 9.0), 7.6)
    sub_top, sub_bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.1])
    map_axes = np.atleast_1d(sub_top.subplots(1, columns, sharey=True))
    image = None
    for ax, p, grid in zip(map_axes, progresses, grids, strict=True):
        image = ax.pcolormesh(ratios, advantages, grid, shading="auto", cmap=SEQUENTIAL_CMAP,
                              norm=norm)
        ax.axvline(1.0, color="white", lw=0.8)
        _format_ratio_axis(ax, ratio_range, log_ratio)
        ax.tick_params(axis="x", labelsize="small")
        ax.set_title(f"progress p = {p:g}")
        ax.set_xlabel("ratio r")
    map_axes[0].set_ylabel("advantage A")
    sub_top.colorbar(image, ax=list(map_axes), label="drift D(r, A, p)", shrink=0.9, pad=0.01)
    sub_top.suptitle(f"{name} over ratio × advantage (shared colour scale)")

    slice_axes = np.atleast_1d(sub_bottom.subplots(1, len(slice_advantages)))
    cmap = matplotlib.colormaps["plasma"]
    first, span = min(progresses), max(max(progresses) - min(progresses), 1e-9)
    for ax, a in zip(slice_axes, slice_advantages, strict=True):
        ones = np.full_like(ratios, a)
        top = 0.0
        for p in progresses:
            shade = cmap(0.85 * (p - first) / span)
            values = _evaluate_drift(drift_fn, ratios, ones, p)
            top = max(top, _upper(values))
            ax.plot(ratios, values, color=shade, lw=2, label=f"p = {p:g}")
        if reference is not None:
            values = _evaluate_drift(reference, ratios, ones)
            # Keep the learned drift readable: PPO's hard clip may run off the top.
            off_scale = _upper(values) > 3.0 * top
            ax.plot(ratios, values, color="black", ls="--", lw=1.2,
                    label=_drift_name(reference, None)
                    + (" (runs off scale)" if off_scale else ""))
            if off_scale:
                ax.set_ylim(-0.04 * top * 1.5, top * 1.5)
        _finish_drift_slice(ax, ratio_range, log_ratio, "drift D(r, A, p)",
                            f"slice at A = {a:+g}, one line per training progress", ncol=2)
    fig.suptitle(title or "Temporally-aware drift: how the penalty changes over training",
                 fontsize="large")
    return fig


def plot_run_drifts(drifts: Mapping[str, tuple[str, DriftFn]],
                    references: Mapping[str, DriftFn], *, clip_eps: float = 0.2,
                    run_name: str = "run") -> dict[str, Figure]:
    """Every figure of a run that learned drifts, by file stem: each candidate's drift as a
    heatmap with slices (``drift_<which>``), plus its change over training
    (``temporal_drift_<which>``) when it depends on progress; then every candidate next to
    the reference drifts as heatmaps on one colour scale (``drift_side_by_side``) and, with
    several candidates (the mean and best of a run, or the search means of several runs in
    ``metarl compare``), all of them overlaid as slices at ``A = ±1`` (``drift_slices``).
    A drift that depends on progress is drawn at progress 0.5 except in its temporal figure.

    Args:
        drifts: ``{which: (candidate label, drift_fn)}``; ``which`` names the files, the
            label names the candidate in titles and legends, after the drift's own
            ``label``.
        references: ``{label: drift_fn}`` every figure compares with (PPO's clip, DPO's
            closed form); the first is drawn in the temporal figures' slices too.
        clip_eps: PPO's clip range, marked in the figures.
        run_name: the run's name, at the start of every title.
    """
    figures, named = {}, {}
    for which, (candidate, drift_fn) in drifts.items():
        label = f"{_drift_name(drift_fn, None)}, {candidate}"
        uses_progress = _uses_progress(drift_fn)
        progress = 0.5 if uses_progress else 0.0
        at = f" at training progress {progress:g}" if uses_progress else ""
        figures[f"drift_{which}"] = plot_drift(
            drift_fn, label=label, progress=progress, clip_eps=clip_eps, references=references,
            title=f"{run_name}: drift of the {candidate}{at}")
        if uses_progress:
            figures[f"temporal_drift_{which}"] = plot_temporal_drift(
                drift_fn, label=label, reference=next(iter(references.values()), None),
                title=f"{run_name}: drift of the {candidate} over training")
        named[candidate] = drift_fn
    if not named:
        return figures
    uses_progress = any(_uses_progress(fn) for fn in named.values())
    progress = 0.5 if uses_progress else 0.0
    at = f" at training progress {progress:g}" if uses_progress else ""
    figures["drift_side_by_side"] = plot_drift_comparison(
        named, references=references, progress=progress, clip_eps=clip_eps,
        title=f"{run_name}: learned drift{at} next to PPO's clip and DPO, one colour scale")
    if len(named) > 1:
        figures["drift_slices"] = plot_drift_slices(
            named, references=references, progress=progress, clip_eps=clip_eps,
            title=f"{run_name}: {len(named)} learned drifts{at} at A = ±1")
    return figures
