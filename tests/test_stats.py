"""Statistics of held-out returns (:mod:`metarl.stats`): aggregate estimates, the
probability of improvement, the verdict rule and performance profiles, checked against
values worked out by hand; then the verdicts an evaluation record holds and prints.

No agent is trained here: the scores are planted arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from metarl import stats
from metarl.evolve.evaluate import environment_statistics, format_table, held_out_scores
from metarl.evolve.judging import comparison_pairs

# 12 scores with a long upper tail: the IQM (the mean of the middle half) differs from
# both the mean and the median.
SKEWED = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 50.0, 8.0])


# --------------------------------------------------------------------------------------
# aggregate estimates


def test_iqm_median_and_mean_are_the_textbook_values_with_intervals_around_them():
    found = stats.aggregates(SKEWED)
    assert found["iqm"].value == pytest.approx(scipy_stats.trim_mean(SKEWED, 0.25))
    # by hand: sorted 1 1 2 3 3 4 5 5 6 8 9 50; the middle six are 3 3 4 5 5 6
    assert found["iqm"].value == pytest.approx(26 / 6)
    assert found["median"].value == pytest.approx(4.5)
    assert found["mean"].value == pytest.approx(97 / 12)
    for estimate in found.values():
        assert estimate.low <= estimate.value <= estimate.high
        assert estimate.low < estimate.high
    # the outlier widens the mean's interval far more than the IQM's
    assert (found["mean"].high - found["mean"].low) > 2 * (found["iqm"].high - found["iqm"].low)


def test_one_task_intervals_match_rliables_stratified_bootstrap():
    """Over one task the interval is scipy's vectorised bootstrap of the runs, the same
    percentile bootstrap rliable's (per-resample) loop draws: the two agree to within
    resampling noise (measured: under 6% of the interval's width at 2000 resamples)."""
    from rliable import library, metrics

    rng = np.random.default_rng(4)
    scores = rng.normal(300.0, 40.0, size=16)
    functions = {"iqm": metrics.aggregate_iqm, "mean": metrics.aggregate_mean,
                 "median": np.median}
    for name, function in functions.items():
        ours = stats.aggregate(scores, name)
        with stats._seeded_global_generator(0):
            _, intervals = library.get_interval_estimates(
                {name: scores[:, None]}, lambda x, f=function: np.array([f(x)]),
                method="percentile", reps=2000)
        low, high = np.asarray(intervals[name]).reshape(2)
        width = high - low
        assert abs(ours.low - low) < 0.1 * width and abs(ours.high - high) < 0.1 * width, (
            name, ours, low, high)
    thresholds = np.linspace(200.0, 400.0, 9)
    profile = stats.performance_profile({"x": scores}, thresholds)["x"]
    with stats._seeded_global_generator(0):
        _, bands = library.create_performance_profile(
            {"x": scores[:, None]}, thresholds, custom_profile_func=stats._fraction_above,
            reps=2000)
    band = np.asarray(bands["x"]).reshape(2, -1)
    # the band's ends move by 1/16 steps; they agree to within one run
    assert np.all(np.abs(profile.low - band[0]) <= 1 / 16 + 1e-9), (profile.low, band[0])
    assert np.all(np.abs(profile.high - band[1]) <= 1 / 16 + 1e-9), (profile.high, band[1])


def test_runs_by_tasks_pool_all_runs_for_the_iqm():
    scores = SKEWED.reshape(6, 2)
    assert stats.aggregate(scores, "iqm").value == pytest.approx(
        scipy_stats.trim_mean(SKEWED, 0.25))


def test_several_task_iqm_and_interval_are_rliables_to_the_bit():
    """Over several tasks the IQM and its stratified bootstrap interval are rliable's own
    (``aggregate_iqm`` in its bootstrap, from the same seed), with ties and odd sizes."""
    from rliable import library, metrics

    rng = np.random.default_rng(11)
    for runs, tasks in [(16, 3), (7, 5), (3, 2), (1, 4)]:
        scores = np.round(rng.normal(50.0, 20.0, size=(runs, tasks)))  # ties
        assert stats.point_estimate(scores, "iqm") == metrics.aggregate_iqm(scores)
        if runs < 2:
            continue
        ours = stats.aggregate(scores, "iqm", resamples=300, seed=2)
        with stats._seeded_global_generator(2):
            _, intervals = library.get_interval_estimates(
                {"iqm": scores}, lambda x: np.array([metrics.aggregate_iqm(x)]),
                method="percentile", reps=300)
        assert (ours.low, ours.high) == tuple(np.asarray(intervals["iqm"]).ravel())


def test_the_mean_interval_narrows_with_more_seeds():
    rng = np.random.default_rng(0)
    small, large = rng.normal(100.0, 10.0, size=8), rng.normal(100.0, 10.0, size=400)
    narrow, wide = stats.aggregate(large, "mean"), stats.aggregate(small, "mean")
    assert wide.low < small.mean() < wide.high
    assert narrow.low < large.mean() < narrow.high
    assert (narrow.high - narrow.low) < (wide.high - wide.low) / 3


def test_degenerate_samples_and_diverged_runs():
    assert stats.aggregate([500.0, 500.0], "iqm") == stats.Estimate(500.0, 500.0, 500.0)
    assert stats.aggregate([7.0], "mean") == stats.Estimate(7.0, 7.0, 7.0)
    assert all(math.isnan(v) for v in stats.aggregate([], "median").to_dict().values())
    # a NaN or inf (training diverged) is left out of the aggregates
    assert stats.aggregate([1.0, np.nan, 3.0, np.inf], "mean").value == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown 'max'"):
        stats.aggregate(SKEWED, "max")


def test_intervals_are_reproducible_and_leave_the_global_generator_alone():
    fast = {"resamples": 300}
    # the legacy global generator on purpose: rliable draws from it
    outside = np.random.get_state()  # noqa: NPY002
    try:
        np.random.seed(123)  # noqa: NPY002
        before = np.random.get_state()  # noqa: NPY002
        first = stats.aggregates(SKEWED, **fast)
        assert np.array_equal(np.random.get_state()[1], before[1])  # noqa: NPY002
        assert np.random.get_state()[2] == before[2]  # noqa: NPY002
        np.random.seed(999)  # noqa: NPY002 (another global state, the same intervals)
        assert stats.aggregates(SKEWED, **fast) == first
    finally:
        np.random.set_state(outside)  # noqa: NPY002
    other = SKEWED[::-1] + 0.5
    unpaired = stats.probability_of_improvement(SKEWED, other, paired=False, **fast)
    assert stats.probability_of_improvement(SKEWED, other, paired=False, **fast) == unpaired
    # another seed draws other resamples
    assert stats.aggregate(SKEWED, "iqm", seed=1, **fast) != first["iqm"]


# --------------------------------------------------------------------------------------
# probability of improvement


@pytest.mark.parametrize("paired", [True, False])
def test_completely_separated_samples_improve_with_probability_one(paired):
    low = np.arange(10.0)
    high = low + 100.0
    assert stats.probability_of_improvement(high, low, paired=paired, resamples=300
                                            ) == stats.Estimate(1.0, 1.0, 1.0)
    assert stats.probability_of_improvement(low, high, paired=paired, resamples=300
                                            ) == stats.Estimate(0.0, 0.0, 0.0)


def test_paired_probability_is_the_fraction_of_seeds_won_ties_counting_half():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    y = np.array([0.0, 2.0, 4.0, 3.0, 9.0, 1.0, 7.0, 0.0])
    # won on seeds 0, 3, 5, 7; tied on 1 and 6; lost on 2 and 4: (4 + 2 / 2) / 8
    estimate = stats.probability_of_improvement(x, y, paired=True)
    assert estimate.value == pytest.approx(5 / 8)
    assert estimate.low < 5 / 8 < estimate.high
    # unpaired, the same numbers are compared all against all: a different statistic
    wins = sum((a > b) + 0.5 * (a == b) for a in x for b in y) / 64
    unpaired = stats.probability_of_improvement(x, y, paired=False, resamples=300)
    assert unpaired.value == pytest.approx(wins)
    assert wins != pytest.approx(5 / 8)


def test_pairing_sees_a_small_gain_that_the_spread_between_seeds_hides():
    seeds = np.linspace(0.0, 300.0, 16)  # seeds differ far more than the objectives do
    x, y = seeds + 1.0, seeds
    paired = stats.probability_of_improvement(x, y, paired=True)
    unpaired = stats.probability_of_improvement(x, y, paired=False, resamples=500)
    assert paired == stats.Estimate(1.0, 1.0, 1.0)
    assert unpaired.low < 0.5 < unpaired.high


def test_unpaired_estimate_and_interval_are_rliables_to_the_bit():
    """Three tasks with ties, a diverged run and unequal run counts: the value and the
    interval equal those of rliable's own bootstrap of its own probability of improvement
    (scipy's Mann-Whitney U per task and resample), drawn from the same seed."""
    from rliable import library, metrics

    rng = np.random.default_rng(7)
    x = rng.integers(0, 6, size=(9, 3)).astype(np.float64)
    y = rng.integers(1, 7, size=(6, 3)).astype(np.float64)
    x[2, 1] = np.nan  # a diverged run ranks below every score
    estimate = stats.probability_of_improvement(x, y, paired=False, resamples=300, seed=3)

    ranked_x = np.where(np.isfinite(x), x, -np.inf)
    assert estimate.value == metrics.probability_of_improvement(ranked_x, y)
    with stats._seeded_global_generator(3):
        _, intervals = library.get_interval_estimates(
            {"x": [ranked_x, y]},
            lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
            method="percentile", reps=300)
    assert (estimate.low, estimate.high) == tuple(np.asarray(intervals["x"]).ravel())
    # identical samples tie exactly, as rliable's shortcut for them says
    assert stats.probability_of_improvement(y, y, paired=False, resamples=50).value == 0.5


def test_a_diverged_seed_ranks_below_every_score():
    x = np.array([np.nan, 5.0, 5.0, -np.inf])
    y = np.array([1.0, 1.0, np.nan, np.nan])
    # seed 0 lost, seeds 1 and 2 won, seed 3 tied (both diverged)
    assert stats.probability_of_improvement(x, y, paired=True).value == pytest.approx(2.5 / 4)


def test_paired_samples_need_the_same_seeds():
    with pytest.raises(ValueError, match="same seeds"):
        stats.probability_of_improvement([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)
    one = stats.probability_of_improvement([2.0], [1.0], paired=True)
    assert one.value == 1.0 and math.isnan(one.low) and math.isnan(one.high)
    assert stats.verdict(one.low, one.high) == "no difference found"


# --------------------------------------------------------------------------------------
# the verdict rule


@pytest.mark.parametrize("low, high, expected", [
    (0.51, 0.90, "better"),
    (1.0, 1.0, "better"),
    (0.10, 0.49, "worse"),
    (0.0, 0.0, "worse"),
    (0.50, 0.90, "no difference found"),  # touching 0.5 is not wholly above it
    (0.20, 0.50, "no difference found"),
    (0.30, 0.70, "no difference found"),
    (math.nan, math.nan, "no difference found"),
])
def test_the_verdict_needs_the_whole_interval_on_one_side_of_one_half(low, high, expected):
    assert stats.verdict(low, high) == expected
    assert stats.OUTCOMES == ("better", "no difference found", "worse")


# --------------------------------------------------------------------------------------
# performance profiles


def test_a_performance_profile_counts_the_runs_above_each_threshold():
    scores = {"a": np.array([1.0, 2.0, 3.0, 4.0]), "b": np.array([2.0, 2.0, np.nan, 10.0])}
    thresholds = np.array([0.0, 1.5, 2.0, 3.5, 10.0])
    profiles = stats.performance_profile(scores, thresholds, resamples=500)
    np.testing.assert_allclose(profiles["a"].fraction, [1.0, 0.75, 0.5, 0.25, 0.0])
    np.testing.assert_allclose(profiles["b"].fraction, [0.75, 0.75, 0.25, 0.25, 0.0])
    for profile in profiles.values():
        assert np.all(profile.low <= profile.fraction + 1e-12)
        assert np.all(profile.fraction <= profile.high + 1e-12)
        np.testing.assert_array_equal(profile.thresholds, thresholds)
    # rliable's own score distribution gives the same curve
    from rliable import library
    np.testing.assert_allclose(
        library.score_distributions(scores["a"][:, None], thresholds), profiles["a"].fraction)


def test_profile_thresholds_span_the_finite_scores():
    thresholds = stats.profile_thresholds([3.0, np.nan], [-1.0, 7.0], count=5)
    np.testing.assert_allclose(thresholds, [-1.0, 1.0, 3.0, 5.0, 7.0])
    assert stats.profile_thresholds([2.0, 2.0]).tolist() == [2.0]
    assert stats.profile_thresholds([np.nan]).size == 0


# --------------------------------------------------------------------------------------
# the verdicts of an evaluation record


def result(env_id, objective, returns, valid=None):
    mean = stats.aggregate(np.asarray(returns)[np.isfinite(returns)], "mean")
    found = {"env_id": env_id, "objective": objective, "returns": list(returns),
             "mean": mean.value, "ci_low": mean.low, "ci_high": mean.high,
             "invalid": int((~np.isfinite(returns)).sum()), "curves": []}
    if valid is not None:
        found["valid"] = valid
    return found


BASELINE = 100.0 + np.arange(16.0)
# evolved: far ahead on half the seeds and a little behind on the other half
UPSIDE = BASELINE + np.where(np.arange(16) % 2 == 0, 20.0, -5.0)


def test_a_mean_above_the_baselines_is_no_longer_enough_to_be_better():
    results = [result("CartPole-v1", "evolved", UPSIDE), result("CartPole-v1", "l2", BASELINE)]
    evolved, baseline = results
    # the old rule: the evolved mean's interval lies above the baseline's mean -> "better"
    assert evolved["ci_low"] > baseline["mean"]
    saved = environment_statistics(results, resamples=300)
    [comparison] = saved["environments"]["CartPole-v1"]["comparisons"]
    assert comparison["paired"] is True
    assert comparison["probability_of_improvement"] == pytest.approx(0.5)
    assert comparison["low"] < 0.5 < comparison["high"]
    assert comparison["verdict"] == "no difference found"


def test_a_clear_win_is_better_and_the_record_holds_every_aggregate():
    results = [result("CartPole-v1", "evolved", BASELINE + 10.0),
               result("CartPole-v1", "l2", BASELINE),
               result("CartPole-v1", "ppo", BASELINE + 30.0)]
    saved = environment_statistics(results)
    assert (saved["confidence"], saved["resamples"], saved["seed"]) == (0.95, 2000, 0)
    cartpole = saved["environments"]["CartPole-v1"]
    assert set(cartpole["objectives"]) == {"evolved", "l2", "ppo"}
    iqm = cartpole["objectives"]["l2"]["iqm"]
    assert iqm["value"] == pytest.approx(scipy_stats.trim_mean(BASELINE, 0.25))
    assert iqm["low"] <= iqm["value"] <= iqm["high"]
    assert set(cartpole["objectives"]["l2"]) == {"iqm", "median", "mean"}
    assert cartpole["comparisons"] == [
        {"evolved": "evolved", "baseline": "l2", "probability_of_improvement": 1.0,
         "low": 1.0, "high": 1.0, "paired": True, "verdict": "better"},
        {"evolved": "evolved", "baseline": "ppo", "probability_of_improvement": 0.0,
         "low": 0.0, "high": 0.0, "paired": True, "verdict": "worse"}]


def test_a_seed_marked_invalid_counts_as_diverged():
    returns = [5.0, 5.0, 5.0, 5.0]
    scores = held_out_scores(result("Pendulum-v1", "evolved", returns,
                                    valid=[True, False, True, True]))
    assert np.isnan(scores[1]) and np.isfinite(scores[[0, 2, 3]]).all()
    assert held_out_scores({"returns": [1.0, None]}).tolist()[0] == 1.0
    assert held_out_scores({}).size == 0


def test_comparison_pairs_judge_tuned_rows_only_against_tuned_rows():
    names = ["evolved", "l2", "ppo", "evolved (tuned)", "l2 (tuned)", "ppo (tuned)"]
    assert comparison_pairs(names) == [
        ("evolved", "l2"), ("evolved", "ppo"),
        ("evolved (tuned)", "l2 (tuned)"), ("evolved (tuned)", "ppo (tuned)")]
    assert comparison_pairs(["l2", "ppo"]) == []
    assert comparison_pairs(["evolved", "l2 (tuned)"]) == []


def test_the_table_prints_the_aggregates_and_each_verdict():
    results = [result("CartPole-v1", "evolved", UPSIDE), result("CartPole-v1", "l2", BASELINE),
               result("Acrobot-v1", "evolved", -BASELINE + 50.0),
               result("Acrobot-v1", "l2", -BASELINE)]
    report = {"metric": "mean_return", "results": results,
              "statistics": environment_statistics(results, resamples=300)}
    table = format_table(report)
    assert "mean_return IQM" in table and "95% CI" in table and "P(improvement)" in table
    lines = table.splitlines()
    iqm = report["statistics"]["environments"]["CartPole-v1"]["objectives"]["l2"]["iqm"]
    cells = f"{iqm['value']:.2f} [{iqm['low']:.2f}, {iqm['high']:.2f}]"
    assert any(ln.startswith("CartPole-v1  l2") and cells in " ".join(ln.split())
               for ln in lines), table
    assert any(ln.startswith("CartPole-v1  evolved    l2") and
               ln.endswith("no difference found") for ln in lines), table
    assert any(ln.startswith("Acrobot-v1   evolved    l2") and ln.endswith("better")
               for ln in lines), table
    assert "tie" not in table
    # the table shows the saved verdicts
    report["statistics"]["environments"]["Acrobot-v1"]["comparisons"][0]["verdict"] = "worse"
    assert any(ln.startswith("Acrobot-v1   evolved    l2") and ln.endswith("worse")
               for ln in format_table(report).splitlines())


def test_a_record_saved_without_statistics_gets_its_verdicts_from_the_returns():
    results = [result("Acrobot-v1", "evolved", -BASELINE + 50.0),
               result("Acrobot-v1", "l2", -BASELINE)]
    lines = format_table({"metric": "mean_return", "results": results}).splitlines()
    assert any(ln.startswith("Acrobot-v1   evolved    l2") and ln.endswith("better")
               for ln in lines), lines


def test_pooled_runs_on_shared_seeds_resample_the_seed_not_the_pair():
    x = np.array([[3.0, 1.0, 2.0, 5.0], [4.0, 0.0, 2.0, 6.0]])
    y = np.array([[2.0, 2.0, 2.0, 1.0]] * 2)  # one baseline evaluation read by both runs
    pooled = stats.pooled_probability_of_improvement(x, y, resamples=500)
    # run 0 wins seeds 0 and 3, ties seed 2; run 1 wins seeds 0 and 3, ties seed 2
    assert pooled.value == pytest.approx((2.5 + 2.5) / 8)
    # R copies of one run carry no more evidence than that run: the same interval as the
    # run alone (a pooled bootstrap of the R * S pairs would narrow it)
    one = stats.probability_of_improvement(x[0], y[0], paired=True, resamples=500)
    copies = stats.pooled_probability_of_improvement(np.stack([x[0]] * 3), np.stack([y[0]] * 3),
                                                     resamples=500)
    assert (copies.value, copies.low, copies.high) == pytest.approx((one.value, one.low,
                                                                     one.high))
    naive = stats.probability_of_improvement(np.tile(x[0], 3), np.tile(y[0], 3), paired=True,
                                             resamples=500)
    assert naive.high - naive.low < copies.high - copies.low
    with pytest.raises(ValueError, match="same runs and seeds"):
        stats.pooled_probability_of_improvement(x, y[:, :3])
