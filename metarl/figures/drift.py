"""Figures of learned objectives and of meta-evolution runs.

Every ``plot_*`` function returns a :class:`matplotlib.figure.Figure` built without pyplot
(so nothing is shown and no GUI backend is needed; PNGs are written with Agg), and
:func:`plot_run` writes the figures of a run directory to ``<run_dir>/plots/*.png``:

==============================  =========================================================
``fitness.png``                 fitness per generation (always)
``<figure>.png``                what the run's objective draws of its learned loss (its
                                registered ``plot``: ``value_distance.png`` for the value
                                distance, ``drift_{mean,best}.png`` for LPO, ...)
``learning_curves_<n>.png``     evolved vs baselines on held-out seeds, one per evaluation
                                (``evaluations/<n>.json``; ``learning_curves.png`` for the
                                ``evaluation.json`` of runs made before evaluations
                                accumulated)
==============================  =========================================================

The drift plots take a function ``drift_fn(ratio, advantage, progress=0.0)``, such as the
drift objectives' ``drift_fn`` (e.g. :func:`metarl.objectives.lpo.drift_fn`).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from metarl.evaluate import EVALUATION_FILE, list_records
from metarl.objectives import dpo, get_objective, lpo
from metarl.objectives.registry import RunFigureRequest
from metarl.objectives.value_distance import value_distance
from metarl.run import (
    BEST_FILE,
    MEAN_FILE,
    RunError,
    load_meta_params,
    read_metrics,
    read_run_config,
)

PLOTS_DIR = "plots"

DriftFn = Callable[..., Any]  # (ratio [...], advantage [...], progress=0.0) -> drift [...]

# One colour per role, the same in every figure.
CANDIDATE_COLOURS = ("C0", "C1", "C4", "C5", "C6", "C8", "C9")
BASELINE_COLOURS = {"ppo": "C3", "l2": "C1", "dpo": "C2"}
SEQUENTIAL_CMAP = "viridis"


# --------------------------------------------------------------------------------------
# helpers


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _is_param_tree(value: Any) -> bool:
    """A term's meta-parameters (``{"layers": [...]}``), as opposed to a labelled mapping."""
    return isinstance(value, Mapping) and "layers" in value


def _labelled(params: Any, default_label: str, term: str) -> dict[str, Any]:
    """``params`` or ``{label: params}`` -> ``{label: term params}``.

    Also accepts whole meta-parameters ``{"policy": ..., "value": ...}`` and takes ``term``.
    """
    if isinstance(params, Mapping) and set(params) == {"policy", "value"}:
        params = params[term]
    if _is_param_tree(params) or not isinstance(params, Mapping):
        return {default_label: params}
    labelled = {}
    for label, value in params.items():
        if isinstance(value, Mapping) and set(value) == {"policy", "value"}:
            value = value[term]
        labelled[str(label)] = value
    return labelled


def _as_numpy(values) -> np.ndarray:
    return np.asarray(jax.device_get(values), np.float64)


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
    ratio = jnp.asarray(ratio, jnp.float32)
    advantage = jnp.asarray(advantage, jnp.float32)
    if progress is None:
        return _as_numpy(drift_fn(ratio, advantage))
    return _as_numpy(drift_fn(ratio, advantage, progress=jnp.float32(progress)))


def _drift_name(drift_fn: DriftFn, label: str | None) -> str:
    if label is not None:
        return label
    if drift_fn is dpo.drift:
        return f"DPO drift (α = {dpo.DEFAULT_ALPHA:g}, β = {dpo.DEFAULT_BETA:g})"
    return getattr(drift_fn, "label", None) or "drift"


# --------------------------------------------------------------------------------------
# learned value distance


def _default_value_distance_form() -> str | None:
    """The ``form`` that :func:`value_distance` uses when none is given (None: no forms)."""
    parameter = inspect.signature(value_distance).parameters.get("form")
    return None if parameter is None else parameter.default


