"""Which engine finds more per agent-step: evolution (Open_ES) and meta-gradients
(``[meta] method = "metagradient"``) on the same objective and task, at equal agent-steps,
over several meta-seeds.

Tasks (``--task``, several allowed):

- ``drift``: the drift known-answer task of ``tests/test_known_answers.py`` (LPO from PPO's
  clip on the continuous outlier bandit, PPO at a learning rate of 0.1); the known answer is
  a drift that pulls ratios back harder than PPO's clip (restoring slope above 1.45);
- ``outliers``: the value-distance known-answer task on PPO
  (``tests/test_metagradient_known_answers.py``: the discrete outlier bandit, where Huber
  beats L2 as PPO's value loss); the known answer is a distance that weights large errors
  less than ordinary ones (large-error weight below 0.5);
- ``cartpole_value`` and ``cartpole_drift``: a real task, PPO on CartPole-v1 at the main
  job's size (65,536 steps per agent), with the value distance from L2 and with the LPO
  drift from PPO's clip; they have no known answer, only the held-out verdict. With ``--run-dirs``
  each of their searches is also a run directory, for ``metarl evaluate RUN --tune
  --start``.

For each task, engine and meta-seed the search runs until it has trained ``--agent-steps``
environment steps (each engine's whole steps: the count it reached is recorded), and after
every step (every ``--measure-every`` steps, and the last) the known answer's shape measure
of the current meta-parameters (evolution: the search's centre; meta-gradients: the one
point) is recorded with the agent-steps so far.
Reported per run: that trajectory, the agent-steps at which the measure first crossed the
known-answer tests' threshold (``null`` if never), the final measure, and the held-out
verdict: ``--held-out-seeds`` fresh agents trained with the final meta-parameters and with
the task's baseline (where an evolution starts: PPO's clip, L2; a meta-gradient search
starts there plus ``meta.init_noise``), on the same keys (``metarl evaluate``'s evaluation
seed), judged by the paired probability of improvement
(:func:`metarl.stats.probability_of_improvement`) and :func:`metarl.stats.verdict`.
Per task and engine a summary gives the meta-seeds' verdicts, one verdict over all of
them (their held-out seeds pooled), the spread of the final gains and how many runs
reached the known answer.

    python benchmarks/engines.py --task drift outliers --meta-seeds 0 1 2 3 \\
        --agent-steps 262144 --out docs/results/engines.json
    python benchmarks/engines.py --smoke --out /tmp/engines_smoke.json

``--smoke`` runs every task tiny (a few thousand agent-steps, 4 held-out seeds, one
meta-seed): it checks the harness, not the engines.

``--memory`` measures instead the peak resident memory of each engine on the CartPole value
task at equal agent-steps (``--agent-steps``): one child process per engine and setting
(an ES generation; meta-gradient steps with unrolls of ``--unrolls`` updates, each with and
without rematerialisation), each reporting its ``ru_maxrss`` (the figure ``/usr/bin/time
-v`` prints as its maximum resident set size) and the compiled step's buffers as XLA
counts them (``memory_analysis``: temporaries, arguments, outputs).

    python benchmarks/engines.py --memory --unrolls 1 4 16 --agent-steps 262144 \
        --out docs/results/engines/memory.json

``--speed`` measures, per engine and size, the seconds of a compiled step and the
agent-steps per second after the first, with the same memory figures and the accelerator's
peak bytes in use: the evolution at each ``--populations`` size (two seeds a candidate), and
meta-gradients with as many ``--agents`` and each of ``--unrolls`` (rematerialised), then the
most agents at the longest unroll without rematerialisation. Smallest first, each in its own
process; ``--deadline`` skips what would not finish (sized for a lent GPU's minutes):

    python benchmarks/engines.py --speed --populations 64 512 --agents 64 1024 \
        --unrolls 4 16 --deadline 300 --out docs/results/engines/speed_gpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_objective
from metarl.evolve.generation import Evolution, search_start
from metarl.evolve.metagradient import MetaGradient, metagradient_start
from metarl.evolve.metagradient_config import MetaGradientConfig
from metarl.evolve.verdicts import settled_apart
from metarl.kinds import start as start_run
from metarl.runs.evaluations import write_used_roots
from metarl.stats import probability_of_improvement, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_known_answers import (  # noqa: E402  (the tests' one definition)
    MAX_LARGE_ERROR_WEIGHT,
    MIN_RESTORING_SLOPE,
    drift_config,
    large_error_weight,
    restoring_slope,
)
from test_metagradient_known_answers import (  # noqa: E402
    drift_metagradient,
    outliers_evolution,
    outliers_metagradient,
)

ENGINES = ("evolution", "metagradient")


@dataclass(frozen=True)
class Task:
    """One task of the comparison.

    Attributes:
        configs: ``engine -> (meta_seed -> ExperimentConfig)``: each engine's experiment
            (its budget is set here from ``--agent-steps``).
        measure: ``meta_params -> float``, the known answer's shape measure (``None``:
            the task has no known answer).
        reached: ``measure -> bool``, whether the measure shows the known answer.
        threshold: the threshold, as recorded.
        baseline: what the held-out verdict compares with (an evolution's start).
    """

    configs: dict[str, Callable[[int], ExperimentConfig]]
    measure: Callable[[Any], float] | None
    reached: Callable[[float], bool] | None
    threshold: str | None
    baseline: str


def drift_measure(meta_params) -> float:
    return restoring_slope(meta_params["policy"])


def outliers_measure(meta_params) -> float:
    return large_error_weight(meta_params["value"])


# PPO on CartPole-v1 at the main job's size (experiments/value_distance_cartpole.toml: 128
# updates of 4 x 128 steps, 64-64 networks), where agents learn (the main job's fitness,
# the mean training return, is about 200 to 260)
CARTPOLE_INNER = {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 128,
                  "total_timesteps": 65_536, "update_epochs": 4, "num_minibatches": 4}
CARTPOLE_OBJECTIVES = {
    "cartpole_value": {"name": "value_distance", "options": {"hidden_sizes": [16]}},
    "cartpole_drift": {"name": "lpo", "options": {"hidden_sizes": [16], "ppo_init": True}},
}
# Open_ES as the evidence pages' CartPole searches set it (lpo_cpu.toml's sigma and
# learning rate for the drift); the meta-gradient's objective: the actor-critic objective
# for the value distance (PPO's shared gradient-norm clip passes a critic's loss on to the
# actor), the policy's for the drift (which acts on the policy alone), from a drift
# perturbed off PPO's clip as in the drift known-answer task
CARTPOLE_ES = {"cartpole_value": {"sigma": 0.1, "learning_rate": 0.05},
               "cartpole_drift": {"sigma": 0.03, "learning_rate": 0.03}}
# (an init_noise of 0.03 left the drift of an earlier, smaller CartPole task at its flat
# point: its meta-gradient was exactly zero for 308 steps on every meta-seed)
CARTPOLE_META = {"cartpole_value": {"objective": "actor_critic", "learning_rate": 0.01},
                 "cartpole_drift": {"objective": "policy", "learning_rate": 0.01,
                                    "init_noise": 0.1}}


def cartpole_evolution(task: str, seed: int) -> ExperimentConfig:
    return config_from_dict({
        "name": f"engines_{task}_evolution", "objective": CARTPOLE_OBJECTIVES[task],
        "inner": CARTPOLE_INNER,
        "es": {"strategy": "Open_ES", "population_size": 8, **CARTPOLE_ES[task]},
        "fitness": {"metric": "mean_return", "seeds_per_candidate": 2},
        "run": {"seed": seed, "progress": False}})


def cartpole_metagradient(task: str, seed: int) -> ExperimentConfig:
    return config_from_dict({
        "name": f"engines_{task}_metagradient", "objective": CARTPOLE_OBJECTIVES[task],
        "inner": CARTPOLE_INNER,
        "meta": {"method": "metagradient", "unroll": 4, "agents": 8,
                 **CARTPOLE_META[task]},
        "run": {"seed": seed, "progress": False}})


def cartpole_task(task: str) -> Task:
    return Task({"evolution": functools.partial(cartpole_evolution, task),
                 "metagradient": functools.partial(cartpole_metagradient, task)},
                None, None, None, {"cartpole_value": "l2", "cartpole_drift": "ppo_clip"}[task])


def drift_evolution(seed: int) -> ExperimentConfig:
    return drift_config(seed=seed)


TASKS = {
    "drift": Task({"evolution": drift_evolution, "metagradient": drift_metagradient},
                  drift_measure, lambda slope: slope > MIN_RESTORING_SLOPE,
                  f"restoring slope > {MIN_RESTORING_SLOPE}", "ppo_clip"),
    "outliers": Task({"evolution": outliers_evolution, "metagradient": outliers_metagradient},
                     outliers_measure, lambda weight: weight < MAX_LARGE_ERROR_WEIGHT,
                     f"large-error weight < {MAX_LARGE_ERROR_WEIGHT}", "l2"),
    "cartpole_value": cartpole_task("cartpole_value"),
    "cartpole_drift": cartpole_task("cartpole_drift"),
}
# --smoke: every task's inner loop cut to a few updates, budgets of a few steps
SMOKE_INNER = {"drift": {"total_timesteps": 128}, "outliers": {"total_timesteps": 128},
               "cartpole_value": {"total_timesteps": 512, "num_steps": 32},
               "cartpole_drift": {"total_timesteps": 512, "num_steps": 32}}


def with_budget(config: ExperimentConfig, engine: str, steps: int) -> ExperimentConfig:
    if engine == "evolution":
        return config.replace(es=dataclasses.replace(config.es, generations=steps))
    return config.replace(meta=dataclasses.replace(config.meta, steps=steps))


def smaller(config: ExperimentConfig, changes: dict[str, Any]) -> ExperimentConfig:
    inner = config.inner[0].replace(**changes)
    config = config.replace(inner=(inner,))
    if isinstance(config.meta, MetaGradientConfig):
        updates = inner.num_updates
        unroll = min(config.meta.unroll, updates)
        while updates % unroll:
            unroll -= 1
        config = config.replace(meta=dataclasses.replace(config.meta, unroll=unroll,
                                                         agents=2, lifetime=0))
    else:
        config = config.replace(es=dataclasses.replace(config.es, population_size=4),
                                fitness=dataclasses.replace(config.fitness,
                                                            seeds_per_candidate=1))
    return config


def build_engine(engine: str, config: ExperimentConfig):
    """``engine``'s search of ``config``, not yet started: ``(search, agent-steps of one of
    its steps, the meta-parameters it starts from)``."""
    if engine == "evolution":
        search = Evolution(config)
        return (search, search.agent_steps_per_generation,
                search_start(search.objective, config.run.seed))
    search = MetaGradient(config)
    return search, search.agent_steps_per_step, metagradient_start(search.objective, config)


def run_search(task: Task, engine: str, config: ExperimentConfig, agent_steps: int,
               measure_every: int = 1, run_dir: Path | None = None) -> dict[str, Any]:
    """One search of ``config`` by ``engine`` until ``agent_steps`` have trained, the
    known answer's measure taken every ``measure_every`` steps and after the last: the
    objective, the start, the final meta-parameters and the record. With ``run_dir``
    (tasks without a known answer) the search is a run of the toolkit's own engine
    (:func:`metarl.kinds.start`) in that directory, to the same budget."""
    if run_dir is not None:
        return run_in_directory(task, engine, config, agent_steps, run_dir)
    started = time.process_time()
    search, per_step, start = build_engine(engine, config)
    state = search.init()  # from the run's seed, as a run directory's

    def current(state):
        point = (search.mean_meta_params(state) if engine == "evolution"
                 else state.meta_params)
        return jax.device_get(point)
    steps = max(1, -(-agent_steps // per_step))
    trajectory = []
    if task.measure is not None:
        trajectory.append([0, task.measure(current(state))])
    for step in range(1, steps + 1):
        state, _ = search.step(state)
        if task.measure is not None and (step % measure_every == 0 or step == steps):
            trajectory.append([step * per_step, task.measure(current(state))])
    reached = None
    if task.reached is not None:
        reached = next((steps_done for steps_done, value in trajectory
                        if task.reached(value)), None)
    return {"objective": search.objective, "start": start, "final": current(state),
            "baseline": search_start(search.objective, config.run.seed),
            "record": {"steps": steps, "agent_steps_per_step": per_step,
                       "agent_steps": steps * per_step, "trajectory": trajectory,
                       "final_measure": trajectory[-1][1] if trajectory else None,
                       "agent_steps_to_known_answer": reached,
                       "cpu_seconds_search": time.process_time() - started}}


def run_in_directory(task: Task, engine: str, config: ExperimentConfig, agent_steps: int,
                     run_dir: Path) -> dict[str, Any]:
    """:func:`run_search` as a run directory (``metarl evaluate RUN --tune --start`` judges
    it afterwards): the search's final meta-parameters are its ``mean_meta_params``
    (evolution: the search's centre; meta-gradients: the one point)."""
    if task.measure is not None:
        raise ValueError("--run-dirs: only the tasks without a known answer are written as "
                         "run directories")
    started = time.process_time()
    search, per_step, start = build_engine(engine, config)
    steps = max(1, -(-agent_steps // per_step))
    config = with_budget(config, engine, steps).replace(
        name=run_dir.name, run=dataclasses.replace(config.run, checkpoint_every=steps,
                                                   keep_checkpoints=1))
    result = start_run(config, run_dir)
    return {"objective": search.objective, "start": start,
            "final": jax.device_get(result.mean_meta_params),
            "baseline": search_start(search.objective, config.run.seed),
            "record": {"steps": steps, "agent_steps_per_step": per_step,
                       "agent_steps": steps * per_step, "trajectory": [],
                       "final_measure": None, "agent_steps_to_known_answer": None,
                       "run_dir": str(run_dir),
                       "cpu_seconds_search": time.process_time() - started}}


def held_out(search: dict[str, Any], config: ExperimentConfig, seeds: int) -> dict[str, Any]:
    """The final meta-parameters against the task's baseline (an evolution's start: L2,
    PPO's clip; a meta-gradient search starts there plus ``meta.init_noise``) on ``seeds``
    held-out keys, paired."""
    started = time.process_time()
    objective, inner = search["objective"], config.inner[0]
    returns = {name: np.asarray(evaluate_objective(objective, params, inner, config.fitness,
                                                   seeds, DEFAULT_EVAL_SEED, name).returns,
                                np.float64)
               for name, params in (("baseline", search["baseline"]),
                                    ("found", search["final"]))}
    difference = returns["found"] - returns["baseline"]
    estimate = probability_of_improvement(returns["found"], returns["baseline"], paired=True)
    return {"mean_return": {name: float(np.mean(r)) for name, r in returns.items()},
            "returns": {name: [float(x) for x in r] for name, r in returns.items()},
            "gain": float(np.mean(difference)),
            "gain_standard_error": float(np.std(difference, ddof=1) / np.sqrt(seeds)),
            "p_improvement": {"value": estimate.value, "low": estimate.low,
                              "high": estimate.high},
            "verdict": verdict(estimate.low, estimate.high),
            "cpu_seconds_held_out": time.process_time() - started}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    gains = np.asarray([run["held_out"]["gain"] for run in runs])
    reached = [run["agent_steps_to_known_answer"] for run in runs]
    found = np.concatenate([run["held_out"]["returns"]["found"] for run in runs])
    baseline = np.concatenate([run["held_out"]["returns"]["baseline"] for run in runs])
    pooled = probability_of_improvement(found, baseline, paired=True)
    return {
        "pooled_p_improvement": {"value": pooled.value, "low": pooled.low,
                                 "high": pooled.high},
        "pooled_verdict": verdict(pooled.low, pooled.high),
        "verdicts": [run["held_out"]["verdict"] for run in runs],
        "gain_mean": float(gains.mean()), "gain_min": float(gains.min()),
        "gain_max": float(gains.max()),
        "reached_known_answer": sum(r is not None for r in reached),
        "agent_steps_to_known_answer": reached,
        "cpu_seconds": float(sum(run["cpu_seconds_search"]
                                 + run["held_out"]["cpu_seconds_held_out"] for run in runs)),
    }


def cost_config(engine: str, size: int | None, unroll: int | None, remat: bool,
                smoke: bool = False) -> ExperimentConfig:
    """One engine's experiment on the CartPole value task for ``--memory`` and ``--speed``.
    ``size``: the evolution's population or the meta-gradient's agents (``None``: the
    task's); ``unroll`` and ``remat``: the meta-gradient's."""
    config = TASKS["cartpole_value"].configs[engine](0)
    if smoke:
        config = smaller(config, SMOKE_INNER["cartpole_value"])
    if engine == "evolution":
        if size:
            config = config.replace(es=dataclasses.replace(config.es, population_size=size))
        return config
    changes = {"unroll": unroll, "remat": remat} | ({"agents": size} if size else {})
    return config.replace(meta=dataclasses.replace(config.meta, **changes))


def device_peak_mib() -> float | None:
    """The accelerator allocator's peak bytes in use, in MiB (``None`` on the CPU, whose
    device keeps no such count: the resident set is its measure)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


def measure_child(spec: dict[str, Any]) -> None:
    """One engine and setting (``spec``: ``engine``, ``size``, ``unroll``, ``remat``,
    ``steps`` and ``smoke``), in this (child) process: compiles its step, runs ``steps``
    steps, each timed to completion, and prints one JSON line: the compile and step
    seconds, the agent-steps per second of the steps after the first, the compiled step's
    buffers as XLA counts them, the process's peak resident memory (``ru_maxrss``, KiB on
    Linux) and the accelerator's peak bytes in use."""
    import resource

    search, per_step, _ = build_engine(spec["engine"], cost_config(
        spec["engine"], spec["size"], spec["unroll"], spec["remat"], spec["smoke"]))
    state = search.init()
    started = time.perf_counter()
    compiled = search.step.lower(state).compile()
    compile_seconds = time.perf_counter() - started
    analysis = compiled.memory_analysis()
    seconds = []
    for _ in range(spec["steps"]):
        started = time.perf_counter()
        state, _ = compiled(state)
        jax.block_until_ready(state)
        seconds.append(time.perf_counter() - started)
    timed = seconds[1:] or seconds
    print(json.dumps({
        "engine": spec["engine"], "size": spec["size"], "unroll": spec["unroll"],
        "remat": spec["remat"] if spec["unroll"] else None,
        "steps": spec["steps"], "agent_steps_per_step": per_step,
        "agent_steps": spec["steps"] * per_step, "compile_seconds": compile_seconds,
        "step_seconds": seconds,
        "agent_steps_per_second": per_step / float(np.median(timed)),
        "xla_temp_mib": analysis.temp_size_in_bytes / 2**20,
        "xla_argument_mib": analysis.argument_size_in_bytes / 2**20,
        "xla_output_mib": analysis.output_size_in_bytes / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "device_peak_mib": device_peak_mib()}))


def measure_rows(specs: list[dict[str, Any]], deadline: float | None,
                 write: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Each setting of ``specs`` in a child process of its own (a fresh peak), one after
    the other, the rows so far written after each; with ``deadline`` (seconds from now)
    a setting that would start later than that is skipped and one that runs past it is
    stopped, each recorded as such."""
    import subprocess

    ends = None if deadline is None else time.monotonic() + deadline
    rows = []
    for spec in specs:
        left = None if ends is None else ends - time.monotonic()
        if left is not None and left < 15:
            row = {**spec, "skipped": "past --deadline"}
        else:
            command = [sys.executable, __file__, "--child", json.dumps(spec)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, check=True,
                                      timeout=left)
                row = json.loads(done.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = {**spec, "skipped": "ran past --deadline"}
            except subprocess.CalledProcessError as error:
                row = {**spec, "failed": error.stderr.strip().splitlines()[-8:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(rows)
    return rows


def memory_specs(unrolls: list[int], agent_steps: int, smoke: bool) -> list[dict[str, Any]]:
    """``--memory``: an evolution generation and meta-gradient steps with each unroll, with
    and without rematerialisation, at the task's sizes, each until ``agent_steps``."""
    settings = [("evolution", None, False)] + [("metagradient", unroll, remat)
                                               for unroll in unrolls for remat in (True, False)]
    specs = []
    for engine, unroll, remat in settings:
        # the step's size without starting the search: nothing compiles in this process
        per_step = build_engine(engine, cost_config(engine, None, unroll, remat, smoke))[1]
        specs.append({"engine": engine, "size": None, "unroll": unroll, "remat": remat,
                      "steps": max(1, -(-agent_steps // per_step)), "smoke": smoke})
    return specs


def speed_specs(populations: list[int], agents: list[int], unrolls: list[int], repeats: int,
                smoke: bool) -> list[dict[str, Any]]:
    """``--speed``: by size, smallest first (a deadline cuts the largest), an evolution of
    each population and meta-gradients of as many agents with each unroll
    (rematerialised), then at the most agents and the longest unroll without
    rematerialisation; each for one step and ``repeats`` timed ones."""
    def spec(engine, size, unroll=None, remat=False):
        return {"engine": engine, "size": size, "unroll": unroll, "remat": remat,
                "steps": 1 + repeats, "smoke": smoke}
    specs = []
    for population, agent_count in zip(populations, agents, strict=True):
        specs.append(spec("evolution", population))
        specs += [spec("metagradient", agent_count, unroll, True) for unroll in unrolls]
    return specs + [spec("metagradient", agents[-1], max(unrolls), False)]


def latest_evaluation(run_dir: Path) -> Path:
    """The newest ``evaluations/N.json`` of a run directory (``metarl evaluate``'s)."""
    records = sorted((run_dir / "evaluations").glob("*.json"), key=lambda p: int(p.stem))
    if not records:
        raise FileNotFoundError(f"{run_dir}: no evaluations; run metarl evaluate "
                                f"{run_dir} --tune --start first")
    return records[-1]


def summarise_evaluations(root: Path, number: int | None = None) -> dict[str, Any]:
    """``--evaluations``: the tuned verdicts of the searches ``--run-dirs`` wrote under
    ``root`` (``root/<task>/<engine>_s<meta-seed>``), from each run's newest ``metarl
    evaluate --tune --start`` record, or its ``evaluations/<number>.json`` (``--evaluation``;
    runs without one are left out, so one evaluation of all runs pools on the same held-out
    keys): per run its held-out root (``eval_seed``, and whether
    an earlier evaluation of the run had used it), the held-out returns of every row, the
    comparisons and, per tuned objective, the chosen setting, the knobs chosen at an edge of
    the final grid (``at_edge``), how the grid widened (``widening``) and the tuned
    comparisons whose rows settled where the other never tuned (``settled_apart``,
    :func:`metarl.evolve.verdicts.settled_apart`; the records'
    training curves and tuning scores left out); per task
    and engine each comparison pooled over the meta-seeds (their held-out seeds together,
    paired with the same baseline row of each run); with both engines, their results
    against each other (:func:`between_engines`)."""
    report = {"root": str(root), "tasks": {}}
    for task_dir in sorted(path for path in root.iterdir() if path.is_dir()):
        engines: dict[str, Any] = {}
        for run_dir in sorted(path for path in task_dir.iterdir() if path.is_dir()):
            engine, seed = run_dir.name.rsplit("_s", 1)
            path = (latest_evaluation(run_dir) if number is None
                    else run_dir / "evaluations" / f"{number}.json")
            if not path.is_file():
                continue
            record = json.loads(path.read_text())
            (env_id, stats), = record["statistics"]["environments"].items()
            tuning = record.get("tuning", {}).get("environments", {}).get(env_id, {})
            engines.setdefault(engine, {"runs": []})["runs"].append({
                "meta_seed": int(seed), "record": str(path), "env_id": env_id,
                "eval_seed": record.get("eval_seed"),
                "eval_seed_reused": record.get("eval_seed_reused"),
                "returns": {row["objective"]: row["returns"] for row in record["results"]},
                "comparisons": stats["comparisons"],
                "chosen": {name: entry.get("chosen") for name, entry in tuning.items()},
                "at_edge": {name: entry.get("at_edge") for name, entry in tuning.items()},
                "widening": {name: entry.get("widening") for name, entry in tuning.items()},
                "settled_apart": [list(key) for key in settled_apart(record)]})
        for section in engines.values():
            pairs = [(c["evolved"], c["baseline"]) for c in section["runs"][0]["comparisons"]]
            pooled = []
            for evolved, baseline in pairs:
                found = np.concatenate([run["returns"][evolved] for run in section["runs"]])
                base = np.concatenate([run["returns"][baseline] for run in section["runs"]])
                estimate = probability_of_improvement(found, base, paired=True)
                verdicts = [next(c["verdict"] for c in run["comparisons"]
                                 if (c["evolved"], c["baseline"]) == (evolved, baseline))
                            for run in section["runs"]]
                pooled.append({"evolved": evolved, "baseline": baseline, "verdicts": verdicts,
                               "pooled_p_improvement": {"value": estimate.value,
                                                        "low": estimate.low,
                                                        "high": estimate.high},
                               "pooled_verdict": verdict(estimate.low, estimate.high)})
            section["pooled"] = pooled
        if not engines:
            continue
        if set(ENGINES) <= engines.keys():
            engines["evolution_vs_metagradient"] = between_engines(engines)
        report["tasks"][task_dir.name] = engines
    return report


def between_engines(engines: dict[str, Any]) -> list[dict[str, Any]]:
    """The two engines' results against each other, for each row both evaluated
    (``evolved``, ``evolved (tuned)``): evolution's runs against meta-gradients', meta-seed
    by meta-seed and held-out seed by held-out seed (``metarl evaluate`` trains every row on
    the same keys), pooled."""
    evolution, metagradient = (sorted(engines[name]["runs"], key=lambda run: run["meta_seed"])
                               for name in ENGINES)
    rows = []
    for row in ("evolved", "evolved (tuned)"):
        if not all(row in run["returns"] for run in evolution + metagradient):
            continue
        found = np.concatenate([run["returns"][row] for run in evolution])
        other = np.concatenate([run["returns"][row] for run in metagradient])
        estimate = probability_of_improvement(found, other, paired=True)
        rows.append({"row": row, "p_evolution_better": {"value": estimate.value,
                                                        "low": estimate.low,
                                                        "high": estimate.high},
                     "verdict": verdict(estimate.low, estimate.high)})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", nargs="+", choices=tuple(TASKS), default=["drift",
                                                                            "outliers"])
    parser.add_argument("--engine", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--meta-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--agent-steps", type=int, default=262_144,
                        help="environment steps each search trains (both engines)")
    parser.add_argument("--held-out-seeds", type=int, default=64)
    parser.add_argument("--measure-every", type=int, default=1,
                        help="steps between two measures of the learned shape (each costs "
                             "about as much as a meta-gradient step on the outlier task)")
    parser.add_argument("--run-dirs", default=None, metavar="DIR",
                        help="write each search of a task without a known answer as the "
                             "run directory DIR/<task>/<engine>_s<meta-seed>")
    parser.add_argument("--smoke", action="store_true",
                        help="every task tiny, one meta-seed, 4 held-out seeds")
    parser.add_argument("--memory", action="store_true",
                        help="measure each engine's peak memory instead (module docstring)")
    parser.add_argument("--speed", action="store_true",
                        help="measure each engine's agent-steps per second and memory by "
                             "size instead (module docstring)")
    parser.add_argument("--unrolls", type=int, nargs="+", default=None,
                        help="--memory, --speed: the meta-gradient unrolls measured "
                             "(default 1 4 16; --speed 4 16)")
    parser.add_argument("--populations", type=int, nargs="+", default=[64, 512],
                        help="--speed: the evolution's populations (two seeds each)")
    parser.add_argument("--agents", type=int, nargs="+", default=[64, 1024],
                        help="--speed: the meta-gradient's agents, one count per population")
    parser.add_argument("--repeats", type=int, default=3,
                        help="--speed: timed steps after the first")
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="--memory, --speed: skip or stop the settings past this time")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--evaluations", metavar="DIR", default=None,
                        help="summarise instead the tuned evaluations of the searches that "
                             "--run-dirs DIR wrote (metarl evaluate RUN --tune --start on "
                             "each first): per run and pooled over meta-seeds")
    parser.add_argument("--evaluation", type=int, default=None, metavar="N",
                        help="--evaluations: read each run's evaluations/N.json (runs "
                             "without one left out) instead of its newest")
    parser.add_argument("--out", default="docs/results/engines.json")
    args = parser.parse_args(argv)
    command = "python benchmarks/engines.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.child:
        measure_child(json.loads(args.child))
        return {}
    if args.evaluations:
        report = {"benchmark": "engines evaluations", "command": command,
                  **summarise_evaluations(Path(args.evaluations), args.evaluation)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        for task, engines in report["tasks"].items():
            for row in engines.get("evolution_vs_metagradient", []):
                estimate = row["p_evolution_better"]
                print(f"{task:16} evolution against meta-gradients, {row['row']}: "
                      f"{estimate['value']:.2f} [{estimate['low']:.2f}, "
                      f"{estimate['high']:.2f}] {row['verdict']}")
            for engine, section in engines.items():
                if engine not in ENGINES:
                    continue
                for row in section["pooled"]:
                    estimate = row["pooled_p_improvement"]
                    print(f"{task:16} {engine:13} {row['evolved']:16} vs {row['baseline']:14} "
                          f"{estimate['value']:.2f} [{estimate['low']:.2f}, "
                          f"{estimate['high']:.2f}] {row['pooled_verdict']:20} "
                          f"{row['verdicts']}")
        return report
    if args.memory or args.speed:
        if args.speed and len(args.populations) != len(args.agents):
            parser.error("--speed: give one --agents count per --populations size")
        unrolls = args.unrolls or ([4, 16] if args.speed else [1, 4, 16])
        if args.smoke:
            unrolls = [1, 2]  # both divide the smoke task's 4 updates
            args.populations, args.agents, args.repeats = [4], [2], 1
            args.agent_steps = min(args.agent_steps, 2048)
        specs = (speed_specs(args.populations, args.agents, unrolls, args.repeats, args.smoke)
                 if args.speed else memory_specs(unrolls, args.agent_steps, args.smoke))
        device = jax.devices()[0]
        report = {"benchmark": "engines speed" if args.speed else "engines memory",
                  "command": command, "task": "cartpole_value", "smoke": args.smoke,
                  "agent_steps": None if args.speed else args.agent_steps,
                  "jax": jax.__version__, "device": str(device),
                  "device_kind": device.device_kind,
                  "xla_flags": os.environ.get("XLA_FLAGS", ""),
                  "load_average_at_start": os.getloadavg()}
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)

        def write(rows):
            report.update(rows=rows, load_average_at_end=os.getloadavg())
            out.write_text(json.dumps(report, indent=1) + "\n")
        write(measure_rows(specs, args.deadline, write))
        return report
    if args.smoke:
        args.meta_seeds, args.held_out_seeds = args.meta_seeds[:1], 4
        args.agent_steps = min(args.agent_steps, 2048)
    report = {"benchmark": "engines", "command": command,
              "agent_steps": args.agent_steps, "held_out_seeds": args.held_out_seeds,
              "measure_every": args.measure_every,
              "eval_seed": DEFAULT_EVAL_SEED, "meta_seeds": args.meta_seeds,
              "smoke": args.smoke, "jax": jax.__version__, "device": str(jax.devices()[0]),
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "tasks": {}}
    for name in args.task:
        task = TASKS[name]
        section = {"known_answer": task.threshold, "baseline": task.baseline,
                   "engines": {}}
        for engine in args.engine:
            runs = []
            for seed in args.meta_seeds:
                config = task.configs[engine](seed)
                if args.smoke:
                    config = smaller(config, SMOKE_INNER[name])
                run_dir = (None if args.run_dirs is None or task.measure is not None
                           else Path(args.run_dirs) / name / f"{engine}_s{seed}")
                search = run_search(task, engine, config, args.agent_steps,
                                    args.measure_every, run_dir)
                config = with_budget(config, engine, search["record"]["steps"])
                record = {"meta_seed": seed, **search["record"],
                          "held_out": held_out(search, config, args.held_out_seeds),
                          "config": config.to_dict()}
                if run_dir is not None:  # a later metarl evaluate draws other held-out keys
                    write_used_roots(run_dir, [DEFAULT_EVAL_SEED],
                                     f"the untuned held-out check of {args.out}")
                runs.append(record)
                print(json.dumps({"task": name, "engine": engine, "meta_seed": seed,
                                  "final_measure": record["final_measure"],
                                  "agent_steps_to_known_answer":
                                      record["agent_steps_to_known_answer"],
                                  "verdict": record["held_out"]["verdict"],
                                  "gain": record["held_out"]["gain"]}), flush=True)
            section["engines"][engine] = {"summary": summarise(runs), "runs": runs}
        report["tasks"][name] = section
    report["load_average_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
