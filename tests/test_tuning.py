"""Tuned baselines (``metarl evaluate --tune``): each objective searches its declared grid on
tuning seeds as one program, the evolved objective gets the same budget over the shared
knobs, the record keeps grids, scores and choices, and bad options are named.

One tiny tuned evaluation (CartPole PPO, 2048 steps, 2 tuning seeds, 2 x 2 grids) is made
once for the module and read by most tests: compilation dominates on the CPU. The run
directory is written by hand (config and the objective's initial meta-parameters): an
evaluation needs no evolution, and the learned value distance starts exactly at L2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _evaluation_run import TINY, write_run

from inner_loops.dqn import DQNConfig
from inner_loops.objective import LossInputs
from inner_loops.ppo import PPOConfig
from inner_loops.sac import SACConfig
from inner_loops.td3 import TD3Config
from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.evaluate import DEFAULT_EVAL_SEED, evaluate_run
from metarl.evolve.generation import Evolution, search_start
from metarl.evolve.tuning import (
    DEFAULT_TUNE_BY,
    DEFAULT_TUNE_SEED,
    TUNE_STATISTICS,
    choose,
    evolved_plan,
    fill_grid,
    format_tuning,
    grid_edges,
    objective_plan,
    tune_objective,
    tuning_keys,
)
from metarl.kinds import evaluate
from metarl.objectives import get_objective, make_objective
from metarl.runs.meta_params import MEAN_FILE, load_meta_params, save_meta_params
from metarl.sweep import SweepResult

# x1e-6 of the run's learning rate: agents that cannot learn, which tuning must not choose
GRID = {"vf_coef": [0.1, 1.0], "learning_rate": [1e-6, 1.0]}
# no widening here (tests/test_tuning_widening.py widens): one program per objective
OPTIONS = {"seeds": 2, "baselines": ["l2"], "tune": True, "tune_seeds": 2, "tune_grid": GRID,
           "tune_rounds": 0}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("tuning") / "run")


@pytest.fixture(scope="module")
def tuned(run_dir, compilations):
    """The tuned evaluation, and the names of the programs compiled while it ran."""
    before = len(compilations.events)
    report = evaluate_run(run_dir, **OPTIONS)
    return report, [name for _, name, _ in compilations.events[before:]]


def test_tuning_is_one_program_per_objective(tuned):
    _, compiled = tuned
    assert compiled.count("jit(sweep_program)") == 2  # the evolved objective's and l2's


def test_the_record_keeps_grids_scores_choices_and_both_rows(tuned):
    report, _ = tuned
    assert [r["objective"] for r in report["results"]] == [
        "evolved", "l2", "evolved (tuned)", "l2 (tuned)"]
    records = report["tuning"]["environments"]["CartPole-v1"]
    assert list(records) == ["evolved", "l2"]
    l2 = records["l2"]
    assert l2["grid"] == GRID and l2["relative_to"] == {"learning_rate": 0.005}
    assert [s["setting"] for s in l2["settings"]] == [
        {"vf_coef": v, "learning_rate": lr} for v in (0.1, 1.0) for lr in (5e-9, 0.005)]
    for setting in l2["settings"]:
        assert len(setting["returns"]) == 2 and setting["invalid"] == 0
        assert setting["ci_low"] <= setting["mean"] <= setting["ci_high"]
    assert l2["chosen"] == l2["settings"][l2["chosen_index"]]["setting"]
    assert report["tuning"]["seeds"] == 2 and report["tuning"]["tune_seed"] == DEFAULT_TUNE_SEED
    tuned_row = report["results"][3]
    assert len(tuned_row["returns"]) == 2 and tuned_row["invalid"] == 0
    # the spec names the tuning, so a tuned and an untuned evaluation are two records
    assert report["spec"]["tune"]["seeds"] == 2
    assert report["spec"]["tune"]["grids"]["CartPole-v1"]["l2"] == GRID
    # chosen by the IQM unless asked otherwise, and the record says so
    assert report["spec"]["tune"]["by"] == report["tuning"]["tune_by"] == "iqm"
    assert l2["tune_by"] == "iqm" and "interquartile mean" in report["tuning"]["score"]
    for setting in l2["settings"]:  # the IQM of 2 seeds trims none: their mean
        assert setting["iqm"] == pytest.approx(np.mean(setting["returns"]))


def test_a_learning_rate_at_which_agents_cannot_learn_is_not_chosen(tuned):
    report, _ = tuned
    for name, record in report["tuning"]["environments"]["CartPole-v1"].items():
        means = [s["mean"] for s in record["settings"]]
        assert record["chosen_index"] == int(np.argmax(means)), name
        assert record["chosen"]["learning_rate"] == 0.005, name
        frozen = [s["mean"] for s in record["settings"] if s["setting"]["learning_rate"] < 1e-6]
        assert max(frozen) < max(means) - 5, name
        # x1 is the top of this grid: the record and the summary say the optimum may lie above
        assert record["at_edge"]["learning_rate"] == "highest", name
        assert (f"  CartPole-v1  {name}: " in format_tuning(report)
                and "at the end of its grid: learning_rate (its highest)" in format_tuning(report))


def test_the_evolved_objective_gets_the_baselines_budget(tuned):
    report, _ = tuned
    records = report["tuning"]["environments"]["CartPole-v1"]
    evolved, l2 = records["evolved"], records["l2"]
    assert evolved["budget"] == l2["budget"] == {"settings": 4, "seeds": 2, "runs": 8}
    assert list(evolved["grid"]) == ["learning_rate"]  # the shared knob only
    assert {1e-6, 1.0} <= set(evolved["grid"]["learning_rate"])
    assert len(evolved["settings"]) == len(l2["settings"])


def test_left_out_baselines_are_named(tuned, run_dir, capsys):
    report, _ = tuned
    assert report["not_reported"] == {"ppo": "left out by baselines=l2",
                                      "huber": "left out by baselines=l2"}
    flags = ["--seeds", "2", "--baselines", "l2", "--tune", "--tune-seeds", "2",
             "--tune-grid", "vf_coef=0.1,1", "--tune-grid", "learning_rate=1e-6,1",
             "--tune-rounds", "0"]
    assert main(["evaluate", str(run_dir), *flags]) == 0  # the same evaluation: reused
    out = capsys.readouterr().out
    assert "reusing" in out and "l2 (tuned)" in out
    assert "not reported: ppo (left out by baselines=l2); huber (left out by" in out
    assert "learning_rate=0.005 (x1)" in out
    assert "chosen settings, best interquartile mean over the tuning seeds" in out
    assert "(IQM " in out and "(score " not in out


def test_the_search_is_judged_against_its_starting_point(tuned, run_dir):
    report, _ = tuned
    # on the same held-out seeds as the evaluation without the start, on purpose
    with_start = evaluate_run(run_dir, **OPTIONS, start=True, eval_seed=report["eval_seed"])
    assert not with_start["reused"] and with_start["spec"]["start"] is True
    rows = {r["objective"]: r for r in with_start["results"]}
    assert list(rows) == ["evolved", "start", "l2", "evolved (tuned)", "start (tuned)",
                          "l2 (tuned)"]
    # the tiny run's search mean and its start are both the distance at L2 (a zero output
    # layer), so the two train alike on the same held-out seeds and no difference is found
    assert rows["start"]["returns"] == rows["evolved"]["returns"]
    comparisons = with_start["statistics"]["environments"]["CartPole-v1"]["comparisons"]
    judged = {(c["evolved"], c["baseline"]): c for c in comparisons}
    assert judged[("evolved", "start")]["probability_of_improvement"] == 0.5
    assert judged[("evolved", "start")]["verdict"] == "no difference found"
    assert ("evolved (tuned)", "start (tuned)") in judged
    records = with_start["tuning"]["environments"]["CartPole-v1"]
    assert list(records) == ["evolved", "start", "l2"]
    assert records["start"]["budget"] == records["evolved"]["budget"]  # the same budget
    # the baselines' rows are those of the evaluation without the start
    before = {r["objective"]: r["returns"] for r in report["results"]}
    assert rows["l2"]["returns"] == before["l2"]
    assert rows["l2 (tuned)"]["returns"] == before["l2 (tuned)"]


def test_the_start_row_trains_the_start_not_the_search_result(tuned, tmp_path):
    report, _ = tuned
    moved = write_run(tmp_path / "moved")  # a search that moved: the output layer grew
    meta = jax.tree_util.tree_map(lambda w: w + 0.5, load_meta_params(
        moved / MEAN_FILE, make_objective("value_distance", hidden_sizes=[8]).init(
            jax.random.PRNGKey(0))))
    save_meta_params(moved / MEAN_FILE, meta)
    rows = {r["objective"]: r["returns"] for r in evaluate_run(
        moved, seeds=2, baselines=["l2"], start=True)["results"]}
    assert rows["evolved"] != rows["start"]
    # the start is the distance at L2, as the unmoved run's search mean: the same returns
    unmoved = {r["objective"]: r["returns"] for r in report["results"]}
    assert rows["start"] == unmoved["evolved"]


def test_the_start_is_where_the_evolution_begins():
    config = config_from_dict({**TINY, "objective": {"name": "lpo",
                                                     "options": {"hidden_sizes": [4]}},
                               "run": {"seed": 7}})
    evolution = Evolution(config)
    began = evolution.mean_meta_params(evolution.init(baselines=(1.0,)))
    start = search_start(config.objective.build(), 7)
    jax.tree_util.tree_map(np.testing.assert_allclose, began, start)
    # a random hidden layer: another seed starts elsewhere
    other = search_start(config.objective.build(), 8)
    assert not np.allclose(other["policy"]["layers"][0]["w"], start["policy"]["layers"][0]["w"])


def test_an_untuned_evaluation_is_another_record_with_the_same_default_rows(tuned, run_dir):
    report, _ = tuned
    # on the tuned record's held-out root on purpose: a new evaluation on seen seeds
    untuned = evaluate_run(run_dir, seeds=2, baselines=["l2"], eval_seed=report["eval_seed"])
    assert not untuned["reused"] and untuned["id"] != report["id"]
    assert untuned["eval_seed_reused"] is True
    assert report["id"] in untuned["eval_seed_earlier_records"]
    assert "tune" not in untuned["spec"] and "tuning" not in untuned
    assert [r["returns"] for r in untuned["results"]] == [
        r["returns"] for r in report["results"][:2]]


def test_tuning_seeds_are_apart_from_the_held_out_seeds(run_dir):
    from metarl import cli

    assert cli.DEFAULT_TUNE_SEED == DEFAULT_TUNE_SEED  # the command line's default
    tuning = np.asarray(tuning_keys(DEFAULT_TUNE_SEED, 64))
    held_out = np.asarray(jax.random.split(jax.random.PRNGKey(DEFAULT_EVAL_SEED), 64))
    assert not {tuple(k) for k in tuning} & {tuple(k) for k in held_out}
    with pytest.raises(ConfigError, match="tune_seed: 10007 is the root of eval_seed"):
        evaluate_run(run_dir, **{**OPTIONS, "tune_seed": DEFAULT_EVAL_SEED,
                                 "eval_seed": DEFAULT_EVAL_SEED})
    with pytest.raises(ConfigError, match=r"tune_seed: 1 is the root of run.seed \+ 1"):
        evaluate_run(run_dir, **{**OPTIONS, "tune_seed": 1})


@pytest.mark.parametrize(("options", "message"), [
    ({"tune_grid": {"clip_eps": [0.1]}},
     "tune_grid: unknown knob 'clip_eps'; the objectives tuned here \\(l2\\) declare: "
     "learning_rate, vf_coef"),
    ({"tune_grid": {"vf_coef": [-1.0, 1.0]}},
     "tune_grid vf_coef: -1 is not allowed: inner.vf_coef: must be >= 0"),
    ({"tune_grid": {"learning_rate": [0.0, 1.0]}},
     r"tune_grid learning_rate: 0 \(x0 of the run's 0.005\) is not allowed: "
     "inner.learning_rate: must be positive"),
    ({"tune_grid": {"vf_coef": [0.1, 0.1]}}, "tune_grid vf_coef: give distinct values"),
    ({"tune_seeds": 1}, "tune_seeds: need at least 2"),
    ({"tune_by": "median"},
     r"tune_by: got 'median'; allowed: iqm \(interquartile mean\), mean"),
    ({"tune": False, "tune_by": "mean"},
     "tune_seeds, tune_grid, tune_by, tune_rounds: only with tune=True"),
    ({"tune_rounds": -1}, "tune_rounds: expected a count of widening rounds"),
])
def test_bad_tuning_options_are_named(run_dir, options, message):
    with pytest.raises(ConfigError, match=message):
        evaluate_run(run_dir, **{**OPTIONS, **options})


def test_a_record_tuned_before_tune_by_counts_as_chosen_by_the_mean(tuned, run_dir, capsys):
    report, _ = tuned
    saved = json.loads(Path(report["path"]).read_text())
    # the record as saved before tune_by existed: no field anywhere
    del saved["spec"]["tune"]["by"], saved["tuning"]["tune_by"]
    for records in saved["tuning"]["environments"].values():
        for record in records.values():
            del record["tune_by"]
            for setting in record["settings"]:
                del setting["iqm"]
    old = Path(report["path"]).with_name("99.json")
    old.write_text(json.dumps(saved))

    again = evaluate_run(run_dir, **OPTIONS)  # by the IQM: not the old record, the latest
    assert again["reused"] and again["id"] == report["id"]
    by_mean = evaluate_run(run_dir, **OPTIONS, tune_by="mean")
    assert by_mean["reused"] and by_mean["id"] == 99
    assert "tune_by" not in by_mean["tuning"]  # read as it was saved, not re-labelled
    text = format_tuning(by_mean)
    assert "best mean over the tuning seeds" in text and "(IQM " not in text
    best = by_mean["tuning"]["environments"]["CartPole-v1"]["l2"]
    assert f"(mean {best['settings'][best['chosen_index']]['mean']:.2f};" in text

    flags = ["--seeds", "2", "--baselines", "l2", "--tune", "--tune-seeds", "2",
             "--tune-grid", "vf_coef=0.1,1", "--tune-grid", "learning_rate=1e-6,1",
             "--tune-rounds", "0"]
    assert main(["evaluate", str(run_dir), *flags, "--tune-by", "mean"]) == 0
    assert f"reusing {old}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["evaluate", str(run_dir), *flags, "--tune-by", "median"])
    assert re.search(r"--tune-by: invalid choice: '?median'? \(choose from '?iqm'?, '?mean'?\)",
                     capsys.readouterr().err)


def result(returns, invalid=0):
    """A setting's result as :func:`metarl.sweep.summarise_sweep` gives it."""
    returns = np.asarray(returns, np.float64)
    finite = returns[np.isfinite(returns)]
    mean = float(finite.mean()) if finite.size else np.nan
    return SweepResult(setting={}, returns=returns.tolist(), mean=mean,
                       ci_low=np.nan, ci_high=np.nan, invalid=invalid, curves=[])


