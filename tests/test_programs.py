"""Programs shared by equal configs within a process (:mod:`metarl.programs`)."""

from __future__ import annotations

import dataclasses

import jax
import pytest
from _tiny_evolution import TINY

from metarl import programs
from metarl.evolve.generation import Evolution
from metarl.kinds import load_experiment


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return load_experiment(path)


def _with_run(config, **changes):
    return config.replace(run=dataclasses.replace(config.run, **changes))


def test_a_config_differing_only_in_name_and_io_settings_shares_the_step(tiny):
    """Building nothing is the point: equal programs are one jitted function, so they
    are traced, lowered and compiled once per process."""
    step = Evolution(tiny).step
    again = tiny.replace(name="other")
    again = _with_run(again, output_dir="elsewhere", progress=True, checkpoint_every=3,
                      keep_checkpoints=7, max_invalid_generations=0)
    assert Evolution(again).step is step
    # nor the budget, which shapes no schedule: a run continued with more generations
    longer = again.replace(es=dataclasses.replace(again.es, generations=tiny.es.generations + 4))
    assert Evolution(longer).step is step


@pytest.mark.parametrize("change", ["sigma", "seeds", "chunk_size"])
def test_anything_that_enters_the_program_gets_its_own(tiny, change):
    if change == "sigma":
        other = tiny.replace(es=dataclasses.replace(tiny.es, sigma=tiny.es.sigma * 2))
    elif change == "seeds":
        other = tiny.replace(fitness=dataclasses.replace(tiny.fitness, seeds_per_candidate=3))
    else:
        other = _with_run(tiny, chunk_size=1)
    assert Evolution(other).step is not Evolution(tiny).step


def test_the_latest_programs_are_kept(monkeypatch):
    monkeypatch.setattr(programs, "_PROGRAMS", type(programs._PROGRAMS)())
    monkeypatch.setattr(programs, "KEPT", 2)
    built = []

    def build(name):
        built.append(name)
        return name

    for name in ("a", "b", "a", "c", "a", "b"):
        assert programs.shared_program((name,), lambda name=name: build(name)) == name
    # "a" was used again before "c" came, so "b" was dropped first and is built again
    assert built == ["a", "b", "c", "b"]


def test_a_failing_build_keeps_nothing(monkeypatch):
    monkeypatch.setattr(programs, "_PROGRAMS", type(programs._PROGRAMS)())

    def fail():
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        programs.shared_program(("x",), fail)
    assert programs.shared_program(("x",), lambda: 3) == 3


def test_a_run_resumed_where_it_started_compiles_no_new_step(tiny, tmp_path, compilations):
    from metarl.kinds import resume, start

    config = tiny.replace(es=dataclasses.replace(tiny.es, generations=1))
    start(config, tmp_path / "run")
    before = [name for _, name, _ in compilations.events]
    resume(tmp_path / "run", 2)
    new = [name for _, name, _ in compilations.events][len(before):]
    assert not [name for name in new if "generation" in name], new
    assert Evolution(config).step._cache_size() == 1


def test_an_objective_asked_for_again_is_the_same_object():
    """Equal (name, options) give one Objective, so programs traced from it can be shared;
    other options give another, and options that are not plain data are never shared."""
    import numpy as np

    from metarl.objectives import make_objective

    first = make_objective("value_distance", hidden_sizes=[8])
    assert make_objective("value_distance", hidden_sizes=[8]) is first
    assert make_objective("value_distance", hidden_sizes=[16]) is not first
    assert make_objective("value_distance", hidden_sizes=[8], learn_scale=True) is not first
    odd = np.array([8])
    assert make_objective("value_distance", hidden_sizes=odd) is not make_objective(
        "value_distance", hidden_sizes=odd)


def test_evaluating_an_objective_again_compiles_nothing(tiny, compilations):
    """A second evaluation of an equal objective and [inner] table (another run, another
    environment's baselines) reuses the first one's program and trains the same agents."""
    from metarl.evolve.evaluate import evaluate_objective
    from metarl.objectives import make_objective

    def evaluate():
        objective = make_objective("l2")
        return evaluate_objective(objective, objective.init(jax.random.PRNGKey(0)), tiny.inner[0],
                                  tiny.fitness, seeds=2, eval_seed=5, name="l2")

    first = evaluate()
    before = compilations.count()
    again = evaluate()
    assert compilations.count() == before
    assert again.returns == first.returns


def test_judging_compiles_at_level_1_on_a_cpu_unless_xla_flags_name_a_level(monkeypatch):
    """XLA accepts the option (a misspelt one fails the compile), the user's level (or the
    test suite's) wins, and the training store keys its entries by the choice."""
    from metarl.evolve import store

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
    options = programs.judging_compiler_options()
    assert options == {"xla_backend_optimization_level": programs.JUDGING_CPU_LEVEL} == {
        "xla_backend_optimization_level": 1}
    assert float(jax.jit(lambda x: x + 1, compiler_options=options)(1.0)) == 2.0
    versions = set()
    for level in (1, 2):
        monkeypatch.setattr(programs, "JUDGING_CPU_LEVEL", level)
        monkeypatch.setattr(store, "_CODE_VERSION", None)
        versions.add(store.code_version())
    assert len(versions) == 2
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert programs.judging_compiler_options() is None
