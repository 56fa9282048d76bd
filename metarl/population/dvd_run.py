"""Run kind "dvd": DvD-TD3 (:mod:`.dvd`) from an experiment file, in a run directory.

.. code-block:: toml

    kind = "dvd"
    name = "dvd_td3_pendulum"
    [inner]            # TD3's settings per member: environments, budget, networks, ...
    env_id = "Pendulum-v1"
    total_timesteps = 20000
    [dvd]              # DvDConfig: population, segment length, weight schedule, kernel
    population_size = 5
    weight_schedule = "bandit"
    [run]              # seed, checkpoint_every (segments), keep_checkpoints, ...

One step of the run is one segment of ``dvd.segment_updates`` updates (one jitted call;
the bandit plays one arm per segment); ``metrics.jsonl`` has a line per segment (every
member's return, the population's diversity, the weight and the bandit's arm, skipped
non-finite steps), each checkpoint the whole state (actors, shared critic and buffer,
environments, bandit, key), so a resumed run equals the uninterrupted one. A segment
after which some parameter is not finite is invalid (``run.max_invalid_generations``;
non-finite steps are skipped, so this should not happen). ``metarl evaluate`` plays every
final member's deterministic episodes; ``metarl plot`` draws diversity, returns and the
weight over training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.population.dvd import DvDConfig, DvDState, make_dvd, segment_record
from metarl.population.method_config import (
    MethodExperimentConfig,
    method_config_from_dict,
    shared_method_programs,
)
from metarl.runs import engine
from metarl.runs.engine import RunKind, SteppedRun, finite_stat
from metarl.runs.evaluations import digest, saved_evaluation

KIND = "dvd"
STEP_KEY = "segment"


def dvd_config_from_dict(data: dict[str, Any]) -> MethodExperimentConfig:
    """Build and validate a ``dvd`` experiment from plain data."""
    return method_config_from_dict(KIND, DvDConfig, data)


class DvDProgram(engine.Program):
    """The DvD functions and jitted segment of one config: the program
    :mod:`~metarl.runs.engine` runs, one segment per step."""

    def __init__(self, config: MethodExperimentConfig, mesh=None):
        del mesh  # one shared critic and buffer: the population trains on one device
        self.config = config
        self.run, self.segment, self._init = shared_method_programs(
            config, KIND, make_dvd, lambda run: run.jit_segment())
        self.steps = config.method.num_segments
        self.hypers = self.run.hyperparams()
        self.agent_steps_per_step = config.method.segment_updates * self.run.steps_per_update

    def init(self) -> DvDState:
        return self._init(jax.random.PRNGKey(self.config.run.seed))

    def completed(self, state: DvDState) -> int:
        return int(state.update_count) // self.config.method.segment_updates

    def step(self, state: DvDState) -> tuple[DvDState, dict[str, Any]]:
        state, metrics = self.segment(state, self.hypers)
        return state, segment_record(metrics)

    def summary(self, segment: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of ``segment``: the record of
        :func:`~metarl.population.dvd.segment_record` with the median return (``finite``
        is the record's: every parameter is finite)."""
        return {
            STEP_KEY: segment,
            **record,
            "median_return": finite_stat(np.median, record["returns"]),
            "agent_steps": record["env_steps"],
        }

    @staticmethod
    def postfix(line: dict[str, Any]) -> dict[str, str]:
        rate = line["agent_steps_per_second"]
        return {"best": f"{line['best_return']:.4g}", "median": f"{line['median_return']:.4g}",
                "diversity": f"{line['diversity']:.3g}", "weight": f"{line['weight']:.3g}",
                "steps_per_s": f"{rate:.3g}" if rate else "-"}


@dataclass
class DvDRunResult(SteppedRun):
    """A DvD run (:class:`~metarl.runs.engine.SteppedRun`); ``state`` is a
    :class:`~metarl.population.dvd.DvDState`."""


def plot_dvd_run(run_dir: str | Path) -> list[Path]:
    """Write ``plots/dvd.png`` (diversity, every member's return, the weight)."""
    from metarl.figures.population import plot_dvd

    def draw(config, history):
        method = config.method
        return plot_dvd(history, title=(
            f"{config.name}: DvD, {method.population_size} TD3 actors on "
            f"{method.inner.env_id}, weight {method.weight_schedule}"))

    return RUN_KIND.plot_history(run_dir, "dvd.png", draw)


def evaluate_dvd_run(run_dir: str | Path, eval_seed: int = 10_007, rerun: bool = False
                     ) -> dict[str, Any]:
    """Play every final member's deterministic episodes (``inner.eval_episodes``); saved as
    ``evaluations/<n>.json`` and reused when made before. The report also has the final
    population's diversity (log-det over its actions)."""
    run_dir = Path(run_dir)
    run = engine.load_run(RUN_KIND, run_dir)
    last = run.history[-1]
    segment = int(last[STEP_KEY])
    spec = {"kind": KIND, STEP_KEY: segment, "eval_seed": eval_seed,
            "checkpoint_digest": digest(last["returns"], segment)}

    def compute() -> dict[str, Any]:
        returns = np.asarray(jax.jit(run.program.run.evaluate)(
            run.state, jax.random.PRNGKey(eval_seed)))
        scores = [float(r) for r in returns]
        return {"kind": KIND, "method": "deterministic", STEP_KEY: segment,
                "eval_seed": eval_seed, "episodes": run.config.inner.eval_episodes,
                "env_steps": last["env_steps"], "diversity": last["diversity"],
                "best_member": int(np.nanargmax(np.where(np.isfinite(returns), returns,
                                                         -np.inf))),
                "mean": finite_stat(np.mean, scores),
                "median": finite_stat(np.median, scores),
                "members": [{"member": m, "return": score,
                             "training_return": last["returns"][m]}
                            for m, score in enumerate(scores)]}

    return saved_evaluation(run_dir, spec, compute, rerun)


def format_dvd_evaluation(report: dict[str, Any]) -> str:
    rows = [f"final population after segment {report[STEP_KEY]} "
            f"({report['env_steps']:,} environment steps), diversity (log-det) "
            f"{report['diversity']:.3g}; {report['episodes']} deterministic episodes each:",
            "member  return    training return"]
    for member in sorted(report["members"], key=lambda m: -np.nan_to_num(m["return"],
                                                                         nan=-np.inf)):
        rows.append(f"{member['member']:<7} {member['return']:<9.2f} "
                    f"{member['training_return']:.2f}")
    return "\n".join(rows)


def describe_dvd_segment(line: dict[str, Any]) -> str:
    return (f"segments: {line[STEP_KEY]}  environment steps: {line['env_steps']:,}  last "
            f"segment's returns: best {line['best_return']:.4g}, median "
            f"{line['median_return']:.4g}  diversity: {line['diversity']:.3g}")


RUN_KIND = RunKind(
    name=KIND, step_key=STEP_KEY, from_dict=dvd_config_from_dict, build=DvDProgram,
    result=DvDRunResult, plot=plot_dvd_run, evaluate=evaluate_dvd_run,
    format_evaluation=format_dvd_evaluation, describe=describe_dvd_segment,
    invalid="some parameter of the population was not finite",
    advice="Check the [inner] learning rates, dvd.jitter and dvd.max_grad_norm")