def test_the_iqm_and_the_mean_choose_differently_under_heavy_tails():
    # Acrobot-like: mostly -100, two seeds failed at -500, against a steady -150
    heavy = result([-100] * 6 + [-500] * 2)  # mean -200, IQM -100
    steady = result([-150] * 8)
    assert choose([steady, heavy], "iqm") == 1
    assert choose([steady, heavy], "mean") == 0
    assert choose([steady, heavy]) == 1  # the default is the IQM
    assert DEFAULT_TUNE_BY == "iqm"
    from metarl import cli

    assert (cli.DEFAULT_TUNE_BY, cli.TUNE_STATISTICS) == (DEFAULT_TUNE_BY,
                                                         tuple(TUNE_STATISTICS))
    with pytest.raises(ValueError, match="unknown statistic 'median'"):
        choose([steady, heavy], "median")


@pytest.mark.parametrize("statistic", ["iqm", "mean"])
def test_invalid_settings_rank_last_and_ties_go_to_the_first(statistic):
    diverged = result([1000.0] * 7 + [np.nan], invalid=1)  # the best scores, one NaN seed
    poor, good = result([-10.0] * 8), result([5.0] * 8)
    assert choose([diverged, poor], statistic) == 1
    assert choose([diverged, result([np.nan] * 8, invalid=8), poor], statistic) == 2
    assert choose([poor, good, result([5.0] * 8)], statistic) == 1
    assert choose([result([np.nan] * 8, invalid=8), diverged], statistic) == 1


