"""Many runs side by side: a table of what each reached and which settings differ, overlaid
fitness curves, and the learned functions of every run in the same figure.

    metarl compare runs/vd-seed0 runs/vd-seed1 runs/vd-seed2

From Python: :func:`compare_runs` (the table's data), :func:`format_comparison` and
:func:`plot_comparison` (drawn by :mod:`metarl.figures.records`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.evolve.config import config_from_dict
from metarl.objectives import get_objective
from metarl.objectives.registry import RunFigureRequest
from metarl.runs.engine import read_config
from metarl.runs.evaluations import list_records
from metarl.runs.layout import RunError, read_metrics
from metarl.runs.meta_params import MEAN_FILE, read_meta_params


@dataclass(frozen=True)
class RunSummary:
    """What one run reached.

    Attributes:
        run_dir: its directory.
        label: its name in tables and legends (the directory's name, made unique).
        objective: the registered objective it evolved.
        generations: generations finished.
        best_fitness: best candidate fitness seen.
        final_mean_fitness: mean fitness of the candidates of the last generation.
        evaluations: ``(environment, objective, mean, ci_low, ci_high)`` rows of its
            held-out evaluations, if any.
        settings: every config field as ``"section.field" -> value``.
    """

    run_dir: Path
    label: str
    objective: str
    generations: int
    best_fitness: float
    final_mean_fitness: float
    evaluations: tuple[tuple[str, str, float, float, float], ...]
    settings: dict[str, Any]


@dataclass(frozen=True)
class Comparison:
    """Runs and the settings in which they differ (``"section.field" -> value per run``)."""

    runs: tuple[RunSummary, ...]
    differing: dict[str, list[Any]]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"es": {"sigma": 0.1}, "inner": [{...}]}`` -> ``{"es.sigma": 0.1, "inner.0...."}``."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list) and any(isinstance(v, dict | list) for v in data):
        items = ((str(i), v) for i, v in enumerate(data))
    else:
        return {prefix: data}
    flat = {}
    for key, value in items:
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _evaluation_rows(run_dir: Path) -> tuple[tuple[str, str, float, float, float], ...]:
    """One row per environment and objective; the latest evaluation wins where several
    evaluated the same pair."""
    rows = {}
    for report in list_records(run_dir):
        for r in report.get("results", []):
            rows[(r["env_id"], r["objective"])] = (r["env_id"], r["objective"], r["mean"],
                                                   r["ci_low"], r["ci_high"])
    return tuple(rows.values())


@dataclass(frozen=True)
class Verdict:
    """A run's evolved objective against one baseline on one environment.

    ``outcome`` is ``"better"`` when the evolved mean's 95% bootstrap interval lies above
    the baseline's mean, ``"worse"`` when it lies below, else ``"tie"``.
    """

    run: str
    env_id: str
    baseline: str
    evolved: float
    ci_low: float
    ci_high: float
    baseline_mean: float
    outcome: str


def verdicts(comparison: Comparison, evolved: str = "evolved") -> list[Verdict]:
    """The evolved objective of every evaluated run against each of its baselines."""
    found = []
    for run in comparison.runs:
        rows = {(env, objective): (mean, low, high)
                for env, objective, mean, low, high in run.evaluations}
        for (env, objective), (mean, _, _) in rows.items():
            if objective == evolved or (env, evolved) not in rows:
                continue
            value, low, high = rows[(env, evolved)]
            outcome = "better" if low > mean else "worse" if high < mean else "tie"
            found.append(Verdict(run.label, env, objective, value, low, high, mean, outcome))
    return found


def summarise_run(run_dir: str | Path, label: str | None = None) -> RunSummary:
    """Read one run directory (:class:`RunError` naming what is missing)."""
    run_dir = Path(run_dir)
    config = read_config(run_dir, config_from_dict)
    history = read_metrics(run_dir)
    if not history:
        raise RunError(f"{run_dir} has no finished generation yet (metrics.jsonl is empty)")
    last = history[-1]
    return RunSummary(
        run_dir=run_dir,
        label=label or run_dir.name,
        objective=config.objective.name,
        generations=int(last["generation"]),
        best_fitness=float(last.get("best_fitness_so_far", np.nan)),
        final_mean_fitness=float(last.get("mean_fitness", np.nan)),
        evaluations=_evaluation_rows(run_dir),
        settings={key: value for key, value in flatten(config.to_dict()).items()
                  if key not in ("name", "description", "run.output_dir")},
    )


def unique_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Directory names, with the parent's name prepended where two runs share a name."""
    names = [path.name for path in run_dirs]
    return [f"{path.parent.name}/{path.name}" if names.count(path.name) > 1 else path.name
            for path in run_dirs]


def compare_runs(run_dirs: Sequence[str | Path]) -> Comparison:
    """Summaries of ``run_dirs`` and the settings that are not the same in all of them."""
    if len(run_dirs) < 1:
        raise RunError("compare: give at least one run directory")
    paths = [Path(p) for p in run_dirs]
    runs = tuple(summarise_run(p, label) for p, label in zip(paths, unique_labels(paths),
                                                               strict=True))
    keys = sorted(set().union(*(run.settings for run in runs)))
    differing = {}
    for key in keys:
        values = [run.settings.get(key) for run in runs]
        if any(json.dumps(v) != json.dumps(values[0]) for v in values):
            differing[key] = values
    return Comparison(runs, differing)


def format_comparison(comparison: Comparison) -> str:
    """Plain-text tables: what each run reached, its evaluations, and the settings that
    differ."""
    rows = [("run", "objective", "generations", "best fitness", "last mean fitness")]
    rows += [(r.label, r.objective, str(r.generations), f"{r.best_fitness:.4g}",
              f"{r.final_mean_fitness:.4g}") for r in comparison.runs]
    blocks = [_table(rows)]
    evaluated = [(r.label, *row) for r in comparison.runs for row in r.evaluations]
    if evaluated:
        rows = [("run", "environment", "objective", "mean", "95% CI")]
        rows += [(label, env, objective, f"{mean:.2f}", f"[{low:.2f}, {high:.2f}]")
                 for label, env, objective, mean, low, high in evaluated]
        blocks.append(_table(rows))
    found = verdicts(comparison)
    if found:
        rows = [("environment", "vs baseline", "better", "tie", "worse", "runs")]
        for env, baseline in dict.fromkeys((v.env_id, v.baseline) for v in found):
            outcomes = [v.outcome for v in found if (v.env_id, v.baseline) == (env, baseline)]
            rows.append((env, baseline, *(str(outcomes.count(o)) for o in
                                           ("better", "tie", "worse")), str(len(outcomes))))
        blocks.append("evolved objective against each baseline (better / worse: its 95% "
                      "interval lies above / below the baseline's mean)\n" + _table(rows))
    if comparison.differing:
        rows = [("setting", *[r.label for r in comparison.runs])]
        rows += [(key, *[json.dumps(v) for v in values])
                 for key, values in comparison.differing.items()]
        blocks.append(_table(rows))
    else:
        blocks.append("every setting is the same in all runs")
    return "\n\n".join(blocks)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows).rstrip()


