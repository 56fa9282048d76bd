"""Runs that stop on time (:mod:`metarl.runs.stopping`): a time limit and SIGTERM/SIGINT
stop a run cleanly, its last completed step checkpointed, with exit code 4, and
``metarl resume`` then reaches exactly the run that was never stopped.

- The time rule, on a clock the test advances by hand (each step "takes" 10 s): where a run
  of the tiny evolution stops, the checkpoint ``run.checkpoint_every`` would have skipped,
  the status, and a step abandoned in flight when the time left only covers the stop; the
  same for replicated evolution (several runs advanced by one joint step).
- SIGTERM to ``metarl run`` in a subprocess while its second step trains (an evolution
  generation and a PBT segment): it exits within 30 s with code 4, the step in flight lost,
  and the run resumes into the uninterrupted one.
- ``--time-limit`` on the command line (the tiny evolution), a second signal inside a
  checkpoint save, and bad durations.

The tiny evolution (``tests/_tiny_evolution.py``) shares its compiled generation with the
other run-directory tests. The SIGTERM tests need a step that is still training when the
signal lands: ``tests/_held_step.py`` holds the subprocess's second step in flight in an XLA
loop that would run for hours, so their runs are the tiny evolution (its uninterrupted run
is the module's reference) and a PBT run of two short segments. (Before, the steps were made
slow instead, some 27 CPU-s a generation, and the run, its reference and its resume each
paid for that.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from _subprocess_env import jax_cache_env
from _tiny_evolution import GENERATIONS, KILL_WORKER

from metarl.cli import main
from metarl.evolve.kind import EvolveProgram
from metarl.evolve.replicated import ReplicatedProgram
from metarl.kinds import load_experiment, load_run, resume, start
from metarl.runs import stopping
from metarl.runs.layout import RunInterrupted, read_metrics
from metarl.runs.listing import format_runs, run_info
from metarl.runs.lock import lock_holder
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, load_meta_params

TIMINGS = ("seconds", "agent_steps_per_second", "time")
STOP_WITHIN = 30.0  # seconds from SIGTERM to the end of the process, a step in flight
HELD_STEP = Path(__file__).parent / "_held_step.py"
# Two segments of 8 updates (of 2 x 16 steps) each; checkpoint_every = 2, so that segment 1
# has a checkpoint only if the stop writes it.
SHORT_PBT = """
kind = "pbt"
name = "short_pbt"
[inner]
algorithm = "ppo"
env_id = "CartPole-v1"
num_envs = 2
num_steps = 16
total_timesteps = 512
hidden_sizes = [8]
update_epochs = 1
num_minibatches = 1
[pbt]
population_size = 4
segment_updates = 8
exploit_fraction = 0.25
[pbt.priors.learning_rate]
low = 1e-4
high = 1e-2
log = true
[run]
checkpoint_every = 2
progress = false
"""


# --------------------------------------------------------------------------------------
# helpers


def lines(run_dir: Path) -> list[dict]:
    """``metrics.jsonl``'s step lines without their timings."""
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in read_metrics(run_dir)]


def assert_same_trees(ours, theirs) -> None:
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for mine, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(want))


def assert_same_run(run_dir: Path, reference: Path, meta_params: bool = True) -> None:
    """Every line but its timings, the meta-parameter files (evolution) and the whole
    state of the newest checkpoint, bit for bit."""
    assert lines(run_dir) == lines(reference)
    if meta_params:
        for name in (BEST_FILE, MEAN_FILE):
            assert_same_trees(load_meta_params(run_dir / name),
                              load_meta_params(reference / name))
    assert_same_trees(load_run(run_dir).state, load_run(reference).state)


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def assert_clean(run_dir: Path) -> None:
    """No half-written file and no lock held."""
    assert not [p for p in run_dir.rglob("*") if "tmp" in p.name], list(run_dir.rglob("*"))
    assert lock_holder(run_dir) is None


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """A :class:`Clock` for every stopper, and evolution steps that each take 10 s of it."""
    fake = Clock()
    monkeypatch.setattr(stopping, "monotonic", fake)
    for program in (EvolveProgram, ReplicatedProgram):
        original = program.step

        def step(self, state, original=original):
            out = jax.block_until_ready(original(self, state))
            fake.now += 10.0
            return out

        monkeypatch.setattr(program, "step", step)
    return fake


def cli_env() -> dict[str, str]:
    # as many devices as this process, so that a run the CLI started continues here exactly
    return {**os.environ, **jax_cache_env(), "JAX_NUM_CPU_DEVICES": str(jax.device_count()),
            "PYTHONUNBUFFERED": "1"}


