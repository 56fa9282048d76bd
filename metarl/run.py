"""Run directories: start, continue and read back meta-evolution runs.

A run directory holds::

    config.json                resolved experiment config (reloadable with load_config)
    metrics.jsonl              one JSON line per generation
    best_meta_params.msgpack   best candidate so far (flax msgpack)
    mean_meta_params.msgpack   current centre of the search distribution
    checkpoints/<generation>/  orbax checkpoints (see metarl.checkpoint)

:func:`evolve` starts a run, :func:`resume` continues one from its latest complete
checkpoint, :func:`load_run` reads one back for evaluation and plots.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization
from tqdm import tqdm

from metarl import distributed
from metarl.checkpoint import CheckpointError, RunCheckpointer
from metarl.config import (
    ExperimentConfig,
    config_from_dict,
    read_config_data,
    upgrade_saved_config,
)
from metarl.evolution import Evolution, EvolutionState
from metarl.sharding import num_shards

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
BEST_FILE = "best_meta_params.msgpack"
MEAN_FILE = "mean_meta_params.msgpack"


class RunError(RuntimeError):
    """A run directory is missing, already used, or not a run."""


@dataclass
class RunResult:
    """What a finished (or interrupted) call to :func:`evolve` / :func:`resume` leaves."""

    run_dir: Path
    config: ExperimentConfig
    evolution: Evolution
    state: EvolutionState
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def best_meta_params(self):
        return jax.device_get(self.state.best_meta_params)

    @property
    def mean_meta_params(self):
        return jax.device_get(self.evolution.mean_meta_params(self.state))


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_metrics(run_dir: Path, history: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(line) + "\n" for line in history)
    _atomic_write(run_dir / METRICS_FILE, text.encode())


def save_meta_params(path: str | Path, meta_params) -> None:
    """Write meta-parameters (a pytree of arrays) as flax msgpack."""
    arrays = jax.tree.map(np.asarray, jax.device_get(meta_params))
    _atomic_write(Path(path), serialization.msgpack_serialize(
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
    base = Path(config.run.output_dir) / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, suffix = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{suffix}")
        suffix += 1
    return candidate


def _summary(generation: int, metrics: dict, state: EvolutionState, seconds: float,
             evolution: Evolution, total_steps: int) -> dict[str, Any]:
    metrics = jax.device_get(metrics)
    fitness = np.asarray(metrics["fitness"], np.float64)
    valid = np.asarray(metrics["valid"], bool)
    good = fitness[valid]
    steps = evolution.agent_steps_per_generation

    def stat(fn):
        return float(fn(good)) if good.size else math.nan

    return {
        "generation": generation,
        "fitness": [float(f) for f in fitness],
        "valid": [bool(v) for v in valid],
        "best_fitness": stat(np.max),
        "mean_fitness": stat(np.mean),
        "std_fitness": stat(np.std),
        "best_fitness_so_far": float(state.best_fitness),
        "invalid_candidates": int((~valid).sum()),
        "invalid_runs": int(metrics["invalid_runs"]),
        "mean_return": {
            inner.env_id: float(np.nanmean(metrics["returns"][:, e])) if valid.any() else None
            for e, inner in enumerate(evolution.config.inner)
        },
        "agent_steps": total_steps,
        "devices": num_shards(evolution.mesh),
        "seconds": seconds,
        "agent_steps_per_second": steps / seconds if seconds > 0 else None,
    }


def _run_generations(evolution: Evolution, state: EvolutionState, run_dir: Path,
                     history: list[dict], until: int) -> RunResult:
    config = evolution.config
    checkpointer = RunCheckpointer(run_dir, keep=config.run.keep_checkpoints)
    start = int(state.generation)
    primary = distributed.is_primary()  # only process 0 writes files and shows progress
    bar = tqdm(total=until, initial=start, desc=config.name, unit="gen",
               disable=not (config.run.progress and primary), dynamic_ncols=True)
    total_steps = history[-1]["agent_steps"] if history else 0
    try:
        for generation in range(start + 1, until + 1):
            started = time.perf_counter()
            state, metrics = evolution.step(state)
            jax.block_until_ready(state)
            seconds = time.perf_counter() - started
            total_steps += evolution.agent_steps_per_generation
            line = _summary(generation, metrics, state, seconds, evolution, total_steps)
            history.append(line)
            mean = evolution.mean_meta_params(state)  # a JAX computation: every process
            if primary:
                _write_metrics(run_dir, history)
                save_meta_params(run_dir / BEST_FILE, state.best_meta_params)
                save_meta_params(run_dir / MEAN_FILE, mean)
            # every process calls save: orbax synchronises them and process 0 writes
            if generation % config.run.checkpoint_every == 0 or generation == until:
                meta = {"config": config.to_dict(), "history": history}
                best_now = line["best_fitness"]
                checkpointer.save(generation, state, meta,
                                  best_now if math.isfinite(best_now) else -math.inf)
            bar.update(1)
            bar.set_postfix(
                best=f"{line['best_fitness']:.4g}",
                mean=f"{line['mean_fitness']:.4g}",
                steps_per_s=f"{line['agent_steps_per_second']:.3g}",
                invalid=line["invalid_candidates"],
            )
    finally:
        bar.close()
        checkpointer.close()
    return RunResult(run_dir, config, evolution, state, history)


def evolve(config: ExperimentConfig, run_dir: str | Path | None = None) -> RunResult:
    """Start a new run of ``config`` in ``run_dir`` (a fresh directory by default)."""
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    run_dir = Path(distributed.agree(str(run_dir)))  # process 0's clock names the directory
    taken = (run_dir / CONFIG_FILE).exists()
    distributed.barrier("metarl-evolve-checked")  # all have looked before process 0 writes
    if taken:
        raise RunError(
            f"{run_dir} already holds a run; continue it with `metarl resume {run_dir}` "
            "or choose another directory"
        )
    evolution = Evolution(config)
    if distributed.is_primary():
        run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(run_dir / CONFIG_FILE, json.dumps(config.to_dict(), indent=2).encode())
    distributed.barrier("metarl-evolve-created")
    baselines = None
    if config.fitness.normalize_by_baseline and not config.fitness.baseline_returns:
        baselines = evolution.measure_baselines(jax.random.PRNGKey(config.run.seed + 1))
    state = evolution.init(baselines=baselines)
    return _run_generations(evolution, state, run_dir, [], config.es.generations)


def read_run_config(run_dir: str | Path) -> ExperimentConfig:
    """The resolved config a run was started with."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise RunError(f"{run_dir} is not a metarl run: it has no {CONFIG_FILE}")
    return config_from_dict(upgrade_saved_config(read_config_data(run_dir / CONFIG_FILE)))


