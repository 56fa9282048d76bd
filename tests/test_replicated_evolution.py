"""Replicated evolution (``[es] evolution_seeds = N``): N evolutions as one program in a
parent of N ordinary run directories, each the run of its own seed; a parent killed and
resumed; a seed resumed alone; one verdict across the seeds; clear errors.

Every run is the tiny experiment of ``tests/_tiny_evolution.py`` (population 4, 2 seeds per
candidate) with N = 2 and 3 generations: one joint generation program, compiled once and
shared with the subprocess through JAX's persistent compilation cache.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from _kill import kill_inside_save

from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.replicated import seed_config
from metarl.kinds import (
    evaluate,
    format_evaluation,
    load_experiment,
    load_run,
    read_config,
    resume,
    start,
)
from metarl.runs.checkpoint import RunCheckpointer
from metarl.runs.layout import RunError, read_metrics
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, load_meta_params
from metarl.runs.replicates import REPLICATES_FILE

ROOT = Path(__file__).resolve().parents[1]
GENERATIONS = 3
SEEDS = 2
TIMING = ("seconds", "agent_steps_per_second", "time")
# Seed i of a joint run against the same seed alone: the agents train identically, but the
# return of each run (a mean over its learning curve, fused into the training program) is
# rounded differently in a batch of N*C*S agents than of C*S: the recorded fitness differs
# by about one float32 ulp (2e-6 at 23) and, the ES ranking candidates, the meta-parameters
# stay equal unless two candidates are within that of each other.
FITNESS_RTOL = 1e-6


@pytest.fixture(scope="module")
def joint_run(tiny_config_file, tmp_path_factory, compilations):
    """An uninterrupted joint run of SEEDS seeds and GENERATIONS generations, and the
    backend compilations of its generation program."""
    parent = tmp_path_factory.mktemp("runs") / "joint"
    before = compilations.count()
    result = start(load_experiment(tiny_config_file, [f"es.generations={GENERATIONS}",
                                                      f"es.evolution_seeds={SEEDS}"]), parent)
    compiled = [name for _, name, _ in compilations.events[before:] if "generation" in name]
    return parent, result, compiled


def lines_without_timing(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in line.items() if k not in TIMING} for line in read_metrics(run_dir)]


def meta_params(run_dir: Path) -> list[np.ndarray]:
    return [np.asarray(leaf) for name in (BEST_FILE, MEAN_FILE)
            for leaf in jax.tree.leaves(load_meta_params(run_dir / name))]


def assert_same_seed(run_dir: Path, reference: Path) -> None:
    """Bit for bit: every line (timing aside) and the meta-parameter files."""
    assert lines_without_timing(run_dir) == lines_without_timing(reference)
    for mine, want in zip(meta_params(run_dir), meta_params(reference), strict=True):
        np.testing.assert_array_equal(mine, want)


def assert_close_seed(run_dir: Path, reference: Path) -> None:
    """To the float rounding of FITNESS_RTOL: a seed of a joint run against its run alone."""
    ours, theirs = read_metrics(run_dir), read_metrics(reference)
    assert [line["generation"] for line in ours] == [line["generation"] for line in theirs]
    for mine, want in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine["fitness"], want["fitness"], rtol=FITNESS_RTOL)
        np.testing.assert_allclose(mine["best_fitness_so_far"], want["best_fitness_so_far"],
                                   rtol=FITNESS_RTOL)
        assert mine["valid"] == want["valid"]
    for mine, want in zip(meta_params(run_dir), meta_params(reference), strict=True):
        np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-7)


def test_a_joint_run_writes_one_ordinary_run_directory_per_seed(joint_run):
    parent, result, _ = joint_run
    replicates = json.loads((parent / REPLICATES_FILE).read_text())
    assert replicates["replicates"] == ["seed_0", "seed_1"]
    assert (replicates["count"], replicates["base_seed"]) == (SEEDS, 0)
    assert replicates["config"]["es"]["evolution_seeds"] == SEEDS
    assert read_config(parent).es.evolution_seeds == SEEDS
    assert [member.run_dir for member in result.members] == [parent / "seed_0",
                                                             parent / "seed_1"]
    experiment = config_from_dict(replicates["config"])
    for index in range(SEEDS):
        seed_dir = parent / f"seed_{index}"
        config = read_config(seed_dir)  # the run of seed base + i, alone
        assert config == experiment.replace(
            run=dataclasses.replace(experiment.run, seed=index),
            es=dataclasses.replace(experiment.es, evolution_seeds=1))
        lines = read_metrics(seed_dir)
        assert [line["generation"] for line in lines] == list(range(1, GENERATIONS + 1))
        assert json.loads((seed_dir / "status.json").read_text())["state"] == "finished"
        for name in ("config_history.jsonl", BEST_FILE, MEAN_FILE):
            assert (seed_dir / name).is_file()
        checkpointer = RunCheckpointer(seed_dir)
        assert GENERATIONS in checkpointer.all_generations()
        checkpointer.close()
    # the seeds are different evolutions
    assert read_metrics(parent / "seed_0")[0]["fitness"] != \
        read_metrics(parent / "seed_1")[0]["fitness"]


def test_the_joint_generation_compiles_once(joint_run):
    _, result, compiled = joint_run
    # at most one backend compilation of a generation program (none when the persistent
    # compilation cache already holds it), and one entry in the jitted step's cache for
    # every generation of both seeds
    assert len(compiled) <= 1
    assert result.program.replicated.step._cache_size() == 1


def test_a_seed_equals_its_run_alone(joint_run, tiny_config_file, tmp_path):
    parent, _, _ = joint_run
    alone = tmp_path / "seed_1_alone"
    start(load_experiment(tiny_config_file, [f"es.generations={GENERATIONS}", "run.seed=1"]),
          alone)
    assert read_config(alone) == read_config(parent / "seed_1")
    assert_close_seed(parent / "seed_1", alone)


@pytest.mark.timeout(400)
def test_a_parent_killed_inside_a_save_resumes_into_the_uninterrupted_run(
        joint_run, tiny_config_file, tmp_path):
    reference, _, _ = joint_run
    parent = tmp_path / "killed"
    # frozen inside seed_1's save of generation 2, after seed_0 saved it: the seeds stop
    # at different generations (seed_0 at 2, seed_1 at 1)
    kill_inside_save(2, [str(tiny_config_file), "--run-dir", str(parent), "--no-plots",
                         "--evolution-seeds", str(SEEDS), "--set",
                         f"es.generations={GENERATIONS}"], within="seed_1")
    assert (parent / "seed_0" / "checkpoints" / "2" / "commit_success.txt").exists()
    assert not (parent / "seed_1" / "checkpoints" / "2").exists()
    assert [p for p in (parent / "seed_1" / "checkpoints").iterdir() if "tmp" in p.name]

    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        result = resume(parent)
    assert [int(member.state.generation) for member in result.members] == [GENERATIONS] * 2
    for index in range(SEEDS):
        assert_same_seed(parent / f"seed_{index}", reference / f"seed_{index}")


def test_a_seed_resumes_alone_and_the_parent_resumes_finished_seeds(joint_run, tmp_path,
                                                                    capsys):
    reference, _, _ = joint_run
    parent = shutil.copytree(reference, tmp_path / "apart")
    # seed_1 as if its last save had never happened, then continued alone: an ordinary run
    shutil.rmtree(parent / "seed_1" / "checkpoints" / str(GENERATIONS))
    alone = resume(parent / "seed_1")
    assert int(alone.state.generation) == GENERATIONS
    assert_close_seed(parent / "seed_1", reference / "seed_1")
    # the parent has nothing left to run
    result = resume(parent)
    assert [int(member.state.generation) for member in result.members] == [GENERATIONS] * 2
    assert capsys.readouterr().err.count(f"has finished its {GENERATIONS} generations") == 2
    assert_same_seed(parent / "seed_0", reference / "seed_0")


def test_evaluating_a_parent_judges_every_seed_and_pools_them(joint_run, tmp_path, capsys):
    parent = shutil.copytree(joint_run[0], tmp_path / "evaluated")
    report = evaluate(parent, seeds=2, baselines=["l2"])
    assert report["replicates"] == ["seed_0", "seed_1"]
    # every seed evaluated in its own directory, on the same held-out seeds, and the
    # baseline's row trained once for both
    seed_reports = report["seed_reports"]
    assert [Path(r["path"]).parent.parent.name for r in seed_reports] == ["seed_0", "seed_1"]
    rows = [{r["objective"]: r for r in seed["results"]} for seed in seed_reports]
    assert rows[0]["l2"]["returns"] == rows[1]["l2"]["returns"]
    specs = [seed["spec"] for seed in seed_reports]
    assert specs[0]["meta_params_sha256"] != specs[1]["meta_params_sha256"]
    assert {key: value for key, value in specs[0].items() if key != "meta_params_sha256"} \
        == {key: value for key, value in specs[1].items() if key != "meta_params_sha256"}
    assert [(v["run"], v["baseline"]) for v in report["verdicts"]] == [
        ("seed_0", "l2"), ("seed_1", "l2")]
    (pooled,) = report["pooled"]
    assert pooled["evolution_seeds"] == 2 and sum(pooled["counts"].values()) == 2
    assert pooled["paired"] is True
    assert pooled["verdict"] in ("better", "worse", "no difference found")
    assert 0.0 <= pooled["probability_of_improvement"]["value"] <= 1.0
    assert Path(report["path"]).parent == parent / "evaluations"
    table = format_evaluation(parent, report)
    assert "seed_1" in table and "across evolution seeds" in table
    # the same evaluation again is found, not recomputed; the command line takes a parent
    assert evaluate(parent, seeds=2, baselines=["l2"])["reused"] is True
    assert main(["evaluate", str(parent), "--seeds", "2", "--baselines", "l2"]) == 0
    assert "reusing" in capsys.readouterr().out
    # a new evaluation draws one held-out root for every seed that none of them used
    root = report["eval_seed"]
    assert [r["eval_seed"] for r in seed_reports] == [root, root]
    (parent / "seed_1" / "held_out_roots.json").write_text(json.dumps({"roots": [root + 1]}))
    fresh = evaluate(parent, seeds=2, baselines=[])
    assert not fresh["reused"] and fresh["eval_seed"] == root + 2
    assert [r["eval_seed"] for r in fresh["seed_reports"]] == [root + 2, root + 2]
    assert not any(r["eval_seed_reused"] for r in fresh["seed_reports"])
    assert main(["compare", str(parent), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "seed_0" in out and "seed_1" in out


def test_a_parent_is_neither_started_twice_nor_loaded_as_one_run(joint_run,
                                                                  tiny_config_file):
    parent = joint_run[0]
    config = load_experiment(tiny_config_file, [f"es.generations={GENERATIONS}",
                                                f"es.evolution_seeds={SEEDS}"])
    with pytest.raises(RunError, match="already holds replicated runs.*metarl resume"):
        start(config, parent)
    with pytest.raises(RunError, match="holds a run"):
        start(config, parent / "seed_0")
    with pytest.raises(RunError, match="parent of replicated runs.*seed_1"):
        load_run(parent)


def test_with_measured_baselines_a_seed_config_gives_them():
    config = config_from_dict({"run": {"seed": 7}, "es": {"evolution_seeds": 3},
                               "fitness": {"normalize_by_baseline": True,
                                           "tune_baseline": True}})
    seeded = seed_config(config, 2, [21.5])
    assert (seeded.run.seed, seeded.es.evolution_seeds) == (9, 1)
    assert seeded.fitness.baseline_returns == (21.5,)
    assert seeded.fitness.tune_baseline is False and seeded.fitness.normalize_by_baseline
    assert seed_config(config, 0).fitness == config.fitness


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_a_bad_number_of_evolution_seeds_names_the_field(value):
    with pytest.raises(ConfigError, match=r"es\.evolution_seeds"):
        config_from_dict({"es": {"evolution_seeds": value}})


def test_the_evolution_seeds_flag_is_checked_and_only_for_evolution(tiny_config_file,
                                                                    tmp_path, capsys):
    assert main(["run", str(tiny_config_file), "--evolution-seeds", "0", "--run-dir",
                 str(tmp_path / "zero")]) == 2
    assert "es.evolution_seeds: must be a positive integer" in capsys.readouterr().err
    assert main(["run", str(ROOT / "experiments" / "pbt_ppo_cartpole.toml"),
                 "--evolution-seeds", "2", "--run-dir", str(tmp_path / "pbt")]) == 2
    err = capsys.readouterr().err
    assert "--evolution-seeds: only evolution experiments" in err and "'pbt'" in err
    assert not (tmp_path / "zero").exists() and not (tmp_path / "pbt").exists()
