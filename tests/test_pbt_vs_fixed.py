"""Tests of experiments/pbt_vs_fixed.py.

- Its statistics, and the tuned arm's choice of setting and seeds, against hand-computed
  cases.
- Learning: on a small PPO CartPole task whose learning-rate prior spans four decades (most
  draws learn slowly), PBT's area under the population's median return curve is above the
  fixed population's, seed by seed (4 seeds as one vmapped program, with the script's own
  arms; the full-size experiment is too long for the tests). The same compiled program
  tunes a setting on the script's tuning seeds and starts the tuned arm with it.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import PPOConfig, make_learner
from metarl.population.pbt import PBTConfig
from metarl.population.priors import Prior

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


def test_best_setting_takes_the_highest_score_then_the_larger_area_and_ranks_nan_last():
    script = load_script()
    nan = math.nan
    assert script.best_setting([3.0, 5.0, 1.0], [9.0, 0.0, 9.0]) == 1  # score first
    assert script.best_setting([3.0, 5.0, 5.0, 1.0], [0.0, 1.0, 2.0, 9.0]) == 2  # tie: area
    assert script.best_setting([5.0, 5.0], [1.0, 1.0]) == 0  # full tie: the first
    assert script.best_setting([nan, -2.0, -1.0], [100.0, 0.0, 0.0]) == 2  # NaN score last
    assert script.best_setting([5.0, 5.0, 4.0], [nan, -10.0, 50.0]) == 1  # NaN area last
    assert script.best_setting([nan, nan], [1.0, 2.0]) == 1  # all NaN: still by area


def test_seed_lists_keep_the_tuning_seeds_apart_from_the_held_out_ones():
    script = load_script()
    seeds, tuning = script.seed_lists(8, 2)
    assert seeds == list(range(1000, 1008)) and tuning == [2000, 2001]
    assert len(script.seed_lists(1000, 5)[0]) == 1000  # 1000-1999: still apart
    with pytest.raises(ValueError, match="tuning seeds"):
        script.seed_lists(1001, 1)


# ----------------------------------------------------------------------- learning


# 8 segments of 16 updates of 4 x 32 steps: 16k steps per member, 4 members. The prior
# spans 1e-5 to 1e-1: a fixed population mostly holds rates too small to learn in this
# budget (or too large to be stable), which PBT's worst half replaces by copies of its best.
SMALL_PPO = PPOConfig(num_envs=4, num_steps=32, total_timesteps=4 * 32 * 16 * 8,
                      update_epochs=2, num_minibatches=2, hidden_sizes=(32, 32))
SMALL_PBT = PBTConfig(population_size=4, segment_updates=16, exploit_fraction=0.5,
                      fitness_window=2, reseed_copies=True,
                      priors={"learning_rate": Prior(1e-5, 1e-1, log=True)})
SMALL_SEEDS = [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_pbt_beats_the_fixed_population_on_a_small_task_seed_by_seed():
    script = load_script()
    learner = make_learner(SMALL_PPO)
    segments = SMALL_PPO.num_updates // SMALL_PBT.segment_updates
    population = script.Population(learner, SMALL_PBT, "auto")
    arms = {name: population.train(SMALL_SEEDS, segments, exploit=name == "pbt")
            for name in ("pbt", "fixed")}
    area = {name: script.member_scores(arm["fitness"])[1].mean(axis=1)  # [seeds]
            for name, arm in arms.items()}
    difference = script.paired(area["pbt"], area["fixed"])
    print(f"area under the median return curve: pbt {area['pbt'].round(1)}, "
          f"fixed {area['fixed'].round(1)}")
    # Measured on root seeds 0-3, 100-103, 1000-1003 and 2000-2003: the fixed population's
    # area 26 to 198, PBT above it on 16 of 16 seeds by 29 to 274, the mean difference over
    # 4 seeds 102 to 131 (on these seeds +39, +130, +107, +134).
    assert difference["seeds_above"] >= 3, difference
    assert difference["mean"] > 40.0, difference

    # The tuned arm: chosen on the script's tuning seeds (as many populations as above, so
    # the compiled programs serve them), started on the held-out seeds for one segment.
    tuning_seeds = script.seed_lists(len(SMALL_SEEDS), len(SMALL_SEEDS))[1]
    assert not set(tuning_seeds) & (set(SMALL_SEEDS) | set(script.seed_lists(8, 1)[0]))
    tuning = script.tune(population, tuning_seeds, segments)
    assert tuning["seeds"] == tuning_seeds
    drawn = population.init(
        jnp.stack([jax.random.split(jax.random.PRNGKey(seed))[0] for seed in tuning_seeds]))[1]
    for name, values in tuning["candidates"].items():  # the tuning seeds' own draws
        assert values == np.asarray(getattr(drawn, name)).reshape(-1).tolist(), name
    scores = np.nan_to_num(np.asarray(tuning["scores"]), nan=-np.inf)
    areas = np.nan_to_num(np.asarray(tuning["areas"]), nan=-np.inf)
    best = np.flatnonzero(scores == scores.max())
    index = tuning["chosen_index"]
    assert index in best and areas[index] == areas[best].max(), tuning
    assert tuning["chosen"] == {name: values[index]
                                for name, values in tuning["candidates"].items()}
    assert tuning["chosen_score"] == scores.max()
    compiled = population.segment._cache_size()
    tuned = population.train(SMALL_SEEDS, 1, exploit=False, hypers_override=tuning["chosen"])
    assert population.segment._cache_size() == compiled  # new values, no new compilation
    for name, value in tuning["chosen"].items():
        assert np.all(np.asarray(tuned["hypers"][name]) == value), (name, tuned["hypers"])
    assert len(set(tuned["fitness"].reshape(-1).tolist())) > 1  # members still differ
    with pytest.raises(ValueError, match="no prior"):
        population.check_override({"gamma": 0.9})