def start_cli(args: list, log: Path, held: str | None = None) -> subprocess.Popen:
    """``python -m metarl.cli ARGS``, its output to ``log``; with ``held`` (a program class,
    ``module:Class``), the same command line through ``tests/_held_step.py``, which holds
    that program's step 2 in flight."""
    handle = open(log, "w")  # noqa: SIM115 - closed by finish()
    command = ["-m", "metarl.cli"] if held is None else [str(HELD_STEP), held]
    process = subprocess.Popen([sys.executable, *command, *map(str, args)],
                               env=cli_env(), stdout=handle, stderr=subprocess.STDOUT)
    process.log_file, process.log = handle, log
    return process


def finish(process: subprocess.Popen, timeout: float) -> str:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.log_file.close()
    return process.log.read_text()


def sigterm_in_second_step(held: str, args: list, recorded, log: Path
                           ) -> tuple[int, float, str]:
    """Start ``metarl ARGS`` with step 2 of the program class ``held`` held in flight
    (``tests/_held_step.py``), wait until ``recorded()`` says step 1 is written and the
    worker says step 2 is held, give it half a second to be waiting inside the computation,
    and send SIGTERM. Returns the exit code, the seconds from the signal to the process's
    end and its output."""
    process = start_cli(args, log, held=held)
    try:
        deadline = time.monotonic() + 400
        while not (recorded() and "HOLDING_IN_STEP 2" in log.read_text()):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "step 1 never ended or step 2 never started"
            time.sleep(0.02)
        time.sleep(0.5)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output = finish(process, STOP_WITHIN + 30)
        return process.returncode, time.monotonic() - signalled, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.log_file.close()


def assert_stopped_in_flight(code: int, seconds: float, output: str, run_dir: Path,
                             step_key: str) -> None:
    """What a SIGTERM during step 2 leaves: exit code 4 within STOP_WITHIN seconds, the
    lines saying so, step 1 checkpointed (``run.checkpoint_every = 2`` skipped it), the
    status, no half-written file, no lock."""
    assert code == 4, output
    assert seconds < STOP_WITHIN, (seconds, output)
    assert "SIGTERM received: stopping cleanly" in output
    assert (f"stopped by SIGTERM after {step_key} 1 (checkpoint 1 saved); {step_key} 2 was "
            f"in flight and is lost. `metarl resume {run_dir}` continues it") in output, output
    assert [line[step_key] for line in read_metrics(run_dir)] == [1]
    assert checkpoints(run_dir) == ["1"]
    saved = status(run_dir)
    assert (saved["state"], saved["reason"], saved[step_key]) == ("stopped", "SIGTERM", 1)
    assert saved["resume"] == f"metarl resume {run_dir}"
    assert run_info(run_dir).state == "stopped"
    assert_clean(run_dir)


# --------------------------------------------------------------------------------------
# durations


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("90s", 90.0), ("9m", 540.0), ("2h", 7200.0), ("1h30m", 5400.0),
    ("1.5h", 5400.0), ("1h2m3s", 3723.0), (" 9M ", 540.0), (45, 45.0), (0.5, 0.5)])
def test_a_duration_reads_in_seconds(text, seconds):
    assert stopping.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "9 m", "1m1h", "5x", "m", "1h1h", "", "0", "-5",
                                  "0s", "inf", "nan"])
def test_a_bad_duration_is_refused_by_the_command_line(tiny_config_file, text, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(tiny_config_file), "--time-limit", text])
    assert exit_.value.code == 2
    assert "argument --time-limit:" in capsys.readouterr().err


def test_a_bad_time_limit_from_python_names_it(tiny_config_file, tmp_path):
    from metarl.config import ConfigError

    with pytest.raises(ConfigError, match=r"time_limit: 'soon' is not a duration"):
        start(load_experiment(tiny_config_file), tmp_path / "never", time_limit="soon")
    assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------------------
# the time rule, on a clock the test advances


