"""Run kind "evolve": meta-evolution of a learned objective, one jitted generation per step
of the engine every run kind shares (:mod:`metarl.runs.engine`).

A run directory holds the files of :mod:`metarl.runs.layout` (config, config history,
metrics, status, lock, checkpoints, evaluations, plots) and the meta-parameter files of
:mod:`metarl.runs.meta_params` (the best candidate and the search distribution's centre),
written after every generation; with ``[fitness] tune_baseline`` also
``baseline_tuning.json``, how the normalising baselines were tuned. Start, continue and read
runs back through :mod:`metarl.kinds` (``start``, ``resume``, ``load_run``);
``es.generations`` may grow when a run continues, since it shapes no schedule. A run stops with
:class:`~metarl.runs.layout.RunStopped` when every candidate has been invalid for
``run.max_invalid_generations`` generations in a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.evaluate import evaluate_run, format_report
from metarl.evolve.generation import Evolution, EvolutionState
from metarl.evolve.report import plot_run
from metarl.evolve.tuning import tuned_fitness_baselines
from metarl.runs import engine
from metarl.runs.layout import write_json
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, save_meta_params
from metarl.sharding import num_shards

__all__ = ["BASELINE_TUNING_FILE", "RUN_KIND", "EvolveProgram", "RunResult",
           "describe_generation"]
BASELINE_TUNING_FILE = "baseline_tuning.json"


@dataclass
class RunResult(engine.SteppedRun):
    """What starting, continuing or reading back an evolution run leaves
    (:mod:`metarl.kinds`): ``state`` is an
    :class:`~metarl.evolve.generation.EvolutionState`, ``program`` an
    :class:`EvolveProgram`."""

    @property
    def evolution(self) -> Evolution:
        return self.program.evolution

    @property
    def best_meta_params(self):
        return jax.device_get(self.state.best_meta_params)

    @property
    def mean_meta_params(self):
        return jax.device_get(self.evolution.mean_meta_params(self.state))


class EvolveProgram(engine.Program):
    """An :class:`~metarl.evolve.generation.Evolution` as the program
    :mod:`~metarl.runs.engine` runs, one jitted generation per step."""

    def __init__(self, config: ExperimentConfig, mesh=None):
        self.evolution = Evolution(config, mesh)  # checks the config fully
        self.mesh = self.evolution.mesh
        self.steps = config.es.generations
        self.agent_steps_per_step = self.evolution.agent_steps_per_generation
        self.baseline_tuning = None  # written after the first generation (tune_baseline)

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
        when fitness is normalised by them and the config does not give them (at their
        best setting with ``fitness.tune_baseline``: the tuning record is kept as
        ``baseline_tuning.json`` after the first generation)."""
        baselines, self.baseline_tuning = self.normalising_baselines()
        return self.evolution.init(baselines=baselines)

    def normalising_baselines(self) -> tuple[Any, dict[str, Any] | None]:
        """``(baselines, tuning record)`` that :meth:`init` starts from: the ``[E]``
        returns that normalise fitness when the run measures them (``None`` when fitness
        is not normalised or the config gives ``fitness.baseline_returns``), measured from
        ``PRNGKey(run.seed + 1)``, and with ``fitness.tune_baseline`` the record of their
        tuning (``None`` otherwise)."""
        fitness = self.config.fitness
        if fitness.tune_baseline:
            baselines, records = tuned_fitness_baselines(self.config, self.config.run.seed + 1,
                                                         self.mesh)
            return baselines, {"seeds": fitness.baseline_seeds,
                               "seed": self.config.run.seed + 1,
                               "baselines": dict(zip(records, baselines, strict=True)),
                               "environments": records}
        if fitness.normalize_by_baseline and not fitness.baseline_returns:
            return self.evolution.measure_baselines(
                jax.random.PRNGKey(self.config.run.seed + 1)), None
        return None, None

    @staticmethod
    def completed(state: EvolutionState) -> int:
        return int(state.generation)

    def step(self, state: EvolutionState) -> tuple[EvolutionState, dict[str, Any]]:
        state, metrics = self.evolution.step(state)
        return state, {"metrics": metrics, "best_fitness_so_far": state.best_fitness}

    def summary(self, generation: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of ``generation``: every candidate's fitness and
        validity, their statistics, the best so far and each environment's mean return
        (with ``fitness.hyperparameter_ranges`` also ``hyperparameters``: per field and
        environment the smallest and largest value the runs drew). With ``es.rungs > 1``
        also ``rung_reached`` per candidate; ``fitness`` is then what the strategy was told
        (:func:`metarl.evolve.rungs.rank_below_survivors`) and the statistics and mean
        returns are those of the candidates that trained the whole budget. With
        ``es.truncations > 1`` (:mod:`metarl.evolve.truncation`) a line is one truncation:
        the fitness and returns are the truncation's, ``truncation`` says which, and
        ``unroll_fitness`` the population's mean fitness per truncation over the unroll it
        ended (``null`` mid-unroll); ``best_fitness_so_far`` is the best unroll's.

        Environments are keyed by their task labels
        (:attr:`~metarl.evolve.config.ExperimentConfig.task_labels`: the ``env_id`` where no
        other task shares it). With ``fitness.tasks_per_generation`` below the number of
        tasks, ``tasks`` lists the indices (into ``[[inner]]``) of the tasks the generation
        trained, and ``mean_return`` and ``hyperparameters`` hold those tasks only."""
        metrics = jax.device_get(record["metrics"])
        fitness = np.asarray(metrics["fitness"], np.float64)
        drawn = metrics.get("hyperparameters") or {}
        valid = np.asarray(metrics["valid"], bool)
        reached = metrics.get("rung_reached")
        # with rungs, the statistics are of the candidates that trained the whole budget
        full = valid if reached is None else valid & (np.asarray(reached) ==
                                                      self.config.es.rungs - 1)
        good = fitness[full]

        labels = self.config.task_labels
        sampled = metrics.get("tasks")
        trained = (list(range(len(labels))) if sampled is None  # the tasks of each column
                   else [int(task) for task in sampled])

        return {
            "generation": generation,
            "fitness": [float(f) for f in fitness],
            "valid": [bool(v) for v in valid],
            "best_fitness": engine.finite_stat(np.max, good),
            "mean_fitness": engine.finite_stat(np.mean, good),
            "std_fitness": engine.finite_stat(np.std, good),
            "best_fitness_so_far": float(record["best_fitness_so_far"]),
            "invalid_candidates": int((~valid).sum()),
            "invalid_runs": int(metrics["invalid_runs"]),
            **({"tasks": trained} if sampled is not None else {}),
            "mean_return": {
                labels[task]: (float(np.nanmean(metrics["returns"][full, e])) if full.any()
                               else None)
                for e, task in enumerate(trained)
            },
            **({"rung_reached": [int(r) for r in reached]} if reached is not None else {}),
            **({"truncation": int(metrics["truncation"]),
                "unroll_fitness": _number_or_none(metrics["unroll_fitness"])}
               if "truncation" in metrics else {}),
            "devices": num_shards(self.mesh),
            **({"hyperparameters": {  # fitness.hyperparameter_ranges: [min, max] drawn
                name: {labels[task]: [float(v) for v in values[e]]
                       for e, task in enumerate(trained)}
                for name, values in drawn.items()}} if drawn else {}),
        }

    def after_step(self, run_dir: Path, state: EvolutionState, primary: bool) -> None:
        """Keep the best candidate and the search distribution's centre as msgpack files."""
        mean = self.evolution.mean_meta_params(state)  # a JAX computation: every process
        if primary:
            save_meta_params(run_dir / BEST_FILE, state.best_meta_params)
            save_meta_params(run_dir / MEAN_FILE, mean)
            if self.baseline_tuning is not None:
                write_json(run_dir / BASELINE_TUNING_FILE, self.baseline_tuning, run_dir)
        self.baseline_tuning = None

    @staticmethod
    def postfix(line: dict[str, Any]) -> dict[str, Any]:
        rate = line["agent_steps_per_second"]
        return {"best": f"{line['best_fitness']:.4g}", "mean": f"{line['mean_fitness']:.4g}",
                "steps_per_s": f"{rate:.3g}" if rate else "-",
                "invalid": line["invalid_candidates"]}


def _number_or_none(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def describe_generation(line: dict[str, Any]) -> str:
    """An evolution run's last line, for the command line."""
    return (f"generations: {line['generation']}  best fitness so far: "
            f"{line['best_fitness_so_far']:.4g}  last mean fitness: "
            f"{line['mean_fitness']:.4g}")


RUN_KIND = engine.RunKind(
    name="evolve", step_key="generation", from_dict=config_from_dict, build=EvolveProgram,
    result=RunResult, plot=plot_run, describe=describe_generation,
    evaluate=evaluate_run, format_evaluation=format_report,
    score_key="best_fitness", best_so_far_key="best_fitness_so_far", valid_key="valid",
    budget_field="es.generations",
    invalid="every candidate was invalid (NaN or infinite returns)",
    advice="Check the config's settings (learning rates, es.sigma, ...)",
    record_sources=ExperimentConfig.recorded_in)
