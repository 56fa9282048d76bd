"""The optimiser slot and the learned optimisers (``learned_optimizer``, ``open_optimizer``):
Adam at initialisation, exact PPO training, jit + vmap, resumption (of training, and of a
run evolving one from its checkpoint), errors, a short evolution on a planted problem, the
figure of the learned update, and the evaluation tuned against Adam."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _evaluation_run import TINY as TINY_RUN
from _evaluation_run import write_run
from matplotlib.figure import Figure

from inner_loops import ppo, registry
from inner_loops.dqn import DQNConfig
from inner_loops.objective import Objective
from metarl.evolve.config import ESConfig, config_from_dict
from metarl.evolve.evaluate import evaluate_run
from metarl.evolve.kind import EvolveProgram
from metarl.evolve.strategies import ask_search, build_strategy, init_search, tell_search
from metarl.kinds import resume, start
from metarl.objectives import get_objective, learned_optimizer, make_objective, open_optimizer
from metarl.objectives.learned_optimizer import LearnedOptState, update_at
from metarl.objectives.open_optimizer import dormancy, layer_positions
from metarl.objectives.registry import RunFigureRequest
from metarl.runs.layout import read_metrics
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, load_meta_params

OPTIMIZERS = ("learned_optimizer", "open_optimizer")
# 8 updates of a 4 x 16 batch, two epochs of two minibatches: a second or two per compile
TINY = ppo.PPOConfig(num_envs=4, num_steps=16, total_timesteps=512, hidden_sizes=(8,),
                     update_epochs=2, num_minibatches=2)


def nested_params():
    """A nested parameter pytree like a two-tower network, plus a 0-d leaf."""
    key = jax.random.PRNGKey(3)
    shapes = {"actor": {"Dense_0": {"kernel": (3, 5), "bias": (5,)},
                        "Dense_1": {"kernel": (5, 2), "bias": (2,)}},
              "critic": {"Dense_0": {"kernel": (3, 5), "bias": (5,)}},
              "scale": ()}
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([jax.random.normal(k, s) for k, s in zip(keys, leaves,
                                                                        strict=True)])


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_at_initialisation_the_rule_is_adam_bit_for_bit(name):
    """Five steps of fixed gradients (scales 1e-2 to 1e2) on a nested pytree, in one jitted
    scan: identical to ``scale_by_adam(eps=1e-5)`` (array_equal: exact up to the sign of
    a zero)."""
    objective = make_objective(name)
    meta_params = objective.init(jax.random.PRNGKey(0))
    adam = optax.scale_by_adam(eps=1e-5)
    params = nested_params()

    @jax.jit
    def both(meta_params):
        rule = objective.optimizer_transformation(meta_params)

        def step(states, n):
            state, adam_state = states
            grads = jax.tree.map(lambda p: jnp.sin(p * (n + 1.0)) * 10.0 ** (n - 2.0), params)
            updates, state = rule.update(grads, state, params, progress=n / 5.0,
                                         key=jax.random.PRNGKey(n.astype(jnp.int32)))
            reference, adam_state = adam.update(grads, adam_state, params)
            return (state, adam_state), (updates, reference)

        _, outputs = jax.lax.scan(step, (rule.init(params), adam.init(params)),
                                  jnp.arange(5.0))
        return outputs

    got, expected = both(meta_params)
    assert_trees_equal(got, expected)


def test_slot_keeps_old_meta_parameters_and_adds_its_own():
    """Without the slot the meta-parameters are ``{"policy", "value"}`` as before; with it an
    ``"optimizer"`` entry is added and the loss terms' draws do not change."""
    assert set(make_objective("ppo").init(jax.random.PRNGKey(0))) == {"policy", "value"}
    distance = make_objective("value_distance", hidden_sizes=[4])
    meta_params = make_objective("learned_optimizer").init(jax.random.PRNGKey(0))
    assert set(meta_params) == {"policy", "value", "optimizer"}
    assert meta_params["optimizer"]["layers"][-1]["w"].shape == (16, 2)
    combined = Objective(value=distance.value, optimizer=make_objective("open_optimizer").optimizer)
    assert_trees_equal(combined.init(jax.random.PRNGKey(1))["value"],
                       distance.init(jax.random.PRNGKey(1))["value"])
    assert combined.slots == ("value", "optimizer")
    assert combined.name == "default+value_distance+open_optimizer"


