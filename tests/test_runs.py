"""Run directories end to end: exact resume, SIGKILL during a generation (also of a run in
successive-halving rungs) and during a save, clear errors that overwrite nothing, and the CLI.

Every run here uses one tiny config (one test also trains it in rungs, a second generation
program), so the generation step compiles once and later runs (including the subprocesses)
reuse it from JAX's persistent compilation cache.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from _subprocess_env import env_without_device_count, jax_cache_env
from _tiny_evolution import GENERATIONS, KILL_WORKER

from metarl.cli import main
from metarl.kinds import load_experiment, load_run, resume, start
from metarl.runs.checkpoint import RunCheckpointer
from metarl.runs.layout import CheckpointError, RunError, read_metrics
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, load_meta_params

# The tiny experiment trained in successive-halving rungs (metarl.evolve.rungs): of its 4
# candidates all train updates 1-4 of 32, the best 2 updates 5-11 and the best one the rest.
IN_RUNGS = ["es.rungs=3", "es.eta=3", "es.generations=3"]
TIMINGS = ("seconds", "agent_steps_per_second", "time")  # fields a repeated run may change


@pytest.fixture(scope="module")
def reference_run(tiny_config_file, tmp_path_factory):
    """An uninterrupted run of GENERATIONS generations."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference"
    start(load_experiment(tiny_config_file), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def reference_run_in_rungs(tiny_config_file, tmp_path_factory):
    """An uninterrupted run of the tiny experiment in rungs (``IN_RUNGS``)."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference_in_rungs"
    start(load_experiment(tiny_config_file, IN_RUNGS), run_dir)
    return run_dir


def _fitness(run_dir):
    return [line["fitness"] for line in read_metrics(run_dir)]


def _lines(run_dir):
    """``metrics.jsonl``'s lines without their timings."""
    return [{name: value for name, value in line.items() if name not in TIMINGS}
            for line in read_metrics(run_dir)]


def _assert_same_trees(ours, theirs):
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for mine, reference_leaf in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(reference_leaf))


def _assert_same_run(run_dir, reference, state=None):
    """Every line of ``metrics.jsonl`` (each candidate's fitness, the rungs it reached, the
    statistics) but its timings, and the best and mean meta-parameter files, bit for bit;
    given the ``state`` a run ended with, also that it is the state of the reference's
    newest checkpoint (the strategy's state, key, best so far, ...)."""
    assert _fitness(run_dir) == _fitness(reference)
    assert _lines(run_dir) == _lines(reference)
    for name in (BEST_FILE, MEAN_FILE):
        _assert_same_trees(load_meta_params(run_dir / name), load_meta_params(reference / name))
    if state is not None:
        _assert_same_trees(state, load_run(reference).state)


