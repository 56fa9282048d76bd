"""Distilled formulas drawn over the evolved network they were fitted to.

Every figure puts the inputs training visited underneath, so a reader sees where a formula
was fitted and where it extrapolates. Arrays in, figure out; the distiller
(:mod:`metarl.evolve.distill`) evaluates the network and the formulas.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from metarl.figures.style import CANDIDATE_COLOURS, SEQUENTIAL_CMAP, new_figure

NETWORK_STYLE = {"color": "black", "lw": 2.4, "alpha": 0.55}


def _density(ax, samples: np.ndarray, lo: float, hi: float, xlabel: str) -> None:
    """A histogram of the visited ``samples [M]`` within ``[lo, hi]``, as a density."""
    samples = np.asarray(samples, np.float64).ravel()
    inside = samples[(samples >= lo) & (samples <= hi)]
    if inside.size:
        ax.hist(inside, bins=80, range=(lo, hi), density=True, color="0.6")
    share = inside.size / max(samples.size, 1)
    ax.set_ylabel("visited\ndensity")
    ax.set_xlabel(xlabel)
    ax.set_title(f"visited in training ({100 * share:.1f}% in range)", fontsize=8)


def plot_distilled_distance(x: np.ndarray, network: np.ndarray,
                            formulas: Mapping[str, np.ndarray], samples: np.ndarray,
                            title: str | None = None):
    """The evolved value distance and its formulas on one set of axes.

    Args:
        x: ``[N]`` errors ``value - target`` (the grid).
        network: ``[N]`` the evolved ``d(x)``.
        formulas: legend label (the expression) -> ``[N]`` its values.
        samples: ``[M]`` errors visited in training, drawn as a density underneath.
        title: figure title.
    """
    fig = new_figure(8.0, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    top.plot(x, network, label="evolved network", **NETWORK_STYLE)
    for index, (label, values) in enumerate(formulas.items()):
        top.plot(x, values, color=CANDIDATE_COLOURS[index % len(CANDIDATE_COLOURS)],
                 lw=1.3, ls="--", label=label)
    top.set_ylabel("d(x)")
    top.legend(fontsize=7, loc="best")
    top.grid(alpha=0.3)
    _density(bottom, samples, float(x[0]), float(x[-1]), "x = value - target")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_distilled_drift(ratio: np.ndarray, slices: Mapping[float, tuple[np.ndarray, Mapping[
                         str, np.ndarray]]], ratio_samples: np.ndarray,
                         title: str | None = None):
    """The evolved drift and its formulas as slices ``D(r, A)`` at a few advantages.

    Args:
        ratio: ``[N]`` probability ratios (the grid).
        slices: advantage ``A`` -> (``[N]`` the network's drift at ``A``, legend label ->
            ``[N]`` each formula's drift at ``A``); one column of axes per ``A``.
        ratio_samples: ``[M]`` ratios visited in training, as a density underneath.
        title: figure title.
    """
    columns = max(len(slices), 1)
    fig = new_figure(3.6 * columns + 1.0, 6.8)
    axes = np.asarray(fig.subplots(2, columns, sharex=True, height_ratios=(3, 1),
                                   squeeze=False))
    for column, (advantage, (network, formulas)) in enumerate(slices.items()):
        ax = axes[0, column]
        ax.plot(ratio, network, label="evolved network", **NETWORK_STYLE)
        for index, (label, values) in enumerate(formulas.items()):
            ax.plot(ratio, values, color=CANDIDATE_COLOURS[index % len(CANDIDATE_COLOURS)],
                    lw=1.3, ls="--", label=label)
        ax.set_title(f"A = {advantage:g}")
        ax.axvline(1.0, color="0.7", lw=0.8)
        ax.grid(alpha=0.3)
        if column == 0:
            ax.set_ylabel("drift D(r, A)")
        _density(axes[1, column], ratio_samples, float(ratio[0]), float(ratio[-1]),
                 "ratio r")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_drift_residual(ratio: np.ndarray, advantage: np.ndarray, residual: np.ndarray,
                        samples: tuple[np.ndarray, np.ndarray] | None = None,
                        label: str = "formula", title: str | None = None):
    """A heatmap of ``formula - network`` over ratio × advantage.

    Args:
        ratio: ``[Nr]`` ratios; advantage: ``[Na]`` advantages.
        residual: ``[Na, Nr]`` formula minus network.
        samples: ``(ratios [M], advantages [M])`` visited in training, drawn as the contours
            of their density (where the residual matters).
        label: the formula, for the colour bar.
        title: figure title.
    """
    fig = new_figure(7.5, 5.5)
    ax = fig.subplots()
    residual = np.asarray(residual, np.float64)
    bound = float(np.nanmax(np.abs(residual))) if np.isfinite(residual).any() else 1.0
    bound = bound if bound > 0 else 1.0
    image = ax.pcolormesh(ratio, advantage, residual, cmap="RdBu_r", vmin=-bound, vmax=bound,
                          shading="auto")
    fig.colorbar(image, ax=ax, label=f"{label} - network")
    if samples is not None:
        counts, r_edges, a_edges = np.histogram2d(
            np.ravel(samples[0]), np.ravel(samples[1]), bins=40,
            range=((float(ratio[0]), float(ratio[-1])),
                   (float(advantage[0]), float(advantage[-1]))))
        if counts.max() > 0:
            centres_r = 0.5 * (r_edges[1:] + r_edges[:-1])
            centres_a = 0.5 * (a_edges[1:] + a_edges[:-1])
            levels = counts.max() * np.array([0.01, 0.1, 0.5])
            ax.contour(centres_r, centres_a, counts.T, levels=levels, cmap=SEQUENTIAL_CMAP,
                       linewidths=0.9)
    ax.set_xlabel("ratio r")
    ax.set_ylabel("advantage A")
    ax.set_title(title or "residual of the formula (contours: visited inputs, 1%, 10%, 50% "
                          "of the densest bin)", fontsize=9)
    return fig
