"""The meta-gradient engine (``[meta] method = "metagradient"``,
:mod:`metarl.evolve.metagradient`): its config, its gradients, its runs.

**Gradients.** On two tiny problems the meta-gradient of one agent is checked against
central finite differences of the same function, along three directions (the gradient's own
and two random ones), in float32 with a step of 0.01 (measured: relative errors 4e-5 to
2e-2, the largest on the smallest directional derivatives, where stopping the rollouts'
gradient at ``K = 2`` is off by 10 % to 13 %; a step of 0.03 crosses a kink of the drift's
ReLU along the gradient's direction):

- ``DRIFT``: LPO's drift (random initialisation) for PPO on the continuous
  ``observation_action`` probe. At ``K = 1`` update with the default, rollouts as data:
  the one rollout is collected by the agent before any update, so that is the exact
  derivative. At ``K = 2`` differentiating through the rollouts too
  (``meta.rollout_gradient``: the exact derivative, environment included); the default
  then gives another gradient;
- ``VALUE``: a value distance for PPO on the discrete probe, scored by the critic's error
  (``value_error``), ``K = 2``, rollouts as data: its episodes last one step, so its value
  targets are the rewards, which no parameter changes, and nothing the critic learns from
  depends on the rollouts' parameters (no gradient-norm clip ties it to the actor): the
  default gradient is the exact derivative here, and must match the differences too.

The function differenced is the meta-objective of the agent after the unroll on the
validation rollout collected at the unperturbed point (the engine holds that rollout fixed
too: its gradient is that of the policy-gradient surrogate, not of the returns the rollout
happened to sample).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kill import kill_inside_save
from jax.flatten_util import ravel_pytree

import metarl
from metarl.cli import main
from metarl.config import ConfigError, apply_overrides, upgrade_saved_config
from metarl.evolve import report as report_module
from metarl.evolve.config import config_from_dict
from metarl.evolve.engines import engine_of
from metarl.evolve.generation import Evolution, search_start
from metarl.evolve.metagradient import MetaGradient, first_lifetimes, metagradient_start
from metarl.evolve.metagradient_config import EvolutionMeta, MetaGradientConfig
from metarl.evolve.metagradient_kind import MetaGradientResult
from metarl.kinds import evaluate, load_experiment, load_run, plot, resume, start
from metarl.runs.layout import read_metrics
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE

WORKER = Path(__file__).with_name("_metagradient_worker.py")
FD_STEP = 0.01
DRIFT = {
    "objective": {"name": "lpo", "options": {"hidden_sizes": [4]}},
    "inner": {"env_id": "probe/observation_action-continuous", "num_envs": 4, "num_steps": 2,
              "total_timesteps": 64, "update_epochs": 1, "num_minibatches": 2,
              "hidden_sizes": [8], "learning_rate": 0.05, "anneal_lr": False},
    "meta": {"method": "metagradient", "agents": 2},
    "run": {"progress": False},
}
VALUE = {
    "objective": {"name": "value_distance",
                  "options": {"hidden_sizes": [4], "form": "even_scaled_l2"}},
    "inner": {"env_id": "probe/observation_action-discrete", "num_envs": 4, "num_steps": 2,
              "total_timesteps": 64, "update_epochs": 2, "num_minibatches": 1,
              "hidden_sizes": [8], "learning_rate": 0.05, "anneal_lr": False,
              "max_grad_norm": 1e6},
    "meta": {"method": "metagradient", "agents": 2, "objective": "value_error"},
    "run": {"progress": False},
}


def experiment(base: dict, **meta) -> dict:
    return {**base, "meta": {**base["meta"], **meta}}


class Problem:
    """One agent of ``data``'s experiment at its start (``like``'s agent and start where
    given), with the jitted meta-gradient and the function that finite differences measure
    (module docstring)."""

    def __init__(self, data: dict, like: Problem | None = None):
        self.metagradient = MetaGradient(config_from_dict(data))
        if like is None:
            state = self.metagradient.init()
            self.theta = state.meta_params
            self.agent = jax.tree.map(lambda x: x[0], state.agents)
        else:  # the same start: ``like``'s experiment but for meta.unroll or rollout_gradient,
            # which do not enter the init (its program would be compiled again for nothing)
            self.theta, self.agent = like.theta, like.agent
        self.hypers = self.metagradient.learner.default_hypers
        self.key = jax.random.PRNGKey(3)
        self.flat, self.unravel = ravel_pytree(self.theta)
        self._gradient = jax.jit(self.metagradient.agent_meta_gradient)
        self._objective = jax.jit(self.objective)

    def gradient(self, hypers=None) -> np.ndarray:
        hypers = self.hypers if hypers is None else hypers
        gradient = self._gradient(self.theta, self.agent, hypers, self.key)[0]
        return np.asarray(ravel_pytree(gradient)[0], np.float64)

    def objective(self, flat):
        """The meta-objective after the unroll from ``flat`` meta-parameters, on the
        validation rollout of the unperturbed unroll."""
        metagradient, hypers = self.metagradient, self.hypers
        trained, _ = metagradient.unroll(self.theta, self.agent, hypers)
        batch, _ = metagradient.validation_batch(trained, hypers, self.key)
        trained, _ = metagradient.unroll(self.unravel(flat), self.agent, hypers)
        return metagradient.meta_loss(trained.params, batch, hypers)

    def differences(self, directions: np.ndarray) -> np.ndarray:
        """Central differences of :meth:`objective` along each row of ``directions``."""
        return np.asarray([
            (float(self._objective(self.flat + FD_STEP * d))
             - float(self._objective(self.flat - FD_STEP * d))) / (2 * FD_STEP)
            for d in jnp.asarray(directions, jnp.float32)])


def directions(gradient: np.ndarray, seed: int = 0) -> np.ndarray:
    """The gradient's own direction and two random ones, each of unit length."""
    rows = np.concatenate([gradient[None], np.random.default_rng(seed).standard_normal(
        (2, gradient.size))])
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def assert_matches(gradient: np.ndarray, differences: np.ndarray, rows: np.ndarray):
    analytic = rows @ gradient
    tolerance = 0.02 * np.abs(analytic) + 1e-3 * np.linalg.norm(gradient)
    assert np.all(np.abs(differences - analytic) <= tolerance), (analytic, differences)


