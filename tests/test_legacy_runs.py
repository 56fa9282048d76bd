"""Run directories written by metarl 0.1 (before algorithms were chosen by name and before
``chunk_size`` took ``"auto"``) still resume, and continue exactly as they would have.

``tests/data/run_0_1`` is a 2-generation run of a tiny value-distance experiment written by
that version (its ``config.json`` names no algorithm and says ``chunk_size = 0``);
``run_0_1_mean_after_3.msgpack`` is the search mean that version reached running the same
experiment straight for 3 generations.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
from _xla import learning_env

from metarl.kinds import load_run, read_config
from metarl.runs.meta_params import MEAN_FILE, load_meta_params

DATA = Path(__file__).parent / "data"


def test_a_run_of_metarl_0_1_resumes_and_continues_exactly(tmp_path):
    run_dir = tmp_path / "old_run"
    shutil.copytree(DATA / "run_0_1", run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    assert "algorithm" not in saved["inner"][0] and saved["run"]["chunk_size"] == 0

    config = read_config(run_dir)
    assert config.run.chunk_size == "auto"
    assert type(config.inner[0]).__name__ == "PPOConfig"

    # resumed in a process with the code generation that version ran under (level 1,
    # XLA's default emitters): this suite's quicker-to-compile flags round differently
    resume = f"from metarl.kinds import resume; resume({str(run_dir)!r}, generations=3)"
    subprocess.run([sys.executable, "-c", resume], env=learning_env(), check=True,
                   capture_output=True, timeout=600)
    result = load_run(run_dir)
    assert [line["generation"] for line in result.history] == [1, 2, 3]
    expected = load_meta_params(DATA / "run_0_1_mean_after_3.msgpack")
    reached = load_meta_params(run_dir / MEAN_FILE)
    for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(reached), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