@pytest.fixture(scope="module")
def reference(tiny_config_file, tmp_path_factory) -> Path:
    """An uninterrupted run of the tiny evolution (GENERATIONS generations)."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference"
    start(load_experiment(tiny_config_file), run_dir)
    return run_dir


def test_a_time_limit_stops_before_the_step_that_would_not_fit(clock, tiny_config_file,
                                                              reference, tmp_path):
    """Each generation takes 10 s (saves take none), the limit is 37 s, a save not yet
    timed counts 5 s and the exit 5 s. Before generation 1: 37 s left >= 1.5 * 0 + 5 + 5;
    before 2: 27 >= 1.5 * 10 + 5 + 5 = 25; before 3: 17 < 25, so it stops after 2, and
    saves checkpoint 2, which ``run.checkpoint_every = 3`` skipped. Resumed without a
    limit, it is the uninterrupted run."""
    run_dir = tmp_path / "limited"
    with pytest.raises(RunInterrupted) as stop:
        start(load_experiment(tiny_config_file, ["run.checkpoint_every=3"]), run_dir,
              time_limit=37)
    assert (stop.value.step, stop.value.abandoned, stop.value.run_dir) == (2, False, run_dir)
    assert str(stop.value) == (
        "stopped by the time limit (17 s left; the next step and a stop after it may take "
        f"25 s) after generation 2 (checkpoint 2 saved). `metarl resume {run_dir}` "
        "continues it")
    assert clock.now == 20.0
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2]
    assert checkpoints(run_dir) == ["2"]
    saved = status(run_dir)
    assert saved["state"] == "stopped" and saved["generation"] == 2
    assert saved["reason"].startswith("the time limit (17 s left")
    assert run_info(run_dir).state == "stopped"
    assert "stopped  2/5" in format_runs([run_info(run_dir)], tmp_path)
    assert "by the time limit; resumes from checkpoint 2" in format_runs([run_info(run_dir)])
    assert_clean(run_dir)

    result = resume(run_dir, time_limit="1h")
    assert int(result.state.generation) == GENERATIONS
    assert status(run_dir)["state"] == "finished"
    assert "reason" not in status(run_dir)  # what the stop said went with it
    assert_same_run(run_dir, reference)


def test_a_step_that_would_overrun_the_limit_is_abandoned(tiny_config_file, monkeypatch,
                                                         tmp_path):
    """Generation 1 takes no time, generation 2 10 s at once and then never ends. With a
    limit of 14 s, generation 2 starts (14 >= 1.5 * 0 + 5 + 5); once 4 s are left, not
    enough for the stop (5 s to save generation 1, which ``run.checkpoint_every = 3``
    skipped, and 5 to exit), it is abandoned in flight, and generation 1 is saved from the
    state the engine still holds."""
    clock = Clock()
    monkeypatch.setattr(stopping, "monotonic", clock)
    release = threading.Event()
    original = EvolveProgram.step

    def step_that_hangs(self, state):
        if self.completed(state) + 1 == 2:
            clock.now += 10.0
            release.wait(60)
        return original(self, state)

    monkeypatch.setattr(EvolveProgram, "step", step_that_hangs)
    run_dir = tmp_path / "overrun"
    try:
        with pytest.raises(RunInterrupted) as stop:
            start(load_experiment(tiny_config_file, ["run.checkpoint_every=3"]), run_dir,
                  time_limit=14)
    finally:
        release.set()
    assert (stop.value.step, stop.value.abandoned) == (1, True)
    assert str(stop.value) == (
        "stopped by the time limit (4 s left: enough to stop, not to go on) after generation "
        "1 (checkpoint 1 saved); generation 2 was in flight and is lost. "
        f"`metarl resume {run_dir}` continues it")
    assert checkpoints(run_dir) == ["1"] and len(read_metrics(run_dir)) == 1
    assert_clean(run_dir)


@pytest.mark.timeout(600)
def test_replicated_runs_stop_after_the_same_joint_step(clock, tiny_config_file, tmp_path):
    """Two evolution seeds advanced by one joint step stop together; the stop names their
    parent, which resumes both into the uninterrupted replicated run."""
    config = load_experiment(tiny_config_file, ["es.generations=3", "es.evolution_seeds=2",
                                                "run.checkpoint_every=3"])
    reference = tmp_path / "reference"
    start(config, reference)
    parent = tmp_path / "joint"
    clock.now = 0.0
    with pytest.raises(RunInterrupted) as stop:
        start(config, parent, time_limit=37)  # as in the test of one run above
    assert stop.value.run_dir == parent and stop.value.step == 2
    assert str(stop.value) == (
        "stopped by the time limit (17 s left; the next step and a stop after it may take "
        "25 s) after seed_0: generation 2 (checkpoint 2 saved), seed_1: generation 2 "
        f"(checkpoint 2 saved). `metarl resume {parent}` continues it")
    for seed in ("seed_0", "seed_1"):
        assert checkpoints(parent / seed) == ["2"]
        assert status(parent / seed)["resume"] == f"metarl resume {parent}"
    resume(parent)
    for seed in ("seed_0", "seed_1"):
        assert_same_run(parent / seed, reference / seed)


# --------------------------------------------------------------------------------------
# SIGTERM while a step trains, in a subprocess


@pytest.mark.timeout(600)
def test_sigterm_during_a_generation_stops_within_seconds_and_resumes_exactly(
        tiny_config_file, reference, tmp_path):
    """The tiny evolution with ``run.checkpoint_every = 2`` (so that generation 1 has a
    checkpoint only if the stop writes it), generation 2 held in flight; resumed, it is the
    module's uninterrupted reference."""
    run_dir = tmp_path / "signalled"
    code, seconds, output = sigterm_in_second_step(
        "metarl.evolve.kind:EvolveProgram",
        ["run", tiny_config_file, "--set", "run.checkpoint_every=2", "--run-dir", run_dir,
         "--no-plots"],
        lambda: (run_dir / MEAN_FILE).exists(), tmp_path / "run.log")
    assert_stopped_in_flight(code, seconds, output, run_dir, "generation")
    result = resume(run_dir)
    assert int(result.state.generation) == GENERATIONS
    assert_same_run(run_dir, reference)


