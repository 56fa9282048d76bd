"""Symbolic distillation: planted formulas are recovered, the symbolic objectives compute the
losses they are written as and train under jit and vmap, bad input is a clear error, and
``metarl distill`` runs end to end on a tiny evolution run directory."""

from __future__ import annotations

import json
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_evolution import TINY

from inner_loops.objective import LossInputs, squared_error
from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.distill import (
    DistillConfig,
    distill_run,
    drift_basis,
    fit_formulas,
    value_basis,
)
from metarl.evolve.generation import build_learner
from metarl.kinds import load_experiment
from metarl.objectives import make_objective
from metarl.objectives.symbolic import compile_expression
from metarl.runs.layout import write_json
from metarl.runs.meta_params import save_meta_params


def _held_out(size, seed=0):
    return np.random.default_rng(seed).random(size) < 0.2


def test_a_planted_asymmetric_scaled_l2_is_recovered_with_its_two_terms():
    x = np.random.default_rng(1).normal(0.0, 2.0, 3000)
    target = 0.5 * x**2 + 0.2 * x * np.abs(x)  # 0.7 x^2 above zero, 0.3 x^2 below
    formulas = fit_formulas({"x": x}, target, value_basis(), ("x",), 4, _held_out(x.size))
    two = next(f for f in formulas if f["terms"] == 2)
    assert two["mse"] < 1e-8 and two["r2"] > 1 - 1e-9
    assert two["expression"] in ("0.5*x**2 + 0.2*x*Abs(x)", "0.2*x*Abs(x) + 0.5*x**2")
    assert formulas[-1] is two  # nothing more complex is more accurate
    assert formulas[0]["terms"] == 1 and formulas[0]["mse"] > two["mse"]


def test_a_planted_drift_is_recovered_and_vanishes_at_ratio_one():
    rng = np.random.default_rng(2)
    r = np.exp(rng.normal(0.0, 0.3, 4000))
    a = rng.normal(0.0, 1.0, r.size)
    u = (r - 1) * a
    target = 1.5 * np.maximum(0.0, u - 2 * np.tanh(u / 2)) + 0.5 * np.log(r) ** 2
    inputs = {"r": r, "A": a}
    formulas = fit_formulas(inputs, target, drift_basis(0.2, progress=False), ("r", "A"), 3,
                            _held_out(r.size), nonnegative=True)
    two = next(f for f in formulas if f["terms"] == 2)
    assert two["mse"] < 1e-10 and two["r2"] > 1 - 1e-8
    assert two["expression"].startswith("Max(0, ")
    assert "tanh(A*(r - 1)/2)" in two["expression"] and "log(r)**2" in two["expression"]
    drift = compile_expression(two["expression"], ("r", "A"))
    assert np.all(np.asarray(drift(jnp.ones(5), jnp.linspace(-3, 3, 5))) == 0.0)


def _inputs():
    rng = np.random.default_rng(3)
    values, targets = rng.normal(size=(2, 64)).astype(np.float32)
    ratio = np.exp(rng.normal(0.0, 0.2, 64)).astype(np.float32)
    advantages = rng.normal(size=64).astype(np.float32)
    return LossInputs(ratio=jnp.asarray(ratio), log_ratio=jnp.log(ratio),
                      advantages=jnp.asarray(advantages), values=jnp.asarray(values),
                      targets=jnp.asarray(targets), clip_eps=jnp.float32(0.2),
                      progress=jnp.float32(0.25))


def test_symbolic_objectives_equal_the_losses_written_by_hand():
    inputs = _inputs()
    l2 = make_objective("symbolic", value="0.5*x**2")
    assert l2.init(jax.random.PRNGKey(0)) == {"policy": {}, "value": {}}
    assert l2.value_loss({"value": {}}, inputs) == squared_error().loss({}, inputs)

    drift = make_objective("symbolic_drift",
                           drift="relu((r - 1)*A - 2*tanh((r - 1)*A/2)) + p*log(r)**2")
    r, a = inputs.ratio, inputs.advantages
    by_hand = jax.nn.relu((r - 1) * a - 2 * jnp.tanh((r - 1) * a / 2)) + 0.25 * jnp.log(r)**2
    expected = -jnp.mean(r * a - by_hand)
    np.testing.assert_allclose(drift.policy_loss({"policy": {}}, inputs), expected, rtol=1e-6)