def test_the_summary_names_the_statistic_that_chose():
    setting = {"setting": {"vf_coef": 0.1}, "mean": -200.0, "iqm": -100.0,
               "returns": [-100.0] * 6 + [-500.0] * 2}
    record = {"budget": {"settings": 1, "seeds": 8}, "chosen_index": 0, "relative_to": {},
              "chosen": {"vf_coef": 0.1}, "skipped": {}, "settings": [setting]}
    report = {"tuning": {"seeds": 8, "tune_seed": 1, "tune_by": "iqm",
                         "environments": {"Acrobot-v1": {"l2": record}}}}
    assert "best interquartile mean" in format_tuning(report)
    assert "(IQM -100.00; 1 settings x 8 seeds)" in format_tuning(report)
    del report["tuning"]["tune_by"]  # an older record: chosen by the mean
    assert "best mean" in format_tuning(report)
    assert "(mean -200.00; 1 settings x 8 seeds)" in format_tuning(report)
    report["tuning"]["tune_by"] = "iqm"
    del setting["iqm"]  # computed from the returns where the record lacks it
    assert "(IQM -100.00;" in format_tuning(report)


def test_choices_at_an_end_of_their_grid_are_named():
    record = {"grid": {"vf_coef": [0.03, 0.1, 0.3, 1.0], "learning_rate": [1 / 3, 1.0, 3.0],
                       "alpha": [4.0]},
              "relative_to": {"learning_rate": 2.5e-4},
              # chosen values pass through float32 hyperparameters
              "chosen": {"vf_coef": float(np.float32(0.1)), "alpha": 4.0,
                         "learning_rate": float(np.float32(3.0 * 2.5e-4))}}
    assert grid_edges(record) == {"learning_rate": "highest"}  # a grid of one has no edge
    record["chosen"].update(vf_coef=float(np.float32(0.03)),
                            learning_rate=float(np.float32(2.5e-4)))
    assert grid_edges(record) == {"vf_coef": "lowest"}
    assert grid_edges({"grid": {}, "chosen": {}}) == {}  # nothing searched


