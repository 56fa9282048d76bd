"""Several processes running one experiment together (:mod:`metarl.distributed`).

``metarl --distributed run | resume`` runs as a group of two processes with two fake CPU
devices each, joined by :mod:`jax.distributed` on 127.0.0.1 (gloo collectives), which shard
every generation's 18 training runs over the four devices (padded to 20). One such run serves
every multi-process check: its processes agree with each other exactly and with the same
experiment run here in one process on one device, and the run locks, resumes, refuses and
stops (on a signal to one of its processes) as one. Each process reports what it saw
(``tests/_distributed_worker.py``), since only process 0 writes the run's files. Every wait
is bounded: a process that hangs (e.g. its peer died inside a collective, or its exit hangs
once another process has gone) is killed and the test fails. The settings' own tests need no
processes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest
from _subprocess_env import env_without_device_count, jax_cache_env, start_worker, stop_workers

from metarl import distributed
from metarl.evolve.generation import Evolution
from metarl.kinds import load_experiment
from metarl.runs.config_history import read_config_history
from metarl.runs.layout import read_metrics
from metarl.runs.lock import acquire, lock_holder
from metarl.runs.meta_params import MEAN_FILE, load_meta_params
from metarl.sharding import num_shards, population_mesh

WORKER = Path(__file__).with_name("_distributed_worker.py")
PROCESSES = 2
LOCAL_DEVICES = 2
GROUP_TIMEOUT = 400  # seconds for every process of a group to finish
PEER_GRACE = 60  # seconds the others may take to end once one process has
GENERATIONS = 2
# 6 candidates x 3 seeds: 18 runs a generation, which 4 devices share only when padded to 20
EXPERIMENT = f"""
name = "distributed"
[objective]
name = "value_distance"
options = {{ hidden_sizes = [4] }}
[inner]
num_envs = 2
num_steps = 16
total_timesteps = 128
hidden_sizes = [8]
update_epochs = 1
num_minibatches = 1
[es]
population_size = 6
generations = {GENERATIONS}
[fitness]
seeds_per_candidate = 3
common_seeds = false
[run]
chunk_size = 1
checkpoint_every = 2
progress = false
"""


@dataclass
class Finished:
    """One process of a group once it ended: exit code, stdout and stderr, and its report
    (``tests/_distributed_worker.py``; ``None`` if it wrote none)."""

    code: int
    output: str
    report: dict | None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def group_env(address: str, rank: int) -> dict[str, str]:
    # The suite's XLA flags and compilation cache: process 0 of a later group then loads
    # the programs process 0 of an earlier one compiled (the others always compile: JAX
    # keys a multi-process CPU program by the process too, and only process 0 writes).
    env = {k: v for k, v in env_without_device_count(**jax_cache_env()).items()
           if not k.startswith(("METARL_", "SLURM_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", JAX_COORDINATOR_BIND_ADDRESS=address,
               **{distributed.ENV_COORDINATOR: address,
                  distributed.ENV_NUM_PROCESSES: str(PROCESSES),
                  distributed.ENV_PROCESS_ID: str(rank)})
    return env


def run_group(args: list, logs: Path, name: str,
              extra_env: dict[int, dict[str, str]] | None = None) -> list[Finished]:
    """``metarl --cpu-devices 2 --distributed ARGS`` as PROCESSES processes (with
    ``extra_env[rank]`` in a rank's environment). They work in step, so once one has ended
    the others must follow within PEER_GRACE seconds (a peer left waiting in a collective
    or in the distributed runtime's shutdown would otherwise hang), and all within
    GROUP_TIMEOUT."""
    address = f"127.0.0.1:{free_port()}"
    reports = [logs / f"{name}{rank}.json" for rank in range(PROCESSES)]
    processes = {
        f"{name}{rank}": start_worker(
            WORKER, [str(reports[rank]), "--cpu-devices", str(LOCAL_DEVICES), "--distributed",
                     *map(str, args)],
            {**group_env(address, rank), **(extra_env or {}).get(rank, {})}, logs,
            f"{name}{rank}")
        for rank in range(PROCESSES)
    }
    deadline = time.monotonic() + GROUP_TIMEOUT
    try:
        while any(process.poll() is None for process in processes.values()):
            if time.monotonic() > deadline:
                pytest.fail(f"{name}: a process still ran past its time:\n" + "\n".join(
                    f"--- {label} (exit {process.poll()}):\n{read_output(logs, label)[-3000:]}"
                    for label, process in processes.items()))
            if any(process.poll() is not None for process in processes.values()):
                deadline = min(deadline, time.monotonic() + PEER_GRACE)
            time.sleep(0.1)
    finally:
        stop_workers(processes)
    return [Finished(process.returncode, read_output(logs, label),
                     json.loads(report.read_text()) if report.exists() else None)
            for (label, process), report in zip(processes.items(), reports, strict=True)]


def read_output(logs: Path, label: str) -> str:
    return (logs / f"{label}.out").read_text() + (logs / f"{label}.err").read_text()


def flat_mean(run_dir: Path) -> list[float]:
    """The ES mean a run saved, its leaves flattened in order, as the ES itself holds it."""
    leaves = jax.tree.leaves(load_meta_params(run_dir / MEAN_FILE))
    return np.concatenate([np.ravel(leaf) for leaf in leaves]).astype(np.float64).tolist()


@pytest.fixture(scope="module")
def experiment_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("experiment") / "distributed.toml"
    path.write_text(EXPERIMENT)
    return path


@dataclass
class GroupRun:
    run_dir: Path
    processes: list[Finished]


@pytest.fixture(scope="module")
def group_run(experiment_file, tmp_path_factory) -> GroupRun:
    """``metarl --distributed run`` of the experiment by one group of processes."""
    logs = tmp_path_factory.mktemp("group")
    run_dir = logs / "run"
    processes = run_group(["run", experiment_file, "--run-dir", run_dir, "--no-plots"],
                          logs, "run")
    assert [p.code for p in processes] == [0] * PROCESSES, [p.output for p in processes]
    return GroupRun(run_dir, processes)


@dataclass
class OneProcessRun:
    fitness: list[list[float]]  # every generation's
    means: list[list[float]]  # the flat ES mean after every generation
    devices: int


@pytest.fixture(scope="module")
def one_process_run(experiment_file) -> OneProcessRun:
    """The same experiment in this process on one device, without jax.distributed, for
    GENERATIONS + 1 generations: those of the group's run and of its resume."""
    evolution = Evolution(load_experiment(experiment_file), population_mesh(1))
    state = evolution.init()
    fitness, means = [], []
    for _ in range(GENERATIONS + 1):
        state, metrics = evolution.step(state)
        fitness.append(np.asarray(metrics["fitness"], np.float64).tolist())
        means.append(np.asarray(state.es_state.mean, np.float64).tolist())
    return OneProcessRun(fitness, means, num_shards(evolution.mesh))


def assert_processes_agree_with_one(processes: list[Finished], one: OneProcessRun,
                                    generations: list[int]) -> None:
    """Every process recorded ``generations`` with the fitness and ES mean of the run in one
    process (to float rounding), and all processes exactly the same numbers."""
    for process in processes:
        recorded = process.report["generations"]
        assert [g["generation"] for g in recorded] == generations
        for g in recorded:
            np.testing.assert_allclose(g["fitness"], one.fitness[g["generation"] - 1],
                                       rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(g["mean"], one.means[g["generation"] - 1], rtol=1e-5,
                                       atol=1e-6)
    # they hold the same replicated state, so agree with each other exactly
    first, *others = [p.report["generations"] for p in processes]
    assert all(other == first for other in others)


@pytest.mark.timeout(900)
def test_two_processes_agree_with_one(group_run, one_process_run):
    """Two processes of two devices each, sharding every generation over all four, give the
    fitness and ES mean of one process on one device, and agree with each other exactly;
    each knows its rank and the whole group's devices, only process 0 is primary (and prints
    the summary), and the generation is traced and compiled once in each process."""
    assert one_process_run.devices == 1
    assert np.ptp(one_process_run.fitness[0]) > 0  # the candidates differ: a real check
    processes = group_run.processes
    for rank, process in enumerate(processes):
        report = process.report
        assert report["process_index"] == rank
        assert report["is_primary"] == (rank == 0)
        assert report["process_count"] == PROCESSES
        assert report["local_devices"] == LOCAL_DEVICES
        assert report["devices"] == PROCESSES * LOCAL_DEVICES
        assert report["step_programs"] == 1  # the sharded generation compiled once
        assert ("run directory" in process.output) == (rank == 0), process.output
    assert_processes_agree_with_one(processes, one_process_run, [1, 2])
    # what process 0 wrote is what every process computed
    lines = read_metrics(group_run.run_dir)
    assert [line["devices"] for line in lines] == [PROCESSES * LOCAL_DEVICES] * GENERATIONS
    assert [line["fitness"] for line in lines] == [
        g["fitness"] for g in processes[0].report["generations"]]
    assert flat_mean(group_run.run_dir) == processes[0].report["generations"][-1]["mean"]


@pytest.mark.timeout(900)
def test_a_multi_process_run_locks_resumes_and_refuses_as_one(group_run, one_process_run,
                                                              tmp_path):
    """The group's run directory holds one start (process 0 writes) and no lock once it
    ended; a group resumes it, taking the generation one process takes next; while another
    process holds the directory, every process of a group refuses (none hangs)."""
    run_dir = shutil.copytree(group_run.run_dir, tmp_path / "run")
    assert [e["event"] for e in read_config_history(run_dir)] == ["start"]
    assert lock_holder(run_dir) is None
    resumed = run_group(["resume", run_dir, "--generations", GENERATIONS + 1, "--no-plots"],
                        tmp_path, "resume")
    assert [p.code for p in resumed] == [0] * PROCESSES, [p.output for p in resumed]
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2, 3]
    assert_processes_agree_with_one(resumed, one_process_run, [GENERATIONS + 1])
    with acquire(run_dir, "holder"):
        refused = run_group(["resume", run_dir, "--generations", GENERATIONS + 2,
                             "--no-plots"], tmp_path, "refused")
    assert [p.code for p in refused] == [2] * PROCESSES, [p.output for p in refused]
    assert all(f"in use by process {os.getpid()}" in p.output for p in refused)
    assert all(p.report["generations"] == [] for p in refused)
    assert len(read_metrics(run_dir)) == GENERATIONS + 1


@pytest.mark.timeout(900)
def test_a_signal_to_one_process_stops_every_process_after_the_same_generation(
        group_run, one_process_run, tmp_path):
    """A resume to GENERATIONS + 2 generations whose process 1 alone receives SIGTERM once
    it has recorded generation GENERATIONS + 1: the processes agree before the next
    generation, so both stop there with exit code 4; generation GENERATIONS + 1, which
    ``run.checkpoint_every = 2`` skips, is checkpointed by both together; process 0 records
    the stop and why; and every process, the coordinator too, exits."""
    run_dir = shutil.copytree(group_run.run_dir, tmp_path / "run")
    stop_after = GENERATIONS + 1
    stopped = run_group(["resume", run_dir, "--generations", GENERATIONS + 2, "--no-plots"],
                        tmp_path, "stopped", {1: {"WORKER_SIGNAL_AFTER": str(stop_after)}})
    assert [p.code for p in stopped] == [4] * PROCESSES, [p.output for p in stopped]
    assert_processes_agree_with_one(stopped, one_process_run, [stop_after])
    assert f"stopped by SIGTERM after generation {stop_after}" in stopped[1].output
    assert (f"stopped by SIGTERM (received by another process) after generation "
            f"{stop_after} (checkpoint {stop_after} saved)") in stopped[0].output
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2, stop_after]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "3"]
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["generation"]) == ("stopped", stop_after)
    assert status["resume"] == f"metarl resume {run_dir}"
    assert lock_holder(run_dir) is None


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("METARL_", "SLURM_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_settings_from_arguments_and_environment(clean_env):
    assert distributed.resolve_settings() == {
        "coordinator_address": None, "num_processes": None, "process_id": None,
        "local_device_ids": None,
    }  # nothing set: JAX detects the cluster
    clean_env.setenv(distributed.ENV_COORDINATOR, "10.0.0.1:1234")
    clean_env.setenv(distributed.ENV_NUM_PROCESSES, "4")
    clean_env.setenv(distributed.ENV_PROCESS_ID, "3")
    clean_env.setenv(distributed.ENV_LOCAL_DEVICE_IDS, "0,1")
    assert distributed.resolve_settings() == {
        "coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3,
        "local_device_ids": [0, 1],
    }
    explicit = distributed.resolve_settings("h:1", 2, 0, "all")
    assert explicit == {"coordinator_address": "h:1", "num_processes": 2, "process_id": 0,
                        "local_device_ids": []}  # [] = every local device


def test_slurm_one_task_per_node_uses_every_local_device(clean_env):
    clean_env.setenv("SLURM_LOCALID", "0")
    clean_env.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x4)")
    assert distributed.resolve_settings()["local_device_ids"] == []
    clean_env.setenv("SLURM_STEP_TASKS_PER_NODE", "8(x2)")  # one task per GPU: JAX decides
    assert distributed.resolve_settings()["local_device_ids"] is None
    clean_env.setenv(distributed.ENV_LOCAL_DEVICE_IDS, "3")
    assert distributed.resolve_settings()["local_device_ids"] == [3]


def test_initialize_validates_settings(clean_env):
    with pytest.raises(ValueError, match="set all of"):
        distributed.initialize("127.0.0.1:1234")
    clean_env.setenv(distributed.ENV_NUM_PROCESSES, "two")
    with pytest.raises(ValueError, match=distributed.ENV_NUM_PROCESSES):
        distributed.initialize()
    clean_env.setenv(distributed.ENV_NUM_PROCESSES, "2")
    clean_env.setenv(distributed.ENV_COORDINATOR, "127.0.0.1:1234")
    clean_env.setenv(distributed.ENV_PROCESS_ID, "2")
    with pytest.raises(ValueError, match="process_id"):
        distributed.initialize()
    clean_env.setenv(distributed.ENV_PROCESS_ID, "0")
    clean_env.setenv(distributed.ENV_LOCAL_DEVICE_IDS, "0,x")
    with pytest.raises(ValueError, match=distributed.ENV_LOCAL_DEVICE_IDS):
        distributed.initialize()
    assert not distributed.is_initialized()
    assert distributed.process_count() == 1 and distributed.is_primary()