def _tree_digest(directory: Path) -> str:
    """Names and contents of every file (the lock file aside: each writer takes it)."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.name == "run.lock":
            continue
        digest.update(str(path.relative_to(directory)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_reference_run_writes_a_complete_run_directory(reference_run):
    lines = read_metrics(reference_run)
    assert [line["generation"] for line in lines] == list(range(1, GENERATIONS + 1))
    assert all(len(line["fitness"]) == 4 and line["invalid_candidates"] == 0 for line in lines)
    for name in ("config.json", "metrics.jsonl", "best_meta_params.msgpack", MEAN_FILE):
        assert (reference_run / name).is_file()
    checkpointer = RunCheckpointer(reference_run)
    kept = checkpointer.all_generations()
    checkpointer.close()
    # the last two plus the one whose generation scored best
    best = 1 + int(np.argmax([line["best_fitness"] for line in lines]))
    assert set(kept) == {GENERATIONS - 1, GENERATIONS, best}


def test_two_plus_two_resumed_equals_four_straight(tiny_config_file, reference_run, tmp_path):
    config = load_experiment(tiny_config_file, ["es.generations=2"])
    run_dir = tmp_path / "split"
    start(config, run_dir)
    assert len(read_metrics(run_dir)) == 2
    result = resume(run_dir, generations=GENERATIONS)
    assert int(result.state.generation) == GENERATIONS
    _assert_same_run(run_dir, reference_run)


def _start_worker(tiny_config_file, run_dir, pause_at=0, pause_in_generation=0,
                  overrides=()):
    """``metarl run`` of the tiny experiment (with ``--set`` ``overrides``) in the kill
    worker, which freezes inside the save of checkpoint ``pause_at`` or inside generation
    ``pause_in_generation`` when asked (``tests/_kill_worker.py``)."""
    # The worker runs the CLI, which would expose one CPU device per core; it must use as
    # many devices as this process, which resumes its run, for the resume to be exact. Its
    # programs are then this process's, loaded from the persistent cache.
    env = {**os.environ, **jax_cache_env(), "JAX_NUM_CPU_DEVICES": str(jax.device_count()),
           "METARL_TEST_PAUSE_IN_GENERATION": str(pause_in_generation)}
    sets = [arg for override in overrides for arg in ("--set", override)]
    return subprocess.Popen(
        [sys.executable, str(KILL_WORKER), str(pause_at), str(tiny_config_file), *sets,
         "--run-dir", str(run_dir), "--no-plots"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


def _wait_for(predicate, process, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            raise AssertionError(f"worker exited early:\n{process.stdout.read()}")
        time.sleep(0.02)
    process.kill()
    raise AssertionError("timed out waiting for the worker")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("rungs", [pytest.param(1, id="one_rung"),
                                   pytest.param(3, id="three_rungs")])
def test_sigkill_during_a_generation_then_resume(rungs, tiny_config_file, request, tmp_path):
    """SIGKILL inside generation 3, then resume: the run equals the uninterrupted one bit
    for bit. A run checkpoints after whole generations only; in rungs (``IN_RUNGS``) a
    generation's rungs, and the selections between them, are one jitted program, so inside
    the generation is the one place such a run can be stopped mid-way. The worker is killed
    once that program has been dispatched and before anything of it is written: generation
    3 is lost whole and trained again, its rungs included, from checkpoint 2."""
    reference = request.getfixturevalue("reference_run_in_rungs" if rungs > 1
                                        else "reference_run")
    run_dir = tmp_path / "killed"
    process = _start_worker(tiny_config_file, run_dir, pause_in_generation=3,
                            overrides=IN_RUNGS if rungs > 1 else ())
    _wait_for(lambda: "PAUSED_IN_GENERATION" in process.stdout.readline(), process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    lines = read_metrics(run_dir)
    assert [line["generation"] for line in lines] == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1", "2"]
    if rungs > 1:  # each generation stopped 2 candidates after rung 0 and 1 after rung 1
        assert [sorted(line["rung_reached"]) for line in lines] == [[0, 0, 1, 2]] * 2
    result = resume(run_dir)
    assert int(result.state.generation) == len(read_metrics(reference))
    _assert_same_run(run_dir, reference, result.state)


@pytest.fixture(scope="module")
def two_device_cli_run(tiny_config_file, tmp_path_factory):
    """``metarl --cpu-devices 2 run`` of 2 generations with its progress bar, in a process
    of its own: its run directory and the finished process. The command line's test and
    the test of resuming on another device count continue copies of it (a process costs
    about 5 CPU-seconds to start and trace, so one serves both)."""
    run_dir = tmp_path_factory.mktemp("cli") / "two_devices"
    env = env_without_device_count(**jax_cache_env(), PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "metarl.cli", "--cpu-devices", "2", "run",
                           str(tiny_config_file), "--set", "es.generations=2", "--set",
                           "run.progress=true", "--run-dir", str(run_dir), "--no-plots"],
                          capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr
    return run_dir, done


def test_resuming_on_another_device_count_warns(two_device_cli_run, tmp_path):
    """A run started by the CLI on 2 CPU devices and resumed here on this process's one."""
    run_dir = shutil.copytree(two_device_cli_run[0], tmp_path / "two_devices")
    assert read_metrics(run_dir)[-1]["devices"] == 2
    with pytest.warns(UserWarning, match=r"ran on 2 device\(s\) and resumes on 1"):
        result = resume(run_dir, generations=3)
    assert [line["devices"] for line in result.history] == [2, 2, 1]


