"""The figures of an evolution run, read from its directory and written to
``<run_dir>/plots/*.png`` (:func:`plot_run`, what ``metarl plot`` draws):

==============================  =========================================================
``fitness.png``                 fitness per generation (always; per unroll for a
                                truncated run, ``es.truncations > 1``)
``<figure>.png``                what the run's objective draws of its learned loss (its
                                registered ``plot``: ``value_distance.png`` for the value
                                distance, ``drift_{mean,best}.png`` for LPO, ...)
``learning_curves_<n>.png``     evolved vs baselines on held-out seeds, one per evaluation
                                (``evaluations/<n>.json``; ``learning_curves.png`` for the
                                ``evaluation.json`` of runs made before evaluations
                                accumulated)
``across_<n>.png``              one line per objective over a hyperparameter, for an
                                evaluation made with ``across`` (``--across``)
==============================  =========================================================

This module reads; the drawing is :mod:`metarl.figures`' and the objectives' plot hooks'.
"""

from __future__ import annotations

from pathlib import Path

import jax

from metarl.evolve.across import save_across_figure
from metarl.evolve.config import config_from_dict
from metarl.evolve.engines import engine_of
from metarl.figures.records import plot_fitness, plot_learning_curves, plot_truncated_fitness
from metarl.figures.style import save_png
from metarl.objectives import get_objective
from metarl.objectives.registry import RunFigureRequest
from metarl.runs.engine import read_config
from metarl.runs.evaluations import list_records
from metarl.runs.layout import PLOTS_DIR, RunError, read_metrics
from metarl.runs.meta_params import read_candidates


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write the figures of an evolution run to ``<run_dir>/plots/*.png`` and return their
    paths.

    Always the fitness; then what the run's objective draws of its learned loss for the
    search mean and the best candidate (its registered ``plot``, e.g. the learned value
    distance against L2, or LPO's drift); and the learning curves of every evaluation of the
    run (:func:`metarl.runs.evaluations.list_records`), with the figure across a
    hyperparameter of each evaluation that has one.

    Raises:
        RunError: ``run_dir`` is missing, is not a run, or has no finished generation.
    """
    run_dir = Path(run_dir)
    config = read_config(run_dir, config_from_dict)  # raises RunError naming what is missing
    history = read_metrics(run_dir)
    if not history:
        raise RunError(f"{run_dir} has no finished generation yet (metrics.jsonl is empty)")
    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    if "truncation" in history[-1]:  # es.truncations > 1: a line is one truncation
        fitness = plot_truncated_fitness(history, title=f"{config.name}: fitness per unroll")
    else:
        engine = engine_of(config)
        fitness = plot_fitness(history, metric=config.fitness.metric, members=engine.members,
                               title=f"{config.name}: {engine.fitness_title}")
    written = [_save(fitness, out / "fitness.png")]

    plot = get_objective(config.objective.name).plot
    if plot is not None:
        template = config.objective.build().init(jax.random.PRNGKey(0))
        request = RunFigureRequest(
            run_name=config.name, candidates=read_candidates(run_dir, template),
            options=dict(config.objective.options), inner=config.inner[0],
            generation=history[-1]["generation"],
        )
        for stem, fig in plot(request).items():
            written.append(_save(fig, out / f"{stem}.png"))

    for report in list_records(run_dir):
        if not report.get("results"):
            continue
        # reports written before results recorded their steps per update came from PPO
        by_env = {inner.env_id: getattr(inner, "batch_size", None) for inner in config.inner}
        steps = {r["env_id"]: r.get("steps_per_update") or by_env.get(r["env_id"])
                 or getattr(config.inner[0], "batch_size", 1)
                 for r in report.get("results", [])}
        legacy = not isinstance(report["id"], int)
        title = f"{config.name}: held-out learning curves"
        if not legacy:
            title += (f" (evaluation {report['id']}: {report.get('seeds', '?')} seeds, "
                      f"{report.get('meta_params', 'mean')} meta-params)")
        fig = plot_learning_curves(report, steps_per_update=steps, title=title)
        name = ("learning_curves.png" if report["id"] == "legacy"
                else f"learning_curves_{report['id']}.png")
        written.append(_save(fig, out / name))
        if report.get("across") and not legacy:
            written.append(save_across_figure(run_dir, report, config.name))
    return written


def _save(fig, path: Path) -> Path:
    return save_png(fig, path)
