"""Tuning that widens itself (``metarl evaluate --tune --tune-rounds``): a choice at an edge
of its grid is followed past that edge on the tuning seeds, within the knob's valid range,
until it is inside or the cap is reached; every objective then gets the same number of
settings in all, and the record keeps every round.

The widening is a pure function over a scorer (:func:`metarl.evolve.tuning.widen`), so a
planted optimum is found without training; one tiny real tuned evaluation (a 2-value
learning-rate grid, so that its choice is always at an edge) shows the rounds in the
record.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _evaluation_run import TINY, write_run

from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.evaluate import evaluate_run
from metarl.evolve.tuning import (
    DEFAULT_TUNE_SEED,
    WIDENING_BUDGET_RULE,
    Search,
    balance,
    balance_objective,
    choose,
    fill_grid,
    format_tuning,
    grid_edges,
    next_value,
    objective_plan,
    widen,
)
from metarl.objectives import get_objective, make_objective
from metarl.objectives.l2 import CLIP_EPS
from metarl.objectives.registry import LEARNING_RATE, VF_COEF, Tunable
from metarl.sweep import SweepResult


def planted(knob: str, best: float, log: bool = True):
    """A scorer whose every seed scores ``-(distance to best)^2`` (in log where ``log``),
    and the settings it was asked for, in order."""
    asked: list[dict[str, float]] = []

    def score(settings):
        asked.extend(settings)
        results = []
        for setting in settings:
            value = setting[knob]
            distance = math.log(value / best) if log else value - best
            returns = [-distance ** 2] * 4
            results.append(SweepResult(setting=dict(setting), returns=returns,
                                       mean=returns[0], ci_low=np.nan, ci_high=np.nan,
                                       invalid=0, curves=[]))
        return results

    return score, asked


def anything(knob, value):
    return value > 0


def test_next_value_continues_the_grids_own_spacing():
    assert next_value([1 / 3, 1.0, 3.0], "highest") == 9.0
    assert next_value([1 / 3, 1.0, 3.0], "lowest") == 0.1111
    assert next_value([0.03, 0.1, 0.3, 1.0], "highest") == pytest.approx(3.333)
    assert next_value([-1.0, 0.0], "highest") == 1.0  # not positive: by the difference
    assert next_value([-1.0, 0.0], "lowest") == -2.0


def test_a_given_ratio_replaces_the_grids_own_spacing_for_positive_knobs():
    assert next_value([1.0, 1.25, 1.5], "highest", 3.0) == 4.5
    assert next_value([1.0, 1.25, 1.5], "lowest", 3.0) == 0.3333
    assert next_value([-1.0, 0.0], "highest", 3.0) == 1.0  # not positive: the difference


def test_a_fine_grid_widened_by_the_baselines_step_reaches_what_their_grid_reaches():
    """The evolved objective's learning rates are 12 points over the baselines' 1/3x to 3x:
    widened by their own x1.22 spacing, three rounds end at 5.4x; by the baselines' x3,
    at 27x, as the baselines' own grid does."""
    fine = fill_grid([1 / 3, 1.0, 3.0], 12)
    score, asked = planted("learning_rate", 30.0)
    own = widen({"learning_rate": fine}, score, anything, rounds=3)
    assert max(s["learning_rate"] for s in own.settings) < 6.0
    assert own.edges(choose(own.results)) == {"learning_rate": "highest"}  # still capped
    score, asked = planted("learning_rate", 30.0)
    stepped = widen({"learning_rate": fine}, score, anything, rounds=3,
                    ratios={"learning_rate": 3.0})
    assert [s["learning_rate"] for s in asked][12:] == [9.0, 27.0, 81.0]
    assert stepped.settings[choose(stepped.results)] == {"learning_rate": 27.0}


def test_a_best_learning_rate_far_outside_the_first_grid_is_found():
    score, asked = planted("learning_rate", 30.0)
    search = widen({"learning_rate": (1 / 3, 1.0, 3.0)}, score, anything, rounds=3)
    index = choose(search.results)
    assert search.settings[index] == {"learning_rate": 27.0}  # x27: the grid point nearest x30
    assert [s["learning_rate"] for s in asked] == [1 / 3, 1.0, 3.0, 9.0, 27.0, 81.0]
    assert [entry["reason"] for entry in search.rounds] == ["grid", "widen", "widen", "widen"]
    assert [entry["chosen"]["learning_rate"] for entry in search.rounds] == [3.0, 9.0, 27.0,
                                                                             27.0]
    assert search.rounds[2]["grid"] == {"learning_rate": [1 / 3, 1.0, 3.0, 9.0, 27.0]}
    assert search.rounds[3]["at_edge"] == {}  # inside its values: widening stops
    assert search.rounds[1]["added"][0]["score"] == pytest.approx(-math.log(9 / 30) ** 2)