def plot_comparison(comparison: Comparison) -> dict[str, Any]:
    """``{file stem: Figure}``: the mean and best-so-far fitness of every run over
    generations (``fitness``), the held-out evaluations of the runs that have any
    (``evaluations``) and, when all runs evolved the same objective, what its registered
    ``plot`` draws of every run's search mean at once."""
    from metarl.figures.records import plot_evaluation_intervals, plot_fitness_overlay

    figures = {"fitness": plot_fitness_overlay(
        {run.label: read_metrics(run.run_dir) for run in comparison.runs})}
    evaluated = {run.label: run.evaluations for run in comparison.runs if run.evaluations}
    if evaluated:
        figures["evaluations"] = plot_evaluation_intervals(evaluated)

    objectives = {run.objective for run in comparison.runs}
    if len(objectives) != 1:
        return figures
    plot = get_objective(objectives.pop()).plot
    if plot is None:
        return figures
    first = read_config(comparison.runs[0].run_dir, config_from_dict)
    candidates = {}
    for run in comparison.runs:
        if (run.run_dir / MEAN_FILE).is_file():
            config = read_config(run.run_dir, config_from_dict)
            template = config.objective.build().init(jax.random.PRNGKey(0))
            candidates[run.label] = read_meta_params(run.run_dir / MEAN_FILE, template)
    request = RunFigureRequest(
        run_name=f"{len(candidates)} runs", candidates=candidates,
        options=dict(first.objective.options), inner=first.inner[0],
        generation=max(run.generations for run in comparison.runs))
    for stem, figure in plot(request).items():
        figures[_safe_stem(stem)] = figure
    return figures


def _safe_stem(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)


def save_comparison(comparison: Comparison, out_dir: str | Path) -> list[Path]:
    """Write ``comparison.txt`` and the figures of :func:`plot_comparison` to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.txt").write_text(format_comparison(comparison) + "\n")
    written = [out / "comparison.txt"]
    for stem, figure in plot_comparison(comparison).items():
        figure.savefig(out / f"{stem}.png", dpi=110)
        written.append(out / f"{stem}.png")
    return written