@pytest.fixture(scope="module")
def problems():
    """The problems of the module docstring, built once (each compiles its own programs;
    the drifts share one start)."""
    drift = Problem(experiment(DRIFT, unroll=1))
    return {
        "drift_1": drift,
        "drift_2_exact": Problem(experiment(DRIFT, unroll=2, rollout_gradient=True), drift),
        "value_2": Problem(experiment(VALUE, unroll=2)),
    }


@pytest.mark.parametrize("name", ["drift_1", "drift_2_exact", "value_2"])
def test_the_meta_gradient_matches_finite_differences(problems, name):
    problem = problems[name]
    gradient = problem.gradient()
    assert np.linalg.norm(gradient) > 0
    rows = directions(gradient)
    assert_matches(gradient, problem.differences(rows), rows)


def test_rollouts_are_data_unless_asked(problems):
    """By default what a rollout produces carries no gradient: at ``K = 2`` the gradient is
    then no longer the derivative (the second rollout's log-probabilities and values, and
    the environment, depend on the first update)."""
    exact = problems["drift_2_exact"]
    gradient = Problem(experiment(DRIFT, unroll=2), exact).gradient()
    rows = directions(exact.gradient())
    assert np.max(np.abs(rows @ gradient - exact.differences(rows))) > 0.03 * np.linalg.norm(
        exact.gradient())


