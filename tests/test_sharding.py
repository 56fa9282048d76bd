"""Sharding populations over devices (:mod:`metarl.sharding`).

The device count is fixed when JAX starts, so the multi-device checks run
``tests/_sharding_worker.py`` in fresh processes with four fake CPU devices and compare the
sharded results with single-device runs made in the same process: PPO populations (whole
and in segments), the traced per-device structure, evolution generations, and DQN
populations with their states, replay buffers included. Sharding wraps any learner's
``train``, ``init`` and ``advance`` the same way, so an on-policy and an off-policy learner
cover it; TD3 and SAC are not sharded here (they cost 39 CPU-seconds more in these
processes and exercise no other path; their vmapped and chunked populations are checked
against their members in ``tests/test_td3_sac.py``). Starting a process costs several
CPU-seconds (importing jax, gymnax and metarl), so all of these run in two processes only,
both started when the module starts so that their compilations overlap. They compile at
XLA's lowest backend optimisation level (the same for both sides of every comparison) to
keep the suite fast; sharding does not depend on it.

The in-process tests here run on this process's single device and compile nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sharding_worker import TINY  # the worker's configs, what it trains
from _subprocess_env import (
    env_without_device_count,
    every_core,
    module_on_every_core,
    on_every_core,
    start_worker,
    stop_workers,
)

from inner_loops.population import CPU_CHUNK_SIZE
from metarl import sharding
from metarl.config import ConfigError, RunConfig
from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.generation import Evolution

WORKER = Path(__file__).with_name("_sharding_worker.py")
DEVICES = 4
# The parts of the worker each process runs, split by the code generation they need: the
# populations are compared bit for bit, under XLA's default code generation (the suite's
# older one, without "fusion emitters", rounds their sharded programs differently from the
# single-device ones in the last bits: measured for PPO, DQN, TD3 and SAC); the generations
# are compared to 1e-6, and the older code generation compiles their two programs in 16
# CPU-seconds instead of 22 (measured with a cold compilation cache; their fitness and
# means came out identical). The parts' costs: plain 34 CPU-seconds (with the process's lazy
# imports, 2.5 s), dqn 25; generation 9 (with the imports), generation_sharded 7,
# structure 2.
PROCESSES = {
    "exact": ["plain", "dqn"],
    "generations": ["generation", "generation_sharded", "structure"],
}
OLDER_CODE_GENERATION = {"generations"}
# Seconds from the start for both processes: a hang fails the tests instead of freezing the
# suite, and the tests' own timeouts (600 s) leave room for it. The worker's watchdog fires
# first, printing every thread's stack to its stderr, whose tail the failure shows.
TIMEOUT = 480
WATCHDOG = TIMEOUT - 30


def worker_env(devices: int, older_code_generation: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METARL_")}
    flags = [f"--xla_force_host_platform_device_count={devices}",
             "--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1"]
    if older_code_generation:
        flags.append("--xla_cpu_use_fusion_emitters=false")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env["WORKER_WATCHDOG"] = str(WATCHDOG)
    return env


class Workers:
    """The worker processes of :data:`PROCESSES`, all started at once.

    :meth:`result` waits only for the process that runs the part asked for, so a test
    needs only its own process to finish, and a failed or hung process fails only the
    tests whose parts it runs (each with the tail of its stderr).
    """

    def __init__(self, logs: Path):
        self.logs = logs
        self.deadline = time.monotonic() + TIMEOUT
        self.processes = {
            name: start_worker(WORKER, parts,
                               worker_env(DEVICES, name in OLDER_CODE_GENERATION), logs, name)
            for name, parts in PROCESSES.items()}
        self.outputs: dict[str, dict] = {}

    def output(self, name: str) -> dict:
        """Everything process ``name`` printed (waiting for it the first time)."""
        if name not in self.outputs:
            process = self.processes[name]
            try:
                process.wait(timeout=max(1.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode != 0:
                pytest.fail(f"sharding worker ({name}: {', '.join(PROCESSES[name])}) failed "
                            f"({process.returncode}); stderr tail:\n"
                            f"{(self.logs / f'{name}.err').read_text()[-3000:]}")
            output = json.loads((self.logs / f"{name}.out").read_text().splitlines()[-1])
            assert output["devices"] == DEVICES and output["platform"] == "cpu"
            self.outputs[name] = output
        return self.outputs[name]

    def result(self, part: str) -> dict:
        [name] = [name for name, parts in PROCESSES.items() if part in parts]
        return self.output(name)[part]


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Both worker processes, started together; killed (if still running) at the end."""
    processes = Workers(tmp_path_factory.mktemp("sharding"))
    yield processes
    stop_workers(processes.processes)


