"""Drift functions as plain callables, and the hook that draws a run that learned one.

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
    """The ``plot`` hook of a drift objective: the drift of each candidate of the run, at
    the run's ``clip_eps``, drawn by :func:`metarl.figures.drift.plot_run_drifts` (which
    lists the figures) next to the reference drifts.

    Args:
        request: the run (see :class:`~metarl.objectives.registry.RunFigureRequest`).
        drift_of: ``(policy_meta_params, clip_eps, ppo_init) -> DriftFunction``.
        references: ``clip_eps -> {label: drift}``, the drifts every figure compares with
            (:func:`metarl.objectives.lpo.reference_drifts`); the first one is drawn in the
            temporal figure's slices too.
    """
    from metarl.figures.drift import plot_run_drifts  # matplotlib only when drawing

    clip_eps = float(getattr(request.inner, "clip_eps", 0.2))
    compared = references(clip_eps)
    ppo_init = bool(request.options.get("ppo_init", False))
    drifts = {which: (request.label(which), drift_of(params["policy"], clip_eps, ppo_init))
              for which, params in request.candidates.items()}
    return plot_run_drifts(drifts, compared, clip_eps=clip_eps, run_name=request.run_name)
