"""Figures of learned objectives and of runs (metarl.figures, the objectives' plot hooks and
metarl.evolve.report).

The plot functions are checked on hand-made meta-parameters; ``plot_run`` on one tiny real run
(made once per module, through the CLI in a subprocess that shares the notebooks' persistent
JAX compilation cache) and on hand-made run directories for the drift objectives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _subprocess_env import jax_cache_env
from matplotlib.figure import Figure

from inner_loops.objective import ppo_clip_surrogate
from metarl import figures
from metarl.evolve.report import plot_run
from metarl.kinds import load_experiment
from metarl.objectives import dpo, lpo, make_objective, ta_lpo
from metarl.objectives.value_distance import plot_learned_distance
from metarl.runs.layout import RunError
from metarl.runs.meta_params import save_meta_params

REPO = Path(__file__).resolve().parents[1]
VALUE_DISTANCE_TOML = REPO / "experiments" / "value_distance_cartpole.toml"
LPO_TOML = REPO / "experiments" / "lpo_cartpole_tiny.toml"
# The same tiny setting as tests/test_notebooks.py, so the compiled generation step is shared.
# Full generations (es.rungs=1): the file's successive halving needs 9 updates per agent at
# least, and these runs have 4.
TINY_OVERRIDES = ["es.generations=2", "es.population_size=2", "inner.total_timesteps=2048",
                  "es.rungs=1", "run.progress=false"]
# The curves and grids are computed one jax operation at a time, each compiled for its
# shapes: one size of curve and one of grid for every figure here compile each operation
# once, not once a size (five sizes before: 499 compilations in this module, now 366).
CURVE_POINTS = 61
GRID_POINTS = 31


# --------------------------------------------------------------------------------------
# helpers


def content_axes(fig: Figure):
    """The figure's axes without colour bars."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def colorbars(fig: Figure):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def assert_labelled(fig: Figure, legends: bool = True) -> None:
    assert isinstance(fig, Figure)
    assert fig.get_suptitle() or len(content_axes(fig)) == 1, "figure has no title"
    for ax in content_axes(fig):
        assert ax.get_xlabel(), f"axes {ax.get_title()!r} has no x label"
        assert ax.get_title(), "axes without a title"
        if legends and ax.get_legend() is not None:
            assert [t.get_text() for t in ax.get_legend().get_texts()]


def legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None, f"axes {ax.get_title()!r} has no legend"
    return [t.get_text() for t in legend.get_texts()]


def line(ax, label: str):
    """The line of ``ax`` labelled ``label``."""
    (found,) = [ln for ln in ax.lines if ln.get_label() == label]
    return found


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def key():
    return jax.random.PRNGKey(3)


@pytest.fixture(scope="module")
def value_params(key):
    params = make_objective("value_distance", hidden_sizes=(8, 8)).init(key)
    # The output layer starts at zero (d = L2); perturb it so the learned part shows.
    return jax.tree.map(lambda x: x + 0.1 * jax.random.normal(key, x.shape), params)


@pytest.fixture(scope="module")
def lpo_params(key):
    return make_objective("lpo", hidden_sizes=(16,)).init(key)


@pytest.fixture(scope="module")
def ta_lpo_params(key):
    return make_objective("ta_lpo", hidden_sizes=(16,)).init(key)


# --------------------------------------------------------------------------------------
# value distance


def test_plot_value_distance(value_params):
    fig = plot_learned_distance(value_params["value"], x_range=(-3, 3),
                                num_points=CURVE_POINTS)
    assert_labelled(fig)
    ax_d, ax_grad, ax_change = content_axes(fig)
    for ax in (ax_d, ax_grad, ax_change):
        assert ax.get_ylabel()
        assert any("L2" in text for text in legend_texts(ax))
    x, d = line(ax_d, "learned d(x)").get_data()
    assert x[0] == pytest.approx(-3) and x[-1] == pytest.approx(3)
    assert d[np.argmin(np.abs(x))] == pytest.approx(0.0, abs=1e-6)  # d(0) = 0
    l2 = line(ax_d, "L2: ½x²").get_ydata()
    np.testing.assert_allclose(l2, 0.5 * x**2, rtol=1e-6)
    # the derivative panel is d'(x) of the same function (checked by finite differences)
    grad = line(ax_grad, "learned d(x): d'(x)").get_ydata()
    np.testing.assert_allclose(grad[1:-1], (d[2:] - d[:-2]) / (x[2] - x[0]), atol=2e-2)
    # the default form scales L2: the third panel is the weight d / ½x² = exp(g) > 0
    weight = line(ax_change, "learned d(x): d(x) / ½x²").get_ydata()
    nonzero = x != 0
    np.testing.assert_allclose(weight[nonzero], d[nonzero] / l2[nonzero], rtol=1e-5)
    assert np.all(weight[nonzero] > 0)


