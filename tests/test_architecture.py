"""How the pieces fit: algorithms by name, objectives that fit them, inert imports and
configs, a natural device count, and library modules that never import the command line."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _subprocess_env import env_without_device_count

from inner_loops import registry
from inner_loops.objective import Objective
from inner_loops.ppo import PPOConfig
from metarl.config import ConfigError, config_from_dict
from metarl.evaluate import default_baselines
from metarl.evolution import build_learner
from metarl.objectives import make_objective

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_PACKAGES = ("metarl", "inner_loops")
COMMAND_LINE = {"metarl.cli", "metarl.__main__"}


@pytest.fixture
def critic_only_algorithm():
    """A registered algorithm with only a critic (value) slot, as off-policy learners have;
    it builds PPO underneath, which is all these checks need."""

    @dataclasses.dataclass(frozen=True)
    class CriticOnlyConfig(PPOConfig):
        pass

    def build(config, objective=None):
        return dataclasses.replace(registry.get_algorithm("ppo").build(PPOConfig(), objective),
                                   algorithm="critic_only")

    registry.register_algorithm("critic_only", CriticOnlyConfig, build, slots=("value",))
    try:
        yield CriticOnlyConfig
    finally:
        registry._REGISTRY.pop("critic_only", None)


def test_unknown_algorithm_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"inner\.algorithm: unknown 'sarsa'; allowed: .*ppo"):
        config_from_dict({"inner": {"algorithm": "sarsa"}})


def test_the_algorithm_round_trips_through_the_saved_config():
    config = config_from_dict({"inner": {"algorithm": "ppo", "num_envs": 8}})
    saved = json.loads(json.dumps(config.to_dict()))
    assert saved["inner"][0]["algorithm"] == "ppo"
    assert config_from_dict(saved) == config
    assert registry.algorithm_of(config.inner[0]).name == "ppo"


def test_an_objective_that_does_not_fit_names_both(critic_only_algorithm):
    config = critic_only_algorithm()
    with pytest.raises(ValueError, match="objective 'lpo' does not fit algorithm 'critic_only': "
                                         "it fills the policy loss slot"):
        registry.make_learner(config, make_objective("lpo"))
    with pytest.raises(ConfigError, match="objective.name: objective 'dpo' does not fit "
                                          "algorithm 'critic_only'"):
        build_learner(config, make_objective("dpo"))
    # a value-only objective fits a critic-only algorithm; a PPO-only one does not
    assert build_learner(config, make_objective("value_distance")).algorithm == "critic_only"
    with pytest.raises(ValueError, match="it applies to ppo only"):
        registry.make_learner(config, dataclasses.replace(make_objective("l2"),
                                                          algorithms=("ppo",)))


def test_default_baselines_are_those_that_fit_the_algorithm(critic_only_algorithm):
    assert default_baselines("value_distance", PPOConfig()) == ["ppo", "l2", "huber"]
    assert default_baselines("value_distance", critic_only_algorithm()) == ["l2", "huber"]
    assert default_baselines("lpo", PPOConfig()) == ["ppo", "dpo"]


def test_an_empty_objective_trains_with_the_algorithms_own_losses():
    learner = registry.make_learner(PPOConfig(), Objective())
    assert learner.objective.slots == ("policy", "value")
    assert learner.default_meta_params == {"policy": {}, "value": {}}


INERT_IMPORT = """
import importlib, json, pkgutil, sys
import jax
from jax._src import xla_bridge
import metarl, inner_loops
names = []
for package in (metarl, inner_loops):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
            names.append(info.name)
from metarl.config import config_from_dict, load_config
config = config_from_dict({"inner": {"env_id": "Pendulum-v1", "policy": "gaussian"}})
load_config("experiments/value_distance_cartpole.toml")
started = bool(xla_bridge._backends)
loaded = sorted(m for m in ("gymnax", "brax", "evosax") if m in sys.modules)
print(json.dumps({"modules": len(names), "started": started, "loaded": loaded,
                  "devices": jax.device_count()}))
"""


def test_imports_and_configs_start_no_jax_and_a_natural_start_uses_every_core():
    """Import every module and build configs (one naming an environment): JAX has not
    started and no environment library is loaded; then the first computation sees one CPU
    device per core, without the program having asked for it."""
    env = env_without_device_count()
    result = subprocess.run([sys.executable, "-c", INERT_IMPORT], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["modules"] >= 10
    assert report["started"] is False
    assert report["loaded"] == []
    assert report["devices"] == len(os.sched_getaffinity(0))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_library_modules_never_import_the_command_line():
    offenders = []
    for package in LIBRARY_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module in COMMAND_LINE:
                continue
            wrong = _imports(path) & COMMAND_LINE
            if wrong:
                offenders.append(f"{module} imports {sorted(wrong)}")
    assert offenders == []


def test_inner_loops_never_import_metarl():
    """The inner loops are the lower layer: metarl builds on them, never the reverse."""
    paths = sorted((ROOT / "inner_loops").rglob("*.py"))
    offenders = [str(path.relative_to(ROOT)) for path in paths
                 if any(name == "metarl" or name.startswith("metarl.") for name in _imports(path))]
    assert offenders == []
