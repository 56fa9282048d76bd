"""``metarl compare``: several run directories side by side — what each reached, the
settings that differ, their fitness curves and their learned functions in one figure.

The run directories are written directly (config, metrics, meta-parameters), without
training: what is compared is what the files hold."""

from __future__ import annotations

import json

import jax
import pytest

from metarl import cli
from metarl.evolve.compare import (
    compare_runs,
    flatten,
    format_comparison,
    plot_comparison,
    verdicts,
)
from metarl.evolve.config import config_from_dict
from metarl.runs.evaluations import save_record
from metarl.runs.layout import CONFIG_FILE, METRICS_FILE, RunError
from metarl.runs.meta_params import MEAN_FILE, save_meta_params


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
    assert cli.main(["compare", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def write_evaluation(run_dir, rows):
    """An evaluation record holding ``(env, objective, mean, ci_low, ci_high)`` rows."""
    results = [{"env_id": env, "objective": objective, "mean": mean, "ci_low": low,
                "ci_high": high, "returns": [], "invalid": 0, "curves": []}
               for env, objective, mean, low, high in rows]
    save_record(run_dir, {"objective": "value_distance", "metric": "mean_return",
                          "seeds": 16, "results": results})


def test_verdicts_count_runs_whose_interval_excludes_the_baselines_mean(runs):
    write_evaluation(runs[0], [("CartPole-v1", "evolved", 220.0, 210.0, 230.0),
                               ("CartPole-v1", "l2", 195.0, 188.0, 202.0)])
    write_evaluation(runs[1], [("CartPole-v1", "evolved", 200.0, 190.0, 210.0),
                               ("CartPole-v1", "l2", 195.0, 188.0, 202.0)])
    # a later evaluation of the same pair replaces the earlier one; another env adds to it
    write_evaluation(runs[1], [("CartPole-v1", "evolved", 150.0, 140.0, 160.0),
                               ("CartPole-v1", "l2", 195.0, 188.0, 202.0),
                               ("Acrobot-v1", "evolved", -300.0, -320.0, -280.0),
                               ("Acrobot-v1", "l2", -350.0, -370.0, -330.0)])
    comparison = compare_runs(runs)
    found = {(v.run, v.env_id): v.outcome for v in verdicts(comparison)}
    assert found == {("a/vd", "CartPole-v1"): "better", ("b/vd", "CartPole-v1"): "worse",
                     ("b/vd", "Acrobot-v1"): "better"}
    table = format_comparison(comparison)
    assert "vs baseline" in table
    line = next(ln for ln in table.splitlines() if ln.startswith("CartPole-v1  l2"))
    assert line.split()[2:] == ["1", "0", "1", "2"]  # better, tie, worse, runs


def test_the_evaluations_figure_has_a_panel_per_environment_and_a_row_per_run(runs):
    write_evaluation(runs[0], [("CartPole-v1", "evolved", 220.0, 210.0, 230.0),
                               ("CartPole-v1", "l2", 195.0, 188.0, 202.0),
                               ("Acrobot-v1", "evolved", -300.0, -320.0, -280.0)])
    write_evaluation(runs[2], [("CartPole-v1", "evolved", 190.0, 180.0, 200.0),
                               ("CartPole-v1", "l2", 195.0, 188.0, 202.0)])
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