@pytest.fixture(scope="module", autouse=True)
def start_workers_first(request):
    """Start both workers when the module starts if any selected test of it needs them
    (whichever test comes first, and whichever process its part is in)."""
    if any(item.module is request.module and "workers" in item.fixturenames
           for item in request.session.items):
        request.getfixturevalue("workers")


def assert_same_metrics(reference: dict, other: dict, exact: bool) -> None:
    assert reference.keys() == other.keys()
    for name in reference:
        a, b = np.asarray(reference[name]), np.asarray(other[name])
        assert a.shape == b.shape == (6, TINY.num_updates), name
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.timeout(600)
def test_sharded_population_equals_single_device(workers):
    results = workers.result("plain")["results"]
    reference = results["reference"]["metrics"]
    # 6 agents on 4 devices: padded to 8, the 2 copies dropped; bit-identical per agent.
    assert_same_metrics(reference, results["sharded"]["metrics"], exact=True)
    # the same agents in two sharded init/advance segments (as PBT runs them)
    assert_same_metrics(reference, results["sharded_segments"]["metrics"], exact=True)
    assert "'population': 4" in results["sharded"]["sharding"]
    assert "spec=P()" in results["sharded"]["sharding"]  # replicated: every device has it
    if "sharded_chunked" in results:  # worker run with --chunked
        # Chunks of 1 per device change only how XLA batches the arithmetic.
        assert_same_metrics(reference, results["sharded_chunked"]["metrics"], exact=False)