@pytest.mark.parametrize(("options", "flags", "message"), [
    ({"tune": True}, ["--tune"], "tune: a pbt run cannot be tuned"),
    ({"across": {"learning_rate": [1e-4, 1e-3]}}, ["--across", "learning_rate=1e-4,1e-3"],
     "across: a pbt run cannot be evaluated across"),
])
def test_tuning_and_across_are_refused_for_other_kinds(tmp_path, capsys, options, flags,
                                                       message):
    run_dir = tmp_path / "pbt"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"kind": "pbt"}))
    with pytest.raises(ConfigError, match=message):
        evaluate(run_dir, **options)
    assert main(["evaluate", str(run_dir), *flags]) == 2
    assert f"{flags[0]}: only for evolution runs" in capsys.readouterr().err


def test_knobs_the_algorithm_lacks_are_skipped_with_the_reason():
    dqn = DQNConfig(total_timesteps=4096)
    plan = objective_plan("l2", dqn)
    assert [knob.name for knob in plan.knobs] == ["learning_rate"]
    assert plan.skipped["vf_coef"].startswith("dqn has no hyperparameter vf_coef")
    with pytest.raises(ConfigError, match="tune_grid vf_coef: dqn has no hyperparameter"):
        objective_plan("l2", dqn, {"vf_coef": (0.1,)})
    assert evolved_plan("evolved", [plan]).settings == plan.settings == 3


