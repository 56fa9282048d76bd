"""``metarl compare --evaluation N``: held-out scores read from one chosen evaluation record
of each run, so that a comparison made after some evaluations is made again, to the
character, after later ones; a clear one-line error naming the run when it has no such
record. The run directories are written directly (no training), as in test_compare.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_compare import L2, write_evaluation, write_run

from metarl import cli
from metarl.evolve.compare import (
    between_runs,
    compare_runs,
    evaluation_numbers,
    format_comparison,
    pooled_verdicts,
    verdicts,
)
from metarl.runs.layout import RunError


@pytest.fixture
def runs(tmp_path):
    """Two runs, each with evaluations/1.json (the evolved objective 10 above L2 on every
    seed) and evaluations/2.json (40 below), then a third record on another environment."""
    made = [write_run(tmp_path / "a", 0.05, 0), write_run(tmp_path / "b", 0.05, 1)]
    for run in made:
        write_evaluation(run, [("CartPole-v1", "evolved", L2 + 10.0),
                               ("CartPole-v1", "l2", L2)])
        write_evaluation(run, [("CartPole-v1", "evolved", L2 - 40.0),
                               ("CartPole-v1", "l2", L2)])
    write_evaluation(made[0], [("Acrobot-v1", "evolved", -300.0 + np.arange(16.0)),
                               ("Acrobot-v1", "l2", -350.0 + np.arange(16.0))])
    return made


def outcomes(comparison):
    return {(v.run, v.env_id): v.outcome for v in verdicts(comparison)}


def test_by_default_the_latest_evaluation_of_each_pair_counts(runs):
    assert outcomes(compare_runs(runs)) == {
        ("a", "CartPole-v1"): "worse", ("a", "Acrobot-v1"): "better",
        ("b", "CartPole-v1"): "worse"}


def test_one_number_reads_that_record_of_every_run(runs):
    comparison = compare_runs(runs, 1)
    assert outcomes(comparison) == {("a", "CartPole-v1"): "better",
                                    ("b", "CartPole-v1"): "better"}
    assert [run.evaluation for run in comparison.runs] == [1, 1]
    # the record alone: the Acrobot rows of record 3 are not read
    assert {row[0] for run in comparison.runs for row in run.evaluations} == {"CartPole-v1"}
    assert outcomes(compare_runs(runs, [3, 2])) == {("a", "Acrobot-v1"): "better",
                                                    ("b", "CartPole-v1"): "worse"}


def test_a_comparison_made_earlier_is_made_again_after_later_evaluations(tmp_path):
    runs = [write_run(tmp_path / "a", 0.05, 0), write_run(tmp_path / "b", 0.05, 1)]
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 + 10.0), ("CartPole-v1", "l2", L2)])
    write_evaluation(runs[1], [("CartPole-v1", "evolved", L2 + 3.0), ("CartPole-v1", "l2", L2)])

    def table(evaluation=None):
        comparison = compare_runs(runs, evaluation)
        return format_comparison(comparison, pooled_verdicts(comparison, resamples=300),
                                 between_runs(comparison))

    before = table()
    write_evaluation(runs[0], [("CartPole-v1", "evolved", L2 - 40.0), ("CartPole-v1", "l2", L2)])
    assert table() != before
    assert table([1, 1]) == before == table(1)


def test_a_missing_record_is_an_error_naming_the_run_and_its_records(runs, tmp_path):
    with pytest.raises(RunError, match=r"/b has no evaluations/3\.json \(its records: 1, 2\)"):
        compare_runs(runs, 3)
    bare = write_run(tmp_path / "bare", 0.05, 2)
    with pytest.raises(RunError, match=r"bare has no evaluations/1\.json \(it has none\)"):
        compare_runs([bare], 1)


def test_the_numbers_are_one_for_all_runs_or_one_per_run():
    assert evaluation_numbers(None, 3) == [None, None, None]
    assert evaluation_numbers(2, 3) == [2, 2, 2]
    assert evaluation_numbers([2], 3) == [2, 2, 2]
    assert evaluation_numbers([3, 2, 2], 3) == [3, 2, 2]
    with pytest.raises(RunError, match="names 2 records for 3 run directories"):
        evaluation_numbers([3, 2], 3)
    for bad in (0, [-1], True, [1.5]):
        with pytest.raises(RunError, match="record numbers of 1 or more"):
            evaluation_numbers(bad, 1)


def test_the_command_line_reads_the_chosen_records_and_saves_them(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["compare", *map(str, runs), "--evaluation", "1,2", "--out", str(out),
                     "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()  # --no-plots prints the table only
    assert cli.main(["compare", *map(str, runs), "--evaluation", "1,2", "--out",
                     str(out)]) == 0
    capsys.readouterr()
    assert (out / "comparison.txt").read_text() == printed
    saved = json.loads((out / "comparison.json").read_text())
    assert [run["evaluation"] for run in saved["runs"]] == [1, 2]
    assert {(v["run"], v["outcome"]) for v in saved["verdicts"]} == {("a", "better"),
                                                                      ("b", "worse")}
    # a missing record: exit code 2 and one line naming the run
    assert cli.main(["compare", *map(str, runs), "--evaluation", "7", "--no-plots"]) == 2
    assert "has no evaluations/7.json" in capsys.readouterr().err
    for bad in ("x", "0", "1,", ""):
        with pytest.raises(SystemExit) as stop:
            cli.main(["compare", str(runs[0]), "--evaluation", bad])
        assert stop.value.code == 2
        assert "--evaluation" in capsys.readouterr().err
