"""``benchmarks/engines.py`` (evolution against meta-gradients at equal agent-steps) runs end
to end in its ``--smoke`` size and reports what it promises: per engine the agent-steps each
search trained, the known answer's shape measure after every step and the agent-steps at
which it crossed its threshold, and the held-out verdict against the search's start. One
task (the drift's) keeps the test at about 20 CPU-seconds; the others differ only in their
configs, which ``tests/test_metagradient_known_answers.py`` and ``test_known_answers.py``
build."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "engines.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("engines", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_engines_benchmark_compares_both_engines_at_equal_agent_steps(tmp_path):
    engines = load_benchmark()
    out = tmp_path / "engines.json"
    returned = engines.main(["--smoke", "--task", "drift", "--agent-steps", "2048",
                             "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["smoke"] and report["meta_seeds"] == [0] and report["held_out_seeds"] == 4
    assert report["agent_steps"] == 2048 and returned["tasks"].keys() == {"drift"}
    task = report["tasks"]["drift"]
    assert task["known_answer"] == "restoring slope > 1.45"
    assert task["engines"].keys() == {"evolution", "metagradient"}
    for engine, section in task["engines"].items():
        run, = section["runs"]
        # each engine trains its whole steps until the budget is reached, no further
        assert 2048 <= run["agent_steps"] < 2048 + run["agent_steps_per_step"], engine
        assert run["agent_steps"] == run["steps"] * run["agent_steps_per_step"]
        steps_done = [point[0] for point in run["trajectory"]]
        assert steps_done == [step * run["agent_steps_per_step"]
                              for step in range(run["steps"] + 1)]
        assert run["final_measure"] == run["trajectory"][-1][1]
        reached = run["agent_steps_to_known_answer"]
        crossed = [done for done, slope in run["trajectory"] if slope > 1.45]
        assert reached == (crossed[0] if crossed else None)
        held_out = run["held_out"]
        assert held_out["verdict"] in ("better", "worse", "no difference found")
        assert 0 <= held_out["p_improvement"]["value"] <= 1
        assert np.isfinite(held_out["gain"])
        assert section["summary"]["verdicts"] == [held_out["verdict"]]
        assert section["summary"]["reached_known_answer"] == int(reached is not None)
    evolution = task["engines"]["evolution"]["runs"][0]["config"]
    metagradient = task["engines"]["metagradient"]["runs"][0]["config"]
    assert "meta" not in evolution and metagradient["meta"]["method"] == "metagradient"
    assert evolution["inner"] == metagradient["inner"]  # the same task for both
    assert evolution["objective"] == metagradient["objective"]  # and the same objective
    assert evolution["es"]["generations"] == task["engines"]["evolution"]["runs"][0]["steps"]
    assert metagradient["meta"]["steps"] == task["engines"]["metagradient"]["runs"][0]["steps"]


def test_speed_settings_go_smallest_first_and_a_deadline_skips_what_would_not_finish():
    engines = load_benchmark()
    specs = engines.speed_specs([64, 512], [64, 1024], [4, 16], repeats=3, smoke=False)
    assert [(spec["engine"], spec["size"], spec["unroll"], spec["remat"]) for spec in specs] == [
        ("evolution", 64, None, False), ("metagradient", 64, 4, True),
        ("metagradient", 64, 16, True), ("evolution", 512, None, False),
        ("metagradient", 1024, 4, True), ("metagradient", 1024, 16, True),
        ("metagradient", 1024, 16, False)]
    assert {spec["steps"] for spec in specs} == {4}  # one untimed step, three timed
    written = []
    rows = engines.measure_rows(specs[:2], 0, lambda rows: written.append(list(rows)))
    assert [row["skipped"] for row in rows] == ["past --deadline"] * 2
    assert [len(rows) for rows in written] == [1, 2]  # what ran so far is never lost


def test_the_tuned_evaluations_of_each_engine_are_pooled_over_meta_seeds(tmp_path):
    """``--evaluations`` reads each search's newest ``metarl evaluate`` record and pools
    each comparison over the meta-seeds, pairing every run's rows seed by seed."""
    from metarl.stats import probability_of_improvement

    engines = load_benchmark()
    rng = np.random.default_rng(0)
    baseline = rng.normal(200, 10, 16)
    found = {0: baseline + 5, 1: baseline - 1}  # one run ahead on every seed, one behind
    for seed, returns in found.items():
        evaluations = tmp_path / "cartpole_value" / f"evolution_s{seed}" / "evaluations"
        evaluations.mkdir(parents=True)
        (evaluations / "1.json").write_text("{}")  # an older record, replaced by 2.json
        (evaluations / "2.json").write_text(json.dumps({
            "results": [{"objective": "evolved (tuned)", "returns": list(returns)},
                        {"objective": "l2 (tuned)", "returns": list(baseline)}],
            "statistics": {"environments": {"CartPole-v1": {"comparisons": [
                {"evolved": "evolved (tuned)", "baseline": "l2 (tuned)",
                 "verdict": "better" if seed == 0 else "worse"}]}}},
            "eval_seed": 10008 + seed, "eval_seed_reused": False,
            "tuning": {"environments": {"CartPole-v1": {
                "l2": {"chosen": {"vf_coef": 0.3}, "at_edge": {"learning_rate": "highest"},
                       "widening": {"cap": 3, "rounds": 3,
                                    "capped": {"learning_rate": "highest"}}}}}}}))
    out = tmp_path / "evaluations.json"
    engines.main(["--evaluations", str(tmp_path), "--out", str(out)])
    section = json.loads(out.read_text())["tasks"]["cartpole_value"]["evolution"]
    assert [run["meta_seed"] for run in section["runs"]] == [0, 1]
    assert section["runs"][0]["record"].endswith("2.json")
    assert section["runs"][1]["chosen"] == {"l2": {"vf_coef": 0.3}}
    # what the tables need to name the held-out roots and mark a choice still at an edge
    assert [(run["eval_seed"], run["eval_seed_reused"]) for run in section["runs"]] == [
        (10008, False), (10009, False)]
    assert section["runs"][1]["at_edge"] == {"l2": {"learning_rate": "highest"}}
    assert section["runs"][1]["widening"]["l2"]["capped"] == {"learning_rate": "highest"}
    pooled, = section["pooled"]
    assert pooled["verdicts"] == ["better", "worse"]
    expected = probability_of_improvement(np.concatenate([found[0], found[1]]),
                                          np.concatenate([baseline, baseline]), paired=True)
    assert pooled["pooled_p_improvement"]["value"] == expected.value == 0.5
    # one evaluation by number, so that every run pools on the same held-out keys; runs
    # without that evaluation are left out
    by_number = engines.summarise_evaluations(tmp_path, 2)
    assert by_number["tasks"]["cartpole_value"]["evolution"]["pooled"] == section["pooled"]
    (tmp_path / "cartpole_value" / "evolution_s1" / "evaluations" / "2.json").rename(
        tmp_path / "cartpole_value" / "evolution_s1" / "evaluations" / "3.json")
    only_first = engines.summarise_evaluations(tmp_path, 2)["tasks"]["cartpole_value"]
    assert [run["meta_seed"] for run in only_first["evolution"]["runs"]] == [0]
    assert engines.summarise_evaluations(tmp_path, 4)["tasks"] == {}


def test_the_two_engines_results_are_compared_seed_by_seed(tmp_path):
    """With both engines under the root, ``--evaluations`` also pits evolution's results
    against meta-gradients', held-out seed by held-out seed."""
    engines = load_benchmark()
    baseline = np.arange(16, dtype=float)
    for engine, shift in (("evolution", 1.0), ("metagradient", 0.0)):
        evaluations = tmp_path / "cartpole_value" / f"{engine}_s0" / "evaluations"
        evaluations.mkdir(parents=True)
        (evaluations / "1.json").write_text(json.dumps({
            "results": [{"objective": "evolved", "returns": list(baseline + shift)}],
            "statistics": {"environments": {"CartPole-v1": {"comparisons": []}}}}))
    report = engines.main(["--evaluations", str(tmp_path), "--out",
                           str(tmp_path / "evaluations.json")])
    versus, = report["tasks"]["cartpole_value"]["evolution_vs_metagradient"]
    assert versus["row"] == "evolved" and versus["verdict"] == "better"
    assert versus["p_evolution_better"]["value"] == 1.0  # ahead on every held-out seed