@pytest.mark.parametrize("form, label, neutral", [
    ("scaled_l2", "learned d(x): d(x) / ½x²", 1.0),
    ("l2_residual", "learned d(x): d(x) - ½x²", 0.0),
])
def test_plot_value_distance_at_init_is_l2(key, form, label, neutral):
    params = make_objective("value_distance", hidden_sizes=(8, 8), form=form).init(key)
    # whole meta-params are accepted too
    fig = plot_learned_distance(params, form=form, num_points=CURVE_POINTS)
    ax_d, _, ax_change = content_axes(fig)
    assert form in fig.get_suptitle()
    change = line(ax_change, label).get_ydata()
    np.testing.assert_allclose(change[np.isfinite(change)], neutral, atol=1e-5)
    np.testing.assert_allclose(line(ax_d, "learned d(x)").get_ydata(),
                               line(ax_d, "L2: ½x²").get_ydata(), atol=1e-5)


def test_plot_value_distance_overlays_labelled_candidates(value_params, key):
    init = make_objective("value_distance", hidden_sizes=(8, 8)).init(key)
    fig = plot_learned_distance({"mean": init["value"], "best": value_params["value"]},
                                num_points=CURVE_POINTS)
    texts = legend_texts(content_axes(fig)[0])
    assert texts[:2] == ["mean", "best"]


# --------------------------------------------------------------------------------------
# drift


def test_ppo_drift_fn_matches_clip_surrogate():
    ratio = jnp.linspace(0.4, 2.5, 50)
    for a in (-1.5, 0.7):
        advantage = jnp.full_like(ratio, a)
        drift_fn = lpo.ppo_drift_fn(clip_eps=0.2)
        expected = ratio * advantage - ppo_clip_surrogate(ratio, advantage, 0.2)
        np.testing.assert_allclose(drift_fn(ratio, advantage), expected, atol=1e-6)
        assert drift_fn.label.startswith("PPO clip") and not drift_fn.uses_progress


def test_drift_fns_equal_their_objectives_drift(lpo_params, ta_lpo_params):
    ratio, advantage = jnp.linspace(0.5, 2.0, 7), jnp.linspace(-1.0, 1.0, 7)
    np.testing.assert_array_equal(lpo.drift_fn(lpo_params["policy"])(ratio, advantage),
                                  lpo.drift(lpo_params["policy"], ratio, advantage))
    temporal = ta_lpo.drift_fn(ta_lpo_params["policy"])
    assert temporal.uses_progress
    np.testing.assert_array_equal(temporal(ratio, advantage, 0.7),
                                  ta_lpo.drift(ta_lpo_params["policy"], ratio, advantage,
                                               progress=0.7))
    np.testing.assert_array_equal(dpo.drift_fn()(ratio, advantage), dpo.drift(ratio, advantage))


def test_plot_drift_lpo(lpo_params):
    drift_fn = lpo.drift_fn(lpo_params["policy"])
    fig = figures.plot_drift(drift_fn, num_points=GRID_POINTS,
                             references=lpo.reference_drifts())
    assert_labelled(fig)
    heatmap, plus, minus = content_axes(fig)
    assert len(colorbars(fig)) == 1 and colorbars(fig)[0].get_ylabel()
    assert heatmap.get_ylabel() == "advantage A"
    assert heatmap.get_xscale() == "log"
    array = heatmap.collections[0].get_array()
    assert np.all(np.asarray(array) >= 0)
    for ax in (plus, minus):
        texts = legend_texts(ax)
        assert any(t.startswith("learned LPO") for t in texts)
        assert any(t.startswith("PPO clip") for t in texts)
        assert any(t.startswith("DPO") for t in texts)
    assert "A = +1" in plus.get_title() and "A = -1" in minus.get_title()
    # every drift vanishes at r = 1
    for line in plus.lines + minus.lines:
        r, d = line.get_data()
        if len(r) > 2:
            assert d[np.argmin(np.abs(r - 1.0))] == pytest.approx(0.0, abs=1e-6)