@pytest.fixture(scope="module")
def learners():
    """``{name: (learner, jit(advance))}`` for Adam (``None``) and both learned optimisers,
    built once so that the tests share their compiled programs."""
    built = {}
    for name in (None, *OPTIMIZERS):  # open_optimizer's advance is only used under vmap
        learner = ppo.build(TINY, None if name is None else make_objective(name))
        built[name] = (learner, jax.jit(learner.advance, static_argnums=3))
    return built


def advance(learners, name, num_updates, meta_params=None, state=None):
    learner, advance_fn = learners[name]
    meta_params = learner.default_meta_params if meta_params is None else meta_params
    if state is None:
        state = learner.init(jax.random.PRNGKey(0), meta_params, learner.default_hypers)
    return advance_fn(state, meta_params, learner.default_hypers, num_updates)


def assert_close_to_adam(state, metrics, adam_state, adam_metrics):
    """The same episodes (exactly), parameters and losses equal to float rounding."""
    for field in ("episode_return", "episode_length", "episodes"):
        np.testing.assert_array_equal(metrics[field], adam_metrics[field])
    for x, y in zip(jax.tree.leaves((state.params, metrics)),
                    jax.tree.leaves((adam_state.params, adam_metrics)), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_ppo_with_a_learned_optimizer_at_initialisation_trains_as_adam(learners):
    """Eight PPO updates with ``learned_optimizer`` at initialisation against Adam. Measured:
    parameters within 5e-10 and most metrics bit-identical; XLA compiles the two programs'
    update arithmetic differently (fusion, fused multiply-adds), so losses that cancel
    (the surrogate's mean, ``approx_kl``) differ in their last bits. The rule's own output
    is Adam's bit for bit (the test above)."""
    adam_state, adam_metrics = advance(learners, None, 8)
    state, metrics = advance(learners, "learned_optimizer", 8)
    assert_close_to_adam(state, metrics, adam_state, adam_metrics)


def test_open_optimizer_trains_under_vmap_resumes_exactly_and_starts_at_adam(learners):
    """``open_optimizer`` with two meta-parameter sets in one ``jit(vmap(advance))``:
    the one at initialisation trains as Adam (to rounding), the perturbed one (with learned
    noise) differently and finitely; and ``advance(init, 4)`` then ``advance(..., 4)``
    equals ``advance(init, 8)`` bit for bit, so the rule's state lives in the agent's."""
    learner, _ = learners["open_optimizer"]
    base = learner.default_meta_params
    perturbed = jax.tree.map(
        lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(7), x.shape), base)
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), base, perturbed)
    hypers = learner.default_hypers
    states = jax.jit(jax.vmap(learner.init, in_axes=(None, 0, None)))(
        jax.random.PRNGKey(0), both, hypers)
    advance_all = jax.jit(jax.vmap(learner.advance, in_axes=(0, 0, None, None)),
                          static_argnums=3)
    whole, whole_metrics = advance_all(states, both, hypers, 8)
    first, first_metrics = advance_all(states, both, hypers, 4)
    rest, rest_metrics = advance_all(first, both, hypers, 4)
    assert_trees_equal(rest, whole)
    assert_trees_equal(jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1),
                                    first_metrics, rest_metrics), whole_metrics)

    losses = np.asarray(whole_metrics["policy_loss"])
    assert losses.shape == (2, TINY.num_updates)
    assert np.all(np.asarray(whole_metrics["finite"]))
    assert not np.array_equal(losses[0], losses[1])
    adam_state, adam_metrics = advance(learners, None, 8)
    assert_close_to_adam(jax.tree.map(lambda x: x[0], whole),
                         jax.tree.map(lambda x: x[0], whole_metrics), adam_state, adam_metrics)