def test_a_critic_loss_of_td3_and_sac_is_tuned_over_the_critic_learning_rate():
    # TD3 and SAC have no learning_rate: the learning rate of the network a value loss
    # trains is critic_learning_rate, searched at the same multiples of the run's own
    for inner in (TD3Config(critic_learning_rate=2e-3), SACConfig(critic_learning_rate=2e-3)):
        plan = objective_plan("l2", inner)
        assert [(knob.name, knob.trained) for knob in plan.knobs] == [
            ("critic_learning_rate", (float(f"{2e-3 / 3:.7g}"), 2e-3, 6e-3))]
        assert plan.relative_to == {"critic_learning_rate": 2e-3}
        assert "vf_coef" in plan.skipped
        evolved = evolved_plan("evolved", [plan, objective_plan("huber", inner)])
        assert [knob.name for knob in evolved.knobs] == ["critic_learning_rate"]
        assert evolved.settings == 3


def test_shipped_grids_give_every_objective_twelve_settings():
    plans = [objective_plan(name, PPOConfig()) for name in ("ppo", "l2", "huber", "dpo")]
    assert [plan.settings for plan in plans] == [12, 12, 12, 12]
    assert plans[1].grid == {"vf_coef": [0.03, 0.1, 0.3, 1.0],
                             "learning_rate": [1 / 3, 1.0, 3.0]}
    evolved = evolved_plan("evolved", plans)
    assert evolved.settings == 12 and list(evolved.grid) == ["learning_rate"]
    rates = evolved.grid["learning_rate"]
    assert {1 / 3, 1.0, 3.0} <= set(rates) and rates == sorted(rates)
    # its fine grid widens by the baselines' coarsest step (x3), not its own x1.22
    assert evolved.widen_ratios == {"learning_rate": pytest.approx(3.0)}
    assert all(plan.widen_ratios == {} for plan in plans)
    assert fill_grid([1.0, 4.0], 3) == [1.0, 2.0, 4.0]
    assert fill_grid([0.0, 1.0], 3) == [0.0, 0.5, 1.0]


