"""Run kind "evolve": start, continue and read back meta-evolution runs.

A run directory holds the files of :mod:`metarl.runs.layout` (config, config history,
metrics, status, lock, checkpoints, evaluations, plots) and, for evolution::

    best_meta_params.msgpack   best candidate so far (flax msgpack)
    mean_meta_params.msgpack   current centre of the search distribution

Evolution runs on the engine every run kind shares (:mod:`metarl.runs.engine`), one
generation per step: :func:`evolve` starts a run, :func:`resume` continues one by the rules
of :mod:`metarl.runs.resume` (from its newest usable checkpoint, or from the beginning when
it never reached one; ``es.generations`` may grow, since it shapes no schedule),
:func:`load_run` reads one back for evaluation and plots. Both :func:`evolve` and
:func:`resume` hold the directory's lock while they write (:mod:`metarl.runs.lock`), and
stop with :class:`RunStopped` when every candidate has been invalid for
``run.max_invalid_generations`` generations in a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from metarl.config import ExperimentConfig, config_from_dict
from metarl.evolution import Evolution, EvolutionState
from metarl.runs import engine
from metarl.runs.layout import (
    CONFIG_FILE,
    METRICS_FILE,
    CheckpointError,
    RunError,
    RunStopped,
    atomic_write,
    read_metrics,
)
from metarl.sharding import num_shards

BEST_FILE = "best_meta_params.msgpack"
MEAN_FILE = "mean_meta_params.msgpack"

__all__ = [
    "BEST_FILE", "CONFIG_FILE", "MEAN_FILE", "METRICS_FILE", "CheckpointError", "RunError",
    "RunResult", "RunStopped", "evolve", "load_meta_params", "load_run", "new_run_dir",
    "read_metrics", "read_run_config", "resume", "save_meta_params",
]


@dataclass
class RunResult(engine.SteppedRun):
    """What :func:`evolve` / :func:`resume` / :func:`load_run` leave: ``state`` is an
    :class:`~metarl.evolution.EvolutionState`, ``program`` an :class:`EvolveProgram`."""

    @property
    def evolution(self) -> Evolution:
        return self.program.evolution

    @property
    def best_meta_params(self):
        return jax.device_get(self.state.best_meta_params)

    @property
    def mean_meta_params(self):
        return jax.device_get(self.evolution.mean_meta_params(self.state))


def save_meta_params(path: str | Path, meta_params) -> None:
    """Write meta-parameters (a pytree of arrays) as flax msgpack, atomically."""
    arrays = jax.tree.map(np.asarray, jax.device_get(meta_params))
    atomic_write(Path(path), serialization.msgpack_serialize(
        serialization.to_state_dict(arrays)
    ))


def load_meta_params(path: str | Path, template=None):
    """Read meta-parameters written by :func:`save_meta_params`.

    With a ``template`` (e.g. ``objective.init(key)``) the result has its exact structure;
    without one, lists come back as dicts keyed ``"0"``, ``"1"``, ...
    """
    path = Path(path)
    if not path.is_file():
        raise RunError(f"no meta-parameters file at {path}")
    raw = serialization.msgpack_restore(path.read_bytes())
    if template is None:
        return raw
    return serialization.from_state_dict(template, raw)


def new_run_dir(config: ExperimentConfig) -> Path:
    """A fresh directory ``<output_dir>/<name>-<timestamp>`` (suffixed if it exists)."""
    return engine.new_run_dir(config)


class EvolveProgram:
    """An :class:`~metarl.evolution.Evolution` as the program
    :mod:`~metarl.runs.engine` runs, one jitted generation per step."""

    def __init__(self, config: ExperimentConfig, mesh=None):
        self.evolution = Evolution(config, mesh)  # checks the config fully
        self.mesh = self.evolution.mesh
        self.steps = config.es.generations
        self.agent_steps_per_step = self.evolution.agent_steps_per_generation

    @property
    def config(self) -> ExperimentConfig:
        return self.evolution.config

    @config.setter
    def config(self, config: ExperimentConfig) -> None:  # a new budget or trackers
        self.evolution.config = config

    def template(self) -> EvolutionState:
        """A state to restore into (the baselines are in every checkpoint)."""
        return self.evolution.init()

    def init(self) -> EvolutionState:
        """The state before the first generation; measures the baselines' returns first
        when fitness is normalised by them and the config does not give them."""
        fitness = self.config.fitness
        baselines = None
        if fitness.normalize_by_baseline and not fitness.baseline_returns:
            baselines = self.evolution.measure_baselines(
                jax.random.PRNGKey(self.config.run.seed + 1))
        return self.evolution.init(baselines=baselines)

    @staticmethod
    def completed(state: EvolutionState) -> int:
        return int(state.generation)

    def step(self, state: EvolutionState) -> tuple[EvolutionState, dict[str, Any]]:
        state, metrics = self.evolution.step(state)
        return state, {"metrics": metrics, "best_fitness_so_far": state.best_fitness}

    def summary(self, generation: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of ``generation``: every candidate's fitness and
        validity, their statistics, the best so far and each environment's mean return."""
        metrics = jax.device_get(record["metrics"])
        fitness = np.asarray(metrics["fitness"], np.float64)
        valid = np.asarray(metrics["valid"], bool)
        good = fitness[valid]

        def stat(fn):
            return float(fn(good)) if good.size else math.nan

        return {
            "generation": generation,
            "fitness": [float(f) for f in fitness],
            "valid": [bool(v) for v in valid],
            "best_fitness": stat(np.max),
            "mean_fitness": stat(np.mean),
            "std_fitness": stat(np.std),
            "best_fitness_so_far": float(record["best_fitness_so_far"]),
            "invalid_candidates": int((~valid).sum()),
            "invalid_runs": int(metrics["invalid_runs"]),
            "mean_return": {
                inner.env_id: (float(np.nanmean(metrics["returns"][:, e])) if valid.any()
                               else None)
                for e, inner in enumerate(self.config.inner)
            },
            "devices": num_shards(self.mesh),
        }

    def after_step(self, run_dir: Path, state: EvolutionState, primary: bool) -> None:
        """Keep the best candidate and the search distribution's centre as msgpack files."""
        mean = self.evolution.mean_meta_params(state)  # a JAX computation: every process
        if primary:
            save_meta_params(run_dir / BEST_FILE, state.best_meta_params)
            save_meta_params(run_dir / MEAN_FILE, mean)

    @staticmethod
    def postfix(line: dict[str, Any]) -> dict[str, Any]:
        rate = line["agent_steps_per_second"]
        return {"best": f"{line['best_fitness']:.4g}", "mean": f"{line['mean_fitness']:.4g}",
                "steps_per_s": f"{rate:.3g}" if rate else "-",
                "invalid": line["invalid_candidates"]}


