"""The throughput benchmark runs end to end and reports what the README quotes from it."""

import json
import math
import subprocess
import sys
from pathlib import Path

from _subprocess_env import env_without_device_count, jax_cache_env

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_throughput_benchmark_reports_best_and_median_per_device_count():
    # one PPO update per agent (4 envs x 128 steps): the smallest run the settings allow
    command = [sys.executable, str(BENCHMARKS / "throughput.py"), "--populations", "2",
               "--devices", "1", "2", "--total-timesteps", "512", "--repeats", "3"]
    out = subprocess.run(command, env=env_without_device_count(**jax_cache_env()),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["env"] == "CartPole-v1"
    assert [(r["population"], r["devices"]) for r in report["results"]] == [(2, 1), (2, 2)]
    for row in report["results"]:
        assert row["agent_steps"] == 2 * 512
        assert len(row["run_seconds"]) == 3
        assert row["agent_steps_per_second"] >= row["median_agent_steps_per_second"] > 0
        assert math.isfinite(row["final_return_mean"])
        assert row["peak_rss_mb"] > 0
    # the same keys train the same agents whether or not the population is sharded
    one, two = report["results"]
    assert math.isclose(one["final_return_mean"], two["final_return_mean"], rel_tol=1e-5)
