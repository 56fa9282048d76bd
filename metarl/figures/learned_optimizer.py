"""The figure of a learned update rule: the update it makes against the gradient, at several
momenta and training-progress values, next to the base update it started from (Adam's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from metarl.figures.style import new_figure

MOMENTUM_CMAP = "plasma"  # sequential with no pale middle: m = 0 stays visible


def plot_learned_update(
    gradients: np.ndarray,
    momenta: Sequence[float],
    progresses: Sequence[float],
    updates: Mapping[str, np.ndarray],
    base: np.ndarray,
    *,
    noise_std: Mapping[str, np.ndarray] | None = None,
    base_label: str = "Adam",
    title: str | None = None,
) -> Figure:
    """Learned updates against the normalised gradient: one row of panels per candidate (on
    the row's own scale), one panel per training progress, one colour per momentum; the
    learned update solid, the base update at the same momentum dashed, and where the rule
    is stochastic a band of ± one standard deviation of its noise.

    Args:
        gradients: ``[N]`` the x-axis, the normalised gradient ``g / (sqrt(v_hat) + eps)``.
        momenta: ``[M]`` the momentum of each line, in the same units.
        progresses: ``[P]`` the training progress of each panel.
        updates: ``{label: [P, M, N]}`` each candidate's update (e.g. a run's search mean
            and best candidate; :func:`metarl.objectives.learned_optimizer.update_grid`
            evaluates a run's meta-parameters).
        base: ``[M, N]`` the base update (the same at every progress), drawn in each panel.
        noise_std: ``{label: [P, M, N]}`` standard deviation of a candidate's learned noise;
            a band is drawn where it is positive.
        base_label: the base update's name in the legend.
        title: figure title (a default says what is shown).

    Raises:
        ValueError: no candidate, or an array whose shape does not match the axes.
    """
    x = np.asarray(gradients, np.float64)
    momenta = [float(m) for m in momenta]
    progresses = [float(p) for p in progresses]
    base = np.asarray(base, np.float64)
    expected = (len(progresses), len(momenta), x.size)
    if not updates:
        raise ValueError("plot_learned_update: no update to draw")
    if base.shape != expected[1:]:
        raise ValueError(f"base: expected shape {expected[1:]} (momenta, gradients), got "
                         f"{base.shape}")
    arrays = {str(label): np.asarray(update, np.float64) for label, update in updates.items()}
    bands = {str(label): np.asarray(std, np.float64) for label, std in (noise_std or {}).items()}
    for name, array in (*arrays.items(), *bands.items()):
        if array.shape != expected:
            raise ValueError(f"{name}: expected shape {expected} (progresses, momenta, "
                             f"gradients), got {array.shape}")

    cmap = matplotlib.colormaps[MOMENTUM_CMAP]
    span = max(max(momenta) - min(momenta), 1e-9)
    colours = [cmap(0.05 + 0.75 * (m - min(momenta)) / span) for m in momenta]
    fig = new_figure(4.2 * len(progresses) + 0.8, 3.3 * len(arrays) + 0.8)
    axes = fig.subplots(len(arrays), len(progresses), sharex=True, sharey="row",
                        squeeze=False)
    for row, (label, update) in enumerate(arrays.items()):
        band = bands.get(label)
        for column, progress in enumerate(progresses):
            ax = axes[row, column]
            for index, (momentum, colour) in enumerate(zip(momenta, colours, strict=True)):
                ax.plot(x, base[index], color=colour, ls="--", lw=1.1,
                        label=f"{base_label}, m = {momentum:+g}")
                line = update[column, index]
                ax.plot(x, line, color=colour, lw=2.2, label=f"learned, m = {momentum:+g}")
                if band is not None and np.any(band[column, index] > 0):
                    ax.fill_between(x, line - band[column, index], line + band[column, index],
                                    color=colour, alpha=0.15, lw=0,
                                    label="± noise std" if index == 0 else None)
            ax.axhline(0.0, color="0.8", lw=0.8, zorder=0)
            ax.axvline(0.0, color="0.8", lw=0.8, zorder=0)
            ax.grid(alpha=0.3)
            ax.set_title(f"{label}: progress {progress:g}", fontsize="medium")
        axes[row, 0].set_ylabel("update u (learning-rate units)")
        if row == 0 or band is not None:  # the band's entry goes where a band is drawn
            axes[row, 0].legend(fontsize="x-small", ncol=2)
    for ax in axes[-1]:
        ax.set_xlabel("normalised gradient g / (sqrt(v_hat) + eps)")
    fig.suptitle(title or f"Learned update against the gradient (dashed: {base_label})")
    return fig


def plot_run_updates(grids: Mapping[str, Any], *, base_label: str = "Adam",
                     title: str | None = None) -> Figure:
    """Every candidate's learned update in one :func:`plot_learned_update` figure, from
    grids that evaluated each rule on the same inputs.

    Args:
        grids: ``{label: grid}``, each grid holding the arrays ``gradients [N]``,
            ``momenta [M]``, ``progresses [P]``, ``update [P, M, N]``, ``noise_std
            [P, M, N]`` and ``adam [M, N]`` as attributes (e.g.
            :class:`metarl.objectives.learned_optimizer.UpdateGrid`). The axes and the base
            update are the first grid's; a noise band is drawn for the candidates whose
            noise is somewhere positive.
        base_label, title: as in :func:`plot_learned_update`.
    """
    first = next(iter(grids.values()))
    noisy = {label: np.asarray(grid.noise_std) for label, grid in grids.items()
             if np.any(np.asarray(grid.noise_std) > 0)}
    return plot_learned_update(
        np.asarray(first.gradients), np.asarray(first.momenta).tolist(),
        np.asarray(first.progresses).tolist(),
        {label: np.asarray(grid.update) for label, grid in grids.items()},
        np.asarray(first.adam), noise_std=noisy or None, base_label=base_label, title=title)