@pytest.mark.parametrize("text, message", [
    ("y + 1", "unknown name.*y.*allowed: variables x"),
    ("foo(x)", "unknown function.*foo"),
    ("x +", "cannot parse"),
    ("", "non-empty string"),
])
def test_bad_expressions_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        make_objective("symbolic", value=text)


def test_a_bad_expression_in_an_experiment_is_a_config_error():
    data = tomllib.loads(TINY)
    data["objective"] = {"name": "symbolic_drift", "options": {"drift": "r*x"}}
    with pytest.raises(ConfigError, match=r"objective: .*unknown name\(s\) x"):
        config_from_dict(data).objective.build()


def test_a_symbolic_drift_trains_under_jit_and_vmap():
    inner = config_from_dict(tomllib.loads(TINY)).inner[0].replace(total_timesteps=512)
    objective = make_objective("symbolic_drift", drift="Max(0, 0.5*(r - 1)**2*Abs(A))")
    learner = build_learner(inner, objective)
    metrics = jax.jit(jax.vmap(learner.train, in_axes=(0, None)))(
        jax.random.split(jax.random.PRNGKey(0), 2), objective.init(jax.random.PRNGKey(0)))
    returns = np.asarray(metrics["episode_return"])
    assert returns.shape[0] == 2 and np.isfinite(returns[:, -1]).all()


def test_distill_options_are_checked():
    with pytest.raises(ConfigError, match="candidate: got 'worst'; allowed: mean, best"):
        DistillConfig(candidate="worst")
    with pytest.raises(ConfigError, match="max_complexity"):
        DistillConfig(max_complexity=0)


def _run_dir(path, objective=None, data=None):
    """A run directory as an evolution run leaves it (config and mean meta-parameters),
    with perturbed meta-parameters so the evolved function is not L2; ``data`` is the
    experiment (default: the tiny PPO one)."""
    data = tomllib.loads(TINY) if data is None else data
    if objective is not None:
        data["objective"] = objective
    config = config_from_dict(data)
    path.mkdir()
    write_json(path / "config.json", config.to_dict())
    params = config.objective.build().init(jax.random.PRNGKey(1))
    params = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(2),
                                                                a.shape), params)
    save_meta_params(path / "mean_meta_params.msgpack", params)
    return path