@pytest.mark.timeout(400)
def test_sigkill_during_a_save_skips_the_incomplete_checkpoint(
    tiny_config_file, reference_run, tmp_path
):
    run_dir = tmp_path / "killed_in_save"
    process = _start_worker(tiny_config_file, run_dir, pause_at=3)
    marker = []

    def paused():
        line = process.stdout.readline()
        marker.append(line)
        return "PAUSED_IN_SAVE" in line

    _wait_for(paused, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    checkpoints = run_dir / "checkpoints"
    leftovers = [p.name for p in checkpoints.iterdir() if "tmp" in p.name]
    assert leftovers, "the kill should leave orbax's temporary directory behind"
    assert not (checkpoints / "3").exists()
    assert (checkpoints / "2" / "commit_success.txt").exists()
    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        result = resume(run_dir)
    assert int(result.state.generation) == GENERATIONS
    _assert_same_run(run_dir, reference_run)


def test_resuming_a_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(RunError, match="run directory not found"):
        resume(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="not a metarl run"):
        resume(tmp_path / "empty")


def test_resume_with_a_changed_config_stops_and_overwrites_nothing(reference_run, tmp_path):
    import shutil

    run_dir = tmp_path / "changed"
    shutil.copytree(reference_run, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    config["objective"]["options"]["hidden_sizes"] = [16]
    (run_dir / "config.json").write_text(json.dumps(config))
    before = _tree_digest(run_dir)
    with pytest.raises(RunError, match=r"objective\.options\.hidden_sizes \[8\] -> \[16\]"):
        resume(run_dir, generations=GENERATIONS + 1)
    assert _tree_digest(run_dir) == before
    # accepted, the change still cannot continue: the checkpoint's arrays have other shapes
    with pytest.raises(CheckpointError, match="no longer matches"):
        resume(run_dir, generations=GENERATIONS + 1, accept_config_change=True)
    assert _tree_digest(run_dir) == before


def test_evolve_refuses_to_overwrite_a_run(tiny_config_file, reference_run):
    with pytest.raises(RunError, match="already holds a run"):
        start(load_experiment(tiny_config_file), reference_run)


@pytest.mark.timeout(600)
def test_cli_evolve_resume_and_errors(two_device_cli_run, tmp_path, capsys):
    """``metarl run`` writes a run directory with a progress bar, on the devices
    ``--cpu-devices`` asks for; ``metarl resume --generations`` extends it (here, in this
    process on its one device, saying so)."""
    started, done = two_device_cli_run
    assert "run directory" in done.stdout
    assert "2/2" in done.stderr  # the progress bar reached the last generation
    assert [line["generation"] for line in read_metrics(started)] == [1, 2]
    assert [line["devices"] for line in read_metrics(started)] == [2, 2]
    assert json.loads((started / "config.json").read_text())["es"]["generations"] == 2

    run_dir = shutil.copytree(started, tmp_path / "cli")
    # JAX runs here before the command does, so the command keeps this process's device
    assert jax.device_count() == 1
    assert main(["resume", str(run_dir), "--generations", "3", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "metarl resume: warning:" in err and "resumes on 1" in err, err
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2, 3]


def test_cli_errors_name_the_problem_and_exit_2(tiny_config_file, tmp_path, capsys):
    assert main(["run", str(tiny_config_file), "--set", "es.popsize=4"]) == 2
    assert "es.popsize: unknown field" in capsys.readouterr().err
    assert main(["resume", str(tmp_path / "nowhere")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nowhere")]) == 2
    assert "run directory not found" in capsys.readouterr().err


def test_several_runs_evaluated_together_train_each_baseline_once(reference_run, tmp_path,
                                                                  capsys):
    runs = [shutil.copytree(reference_run, tmp_path / name) for name in ("a", "b")]
    for run in runs:
        shutil.rmtree(run / "evaluations", ignore_errors=True)
    flags = ["--seeds", "3", "--baselines", "l2", "--no-cache"]  # as the test below
    assert main(["evaluate", *map(str, runs), *flags]) == 0
    out = capsys.readouterr().out
    # copies of one run: its evolved row and l2's are trained for the first, reused after
    assert "training store in memory: 2 reused, 2 trained" in out
    assert out.count("saved") == 2 and f"== {runs[1]}" in out
    first, second = (json.loads((run / "evaluations" / "1.json").read_text()) for run in runs)
    assert first["results"] == second["results"]  # copies of one run: every row the same
    # alone, without a store on disk, a run trains its rows again and gets the same ones
    assert main(["evaluate", str(runs[0]), *flags, "--rerun"]) == 0
    assert "training store in memory: 0 reused, 2 trained" in capsys.readouterr().out
    again = json.loads((runs[0] / "evaluations" / "1.json").read_text())
    assert again["results"] == first["results"]


def test_evaluate_compares_the_evolved_objective_with_baselines(reference_run, capsys):
    assert main(["evaluate", str(reference_run), "--seeds", "3", "--baselines", "l2"]) == 0
    table = capsys.readouterr().out
    assert "evolved" in table and "l2" in table and "95% CI" in table
    report = json.loads((reference_run / "evaluations" / "1.json").read_text())
    assert [r["objective"] for r in report["results"]] == ["evolved", "l2"]
    for result in report["results"]:
        assert len(result["returns"]) == 3 and result["invalid"] == 0
        assert result["ci_low"] <= result["mean"] <= result["ci_high"]
        assert len(result["curves"]) == 3 and len(result["curves"][0]) == 32  # updates
        assert result["mean"] > 9.0  # CartPole gives at least ~9 steps per episode
    # per environment: every objective's aggregates and the paired verdict, also printed
    cartpole = report["statistics"]["environments"]["CartPole-v1"]
    assert set(cartpole["objectives"]) == {"evolved", "l2"}
    [judged] = cartpole["comparisons"]
    assert (judged["evolved"], judged["baseline"], judged["paired"]) == ("evolved", "l2", True)
    assert judged["low"] <= judged["probability_of_improvement"] <= judged["high"]
    assert judged["verdict"] in ("better", "no difference found", "worse")
    assert any(line.startswith("CartPole-v1") and line.endswith(judged["verdict"])
               for line in table.splitlines())