def test_the_cap_stops_widening_with_the_choice_still_at_its_edge():
    score, asked = planted("learning_rate", 30.0)
    search = widen({"learning_rate": (1 / 3, 1.0, 3.0)}, score, anything, rounds=1)
    assert [s["learning_rate"] for s in asked] == [1 / 3, 1.0, 3.0, 9.0]
    assert search.edges(choose(search.results)) == {"learning_rate": "highest"}
    # the low side widens the same way, by the grid's own ratio
    score, asked = planted("learning_rate", 0.01)
    widen({"learning_rate": (1 / 3, 1.0, 3.0)}, score, anything, rounds=2)
    assert [s["learning_rate"] for s in asked][3:] == [0.1111, 0.03703]


def test_a_knob_is_not_widened_past_its_valid_range():
    score, asked = planted("clip_eps", 0.95, log=False)
    search = widen({"clip_eps": (0.2, 0.4)}, score,
                   lambda knob, value: CLIP_EPS.allows(value), rounds=3)
    assert [s["clip_eps"] for s in asked] == [0.2, 0.4, 0.8]  # 1.6 is past clip_eps < 1
    assert [entry["reason"] for entry in search.rounds] == ["grid", "widen"]
    assert search.edges(choose(search.results)) == {"clip_eps": "highest"}


def test_only_the_knob_at_an_edge_is_widened_from_the_best_setting():
    def score(settings):
        return [SweepResult(setting=s, returns=[v] * 2, mean=v, ci_low=np.nan,
                            ci_high=np.nan, invalid=0, curves=[])
                for s in settings
                for v in [-math.log(s["learning_rate"] / 9) ** 2 - (s["vf_coef"] - 0.3) ** 2]]

    search = widen({"learning_rate": (1.0, 3.0), "vf_coef": (0.1, 0.3, 1.0)}, score,
                   anything, rounds=3)
    added = [a["setting"] for entry in search.rounds[1:] for a in entry["added"]]
    assert added == [{"learning_rate": 9.0, "vf_coef": 0.3},
                     {"learning_rate": 27.0, "vf_coef": 0.3}]
    assert search.settings[choose(search.results)] == {"learning_rate": 9.0, "vf_coef": 0.3}


def test_balance_refines_between_the_best_settings_neighbours():
    score, _ = planted("learning_rate", 1.0)
    search = widen({"learning_rate": (1 / 3, 1.0, 3.0)}, score, anything, rounds=3)
    assert len(search.settings) == 3  # chosen inside at once: nothing widened
    balanced = balance(search, score, 6, anything)
    assert [s["learning_rate"] for s in balanced.settings[3:]] == [0.5774, 1.732, 0.7599]
    assert balanced.rounds[-1]["reason"] == "balance"
    assert balance(balanced, score, 6, anything) is balanced  # as many already


def test_balance_extends_past_an_edge_where_no_neighbour_is_left():
    score, _ = planted("learning_rate", 100.0)
    search = widen({"learning_rate": (1.0, 3.0)}, score, anything, rounds=0)
    balanced = balance(search, score, 4, anything)
    assert [s["learning_rate"] for s in balanced.settings[2:]] == [1.732, 9.0]
    # nothing left to add (a single value, no range to step into): unchanged
    single = widen({"learning_rate": (1.0,)}, score, anything, rounds=3)
    assert balance(single, score, 3, anything) is single


def test_valid_ranges_are_declared_for_the_shipped_knobs():
    assert LEARNING_RATE.low == 0 and LEARNING_RATE.high is None
    assert VF_COEF.low == 0 and (CLIP_EPS.low, CLIP_EPS.high) == (0, 1)
    dpo = {t.name: t for t in get_objective("dpo").tunables}
    assert dpo["alpha"].low == 0 and dpo["beta"].low == 0
    assert dpo["learning_rate"] is LEARNING_RATE  # its fallback: the critic learning rate
    assert LEARNING_RATE.fallbacks == ("critic_learning_rate",)
    assert not CLIP_EPS.allows(1.0) and CLIP_EPS.allows(0.99) and not VF_COEF.allows(0.0)
    with pytest.raises(ValueError, match=r"tunable x: values \[1.5\] lie outside its valid"):
        Tunable("x", (0.5, 1.5), low=0.0, high=1.0)