def test_dpo_reads_alpha_and_beta_traced_from_its_meta_params():
    inputs = LossInputs(ratio=jnp.array([0.5, 0.9, 1.3, 2.0]),
                        log_ratio=jnp.log(jnp.array([0.5, 0.9, 1.3, 2.0])),
                        advantages=jnp.array([1.0, -2.0, 3.0, -0.5]))
    default = make_objective("dpo")
    assert default.init(jax.random.PRNGKey(0)) == {"policy": {}, "value": {}}
    traced = {"policy": {"alpha": jnp.float32(4.0), "beta": jnp.float32(0.3)}, "value": {}}
    static = make_objective("dpo", alpha=4.0, beta=0.3)
    np.testing.assert_allclose(default.policy_loss(traced, inputs),
                               static.policy_loss({"policy": {}, "value": {}}, inputs))
    assert not np.isclose(default.policy_loss(traced, inputs),
                          default.policy_loss({"policy": {}, "value": {}}, inputs))
    with pytest.raises(ConfigError, match="tune_grid alpha: -1 is not allowed for objective "
                                          "'dpo': DPO needs alpha > 0"):
        objective_plan("dpo", PPOConfig(), {"alpha": (-1.0, 2.0)})


def test_dpo_options_are_swept_in_one_program(compilations):
    inner = config_from_dict(TINY).inner[0]
    plan = objective_plan("dpo", inner, {"alpha": (0.01, 4.0), "beta": (0.6,),
                                         "learning_rate": (1.0,)})
    before = len(compilations.events)
    record = tune_objective(plan, make_objective("dpo"), inner, config_from_dict(TINY).fitness,
                            seeds=2, tune_seed=DEFAULT_TUNE_SEED)
    compiled = [name for _, name, _ in compilations.events[before:]]
    assert compiled.count("jit(sweep_program)") == 1
    assert [s["setting"]["alpha"] for s in record["settings"]] == [0.01, 4.0]
    first, second = (s["returns"] for s in record["settings"])
    assert first != second  # the traced alpha reaches the loss
    assert get_objective("dpo").tunables[0].option