@pytest.mark.timeout(600)
def test_each_device_trains_its_share_in_chunks(workers):
    structure = workers.result("structure")
    assert structure["local_agents"] == 64 // DEVICES
    assert structure["scan_lengths"] == [16 // 4]  # 4 chunks, one after another
    assert structure["chunk_batch"] == [4]  # of 4 agents each
    assert "population" in structure["output_spec"]


@pytest.mark.timeout(600)
def test_sharded_generation_equals_single_device_and_compiles_once(workers):
    reference, sharded = workers.result("generation"), workers.result("generation_sharded")
    assert reference["mesh_devices"] == 1 and sharded["mesh_devices"] == DEVICES
    np.testing.assert_allclose(sharded["fitness"], reference["fitness"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sharded["mean"], reference["mean"], rtol=1e-5, atol=1e-6)
    assert sharded["best_fitness"] == pytest.approx(reference["best_fitness"], rel=1e-6)
    assert np.ptp(reference["fitness"][0]) > 0  # candidates differ, so ranks are tested
    assert reference["cache_size"] == 1 and sharded["cache_size"] == 1
    assert "spec=P()" in sharded["sharding"]


@pytest.mark.timeout(600)
def test_sharded_dqn_population_equals_single_device(workers):
    """6 DQN agents with their own hyperparameters, sharded over 4 devices (padded to 8),
    equal the same agents on one device bit for bit: the metrics of ``train_population``
    (what evolution runs), and the metrics and final states (replay buffers, optimiser,
    target networks, environments, keys) of a sharded ``init`` and two ``advance``
    segments (what PBT runs)."""
    dqn = workers.result("dqn")
    results = dqn["results"]
    reference = results["reference"]
    num_updates = dqn["num_updates"]
    for run in ("sharded", "sharded_segments"):
        metrics = results[run]["metrics"]
        assert metrics.keys() == reference["metrics"].keys()
        for name, values in reference["metrics"].items():
            assert np.shape(values) == (6, num_updates), name
            np.testing.assert_array_equal(metrics[name], values, err_msg=f"{run}: {name}")
    assert len(results["sharded_segments"]["states"]) == len(reference["states"])
    for index, (sharded, single) in enumerate(zip(results["sharded_segments"]["states"],
                                                  reference["states"], strict=True)):
        np.testing.assert_array_equal(sharded, single, err_msg=f"state leaf {index}")
    assert results["sharded_segments"]["state_devices"] == DEVICES
    assert "'population': 4" in results["sharded"]["sharding"]
    assert "spec=P()" in results["sharded"]["sharding"]
    # the agents learned (gradient steps after the warm-up) and differ from each other
    td_loss = np.asarray(reference["metrics"]["td_loss"])
    assert np.all(td_loss[:, -1] > 0)
    assert len({tuple(row) for row in td_loss.tolist()}) == 6


def test_one_device_mesh_takes_the_unsharded_path(monkeypatch):
    calls = []

    def unsharded(*args):
        calls.append(args)
        return "unsharded"

    monkeypatch.setattr(sharding.population, "map_in_chunks", unsharded)
    keys = jnp.zeros((3, 2), jnp.uint32)
    for mesh in (None, sharding.population_mesh(1)):
        for chunk in ("auto", 2):
            assert sharding.train_population("train", keys, "meta", "hypers", chunk,
                                             mesh) == "unsharded"
    auto = sharding.default_chunk_size()
    assert calls == [("train", (keys, "meta", "hypers"), c) for c in (auto, 2)] * 2


def test_cpu_devices_train_in_chunks_unless_told_otherwise():
    assert sharding.default_chunk_size() == CPU_CHUNK_SIZE  # the tests run on CPU
    assert sharding.default_chunk_size(sharding.population_mesh(1)) == CPU_CHUNK_SIZE
    population = 2 * CPU_CHUNK_SIZE + 3

    def train(key, meta_params, hypers):
        return {"x": jnp.sum(key.astype(jnp.float32)) + meta_params}

    def scan_lengths(chunk_size):
        jaxpr = jax.make_jaxpr(
            lambda k, m: sharding.train_population(train, k, m, None, chunk_size)
        )(jnp.zeros((population, 2), jnp.uint32), jnp.zeros(population))
        return [e.params["length"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]

    assert scan_lengths("auto") == [2]  # two chunks of 16, then the rest
    assert scan_lengths(population) == []  # one vmap


def test_run_mesh_is_the_given_mesh_or_every_device_with_shard_and_none_for_one():
    assert sharding.run_mesh(False) is None
    assert sharding.run_mesh(True, sharding.population_mesh(1)) is None
    built = sharding.run_mesh(True)
    assert (built is None) == (jax.device_count() == 1)
    if built is not None:
        assert sharding.num_shards(built) == jax.device_count()
        assert sharding.run_mesh(False, built) is built


def test_population_mesh_and_padding():
    mesh = sharding.population_mesh()
    assert mesh.axis_names == (sharding.POPULATION_AXIS,)
    assert sharding.num_shards(mesh) == jax.device_count()
    assert sharding.num_shards(None) == 1
    with pytest.raises(ValueError, match="devices"):
        sharding.population_mesh(jax.device_count() + 1)
    assert [sharding.padded_size(n, 4) for n in (1, 4, 6, 8, 9)] == [4, 4, 8, 8, 12]
    tree = {"a": jnp.arange(6).reshape(3, 2), "b": jnp.arange(3)}
    padded = sharding.pad_population(tree, 5)
    np.testing.assert_array_equal(padded["a"], [[0, 1], [2, 3], [4, 5], [4, 5], [4, 5]])
    np.testing.assert_array_equal(padded["b"], [0, 1, 2, 2, 2])
    with pytest.raises(ValueError):
        sharding.pad_population(tree, 2)
    for bad in (-1, 0, 1.5, None, "all"):
        with pytest.raises(ValueError, match="chunk_size"):
            sharding.train_population(None, jnp.zeros((2, 2)), chunk_size=bad)


def test_put_replicated_keeps_values():
    mesh = sharding.population_mesh()
    tree = {"x": jnp.arange(3.0), "k": jax.random.PRNGKey(1), "typed": jax.random.key(2)}
    placed = sharding.put_replicated(tree, mesh)
    for name in ("x", "k"):
        assert placed[name].sharding == sharding.replicated(mesh)
        np.testing.assert_array_equal(placed[name], tree[name])
    np.testing.assert_array_equal(jax.random.key_data(placed["typed"]),
                                  jax.random.key_data(tree["typed"]))
    assert sharding.put_replicated(placed, mesh)["x"] is placed["x"]


def test_run_config_shard_field():
    assert RunConfig().shard is True
    assert config_from_dict({"run": {"shard": False}}).run.shard is False
    with pytest.raises(ConfigError, match="run.shard"):
        config_from_dict({"run": {"shard": "yes"}})
    with pytest.raises(ConfigError, match="run.shard"):
        RunConfig(shard=1)
    config = ExperimentConfig(inner=(TINY,), run=RunConfig(shard=False))
    assert Evolution(config).mesh is None  # the unsharded single-device path
    sharded = Evolution(ExperimentConfig(inner=(TINY,)))  # sharded by default
    assert sharding.num_shards(sharded.mesh) == jax.device_count()
    if jax.device_count() == 1:
        assert sharded.mesh is None  # one device: the unsharded program, unchanged


# --------------------------------------------------------------- one device per core

PROBE = ("import sys; from metarl import sharding; "
         "n = sharding.use_cpu_cores(int(sys.argv[1]) if len(sys.argv) > 1 else None); "
         "import jax, os; print(n, jax.device_count(), os.environ['XLA_FLAGS'])")


def probe(*args: str, **env: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", on_every_core(PROBE), *args],
        env=env_without_device_count(JAX_PLATFORMS="cpu", **env),
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()[:2]


def test_use_cpu_cores_exposes_one_device_per_core_or_the_count_asked():
    assert probe() == [str(len(every_core()))] * 2
    assert probe("3") == ["3", "3"]
    # a count the user already chose wins
    assert probe("3", XLA_FLAGS="--xla_force_host_platform_device_count=5") == ["5", "5"]
    assert probe("3", JAX_NUM_CPU_DEVICES="2") == ["2", "2"]


def probe_flags(**env: str) -> list[str]:
    return subprocess.run(
        [sys.executable, "-c", on_every_core(PROBE), "2"],
        env=env_without_device_count(JAX_PLATFORMS="cpu", **env),
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()[2:]


def test_use_cpu_cores_lets_a_lagging_device_wait_instead_of_aborting():
    """XLA aborts a CPU collective whose devices arrive over 40 s apart (a niced sharded
    run did, at load 5); the devices use_cpu_cores exposes wait as long as XLA's own
    collective timeout, and a value the user set is kept. XLA accepted the flag: the
    probe computed with it."""
    wait = f"--xla_cpu_collective_call_terminate_timeout_seconds={sharding.COLLECTIVE_WAIT_SECONDS}"
    assert wait in probe_flags()
    assert probe_flags(XLA_FLAGS="--xla_cpu_collective_call_terminate_timeout_seconds=60") == [
        "--xla_cpu_collective_call_terminate_timeout_seconds=60"]


def test_the_collective_wait_does_not_change_a_stored_training_key(monkeypatch):
    from metarl.evolve import store

    monkeypatch.setattr(store, "_CODE_VERSION", None)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_collective_call_terminate_timeout_seconds=9")
    waiting = store.code_version()
    monkeypatch.setattr(store, "_CODE_VERSION", None)
    monkeypatch.delenv("XLA_FLAGS")
    assert store.code_version() == waiting
    monkeypatch.setattr(store, "_CODE_VERSION", None)
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=1")
    assert store.code_version() != waiting  # a flag that can change rounding still counts


def test_use_cpu_cores_rejects_bad_counts_and_late_calls():
    with pytest.raises(ValueError, match="count"):
        sharding.use_cpu_cores(0)
    jax.numpy.zeros(1).block_until_ready()  # JAX has started in this process
    with pytest.raises(RuntimeError, match="already started.*before.*importing gymnax"):
        sharding.use_cpu_cores(jax.device_count() + 1)


def test_cli_cpu_devices_after_jax_started_is_a_clear_error(capsys):
    from metarl import cli

    jax.numpy.zeros(1).block_until_ready()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--cpu-devices", str(jax.device_count() + 1), "plot", "nowhere"])
    assert exit_info.value.code == 2
    assert "--cpu-devices: JAX has already started" in capsys.readouterr().err


@pytest.mark.parametrize("args, expected", [((), None), (("--cpu-devices", "3"), 3)])
def test_cli_exposes_one_cpu_device_per_core(args, expected):
    """The real command line, in a fresh process: its imports must leave JAX unstarted
    (gymnax starts it on import) so that the device count can still be set."""
    out = subprocess.run(module_on_every_core("metarl.cli", *args, "devices"),
                         env=env_without_device_count(JAX_PLATFORMS="cpu"),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    expected = expected or len(every_core())
    assert out.startswith(f"{expected} cpu device(s)"), out
