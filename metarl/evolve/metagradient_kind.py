"""Meta-gradient runs on the engine every run kind shares (:mod:`metarl.runs.engine`).

An evolution experiment with ``[meta] method = "metagradient"`` is still of kind
``"evolve"``: it reads the same experiment files, writes the same run directory (config,
``metrics.jsonl``, checkpoints, status, ``best_meta_params.msgpack`` and
``mean_meta_params.msgpack``) and is evaluated, plotted, compared and distilled as an
evolution run is. Only its program differs, :class:`MetaGradientProgram` (one jitted
meta-gradient step of :class:`~metarl.evolve.metagradient.MetaGradient` per step of the
engine), and its budget, ``meta.steps`` (:data:`RUN_KIND`, which :mod:`metarl.kinds` picks
for such a run).

**Its lines** of ``metrics.jsonl`` (one per meta-step, keyed ``generation`` as an
evolution's are) hold what an evolution's hold where it means the same: ``fitness`` (each
agent's ``fitness.metric`` over the updates of the step; ``null`` where it finished no
episode), ``valid`` (its losses and meta-gradient were finite), ``best_fitness``,
``mean_fitness``, ``std_fitness`` over them, ``best_fitness_so_far``, ``mean_return``
per task and ``devices``; and besides ``meta_loss``, ``meta_grad_norm`` (the mean
meta-gradient's global norm before clipping), ``invalid_agents``, ``restarted`` (agents
replaced by fresh ones at the start of the step) and ``ages`` (each agent's updates after
it). So the fitness figure, the progress bar and the trackers work as for evolution.

**Best and mean.** A meta-gradient run has one point, the current meta-parameters, and no
candidate scored on its own (an agent's return mixes the meta-parameters of its whole
life): ``best_meta_params.msgpack`` and ``mean_meta_params.msgpack`` both hold the current
meta-parameters, after every step.

**A stuck search.** A run whose meta-gradient is exactly zero for :data:`FLAT_STEPS`
meta-steps in a row warns once (``UserWarning``): the learned loss changes nothing the
meta-objective sees there, so the search cannot leave that point (LPO's drift is clipped to
zero around PPO's clip, for one; ``meta.init_noise`` starts the search off it).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.evolve import kind as evolve_kind
from metarl.evolve.config import ExperimentConfig
from metarl.evolve.metagradient import MetaGradient, MetaGradientState
from metarl.runs import engine
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, save_meta_params
from metarl.sharding import num_shards

__all__ = ["RUN_KIND", "MetaGradientProgram", "MetaGradientResult", "describe_meta_step",
           "FLAT_STEPS"]

# meta-steps in a row with a meta-gradient of exactly zero before a run warns that it is
# stuck: a gradient that is small but not zero still moves the search
FLAT_STEPS = 5


@dataclass
class MetaGradientResult(engine.SteppedRun):
    """What starting, continuing or reading back a meta-gradient run leaves
    (:mod:`metarl.kinds`): ``state`` is a
    :class:`~metarl.evolve.metagradient.MetaGradientState`, ``program`` a
    :class:`MetaGradientProgram`."""

    @property
    def metagradient(self) -> MetaGradient:
        return self.program.metagradient

    @property
    def best_meta_params(self):
        """The current meta-parameters (the module docstring says why)."""
        return jax.device_get(self.state.meta_params)

    @property
    def mean_meta_params(self):
        return jax.device_get(self.state.meta_params)


class MetaGradientProgram(engine.Program):
    """A :class:`~metarl.evolve.metagradient.MetaGradient` as the program
    :mod:`~metarl.runs.engine` runs, one jitted meta-step per step."""

    def __init__(self, config: ExperimentConfig, mesh=None):
        self.metagradient = MetaGradient(config, mesh)  # checks the config fully
        self.mesh = self.metagradient.mesh
        self.steps = config.meta.steps
        self.agent_steps_per_step = self.metagradient.agent_steps_per_step
        self.flat_steps = 0  # meta-steps in a row, up to the last, with a zero meta-gradient

    @property
    def config(self) -> ExperimentConfig:
        return self.metagradient.config

    @config.setter
    def config(self, config: ExperimentConfig) -> None:  # a new budget or trackers
        self.metagradient.config = config

    def init(self) -> MetaGradientState:
        return self.metagradient.init()

    @staticmethod
    def completed(state: MetaGradientState) -> int:
        return int(state.generation)

    def step(self, state: MetaGradientState) -> tuple[MetaGradientState, dict[str, Any]]:
        state, metrics = self.metagradient.step(state)
        return state, {"metrics": metrics}

    def summary(self, generation: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of meta-step ``generation`` (the module docstring
        lists its fields)."""
        metrics = jax.device_get(record["metrics"])
        fitness = np.asarray(metrics["returns"], np.float64)
        valid = np.asarray(metrics["valid"], bool)
        good = fitness[valid & np.isfinite(fitness)]

        self.note_flat(generation, float(metrics["meta_grad_norm"]))
        label, = self.config.task_labels
        return {
            "generation": generation,
            "fitness": [float(f) if math.isfinite(f) else None for f in fitness],
            "valid": [bool(v) for v in valid],
            "best_fitness": engine.finite_stat(np.max, good),
            "mean_fitness": engine.finite_stat(np.mean, good),
            "std_fitness": engine.finite_stat(np.std, good),
            "invalid_agents": int((~valid).sum()),
            "mean_return": {label: engine.finite_stat(np.mean, good) if good.size else None},
            "meta_loss": float(metrics["meta_loss"]),
            "meta_grad_norm": float(metrics["meta_grad_norm"]),
            "restarted": int(metrics["restarted"]),
            "ages": [int(age) for age in metrics["ages"]],
            "devices": num_shards(self.mesh),
        }

    def note_flat(self, generation: int, grad_norm: float) -> None:
        """Warn, once a run, when the last :data:`FLAT_STEPS` meta-steps had a
        meta-gradient of exactly zero: the search sits where the learned loss changes
        nothing the meta-objective sees, so it cannot move on its own."""
        self.flat_steps = self.flat_steps + 1 if grad_norm == 0 else 0
        if self.flat_steps == FLAT_STEPS:
            meta = self.config.meta
            warnings.warn(
                f"meta-gradient steps {generation - FLAT_STEPS + 1} to {generation} had a "
                f"meta-gradient of exactly zero: at the current meta-parameters objective "
                f"{self.config.objective.name!r} does not change what the agents learn (a "
                f"flat point, as an LPO drift clipped to zero everywhere), so the search "
                f"cannot move. Start it further from that point (meta.init_noise is "
                f"{meta.init_noise}) or check meta.objective ({meta.objective!r}).",
                stacklevel=2)

    def after_step(self, run_dir: Path, state: MetaGradientState, primary: bool) -> None:
        """Keep the current meta-parameters as both msgpack files."""
        if primary:
            meta_params = jax.device_get(state.meta_params)
            save_meta_params(run_dir / BEST_FILE, meta_params)
            save_meta_params(run_dir / MEAN_FILE, meta_params)

    @staticmethod
    def postfix(line: dict[str, Any]) -> dict[str, Any]:
        rate = line["agent_steps_per_second"]
        return {"mean": f"{line['mean_fitness']:.4g}", "meta_loss": f"{line['meta_loss']:.4g}",
                "grad": f"{line['meta_grad_norm']:.3g}",
                "steps_per_s": f"{rate:.3g}" if rate else "-",
                "invalid": line["invalid_agents"]}


def describe_meta_step(line: dict[str, Any]) -> str:
    """A meta-gradient run's last line, for the command line."""
    return (f"meta-gradient steps: {line['generation']}  last mean agent fitness: "
            f"{line['mean_fitness']:.4g}  meta-loss: {line['meta_loss']:.4g}")


RUN_KIND = dataclasses.replace(
    evolve_kind.RUN_KIND, build=MetaGradientProgram, result=MetaGradientResult,
    describe=describe_meta_step, budget_field="meta.steps",
    invalid="every agent's losses or meta-gradient were non-finite",
    advice="Check the [meta] and [inner] settings (meta.learning_rate, meta.unroll, ...)")
