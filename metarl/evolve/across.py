"""Held-out performance across one knob: every objective of an evaluation trained at each
value of one traced hyperparameter on the same held-out seeds (``metarl evaluate --across``),
its figure and its table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inner_loops.population import broadcast_to_population
from metarl.config import ConfigError
from metarl.evolve.config import FitnessConfig
from metarl.evolve.generation import build_learner
from metarl.evolve.judging import evaluation_figure_path, save_evaluation_figure, text_table
from metarl.stats import aggregate
from metarl.sweep import GridAxis, check_grid, sweep_population, train_sweep

__all__ = ["ACROSS_STATISTICS", "across_figure_path", "check_across", "evaluate_across",
           "format_across", "save_across_figure"]

ACROSS_STATISTICS = ("iqm", "mean")  # what a point of an evaluation across a knob keeps


def check_across(across: Mapping[str, Sequence[float]] | None, inners, objective
                 ) -> GridAxis | None:
    """``across`` as a :class:`~metarl.sweep.GridAxis` (``None`` when not given), checked
    before anything trains: one knob, a traced hyperparameter of every environment's
    algorithm, at least 2 distinct finite values that its config accepts. Errors name
    ``across``."""
    if not across:
        return None
    if not isinstance(across, Mapping) or len(across) != 1:
        raise ConfigError(f"across: expected one knob -> values, e.g. "
                          f"{{'learning_rate': [1e-4, 3e-4, 1e-3]}}; got {across!r}")
    (name, values), = across.items()
    name = str(name).removeprefix("inner.")
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ConfigError(f"across {name}: expected a list of numbers, got {values!r}")
    if any(isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v)
           for v in values):
        raise ConfigError(f"across {name}: expected finite numbers, got {list(values)}")
    if len(values) < 2 or len(set(values)) != len(values):
        raise ConfigError(f"across {name}: give at least 2 distinct values, got "
                          f"{list(values)}")
    axis = GridAxis(name, tuple(float(v) for v in values))
    for inner in inners:  # the traced fields are the algorithm's, whatever the objective
        try:
            check_grid(inner, build_learner(inner, objective), [axis])
        except ConfigError as error:
            raise ConfigError("across " + str(error).removeprefix("--grid ")) from None
    return axis


def evaluate_across(objective, meta_params, inner, fitness: FitnessConfig, axis: GridAxis,
                    seeds: int, eval_seed: int, chunk_size="auto", mesh=None
                    ) -> list[dict[str, Any]]:
    """Train ``objective`` at every value of ``axis`` on the ``seeds`` held-out seeds (the
    keys :func:`evaluate_objective` uses), all values x seeds as one vmapped program
    (:func:`metarl.sweep.train_sweep`: chunked by ``chunk_size``, sharded over ``mesh``).

    Returns one point per value, in the order given: ``value``, the seeds' ``returns``
    (NaN where training diverged), ``invalid`` and, per statistic of
    :data:`ACROSS_STATISTICS`, ``{"value", "low", "high"}`` with a 95% bootstrap interval
    (:func:`metarl.stats.aggregate`)."""
    learner = build_learner(inner, objective)
    settings, keys, hypers = sweep_population(learner, [axis], seeds, eval_seed)
    members = len(settings) * seeds
    trained = train_sweep(learner, keys, hypers, fitness,
                          broadcast_to_population(meta_params, members), chunk_size, mesh)
    returns = np.where(trained["valid"], trained["returns"], np.nan)
    points = []
    for index, value in enumerate(axis.values):
        scores = returns[index * seeds:(index + 1) * seeds]
        points.append({
            "value": value,
            "returns": [None if np.isnan(r) else float(r) for r in scores],
            "invalid": int(np.isnan(scores).sum()),
            **{statistic: aggregate(scores, statistic).to_dict()
               for statistic in ACROSS_STATISTICS},
        })
    return points


def across_figure_path(run_dir: str | Path, record_id: Any) -> Path:
    """Where the figure of evaluation ``record_id``'s ``across`` section is saved."""
    return evaluation_figure_path(run_dir, "across", record_id)


def save_across_figure(run_dir: str | Path, report: Mapping[str, Any], run_name: str
                       ) -> Path:
    """Draw ``report``'s ``across`` section (:func:`metarl.figures.records.plot_across`)
    into :func:`across_figure_path` and return the path."""
    from metarl.figures.records import plot_across

    section = report["across"]
    fig = plot_across(section, title=f"{run_name}: held-out {section['metric']} across "
                                     f"{section['knob']}\n(evaluation {report['id']}, "
                                     f"{section['seeds']} seeds per value)")
    return save_evaluation_figure(fig, run_dir, "across", report["id"])


def format_across(report: Mapping[str, Any]) -> str:
    """The ``across`` section of an evaluation as a table: per environment and objective,
    the IQM and its 95% interval at each value of the knob (empty without one)."""
    section = report.get("across")
    if not section:
        return ""
    values = section["values"]
    rows = [("environment", "objective", *[f"{section['knob']}={v:g}" for v in values])]
    for env_id, curves in section["environments"].items():
        for name, points in curves.items():
            by_value = {point["value"]: point["iqm"] for point in points}
            rows.append((env_id, name, *[
                f"{by_value[v]['value']:.2f} [{by_value[v]['low']:.2f}, "
                f"{by_value[v]['high']:.2f}]" for v in values]))
    return (f"across {section['knob']}: {section['metric']} IQM [95% CI] over "
            f"{section['seeds']} held-out seeds at each value\n" + text_table(rows))