def test_plot_drift_ta_lpo_at_a_progress(ta_lpo_params):
    drift_fn = ta_lpo.drift_fn(ta_lpo_params["policy"])
    early = figures.plot_drift(drift_fn, progress=0.0, num_points=GRID_POINTS, log_ratio=False)
    late = figures.plot_drift(drift_fn, progress=1.0, num_points=GRID_POINTS, log_ratio=False)
    assert "progress 1" in late.get_suptitle()
    grid_early = np.asarray(content_axes(early)[0].collections[0].get_array())
    grid_late = np.asarray(content_axes(late)[0].collections[0].get_array())
    assert not np.allclose(grid_early, grid_late)


def test_plot_drift_draws_the_references_it_is_given():
    ppo_only = {label: fn for label, fn in lpo.reference_drifts().items()
                if label.startswith("PPO")}
    fig = figures.plot_drift(dpo.drift_fn(), num_points=GRID_POINTS, slice_advantages=(1.0,),
                             references=ppo_only)
    assert_labelled(fig)
    heatmap, plus = content_axes(fig)
    assert heatmap.get_title().startswith("DPO")  # the drift's own label
    texts = legend_texts(plus)
    assert sum(t.startswith("DPO") for t in texts) == 1
    assert any(t.startswith("PPO clip") for t in texts)
    without = figures.plot_drift(dpo.drift_fn(), num_points=GRID_POINTS,
                                 slice_advantages=(1.0,))
    assert legend_texts(content_axes(without)[1]) == [dpo.drift_fn().label]


def test_plot_temporal_drift(ta_lpo_params):
    drift_fn = ta_lpo.drift_fn(ta_lpo_params["policy"])
    progresses = (0.0, 0.5, 1.0)
    fig = figures.plot_temporal_drift(drift_fn, progresses, num_points=GRID_POINTS,
                                      reference=lpo.ppo_drift_fn())
    assert_labelled(fig)
    axes = content_axes(fig)
    maps, slices = axes[:3], axes[3:]
    assert [ax.get_title() for ax in maps] == [f"progress p = {p:g}" for p in progresses]
    assert len(colorbars(fig)) == 1  # one shared colour scale
    norms = {(m.collections[0].norm.vmin, m.collections[0].norm.vmax) for m in maps}
    assert len(norms) == 1
    for ax in slices:
        texts = legend_texts(ax)
        assert [t for t in texts if t.startswith("p = ")] == ["p = 0", "p = 0.5", "p = 1"]
        assert any(t.startswith("PPO clip") for t in texts)
        assert ax.get_ylabel()


def test_plot_drift_comparison_puts_every_drift_on_one_colour_scale(lpo_params):
    evolved = lpo.drift_fn(lpo_params["policy"])
    fig = figures.plot_drift_comparison({"evolved": evolved}, num_points=GRID_POINTS,
                                        references=lpo.reference_drifts())
    assert_labelled(fig)
    maps = content_axes(fig)
    assert [ax.get_title() for ax in maps][0] == "evolved"
    assert maps[1].get_title().startswith("PPO clip") and maps[2].get_title().startswith("DPO")
    assert len(colorbars(fig)) == 1
    assert len({(m.collections[0].norm.vmin, m.collections[0].norm.vmax) for m in maps}) == 1
    # the PPO panel holds PPO's clipping drift: largest at r = 2, A = 2, (2 - 1.2) * 2
    assert np.asarray(maps[1].collections[0].get_array()).max() == pytest.approx(1.6, rel=1e-4)
    alone = figures.plot_drift_comparison({"evolved": evolved}, num_points=GRID_POINTS)
    assert len(content_axes(alone)) == 1


def test_plot_drift_comparison_evaluates_a_temporal_drift_at_the_progress(ta_lpo_params):
    drift_fn = ta_lpo.drift_fn(ta_lpo_params["policy"])
    grids = [np.asarray(content_axes(figures.plot_drift_comparison(
        {"ta": drift_fn}, progress=p, num_points=GRID_POINTS))[0]
        .collections[0].get_array()) for p in (0.0, 1.0)]
    assert not np.allclose(*grids)


def test_plot_drift_slices_overlays_every_drift(lpo_params, key):
    other = jax.tree.map(lambda x: 1.5 * x, lpo_params["policy"])
    drifts = {"run 0": lpo.drift_fn(lpo_params["policy"]), "run 1": lpo.drift_fn(other)}
    fig = figures.plot_drift_slices(drifts, num_points=GRID_POINTS,
                                    references=lpo.reference_drifts())
    assert_labelled(fig)
    plus, minus = content_axes(fig)
    for ax in (plus, minus):
        texts = legend_texts(ax)
        assert texts[:2] == ["run 0", "run 1"]
        assert any(t.startswith("PPO clip") for t in texts)
    with pytest.raises(ValueError, match="no drift"):
        figures.plot_drift_slices({})


