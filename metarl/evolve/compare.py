"""Many runs side by side: a table of what each reached and which settings differ, overlaid
fitness curves, and the learned functions of every run in the same figure.

    metarl compare runs/vd-seed0 runs/vd-seed1 runs/vd-seed2

From Python: :func:`compare_runs` (the table's data), :func:`format_comparison` and
:func:`plot_comparison`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from metarl.run import MEAN_FILE, RunError, read_metrics, read_run_config
from metarl.runs.evaluations import LEGACY_FILE, list_records

EVALUATION_FILE = LEGACY_FILE


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
    config = read_run_config(run_dir)
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
    (``evaluations``, :func:`plot_evaluations`) and, when all runs evolved the same
    objective, what its registered ``plot`` draws of every run's search mean at once."""
    from matplotlib.figure import Figure

    from metarl.objectives import get_objective
    from metarl.objectives.registry import RunFigureRequest
    from metarl.plots import load_candidate_meta_params

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for index, run in enumerate(comparison.runs):
        history = read_metrics(run.run_dir)
        generations = [line["generation"] for line in history]
        colour = f"C{index % 10}"
        ax.plot(generations, [line.get("mean_fitness", np.nan) for line in history],
                color=colour, lw=1.8, label=f"{run.label}: mean")
        ax.plot(generations, [line.get("best_fitness_so_far", np.nan) for line in history],
                color=colour, lw=1.2, ls="--", drawstyle="steps-post",
                label=f"{run.label}: best so far")
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2 if len(comparison.runs) > 4 else 1)
    ax.set_title(f"Fitness of {len(comparison.runs)} runs")
    figures = {"fitness": fig}

    if any(run.evaluations for run in comparison.runs):
        figures["evaluations"] = plot_evaluations(comparison)

    objectives = {run.objective for run in comparison.runs}
    if len(objectives) != 1:
        return figures
    plot = get_objective(objectives.pop()).plot
    if plot is None:
        return figures
    first = read_run_config(comparison.runs[0].run_dir)
    candidates = {}
    for run in comparison.runs:
        if (run.run_dir / MEAN_FILE).is_file():
            config = read_run_config(run.run_dir)
            candidates[run.label] = load_candidate_meta_params(run.run_dir / MEAN_FILE, config)
    request = RunFigureRequest(
        run_name=f"{len(candidates)} runs", candidates=candidates,
        options=dict(first.objective.options), inner=first.inner[0],
        generation=max(run.generations for run in comparison.runs))
    for stem, figure in plot(request).items():
        figures[_safe_stem(stem)] = figure
    return figures


def plot_evaluations(comparison: Comparison):
    """Every run's held-out evaluation in one figure: one panel per environment, one row
    per run, the evolved objective's and each baseline's mean return with its 95%
    bootstrap interval (baselines are trained on the same held-out seeds in every run)."""
    from matplotlib.figure import Figure

    from metarl.plots import BASELINE_COLOURS

    runs = [run for run in comparison.runs if run.evaluations]
    envs = list(dict.fromkeys(env for run in runs for env, *_ in run.evaluations))
    objectives = list(dict.fromkeys(obj for run in runs for _, obj, *_ in run.evaluations))
    objectives.sort(key=lambda name: name != "evolved")
    fig = Figure(figsize=(4.2 * len(envs) + 1.0, 1.0 + 0.45 * len(runs) * len(objectives)),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(envs)))
    spread = 0.7 / max(len(objectives), 1)
    for ax, env in zip(axes, envs, strict=True):
        for k, objective in enumerate(objectives):
            colour = "C0" if objective == "evolved" else BASELINE_COLOURS.get(
                objective, f"C{(k + 4) % 10}")
            ys, means, errors = [], [], [[], []]
            for i, run in enumerate(runs):
                for env_id, name, mean, low, high in run.evaluations:
                    if (env_id, name) == (env, objective):
                        ys.append(i + (k - (len(objectives) - 1) / 2) * spread)
                        means.append(mean)
                        errors[0].append(mean - low)
                        errors[1].append(high - mean)
            if ys:
                ax.errorbar(means, ys, xerr=errors, fmt="o", color=colour, capsize=3,
                            label=objective)
        ax.set_yticks(range(len(runs)), [run.label for run in runs])
        ax.invert_yaxis()
        ax.set_xlabel("mean return (95% bootstrap CI)")
        ax.set_title(env)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize="small")
    fig.suptitle(f"Held-out evaluations of {len(runs)} runs")
    return fig


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
