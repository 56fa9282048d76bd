"""Hyperparameter sweeps trained as one program: every combination × seed of a grid is one
member of a vmapped (chunked, sharded) population.

Only an algorithm's traced hyperparameters (its ``Hyperparams`` fields: learning rate,
discount, ...) can vary inside one program; settings that shape arrays (network widths,
batch sizes) need one program each, and asking to sweep one is an error that says so.
Results: a table of each combination's score with a 95% bootstrap interval, learning
curves, and a heatmap when the grid has two axes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.population import stack_hyperparams
from metarl.config import ConfigError
from metarl.curves import compact_curves, record_text
from metarl.evolve.config import ExperimentConfig
from metarl.evolve.fitness import run_is_valid, run_return
from metarl.evolve.generation import build_learner
from metarl.programs import judging_compiler_options
from metarl.stats import aggregate

SWEEP_FILE = "sweep.json"
FIELD_PREFIX = "inner."


@dataclass(frozen=True)
class GridAxis:
    """One swept hyperparameter and its values, e.g. ``learning_rate`` over ``[1e-4, 1e-3]``."""

    name: str
    values: tuple[float, ...]


def parse_grid(text: str, flag: str = "--grid") -> GridAxis:
    """``"inner.learning_rate=1e-4,3e-4,1e-3"`` -> :class:`GridAxis` (values parsed as TOML
    numbers; the ``inner.`` prefix is optional). Errors name ``flag``."""
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r}: expected FIELD=VALUE,VALUE,...")
    field, _, listed = text.partition("=")
    name = field.strip().removeprefix(FIELD_PREFIX)
    values = []
    for part in listed.split(","):
        try:
            value = tomllib.loads(f"v = {part.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = part.strip()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{flag} {field.strip()}: {part.strip()!r} is not a number")
        values.append(float(value))
    if not values or len(set(values)) != len(values):
        raise ConfigError(f"{flag} {field.strip()}: give distinct values, got {listed!r}")
    return GridAxis(name, tuple(values))


def check_grid(inner: Any, learner, grid: list[GridAxis]) -> None:
    """Raise :class:`ConfigError` naming the field when an axis cannot be swept in one
    program (it sets array shapes, or is no setting at all) or a value is not allowed."""
    traced = learner.default_hypers._fields
    names = [axis.name for axis in grid]
    if len(set(names)) != len(names):
        raise ConfigError(f"--grid: {FIELD_PREFIX}{names} names a field twice")
    settings = {f.name for f in dataclasses.fields(inner)}
    for axis in grid:
        path = f"{FIELD_PREFIX}{axis.name}"
        if axis.name not in settings:
            raise ConfigError(f"--grid {path}: {type(inner).__name__} has no such field; "
                              f"sweepable: {', '.join(traced)}")
        if axis.name not in traced:
            raise ConfigError(
                f"--grid {path}: sets array shapes or the program's structure, so one program "
                f"cannot vary it; sweepable in one program: {', '.join(traced)}. Run one "
                f"sweep per value of {axis.name} instead (--set {path}=...)")
        for value in axis.values:
            try:
                inner.replace(**{axis.name: value})
            except ValueError as error:
                raise ConfigError(f"--grid {FIELD_PREFIX}{error}") from None


def sweep_population(learner, grid: list[GridAxis], seeds: int, seed: int = 0,
                     options: tuple[str, ...] = ()):
    """``(settings, keys [P, 2], hypers [P])`` of a sweep: member ``c * seeds + s`` trains
    combination ``settings[c]`` with seed ``s``; every combination sees the same seeds.

    Axes named in ``options`` are no hyperparameters (an objective's traced options, see
    :class:`metarl.objectives.registry.Tunable`): they are in ``settings`` and left out of
    ``hypers``; the caller passes them in the meta-parameters."""
    settings = [dict(zip([a.name for a in grid], values, strict=True))
                for values in itertools.product(*[a.values for a in grid])]
    hypers = stack_hyperparams([
        learner.default_hypers._replace(**{k: jnp.float32(v) for k, v in setting.items()
                                           if k not in options})
        for setting in settings for _ in range(seeds)])
    keys = jnp.concatenate([jax.random.split(jax.random.PRNGKey(seed), seeds)] * len(settings))
    return settings, keys, hypers


@dataclass(frozen=True)
class SweepResult:
    """One combination of the grid.

    Attributes:
        setting: hyperparameter name -> value.
        returns: ``[S]`` score of each seed (the experiment's fitness metric).
        mean, ci_low, ci_high: mean over valid seeds and its 95% bootstrap interval
            (:func:`metarl.stats.aggregate`).
        invalid: seeds whose training produced NaN or inf.
        curves: ``[S, K]`` episode return at the updates ``curve_updates`` (None before
            the first finished episode), compacted by :func:`metarl.curves.compact_curves`
            after ``returns`` were computed from the full curves.
        curve_updates: ``[K]`` 1-based update number of each point of ``curves`` (sweeps
            saved before curves were compacted have none: their points are ``1..U``).
    """

    setting: dict[str, float]
    returns: list[float]
    mean: float
    ci_low: float
    ci_high: float
    invalid: int
    curves: list[list[float | None]]
    curve_updates: list[int] | None = None


def run_sweep(config: ExperimentConfig, grid: list[GridAxis], seeds: int,
              seed: int = 0, chunk_size="auto", mesh=None) -> dict[str, Any]:
    """Train every combination of ``grid`` × ``seeds`` with the experiment's first
    ``[inner]`` settings and objective (its initial meta-parameters), as one jitted
    population. Returns the report (see :func:`save_sweep`)."""
    if not grid:
        raise ConfigError("--grid: give at least one FIELD=VALUES")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ConfigError(f"--seeds: need at least 2 for a confidence interval, got {seeds}")
    inner = config.inner[0]
    learner = build_learner(inner, config.objective.build())
    check_grid(inner, learner, grid)
    settings, keys, hypers = sweep_population(learner, grid, seeds, seed)
    members = len(settings) * seeds
    trained = train_sweep(learner, keys, hypers, config.fitness, chunk_size=chunk_size,
                          mesh=mesh)
    compile_seconds, train_seconds = trained["compile_seconds"], trained["train_seconds"]
    results = summarise_sweep(settings, seeds, trained)
    return {
        "experiment": config.name,
        "algorithm": learner.algorithm,
        "env_id": inner.env_id,
        "objective": config.objective.name,
        "metric": config.fitness.metric,
        "grid": {axis.name: list(axis.values) for axis in grid},
        "seeds": seeds,
        "seed": seed,
        "agents": members,
        "steps_per_update": learner.steps_per_update,
        "agent_steps": members * learner.steps_per_agent,
        "compile_seconds": round(compile_seconds, 2),
        "train_seconds": round(train_seconds, 2),
        "results": [dataclasses.asdict(r) for r in results],
    }


def train_sweep(learner, keys, hypers, fitness, meta_params=None, chunk_size="auto",
                mesh=None, programs: dict[int, Any] | None = None) -> dict[str, Any]:
    """Train the members of a sweep (:func:`sweep_population`) as one jitted program
    (chunked, and sharded over ``mesh``) and score them by ``fitness``'s metric.

    Args:
        learner: the learner every member trains with.
        keys: ``[P, 2]`` PRNG keys.
        hypers: the learner's hyperparameters as ``[P]`` arrays.
        fitness: a :class:`~metarl.evolve.config.FitnessConfig` (metric, final fraction).
        meta_params: ``None`` (the objective's own) or meta-parameters with a leading
            ``[P]`` axis.
        chunk_size, mesh: as :func:`metarl.sharding.train_population` takes them.
        programs: compiled programs by member count, kept by the caller between calls
            with the same learner, fitness, chunking and meta-parameter structure: a call
            of a size compiled before reuses it (``compile_seconds`` 0).

    Returns ``{"curves": [P, U], "returns": [P], "valid": [P]}`` as NumPy arrays, with
    ``compile_seconds`` and ``train_seconds``. The jitted function is named
    ``sweep_program`` (what a count of compilations sees).
    """
    from metarl import sharding

    def sweep_program(keys, meta_params, hypers):
        metrics = sharding.train_population(learner.train, keys, meta_params, hypers,
                                            chunk_size, mesh)
        returns = run_return(metrics, fitness)
        return metrics["episode_return"], returns, run_is_valid(metrics, returns)

    started = time.perf_counter()
    members = int(keys.shape[0])
    if programs is not None and members in programs:
        compiled = programs[members]
    else:
        compiled = jax.jit(sweep_program, compiler_options=judging_compiler_options()).lower(
            keys, meta_params, hypers).compile()
        if programs is not None:
            programs[members] = compiled
    compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    curves, returns, valid = jax.device_get(compiled(keys, meta_params, hypers))
    train_seconds = time.perf_counter() - started
    return {"curves": np.asarray(curves, np.float64), "returns": np.asarray(returns, np.float64),
            "valid": np.asarray(valid, bool), "compile_seconds": round(compile_seconds, 2),
            "train_seconds": round(train_seconds, 2)}


def summarise_sweep(settings: list[dict[str, float]], seeds: int,
                    trained: dict[str, Any]) -> list[SweepResult]:
    """One :class:`SweepResult` per setting from :func:`train_sweep`'s arrays (member
    ``c * seeds + s`` is setting ``c``, seed ``s``)."""
    curves, returns, valid = trained["curves"], trained["returns"], trained["valid"]
    results = []
    for index, setting in enumerate(settings):
        rows = slice(index * seeds, (index + 1) * seeds)
        scores, ok = returns[rows], valid[rows]
        estimate = aggregate(scores[ok], "mean")
        low, high = estimate.low, estimate.high
        results.append(SweepResult(
            setting=setting,
            returns=[float(r) for r in scores],
            mean=float(np.mean(scores[ok])) if ok.any() else math.nan,
            ci_low=low, ci_high=high, invalid=int((~ok).sum()),
            **compact_curves(curves[rows]),
        ))
    return results


def format_sweep(report: dict[str, Any]) -> str:
    """Plain-text table: one row per combination, best first."""
    names = list(report["grid"])
    rows = [(*names, f"{report['metric']} (mean)", "95% CI", "invalid")]
    ranked = sorted(report["results"], key=lambda r: -np.nan_to_num(r["mean"], nan=-np.inf))
    for r in ranked:
        rows.append((*[f"{r['setting'][n]:g}" for n in names], f"{r['mean']:.2f}",
                     f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]", str(r["invalid"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)


def save_sweep(report: dict[str, Any], out_dir: str | Path, plots: bool = True) -> list[Path]:
    """Write ``sweep.json``, ``sweep.txt`` and (with ``plots``) ``learning_curves.png`` and,
    for a two-axis grid, ``heatmap.png`` into ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / SWEEP_FILE, out / "sweep.txt"]
    _write_atomically(written[0], record_text(report))
    _write_atomically(written[1], format_sweep(report) + "\n")
    if plots:
        from metarl.figures.records import plot_sweep_curves, plot_sweep_heatmap
        from metarl.figures.style import save_png

        written.append(save_png(plot_sweep_curves(report), out / "learning_curves.png"))
        if len(report["grid"]) == 2:
            written.append(save_png(plot_sweep_heatmap(report), out / "heatmap.png"))
    return written


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
