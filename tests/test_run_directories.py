"""Run directories that survive what people and machines do to them, with real
processes and real files: a run killed before its first checkpoint, damaged and missing
checkpoint files, two writers at once, non-finite settings and runs whose candidates are all
invalid, config changes refused and accepted, atomic writes and a full disk (a real
size-limited tmpfs), evaluations that accumulate, retention across resumes, ``metarl runs``.

Every evolution here uses the tiny config of ``tests/test_runs.py`` (the same compiled
generation, shared through JAX's persistent compilation cache, in-process and in the
subprocesses); most tests copy one of two runs made once per module and continue the copy.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _subprocess_env import jax_cache_env
from _tiny_evolution import GENERATIONS, KILL_WORKER

from inner_loops.objective import LossTerm, Objective, clipped_l2
from metarl import distributed
from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.kinds import load_experiment, resume, start
from metarl.objectives import register_objective
from metarl.runs import lock as lock_module
from metarl.runs.checkpoint import RunCheckpointer, retained_steps
from metarl.runs.config_history import ConfigChangedError, read_config_history
from metarl.runs.evaluations import list_records
from metarl.runs.layout import (
    CheckpointError,
    DiskFullError,
    RunError,
    RunStopped,
    atomic_write,
    read_metrics,
    read_metrics_and_events,
)
from metarl.runs.listing import list_runs
from metarl.runs.lock import RunLockedError, acquire, hold_run_lock, lock_holder
from metarl.runs.meta_params import MEAN_FILE, load_meta_params


@pytest.fixture(scope="module")
def reference_run(tiny_config_file, tmp_path_factory):
    """An uninterrupted run of GENERATIONS generations."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference"
    start(load_experiment(tiny_config_file), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def two_generations(tiny_config_file, tmp_path_factory):
    """The same experiment run for 2 generations (checkpoints 1 and 2): tests copy it and
    continue the copy to GENERATIONS, which must give the reference run exactly."""
    run_dir = tmp_path_factory.mktemp("runs") / "two"
    start(load_experiment(tiny_config_file, ["es.generations=2"]), run_dir)
    return run_dir


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert [line["fitness"] for line in read_metrics(run_dir)] == \
        [line["fitness"] for line in read_metrics(reference)]
    ours, theirs = load_meta_params(run_dir / MEAN_FILE), load_meta_params(reference / MEAN_FILE)
    for mine, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(mine, want)


def tree_digest(directory: Path) -> dict[str, bytes]:
    """Every file's bytes by relative path (the lock file aside: each writer takes it)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


def cli_env() -> dict[str, str]:
    # as many devices as this process, so that a run continued here continues exactly (and
    # the command's programs are this process's, loaded from the persistent cache)
    return {**os.environ, "JAX_NUM_CPU_DEVICES": str(jax.device_count()),
            "PYTHONUNBUFFERED": "1"}


def start_cli(*args, log: Path) -> subprocess.Popen:
    handle = open(log, "w")  # noqa: SIM115 - closed by finish()
    # every program, however quick to compile, goes to the cache for the next CLI process
    process = subprocess.Popen([sys.executable, "-m", "metarl.cli", *map(str, args)],
                               env={**cli_env(), **jax_cache_env()}, stdout=handle,
                               stderr=subprocess.STDOUT)
    process.log_file, process.log = handle, log
    return process


def finish(process: subprocess.Popen, timeout: float = 300) -> str:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.log_file.close()
    return process.log.read_text()


# --------------------------------------------------------------------------------------
# 1. a run without a complete checkpoint starts again from the beginning


@pytest.mark.timeout(400)
def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(
        tiny_config_file, reference_run, tmp_path, capsys):
    run_dir = tmp_path / "killed_early"
    process = subprocess.Popen(
        [sys.executable, str(KILL_WORKER), "0", str(tiny_config_file), "--run-dir",
         str(run_dir), "--no-plots"], env=cli_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (run_dir / "config.json").exists():  # written just before compiling
        assert process.poll() is None and time.monotonic() < deadline, "worker did not start"
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert not any((run_dir / "checkpoints").glob("[0-9]*")), "killed too late"
    # the lock died with its holder: its file still names it, but nobody holds it
    assert lock_holder(run_dir) is None
    assert json.loads((run_dir / "run.lock").read_text() or "{}").get("pid") == process.pid

    assert main(["resume", str(run_dir), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "no complete checkpoint" in err and "starting it from the beginning" in err
    assert_same_run(run_dir, reference_run)


def test_evolve_into_a_run_that_never_reached_a_checkpoint(
        tiny_config_file, reference_run, tmp_path, capsys):
    run_dir = tmp_path / "never_saved"
    run_dir.mkdir()
    shutil.copy(reference_run / "config.json", run_dir / "config.json")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"generation": 1}) + "\n")
    # another config: refused, with the two ways out
    with pytest.raises(RunError, match=r"another config .* es\.sigma.*metarl resume"):
        start(load_experiment(tiny_config_file, ["es.sigma=0.1"]), run_dir)
    # the same config: nothing was lost, so it starts again there
    start(load_experiment(tiny_config_file), run_dir)
    assert "starting it from the beginning" in capsys.readouterr().err
    assert_same_run(run_dir, reference_run)
    with pytest.raises(RunError, match="already holds a run"):
        start(load_experiment(tiny_config_file), run_dir)


# --------------------------------------------------------------------------------------
# 2. damaged checkpoints are skipped, moved aside, never deleted


def _damage(checkpoint: Path, how: str) -> None:
    if how == "truncate the arrays":
        data = next((checkpoint / "state" / "d").iterdir())
        data.write_bytes(data.read_bytes()[:16])
    elif how == "delete the arrays":
        for data in (checkpoint / "state" / "d").iterdir():
            data.unlink()
    elif how == "truncate the meta item":
        meta = checkpoint / "meta" / "metadata"
        meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])
    elif how == "delete the state metadata":
        (checkpoint / "state" / "_METADATA").unlink()
    elif how == "empty the manifest":
        (checkpoint / "state" / "manifest.ocdbt").write_bytes(b"")
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", ["truncate the arrays", "delete the arrays",
                                 "truncate the meta item", "delete the state metadata",
                                 "empty the manifest"])
def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_continues_exactly(
        two_generations, reference_run, tmp_path, how):
    run_dir = copy_run(two_generations, tmp_path / "damaged")
    _damage(run_dir / "checkpoints" / "2", how)
    damaged_files = tree_digest(run_dir / "checkpoints" / "2")
    with pytest.warns(UserWarning, match="skipping damaged checkpoint 2") as caught:
        result = resume(run_dir, generations=GENERATIONS)
    assert any("moved it to" in str(w.message) for w in caught)
    assert int(result.state.generation) == GENERATIONS
    assert_same_run(run_dir, reference_run)
    # moved aside whole, never deleted, and out of the way of the checkpoints saved since
    assert tree_digest(run_dir / "damaged-checkpoints" / "2") == damaged_files


def test_load_run_skips_a_damaged_checkpoint_without_moving_it(two_generations, tmp_path):
    run_dir = copy_run(two_generations, tmp_path / "read_only")
    _damage(run_dir / "checkpoints" / "2", "truncate the arrays")
    with pytest.warns(UserWarning, match="skipping damaged checkpoint 2"):
        run = load_run_quietly(run_dir)
    assert int(run.state.generation) == 1
    assert (run_dir / "checkpoints" / "2").is_dir()
    assert not (run_dir / "damaged-checkpoints").exists()


def load_run_quietly(run_dir):
    from metarl.kinds import load_run

    return load_run(run_dir)


@pytest.mark.timeout(300)
def test_no_usable_checkpoint_is_one_error_with_exit_code_2(two_generations, tmp_path):
    run_dir = copy_run(two_generations, tmp_path / "all_damaged")
    _damage(run_dir / "checkpoints" / "2", "truncate the meta item")
    _damage(run_dir / "checkpoints" / "1", "delete the arrays")
    files_before = sorted(p.name for p in (run_dir / "checkpoints").rglob("*") if p.is_file())
    output = finish(start_cli("resume", run_dir, "--no-plots", log=tmp_path / "resume.log"))
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("metarl resume: error:")]
    assert len(errors) == 1 and "has no usable checkpoint" in errors[0], output
    assert "1: its arrays do not read back" in errors[0] or "1: its state" in errors[0]
    assert sum("skipping damaged checkpoint" in line for line in output.splitlines()) == 2
    # both moved aside, every file kept
    moved = sorted(p.name for p in (run_dir / "damaged-checkpoints").rglob("*") if p.is_file())
    assert moved == files_before
    # and a second attempt still refuses: the run did have checkpoints
    assert main(["resume", str(run_dir), "--no-plots"]) == 2


# --------------------------------------------------------------------------------------
# 3. one writer at a time


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    lock = acquire(tmp_path, "first")
    assert lock_holder(tmp_path)["pid"] == os.getpid()
    with pytest.raises(RunLockedError, match=rf"process {os.getpid()} on host "
                                             rf"{socket.gethostname()} \(`first`"):
        acquire(tmp_path, "second", wait=0.1)
    lock.release()
    assert lock_holder(tmp_path) is None
    acquire(tmp_path, "third").release()
    # a holder that is killed frees it: the OS drops flock locks with their process
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from metarl.runs.lock import acquire; "
        f"acquire({str(tmp_path)!r}, 'sleeper'); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert lock_holder(tmp_path)["pid"] == holder.pid
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    assert lock_holder(tmp_path) is None
    acquire(tmp_path, "after the kill").release()


def test_under_jax_distributed_only_the_primary_takes_the_lock(tmp_path, monkeypatch):
    """The rule, in one process; tests/test_distributed.py runs a real group of processes
    into a locked directory."""
    monkeypatch.setattr(distributed, "is_primary", lambda: False)
    with hold_run_lock(tmp_path, "secondary") as lock:
        assert lock is None and lock_holder(tmp_path) is None
    # in a group, every process refuses with the primary's message
    monkeypatch.setattr(distributed, "process_count", lambda: 2)
    monkeypatch.setattr(distributed, "agree", lambda text: "held by process 1 on host h")
    with pytest.raises(RunLockedError, match="held by process 1"), \
            hold_run_lock(tmp_path, "secondary"):
        pass


@pytest.mark.timeout(500)
def test_two_resumes_at_once_one_runs_the_other_refuses(two_generations, tmp_path):
    run_dir = copy_run(two_generations, tmp_path / "contended")
    # The winner takes the lock before it builds, restores and loads the generation (seconds
    # of work), so a few generations more keep it held well past when the other looks.
    target = 8
    processes = [start_cli("resume", run_dir, "--generations", target, "--no-plots",
                           log=tmp_path / f"resume{i}.log") for i in range(2)]
    outputs = [finish(process) for process in processes]
    codes = [process.returncode for process in processes]
    assert sorted(codes) == [0, 2], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    assert f"is in use by process {processes[winner].pid} on host " \
           f"{socket.gethostname()}" in outputs[loser]
    assert "Traceback" not in outputs[loser]
    assert [line["generation"] for line in read_metrics(run_dir)] == list(range(1, target + 1))


# --------------------------------------------------------------------------------------
# 4. non-finite settings, and runs whose every candidate is invalid


def _numeric_fields(cls) -> list[tuple[str, object]]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if hint in (float, int) or typing.get_origin(hint) is typing.Union or \
                str(hint).startswith(("int |", "float |")):
            fields.append((f.name, hint))
        elif typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (float,):
            fields.append((f.name + "[0]", hint))
    return fields


def test_every_numeric_config_field_rejects_nan_and_infinity_by_name():
    from inner_loops.registry import available_algorithms, get_algorithm
    from metarl.config import RunConfig
    from metarl.evolve.config import ESConfig, FitnessConfig

    cases = []
    for section, cls in (("es", ESConfig), ("fitness", FitnessConfig), ("run", RunConfig)):
        cases += [(section, name) for name, _ in _numeric_fields(cls)]
    for algorithm in available_algorithms():
        cls = get_algorithm(algorithm).config_class
        cases += [(f"inner:{algorithm}", name) for name, _ in _numeric_fields(cls)]
    assert len(cases) > 25
    assert ("inner:ppo", "learning_rate") in cases and ("es", "sigma") in cases
    for section, name in cases:
        for bad in (float("nan"), float("inf"), float("-inf")):
            if section.startswith("inner:"):
                path = f"inner.{name}"
                data = {"inner": {"algorithm": section.split(":")[1], name: bad}}
            elif name.endswith("[0]"):
                path = f"{section}.{name}"
                data = {section: {name[:-3]: [bad]}}
            else:
                path = f"{section}.{name}"
                data = {section: {name: bad}}
            with pytest.raises(ConfigError) as caught:
                config_from_dict(data)
            assert str(caught.value).startswith(path.replace("[0]", "")), (path, caught.value)
    # tables of free-form numbers too: an objective's options and environment parameters
    for data, path in (({"objective": {"name": "dpo", "options": {"alpha": float("inf")}}},
                        "objective.options.alpha"),
                       ({"inner": {"env_params": {"max_steps_in_episode": float("nan")}}},
                        "inner.env_params.max_steps_in_episode")):
        with pytest.raises(ConfigError, match=rf"^{path}: must be a finite number"):
            config_from_dict(data)


def test_the_command_line_refuses_non_finite_settings(tiny_config_file, tmp_path, capsys):
    for setting in ("inner.learning_rate=inf", "es.sigma=nan", "fitness.final_fraction=-inf"):
        run_dir = tmp_path / setting.split("=")[0]
        assert main(["run", str(tiny_config_file), "--set", setting, "--run-dir",
                     str(run_dir)]) == 2
        err = capsys.readouterr().err
        assert f"{setting.split('=')[0]}: must be a finite number" in err
        assert "Traceback" not in err and not run_dir.exists()


def _always_invalid_loss(meta_params, inputs):
    return clipped_l2().loss({}, inputs) + jnp.nan * meta_params["w"][0]


@register_objective("test_always_invalid", slots=("value",))
def _always_invalid() -> Objective:
    return Objective(value=LossTerm("always_invalid", lambda key: {"w": jnp.zeros(2)},
                                    _always_invalid_loss))


INVALID = """
name = "invalid"
[objective]
name = "test_always_invalid"
[inner]
num_envs = 2
num_steps = 8
total_timesteps = 32
hidden_sizes = [8]
update_epochs = 1
num_minibatches = 1
[es]
population_size = 2
generations = 6
[fitness]
seeds_per_candidate = 1
[run]
checkpoint_every = 4
max_invalid_generations = 2
progress = false
"""


def test_a_run_whose_candidates_are_all_invalid_stops_with_exit_code_3(tmp_path, capsys):
    config_file = tmp_path / "invalid.toml"
    config_file.write_text(INVALID)
    run_dir = tmp_path / "invalid"
    assert main(["run", str(config_file), "--run-dir", str(run_dir), "--no-plots"]) == 3
    err = capsys.readouterr().err
    assert "stopped after generation 2" in err and "run.max_invalid_generations = 2" in err
    assert "Traceback" not in err
    assert [line["invalid_candidates"] for line in read_metrics(run_dir)] == [2, 2]
    checkpointer = RunCheckpointer(run_dir)
    assert checkpointer.all_generations() == [2]  # saved when it stopped, not only every 4
    checkpointer.close()
    assert [run.state for run in list_runs(run_dir)] == ["stopped"]
    # resumed, it goes on while something is valid; here it stops again after one more
    assert main(["resume", str(run_dir), "--no-plots"]) == 3
    assert "stopped after generation 3" in capsys.readouterr().err
    # the limit can be switched off
    with pytest.raises(ConfigError, match="run.max_invalid_generations"):
        config_from_dict({"run": {"max_invalid_generations": -1}})
    assert config_from_dict({"run": {"max_invalid_generations": 0}}).run.max_invalid_generations \
        == 0


# --------------------------------------------------------------------------------------
# 5. config changes: the budget is free, anything else refused unless accepted


def _edit_config(run_dir: Path, **changes) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    for dotted, value in changes.items():
        section, name = dotted.split("__")
        config[section][name] = value
    (run_dir / "config.json").write_text(json.dumps(config))


def test_a_changed_config_is_refused_naming_the_fields_and_changes_nothing(
        two_generations, tmp_path, capsys):
    run_dir = copy_run(two_generations, tmp_path / "edited")
    _edit_config(run_dir, es__population_size=6, es__sigma=0.1, es__generations=5)
    before = tree_digest(run_dir)
    with pytest.raises(ConfigChangedError) as caught:
        resume(run_dir)
    message = str(caught.value)
    assert "es.population_size 4 -> 6" in message and "es.sigma 0.05 -> 0.1" in message
    assert "es.generations" not in message.split("budget")[0]  # the budget may change
    assert "--accept-config-change" in message
    assert tree_digest(run_dir) == before
    assert main(["resume", str(run_dir), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "es.population_size" in err and "Traceback" not in err
    assert tree_digest(run_dir) == before


def test_an_accepted_change_is_recorded_and_only_the_budget_is_free(
        two_generations, reference_run, tmp_path):
    run_dir = copy_run(two_generations, tmp_path / "accepted")
    _edit_config(run_dir, run__keep_checkpoints=3, es__generations=4)
    with pytest.raises(ConfigChangedError, match=r"run\.keep_checkpoints 2 -> 3"):
        resume(run_dir)
    resume(run_dir, accept_config_change=True)
    lines = read_metrics_and_events(run_dir)
    events = [line for line in lines if "event" in line]
    assert [line.get("generation") for line in lines] == [1, 2, None, 3, 4]
    assert events == [{"event": "config_change", "after_step": 2, "time": events[0]["time"],
                       "changes": [{"field": "run.keep_checkpoints", "old": 2, "new": 3}]}]
    history = read_config_history(run_dir)
    assert [entry["event"] for entry in history] == ["start", "config_change"]
    assert history[1]["config"]["run"]["keep_checkpoints"] == 3
    # the changed run goes on without asking again; --generations is a budget change
    resume(run_dir, generations=GENERATIONS)
    assert read_config_history(run_dir)[-1]["changes"] == [
        {"field": "es.generations", "old": 4, "new": GENERATIONS}]
    assert json.loads((run_dir / "config.json").read_text())["es"]["generations"] == GENERATIONS
    assert_same_run(run_dir, reference_run)  # keep_checkpoints changes no result
    assert len([line for line in read_metrics_and_events(run_dir) if "event" in line]) == 1


# --------------------------------------------------------------------------------------
# 6. atomic writes and a full disk


def test_an_atomic_write_that_fails_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    atomic_write(path, b"old\n")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(DiskFullError, match=r"disk full: could not write .*metrics\.jsonl"):
        atomic_write(path, b"new\n")
    assert path.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs mounted for the test (skipped where mounting is not allowed)."""
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a size-limited tmpfs in this container (needs root and "
                    f"CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def _fill(mount_point: Path, leave: int) -> Path:
    stats = os.statvfs(mount_point)
    filler = mount_point / "filler"
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave))
    return filler


