"""Held-out seeds are looked at once: each new evaluation of a run draws a root no earlier
evaluation of it used, an identical request finds its record again, a root asked for on
purpose that was used before is recorded and shown as judged on seen seeds, and the roots
of evolution, its fitness baselines and tuning are never drawn.

The tiny run of ``tests/_evaluation_run.py`` (2 held-out seeds, the evolved objective and
L2) keeps the programs those of the other evaluation tests.
"""

from __future__ import annotations

import json

import pytest
import test_compare
from _evaluation_run import TINY, write_run

from metarl.cli import main
from metarl.config import ConfigError
from metarl.discoveries.materialise import materialise
from metarl.evolve.compare import compare_runs, format_comparison
from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_run, format_table
from metarl.runs.evaluations import USED_ROOTS_FILE, fresh_root, used_eval_seeds


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("held_out") / "run")


@pytest.fixture(scope="module")
def evaluations(run_dir):
    """Three evaluations of one run: two requests drawing their own roots, then the
    first request's root asked for again by a new request."""
    first = evaluate_run(run_dir, seeds=2, baselines=[])
    second = evaluate_run(run_dir, seeds=2, baselines=["l2"])
    again = evaluate_run(run_dir, seeds=2, baselines=["l2"], eval_seed=first["eval_seed"])
    return first, second, again


def test_each_new_evaluation_draws_a_root_no_earlier_one_used(evaluations, run_dir):
    first, second, _ = evaluations
    assert first["eval_seed"] == DEFAULT_EVAL_SEED and second["eval_seed"] == DEFAULT_EVAL_SEED + 1
    assert first["eval_seed_reused"] is False and second["eval_seed_reused"] is False
    assert first["spec"]["eval_seed"] == first["eval_seed"]
    evolved = {r["eval_seed"]: r["results"][0]["returns"] for r in (first, second)}
    assert evolved[DEFAULT_EVAL_SEED] != evolved[DEFAULT_EVAL_SEED + 1]  # other keys
    # the identical request finds its record (and its root) again
    same = evaluate_run(run_dir, seeds=2, baselines=[])
    assert same["reused"] and same["id"] == first["id"]


def test_a_root_asked_for_again_is_recorded_and_shown_as_seen(evaluations):
    first, _, again = evaluations
    assert not again["reused"] and again["eval_seed"] == first["eval_seed"]
    assert again["eval_seed_reused"] is True
    assert again["eval_seed_earlier_records"] == [first["id"]]
    # the same keys: the evolved row is the first evaluation's
    assert again["results"][0]["returns"] == first["results"][0]["returns"]
    table = format_table(again)
    assert table.startswith(f"held-out seeds: 2 per objective and task, keys split from root "
                            f"{first['eval_seed']}")
    verdict_row = next(line for line in table.splitlines() if line.startswith("CartPole-v1")
                       and " l2 " in line and "[" in line and "yes" in line)
    assert verdict_row.rstrip().endswith(" *")
    assert (f"* judged on seen seeds: earlier evaluations already used these held-out seeds, "
            f"so this verdict is no fresh test (evaluations {first['id']} of this run used "
            f"root {first['eval_seed']})") in table
    assert " *" not in format_table(evaluations[1])


def test_compare_marks_verdicts_of_seen_seeds_and_states_them(tmp_path):
    runs = [test_compare.write_run(tmp_path / name, 0.05, seed)
            for seed, name in enumerate("ab")]
    rows = [("CartPole-v1", "evolved", test_compare.L2 + 10.0),
            ("CartPole-v1", "l2", test_compare.L2)]
    for run in runs:
        test_compare.write_evaluation(run, rows, eval_seed=5)
    fresh = format_comparison(compare_runs(runs))
    assert "held-out seeds: 16 from root 5" in fresh and "judged on seen seeds" not in fresh
    path = runs[1] / "evaluations" / "1.json"  # b's record: made on a root used before
    path.write_text(json.dumps({**json.loads(path.read_text()), "eval_seed_reused": True}))
    text = format_comparison(compare_runs(runs))
    row = next(line for line in text.splitlines() if line.startswith("CartPole-v1  evolved"))
    assert row.rstrip().endswith("better *")
    assert "* judged on seen seeds: earlier evaluations already used these" in text
    between = [line for line in text.splitlines()
               if line.split()[:4] == ["CartPole-v1", "evolved", "a", "b"]]
    assert between and all(line.rstrip().endswith(" *") for line in between)


def test_the_roots_of_evolution_and_tuning_are_never_held_out(tmp_path):
    run_dir = write_run(tmp_path / "seeded", {**TINY, "run": {"seed": DEFAULT_EVAL_SEED}})
    with pytest.raises(ConfigError, match=r"eval_seed: 10007 is the root of run.seed "):
        evaluate_run(run_dir, seeds=2, baselines=[], eval_seed=DEFAULT_EVAL_SEED)
    with pytest.raises(ConfigError, match=r"eval_seed: 10008 is the root of run.seed \+ 1"):
        evaluate_run(run_dir, seeds=2, baselines=[], eval_seed=DEFAULT_EVAL_SEED + 1)
    # a fresh root skips run.seed and run.seed + 1 (and the tuning seed, 20011 by default)
    assert evaluate_run(run_dir, seeds=2, baselines=[])["eval_seed"] == DEFAULT_EVAL_SEED + 2
    assert fresh_root({20011, 20012}, 20011) == 20013


def test_roots_used_elsewhere_are_read_and_skipped(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run")
    (run_dir / USED_ROOTS_FILE).write_text(json.dumps({"roots": [DEFAULT_EVAL_SEED],
                                                       "source": "the exported run"}))
    assert used_eval_seeds(run_dir) == {DEFAULT_EVAL_SEED: ["the exported run"]}
    assert main(["evaluate", str(run_dir), "--seeds", "2", "--baselines", "l2"]) == 0
    record = json.loads((run_dir / "evaluations" / "1.json").read_text())
    assert record["eval_seed"] == DEFAULT_EVAL_SEED + 1 and record["eval_seed_reused"] is False
    assert f"keys split from root {DEFAULT_EVAL_SEED + 1}" in capsys.readouterr().out
    assert used_eval_seeds(run_dir) == {DEFAULT_EVAL_SEED: ["the exported run"],
                                        DEFAULT_EVAL_SEED + 1: [1]}


def test_a_zoo_entry_knows_the_roots_of_its_cards_verdicts(tmp_path):
    run_dir, card = materialise("zoo:lpo_cpu", tmp_path / "lpo")
    roots = {c["eval_seed"] for c in card["verdicts"]["comparisons"]}
    assert roots and set(used_eval_seeds(run_dir)) == roots
