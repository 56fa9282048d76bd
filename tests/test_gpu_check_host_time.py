"""``benchmarks/gpu_check.py``'s host time between steps: its ``--timed-run`` runs ``metarl
run`` with the evolution program's ``step`` wrapped to note when each step is dispatched and
when it is ready, and :func:`host_times` turns those into the seconds between one step's end
and the next one's dispatch."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from _subprocess_env import env_without_device_count, jax_cache_env

from metarl.runs.layout import read_metrics

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _gpu_check():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("gpu_check", BENCHMARKS / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_times_are_the_gaps_between_one_step_and_the_next(tmp_path):
    timings = tmp_path / "times.json"
    timings.write_text(json.dumps({"steps": [[0.0, 1.0], [1.5, 3.0], [3.25, 4.0]]}))
    assert _gpu_check().host_times(timings) == {
        "step_compute_seconds": [1.0, 1.5, 0.75], "host_seconds": [0.5, 0.25],
        "host_seconds_median": 0.375}
    assert _gpu_check().host_times(tmp_path / "missing.json") == {"host_seconds": None}


def test_a_timed_run_is_the_command_with_each_step_noted(tiny_config_file, tmp_path):
    timings, run_dir = tmp_path / "times.json", tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--timed-run", str(timings), "run",
         str(tiny_config_file), "--set", "es.generations=3", "--run-dir", str(run_dir),
         "--no-plots"], capture_output=True, text=True, timeout=400,
        env=env_without_device_count(**jax_cache_env()))
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2, 3]
    steps = json.loads(timings.read_text())["steps"]
    assert len(steps) == 3
    # each step is dispatched after the one before it is ready
    assert all(start < end for start, end in steps)
    assert all(before[1] <= after[0] for before, after in zip(steps, steps[1:], strict=False))
    times = _gpu_check().host_times(timings)
    assert len(times["host_seconds"]) == 2 and min(times["host_seconds"]) >= 0