def describe_generation(line: dict[str, Any]) -> str:
    """An evolution run's last line, for the command line."""
    return (f"generations: {line['generation']}  best fitness so far: "
            f"{line['best_fitness_so_far']:.4g}  last mean fitness: "
            f"{line['mean_fitness']:.4g}")


def _plot(run_dir: str | Path) -> list[Path]:
    from metarl.plots import plot_run

    return plot_run(run_dir)


def evolve(config: ExperimentConfig, run_dir: str | Path | None = None) -> RunResult:
    """Start a new run of ``config`` in ``run_dir`` (a fresh directory by default).

    Raises :class:`RunError` if the directory holds another run or another process is
    writing it, and :class:`RunStopped` when the run stops itself.
    """
    return engine.start_run(RUN_KIND, config, run_dir)


def read_run_config(run_dir: str | Path) -> ExperimentConfig:
    """The resolved config a run was started with."""
    return RUN_KIND.read_config(run_dir)


def resume(run_dir: str | Path, generations: int | None = None,
           accept_config_change: bool = False,
           trackers: tuple[str, ...] | None = None) -> RunResult:
    """Continue ``run_dir`` from its newest usable checkpoint (:mod:`metarl.runs.resume`).

    Runs until ``generations`` generations are complete in total (the config's
    ``es.generations`` by default; a new budget is written to ``config.json`` and the config
    history). ``trackers`` replaces ``run.trackers`` from here on (recorded like a new
    budget). Otherwise as :func:`metarl.runs.engine.resume_run`: a config changed in more
    than these is refused unless ``accept_config_change``, and a run that never reached a
    checkpoint starts from the beginning.
    """
    return engine.resume_run(RUN_KIND, run_dir, generations, accept_config_change, trackers)


def load_run(run_dir: str | Path) -> RunResult:
    """Read a run back (newest usable checkpoint, config and metrics) without running or
    changing anything; damaged checkpoints are skipped with a warning."""
    return engine.load_run(RUN_KIND, run_dir)


RUN_KIND = engine.RunKind(
    name="evolve", step_key="generation", from_dict=config_from_dict, build=EvolveProgram,
    result=RunResult, plot=_plot, describe=describe_generation,
    score_key="best_fitness", best_so_far_key="best_fitness_so_far", valid_key="valid",
    budget_field="es.generations", command="metarl evolve",
    invalid="every candidate was invalid (NaN or infinite returns)",
    advice="Check the config's settings (learning rates, es.sigma, ...)")