def test_plot_temporal_drift_needs_progress():
    with pytest.raises(ValueError, match="progress"):
        figures.plot_temporal_drift(dpo.drift)


# --------------------------------------------------------------------------------------
# fitness and learning curves


def test_plot_fitness_from_metrics_lines():
    history = [
        {"generation": 1, "fitness": [10.0, 12.0, 14.0, 16.0], "valid": [True] * 4,
         "best_fitness_so_far": 16.0},
        {"generation": 2, "fitness": [11.0, float("nan"), 20.0, 15.0],
         "valid": [True, False, True, True], "best_fitness_so_far": 20.0},
        {"generation": 3, "fitness": [18.0, 19.0, 21.0, 22.0], "valid": [True] * 4,
         "best_fitness_so_far": 22.0},
    ]
    fig = figures.plot_fitness(history)
    assert_labelled(fig)
    (ax,) = content_axes(fig)
    assert ax.get_ylabel().startswith("fitness")
    texts = legend_texts(ax)
    assert "mean fitness" in texts and "best of generation" in texts
    assert any("min–max" in t for t in texts)
    assert any("1 invalid" in t for t in texts)
    np.testing.assert_allclose(line(ax, "mean fitness").get_ydata(), [13.0, 46.0 / 3.0, 20.0])
    np.testing.assert_allclose(line(ax, "best of generation").get_ydata(), [16.0, 20.0, 22.0])


def test_plot_fitness_of_a_run_in_rungs():
    """Statistics over the candidates that trained the whole budget (as metrics.jsonl's),
    the ones stopped early as dots."""
    history = [
        {"generation": 1, "fitness": [30.0, 200.0, 70.0, 35.0], "valid": [True] * 4,
         "rung_reached": [0, 2, 1, 0], "best_fitness_so_far": 200.0},
        {"generation": 2, "fitness": [210.0, 80.0, 33.0, float("nan")],
         "valid": [True, True, True, False], "rung_reached": [2, 1, 0, 0],
         "best_fitness_so_far": 210.0},
    ]
    (ax,) = content_axes(figures.plot_fitness(history))
    texts = legend_texts(ax)
    assert any("whole budget" in t for t in texts) and any("1 invalid" in t for t in texts)
    np.testing.assert_allclose(line(ax, "mean fitness").get_ydata(), [200.0, 210.0])
    stopped = line(ax, "stopped in an earlier rung (fitness so far)")
    np.testing.assert_allclose(stopped.get_xdata(), [1, 1, 1, 2, 2])
    np.testing.assert_allclose(stopped.get_ydata(), [30.0, 70.0, 35.0, 80.0, 33.0])


def test_plot_fitness_rejects_empty_history():
    with pytest.raises(ValueError, match="empty"):
        figures.plot_fitness([])


def synthetic_report(env_ids=("CartPole-v1", "Acrobot-v1"), seeds=3, updates=6):
    rng = np.random.default_rng(0)
    results = []
    for env_id in env_ids:
        for objective in ("evolved", "ppo", "l2"):
            curves = np.cumsum(rng.normal(1.0, 1.0, (seeds, updates)), axis=1).tolist()
            curves[0][0] = None  # no episode finished yet in that update
            results.append({"objective": objective, "env_id": env_id, "returns": [0.0] * seeds,
                            "mean": 0.0, "ci_low": 0.0, "ci_high": 0.0, "invalid": 0,
                            "curves": curves})
    return {"objective": "value_distance", "meta_params": "mean", "metric": "mean_return",
            "seeds": seeds, "results": results}


def test_plot_learning_curves_per_environment():
    report = synthetic_report()
    fig = figures.plot_learning_curves(report, steps_per_update={"CartPole-v1": 512,
                                                                 "Acrobot-v1": 256})
    assert_labelled(fig)
    axes = content_axes(fig)
    assert [ax.get_title() for ax in axes] == ["CartPole-v1", "Acrobot-v1"]
    for ax, scale in zip(axes, (512, 256), strict=True):
        assert ax.get_xlabel() == "environment steps per agent"
        assert ax.get_ylabel() == "episode return"
        texts = legend_texts(ax)
        assert any(t.startswith("evolved") for t in texts)
        assert any(t.startswith("ppo") for t in texts) and any(t.startswith("l2") for t in texts)
        assert any("95%" in t for t in texts)
        x = ax.lines[0].get_xdata()
        np.testing.assert_allclose(x, scale * np.arange(1, 7))
        assert np.all(np.isfinite(ax.lines[0].get_ydata()))  # a missing value is skipped
    evolved = report["results"][0]["curves"]
    expected = np.nanmean(np.array(evolved, dtype=float), axis=0)
    np.testing.assert_allclose(axes[0].lines[0].get_ydata(), expected)