def resume(run_dir: str | Path, generations: int | None = None) -> RunResult:
    """Continue ``run_dir`` from its latest complete checkpoint.

    Runs until ``generations`` generations are complete in total (the config's
    ``es.generations`` by default). Nothing in the directory is overwritten before the
    checkpoint has been restored successfully.
    """
    run_dir = Path(run_dir)
    evolution, generation, state, meta = _restore_latest(run_dir)
    config = evolution.config
    if generation != int(state.generation):
        raise CheckpointError(f"checkpoint {generation} holds generation {int(state.generation)}")
    until = generations if generations is not None else config.es.generations
    if until < generation:
        raise RunError(f"generations: the run already has {generation} generations (> {until})")
    history = [line for line in meta["history"] if line["generation"] <= generation]
    _warn_if_devices_changed(run_dir, history, num_shards(evolution.mesh))
    if distributed.is_primary():
        _write_metrics(run_dir, history)
    return _run_generations(evolution, state, run_dir, history, until)


def _warn_if_devices_changed(run_dir: Path, history: list[dict], devices: int) -> None:
    """Sharded results agree across device counts only to float rounding, which training
    amplifies, so a run resumed on another count no longer repeats itself exactly."""
    before = history[-1].get("devices") if history else None
    if before is not None and before != devices:
        warnings.warn(
            f"{run_dir} ran on {before} device(s) and resumes on {devices}: it will match an "
            "uninterrupted run only to float rounding, which training amplifies. To continue "
            f"it exactly, resume on {before} device(s) (e.g. `metarl --cpu-devices {before} "
            "resume ...` on a CPU).",
            UserWarning, stacklevel=3,
        )


def load_run(run_dir: str | Path) -> RunResult:
    """Read a run back (latest checkpoint, config and metrics) without running anything."""
    run_dir = Path(run_dir)
    evolution, _, state, meta = _restore_latest(run_dir)
    return RunResult(run_dir, evolution.config, evolution, state, list(meta["history"]))


def _restore_latest(run_dir: Path) -> tuple[Evolution, int, EvolutionState, dict[str, Any]]:
    """Rebuild a run's :class:`Evolution` and restore its latest complete checkpoint."""
    evolution = Evolution(read_run_config(run_dir))
    checkpointer = RunCheckpointer(run_dir, keep=evolution.config.run.keep_checkpoints)
    try:
        generation, state, meta = checkpointer.restore(evolution.init())
    finally:
        checkpointer.close()
    return evolution, generation, state, meta


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The lines of a run's ``metrics.jsonl``."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise RunError(f"no {METRICS_FILE} in {run_dir}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