def plot_value_distance(
    meta_params_value_term: Any,
    x_range: tuple[float, float] = (-5.0, 5.0),
    *,
    form: str | None = None,
    num_points: int = 401,
    label: str = "learned d(x)",
    title: str | None = None,
) -> Figure:
    """The learned value distance ``d(x)``, ``x = value - target``, against L2 ``½x²``.

    Three panels: ``d(x)`` with ``½x²``; the derivatives ``d'(x)`` and ``x`` (the gradient
    the critic receives for an error ``x``, from ``jax.grad``); and what evolution changed:
    for the ``scaled_l2`` form the weight relative to L2, ``d(x) / ½x² = exp(g(x))`` (1 for
    L2), for the additive forms the deviation ``d(x) - ½x²`` (0 for L2).

    Args:
        meta_params_value_term: the ``"value"`` meta-parameters of a ``value_distance``
            objective (``{"layers": [...]}``), whole meta-parameters
            ``{"policy": ..., "value": ...}``, or a mapping ``{label: params}`` to overlay
            several candidates (e.g. ``{"mean": ..., "best": ...}``).
        x_range: range of ``value - target`` to draw.
        form: the objective's ``form`` option (``scaled_l2``, ``l2_residual``, ``raw``);
            by default :func:`~metarl.objectives.value_distance.value_distance`'s default.
        num_points: grid size.
        label: legend label when a single parameter set is given.
        title: figure title (a default says what is shown).
    """
    candidates = _labelled(meta_params_value_term, label, "value")
    resolved = form if form is not None else _default_value_distance_form()
    relative = resolved == "scaled_l2"
    x = jnp.linspace(float(x_range[0]), float(x_range[1]), int(num_points), dtype=jnp.float32)
    x_np = _as_numpy(x)
    l2 = 0.5 * x_np**2

    fig = _new_figure(13.5, 4.2)
    ax_d, ax_grad, ax_change = fig.subplots(1, 3)
    for index, (name, params) in enumerate(candidates.items()):
        colour = CANDIDATE_COLOURS[index % len(CANDIDATE_COLOURS)]

        def distance(v, params=params):
            if form is None:
                return value_distance(params, v)
            return value_distance(params, v, form=form)

        d = _as_numpy(distance(x))
        grad = _as_numpy(jax.vmap(jax.grad(distance))(x))
        ax_d.plot(x_np, d, color=colour, lw=2.6, label=name)
        ax_grad.plot(x_np, grad, color=colour, lw=2.6, label=f"{name}: d'(x)")
        if relative:
            with np.errstate(divide="ignore", invalid="ignore"):
                weight = np.where(x_np == 0.0, np.nan, d / l2)
            ax_change.plot(x_np, weight, color=colour, lw=2.6, label=f"{name}: d(x) / ½x²")
        else:
            ax_change.plot(x_np, d - l2, color=colour, lw=2.6, label=f"{name}: d(x) - ½x²")
    ax_d.plot(x_np, l2, color="black", ls="--", lw=1.2, label="L2: ½x²")
    ax_grad.plot(x_np, x_np, color="black", ls="--", lw=1.2, label="L2: x")
    if relative:
        ax_change.axhline(1.0, color="black", ls="--", lw=1.2, label="L2 (weight 1)")
        ax_change.set_title("learned weight relative to L2")
        ax_change.set_ylabel("d(x) / ½x² = exp(g(x))")
    else:
        ax_change.axhline(0.0, color="black", ls="--", lw=1.2, label="L2 (zero deviation)")
        ax_change.set_title("learned deviation from L2")
        ax_change.set_ylabel("d(x) - ½x²")

    ax_d.set_title("distance d(x)")
    ax_d.set_ylabel("loss per sample")
    ax_grad.set_title("derivative d'(x): gradient on the value")
    ax_grad.set_ylabel("d'(x)")
    for ax in (ax_d, ax_grad, ax_change):
        ax.set_xlabel("x = value - target")
        ax.axvline(0.0, color="0.8", lw=0.8, zorder=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    form_text = f" (form {resolved})" if resolved else ""
    fig.suptitle(title or f"Learned value distance vs L2{form_text}")
    return fig


# --------------------------------------------------------------------------------------
# drift functions


@functools.lru_cache(maxsize=16)
def _reference_drift(name: str, clip_eps: float) -> DriftFn:
    """PPO's or DPO's drift, one function object per setting (so its compilation is reused)."""
    return lpo.ppo_drift_fn(clip_eps) if name == "ppo" else dpo.drift_fn()


def _reference_drifts(compare: Sequence[str], clip_eps: float) -> dict[str, tuple[DriftFn, dict]]:
    styles = {
        "ppo": {"color": "black", "ls": "--", "lw": 1.5},
        "dpo": {"color": "C2", "ls": ":", "lw": 2.0},
    }
    references = {}
    for name in compare:
        if name not in styles:
            raise ValueError(f"compare: unknown reference drift {name!r}; allowed: ppo, dpo")
        fn = _reference_drift(name, float(clip_eps))
        references[fn.label] = (fn, styles[name])
    return references


def plot_drift(
    drift_fn: DriftFn,
    *,
    label: str | None = None,
    ratio_range: tuple[float, float] = (0.5, 2.0),
    advantage_range: tuple[float, float] = (-2.0, 2.0),
    log_ratio: bool = True,
    progress: float = 0.0,
    slice_advantages: Sequence[float] = (1.0, -1.0),
    compare: Sequence[str] | None = None,
    clip_eps: float = 0.2,
    num_points: int = 201,
    title: str | None = None,
) -> Figure:
    """A drift ``D(r, A)`` as a heatmap over ratio × advantage, plus slices at fixed ``A``.

    The policy maximises ``r A - D(r, A)``: the drift is the penalty for moving the ratio
    ``r = π_new / π_old`` away from 1 when the advantage is ``A``. The heatmap marks ``r = 1``
    and PPO's clip range; each slice panel draws the drift at one advantage next to PPO's
    clipping drift ``relu((r - clip(r, 1 ± ε)) A)`` and DPO's closed-form drift.

    Args:
        drift_fn: ``(ratio, advantage[, progress=...]) -> drift``, broadcasting; e.g.
            :func:`metarl.objectives.lpo.drift_fn` of a run's ``"policy"`` meta-parameters,
            or ``metarl.objectives.dpo.drift``.
        label: name of the drift in titles and legends (default: ``drift_fn.label``).
        ratio_range, advantage_range: the grid; ``log_ratio`` spaces the ratio
            logarithmically (``r`` and ``1/r`` equally far from 1).
        progress: training progress passed to ``drift_fn`` (``ta_lpo``); ignored if
            ``drift_fn`` takes no ``progress``.
        slice_advantages: one slice panel per advantage value.
        compare: reference drifts in the slices, from ``"ppo"`` and ``"dpo"`` (default both,
            without the one ``drift_fn`` itself is).
        clip_eps: PPO's clip range for the reference and the marked clip range.
        num_points: grid points per axis.
        title: figure title.
    """
    name = _drift_name(drift_fn, label)
    if compare is None:
        compare = [c for c in ("ppo", "dpo")
                   if not (c == "dpo" and (drift_fn is dpo.drift or name.startswith("DPO")))
                   and not (c == "ppo" and name.startswith("PPO"))]
    references = _reference_drifts(compare, clip_eps)
    takes_progress = _takes_progress(drift_fn)
    progress_arg = progress if takes_progress else None

    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    advantages = np.linspace(advantage_range[0], advantage_range[1], num_points)
    grid = _evaluate_drift(drift_fn, ratios[None, :], advantages[:, None], progress_arg)

    fig = _new_figure(5.6 + 4.2 * len(slice_advantages), 4.4)
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
        for ref_label, (ref_fn, style) in references.items():
            ax.plot(ratios, _evaluate_drift(ref_fn, ratios, ones), label=ref_label, **style)
        _finish_drift_slice(ax, ratio_range, log_ratio, "drift D(r, A)", f"slice at A = {a:+g}")
    suffix = f" at training progress {progress:g}" if _uses_progress(drift_fn) else ""
    fig.suptitle(title or f"Drift over ratio × advantage{suffix}: the penalty subtracted from r·A")
    return fig


def plot_drift_comparison(
    drifts: Mapping[str, DriftFn],
    *,
    references: Sequence[str] = ("ppo", "dpo"),
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
        references: reference drifts appended after ``drifts``, from ``"ppo"`` and
            ``"dpo"``.
        progress: training progress passed to drifts that take it.
        ratio_range, advantage_range, log_ratio, clip_eps, num_points, title: as in
            :func:`plot_drift`.
    """
    panels = [(str(label), fn, _takes_progress(fn)) for label, fn in drifts.items()]
    for label, (fn, _) in _reference_drifts(references, clip_eps).items():
        panels.append((label, fn, False))
    if not panels:
        raise ValueError("plot_drift_comparison: no drift to draw")
    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    advantages = np.linspace(advantage_range[0], advantage_range[1], num_points)
    grids = [_evaluate_drift(fn, ratios[None, :], advantages[:, None],
                             progress if takes else None)
             for _, fn, takes in panels]
    norm = mcolors.Normalize(vmin=0.0, vmax=max(_upper(g) for g in grids))
    fig = _new_figure(max(3.6 * len(panels) + 1.0, 6.0), 4.0)
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
    references: Sequence[str] = ("ppo", "dpo"),
    ratio_range: tuple[float, float] = (0.5, 2.0),
    log_ratio: bool = True,
    slice_advantages: Sequence[float] = (1.0, -1.0),
    progress: float = 0.0,
    clip_eps: float = 0.2,
    num_points: int = 201,
    title: str | None = None,
) -> Figure:
    """Several drifts overlaid as slices at fixed advantages (one panel per advantage),
    with the reference drifts in black / green: e.g. the search means of several runs.

    Args:
        drifts: ``{label: drift_fn}``, one line each.
        references, progress, ratio_range, log_ratio, slice_advantages, clip_eps,
        num_points, title: as in :func:`plot_drift`.
    """
    if not drifts:
        raise ValueError("plot_drift_slices: no drift to draw")
    refs = _reference_drifts(references, clip_eps)
    ratios = _ratio_grid(ratio_range, num_points, log_ratio)
    fig = _new_figure(4.6 * len(slice_advantages) + 0.6, 4.2)
    axes = np.atleast_1d(fig.subplots(1, len(slice_advantages)))
    for ax, a in zip(axes, slice_advantages, strict=True):
        ones = np.full_like(ratios, a)
        for index, (label, fn) in enumerate(drifts.items()):
            values = _evaluate_drift(fn, ratios, ones, progress if _takes_progress(fn) else None)
            ax.plot(ratios, values, color=CANDIDATE_COLOURS[index % len(CANDIDATE_COLOURS)],
                    lw=1.8, label=str(label))
        for ref_label, (ref_fn, style) in refs.items():
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
    clip_eps: float = 0.2,
    num_points: int = 121,
    title: str | None = None,
) -> Figure:
    """A temporally-aware drift ``D(r, A, p)`` at several training-progress values ``p``.

    Top row: one heatmap per progress value, all on one colour scale (one colour bar).
    Bottom row: slices at fixed advantages, one line per progress value (colour = progress),
    with PPO's clipping drift for reference.

    Args:
        drift_fn: ``(ratio, advantage, progress=...) -> drift``, e.g.
            :func:`metarl.objectives.ta_lpo.drift_fn` of a run's ``"policy"`` meta-parameters.
        progresses: training progress values ``n / N`` in ``[0, 1]``.
        label, ratio_range, advantage_range, log_ratio, slice_advantages, clip_eps,
        num_points, title: as in :func:`plot_drift`.
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
    fig = _new_figure(max(3.0 * columns, 9.0), 7.6)
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
    ppo = _reference_drift("ppo", float(clip_eps))
    first, span = min(progresses), max(max(progresses) - min(progresses), 1e-9)
    for ax, a in zip(slice_axes, slice_advantages, strict=True):
        ones = np.full_like(ratios, a)
        top = 0.0
        for p in progresses:
            shade = cmap(0.85 * (p - first) / span)
            values = _evaluate_drift(drift_fn, ratios, ones, p)
            top = max(top, _upper(values))
            ax.plot(ratios, values, color=shade, lw=2, label=f"p = {p:g}")
        reference = _evaluate_drift(ppo, ratios, ones)
        # Keep the learned drift readable: PPO's hard clip may run off the top.
        off_scale = _upper(reference) > 3.0 * top
        ax.plot(ratios, reference, color="black", ls="--", lw=1.2,
                label=ppo.label + (" (runs off scale)" if off_scale else ""))
        if off_scale:
            ax.set_ylim(-0.04 * top * 1.5, top * 1.5)
        _finish_drift_slice(ax, ratio_range, log_ratio, "drift D(r, A, p)",
                            f"slice at A = {a:+g}, one line per training progress", ncol=2)
    fig.suptitle(title or "Temporally-aware drift: how the penalty changes over training",
                 fontsize="large")
    return fig


# --------------------------------------------------------------------------------------
# runs: fitness and learning curves


def plot_fitness(history: Sequence[Mapping[str, Any]] | str | Path, *,
                 metric: str = "mean_return", title: str | None = None) -> Figure:
    """Fitness per generation: best, mean, min-max band and best-so-far.

    Args:
        history: the lines of ``metrics.jsonl`` (``metarl.run.read_metrics``), or a run
            directory. Invalid candidates (NaN runs) are left out of the statistics and
            counted in the legend.
        metric: the run's ``fitness.metric`` (for the y label).
        title: figure title.
    """
    if isinstance(history, str | Path):
        history = read_metrics(history)
    if not history:
        raise ValueError("plot_fitness: the history is empty (no generation finished yet)")
    generations = np.array([line["generation"] for line in history])
    best, mean, low, high, std = [], [], [], [], []
    invalid = 0
    for line in history:
        fitness = np.asarray(line["fitness"], np.float64)
        valid = np.asarray(line.get("valid", [True] * fitness.size), bool) & np.isfinite(fitness)
        invalid += int((~valid).sum())
        good = fitness[valid]
        if good.size:
            best.append(good.max())
            mean.append(good.mean())
            low.append(good.min())
            high.append(good.max())
            std.append(good.std())
        else:
            best.append(np.nan)
            mean.append(np.nan)
            low.append(np.nan)
            high.append(np.nan)
            std.append(np.nan)
    best, mean, low, high, std = map(np.asarray, (best, mean, low, high, std))
    so_far = np.array([line.get("best_fitness_so_far", np.nan) for line in history], np.float64)

    fig = _new_figure(7.5, 4.5)
    ax = fig.subplots()
    population = len(history[-1]["fitness"])
    ax.fill_between(generations, low, high, color="C0", alpha=0.18, step=None,
                    label=f"min–max over {population} candidates")
    ax.fill_between(generations, mean - std, mean + std, color="C0", alpha=0.25,
                    label="mean ± std")
    ax.plot(generations, mean, color="C0", marker="o", lw=2, label="mean fitness")
    ax.plot(generations, best, color="C1", marker="^", lw=1.5, label="best of generation")
    ax.plot(generations, so_far, color="C3", ls="--", drawstyle="steps-post",
            label="best so far")
    if invalid:
        ax.plot([], [], " ", label=f"{invalid} invalid candidate(s) left out")
    ax.set_xlabel("generation")
    described = {"mean_return": "mean episode return over training",
                 "final_return": "final episode return"}.get(metric, metric)
    ax.set_ylabel(f"fitness ({described})")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title or "Fitness of the candidates per generation")
    return fig


def _mean_ci(curves: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, ...]:
    """Per-update mean over seeds and a Student-t confidence interval; ``[S, U] -> 3 × [U]``."""
    from scipy import stats

    count = np.sum(np.isfinite(curves), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(np.where(count[None] > 0, curves, 0.0), axis=0)
        mean = np.where(count > 0, mean, np.nan)
        std = np.nanstd(np.where(count[None] > 1, curves, 0.0), axis=0, ddof=1)
        half = stats.t.ppf(0.5 + confidence / 2, np.maximum(count - 1, 1)) * std / np.sqrt(count)
    half = np.where(count > 1, half, 0.0)
    return mean, mean - half, mean + half


def plot_learning_curves(
    evaluation_report: Mapping[str, Any] | str | Path,
    *,
    steps_per_update: int | Mapping[str, int] | None = None,
    title: str | None = None,
) -> Figure:
    """Episode return per update on held-out seeds: evolved objective vs each baseline.

    One panel per environment; each objective's line is the mean over seeds with a 95%
    confidence band (Student t over seeds).

    Args:
        evaluation_report: the dict returned by :func:`metarl.evaluate.evaluate_run` (or the
            path of a saved evaluation, or a run directory: its newest evaluation).
        steps_per_update: environment steps per update (``num_envs * num_steps``), one int
            or one per environment id, to put environment steps on the x axis; by default
            the report's ``steps_per_update`` if it has one, else updates.
        title: figure title.
    """
    report = _read_report(evaluation_report)
    results = report.get("results") or []
    if not results:
        raise ValueError("plot_learning_curves: the report has no results")
    steps_per_update = steps_per_update if steps_per_update is not None \
        else report.get("steps_per_update")
    env_ids = list(dict.fromkeys(r["env_id"] for r in results))
    objectives = list(dict.fromkeys(r["objective"] for r in results))
    which = report.get("meta_params", "mean")

    fig = _new_figure(6.0 * len(env_ids), 4.4)
    axes = np.atleast_1d(fig.subplots(1, len(env_ids), squeeze=False)[0])
    for ax, env_id in zip(axes, env_ids, strict=True):
        scale = steps_per_update.get(env_id) if isinstance(steps_per_update, Mapping) \
            else steps_per_update
        for result in (r for r in results if r["env_id"] == env_id):
            curves = np.array([[np.nan if v is None else v for v in row]
                               for row in result["curves"]], np.float64)
            if curves.ndim != 2 or curves.size == 0:
                continue
            mean, low, high = _mean_ci(curves)
            x = np.arange(1, curves.shape[1] + 1, dtype=np.float64)
            if scale:
                x = x * scale
            objective = result["objective"]
            if objective == "evolved":
                colour, style, label = "C0", "-", f"evolved ({which} meta-params)"
            else:
                colour = BASELINE_COLOURS.get(objective,
                                              f"C{4 + objectives.index(objective) % 6}")
                style, label = "--", f"{objective} (baseline)"
            seeds = curves.shape[0]
            ax.plot(x, mean, color=colour, ls=style, lw=2, label=f"{label}, {seeds} seeds")
            ax.fill_between(x, low, high, color=colour, alpha=0.15)
        ax.plot([], [], " ", label="bands: 95% CI of the mean")
        ax.set_xlabel("environment steps per agent" if scale else "update")
        ax.set_ylabel("episode return")
        ax.set_title(env_id)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title or "Learning curves on held-out seeds: evolved objective vs baselines")
    return fig


def _read_report(report: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    if isinstance(report, Mapping):
        return report
    path = Path(report)
    if path.is_dir():
        records = list_records(path)
        if records:
            return records[-1]
        path = path / EVALUATION_FILE
    if not path.is_file():
        raise RunError(f"no evaluation report at {path}")
    return json.loads(path.read_text())


# --------------------------------------------------------------------------------------
# a whole run


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write the figures of a run to ``<run_dir>/plots/*.png`` and return their paths.

    Always the fitness; then what the run's objective draws of its learned loss for the
    search mean and the best candidate (its registered ``plot``, e.g. the learned value
    distance against L2, or LPO's drift); and the learning curves of every evaluation of the
    run (:func:`metarl.evaluate.list_records`).

    Raises:
        RunError: ``run_dir`` is missing, is not a run, or has no finished generation.
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)  # raises RunError naming what is missing
    history = read_metrics(run_dir)
    if not history:
        raise RunError(f"{run_dir} has no finished generation yet (metrics.jsonl is empty)")
    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    written = [_save(plot_fitness(history, metric=config.fitness.metric,
                                  title=f"{config.name}: fitness per generation"),
                     out / "fitness.png")]

    plot = get_objective(config.objective.name).plot
    if plot is not None:
        request = RunFigureRequest(
            run_name=config.name, candidates=_load_candidates(run_dir, config),
            options=dict(config.objective.options), inner=config.inner[0],
            generation=history[-1]["generation"],
        )
        for stem, fig in plot(request).items():
            written.append(_save(fig, out / f"{stem}.png"))

    for report in list_records(run_dir):
        if not report.get("results"):
            continue
        # reports written before results recorded their steps per update came from PPO
        by_env = {inner.env_id: getattr(inner, "batch_size", None) for inner in config.inner}
        steps = {r["env_id"]: r.get("steps_per_update") or by_env.get(r["env_id"])
                 or getattr(config.inner[0], "batch_size", 1)
                 for r in report.get("results", [])}
        legacy = not isinstance(report["id"], int)
        title = f"{config.name}: held-out learning curves"
        if not legacy:
            title += (f" (evaluation {report['id']}: {report.get('seeds', '?')} seeds, "
                      f"{report.get('meta_params', 'mean')} meta-params)")
        fig = plot_learning_curves(report, steps_per_update=steps, title=title)
        name = ("learning_curves.png" if report["id"] == "legacy"
                else f"learning_curves_{report['id']}.png")
        written.append(_save(fig, out / name))
    return written


def _load_candidates(run_dir: Path, config) -> dict[str, Any]:
    """``{"mean": params, "best": params}`` for the meta-parameter files present."""
    template = config.objective.build().init(jax.random.PRNGKey(0))
    candidates = {}
    for which, filename in (("mean", MEAN_FILE), ("best", BEST_FILE)):
        if (run_dir / filename).is_file():
            candidates[which] = _read_meta_params(run_dir / filename, template)
    return candidates


def load_candidate_meta_params(path: str | Path, config) -> Any:
    """Meta-parameters saved at ``path`` by a run of ``config``, as float32 arrays in the
    structure of its objective (:class:`RunError` when they do not fit it)."""
    template = config.objective.build().init(jax.random.PRNGKey(0))
    return _read_meta_params(Path(path), template)


def _read_meta_params(path: Path, template: Any) -> Any:
    """Meta-parameters from ``path`` as float32 arrays in ``template``'s structure."""
    try:
        params = load_meta_params(path, template)
    except (TypeError, KeyError, ValueError):
        # Files written before lists were stored as {"0": ...} dicts hold the lists as they
        # were; their raw tree already has the template's structure.
        params = load_meta_params(path)
    expected, found = jax.tree.structure(template), jax.tree.structure(params)
    if expected != found:
        raise RunError(
            f"{path} does not hold meta-parameters of this run's objective: "
            f"expected {expected}, found {found}"
        )
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    for want, got in zip(jax.tree.leaves(template), jax.tree.leaves(params), strict=True):
        if np.shape(want) != np.shape(got):
            raise RunError(f"{path}: a meta-parameter has shape {np.shape(got)}, the "
                           f"objective's has {np.shape(want)}")
    return params


# --------------------------------------------------------------------------------------
# hyperparameter sweeps


def _setting_label(setting: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in setting.items())


def plot_sweep_curves(report: Mapping[str, Any], title: str | None = None) -> Figure:
    """Learning curves of every combination of a sweep (:func:`metarl.sweep.run_sweep`):
    mean episode return over seeds with a 95% confidence band, the best combination first
    in the legend."""
    results = sorted(report["results"], key=lambda r: -np.nan_to_num(r["mean"], nan=-np.inf))
    if not results:
        raise ValueError("plot_sweep_curves: the report has no results")
    fig = _new_figure(7.5, 4.6)
    ax = fig.subplots()
    scale = report.get("steps_per_update")
    colours = matplotlib.colormaps[SEQUENTIAL_CMAP](np.linspace(0.0, 0.9, len(results)))
    for colour, result in zip(colours, results, strict=True):
        curves = np.array([[np.nan if v is None else v for v in row]
                           for row in result["curves"]], np.float64)
        mean, low, high = _mean_ci(curves)
        x = np.arange(1, curves.shape[1] + 1, dtype=np.float64) * (scale or 1)
        ax.plot(x, mean, color=colour, lw=1.8,
                label=f"{_setting_label(result['setting'])}: {result['mean']:.4g}")
        ax.fill_between(x, low, high, color=colour, alpha=0.12)
    ax.set_xlabel("environment steps per agent" if scale else "update")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", title=f"{report['metric']} over {report['seeds']} seeds",
              title_fontsize="small")
    fig.suptitle(title or f"Sweep of {report['algorithm']} on {report['env_id']}: "
                          "learning curves (bands: 95% CI of the mean)")
    return fig


def plot_sweep_heatmap(report: Mapping[str, Any], title: str | None = None) -> Figure:
    """Mean score of each combination of a two-axis sweep, one cell per combination with
    its value written in it."""
    names = list(report["grid"])
    if len(names) != 2:
        raise ValueError(f"plot_sweep_heatmap: needs a grid of two axes, got {names}")
    rows, cols = (report["grid"][name] for name in names)
    grid = np.full((len(rows), len(cols)), np.nan)
    for result in report["results"]:
        setting = result["setting"]
        grid[rows.index(setting[names[0]]), cols.index(setting[names[1]])] = result["mean"]
    fig = _new_figure(1.6 + 1.3 * len(cols), 1.4 + 0.8 * len(rows))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap=SEQUENTIAL_CMAP, aspect="auto", origin="lower")
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label(f"{report['metric']} (mean over {report['seeds']} seeds)")
    finite = grid[np.isfinite(grid)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), value in np.ndenumerate(grid):
        text = "invalid" if np.isnan(value) else f"{value:.4g}"
        ax.text(j, i, text, ha="center", va="center", fontsize="small",
                color="white" if np.isnan(value) or value < middle else "black")
    ax.set_xticks(range(len(cols)), [f"{c:g}" for c in cols])
    ax.set_yticks(range(len(rows)), [f"{r:g}" for r in rows])
    ax.set_xlabel(names[1])
    ax.set_ylabel(names[0])
    ax.set_title(title or f"Sweep of {report['algorithm']} on {report['env_id']}")
    return fig


# --------------------------------------------------------------------------------------
# population-based training


def plot_pbt(history: Sequence[Mapping[str, Any]], steps_per_update: int | None = None,
             title: str | None = None) -> Figure:
    """A PBT run (:attr:`metarl.population.pbt.PBTResult.history`): the return of every
    member over training, and one panel per explored hyperparameter with every member's
    schedule; exploit events are marked where a member took another's state, and the
    lineage of the final best member is drawn bold.

    Args:
        history: one record per segment (``fitness``, ``hypers``, ``source``, ``replaced``,
            ``returns [P, U]``).
        steps_per_update: environment steps per update, for an x axis in steps.
        title: figure title.
    """
    from metarl.population.pbt import lineage

    if not history:
        raise ValueError("plot_pbt: the history is empty")
    names = [name for name, _ in history[0]["hypers"].items()
             if any(len(set(record["hypers"][name])) > 1 for record in history)]
    segment_updates = len(history[0]["returns"][0])
    scale = steps_per_update or 1
    size = len(history[0]["fitness"])
    best = int(np.nanargmax(np.asarray(history[-1]["fitness"], np.float64)))
    chain = lineage(history, best)
    fig = _new_figure(7.5, 2.6 * (1 + len(names)))
    axes = np.atleast_1d(fig.subplots(1 + len(names), 1, sharex=True, squeeze=False)[:, 0])
    colours = matplotlib.colormaps["tab20"](np.linspace(0.0, 1.0, max(size, 2)))
    returns = np.concatenate([np.asarray(r["returns"], np.float64) for r in history], axis=1)
    x = np.arange(1, returns.shape[1] + 1) * scale
    for member in range(size):
        axes[0].plot(x, returns[member], color=colours[member], lw=0.8, alpha=0.6)
    lineage_returns = np.concatenate([np.asarray(record["returns"][m], np.float64)
                                      for record, m in zip(history, chain, strict=True)])
    axes[0].plot(x, lineage_returns, color="black", lw=2.2, label=f"lineage of member {best}")
    axes[0].set_ylabel("episode return")
    axes[0].legend(fontsize="small")
    edges = np.arange(len(history) + 1) * segment_updates * scale
    for ax, name in zip(axes[1:], names, strict=True):
        values = np.array([record["hypers"][name] for record in history], np.float64)  # [S, P]
        for member in range(size):
            ax.step(edges, np.append(values[:, member], values[-1, member]), where="post",
                    color=colours[member], lw=0.9, alpha=0.7)
        chain_values = [values[s, m] for s, m in enumerate(chain)]
        ax.step(edges, chain_values + chain_values[-1:], where="post", color="black", lw=2.2)
        for s, record in enumerate(history[:-1]):
            replaced = np.flatnonzero(record["replaced"])
            ax.scatter(np.full(replaced.size, edges[s + 1]), values[s + 1, replaced],
                       marker="v", s=18, color="C3", zorder=3,
                       label="exploit (copied a better member)" if s == 0 and replaced.size
                       else None)
        if np.all(values > 0) and values.max() / values.min() > 20:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.legend(fontsize="small", loc="best")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("environment steps per member" if steps_per_update else "update")
    fig.suptitle(title or f"Population-based training: {size} members, {len(history)} segments")
    return fig


__all__ = [
    "plot_drift",
    "plot_fitness",
    "plot_learning_curves",
    "plot_pbt",
    "plot_run",
    "plot_sweep_curves",
    "plot_sweep_heatmap",
    "plot_temporal_drift",
    "plot_value_distance",
]