def test_a_grid_value_outside_the_valid_range_is_named():
    inner = config_from_dict(TINY).inner[0]
    with pytest.raises(ConfigError, match=r"tune_grid clip_eps: 1.5 outside its valid range "
                                          r"\(0.0, 1.0\) for objective 'ppo'"):
        objective_plan("ppo", inner, {"clip_eps": (0.2, 1.5)})


def test_an_old_record_without_rounds_still_reads():
    old = {"grid": {"vf_coef": [0.1, 1.0]}, "chosen": {"vf_coef": 1.0}, "relative_to": {},
           "skipped": {}, "chosen_index": 1, "budget": {"settings": 2, "seeds": 2},
           "settings": [{"mean": 1.0, "iqm": 1.0}, {"mean": 2.0, "iqm": 2.0}]}
    assert grid_edges(old) == {"vf_coef": "highest"}
    text = format_tuning({"tuning": {"seeds": 2, "tune_seed": 5, "tune_by": "iqm",
                                     "environments": {"CartPole-v1": {"l2": old}}}})
    assert "at the end of its grid: vf_coef (its highest); the best setting may lie beyond " \
           "(widen with --tune-grid)" in text and "rounds:" not in text
    assert Search((), (), ()).rounds == ()


GRID = {"learning_rate": [0.01, 0.03], "vf_coef": [0.5]}  # x0.01, x0.03: far too low


@pytest.fixture(scope="module")
def widened(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("widening") / "run")
    return evaluate_run(run_dir, seeds=2, baselines=["l2"], tune=True, tune_seeds=2,
                        tune_grid=GRID, tune_rounds=1)


def test_a_real_tuned_evaluation_widens_and_keeps_every_round(widened):
    records = widened["tuning"]["environments"]["CartPole-v1"]
    assert widened["spec"]["tune"]["rounds"] == 1 and widened["tuning"]["rounds"] == 1
    assert widened["tuning"]["budget_rule"] == WIDENING_BUDGET_RULE
    for name, record in records.items():
        rounds = record["rounds"]
        assert [entry["reason"] for entry in rounds] == ["grid", "widen"], name
        assert [a["setting"]["learning_rate"] for a in rounds[0]["added"]] == [0.01, 0.03]
        # two values: the first choice is at an edge, so one step past it by x3 follows
        first = rounds[0]["chosen"]["learning_rate"]
        step = 0.09 if first == 0.03 else 0.003333
        assert [a["setting"]["learning_rate"] for a in rounds[1]["added"]] == [step], name
        assert record["budget"]["settings"] == len(record["settings"]) == 3, name
        assert record["widening"]["cap"] == 1 and record["widening"]["rounds"] == 1
        chosen = record["settings"][record["chosen_index"]]["setting"]["learning_rate"]
        assert chosen == pytest.approx(rounds[-1]["chosen"]["learning_rate"] * 0.005)
        final, values = rounds[-1]["chosen"]["learning_rate"], sorted([0.01, 0.03, step])
        assert (record["widening"]["capped"] != {}) == (final in (values[0], values[-1]))
    assert records["evolved"]["budget"] == records["l2"]["budget"]  # equal budget
    # the evolved objective steps by the baselines' coarsest ratio, and the spec says so
    # (an evaluation widened by another rule is not found identical to this one)
    assert records["evolved"]["widening"]["ratios"] == {"learning_rate": pytest.approx(3.0)}
    assert records["l2"]["widening"]["ratios"] == {}
    assert widened["spec"]["tune"]["widen_ratios"] == {
        "CartPole-v1": {"evolved": {"learning_rate": pytest.approx(3.0)}}}
    text = format_tuning(widened)
    assert "grids widened past an edge for up to 1 rounds;" in text
    assert "rounds: grid +2; widen +1" in text
    capped = [name for name, record in records.items() if record["widening"]["capped"]]
    assert text.count("when the cap of 1 widening rounds was reached") == len(capped)
    assert [r["objective"] for r in widened["results"]][-2:] == ["evolved (tuned)",
                                                                 "l2 (tuned)"]


