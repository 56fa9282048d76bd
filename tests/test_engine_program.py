"""The program protocol of :mod:`metarl.runs.engine`: a run kind's program is a
:class:`~metarl.runs.engine.Program`, refused when the kind is defined (or the program
built) if it lacks a part, and a run alone trains in the one loop of joint runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import pytest

from metarl import kinds
from metarl.config import RunConfig
from metarl.evolve import metagradient_kind
from metarl.evolve.replicated import ReplicatedProgram
from metarl.runs import engine
from metarl.runs.layout import read_metrics


@dataclass
class CountConfig:
    name: str = "count"
    steps: int = 3
    run: RunConfig = field(default_factory=lambda: RunConfig(progress=False))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "steps": self.steps, "run": dataclasses.asdict(self.run)}


def count_config_from_dict(data: dict[str, Any]) -> CountConfig:
    run = dict(data.get("run", {}))
    run["trackers"] = tuple(run.get("trackers", ()))
    return CountConfig(data.get("name", "count"), data.get("steps", 3), RunConfig(**run))


class CountProgram(engine.Program):
    """A state that counts its steps: every part a program must have, nothing optional."""

    def __init__(self, config: CountConfig, mesh=None):
        self.config, self.steps, self.agent_steps_per_step = config, config.steps, 2

    def init(self):
        return {"done": jnp.zeros((), jnp.int32)}

    def completed(self, state) -> int:
        return int(state["done"])

    def step(self, state):
        return {"done": state["done"] + 1}, {"score": float(state["done"])}

    def summary(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        return {"generation": step, "best_return": record["score"], "finite": True}

    def postfix(self, line: dict[str, Any]) -> dict[str, Any]:
        return {"best": line["best_return"]}


def count_kind(build: type = CountProgram) -> engine.RunKind:
    return engine.RunKind(
        name="count", step_key="generation", from_dict=count_config_from_dict, build=build,
        result=engine.SteppedRun, plot=lambda run_dir: [], describe=str,
        evaluate=lambda run_dir, **options: {}, format_evaluation=str)


def test_a_program_lacking_a_method_is_refused_when_its_kind_is_defined():
    class NoStep(engine.Program):
        init, completed, summary, postfix = (CountProgram.init, CountProgram.completed,
                                             CountProgram.summary, CountProgram.postfix)

    with pytest.raises(TypeError, match=r"'count'.*NoStep lacks step"):
        count_kind(NoStep)


def test_a_build_that_is_not_a_program_is_refused_when_its_kind_is_defined():
    with pytest.raises(TypeError, match="subclass of metarl.runs.engine.Program"):
        count_kind(lambda config, mesh: CountProgram(config, mesh))


def test_a_program_lacking_an_attribute_is_refused_before_its_run_writes_anything(tmp_path):
    class NoBudget(CountProgram):
        def __init__(self, config: CountConfig, mesh=None):
            self.config, self.agent_steps_per_step = config, 2  # no steps

    with pytest.raises(TypeError, match="NoBudget lacks steps"):
        engine.start_run(count_kind(NoBudget), CountConfig(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_every_kinds_program_is_a_complete_program():
    specs = [kinds.kind_spec(kind) for kind in kinds.KINDS] + [metagradient_kind.RUN_KIND]
    for spec in specs:
        assert issubclass(spec.build, engine.Program) and not spec.build.__abstractmethods__
    assert issubclass(ReplicatedProgram, engine.JointProgram)
    assert not ReplicatedProgram.__abstractmethods__


def test_the_optional_parts_have_defaults(tmp_path):
    program = count_kind().make_program(CountConfig())
    assert program.mesh is None
    assert int(program.template()["done"]) == 0  # init() by default
    assert program.after_step(tmp_path, program.init(), True) is None
    assert list(tmp_path.iterdir()) == []


def test_a_run_alone_trains_in_the_joint_loop_as_its_one_member(tmp_path, monkeypatch):
    joint_runs = []
    train_jointly = engine.train_jointly

    def spy(kind, joint, members, name):
        joint_runs.append((type(joint).__name__, len(members), name))
        return train_jointly(kind, joint, members, name)

    monkeypatch.setattr(engine, "train_jointly", spy)
    run = engine.start_run(count_kind(), CountConfig(), tmp_path / "run")
    assert joint_runs == [("_Alone", 1, "count")]
    assert int(run.state["done"]) == 3
    lines = read_metrics(tmp_path / "run")
    assert [line["generation"] for line in lines] == [1, 2, 3]
    assert [line["agent_steps"] for line in lines] == [2, 4, 6]
    assert [line["best_return_so_far"] for line in lines] == [0.0, 1.0, 2.0]
