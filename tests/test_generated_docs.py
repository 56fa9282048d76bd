"""The verdict tables of README.md, docs/index.md and the evidence pages are what
``docs/render_verdicts.py`` renders from the records in docs/results: a re-evaluation that
changes a verdict must change the page (run the script) or this test fails. The renderer is
also run on planted inputs, so that a check which finds nothing is not mistaken for clean
pages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "render_verdicts.py"


@pytest.fixture(scope="module")
def render():
    spec = importlib.util.spec_from_file_location("render_verdicts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_generated_block_matches_its_records():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_cell_reads_the_record_and_a_changed_page_is_caught(render):
    # the blog-sized search against tuned L2, by hand from its record: 0.765625 [0.65625,
    # 0.859375], better, on 64 held-out seeds drawn from root 10007
    found, seeds = render.cells(
        render.Source("evaluation", "value_distance_blog_cpu/evaluations/1.json"),
        "CartPole-v1")
    # every objective chose its grid's largest learning rate, and the grid was not widened
    assert found[("l2", True)].text() == "0.77 [0.66, 0.86]: better ‡"
    assert found[("l2", False)].text() == "1.00 [1.00, 1.00]: better"  # untuned: no grid
    assert seeds == "64 (root 10007)"
    # a pooled cell counts the runs that alone gave the pooled verdict
    found, seeds = render.cells(
        render.Source("engines", "engines/cartpole_evaluations.json", "cartpole_value",
                      "evolution"), "")
    assert found[("ppo", True)].text() == "0.70 [0.63, 0.77]: better (2 of 3)"
    assert seeds.startswith("3 × 64")
    # a block whose table differs from the records is rewritten; one without markers is named
    name, block = "value_distance", render.BLOCKS["value_distance"]
    stale = f"before\n<!-- verdicts:{name} begin -->\n| old |\n<!-- verdicts:{name} end -->\n"
    fresh = render.apply(stale, name, render.render(block))
    assert "| old |" not in fresh and "0.77 [0.66, 0.86]: better ‡" in fresh
    assert fresh.count(render.EDGE_NOTE) == 1
    assert render.apply(fresh, name, render.render(block)) == fresh
    with pytest.raises(ValueError, match="verdicts:value_distance begin"):
        render.apply("no markers", name, "table")


def test_a_choice_at_its_knobs_valid_range_is_marked_apart_from_an_unwidened_grid(render):
    # the MiniGrid drift from zero at 9e-3, fresh seeds: on EmptyRandom-6x6 tuned PPO chose
    # clip 0.8, whose next step (1.6) leaves the valid range, and nothing else lay at an edge
    found, _ = render.cells(
        render.Source("evaluation", "task_distribution_zero_init_lr9/evaluations/2.json"),
        "xminigrid/MiniGrid-EmptyRandom-6x6")
    assert found[("ppo", True)].text() == "0.44 [0.19, 0.69]: no difference found §"
    assert found[("dpo", True)].text() == "0.38 [0.19, 0.62]: no difference found"
    capped = {"at_edge": {"alpha": "lowest"}, "widening": {"capped": {"alpha": "lowest"},
                                                            "out_of_range": {}}}
    in_range = {"at_edge": {"clip_eps": "highest"},
                "widening": {"capped": {}, "out_of_range": {"clip_eps": "highest"}}}
    never_widened = {"at_edge": {"learning_rate": "highest"}}  # records before widening
    tuning = {"a": capped, "b": in_range, "c": never_widened, "d": {"at_edge": {}}}
    assert render._edge(tuning, ("d", "b")) == "range"
    assert render._edge(tuning, ("b", "a")) == "grid"  # a grid edge outweighs a range end
    assert render._edge(tuning, ("c", "d")) == "grid"
    assert render._edge(tuning, ("d", "missing")) == ""


def test_a_reused_held_out_root_is_marked(render):
    record = {"seeds": 16, "eval_seed": 10007, "eval_seed_reused": True}
    assert render._eval_seeds(record) == "16 (root 10007 reused)"
    assert render._eval_seeds({"seeds": 16, "eval_seed": 7}) == "16 (root 7)"


def test_a_record_older_than_the_reuse_field_is_marked_from_its_run(render, tmp_path,
                                                                    monkeypatch):
    """Before records said whether they reused a root, the blog-sized run's second
    evaluation (a wider grid, designed after the first) drew from the first one's root:
    a record without the field is reused when an earlier evaluation of its run used the
    same root, and the table says what *reused* means."""
    found, seeds = render.cells(
        render.Source("evaluation", "value_distance_blog_cpu/evaluations/2.json"),
        "CartPole-v1")
    assert seeds == "64 (root 10007 reused)"
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    folder = tmp_path / "run" / "evaluations"
    folder.mkdir(parents=True)
    for number, root in ((1, 10007), (2, 10008), (3, 10007)):
        (folder / f"{number}.json").write_text(f'{{"seeds": 4, "eval_seed": {root}}}')
    marks = [render._eval_seeds({"seeds": 4, "eval_seed": root}, f"run/evaluations/{n}.json")
             for n, root in ((1, 10007), (2, 10008), (3, 10007))]
    assert marks == ["4 (root 10007)", "4 (root 10008)", "4 (root 10007 reused)"]
    # a record that says it did not reuse its root is believed
    assert render._eval_seeds({"seeds": 4, "eval_seed": 10007, "eval_seed_reused": False},
                              "run/evaluations/3.json") == "4 (root 10007)"
    table = render._with_notes(["| 4 (root 10007 reused) |"])
    assert table.endswith(render.REUSED_NOTE)
    assert render._with_notes(["| 4 (root 10007) |"]) == "| 4 (root 10007) |"


def test_check_fails_on_a_page_that_differs_and_writes_nothing(render, monkeypatch, capsys):
    page = "docs/evidence/value-distance.md"
    before = (ROOT / page).read_text(encoding="utf-8")
    monkeypatch.setattr(render, "rendered", lambda: {"value_distance": (page, "| changed |")})
    assert render.main(["--check"]) == 1
    assert "docs/evidence/value-distance.md: block value_distance" in capsys.readouterr().err
    assert (ROOT / page).read_text(encoding="utf-8") == before


def test_a_pooled_engines_cell_names_its_roots_and_marks_any_runs_edge(render, tmp_path,
                                                                       monkeypatch):
    """The engines benchmark pools three meta-seeds' evaluations: the table names the
    held-out roots they drew, marks the cell if any one run reused its root, and marks a
    tuned comparison if either side's choice sat at an unwidened edge in any one run."""
    def run(root, reused, l2_edge):
        return {"eval_seed": root, "eval_seed_reused": reused,
                "returns": {"evolved": [1.0] * 8},
                "at_edge": {"evolved": {}, "l2": {"learning_rate": "highest"} if l2_edge else {}},
                "widening": {"evolved": None, "l2": {"capped": {}, "out_of_range": {}}}}
    pooled = [{"evolved": "evolved (tuned)", "baseline": "l2 (tuned)",
               "verdicts": ["better", "better", "no difference found"],
               "pooled_p_improvement": {"value": 0.6, "low": 0.55, "high": 0.65},
               "pooled_verdict": "better"},
              {"evolved": "evolved", "baseline": "l2",
               "verdicts": ["better"] * 3,
               "pooled_p_improvement": {"value": 0.8, "low": 0.7, "high": 0.9},
               "pooled_verdict": "better"}]
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    for name, runs in (("fresh.json", [run(10008, False, False), run(10008, False, True),
                                       run(10009, False, False)]),
                       ("seen.json", [run(10007, True, False)] * 3)):
        record = {"tasks": {"task": {"evolution": {"runs": runs, "pooled": pooled},
                                     "evolution_vs_metagradient": []}}}
        (tmp_path / name).write_text(json.dumps(record))
    found, seeds = render.cells(render.Source("engines", "fresh.json", "task", "evolution"), "")
    assert seeds == "3 × 8 (root 10008/10009)"
    assert found[("l2", True)].text() == "0.60 [0.55, 0.65]: better (2 of 3) ‡"
    assert found[("l2", False)].text() == "0.80 [0.70, 0.90]: better (3 of 3)"  # untuned
    found, seeds = render.cells(render.Source("engines", "seen.json", "task", "evolution"), "")
    assert seeds == "3 × 8 (root 10007 reused)"
    assert found[("l2", True)].text() == "0.60 [0.55, 0.65]: better (2 of 3)"


def test_a_verdict_between_rows_tuned_into_different_regions_is_marked(render):
    """The value distance of evolution seed 0, fresh seeds: it settled at 2.4x PureJaxRL's
    learning rate inside its first grid and never tried the 27x where tuned L2 settled;
    that cell is marked, and explained under the table."""
    found, _ = render.cells(
        render.Source("evaluation", "value_distance_seeds/vd_s0/evaluations/6.json"),
        "CartPole-v1")
    assert found[("l2", True)].text().endswith(f" {render.APART_MARK}")
    assert not found[("l2", False)].apart  # untuned: nothing was tuned
    table = render._with_notes([f"| {found[('l2', True)].text()} |"])
    assert table.endswith(render.APART_NOTE)
