"""Drift functions as plain callables, and the figures of a run that learned one.

A drift ``D(r, A)`` is the penalty LPO-style policy losses subtract from ``r A``. To draw or
inspect one, objectives turn their meta-parameters into a :class:`DriftFunction`
``(ratio [...], advantage [...], progress=0.0) -> drift [...]`` that carries its label;
:func:`drift_figures` is the ``plot`` hook the drift objectives register.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metarl.objectives.registry import RunFigureRequest


@dataclass(frozen=True, eq=False)
class DriftFunction:
    """A drift with the name figures give it.

    Attributes:
        fn: ``(ratio [...], advantage [...], progress) -> [...]``, broadcasting its inputs.
        label: name in titles and legends.
        uses_progress: whether the drift depends on training progress ``n / N``.
    """

    fn: Callable[[Any, Any, Any], Any]
    label: str
    uses_progress: bool = False

    def __call__(self, ratio, advantage, progress=0.0):
        return self.fn(ratio, advantage, progress)


def drift_figures(request: RunFigureRequest,
                  drift_of: Callable[[Any, float, bool], DriftFunction],
                  references: Callable[[float], dict[str, DriftFunction]]) -> dict[str, Any]:
    """The drift of each candidate as a heatmap with slices (``drift_<which>``), plus its
    change over training (``temporal_drift_<which>``) when it depends on progress; then every
    candidate next to the reference drifts (PPO's, DPO's) as heatmaps on one colour scale
    (``drift_side_by_side``) and, with several candidates (the mean and best of a run, or
    the search means of several runs in ``metarl compare``), all of them overlaid as slices
    at ``A = ±1`` (``drift_slices``).

    Args:
        request: the run (see :class:`~metarl.objectives.registry.RunFigureRequest`).
        drift_of: ``(policy_meta_params, clip_eps, ppo_init) -> DriftFunction``.
        references: ``clip_eps -> {label: drift}``, the drifts every figure compares with
            (:func:`metarl.objectives.lpo.reference_drifts`); the first one is drawn in the
            temporal figure's slices too.
    """
    from metarl.figures.drift import (  # matplotlib only when drawing
        plot_drift,
        plot_drift_comparison,
        plot_drift_slices,
        plot_temporal_drift,
    )

    clip_eps = float(getattr(request.inner, "clip_eps", 0.2))
    compared = references(clip_eps)
    ppo_init = bool(request.options.get("ppo_init", False))
    figures, drifts = {}, {}
    for which, params in request.candidates.items():
        drift_fn = drift_of(params["policy"], clip_eps, ppo_init)
        label = f"{drift_fn.label}, {request.label(which)}"
        progress = 0.5 if drift_fn.uses_progress else 0.0
        at = f" at training progress {progress:g}" if drift_fn.uses_progress else ""
        figures[f"drift_{which}"] = plot_drift(
            drift_fn, label=label, progress=progress, clip_eps=clip_eps, references=compared,
            title=f"{request.run_name}: drift of the {request.label(which)}{at}")
        if drift_fn.uses_progress:
            figures[f"temporal_drift_{which}"] = plot_temporal_drift(
                drift_fn, label=label, reference=next(iter(compared.values()), None),
                title=f"{request.run_name}: drift of the {request.label(which)} over training")
        drifts[request.label(which)] = drift_fn
    if not drifts:
        return figures
    uses_progress = any(fn.uses_progress for fn in drifts.values())
    progress = 0.5 if uses_progress else 0.0
    at = f" at training progress {progress:g}" if uses_progress else ""
    figures["drift_side_by_side"] = plot_drift_comparison(
        drifts, references=compared, progress=progress, clip_eps=clip_eps,
        title=f"{request.run_name}: learned drift{at} next to PPO's clip and DPO, one "
              "colour scale")
    if len(drifts) > 1:
        figures["drift_slices"] = plot_drift_slices(
            drifts, references=compared, progress=progress, clip_eps=clip_eps,
            title=f"{request.run_name}: {len(drifts)} learned drifts{at} at A = ±1")
    return figures