def test_a_record_is_balanced_to_the_count_of_the_objective_with_most(widened):
    """What an evaluation does for an objective that widened less than another: the same
    tuning seeds, extra points of its own grid, chosen again over all of them."""
    record = widened["tuning"]["environments"]["CartPole-v1"]["l2"]
    config = config_from_dict(TINY)
    inner = config.inner[0]
    plan = objective_plan("l2", inner, {key: tuple(values) for key, values in GRID.items()})
    balanced = balance_objective(plan, record, 5, make_objective("l2"), inner, config.fitness,
                                 2, DEFAULT_TUNE_SEED)
    assert balanced["budget"] == {"settings": 5, "seeds": 2, "runs": 10}
    assert [entry["reason"] for entry in balanced["rounds"]] == ["grid", "widen", "balance"]
    assert balanced["settings"][:3] == record["settings"]  # the scores made before are kept
    chosen = record["rounds"][-1]["chosen"]["learning_rate"]
    values = sorted(a["setting"]["learning_rate"] for entry in record["rounds"]
                    for a in entry["added"])
    added = [a["setting"] for a in balanced["rounds"][-1]["added"]]
    assert all(a["vf_coef"] == 0.5 for a in added)  # the best setting's other knobs kept
    position = values.index(chosen)
    # first towards the lower neighbour (the midpoint in log), or past the lowest value
    first = (float(f"{math.sqrt(chosen * values[position - 1]):.4g}") if position > 0
             else next_value(values, "lowest"))
    assert added[0]["learning_rate"] == first
    scores = [s["iqm"] for s in balanced["settings"]]
    assert balanced["chosen_index"] == int(np.argmax(scores))
    assert balance_objective(plan, balanced, 5, make_objective("l2"), inner, config.fitness,
                             2, DEFAULT_TUNE_SEED) is balanced


def test_the_command_line_passes_the_cap_and_finds_the_same_evaluation(widened, capsys):
    run_dir = widened["run_dir"]
    flags = ["--seeds", "2", "--baselines", "l2", "--tune", "--tune-seeds", "2",
             "--tune-grid", "learning_rate=0.01,0.03", "--tune-grid", "vf_coef=0.5"]
    assert main(["evaluate", run_dir, *flags, "--tune-rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert f"reusing {widened['path']}" in out and "rounds: grid +2; widen +1" in out
    assert f"keys split from root {widened['eval_seed']}" in out
    assert main(["evaluate", run_dir, *flags, "--tune-rounds", "-1"]) == 2
    assert "tune_rounds: expected a count of widening rounds" in capsys.readouterr().err


def test_widening_rounds_and_balancing_reuse_one_compiled_sweep(compilations):
    """Where training is short, compilation dominates: every round of one objective's
    search, and its balancing, runs the program compiled for the declared grid (padded to
    its size)."""
    from inner_loops import PPOConfig
    from metarl.evolve.config import FitnessConfig
    from metarl.evolve.tuning import balance_objective, objective_plan, tune_objective

    inner = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, hidden_sizes=(8,),
                      update_epochs=1, num_minibatches=1)  # a program no other test builds
    plan = objective_plan("l2", inner, {"learning_rate": (0.01, 0.03), "vf_coef": (0.5,)})
    objective = make_objective("l2")

    def sweeps() -> int:
        return sum("sweep_program" in name for _, name, _ in compilations.events)

    before = sweeps()
    record = tune_objective(plan, objective, inner, FitnessConfig(), 2, 5, rounds=2)
    balanced = balance_objective(plan, record, record["budget"]["settings"] + 1, objective,
                                 inner, FitnessConfig(), 2, 5)
    assert record["widening"]["rounds"] >= 1  # two values: the choice is at an edge
    assert balanced["budget"]["settings"] == record["budget"]["settings"] + 1
    assert sweeps() - before == 1


def test_a_search_balanced_in_a_new_process_pads_as_the_one_that_made_it(monkeypatch):
    """A member's result can differ in float rounding with its program's size, so a search
    read from the store and balanced where nothing was compiled yet must pad to the sizes
    its own rounds trained at, not to whatever the process holds."""
    from inner_loops import PPOConfig
    from metarl import programs
    from metarl.evolve import tuning
    from metarl.evolve.config import FitnessConfig

    inner = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, hidden_sizes=(8,),
                      update_epochs=1, num_minibatches=1)
    plan = tuning.objective_plan("l2", inner, {"learning_rate": (0.01, 0.03),
                                               "vf_coef": (0.5,)})
    objective = make_objective("l2")
    members = []
    train_sweep = tuning.train_sweep

    def counted(learner, keys, *args):
        members.append(int(keys.shape[0]))
        return train_sweep(learner, keys, *args)

    monkeypatch.setattr(tuning, "train_sweep", counted)
    record = tuning.tune_objective(plan, objective, inner, FitnessConfig(), 2, 5, rounds=2)
    searched = set(members)
    assert searched == {4}  # the 2-setting grid; its widening rounds padded up to it
    balance = [plan, record, record["budget"]["settings"] + 1, objective, inner,
               FitnessConfig(), 2, 5]
    here = tuning.balance_objective(*balance)
    monkeypatch.setattr(programs, "_PROGRAMS", type(programs._PROGRAMS)())  # a new process
    members.clear()
    elsewhere = tuning.balance_objective(*balance)
    assert set(members) <= searched
    assert _without_timings(elsewhere) == _without_timings(here)