def test_the_meta_gradient_is_zero_where_the_learned_loss_cannot_matter(problems):
    """A value distance with ``vf_coef = 0`` trains no critic; a drift with a learning rate
    of 0 moves no parameter: exactly zero. The same problems otherwise have a gradient."""
    value, drift = problems["value_2"], problems["drift_2_exact"]
    assert np.all(value.gradient(value.hypers._replace(vf_coef=jnp.float32(0.0))) == 0)
    assert np.all(drift.gradient(drift.hypers._replace(learning_rate=jnp.float32(0.0))) == 0)
    assert np.count_nonzero(value.gradient()) and np.count_nonzero(drift.gradient())


def test_the_config_names_every_field_it_refuses():
    data = experiment(DRIFT)
    cases = {
        "meta.unroll: must be a positive integer": {"meta": {**data["meta"], "unroll": 0}},
        "meta.objective: got 'return'; allowed: actor_critic, policy, value_error":
            {"meta": {**data["meta"], "objective": "return"}},
        "meta.steps: unknown field with meta.method = 'evolution'; a setting of "
        "meta.method = 'metagradient'; allowed: method": {"meta": {"steps": 3}},
        "meta.method: got 'gradient'; allowed: evolution, metagradient":
            {"meta": {"method": "gradient"}},
        "meta.populations: unknown field; allowed: method, steps, ":
            {"meta": {**data["meta"], "populations": 2}},
        "es.population_size: a meta-gradient run .* has no evolution strategy":
            {"es": {"population_size": 4}},
        "fitness.seeds_per_candidate: not a setting of a meta-gradient run":
            {"fitness": {"seeds_per_candidate": 4}},
        "inner.algorithm: a meta-gradient run .* differentiates through PPO's updates":
            {"inner": {"algorithm": "dqn", "env_id": "CartPole-v1"}},
        "meta.max_grad_norm: must be >= 0": {"meta": {**data["meta"], "max_grad_norm": -1.0}},
    }
    for message, change in cases.items():
        with pytest.raises(ConfigError, match=message):
            config_from_dict({**data, **change})
    with pytest.raises(ConfigError, match="meta.unroll: 3 does not divide the agents' "
                                          "lifetime of 8 updates"):
        MetaGradient(config_from_dict(experiment(DRIFT, unroll=3)))
    with pytest.raises(ConfigError, match="meta.lifetime: 16 updates exceed the .inner. "
                                          "budget of 8 updates"):
        MetaGradient(config_from_dict(experiment(DRIFT, lifetime=16)))
    flat = experiment(DRIFT)
    flat["objective"] = {"name": "lpo", "options": {"hidden_sizes": [4], "ppo_init": True}}
    with pytest.raises(ConfigError, match="meta.init_noise: the loss of objective 'lpo' has "
                                          "a gradient of exactly zero"):
        MetaGradient(config_from_dict(flat))
    MetaGradient(config_from_dict({**flat, "meta": {**flat["meta"], "init_noise": 0.1}}))
    with pytest.raises(ConfigError, match="meta.method: 'metagradient' takes meta-gradient"):
        Evolution(config_from_dict(data))


def test_an_evolution_config_reads_and_writes_as_before():
    """No ``[meta]`` in an evolution's ``config.json`` (its runs' files are unchanged);
    a meta-gradient run's has ``[meta]`` and no ``[es]``, and reads back equal."""
    evolution = config_from_dict({k: v for k, v in DRIFT.items() if k != "meta"})
    assert "meta" not in evolution.to_dict() and "es" in evolution.to_dict()
    assert config_from_dict({**evolution.to_dict(), "meta": {"method": "evolution"}}) == evolution
    metagradient = config_from_dict(experiment(DRIFT, steps=7))
    data = metagradient.to_dict()
    assert "es" not in data and data["meta"]["steps"] == 7
    assert config_from_dict(data) == metagradient