# --------------------------------------------------------------------------------------
# the value distance's overall scale, and fitness normalised by the tuned baseline


def test_the_value_distance_can_learn_its_overall_scale_starting_at_l2():
    inputs = LossInputs(values=jnp.array([0.5, -2.0, 3.0]), targets=jnp.array([0.0, 1.0, 1.0]))
    scaled = make_objective("value_distance", hidden_sizes=(8,), learn_scale=True)
    plain = make_objective("value_distance", hidden_sizes=(8,))
    params = scaled.init(jax.random.PRNGKey(1))
    assert params["value"]["log_scale"] == 0.0
    assert "log_scale" not in plain.init(jax.random.PRNGKey(1))["value"]  # old runs load
    l2 = make_objective("l2").value_loss({"policy": {}, "value": {}}, inputs)
    assert scaled.value_loss(params, inputs) == l2  # unchanged at initialisation
    params["value"]["log_scale"] = jnp.log(jnp.float32(0.03))
    np.testing.assert_allclose(scaled.value_loss(params, inputs), 0.03 * l2, rtol=1e-6)
    from metarl.objectives.value_distance import value_distance

    np.testing.assert_allclose(value_distance(params["value"], jnp.array([2.0])), [0.06],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="learn_scale: expected true or false"):
        make_objective("value_distance", learn_scale="yes")


@pytest.mark.parametrize(("fitness", "message"), [
    ({"tune_baseline": True}, "fitness.tune_baseline: only with normalize_by_baseline"),
    ({"tune_baseline": True, "normalize_by_baseline": True, "baseline_returns": [100.0]},
     "fitness.tune_baseline: baseline_returns are given"),
    ({"tune_baseline": True, "normalize_by_baseline": True, "baseline_seeds": 1},
     "fitness.baseline_seeds: tuning the baseline needs at least 2"),
])
def test_a_tuned_fitness_baseline_names_what_it_needs(fitness, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({**TINY, "fitness": fitness})


def test_fitness_can_be_normalised_by_the_tuned_ppo_baseline(tmp_path, compilations):
    from metarl.evolve.kind import BASELINE_TUNING_FILE, EvolveProgram

    config = config_from_dict({
        **TINY, "inner": {**TINY["inner"], "total_timesteps": 512},
        "fitness": {"normalize_by_baseline": True, "tune_baseline": True,
                    "baseline_seeds": 2},
        "run": {"progress": False},
    })
    program = EvolveProgram(config)
    before = len(compilations.events)
    state = program.init()
    compiled = [name for _, name, _ in compilations.events[before:]]
    assert compiled.count("jit(sweep_program)") == 1
    record = program.baseline_tuning["environments"]["CartPole-v1"]
    assert record["grid"] == {"clip_eps": [0.05, 0.1, 0.2, 0.4],
                              "learning_rate": [1 / 3, 1.0, 3.0]}
    means = [s["mean"] for s in record["settings"]]
    assert float(state.baselines[0]) == pytest.approx(max(means))
    default = next(s for s in record["settings"]
                   if s["setting"] == {"clip_eps": 0.2, "learning_rate": 0.005})
    assert float(state.baselines[0]) >= default["mean"]
    program.after_step(tmp_path, state, primary=True)
    saved = json.loads((tmp_path / BASELINE_TUNING_FILE).read_text())
    assert saved["baselines"] == {"CartPole-v1": pytest.approx(float(state.baselines[0]))}
    assert saved["seed"] == config.run.seed + 1