def _without_timings(record):
    return {k: v for k, v in record.items() if not k.endswith("_seconds")}


def test_padding_reuses_a_compiled_size_only_while_its_extra_training_is_small():
    """A 1-setting round of a longer training (classic's CartPole: 25,600 steps x 8 seeds)
    compiles its own program instead of training eleven repeats; a short one reuses the
    compiled grid."""
    from metarl.evolve.tuning import PAD_AGENT_STEPS, padded_size

    assert PAD_AGENT_STEPS == 500_000
    compiled = {12 * 8, 4 * 8}  # member counts: a 12-setting and a 4-setting program
    assert padded_size(1, 8, 25_600, compiled) == 1
    assert padded_size(3, 8, 62_500, compiled) == 4  # one extra setting: 5e5 agent-steps
    assert padded_size(3, 8, 62_501, compiled) == 3
    assert padded_size(1, 8, 192, compiled) == 4  # the smallest size that holds them
    assert padded_size(5, 8, 192, compiled) == 12
    assert padded_size(13, 8, 192, compiled) == 13  # larger than any compiled program
    assert padded_size(2, 8, 192, set()) == 2
    assert padded_size(1, 5, 192, compiled) == 1  # no size divides into 5-seed settings
    assert padded_size(1, 8, 10, compiled, budget=0) == 1


def test_rows_that_settled_where_the_other_never_tuned_are_marked():
    """The engines' CartPole drift in miniature: PPO's widening reached a learning rate of
    27x while the drift's best first-grid point was inside its grid, so it never tried
    27x; the tuned verdict between them is marked, with both choices and both ranges, and
    a pair whose choices each lie inside the other's range is not."""
    from metarl.evolve.verdicts import APART_MARK, format_table, settled_apart

    def row(chosen, scored):
        return {"chosen": {"learning_rate": chosen},
                "settings": [{"setting": {"learning_rate": v}} for v in scored]}

    def comparison(baseline):
        return {"evolved": "evolved (tuned)", "baseline": f"{baseline} (tuned)",
                "probability_of_improvement": 0.02, "low": 0.0, "high": 0.05,
                "paired": True, "verdict": "worse"}

    report = {"seeds": 4, "eval_seed": 10008, "results": [],
              "tuning": {"environments": {"CartPole-v1": {
                  "evolved": row(6.4e-4, [8.3e-5, 2.5e-4, 6.4e-4, 7.5e-4]),
                  "ppo": row(6.75e-3, [8.3e-5, 2.5e-4, 7.5e-4, 2.25e-3, 6.75e-3, 2.0e-2]),
                  "dpo": row(7.5e-4, [8.3e-5, 2.5e-4, 7.5e-4, 2.25e-3])}}},
              "statistics": {"environments": {"CartPole-v1": {
                  "objectives": {},
                  "comparisons": [comparison("ppo"), comparison("dpo")]}}}}
    apart = settled_apart(report)
    assert list(apart) == [("CartPole-v1", "evolved (tuned)", "ppo (tuned)")]
    entry, = apart[("CartPole-v1", "evolved (tuned)", "ppo (tuned)")]
    assert entry["chosen"] == {"evolved": 6.4e-4, "ppo": 6.75e-3}
    assert entry["scored"]["evolved"] == [8.3e-5, 7.5e-4]
    table = format_table(report)
    marked = [line for line in table.splitlines() if line.rstrip().endswith(APART_MARK.strip())]
    assert len(marked) == 1 and "ppo (tuned)" in marked[0]
    assert "learning_rate 0.00064 against 0.00675" in table