def test_the_meta_table_is_a_type_per_method():
    """``method`` picks the table's type; a saved evolution ``[meta]`` holding the
    meta-gradient fields at their defaults (the one table of both engines took them) still
    reads back, and ``--set meta.X`` reaches the meta-gradient's fields."""
    evolution = config_from_dict({k: v for k, v in DRIFT.items() if k != "meta"})
    assert isinstance(evolution.meta, EvolutionMeta)
    metagradient = config_from_dict(DRIFT)
    assert isinstance(metagradient.meta, MetaGradientConfig)
    assert metagradient.meta == MetaGradientConfig(agents=2)
    assert EvolutionMeta() != MetaGradientConfig()
    with pytest.raises(ConfigError, match="meta.method: this .meta. table is one of method "
                                          "'metagradient', got 'evolution'"):
        MetaGradientConfig(method="evolution")
    saved = {**evolution.to_dict(),
             "meta": {**dataclasses.asdict(MetaGradientConfig()), "method": "evolution"}}
    with pytest.raises(ConfigError, match="meta.agents: unknown field with meta.method = "
                                          "'evolution'"):
        config_from_dict(saved)  # an experiment file's is refused
    assert config_from_dict(upgrade_saved_config(saved)) == evolution
    changed = apply_overrides(DRIFT, ["meta.unroll=2", "meta.objective='policy'"])
    assert config_from_dict(changed).meta == MetaGradientConfig(agents=2, unroll=2,
                                                                objective="policy")


def test_each_engine_starts_its_search_where_its_run_did():
    """``metarl evaluate --start`` trains the engine's start (engines.engine_of): an
    evolution's search_start of run.seed, a meta-gradient run's with its noise."""
    noisy = config_from_dict(experiment(DRIFT, init_noise=0.1))
    evolution = config_from_dict({k: v for k, v in DRIFT.items() if k != "meta"})
    objective = noisy.objective.build()
    assert engine_of(noisy).members == "agents"
    assert engine_of(evolution).members == "candidates"
    for config, start_params in ((noisy, metagradient_start(objective, noisy)),
                                 (evolution, search_start(objective, evolution.run.seed))):
        np.testing.assert_array_equal(
            ravel_pytree(engine_of(config).search_start(objective, config))[0],
            ravel_pytree(start_params)[0])


def test_agents_are_staggered_over_their_lifetime():
    assert first_lifetimes(16, 4, 4, "uniform").tolist() == [4, 8, 12, 16]
    assert first_lifetimes(16, 4, 8, "uniform").tolist() == [4, 4, 8, 8, 12, 12, 16, 16]
    assert first_lifetimes(16, 2, 3, "uniform").tolist() == [6, 12, 16]
    assert first_lifetimes(16, 4, 3, "none").tolist() == [16, 16, 16]


def test_the_start_is_an_evolutions_plus_the_initial_noise():
    config = config_from_dict(experiment(DRIFT, init_noise=0.1))
    objective = config.objective.build()
    start_flat = ravel_pytree(search_start(objective, 0))[0]
    noisy = ravel_pytree(metagradient_start(objective, config))[0]
    assert 0.05 < float(jnp.std(noisy - start_flat)) < 0.2
    plain = config_from_dict(experiment(DRIFT))
    np.testing.assert_array_equal(ravel_pytree(metagradient_start(objective, plain))[0],
                                  start_flat)


# A run: 8 updates per agent in lifetimes of 2 unrolls of 2, the four agents staggered.
RUN = experiment(DRIFT, agents=4, unroll=2, lifetime=4, steps=4, learning_rate=0.01)
RUN_FILE = """
name = "tiny_metagradient"
[objective]
name = "lpo"
options = { hidden_sizes = [4] }
[inner]
env_id = "probe/observation_action-continuous"
num_envs = 4
num_steps = 2
total_timesteps = 64
update_epochs = 1
num_minibatches = 2
hidden_sizes = [8]
learning_rate = 0.05
anneal_lr = false
[meta]
method = "metagradient"
agents = 4
unroll = 2
lifetime = 4
steps = 4
learning_rate = 0.01
[run]
progress = false
checkpoint_every = 1
keep_checkpoints = 5
"""
TIMING = ("seconds", "agent_steps_per_second", "time")
SHARDED_STEPS = 2  # of RUN, sharded and not (tests/_metagradient_worker.py)


