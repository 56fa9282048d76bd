"""Run kind "cem_rl": CEM-RL (:mod:`.cem_rl`) from an experiment file, in a run directory.

.. code-block:: toml

    kind = "cem_rl"
    name = "cem_rl_pendulum"
    [inner]            # TD3's settings: environment, networks, replay, hyperparameters
    env_id = "Pendulum-v1"
    [cem_rl]           # CEMRLConfig: population, elites, RL fraction, generations, ...
    population_size = 10
    generations = 16
    [run]              # seed, checkpoint_every (generations), keep_checkpoints, ...

One step of the run is one generation (one jitted call: ask, TD3 steps of the RL actors
with the shared critic, evaluation episodes, tell, the mean actor's evaluation);
``metrics.jsonl`` has a line per generation (every actor's fitness, which took gradient
steps, the elites' and the mean actor's return), each checkpoint the whole state (search
distribution, shared critic and buffer, key), so a resumed run equals the uninterrupted
one. A generation in which no actor had a finite fitness is invalid
(``run.max_invalid_generations``). ``metarl evaluate`` plays the final mean actor's
deterministic episodes; ``metarl plot`` draws fitness over generations and the RL against
the CEM actors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.population.cem_rl import CEMRLConfig, CEMRLState, generation_record, make_cem_rl
from metarl.population.method_config import (
    MethodExperimentConfig,
    method_config_from_dict,
    shared_method_programs,
)
from metarl.runs import engine
from metarl.runs.engine import RunKind, SteppedRun, finite_stat
from metarl.runs.evaluations import digest, saved_evaluation

KIND = "cem_rl"
STEP_KEY = "generation"


def cem_rl_config_from_dict(data: dict[str, Any]) -> MethodExperimentConfig:
    """Build and validate a ``cem_rl`` experiment from plain data."""
    return method_config_from_dict(KIND, CEMRLConfig, data)


class CEMRLProgram(engine.Program):
    """The CEM-RL functions and jitted generation of one config: the program
    :mod:`~metarl.runs.engine` runs, one generation per step."""

    def __init__(self, config: MethodExperimentConfig, mesh=None):
        del mesh  # one shared critic and buffer: the population trains on one device
        self.config = config
        self.run, self.generation, self._init = shared_method_programs(
            config, KIND, make_cem_rl, lambda run: run.jit_generation())
        self.steps = config.method.generations
        self.hypers = self.run.hyperparams()
        self.agent_steps_per_step = self.run.steps_per_generation

    def init(self) -> CEMRLState:
        return self._init(jax.random.PRNGKey(self.config.run.seed))

    @staticmethod
    def completed(state: CEMRLState) -> int:
        return int(state.cem.generation)

    def step(self, state: CEMRLState) -> tuple[CEMRLState, dict[str, Any]]:
        state, metrics = self.generation(state, self.hypers)
        return state, generation_record(metrics, self.config.method.num_elites)

    def summary(self, generation: int, record: dict[str, Any]) -> dict[str, Any]:
        """The ``metrics.jsonl`` line of ``generation``: the record of
        :func:`~metarl.population.cem_rl.generation_record` with the median fitness and
        which actors were valid."""
        return {
            STEP_KEY: generation,
            **record,
            "median_fitness": finite_stat(np.median, record["fitness"]),
            "agent_steps": record["env_steps"],
            "finite": [bool(np.isfinite(f)) for f in record["fitness"]],
        }

    @staticmethod
    def postfix(line: dict[str, Any]) -> dict[str, str]:
        rate = line["agent_steps_per_second"]
        return {"best": f"{line['best_fitness']:.4g}", "median": f"{line['median_fitness']:.4g}",
                "mean_actor": f"{line['mean_return']:.4g}",
                "steps_per_s": f"{rate:.3g}" if rate else "-"}


@dataclass
class CEMRLRunResult(SteppedRun):
    """A CEM-RL run (:class:`~metarl.runs.engine.SteppedRun`); ``state`` is a
    :class:`~metarl.population.cem_rl.CEMRLState`."""

    @property
    def mean_actor(self) -> Any:
        """The actor at the search distribution's mean: the run's result."""
        return self.program.run.mean_actor(self.state)


def plot_cem_rl_run(run_dir: str | Path) -> list[Path]:
    """Write ``plots/cem_rl.png`` (fitness over generations; RL against CEM actors)."""
    from metarl.figures.population import plot_cem_rl

    def draw(config, history):
        method = config.method
        return plot_cem_rl(history, title=(
            f"{config.name}: CEM-RL, {method.population_size} TD3 actors "
            f"({method.num_rl_actors} RL) on {method.inner.env_id}"))

    return RUN_KIND.plot_history(run_dir, "cem_rl.png", draw)


def evaluate_cem_rl_run(run_dir: str | Path, eval_seed: int = 10_007, rerun: bool = False,
                        episodes: int | None = None) -> dict[str, Any]:
    """Play the final mean actor's deterministic episodes (``inner.eval_episodes`` by
    default); saved as ``evaluations/<n>.json`` and reused when made before."""
    run_dir = Path(run_dir)
    run = engine.load_run(RUN_KIND, run_dir)
    episodes = episodes or run.config.inner.eval_episodes
    last = run.history[-1]
    generation = int(last[STEP_KEY])
    spec = {"kind": KIND, STEP_KEY: generation, "eval_seed": eval_seed,
            "episodes": episodes, "checkpoint_digest": digest(last["fitness"], generation)}

    def compute() -> dict[str, Any]:
        keys = jax.random.split(jax.random.PRNGKey(eval_seed), episodes)
        evaluate = jax.jit(jax.vmap(lambda key: run.program.run.parts.evaluate(
            run.mean_actor, key, 1)))
        returns = [float(r) for r in np.asarray(evaluate(keys))]
        return {"kind": KIND, "method": "deterministic", STEP_KEY: generation,
                "eval_seed": eval_seed, "episodes": episodes, "env_steps": last["env_steps"],
                "mean": finite_stat(np.mean, returns),
                "median": finite_stat(np.median, returns),
                "returns": returns, "last_generation_fitness": last["fitness"]}

    return saved_evaluation(run_dir, spec, compute, rerun)


def format_cem_rl_evaluation(report: dict[str, Any]) -> str:
    returns = np.asarray(report["returns"], np.float64)
    return (f"mean actor after generation {report[STEP_KEY]} "
            f"({report['env_steps']:,} environment steps): {report['episodes']} deterministic "
            f"episodes, mean return {report['mean']:.2f} (min {np.nanmin(returns):.2f}, "
            f"max {np.nanmax(returns):.2f})")


def describe_cem_rl_generation(line: dict[str, Any]) -> str:
    return (f"generations: {line[STEP_KEY]}  environment steps: {line['env_steps']:,}  mean "
            f"actor's return: {line['mean_return']:.4g}  last generation's fitness: best "
            f"{line['best_fitness']:.4g}, elites {line['elite_fitness']:.4g}")


RUN_KIND = RunKind(
    name=KIND, step_key=STEP_KEY, from_dict=cem_rl_config_from_dict, build=CEMRLProgram,
    result=CEMRLRunResult, plot=plot_cem_rl_run, evaluate=evaluate_cem_rl_run,
    format_evaluation=format_cem_rl_evaluation, describe=describe_cem_rl_generation,
    score_key="mean_return", invalid="no actor had a finite fitness",
    advice="Check the [inner] learning rates and cem_rl.max_grad_norm")
