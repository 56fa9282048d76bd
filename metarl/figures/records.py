"""Figures of a run's records: fitness per generation, learning curves of an evaluation, an
evaluation across one hyperparameter, hyperparameter sweeps, several runs' evaluations and
performance profiles. Each takes the records as they are saved (``metrics.jsonl`` lines, an
evaluation report, a sweep report) or arrays computed from them and returns a
:class:`matplotlib.figure.Figure`; reading them from a run directory is the caller's job
(:mod:`metarl.evolve.report`, :mod:`metarl.evolve.compare`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from metarl.figures.style import (
    BASELINE_COLOURS,
    SEQUENTIAL_CMAP,
    as_float_array,
    mean_ci,
    new_figure,
)


def plot_fitness(history: Sequence[Mapping[str, Any]], *,
                 metric: str = "mean_return", title: str | None = None,
                 members: str = "candidates") -> Figure:
    """Fitness per generation: best, mean, min-max band and best-so-far.

    Args:
        history: the lines of an evolution run's ``metrics.jsonl``
            (:func:`metarl.runs.layout.read_metrics`). Invalid candidates (NaN runs) are
            left out of the statistics and counted in the legend. Lines of a run in rungs
            (``es.rungs > 1``: ``rung_reached`` per candidate) draw their statistics from
            the candidates that trained the whole budget, as ``metrics.jsonl``'s are; those
            stopped early, whose fitness is over part of the training (and moved below the
            rest, :func:`metarl.evolve.rungs.rank_below_survivors`), are dots apart.
        metric: the run's ``fitness.metric`` (for the y label).
        title: figure title.
        members: what one fitness of a line belongs to, as the legend names it:
            ``"candidates"`` (an evolution's) or ``"agents"`` (a meta-gradient run's, whose
            lines hold each agent's fitness over the updates of the step).
    """
    if not history:
        raise ValueError("plot_fitness: the history is empty (no generation finished yet)")
    generations = np.array([line["generation"] for line in history])
    last_rung = max((max(line["rung_reached"], default=0) for line in history
                     if "rung_reached" in line), default=None)
    best, mean, low, high, std = [], [], [], [], []
    stopped_x, stopped_y = [], []
    invalid = 0
    for generation, line in zip(generations, history, strict=True):
        fitness = np.asarray(line["fitness"], np.float64)
        valid = np.asarray(line.get("valid", [True] * fitness.size), bool) & np.isfinite(fitness)
        invalid += int((~valid).sum())
        if last_rung is not None and "rung_reached" in line:
            whole = np.asarray(line["rung_reached"]) == last_rung
            stopped_y.extend(fitness[valid & ~whole])
            stopped_x.extend([generation] * int((valid & ~whole).sum()))
            valid = valid & whole
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

    fig = new_figure(7.5, 4.5)
    ax = fig.subplots()
    population = len(history[-1]["fitness"])
    over = (f"{population} {members}" if last_rung is None else
            f"the {members} that trained the whole budget")
    ax.fill_between(generations, low, high, color="C0", alpha=0.18, step=None,
                    label=f"min–max over {over}")
    ax.fill_between(generations, mean - std, mean + std, color="C0", alpha=0.25,
                    label="mean ± std")
    ax.plot(generations, mean, color="C0", marker="o", lw=2, label="mean fitness")
    ax.plot(generations, best, color="C1", marker="^", lw=1.5, label="best of generation")
    ax.plot(generations, so_far, color="C3", ls="--", drawstyle="steps-post",
            label="best so far")
    if stopped_x:
        ax.plot(stopped_x, stopped_y, ls="none", marker=".", color="0.45", ms=4,
                label="stopped in an earlier rung (fitness so far)")
    if invalid:
        ax.plot([], [], " ", label=f"{invalid} invalid {members.removesuffix('s')}(s) left out")
    ax.set_xlabel("generation")
    described = {"mean_return": "mean episode return over training",
                 "final_return": "final episode return"}.get(metric, metric)
    ax.set_ylabel(f"fitness ({described})")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title or "Fitness of the candidates per generation")
    return fig


def plot_truncated_fitness(history: Sequence[Mapping[str, Any]], *,
                           title: str | None = None) -> Figure:
    """Fitness of a truncated evolution run (``es.truncations > 1``) per unroll.

    Each line of such a run is one truncation, and later truncations of an unroll score
    higher only because their agents have trained longer, so fitness per generation would
    saw-tooth. Here the x axis is the unroll; one thin line per truncation position (the
    mean fitness of the candidates at truncation ``k`` of each unroll), the unroll's fitness
    (its lines' ``unroll_fitness``: their mean over the unroll's truncations) bold, and the
    best unroll so far dashed.

    Args:
        history: the lines of the run's ``metrics.jsonl``, each with ``truncation``.
        title: figure title.
    """
    if not history:
        raise ValueError("plot_truncated_fitness: the history is empty")
    unroll, rows = 0, []
    for index, line in enumerate(history):
        if index and line["truncation"] <= history[index - 1]["truncation"]:
            unroll += 1
        fitness = np.asarray(line["fitness"], np.float64)
        valid = np.asarray(line.get("valid", [True] * fitness.size), bool) & np.isfinite(fitness)
        rows.append((unroll + 1, line["truncation"],
                     fitness[valid].mean() if valid.any() else np.nan,
                     np.nan if line.get("unroll_fitness") is None else line["unroll_fitness"],
                     line.get("best_fitness_so_far", np.nan)))
    unrolls, positions, means, unrolled, so_far = (np.asarray(c, np.float64)
                                                   for c in zip(*rows, strict=True))
    fig = new_figure(7.5, 4.5)
    ax = fig.subplots()
    for position in np.unique(positions):
        here = positions == position
        ax.plot(unrolls[here], means[here], lw=1, marker=".", alpha=0.7,
                color=f"C{int(position) % 10}", label=f"truncation {int(position) + 1}: mean")
    ended = np.isfinite(unrolled)
    ax.plot(unrolls[ended], unrolled[ended], color="k", lw=2.2, marker="o",
            label="unroll: mean over its truncations")
    finite = np.isfinite(so_far)
    ax.plot(unrolls[ended & finite], so_far[ended & finite], color="C3", ls="--",
            drawstyle="steps-post", label="best unroll so far")
    ax.set_xlabel("unroll (every agent trained from scratch once)")
    ax.set_ylabel("fitness on the truncation's updates")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    ax.set_title(title or "Fitness per unroll of a truncated evolution")
    return fig


def plot_learning_curves(
    evaluation_report: Mapping[str, Any],
    *,
    steps_per_update: int | Mapping[str, int] | None = None,
    title: str | None = None,
) -> Figure:
    """Episode return per update on held-out seeds: evolved objective vs each baseline.

    One panel per environment; each objective's line is the mean over seeds with a 95%
    confidence band (Student t over seeds).

    Args:
        evaluation_report: an evaluation of an evolution run, as
            :func:`metarl.evolve.evaluate.evaluate_run` returns and saves it.
        steps_per_update: environment steps per update (``num_envs * num_steps``), one int
            or one per environment id, to put environment steps on the x axis; by default
            the report's ``steps_per_update`` if it has one, else updates.
        title: figure title.
    """
    report = evaluation_report
    results = report.get("results") or []
    if not results:
        raise ValueError("plot_learning_curves: the report has no results")
    steps_per_update = steps_per_update if steps_per_update is not None \
        else report.get("steps_per_update")
    env_ids = list(dict.fromkeys(r["env_id"] for r in results))
    objectives = list(dict.fromkeys(r["objective"] for r in results))
    which = report.get("meta_params", "mean")

    fig = new_figure(6.0 * len(env_ids), 4.4)
    axes = np.atleast_1d(fig.subplots(1, len(env_ids), squeeze=False)[0])
    for ax, env_id in zip(axes, env_ids, strict=True):
        scale = steps_per_update.get(env_id) if isinstance(steps_per_update, Mapping) \
            else steps_per_update
        for result in (r for r in results if r["env_id"] == env_id):
            curves = as_float_array(result["curves"])
            if curves.ndim != 2 or curves.size == 0:
                continue
            mean, low, high = mean_ci(curves)
            x = _curve_updates(result, curves)
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


def _curve_updates(result: Mapping[str, Any], curves: np.ndarray) -> np.ndarray:
    """``[K]`` update number of each point of ``curves [S, K]``: the result's
    ``curve_updates`` where its curves were kept at some updates only
    (:func:`metarl.curves.compact_curves`), else ``1..K`` (a record with every update)."""
    kept = result.get("curve_updates")
    if kept is None:
        return np.arange(1, curves.shape[1] + 1, dtype=np.float64)
    if len(kept) != curves.shape[1]:
        raise ValueError(f"curve_updates: {len(kept)} update numbers for curves of "
                         f"{curves.shape[1]} points")
    return np.asarray(kept, np.float64)


def _setting_label(setting: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in setting.items())


def plot_sweep_curves(report: Mapping[str, Any], title: str | None = None) -> Figure:
    """Learning curves of every combination of a sweep (:func:`metarl.sweep.run_sweep`):
    mean episode return over seeds with a 95% confidence band, the best combination first
    in the legend."""
    results = sorted(report["results"], key=lambda r: -np.nan_to_num(r["mean"], nan=-np.inf))
    if not results:
        raise ValueError("plot_sweep_curves: the report has no results")
    fig = new_figure(7.5, 4.6)
    ax = fig.subplots()
    scale = report.get("steps_per_update")
    colours = matplotlib.colormaps[SEQUENTIAL_CMAP](np.linspace(0.0, 0.9, len(results)))
    for colour, result in zip(colours, results, strict=True):
        curves = as_float_array(result["curves"])
        mean, low, high = mean_ci(curves)
        x = _curve_updates(result, curves) * (scale or 1)
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
    fig = new_figure(1.6 + 1.3 * len(cols), 1.4 + 0.8 * len(rows))
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


def plot_fitness_overlay(histories: Mapping[str, Sequence[Mapping[str, Any]]],
                         title: str | None = None) -> Figure:
    """The mean fitness (solid) and best fitness so far (dashed) of several evolution runs
    over generations, one colour per run.

    Args:
        histories: ``{label: metrics.jsonl lines}``, one entry per run.
        title: figure title.
    """
    fig = new_figure(7.5, 4.5)
    ax = fig.subplots()
    for index, (label, history) in enumerate(histories.items()):
        generations = [line["generation"] for line in history]
        colour = f"C{index % 10}"
        ax.plot(generations, [line.get("mean_fitness", np.nan) for line in history],
                color=colour, lw=1.8, label=f"{label}: mean")
        ax.plot(generations, [line.get("best_fitness_so_far", np.nan) for line in history],
                color=colour, lw=1.2, ls="--", drawstyle="steps-post",
                label=f"{label}: best so far")
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2 if len(histories) > 4 else 1)
    ax.set_title(title or f"Fitness of {len(histories)} runs")
    return fig


def plot_across(section: Mapping[str, Any], *, statistic: str = "iqm",
                title: str | None = None) -> Figure:
    """Held-out performance across one hyperparameter: one line per objective over the
    knob's values, with its 95% interval as a band; one panel per environment. The x axis
    is logarithmic when every value is positive.

    Args:
        section: the ``across`` section of an evaluation record
            (:func:`metarl.evolve.evaluate.evaluate_run` with ``across``): ``knob``,
            ``values``, ``seeds``, ``metric`` and ``environments``, ``{env_id: {objective:
            [point, ...]}}`` where a point has ``value`` and per statistic ``{"value",
            "low", "high"}``.
        statistic: which statistic of the points to draw (``"iqm"`` or ``"mean"``).
        title: figure title.
    """
    environments = section.get("environments") or {}
    if not environments:
        raise ValueError("plot_across: the section has no environments")
    knob = section.get("knob", "value")
    values = np.asarray(section.get("values") or [], np.float64)
    fig = new_figure(5.5 * len(environments), 4.2)
    axes = np.atleast_1d(fig.subplots(1, len(environments), squeeze=False)[0])
    for ax, (env_id, curves) in zip(axes, environments.items(), strict=True):
        for k, (objective, points) in enumerate(curves.items()):
            ordered = sorted(points, key=lambda point: point["value"])
            x = np.asarray([point["value"] for point in ordered], np.float64)
            estimate = [point.get(statistic) or {} for point in ordered]
            y, low, high = (np.asarray([e.get(part, np.nan) for e in estimate], np.float64)
                            for part in ("value", "low", "high"))
            if objective == "evolved":
                colour, style = "C0", "-"
            else:
                colour, style = BASELINE_COLOURS.get(objective, f"C{(k + 4) % 10}"), "--"
            ax.plot(x, y, color=colour, ls=style, marker="o", lw=2, label=objective)
            ax.fill_between(x, low, high, color=colour, alpha=0.15)
        if values.size and np.all(values > 0):
            ax.set_xscale("log")
        ax.plot([], [], " ", label=f"bands: 95% CI, {section.get('seeds', '?')} seeds")
        ax.set_xlabel(knob)
        ax.set_ylabel(f"{statistic.upper() if statistic == 'iqm' else statistic} of "
                      f"{section.get('metric', 'return')}")
        ax.set_title(env_id)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title or f"Held-out performance across {knob}", fontsize="medium")
    return fig


def plot_evaluation_intervals(
    evaluations: Mapping[str, Sequence[tuple[str, str, float, float, float]]],
    title: str | None = None,
) -> Figure:
    """Several runs' held-out evaluations in one figure: one panel per environment, one row
    per run, each objective's mean return with its 95% interval.

    Args:
        evaluations: ``{run label: [(environment, objective, mean, ci_low, ci_high), ...]}``
            (the evolved objective is ``"evolved"``, baselines by their names).
        title: figure title.
    """
    labels = list(evaluations)
    rows = [row for label in labels for row in evaluations[label]]
    envs = list(dict.fromkeys(env for env, *_ in rows))
    objectives = list(dict.fromkeys(obj for _, obj, *_ in rows))
    objectives.sort(key=lambda name: name != "evolved")
    fig = new_figure(4.2 * len(envs) + 1.0, 1.0 + 0.45 * len(labels) * len(objectives))
    axes = np.atleast_1d(fig.subplots(1, len(envs)))
    spread = 0.7 / max(len(objectives), 1)
    for ax, env in zip(axes, envs, strict=True):
        for k, objective in enumerate(objectives):
            colour = "C0" if objective == "evolved" else BASELINE_COLOURS.get(
                objective, f"C{(k + 4) % 10}")
            ys, means, errors = [], [], [[], []]
            for i, label in enumerate(labels):
                for env_id, name, mean, low, high in evaluations[label]:
                    if (env_id, name) == (env, objective):
                        ys.append(i + (k - (len(objectives) - 1) / 2) * spread)
                        means.append(mean)
                        errors[0].append(mean - low)
                        errors[1].append(high - mean)
            if ys:
                ax.errorbar(means, ys, xerr=errors, fmt="o", color=colour, capsize=3,
                            label=objective)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("mean return (95% bootstrap CI)")
        ax.set_title(env)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize="small")
    fig.suptitle(title or f"Held-out evaluations of {len(labels)} runs")
    return fig


def plot_performance_profiles(
    panels: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]],
    title: str | None = None,
) -> Figure:
    """Performance profiles: per panel, for each objective the fraction of runs scoring
    above each return threshold, as a step line with its interval as a band.

    Args:
        panels: ``{panel title: {objective: {"thresholds": [K], "fraction": [K],
            "low": [K], "high": [K]}}}`` (the evolved objective's name starts with
            ``"evolved"``; baselines by their names).
        title: figure title.
    """
    if not panels:
        raise ValueError("plot_performance_profiles: no panel to draw")
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    fig = new_figure(5.2 * columns, 3.9 * rows)
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax, (panel, curves) in zip(axes, panels.items(), strict=False):
        for k, (objective, profile) in enumerate(curves.items()):
            base = objective.removesuffix(" (tuned)")
            colour = "C0" if base == "evolved" else BASELINE_COLOURS.get(base, f"C{(k + 4) % 10}")
            style = "-" if base == "evolved" else "--"
            x = np.asarray(profile["thresholds"], np.float64)
            ax.step(x, np.asarray(profile["fraction"], np.float64), where="post", color=colour,
                    ls=style, lw=2, label=objective)
            ax.fill_between(x, np.asarray(profile["low"], np.float64),
                            np.asarray(profile["high"], np.float64), step="post",
                            color=colour, alpha=0.15)
        ax.plot([], [], " ", label="bands: 95% bootstrap interval")
        ax.set_xlabel("return threshold")
        ax.set_ylabel("fraction of runs above")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(panel, fontsize="small")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title or "Performance profiles on held-out seeds: evolved objective vs "
                          "baselines")
    return fig
