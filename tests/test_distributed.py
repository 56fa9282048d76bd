"""Several processes evaluating one generation together (:mod:`metarl.distributed`).

Two processes with two fake CPU devices each join a :mod:`jax.distributed` run on
127.0.0.1 (gloo collectives) and shard each generation of a tiny experiment over the four
devices; a third process runs the same experiment alone on one device. All three start at
once and must agree on every fitness and on the new ES mean. Every wait is bounded: a
process that hangs (e.g. its peer died inside a collective) is killed and the test fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from _subprocess_env import start_worker, stop_workers

from metarl import distributed

WORKER = Path(__file__).with_name("_distributed_worker.py")
PROCESSES = 2
LOCAL_DEVICES = 2
TIMEOUT = 280  # seconds for the whole group


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def env_for(devices: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METARL_", "SLURM_"))}
    env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={devices} "
                        "--xla_backend_optimization_level=0")
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def start(args: list[str], env: dict[str, str], logs: Path, name: str) -> subprocess.Popen:
    return start_worker(WORKER, args, env, logs, name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("distributed")
    port = free_port()
    address = f"127.0.0.1:{port}"
    launches = {
        f"process{rank}": (["distributed"], env_for(
            LOCAL_DEVICES, METARL_COORDINATOR=address, METARL_NUM_PROCESSES=str(PROCESSES),
            METARL_PROCESS_ID=str(rank), JAX_COORDINATOR_BIND_ADDRESS=address,
        ))
        for rank in range(PROCESSES)
    }
    launches["reference"] = (["reference"], env_for(1))
    processes = {name: start(args, env, logs, name) for name, (args, env) in launches.items()}
    deadline = time.monotonic() + TIMEOUT
    failures = []
    try:
        for name, process in processes.items():
            try:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failures.append(f"{name} timed out after {TIMEOUT}s")
                break
            if process.returncode != 0:
                failures.append(f"{name} exited {process.returncode}")
                break
    finally:
        stop_workers(processes)
    if failures:
        tails = "\n".join(f"--- {name} stderr:\n{(logs / f'{name}.err').read_text()[-2000:]}"
                          for name in processes)
        pytest.fail("\n".join(failures) + "\n" + tails)
    return {name: json.loads((logs / f"{name}.out").read_text().strip().splitlines()[-1])
            for name in processes}


@pytest.mark.timeout(600)
def test_two_processes_agree_with_one(runs):
    reference = runs["reference"]
    assert reference["process_count"] == 1 and reference["mesh_devices"] == 1
    assert np.ptp(reference["fitness"][0]) > 0
    for rank in range(PROCESSES):
        result = runs[f"process{rank}"]
        assert result["process_index"] == rank
        assert result["is_primary"] == (rank == 0)
        assert result["process_count"] == PROCESSES
        assert result["local_devices"] == LOCAL_DEVICES
        assert result["devices"] == result["mesh_devices"] == PROCESSES * LOCAL_DEVICES
        np.testing.assert_allclose(result["fitness"], reference["fitness"], rtol=1e-6,
                                   atol=1e-6)
        np.testing.assert_allclose(result["mean"], reference["mean"], rtol=1e-5, atol=1e-6)
        assert result["cache_size"] == 1  # the sharded generation compiled once
    # the processes agree with each other exactly: they hold the same replicated state
    first, second = runs["process0"], runs["process1"]
    assert first["fitness"] == second["fitness"] and first["mean"] == second["mean"]


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
