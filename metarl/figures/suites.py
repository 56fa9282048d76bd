"""A suite's cross-environment verdicts: one interval per environment, and the pooled one.

Drawn as rliable draws interval estimates: one horizontal bar per row from the low to the
high end of the 95% interval, a tick at the point estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from metarl.figures.style import BASELINE_COLOURS, new_figure

__all__ = ["interval_bar", "plot_suite"]


def interval_bar(ax, y: float, estimate: Mapping[str, float] | None, colour: str,
                 label=None) -> None:
    """One interval estimate on row ``y`` of ``ax``, as rliable draws them: a bar from
    ``estimate["low"]`` to ``estimate["high"]``, a tick and a dot at ``estimate["value"]``;
    nothing for a missing or non-finite estimate."""
    if not estimate or not np.isfinite(estimate.get("value", np.nan)):
        return
    low, high, value = estimate["low"], estimate["high"], estimate["value"]
    ax.barh(y, high - low, left=low, height=0.6, color=colour, alpha=0.75, label=label)
    ax.vlines(value, y - 0.3, y + 0.3, color="black", lw=1.5)
    ax.plot([value], [y], "o", color=colour, mec="black", ms=5)  # seen at zero width too


def plot_suite(section: Mapping[str, Any], title: str | None = None) -> Figure:
    """Two panels per comparison of the ``suite`` section of an evaluation record
    (:func:`metarl.evolve.suite_verdicts.suite_section`): P(improvement) of the evolved
    objective over the baseline on each environment and pooled (0.5 dashed: no
    difference), and the pooled IQM of the normalised scores of both sides (1 dashed: the
    baseline's level, 0: the untrained policy's)."""
    pooled = list(section.get("pooled") or [])
    if not pooled:
        raise ValueError("plot_suite: the section has no comparison")
    fig = new_figure(11.0, 1.2 + 0.45 * (len(section["environments"]) // len(pooled) + 2)
                     * len(pooled))
    axes = fig.subplots(len(pooled), 2, squeeze=False,
                        gridspec_kw={"width_ratios": [3, 2]})
    for (left, right), comparison in zip(axes, pooled, strict=True):
        evolved, baseline = comparison["evolved"], comparison["baseline"]
        rows = [row for row in section["environments"]
                if row["evolved"] == evolved and row["baseline"] == baseline]
        labels = [row["environment"] + (" (trained on)" if row["trained_on"] else "")
                  for row in rows] + [f"pooled ({len(comparison['environments'])})"]
        for index, row in enumerate(rows):
            probability = row["probability_of_improvement"]
            interval_bar(left, index, {"value": probability["probability_of_improvement"],
                                       "low": probability["low"], "high": probability["high"]},
                         "C7" if row["trained_on"] else "C0")
        interval_bar(left, len(rows), comparison["probability_of_improvement"], "C3")
        left.axvline(0.5, color="grey", ls="--", lw=1)
        left.set_yticks(range(len(labels)), labels)
        left.invert_yaxis()
        left.set_xlim(-0.03, 1.03)
        left.set_xlabel(f"P({evolved} > {baseline})  [{comparison['verdict']}]")
        for index, name in enumerate((evolved, baseline)):
            colour = "C0" if index == 0 else BASELINE_COLOURS.get(
                name.split(" ")[0], "C1")
            interval_bar(right, index, comparison["normalised_iqm"].get(name), colour)
        right.set_yticks([0, 1], [evolved, baseline])
        right.invert_yaxis()
        right.axvline(1.0, color="grey", ls="--", lw=1)
        right.axvline(0.0, color="grey", ls=":", lw=1)
        right.set_xlabel("pooled IQM of normalised score\n(0 untrained policy, 1 baseline)")
    if title:
        fig.suptitle(title)
    return fig