@pytest.mark.parametrize(("options", "message"), [
    ({"hidden_sizes": []}, "hidden_sizes: expected a non-empty list of positive integers"),
    ({"hidden_sizes": [16, 0]}, "hidden_sizes: expected a non-empty list"),
    ({"hidden_sizes": 16}, "hidden_sizes: expected a list of layer widths"),
    ({"timescales": [0.9, 1.0]}, "timescales: every momentum timescale must lie in (0, 1)"),
    ({"timescales": [0.0]}, "timescales: every momentum timescale must lie in (0, 1)"),
    ({"timescales": ["fast"]}, "timescales: expected a list of numbers"),
    ({"max_log_scale": -1.0}, "max_log_scale: must be a positive finite number"),
    ({"max_additive": float("inf")}, "max_additive: must be a positive finite number"),
])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_bad_options_give_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_objective(name, **options)


def test_open_optimizer_checks_its_noise_bound():
    with pytest.raises(ValueError, match="max_noise: must be a positive finite number"):
        make_objective("open_optimizer", max_noise=0.0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_algorithm_without_the_slot_refuses_it_by_name(name):
    dqn = registry.get_algorithm("dqn")
    assert not get_objective(name).fits(dqn.name, dqn.slots)
    assert get_objective(name).fits("ppo", registry.get_algorithm("ppo").slots)
    with pytest.raises(ValueError, match=f"objective '{name}' does not fit algorithm 'dqn': "
                                         "it fills the optimizer slot"):
        registry.make_learner(DQNConfig(), make_objective(name))


def test_the_update_needs_progress_and_the_noise_a_key():
    params = nested_params()
    grads = jax.tree.map(jnp.ones_like, params)
    for name, missing in (("learned_optimizer", {}), ("open_optimizer", {"progress": 0.5})):
        objective = make_objective(name)
        rule = objective.optimizer_transformation(objective.init(jax.random.PRNGKey(0)))
        with pytest.raises(ValueError, match="needs the extra argument"):
            rule.update(grads, rule.init(params), params, **missing)


def test_open_inputs_layer_position_and_dormancy():
    assert layer_positions(nested_params()) == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    many = {f"Dense_{i}": {"kernel": jnp.zeros((1, 1))} for i in (0, 2, 10)}
    assert layer_positions(many) == [0.0, 1.0, 0.5]  # leaves in key order: 0, 10, 2
    mu = jnp.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])  # unit 1 gets no gradient
    np.testing.assert_allclose(dormancy(mu)[0], [1.0, 0.0, 2.0])


def test_short_evolution_on_a_planted_problem_improves_fitness():
    """A stand-in learner: 30 steps of the rule at a far too small learning rate on a
    quadratic. A larger learned step factor ``exp(3 tanh(o_1))`` is better by construction,
    and three generations of Open_ES raise the fitness (minus the final loss)."""
    objective = make_objective("learned_optimizer")
    curvature = jnp.array([1.0, 2.0, 4.0])
    start = {"w": jnp.array([1.0, -1.0, 0.5])}

    def fitness(meta_params):
        rule = objective.optimizer_transformation(meta_params)

        def step(carry, n):
            params, state = carry
            grads = jax.tree.map(lambda w: curvature * w, params)
            updates, state = rule.update(grads, state, params, progress=n / 30.0)
            return (jax.tree.map(lambda w, u: w - 1e-2 * u, params, updates), state), None

        (params, _), _ = jax.lax.scan(step, (start, rule.init(start)), jnp.arange(30.0))
        return -0.5 * jnp.sum(curvature * params["w"] ** 2)

    config = ESConfig(strategy="Open_ES", population_size=8, generations=3, sigma=0.1,
                      learning_rate=0.1)
    mean = objective.init(jax.random.PRNGKey(0))
    strategy, es_params = build_strategy(config, mean)
    es_state = init_search(config, strategy, es_params, jax.random.PRNGKey(1), mean)

    @jax.jit
    def generation(es_state, key, index):
        ask_key, tell_key = jax.random.split(key)
        population, es_state = ask_search(config, strategy, es_params, ask_key, es_state,
                                          index)
        values = jax.vmap(fitness)(population)
        return tell_search(config, strategy, es_params, tell_key, population, -values,
                           es_state, index), values

    initial = float(fitness(mean))
    for index in range(3):
        es_state, values = generation(es_state, jax.random.PRNGKey(10 + index), index)
    final = float(fitness(strategy.get_mean(es_state)))
    assert final > initial + 0.01 * abs(initial), (initial, final)


