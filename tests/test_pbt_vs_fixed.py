"""The statistics of experiments/pbt_vs_fixed.py against hand-computed cases (the
experiment itself is too long for the tests)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "pbt_vs_fixed.py"


def load_script():
    spec = importlib.util.spec_from_file_location("pbt_vs_fixed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_to_reach_takes_the_first_point_at_the_threshold_and_censors_the_rest():
    script = load_script()
    curves = [[100.0, 480.0, 500.0],   # above from the second point on
              [475.0, 200.0, 500.0],   # at the threshold from the start (and dips after)
              [10.0, 20.0, math.nan]]  # never: counted as the whole budget
    reached_at, reached = script.steps_to_reach(curves, 475.0, [10, 20, 30])
    assert reached_at.tolist() == [20, 10, 30]
    assert reached.tolist() == [True, True, False]


def test_member_scores_rank_nan_members_last():
    script = load_script()
    best, median = script.member_scores([[1.0, math.nan, 3.0, 2.0], [math.nan] * 4])
    assert best[0] == 3.0 and median[0] == 1.5  # median of 1, -inf, 3, 2
    assert best[1] == -math.inf


def test_paired_differences_count_seeds_and_keep_them_together():
    script = load_script()
    result = script.paired([3.0, 5.0, 2.0], [1.0, 5.0, 4.0])
    assert result["per_seed"] == [2.0, 0.0, -2.0]
    assert result["mean"] == 0.0
    assert (result["seeds_above"], result["seeds_equal"], result["seeds_below"]) == (1, 1, 1)
    low, high = result["ci95"]
    assert -2.0 <= low <= 0.0 <= high <= 2.0
    # a constant shift on every seed is known exactly, however different the seeds are
    shifted = script.paired([10.0, 500.0, -3.0], [9.0, 499.0, -4.0])
    assert shifted["ci95"] == [1.0, 1.0] and shifted["seeds_above"] == 3
    assert np.isclose(script.summary([1.0, 2.0, 3.0])["mean"], 2.0)