def same_run(a: Path, b: Path) -> None:
    """Two run directories hold the same lines (but their timing) and meta-parameters."""
    lines = [[{k: v for k, v in line.items() if k not in TIMING} for line in read_metrics(d)]
             for d in (a, b)]
    assert lines[0] == lines[1]
    for name in (BEST_FILE, MEAN_FILE):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def record_steps(metagradient: MetaGradient, steps: int) -> dict:
    """``steps`` meta-steps of ``metagradient`` from its start: after each, the flattened
    meta-parameters, the agents' returns, the meta-loss and the agents restarted; then how
    many programs its step has compiled and over how many devices it runs."""
    state = metagradient.init()
    record = {"meta_params": [], "returns": [], "meta_loss": [], "restarted": []}
    for _ in range(steps):
        state, metrics = metagradient.step(state)
        record["meta_params"].append(np.asarray(ravel_pytree(state.meta_params)[0]).tolist())
        record["returns"].append(np.asarray(metrics["returns"]).tolist())
        record["meta_loss"].append(float(metrics["meta_loss"]))
        record["restarted"].append(int(metrics["restarted"]))
    record["programs"] = metagradient.step._cache_size()
    record["devices"] = 1 if metagradient.mesh is None else int(metagradient.mesh.devices.size)
    return record


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run of ``RUN_FILE``, uninterrupted."""
    path = tmp_path_factory.mktemp("metagradient") / "tiny.toml"
    path.write_text(RUN_FILE)
    result = start(load_experiment(path), path.parent / "whole")
    return path, result


def test_a_run_writes_the_evolution_files_and_restarts_its_agents(reference):
    path, result = reference
    assert isinstance(result, MetaGradientResult)
    assert load_experiment(path) == config_from_dict({**RUN, "name": "tiny_metagradient",
                                                      "run": {**RUN["run"],
                                                              "checkpoint_every": 1,
                                                              "keep_checkpoints": 5}})
    lines = read_metrics(result.run_dir)
    assert [line["generation"] for line in lines] == [1, 2, 3, 4]
    # agents 0 and 1 live 2 updates first, 2 and 3 all 4; then all 4, each from its own start
    assert [line["ages"] for line in lines] == [[2, 2, 2, 2], [2, 2, 4, 4], [4, 4, 2, 2],
                                                [2, 2, 4, 4]]
    assert [line["restarted"] for line in lines] == [0, 2, 2, 2]
    assert [line["agent_steps"] for line in lines] == [4 * 3 * 8 * step for step in (1, 2, 3, 4)]
    for line in lines:
        assert len(line["fitness"]) == 4 and line["valid"] == [True] * 4
        assert np.isfinite(line["meta_loss"]) and line["meta_grad_norm"] > 0
    params = result.mean_meta_params
    assert (result.run_dir / BEST_FILE).read_bytes() == (result.run_dir / MEAN_FILE).read_bytes()
    start_params = metagradient_start(result.metagradient.objective, result.config)
    assert not np.allclose(ravel_pytree(params)[0], ravel_pytree(start_params)[0])
    # one compiled step for the whole run
    assert result.metagradient.step._cache_size() == 1


def test_a_run_stopped_and_resumed_equals_the_run_uninterrupted(reference, tmp_path):
    path, whole = reference
    cut = tmp_path / "cut"
    start(load_experiment(path, ["meta.steps=2"]), cut)
    result = resume(cut, generations=4)
    assert int(result.state.generation) == 4
    same_run(cut, whole.run_dir)
    assert whole.metagradient.step._cache_size() == 1  # the restored state compiled nothing


def test_sigkill_during_a_save_then_resume(reference, tmp_path, capsys):
    path, whole = reference
    run_dir = tmp_path / "killed"
    kill_inside_save(3, ["run", str(path), "--run-dir", str(run_dir), "--no-plots"])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()
                  if p.name.isdigit()) == ["1", "2"]
    assert main(["resume", str(run_dir), "--no-plots"]) == 0
    same_run(run_dir, whole.run_dir)
    restored = load_run(run_dir).state
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_evaluate_and_plot_read_a_metagradient_run(reference, monkeypatch):
    """``metarl evaluate`` (with the search's start) and ``metarl plot`` as for evolution;
    the fitness figure's legend speaks of the run's agents, not of candidates."""
    _, whole = reference
    report = evaluate(whole.run_dir, seeds=2, baselines=["ppo"], start=True)
    assert [row["objective"] for row in report["results"]] == ["evolved", "start", "ppo"]
    assert report["meta_params_generation"] == 4
    drawn = {}
    save = report_module._save

    def keep(fig, path):
        drawn[path.name] = fig
        return save(fig, path)

    monkeypatch.setattr(report_module, "_save", keep)
    names = {p.name for p in plot(whole.run_dir)}
    assert {"fitness.png", "drift_mean.png", "learning_curves_1.png"} <= names
    legend = [text.get_text() for ax in drawn["fitness.png"].axes
              if ax.get_legend() is not None for text in ax.get_legend().get_texts()]
    assert "min–max over 4 agents" in legend, legend
    assert not [text for text in legend if "candidate" in text]


def test_sharded_over_two_devices_equals_one_device(reference):
    """``SHARDED_STEPS`` steps of ``RUN`` over two devices (2 agents each, a restart in the
    second step), in a subprocess (JAX fixes its device count when it starts), equal the
    same steps on one device, run here with the program the reference run compiled."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    flags = [flag for flag in env.get("XLA_FLAGS", "").split()
             if not flag.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=2"])
    env["JAX_PLATFORMS"] = "cpu"
    # the library this process runs the one-device side with, whatever an install points to
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(metarl.__file__).parents[1]), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True,
                          env=env, cwd=WORKER.parent, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads(done.stdout.strip().splitlines()[-1])
    plain = record_steps(reference[1].metagradient, SHARDED_STEPS)
    assert (sharded["devices"], plain["devices"]) == (2, 1)
    assert sharded["programs"] == plain["programs"] == 1
    assert sharded["restarted"] == plain["restarted"] == [0, 2]
    np.testing.assert_allclose(sharded["meta_params"], plain["meta_params"], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(sharded["returns"], plain["returns"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sharded["meta_loss"], plain["meta_loss"], rtol=1e-5)
    assert not np.allclose(plain["meta_params"][0], plain["meta_params"][1])


def test_dataclass_fields_of_the_run_config_are_all_documented():
    """Every [meta] field is in its type's docstring (what the guide will point to)."""
    for meta_type in (EvolutionMeta, MetaGradientConfig):
        for field in dataclasses.fields(meta_type):
            assert f"    {field.name}:" in meta_type.__doc__, field.name


def test_a_run_whose_meta_gradient_stays_exactly_zero_warns_once(reference):
    """Five meta-steps in a row with a meta-gradient of exactly zero warn, once; a step that
    moves starts the count again. (The lines are the reference run's program's, with the
    meta-gradient's norm set: a real flat run compiles a program of its own.)"""
    program = reference[1].program
    program.flat_steps = 0

    def line(generation, grad_norm):
        return program.summary(generation, {"metrics": {
            "returns": np.array([1.0, 2.0]), "valid": np.array([True, True]),
            "meta_loss": 0.5, "meta_grad_norm": grad_norm, "restarted": 0,
            "ages": np.array([2, 2])}})

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for generation, norm in enumerate([0.0, 0.0, 0.0, 0.0, 1e-12, 0.0, 0.0], start=1):
            line(generation, norm)  # never five zeros in a row
    with pytest.warns(UserWarning, match=r"meta-gradient steps 6 to 10 had a meta-gradient "
                                         r"of exactly zero.*objective 'lpo'.*"
                                         r"meta.init_noise is 0.0") as caught:
        for generation in range(8, 20):
            line(generation, 0.0)
    assert len(caught) == 1
