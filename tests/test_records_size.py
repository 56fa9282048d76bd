"""The kept records stay light, and compacted learning curves read back where they were.

``docs/results`` travels with every clone and every copy of the working tree to a GPU
machine, so it must stay under :data:`RESULTS_LIMIT` bytes with no record over
:data:`RECORD_LIMIT`. Evaluation and sweep records keep their curves compacted by
:func:`metarl.curves.compact_curves`; the scores that verdicts use are computed from the
full curves before that, and ``docs/results/compact_records.py`` compacts old records
without changing anything else in them.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from metarl import figures
from metarl.curves import compact_curves, compact_result, curve_updates, kept_updates, record_text
from metarl.evolve.config import FitnessConfig
from metarl.evolve.fitness import run_return
from metarl.figures.style import new_figure, palette_png, save_png
from metarl.sweep import summarise_sweep

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
RESULTS_LIMIT = 15_000_000
RECORD_LIMIT = 1_000_000


def kept_files() -> list[Path]:
    """The files under docs/results that are committed (every file there outside a git
    checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "docs/results"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return [path for path in RESULTS.rglob("*") if path.is_file()]
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_no_kept_record_is_over_a_megabyte():
    records = [path for path in kept_files() if path.suffix in (".json", ".jsonl")]
    assert records, "no records found under docs/results"
    heavy = [f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes" for path in records
             if path.stat().st_size > RECORD_LIMIT]
    assert heavy == [], "compact them with python docs/results/compact_records.py"


def test_docs_results_is_under_fifteen_megabytes():
    total = sum(path.stat().st_size for path in kept_files())
    assert 0 < total < RESULTS_LIMIT, (
        f"docs/results holds {total} bytes; python docs/results/compact_records.py compacts "
        "curves and figures")


def test_compact_curves_keeps_evenly_spaced_updates_with_the_first_and_last():
    assert kept_updates(5, 80).tolist() == [0, 1, 2, 3, 4]
    assert kept_updates(9, 3).tolist() == [0, 4, 8]
    kept = kept_updates(976, 80)
    assert kept.size == 80 and kept[0] == 0 and kept[-1] == 975
    assert set(np.diff(kept)) <= {12, 13}  # 975 / 79 = 12.3
    with pytest.raises(ValueError, match="max_points"):
        kept_updates(10, 1)


def test_compact_curves_rounds_to_significant_digits_and_keeps_missing_points():
    curves = [[None, 1.23456789, 2.0, 300.123456], [np.nan, -0.000123456789, 7.5, 1e-9]]
    compact = compact_curves(curves, max_points=3, digits=5)
    assert compact["curve_updates"] == [1, 3, 4]
    assert compact["curves"] == [[None, 2, 300.12], [None, 7.5, 1e-9]]
    assert isinstance(compact["curves"][0][1], int)  # a whole number is written as one
    assert compact_curves(compact["curves"], compact["curve_updates"], 3, 5) == compact
    with pytest.raises(ValueError, match="2 update numbers for curves of 4 points"):
        compact_curves(curves, [1, 2])


def test_a_compacted_record_is_compacted_again_unchanged():
    full = {"objective": "l2", "returns": [1.5, 2.5], "curves": np.arange(600.0).reshape(2, 300)
            .tolist()}
    once = compact_result(full)
    assert once["returns"] == full["returns"] and once["objective"] == "l2"
    assert once["curve_updates"][0] == 1 and once["curve_updates"][-1] == 300
    assert once["curves"][1][0] == 300 and once["curves"][1][-1] == 599
    assert compact_result(once) == once


def test_a_sweep_scores_its_seeds_on_the_full_curves_and_keeps_them_compacted():
    rng = np.random.default_rng(3)
    curves = rng.normal(100.0, 30.0, (2, 300))
    curves[0, :10] = np.nan  # no episode finished yet
    returns = np.asarray(run_return({"episode_return": jnp.asarray(curves)},
                                    FitnessConfig(metric="mean_return")), np.float64)
    [result] = summarise_sweep([{"learning_rate": 1e-3}], 2, {
        "curves": curves, "returns": returns, "valid": np.array([True, True])})
    np.testing.assert_allclose(result.returns, np.nanmean(curves, axis=1), rtol=1e-6)
    kept = np.asarray(result.curve_updates)
    assert len(result.curves[0]) == kept.size == 80 and (kept[0], kept[-1]) == (1, 300)
    assert result.curves[0][0] is None
    np.testing.assert_allclose(np.asarray(result.curves[1], np.float64),
                               curves[1, kept - 1], rtol=5e-5)
    from_kept = np.nanmean(np.asarray(result.curves, np.float64), axis=1)
    assert not np.allclose(from_kept, result.returns, rtol=1e-6)  # so a score from the
    # compacted curves would have told


def test_a_compacted_record_reads_back_and_draws_at_its_updates():
    rng = np.random.default_rng(0)
    results = [{"objective": name, "env_id": "CartPole-v1", "returns": [1.0, 2.0],
                "mean": 1.5, "ci_low": 1.0, "ci_high": 2.0, "invalid": 0,
                "steps_per_update": 512, "curves": rng.normal(0.0, 1.0, (2, 200)).tolist()}
               for name in ("evolved", "l2")]
    report = {"objective": "value_distance", "meta_params": "mean", "seeds": 2,
              "statistics": {"confidence": 0.95, "by": {"3": [0.1, 0.2]}},
              "results": [compact_result(r) for r in results]}
    text = record_text(report)
    assert json.loads(text) == report
    lines = [line.strip().rstrip(",") for line in text.splitlines()]
    for row in report["results"][0]["curves"]:  # one line a curve, not one a point
        assert json.dumps(row, separators=(",", ":")) in lines
    saved = json.loads(text)
    [ax] = figures.plot_learning_curves(saved, steps_per_update=512).axes
    expected_updates = kept_updates(200) + 1
    np.testing.assert_array_equal(curve_updates(saved["results"][0]), expected_updates)
    np.testing.assert_allclose(ax.lines[0].get_xdata(), 512 * expected_updates)
    old = {**report, "results": results}  # a record from before curves were compacted
    np.testing.assert_array_equal(curve_updates(results[0]), np.arange(1, 201))
    [ax] = figures.plot_learning_curves(old, steps_per_update=512).axes
    np.testing.assert_allclose(ax.lines[0].get_xdata(), 512 * np.arange(1, 201))


def test_record_text_reads_back_as_json_dumps_would():
    data = {"a": [[1, 2.5, None], []], 3: {"b": (1, "x, y"), "c": {}}, "d": float("nan")}
    again = json.loads(record_text(data))
    assert json.dumps(again) == json.dumps(json.loads(json.dumps(data)))


def test_figures_are_saved_as_palette_pngs_that_keep_their_line_colours(tmp_path):
    fig = new_figure(3.0, 2.0)
    ax = fig.subplots()
    for k, colour in enumerate(("C0", "C1", "C2", "C3")):
        ax.plot([0, 1], [k, k + 1], color=colour, lw=6)
        ax.fill_between([0, 1], [k - 0.5, k + 0.5], [k + 0.5, k + 1.5], color=colour,
                        alpha=0.15)
    path = save_png(fig, tmp_path / "figure.png")
    image = Image.open(path)
    assert image.mode == "P" and image.size == (330, 220)  # 3 x 2 inches at 110 dpi
    assert round(image.info["dpi"][0]) == 110
    pixels = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(int)
    for colour in ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)):
        assert np.abs(pixels - colour).max(axis=1).min() <= 4, colour  # C0..C3 kept
    assert palette_png(path.read_bytes()) == path.read_bytes()  # once is enough
    see_through = tmp_path / "see_through.png"
    Image.new("RGBA", (4, 4), (255, 0, 0, 100)).save(see_through)
    assert palette_png(see_through.read_bytes()) == see_through.read_bytes()


