"""The zoo: every discovery the evidence pages report, shipped in the package, in sync with
its run directory under ``docs/results/`` and small."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import metarl
from metarl import cli
from metarl.discoveries import zoo
from metarl.discoveries.fileformat import read_discovery

# what a fresh export differs in from the shipped file without the records having changed
VOLATILE = ("created", "metarl_version", "jax_version")


def test_the_zoo_holds_the_discoveries_the_evidence_reports():
    assert zoo.names() == ["value_distance_blog", "lpo_cpu", "ta_lpo_cpu",
                           "learned_optimizer_cpu", "minigrid_drift"]
    objectives = {entry.name: read_discovery(entry.path)[0]["objective"]["name"]
                  for entry in zoo.ZOO}
    assert objectives == {"value_distance_blog": "value_distance", "lpo_cpu": "lpo",
                          "ta_lpo_cpu": "ta_lpo", "learned_optimizer_cpu": "learned_optimizer",
                          "minigrid_drift": "lpo"}


def test_the_zoo_is_under_two_megabytes():
    total = sum(entry.path.stat().st_size for entry in zoo.ZOO)
    assert 0 < total < zoo.MAX_ZOO_BYTES


def _stable(card: dict) -> dict:
    return {key: value for key, value in card.items() if key not in VOLATILE}


@pytest.mark.parametrize("entry", zoo.ZOO, ids=lambda entry: entry.name)
def test_each_shipped_file_equals_a_fresh_export_of_its_run(entry):
    """Fails when a run's records changed (a new evaluation) without the zoo being
    rebuilt: python -m metarl.discoveries.zoo --rebuild."""
    data, _ = zoo.exported(entry)
    card, arrays = read_discovery(data)
    shipped_card, shipped_arrays = read_discovery(entry.path)
    assert _stable(shipped_card) == _stable(card)
    assert shipped_card["caveats"] == list(entry.caveats) and entry.caveats
    for got, want in zip(jax.tree.leaves(shipped_arrays), jax.tree.leaves(arrays),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_metarl_zoo_lists_one_line_per_entry(capsys):
    assert cli.main(["zoo"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == zoo.names()
    blog = lines[0]
    assert blog.startswith("value_distance_blog: value_distance, found on CartPole-v1; ")
    # its latest tuned comparison with L2: evaluations/4.json, fresh seeds, widening grids
    assert "vs l2 (tuned) on CartPole-v1: worse (P 0.17 [0.08, 0.27])" in blog


def test_a_discovery_without_a_tuned_verdict_says_so():
    card = read_discovery(zoo.entry_path("lpo_cpu"))[0]
    untuned = {**card, "verdicts": {**card["verdicts"], "comparisons": [
        c for c in card["verdicts"]["comparisons"] if not c["tuned"]]}}
    assert zoo.line("x", untuned).endswith("; not judged against a tuned baseline")


def test_a_zoo_entry_loads_by_name_and_an_unknown_name_lists_the_zoo():
    found = metarl.load_objective("zoo:value_distance_blog")
    assert found.name == "value_distance" and found.card["generation"] == 55
    assert found.card["caveats"] == list(zoo.entry("value_distance_blog").caveats)
    with pytest.raises(ValueError, match="unknown zoo entry 'blog'; the zoo has: "
                                         "value_distance_blog, lpo_cpu, ta_lpo_cpu"):
        metarl.load_objective("zoo:blog")
