"""The figure of a learned value distance ``d(x)`` (``x = value - target``) against L2."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from metarl.figures.style import CANDIDATE_COLOURS, new_figure


def plot_value_distance(
    x: np.ndarray,
    distances: Mapping[str, tuple[np.ndarray, np.ndarray]],
    *,
    relative: bool = True,
    form: str | None = None,
    title: str | None = None,
) -> Figure:
    """Learned value distances against L2 ``½x²``, in three panels: ``d(x)`` with ``½x²``;
    the derivatives ``d'(x)`` and ``x`` (the gradient the critic receives for an error
    ``x``); and what evolution changed: with ``relative`` the weight relative to L2,
    ``d(x) / ½x²`` (1 for L2), otherwise the deviation ``d(x) - ½x²`` (0 for L2).

    Args:
        x: ``[N]`` errors ``value - target`` at which the distances were evaluated.
        distances: ``{label: (d [N], d' [N])}``, one line per candidate (e.g. a run's
            search mean and best candidate; :func:`metarl.objectives.value_distance.
            plot_learned_distance` evaluates a run's meta-parameters).
        relative: draw the weight ``d / ½x²`` (for a distance that scales L2) rather than
            the deviation ``d - ½x²``.
        form: the distance's form, named in the default title.
        title: figure title (a default says what is shown).
    """
    x = np.asarray(x, np.float64)
    l2 = 0.5 * x**2
    fig = new_figure(13.5, 4.2)
    ax_d, ax_grad, ax_change = fig.subplots(1, 3)
    for index, (name, (d, grad)) in enumerate(distances.items()):
        colour = CANDIDATE_COLOURS[index % len(CANDIDATE_COLOURS)]
        d, grad = np.asarray(d, np.float64), np.asarray(grad, np.float64)
        ax_d.plot(x, d, color=colour, lw=2.6, label=name)
        ax_grad.plot(x, grad, color=colour, lw=2.6, label=f"{name}: d'(x)")
        if relative:
            with np.errstate(divide="ignore", invalid="ignore"):
                weight = np.where(x == 0.0, np.nan, d / l2)
            ax_change.plot(x, weight, color=colour, lw=2.6, label=f"{name}: d(x) / ½x²")
        else:
            ax_change.plot(x, d - l2, color=colour, lw=2.6, label=f"{name}: d(x) - ½x²")
    ax_d.plot(x, l2, color="black", ls="--", lw=1.2, label="L2: ½x²")
    ax_grad.plot(x, x, color="black", ls="--", lw=1.2, label="L2: x")
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
    form_text = f" (form {form})" if form else ""
    fig.suptitle(title or f"Learned value distance vs L2{form_text}")
    return fig