def test_a_smooth_colour_map_is_saved_without_bands():
    fig = Figure(figsize=(3.0, 2.0))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))  # the field fills the figure
    ax.set_axis_off()
    x = np.linspace(0.0, 1.0, 60)
    ax.imshow(np.add.outer(x, x**2), cmap="viridis", aspect="auto")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    original = np.asarray(Image.open(buffer).convert("RGB"), np.int16)
    palette = Image.open(io.BytesIO(palette_png(buffer.getvalue())))
    moved = np.abs(np.asarray(palette.convert("RGB"), np.int16) - original).max(axis=-1) > 4
    assert palette.mode == "P" and moved.mean() < 0.02  # the octree alone moves most


def _compact_records_script():
    spec = importlib.util.spec_from_file_location("compact_records",
                                                  RESULTS / "compact_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_compacts_old_records_and_figures_once(tmp_path):
    script = _compact_records_script()
    run = tmp_path / "run" / "evaluations"
    run.mkdir(parents=True)
    record = {"seeds": 2, "statistics": {"iqm": 0.123456789012345678},
              "results": [{"objective": "evolved", "returns": [0.1, 0.2],
                           "curves": np.linspace(0.0, 1.0, 600).reshape(2, 300).tolist()}]}
    (run / "1.json").write_text(json.dumps(record, indent=1))
    (tmp_path / "untouched.json").write_text('{"a": 1, "curves": {"median": [1, 2]}}')
    Image.new("RGBA", (40, 30), (255, 255, 255, 255)).save(tmp_path / "figure.png",
                                                          dpi=(110, 110))
    assert script.main([str(tmp_path)]) == 0
    saved = json.loads((run / "1.json").read_text())
    assert script.without_curves(saved) == record | {"results": [
        {"objective": "evolved", "returns": [0.1, 0.2]}]}
    assert len(saved["results"][0]["curves"][0]) == 80
    assert (tmp_path / "untouched.json").read_text() == (
        '{"a": 1, "curves": {"median": [1, 2]}}')  # not a record's per-seed curves
    figure = Image.open(tmp_path / "figure.png")
    assert figure.mode == "P" and round(figure.info["dpi"][0]) == 110
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    script.main([str(tmp_path)])
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