# --------------------------------------------------------------------------------------
# a run directory evolving a learned optimiser, stopped and resumed from its checkpoint

# 4 candidates x 2 seeds of the tiny PPO above (8 updates) per generation
EVOLVED_RUN = {
    "name": "tiny_learned_optimizer_run",
    "objective": {"name": "learned_optimizer", "options": {"hidden_sizes": [8]}},
    "inner": {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 16,
              "total_timesteps": 512, "update_epochs": 2, "num_minibatches": 2,
              "hidden_sizes": [8], "learning_rate": 0.005},
    "es": {"strategy": "Open_ES", "population_size": 4, "generations": 2, "sigma": 0.1,
           "learning_rate": 0.03},
    "fitness": {"seeds_per_candidate": 2},
    "run": {"checkpoint_every": 1, "progress": False},
}
TIMINGS = ("seconds", "agent_steps_per_second", "time")  # fields a repeated run may change


class StoppedInsideAGeneration(Exception):
    """The run's process ends inside a generation (as a crash or Ctrl-C would)."""


def test_a_run_evolving_a_learned_optimizer_resumes_exactly_from_its_checkpoint(
        tmp_path, monkeypatch):
    """Two generations straight, against a run stopped inside its second generation (the
    jitted generation dispatched, nothing of it written) and resumed from checkpoint 1:
    every line of ``metrics.jsonl`` but its timings, the best and mean meta-parameter files
    and the final state (the strategy's, the key, the best candidate's learned optimiser)
    are equal bit for bit. Both runs share one compiled generation (equal configs)."""
    config = config_from_dict(EVOLVED_RUN)
    whole = start(config, tmp_path / "whole")
    step = EvolveProgram.step

    def stop_inside_generation_2(self, state):
        generation = self.completed(state) + 1
        state, record = step(self, state)
        if generation == 2:
            raise StoppedInsideAGeneration
        return state, record

    monkeypatch.setattr(EvolveProgram, "step", stop_inside_generation_2)
    with pytest.raises(StoppedInsideAGeneration):
        start(config, tmp_path / "stopped")
    monkeypatch.undo()
    run_dir = tmp_path / "stopped"
    assert [line["generation"] for line in read_metrics(run_dir)] == [1]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1"]
    resumed = resume(run_dir)

    def lines(directory):
        return [{name: value for name, value in line.items() if name not in TIMINGS}
                for line in read_metrics(directory)]

    assert [line["generation"] for line in lines(run_dir)] == [1, 2]
    assert lines(run_dir) == lines(whole.run_dir)
    assert np.ptp(lines(run_dir)[1]["fitness"]) > 0  # the candidates differ
    for name in (BEST_FILE, MEAN_FILE):
        assert_trees_equal(load_meta_params(run_dir / name),
                           load_meta_params(whole.run_dir / name))
    assert set(resumed.state.best_meta_params) == {"policy", "value", "optimizer"}
    assert_trees_equal(resumed.state, whole.state)


# --------------------------------------------------------------------------------------
# the figure of the learned update

GRID_OF = {"learned_optimizer": learned_optimizer.update_grid,
           "open_optimizer": open_optimizer.update_grid}


