"""``metarl compare``: several run directories side by side — what each reached, the
settings that differ, their fitness curves and their learned functions in one figure.

The run directories are written directly (config, metrics, meta-parameters), without
training: what is compared is what the files hold."""

from __future__ import annotations

import json

import jax
import pytest

from metarl import cli
from metarl.compare import compare_runs, flatten, format_comparison, plot_comparison
from metarl.config import config_from_dict
from metarl.run import CONFIG_FILE, MEAN_FILE, METRICS_FILE, RunError, save_meta_params


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


def test_a_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(RunError):
        compare_runs([tmp_path / "nothing"])
