"""``metarl compare``: several run directories side by side — what each reached, the
settings that differ, their fitness curves and their learned functions in one figure.

The run directories are written directly (config, metrics, meta-parameters), without
training: what is compared is what the files hold."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from metarl import cli
from metarl.evolve.compare import (
    between_runs,
    compare_runs,
    flatten,
    format_comparison,
    plot_comparison,
    pooled_verdicts,
    verdicts,
)
from metarl.evolve.config import config_from_dict
from metarl.runs.evaluations import save_record
from metarl.runs.layout import CONFIG_FILE, METRICS_FILE, RunError
from metarl.runs.meta_params import MEAN_FILE, save_meta_params
from metarl.stats import aggregate


def write_run(path, sigma, seed, objective="value_distance", fitness=(1.0, 2.0, 3.0)):
    config = config_from_dict({
        "name": "compared", "objective": {"name": objective,
                                          "options": {"hidden_sizes": [4]}},
        "es": {"sigma": sigma}, "run": {"seed": seed}})
    path.mkdir(parents=True)
    (path / CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    lines = [{"generation": g + 1, "fitness": [f, f], "valid": [True, True],
              "mean_fitness": f, "best_fitness_so_far": max(fitness[: g + 1])}
             for g, f in enumerate(fitness)]
    (path / METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    meta = config.objective.build().init(jax.random.PRNGKey(seed))
    if objective == "value_distance":  # a different learned distance per run
        meta["value"]["layers"][-1]["w"] = meta["value"]["layers"][-1]["w"] + 0.1 * seed
    save_meta_params(path / MEAN_FILE, meta)
    return path


@pytest.fixture
def runs(tmp_path):
    return [write_run(tmp_path / "a" / "vd", 0.05, 0, fitness=(1.0, 4.0, 3.0)),
            write_run(tmp_path / "b" / "vd", 0.05, 1, fitness=(2.0, 2.5, 5.0)),
            write_run(tmp_path / "c", 0.1, 2)]


def test_flatten_names_nested_fields():
    assert flatten({"es": {"sigma": 0.1}, "inner": [{"gamma": 0.99}], "x": [1, 2]}) == {
        "es.sigma": 0.1, "inner.0.gamma": 0.99, "x": [1, 2]}


def test_the_table_shows_what_each_run_reached_and_only_the_settings_that_differ(runs):
    comparison = compare_runs(runs)
    assert [r.label for r in comparison.runs] == ["a/vd", "b/vd", "c"]
    assert [r.best_fitness for r in comparison.runs] == [4.0, 5.0, 3.0]
    assert [r.final_mean_fitness for r in comparison.runs] == [3.0, 5.0, 3.0]
    assert comparison.differing == {"es.sigma": [0.05, 0.05, 0.1], "run.seed": [0, 1, 2]}
    table = format_comparison(comparison)
    assert "best fitness" in table and "es.sigma" in table and "run.seed" in table
    assert "inner.0.gamma" not in table  # the same in every run


def test_the_figures_overlay_fitness_and_every_runs_learned_function(runs):
    figures = plot_comparison(compare_runs(runs))
    assert set(figures) == {"fitness", "value_distance"}
    fitness_ax = figures["fitness"].axes[0]
    assert len(fitness_ax.lines) == 2 * len(runs)  # mean and best so far per run
    legend = [t.get_text() for t in figures["value_distance"].axes[0].get_legend().get_texts()]
    for label in ("a/vd", "b/vd", "c"):
        assert any(text.startswith(label) for text in legend), legend


def test_runs_of_different_objectives_get_the_fitness_figure_only(runs, tmp_path):
    other = write_run(tmp_path / "lpo", 0.05, 3, objective="lpo")
    assert set(plot_comparison(compare_runs([runs[0], other]))) == {"fitness"}


def test_the_command_line_prints_and_saves(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["compare", *map(str, runs), "--out", str(out)]) == 0
    assert "run.seed" in capsys.readouterr().out
    assert (out / "fitness.png").stat().st_size > 0
    assert (out / "value_distance.png").stat().st_size > 0
    assert (out / "comparison.txt").read_text().startswith("run")
    saved = json.loads((out / "comparison.json").read_text())
    assert [run["label"] for run in saved["runs"]] == ["a/vd", "b/vd", "c"]
    assert saved["differing"]["run.seed"] == [0, 1, 2]
    assert cli.main(["compare", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def write_evaluation(run_dir, rows, eval_seed=10_007):
    """An evaluation record holding ``(env, objective, per-seed returns)`` rows, each with
    its mean and interval as ``metarl evaluate`` saves them."""
    results = []
    for env, objective, returns in rows:
        mean = aggregate(returns, "mean", resamples=200)
        results.append({"env_id": env, "objective": objective, "returns": list(returns),
                        "mean": mean.value, "ci_low": mean.low, "ci_high": mean.high,
                        "invalid": 0, "curves": []})
    save_record(run_dir, {"objective": "value_distance", "metric": "mean_return",
                          "seeds": len(rows[0][2]), "eval_seed": eval_seed,
                          "results": results})


SEEDS = np.arange(16.0)
L2 = 195.0 + SEEDS  # the baseline's score on each held-out seed
# far ahead on half the seeds, a little behind on the other half: a mean interval above the
# baseline's mean, but no more seeds won than lost
UPSIDE = L2 + np.where(SEEDS % 2 == 0, 30.0, -5.0)


def test_verdicts_judge_each_run_by_its_paired_probability_of_improvement(runs):
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 10.0),
                               ("CartPole-v1", "l2", L2)])
    write_evaluation(runs[1], [("CartPole-v1", "evolved", L2 + 10.0),
                               ("CartPole-v1", "l2", L2)])
    # a later evaluation of the same pair replaces the earlier one; another env adds to it
    write_evaluation(runs[1], [("CartPole-v1", "evolved", L2 - 40.0),
                               ("CartPole-v1", "l2", L2),
                               ("Acrobot-v1", "evolved", -300.0 + SEEDS),
                               ("Acrobot-v1", "l2", -350.0 + SEEDS)])
    write_evaluation(runs[2], [("CartPole-v1", "evolved", UPSIDE),
                               ("CartPole-v1", "l2", L2)])
    comparison = compare_runs(runs)
    # the old rule (the evolved mean's interval above the baseline's mean) said better
    c_rows = {row[1]: row for row in comparison.runs[2].evaluations}
    assert c_rows["evolved"][3] > c_rows["l2"][2]
    found = {(v.run, v.env_id): v for v in verdicts(comparison)}
    assert {key: v.outcome for key, v in found.items()} == {
        ("a/vd", "CartPole-v1"): "better", ("b/vd", "CartPole-v1"): "worse",
        ("b/vd", "Acrobot-v1"): "better", ("c", "CartPole-v1"): "no difference found"}
    assert all(v.paired for v in found.values())
    assert found[("a/vd", "CartPole-v1")].probability == 1.0
    assert found[("c", "CartPole-v1")].probability == pytest.approx(0.5)
    assert found[("c", "CartPole-v1")].low < 0.5 < found[("c", "CartPole-v1")].high

    pooled = pooled_verdicts(comparison, resamples=500)
    table = format_comparison(comparison, pooled)
    assert "vs baseline" in table and "no difference found" in table and "tie" not in table
    line = next(ln for ln in table.splitlines() if ln.startswith("CartPole-v1  evolved"))
    assert line.split()[2:7] == ["l2", "1", "1", "1", "3"]  # better, no difference, worse, runs
    # all runs together: 16 + 0 + 8 of the 48 pairs won
    [cartpole, acrobot] = pooled
    assert cartpole.counts == {"better": 1, "no difference found": 1, "worse": 1}
    assert cartpole.paired and cartpole.evolved_scores.size == 48
    assert cartpole.probability.value == pytest.approx(24 / 48)
    assert cartpole.probability.low < 0.5 < cartpole.probability.high
    assert cartpole.outcome == "no difference found"
    assert cartpole.baseline_iqm.value == pytest.approx(np.mean(L2[4:12]))
    assert acrobot.counts == {"better": 1, "no difference found": 0, "worse": 0}
    assert acrobot.outcome == "better" and acrobot.probability.value == 1.0
    assert line.endswith("no difference found")
    assert next(ln for ln in table.splitlines()
                if ln.startswith("Acrobot-v1   evolved")).endswith("better")


def test_evaluations_on_different_keys_are_compared_unpaired(runs):
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 1.0),
                               ("CartPole-v1", "l2", L2)])
    # the evolved objective evaluated again on another key stream: no longer paired
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 1.0)], eval_seed=5)
    [verdict] = verdicts(compare_runs(runs[:1]))
    assert not verdict.paired
    assert verdict.outcome == "no difference found"  # 1 apart on seeds spread over 15
    # the same key stream in another record still pairs
    write_evaluation(runs[0], [("CartPole-v1", "l2", L2)], eval_seed=5)
    [verdict] = verdicts(compare_runs(runs[:1]))
    assert verdict.paired and verdict.outcome == "better"


def test_records_of_older_versions_still_get_verdicts(runs):
    # a metarl 0.1 evaluation.json: a list of reports, no eval_seed, results without their
    # mean or interval
    legacy = [{"objective": "value_distance", "metric": "mean_return", "seeds": 16,
               "results": [{"env_id": "CartPole-v1", "objective": "evolved",
                            "returns": (L2 + 10.0).tolist(), "invalid": 0, "curves": []},
                           {"env_id": "CartPole-v1", "objective": "l2",
                            "returns": L2.tolist(), "invalid": 0, "curves": []}]}]
    (runs[0] / "evaluation.json").write_text(json.dumps(legacy))
    # a record that saved no per-seed returns gets a row but no verdict
    save_record(runs[1], {"objective": "value_distance", "metric": "mean_return",
                          "results": [{"env_id": "CartPole-v1", "objective": "evolved",
                                       "mean": 1.0, "ci_low": 0.5, "ci_high": 1.5},
                                      {"env_id": "CartPole-v1", "objective": "l2",
                                       "mean": 0.0, "ci_low": -0.5, "ci_high": 0.5}]})
    comparison = compare_runs(runs[:2])
    env, objective, mean, low, high = comparison.runs[0].evaluations[0]
    assert (env, objective) == ("CartPole-v1", "evolved")
    assert mean == pytest.approx(np.mean(L2 + 10.0)) and low < mean < high
    assert comparison.runs[1].evaluations[0][2:] == (1.0, 0.5, 1.5)
    [verdict] = verdicts(comparison)
    assert (verdict.run, verdict.outcome, verdict.paired) == ("a/vd", "better", True)
    assert "no difference found" in format_comparison(comparison)


def test_tuned_rows_are_judged_against_tuned_rows(runs):
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 10.0),
                               ("CartPole-v1", "l2", L2),
                               ("CartPole-v1", "evolved (tuned)", L2 - 10.0),
                               ("CartPole-v1", "l2 (tuned)", L2 + 20.0)])
    found = {(v.evolved, v.baseline): v.outcome for v in verdicts(compare_runs(runs[:1]))}
    assert found == {("evolved", "l2"): "better", ("evolved (tuned)", "l2 (tuned)"): "worse"}


def test_the_performance_profiles_show_the_evolved_objective_against_each_baseline(runs):
    for run in runs[:2]:
        write_evaluation(run, [("CartPole-v1", "evolved", L2 + 10.0),
                               ("CartPole-v1", "l2", L2), ("CartPole-v1", "ppo", L2 + 5.0)])
    comparison = compare_runs(runs)
    pooled = pooled_verdicts(comparison, resamples=300)
    figures = plot_comparison(comparison, pooled)
    axes = [ax for ax in figures["performance_profiles"].axes if ax.get_visible()]
    # both runs evaluated the baselines on the same keys: their 16 seeds count once
    assert [ax.get_title() for ax in axes] == [
        "CartPole-v1: evolved vs l2 (2 runs, 32 and 16 seeds)",
        "CartPole-v1: evolved vs ppo (2 runs, 32 and 16 seeds)"]
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert legend[:2] == ["evolved", "l2"]
    evolved, baseline = axes[0].lines[:2]
    x, y = evolved.get_data()
    # at the lowest threshold (the lowest score of either) every evolved run is above it;
    # at the highest none is
    assert x[0] == L2.min() and y[0] == 1.0 and y[-1] == 0.0
    assert baseline.get_data()[1][0] == pytest.approx(15 / 16)  # all but the lowest
    assert len(axes[0].collections) == 2  # one band per objective


def test_the_evaluations_figure_has_a_panel_per_environment_and_a_row_per_run(runs):
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 25.0),
                               ("CartPole-v1", "l2", L2),
                               ("Acrobot-v1", "evolved", -300.0 + SEEDS)])
    write_evaluation(runs[2], [("CartPole-v1", "evolved", L2 - 5.0),
                               ("CartPole-v1", "l2", L2)])
    figures = plot_comparison(compare_runs(runs))
    assert "evaluations" in figures
    axes = figures["evaluations"].axes
    assert [ax.get_title() for ax in axes] == ["CartPole-v1", "Acrobot-v1"]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["a/vd", "c"]
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["evolved", "l2"]
    assert "evaluations" not in plot_comparison(compare_runs(runs[1:2]))


def test_a_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(RunError):
        compare_runs([tmp_path / "nothing"])


def test_runs_are_judged_against_each_other_seed_by_seed(runs, tmp_path):
    # a search against its own starting point, on the same held-out keys, default and tuned
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 10.0),
                               ("CartPole-v1", "l2", L2),
                               ("CartPole-v1", "evolved (tuned)", L2 + 1.0)])
    write_evaluation(runs[1], [("CartPole-v1", "evolved", L2),
                               ("CartPole-v1", "evolved (tuned)", UPSIDE)])
    # another key stream: compared, but not seed by seed
    write_evaluation(runs[2], [("CartPole-v1", "evolved", L2 + 10.0)], eval_seed=5)
    comparison = compare_runs(runs)
    found = {(v.first, v.second, v.objective): v for v in between_runs(comparison)}
    assert set(found) == {("a/vd", "b/vd", "evolved"), ("a/vd", "b/vd", "evolved (tuned)"),
                          ("a/vd", "c", "evolved"), ("b/vd", "c", "evolved")}
    default = found[("a/vd", "b/vd", "evolved")]
    assert default.paired and default.probability == 1.0 and default.outcome == "better"
    tuned = found[("a/vd", "b/vd", "evolved (tuned)")]  # ahead on half the seeds only
    assert tuned.paired and tuned.probability == pytest.approx(0.5)
    assert tuned.outcome == "no difference found"
    assert not found[("a/vd", "c", "evolved")].paired
    assert found[("b/vd", "c", "evolved")].outcome == "worse"  # 10 behind on every seed
    table = format_comparison(comparison)
    assert "the runs' evolved objectives against each other" in table
    assert any(line.split()[:4] == ["CartPole-v1", "evolved", "a/vd", "b/vd"]
               and line.endswith("better") for line in table.splitlines())
    # a run evaluated alone has nothing to be compared with
    assert between_runs(compare_runs(runs[:1])) == []