@pytest.mark.timeout(600)
def test_sigterm_during_a_pbt_segment_stops_within_seconds_and_resumes_exactly(tmp_path):
    """Two short PBT segments, segment 2 held in flight; resumed through the command line,
    the run is the uninterrupted one started here (which compiles the segment for the
    subprocess, through the persistent cache)."""
    experiment = tmp_path / "short_pbt.toml"
    experiment.write_text(SHORT_PBT)
    reference = start(load_experiment(experiment), tmp_path / "reference").run_dir
    run_dir = tmp_path / "signalled"
    code, seconds, output = sigterm_in_second_step(
        "metarl.population.pbt_run:PBTProgram",
        ["run", experiment, "--run-dir", run_dir, "--no-plots"],
        lambda: (run_dir / "metrics.jsonl").is_file() and bool(read_metrics(run_dir)),
        tmp_path / "run.log")
    assert_stopped_in_flight(code, seconds, output, run_dir, "segment")
    assert main(["resume", str(run_dir), "--no-plots"]) == 0
    assert_same_run(run_dir, reference, meta_params=False)


@pytest.mark.timeout(300)
def test_the_command_lines_time_limit_stops_in_time(tiny_config_file, tmp_path):
    """``--time-limit 4s`` on a budget of 100,000 tiny generations (far more than fit in
    the bound below): the command ends with exit code 4 within the limit (plus Python's
    start, which it does not count), its last completed generation checkpointed and the
    status saying how to resume. That a stopped run resumes into the uninterrupted one is
    shown above for the same engine path; the tiny evolution's compiled generation comes
    from the persistent cache, so this costs little more than the limit."""
    run_dir = tmp_path / "limited"
    started = time.monotonic()
    process = start_cli(["run", tiny_config_file, "--set", "es.generations=100000",
                         "--run-dir", run_dir, "--no-plots", "--time-limit", "4s"],
                        tmp_path / "run.log")
    output = finish(process, 120)
    elapsed = time.monotonic() - started
    assert process.returncode == 4, output
    # generous: Python and JAX import slowly beside the suite's other worker
    assert elapsed < 4 + 90, elapsed
    assert "stopped by the time limit" in output and f"metarl resume {run_dir}" in output
    done = len(read_metrics(run_dir)) if (run_dir / "metrics.jsonl").exists() else 0
    assert done < 100000
    assert status(run_dir)["state"] == "stopped" and status(run_dir)["generation"] == done
    if done:  # the newest checkpoint is the last completed generation
        assert max(int(name) for name in checkpoints(run_dir)) == done
    assert_clean(run_dir)


# --------------------------------------------------------------------------------------
# a second signal


@pytest.mark.timeout(600)
def test_a_second_signal_ends_the_process_at_once_and_the_run_still_resumes(
        tiny_config_file, reference, tmp_path):
    """The first SIGTERM arrives while checkpoint 3 is being saved (the kill worker holds
    the save there, its files written into orbax's temporary directory): the run would stop
    after that save. The second ends the process at once, exit code 128 + 15, the save
    never committed: the resume skips the temporary directory, continues from checkpoint 2
    and equals the uninterrupted run."""
    run_dir = tmp_path / "twice"
    env = {**cli_env(), "METARL_TEST_PAUSE_WITHIN": ""}
    process = subprocess.Popen(
        [sys.executable, str(KILL_WORKER), "3", str(tiny_config_file), "--run-dir",
         str(run_dir), "--no-plots"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        line = ""
        while "PAUSED_IN_SAVE" not in line:
            assert process.poll() is None and time.monotonic() < deadline, "no pause"
            line = process.stdout.readline()
        process.send_signal(signal.SIGTERM)
        while "SIGTERM received" not in line:  # the first is acknowledged at once
            assert process.poll() is None and time.monotonic() < deadline, "no answer"
            line = process.stdout.readline()
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=STOP_WITHIN)[0]
        assert time.monotonic() - signalled < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "a second signal (SIGTERM): exiting at once" in output
    assert lock_holder(run_dir) is None
    assert checkpoints(run_dir) == ["1", "2", "3.orbax-checkpoint-tmp"], output
    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        result = resume(run_dir)
    assert int(result.state.generation) == GENERATIONS
    assert_same_run(run_dir, reference)