def test_plot_learning_curves_in_updates_without_steps():
    fig = figures.plot_learning_curves(synthetic_report(env_ids=("CartPole-v1",)))
    (ax,) = content_axes(fig)
    assert ax.get_xlabel() == "update"


# --------------------------------------------------------------------------------------
# plot_run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """One tiny value-distance run made with ``metarl run`` (which also calls plot_run)."""
    run_dir = tmp_path_factory.mktemp("plots") / "run"
    command = [sys.executable, "-m", "metarl.cli", "run", str(VALUE_DISTANCE_TOML),
               "--run-dir", str(run_dir)]
    for override in TINY_OVERRIDES:
        command += ["--set", override]
    env = {**os.environ, **jax_cache_env()}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plots:" in done.stdout  # the CLI drew the plots after evolving
    return run_dir


def test_plot_run_on_a_real_run(tiny_run):
    paths = plot_run(tiny_run)
    assert [p.name for p in paths] == ["fitness.png", "value_distance.png"]
    assert all(p.parent == tiny_run / "plots" and is_png(p) for p in paths)


def test_plot_run_adds_learning_curves_with_an_evaluation(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    report = synthetic_report(env_ids=("CartPole-v1",), updates=4)
    (run_dir / "evaluation.json").write_text(json.dumps(report))
    paths = plot_run(run_dir)
    assert [p.name for p in paths] == ["fitness.png", "value_distance.png",
                                       "learning_curves.png"]
    assert all(is_png(p) for p in paths)


def test_cli_plot_command(tiny_run, capsys):
    from metarl.cli import main

    assert main(["plot", str(tiny_run)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tiny_run / "plots" / n) for n in ("fitness.png", "value_distance.png")]


def fake_run(run_dir: Path, objective: str) -> Path:
    """A run directory written by hand (no training): config, metrics and meta-parameters."""
    config = load_experiment(LPO_TOML, [f"objective.name={objective!r}",
                                    "objective.options={ hidden_sizes = [8] }"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    lines = [{"generation": g, "fitness": [float(g), g + 1.0], "valid": [True, True],
              "best_fitness_so_far": g + 1.0} for g in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    params = config.objective.build().init(jax.random.PRNGKey(7))
    save_meta_params(run_dir / "mean_meta_params.msgpack", params)
    save_meta_params(run_dir / "best_meta_params.msgpack",
                     jax.tree.map(lambda x: 1.1 * x, params))
    return run_dir


@pytest.mark.parametrize("objective, expected", [
    ("lpo", ["fitness.png", "drift_mean.png", "drift_best.png", "drift_side_by_side.png",
             "drift_slices.png"]),
    ("ta_lpo", ["fitness.png", "drift_mean.png", "temporal_drift_mean.png", "drift_best.png",
                "temporal_drift_best.png", "drift_side_by_side.png", "drift_slices.png"]),
])
def test_plot_run_drift_objectives(tmp_path, objective, expected):
    run_dir = fake_run(tmp_path / objective, objective)
    paths = plot_run(run_dir)
    assert [p.name for p in paths] == expected
    assert all(is_png(p) for p in paths)


def test_plot_run_missing_directory(tmp_path):
    with pytest.raises(RunError, match="not found"):
        plot_run(tmp_path / "nowhere")


def test_plot_run_not_a_run(tmp_path):
    with pytest.raises(RunError, match="not a metarl run"):
        plot_run(tmp_path)


def test_plot_run_without_metrics(tmp_path):
    run_dir = fake_run(tmp_path / "run", "lpo")
    (run_dir / "metrics.jsonl").unlink()
    with pytest.raises(RunError, match="metrics"):
        plot_run(run_dir)


def test_plot_run_with_foreign_meta_params(tmp_path):
    run_dir = fake_run(tmp_path / "run", "lpo")
    other = make_objective("value_distance", hidden_sizes=(4,)).init(jax.random.PRNGKey(0))
    save_meta_params(run_dir / "mean_meta_params.msgpack", other)
    with pytest.raises(RunError, match="meta-parameters"):
        plot_run(run_dir)