@pytest.mark.parametrize("leave, failing", [(0, "could not write"),
                                            (48 * 1024, "saving checkpoint 3")])
def test_a_full_disk_is_a_clear_error_and_the_previous_checkpoint_restores(
        two_generations, reference_run, small_disk, capsys, leave, failing):
    run_dir = copy_run(two_generations, small_disk / "run")
    filler = _fill(small_disk, leave)
    assert main(["resume", str(run_dir), "--generations", str(GENERATIONS), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "error: disk full" in err and failing in err and "Traceback" not in err, err
    for name in ("config.json", "status.json"):  # every file parses
        json.loads((run_dir / name).read_text())
    for name in ("metrics.jsonl", "config_history.jsonl"):
        [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
    assert not list((run_dir / "checkpoints").glob("*tmp*"))  # the half save was removed
    filler.unlink()
    resume(run_dir, generations=GENERATIONS)
    assert_same_run(run_dir, reference_run)


# --------------------------------------------------------------------------------------
# 7. evaluations accumulate


@pytest.mark.timeout(400)
def test_evaluations_accumulate_and_an_identical_one_is_reused(reference_run, tmp_path,
                                                                capsys):
    from metarl.evolve.compare import compare_runs
    from metarl.evolve.report import plot_run

    run_dir = copy_run(reference_run, tmp_path / "evaluated")
    shutil.rmtree(run_dir / "evaluations", ignore_errors=True)
    first = ["evaluate", str(run_dir), "--seeds", "3", "--baselines", "l2"]
    assert main(first) == 0
    assert "saved " + str(run_dir / "evaluations" / "1.json") in capsys.readouterr().out
    assert main([*first, "--eval-seed", "5"]) == 0
    assert main(first) == 0
    assert "reusing " + str(run_dir / "evaluations" / "1.json") in capsys.readouterr().out
    records = list_records(run_dir)
    assert [r["id"] for r in records] == [1, 2]
    spec = records[0]["spec"]
    assert spec["environments"] == ["CartPole-v1"] and spec["seeds"] == 3
    assert spec["baselines"] == ["l2"] and spec["meta_params"] == "mean"
    assert spec["total_timesteps"] == {"CartPole-v1": 4096}
    assert records[1]["spec"]["eval_seed"] == 5
    created, results = records[0]["created"], records[0]["results"]
    time.sleep(1.1)
    assert main([*first, "--rerun"]) == 0
    assert "replaced " + str(run_dir / "evaluations" / "1.json") in capsys.readouterr().out
    records = list_records(run_dir)
    assert [r["id"] for r in records] == [1, 2] and records[0]["created"] != created
    assert records[0]["results"] == results  # the same evaluation, computed again
    # an evaluation.json of a run made before evaluations accumulated is read too
    legacy = dict(records[1])
    for key in ("id", "path", "spec"):
        legacy.pop(key)
    (run_dir / "evaluation.json").write_text(json.dumps(legacy))
    assert [r["id"] for r in list_records(run_dir)] == ["legacy", 1, 2]
    names = [p.name for p in plot_run(run_dir)]
    assert names[-3:] == ["learning_curves.png", "learning_curves_1.png",
                          "learning_curves_2.png"]
    # compare keeps one row per environment and objective: the latest evaluation's
    rows = compare_runs([run_dir]).runs[0].evaluations
    latest = list_records(run_dir)[-1]["results"]
    assert rows == tuple((r["env_id"], r["objective"], r["mean"], r["ci_low"], r["ci_high"])
                         for r in latest)
    assert [row[1] for row in rows] == ["evolved", "l2"]


# --------------------------------------------------------------------------------------
# 8. retention holds across resumes; metarl runs


def test_retention_holds_across_resumes(two_generations, tmp_path):
    run_dir = copy_run(two_generations, tmp_path / "kept")
    resume(run_dir, generations=4)
    resume(run_dir, generations=GENERATIONS + 2)
    lines = read_metrics(run_dir)
    scores = {line["generation"]: line["best_fitness"] for line in lines}
    checkpointer = RunCheckpointer(run_dir)
    kept = checkpointer.all_generations()
    checkpointer.close()
    # keep_checkpoints = 2: the last two plus the best generation, however many resumes
    assert set(kept) == retained_steps(list(scores), scores, 2)
    assert len(kept) <= 3 and GENERATIONS + 2 in kept
    assert retained_steps([1, 2, 3, 4], {1: 5.0, 2: 1.0, 3: 2.0, 4: 3.0}, 2) == {1, 3, 4}
    assert retained_steps([1, 2, 3], {1: float("-inf"), 2: float("nan")}, 1) == {3}


def test_metarl_runs_lists_every_state(reference_run, two_generations, tmp_path, capsys):
    root = tmp_path / "many"
    copy_run(reference_run, root / "finished")
    interrupted = copy_run(two_generations, root / "interrupted")
    _edit_config(interrupted, es__generations=GENERATIONS)
    running = copy_run(two_generations, root / "group" / "running")
    never = root / "never_saved"
    never.mkdir()
    shutil.copy(reference_run / "config.json", never / "config.json")
    stopped = copy_run(two_generations, root / "stopped")
    _edit_config(stopped, es__generations=GENERATIONS)
    (stopped / "status.json").write_text(json.dumps({"state": "stopped", "generation": 2,
                                                     "started": "2026-01-02T03:04:05"}))
    with lock_module.acquire(running, "metarl resume"):
        assert main(["runs", str(root)]) == 0
        table = capsys.readouterr().out.splitlines()
    by_name = {line.split()[0]: line for line in table[1:]}
    assert by_name["finished"].split()[1:3] == ["finished", f"{GENERATIONS}/{GENERATIONS}"]
    assert by_name["interrupted"].split()[1:3] == ["interrupted", f"2/{GENERATIONS}"]
    assert "resumes from checkpoint 2" in by_name["interrupted"]
    assert by_name["group/running"].split()[1] == "running"
    assert f"by process {os.getpid()}" in by_name["group/running"]
    assert by_name["never_saved"].split()[1] == "interrupted"
    assert "resumes from the start" in by_name["never_saved"]
    assert by_name["stopped"].split()[1] == "stopped"
    assert "2026-01-02 03:04" in by_name["stopped"]
    best = read_metrics(reference_run)[-1]["best_fitness_so_far"]
    assert f"{best:.4g}" in by_name["finished"]
    assert main(["runs", str(tmp_path / "nowhere")]) == 2


def test_errors_are_run_errors():
    assert issubclass(CheckpointError, RunError) and issubclass(DiskFullError, RunError)
    assert not issubclass(RunStopped, RunError)


def test_a_restored_state_is_placed_as_a_fresh_one(tmp_path):
    """``jax.jit`` keys its programs on whether arguments are committed to a device: a
    checkpoint read back into a fresh (uncommitted) template must come back uncommitted,
    or a run resumed in the process that started it compiles its step again. Arrays the
    template commits stay committed."""
    fresh = {"weights": jnp.arange(6.0).reshape(2, 3), "step": jnp.asarray(4, jnp.int32)}
    pinned = {"weights": jax.device_put(fresh["weights"], jax.devices()[0]),
              "step": fresh["step"]}
    assert not fresh["weights"].committed and pinned["weights"].committed
    checkpointer = RunCheckpointer(tmp_path)
    try:
        checkpointer.save(1, fresh, {"history": []})
        restored = checkpointer.restore_state(1, fresh)
        again = checkpointer.restore_state(1, pinned)
    finally:
        checkpointer.close()
    assert [leaf.committed for leaf in jax.tree.leaves(restored)] == [False, False]
    assert [leaf.committed for leaf in jax.tree.leaves(again)] == [False, True]
    for leaf, saved in zip(jax.tree.leaves(restored), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(leaf, saved)
        assert leaf.dtype == saved.dtype
    step = jax.jit(lambda state: state["weights"] * state["step"])
    step(fresh)
    step(restored)
    assert step._cache_size() == 1  # one program for both


def test_a_half_save_written_to_after_its_removal_is_removed_again(tmp_path):
    """On a loaded machine a failed save's writer thread can create files after the first
    removal; the half-written directory must be gone when the removal returns."""
    import threading

    from metarl.runs.checkpoint import TMP_MARKER

    checkpointer = RunCheckpointer(tmp_path / "run")
    half = checkpointer.directory / f"3.{TMP_MARKER}"
    other = checkpointer.directory / f"2.{TMP_MARKER}"  # another step's: not this save's
    other.mkdir(parents=True)

    def late_writer():  # recreates the half save for 0.3 s, as a lagging writer would
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            (half / "state").mkdir(parents=True, exist_ok=True)
            time.sleep(0.02)

    writer = threading.Thread(target=late_writer)
    writer.start()
    time.sleep(0.05)
    checkpointer._remove_partial_save(3)
    writer.join()  # what it wrote after the removal returned would still be there
    assert not half.exists() and other.exists()