def perturbed(meta_params, scale=1.0, seed=5):
    """``meta_params`` plus normal noise: a rule far from Adam."""
    leaves, treedef = jax.tree.flatten(meta_params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return treedef.unflatten([x + scale * jax.random.normal(k, x.shape)
                              for x, k in zip(leaves, keys, strict=True)])


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_drawn_update_at_initialisation_is_adams_direction(name):
    """On the figure's grid (3 progresses x 3 momenta x 121 gradients) the rule at
    initialisation gives Adam's direction ``0.9 m + 0.1 x`` exactly, with no noise."""
    optimizer_params = make_objective(name).init(jax.random.PRNGKey(0))["optimizer"]
    grid = GRID_OF[name](optimizer_params)
    assert grid.update.shape == grid.noise_std.shape == (3, 3, 121)
    x, m = np.asarray(grid.gradients), np.asarray(grid.momenta)
    np.testing.assert_allclose(grid.adam, 0.9 * m[:, None] + 0.1 * x[None, :], atol=1e-6)
    np.testing.assert_array_equal(grid.update, np.broadcast_to(grid.adam, (3, 3, 121)))
    np.testing.assert_array_equal(grid.noise_std, 0.0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_drawn_update_is_the_rules_step_at_those_inputs(name):
    """A rule far from Adam steps a ``[4, 3]`` kernel whose momenta (Adam's and every
    timescale's) were ``mu`` before the step, late in training (bias corrections 1). The
    grid function at ``x = g / (sqrt(v_hat) + eps)``, ``m = mu / (sqrt(v_hat) + eps)``
    (and, for OPEN, that kernel's dormancy and layer position) gives the same update; for
    OPEN the rest is its noise, ``std * eps`` with the step's own normal draw."""
    objective = make_objective(name)
    meta_params = perturbed(objective.init(jax.random.PRNGKey(0))["optimizer"])
    rule = objective.optimizer_transformation({"optimizer": meta_params})
    keys = jax.random.split(jax.random.PRNGKey(11), 3)
    shape = (4, 3)
    params = {"net": {"Dense_0": {"kernel": jnp.zeros(shape)}}}
    grads = {"net": {"Dense_0": {"kernel": 2.0 * jax.random.normal(keys[0], shape)}}}
    mu = {"net": {"Dense_0": {"kernel": jax.random.normal(keys[1], shape)}}}
    nu = {"net": {"Dense_0": {"kernel": jnp.exp(jax.random.normal(keys[2], shape))}}}
    state = LearnedOptState(optax.ScaleByAdamState(jnp.asarray(200_000, jnp.int32), mu, nu),
                            (mu,) * len(learned_optimizer.DEFAULT_TIMESCALES))
    noise_key = jax.random.PRNGKey(4)
    updates, new_state = rule.update(grads, state, params, progress=0.3, key=noise_key)

    scale = 1.0 / (jnp.sqrt(new_state.adam.nu["net"]["Dense_0"]["kernel"])
                   + learned_optimizer.ADAM_EPS)
    g = grads["net"]["Dense_0"]["kernel"]
    extra = {}
    if name == "open_optimizer":
        extra = {"extra_inputs": (dormancy(new_state.adam.mu["net"]["Dense_0"]["kernel"]),
                                  layer_positions(params)[0]),
                 "max_noise": open_optimizer.DEFAULT_MAX_NOISE}
    update, noise_std, adam = update_at(meta_params, g * scale,
                                        mu["net"]["Dense_0"]["kernel"] * scale, 0.3, **extra)
    got = np.asarray(updates["net"]["Dense_0"]["kernel"])
    assert not np.allclose(update, adam, atol=0.1)  # the rule is far from Adam here
    if name == "learned_optimizer":
        np.testing.assert_array_equal(noise_std, 0.0)
        np.testing.assert_allclose(got, update, rtol=1e-5, atol=1e-6)
    else:
        eps = jax.random.normal(jax.random.split(noise_key, 1)[0], shape)
        assert np.any(np.asarray(noise_std) > 0.1)
        np.testing.assert_allclose(np.abs(got - update), noise_std * np.abs(eps),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_metarl_plot_draws_the_learned_update_of_each_candidate(name):
    """The registered ``plot`` hook: one figure, a row per candidate and a panel per
    progress; OPEN's noise band only where the noise is not zero (the perturbed
    candidate's, not the one at initialisation)."""
    objective = make_objective(name)
    initial = objective.init(jax.random.PRNGKey(0))
    best = {**initial, "optimizer": perturbed(initial["optimizer"])}
    request = RunFigureRequest(run_name="tiny", candidates={"mean": initial, "best": best},
                               options={"hidden_sizes": [16]}, inner=TINY, generation=3)
    figures = get_objective(name).plot(request)
    assert list(figures) == ["learned_update"]
    fig = figures["learned_update"]
    assert isinstance(fig, Figure)
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes[:3]] == [
        "search mean: progress 0", "search mean: progress 0.5", "search mean: progress 1"]
    assert len(axes) == 6 and axes[3].get_title() == "best candidate: progress 0"
    mean_lines = [line.get_ydata() for line in axes[0].get_lines()][:6]
    for adams, learned in zip(mean_lines[::2], mean_lines[1::2], strict=True):
        np.testing.assert_array_equal(learned, adams)  # at initialisation: on Adam's
    bands = [len(ax.collections) for ax in axes]
    assert bands == ([0] * 6 if name == "learned_optimizer" else [0] * 3 + [3] * 3)
    assert get_objective(name).plot(
        RunFigureRequest("empty", {}, {}, TINY, 0)) == {}


# --------------------------------------------------------------------------------------
# evaluation against Adam with tuned learning rates

TUNE_GRID = {"clip_eps": [0.2], "learning_rate": [1 / 3, 1.0]}


def test_a_tuned_evaluation_compares_with_adam_at_its_best_learning_rate(tmp_path):
    """``metarl evaluate --tune`` on a saved ``learned_optimizer`` run at initialisation:
    ``ppo`` (Adam) searches its grid, the learned optimiser the learning rate with as many
    settings; the record keeps the grids, each setting's scores and the choice, and both
    default and tuned rows. The learned optimiser at initialisation is Adam, so every
    setting scores as Adam's at the same learning rate."""
    inner = {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 16,
             "total_timesteps": 512, "update_epochs": 2, "num_minibatches": 2,
             "hidden_sizes": [8], "learning_rate": 0.005}
    run_dir = write_run(tmp_path / "run", {
        **TINY_RUN, "name": "tiny_learned_optimizer", "inner": inner,
        "objective": {"name": "learned_optimizer", "options": {"hidden_sizes": [8]}}})
    report = evaluate_run(run_dir, seeds=2, baselines=["ppo"], tune=True, tune_seeds=2,
                          tune_grid=TUNE_GRID, tune_rounds=0)  # the declared grid only

    assert [r["objective"] for r in report["results"]] == [
        "evolved", "ppo", "evolved (tuned)", "ppo (tuned)"]
    records = report["tuning"]["environments"]["CartPole-v1"]
    evolved, adam = records["evolved"], records["ppo"]
    assert adam["grid"] == TUNE_GRID
    assert evolved["grid"] == {"learning_rate": [1 / 3, 1.0]}  # the shared knob only
    assert evolved["budget"] == adam["budget"] == {"settings": 2, "seeds": 2, "runs": 4}
    for record in (evolved, adam):
        means = [s["mean"] for s in record["settings"]]
        assert record["chosen_index"] == int(np.argmax(means))
        assert record["chosen"] == record["settings"][record["chosen_index"]]["setting"]
    assert [s["setting"]["learning_rate"] for s in evolved["settings"]] == [
        pytest.approx(0.005 / 3), 0.005]
    for ours, theirs in zip(evolved["settings"], adam["settings"], strict=True):
        np.testing.assert_allclose(ours["returns"], theirs["returns"], rtol=1e-4)
    assert evolved["chosen"]["learning_rate"] == adam["chosen"]["learning_rate"]
    for ours, theirs in zip(report["results"][0::2], report["results"][1::2], strict=True):
        assert len(ours["returns"]) == 2 and ours["invalid"] == 0
        np.testing.assert_allclose(ours["returns"], theirs["returns"], rtol=1e-4)