def test_cli_distills_a_run_and_writes_an_experiment_of_its_formula(tmp_path, capsys):
    run = _run_dir(tmp_path / "vd")
    (run / "metrics.jsonl").write_text('{"generation": 1}\n')
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code = main(["distill", str(run), "--samples", "600", "--total-timesteps", "512",
                 "--max-complexity", "3", "--write-experiment", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "d(x) of the mean candidate" in out and "held-out MSE" in out
    saved = json.loads((run / "distill.json").read_text())
    entry = saved["candidates"]["mean"]
    assert entry["objective"] == "value_distance" and entry["variables"] == ["x"]
    errors = [f["mse"] for f in entry["formulas"]]
    assert errors == sorted(errors, reverse=True) and len(errors) >= 1
    assert entry["formulas"][-1]["r2"] > 0.9
    assert "\\begin{tabular}" in (run / "distill.tex").read_text()
    assert (run / "plots" / "distill_mean.png").stat().st_size > 0
    for name, content in before.items():  # the run's own files are left as they were
        assert (run / name).read_bytes() == content
    experiment = load_experiment(run / "distilled_mean_0.json")
    assert experiment.objective.name == "symbolic"
    assert experiment.objective.options["value"] == entry["formulas"][0]["expression"]

    # the formula is judged against the network it came from on the same held-out seeds
    last = len(entry["formulas"]) - 1
    code = main(["evaluate", str(run), "--seeds", "2", "--baselines", "l2",
                 "--total-timesteps", "512", "--distilled", str(last)])
    assert code == 0, capsys.readouterr().err
    record = json.loads(sorted((run / "evaluations").glob("*.json"))[-1].read_text())
    label = f"distilled {last}"
    assert [r["objective"] for r in record["results"]] == ["evolved", "l2", label]
    assert record["spec"]["distilled"] == {label: {"value": entry["formulas"][-1][
        "expression"]}}
    comparisons = record["statistics"]["environments"]["CartPole-v1"]["comparisons"]
    assert {(c["evolved"], c["baseline"]) for c in comparisons} == {("evolved", "l2"),
                                                                   ("evolved", label)}
    assert main(["evaluate", str(run), "--seeds", "2", "--distilled", "99"]) == 2
    assert "formula 99 does not exist" in capsys.readouterr().err


def test_cli_distill_errors_name_the_problem(tmp_path, capsys):
    assert main(["distill", str(tmp_path)]) == 2
    assert "is not a metarl run" in capsys.readouterr().err
    run = _run_dir(tmp_path / "vd")
    assert main(["distill", str(run), "--candidate", "best"]) == 2
    assert "no best meta-parameters" in capsys.readouterr().err
    dpo = _run_dir(tmp_path / "dpo", {"name": "dpo"})
    assert main(["distill", str(dpo)]) == 2
    assert "objective 'dpo' has no evolved function to distil" in capsys.readouterr().err
    assert main(["distill", str(run), "--write-experiment", "0", "--no-fit"]) == 2
    assert "no distillation of the mean candidate" in capsys.readouterr().err


# TD3 on Pendulum with tiny networks: 8 updates of 4 environments x 16 steps, the first only
# collecting (learning_starts 128 needs two updates' steps), then 4 gradient steps on batches
# of 32 for each of the 7 others.
TD3_TINY = """
name = "tiny_td3"
[objective]
name = "value_distance"
options = { hidden_sizes = [8] }
[inner]
algorithm = "td3"
env_id = "Pendulum-v1"
num_envs = 4
train_frequency = 16
gradient_steps = 4
total_timesteps = 512
buffer_size = 512
batch_size = 32
learning_starts = 128
actor_hidden_sizes = [16]
critic_hidden_sizes = [16]
[es]
population_size = 4
generations = 2
[run]
progress = false
"""


def test_the_critic_loss_of_an_off_policy_learner_is_distilled_from_its_td_errors(tmp_path):
    """A value distance filling TD3's critic slot is distilled from the errors ``Q - y``
    that both twin critics' losses see, and its formula reproduces the network there."""
    data = tomllib.loads(TD3_TINY)
    run = _run_dir(tmp_path / "td3", data=data)
    inner = config_from_dict(data).inner[0]
    entry = distill_run(run, samples=600, max_complexity=3, seeds=2, plots=False)

    # Every input of every gradient step: 2 agents x 7 learning updates x 4 steps x 32
    # transitions x 2 critics, and none of the collecting-only first update.
    learning_updates = inner.num_updates - inner.warmup_updates
    assert learning_updates == 7
    assert entry["recorded"]["inputs"] == 2 * learning_updates * 4 * 32 * 2
    assert entry["recorded"]["environments"] == ["Pendulum-v1"]
    # They are TD errors x = Q(s, a) - y: the critics start near 0 and Pendulum's rewards
    # lie in [-16.3, 0], so y = r + 0.98 Q'(s', a') is near r and x near -r, in [0, 16.3].
    quantiles = entry["quantiles"]["x"]
    assert quantiles["0.001"] > -2.0 and quantiles["0.999"] < 20.0
    assert 1.0 < quantiles["0.5"] < 16.3

    # the most accurate formula reproduces the (perturbed, not L2) network on held-out errors
    best, reference = entry["formulas"][-1], entry["reference"]
    assert best["r2"] > 0.999 and best["mse"] < reference["mse"] / 10
