"""How the pieces fit: algorithms by name, objectives that fit them, inert imports and
configs, and an import graph without cycles whose arrows point down the declared layers."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _subprocess_env import env_without_device_count, every_core, on_every_core

from inner_loops import registry
from inner_loops.objective import Objective
from inner_loops.ppo import PPOConfig
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.evaluate import default_baselines
from metarl.evolve.generation import build_learner
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
import importlib, json, os, pkgutil, sys
import jax
from jax._src import xla_bridge
flags_before = os.environ.get("XLA_FLAGS", "")
cpu_devices_before = jax.config.jax_num_cpu_devices
import metarl, inner_loops
names = []
for package in (metarl, inner_loops):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
            names.append(info.name)
from metarl.evolve.config import config_from_dict
from metarl.kinds import load_experiment
config = config_from_dict({"inner": {"env_id": "Pendulum-v1", "policy": "gaussian"}})
load_experiment("experiments/value_distance_cartpole.toml")
report = {"modules": len(names), "started": bool(xla_bridge._backends),
          "loaded": sorted(m for m in ("gymnax", "brax", "evosax") if m in sys.modules),
          "flags_unchanged": os.environ.get("XLA_FLAGS", "") == flags_before,
          "config_unchanged": jax.config.jax_num_cpu_devices == cpu_devices_before}
report["devices"] = jax.device_count()
print(json.dumps(report))
"""

USE_CPU_CORES = """
import json, jax, metarl
asked = metarl.use_cpu_cores()
print(json.dumps({"asked": asked, "devices": jax.device_count()}))
"""


def _run_python(code: str) -> dict:
    env = env_without_device_count()
    result = subprocess.run([sys.executable, "-c", on_every_core(code)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_changes_no_jax_state_and_use_cpu_cores_exposes_every_core():
    """Import every module and build configs (one naming an environment): JAX has not
    started, no environment library is loaded and no JAX or XLA setting changed, so the
    first computation sees JAX's own single CPU device; a program that asks for one device
    per core calls metarl.use_cpu_cores() first."""
    report = _run_python(INERT_IMPORT)
    assert report["modules"] >= 10
    assert report["started"] is False
    assert report["loaded"] == []
    assert report["flags_unchanged"] and report["config_unchanged"]
    assert report["devices"] == 1
    cores = len(every_core())
    assert _run_python(USE_CPU_CORES) == {"asked": cores, "devices": cores}


# --------------------------------------------------------------------------------------
# the import graph

# Layers, lowest first: a module may import modules of its own layer or of a lower one,
# never of a higher one. Figures are leaves (they draw what they are given), so they sit
# low: objectives' plot hooks and run kinds' reports call them.
LAYERS = (
    ("inner_loops",),
    ("metarl.figures",),
    ("metarl.config", "metarl.sharding", "metarl.distributed", "metarl.stats",
     "metarl.programs", "metarl.shipped", "metarl.curves", "metarl.plugins",
     "metarl.suites"),
    ("metarl.objectives",),
    ("metarl.runs",),
    ("metarl.evolve", "metarl.population", "metarl.sweep", "metarl.kinds"),
    ("metarl.discoveries",),
    # the package root sits with the command line: its lazy __getattr__ imports
    # metarl.discoveries (metarl.load_objective)
    ("metarl", "metarl.cli", "metarl.__main__"),
)


def _modules() -> dict[str, Path]:
    """Every module of the library, by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in LIBRARY_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, module: str, modules: set[str]) -> list[tuple[str, list[str]]]:
    """``(imported module, names taken from it)`` of every import in ``path``, at any depth
    (imports inside functions count): ``from a import b`` is an import of ``a.b`` where
    that is a module, else of ``a``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.append((child, []) if child in modules else (base, [alias.name]))
    return found


def _import_graph() -> dict[str, dict[str, list[str]]]:
    """``{module: {imported library module: names taken}}`` over metarl and inner_loops."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for target, names in _imports(path, module, set(modules)):
            while target and target not in modules:  # ``import a.b.c`` of an attribute
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, []).extend(names)
    return graph


def _layer(module: str) -> int:
    best, layer = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best:
                best, layer = len(prefix), index
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def test_the_library_has_no_import_cycle():
    graph = _import_graph()
    cycles, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for target in graph[module]:
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_imports_go_down_the_layers_only():
    wrong = [f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
             for module, edges in sorted(_import_graph().items()) for target in edges
             if _layer(target) > _layer(module)]
    assert wrong == []


def test_figures_import_nothing_of_the_library_but_themselves():
    graph = _import_graph()
    outside = [f"{module} imports {target}" for module in graph
               if module.startswith("metarl.figures") for target in graph[module]
               if not target.startswith("metarl.figures")]
    assert outside == []


def test_no_module_imports_another_modules_private_names():
    private = [f"{module} imports {name} from {target}"
               for module, edges in sorted(_import_graph().items())
               for target, names in edges.items() for name in names
               if name.startswith("_") and not name.startswith("__")]
    assert private == []


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """A checker that missed imports inside functions would miss the circles they hide."""
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from metarl.evolve import kind\n    from . import stats\n")
    found = _imports(path, "metarl.probe", {"metarl.evolve.kind", "metarl.stats"})
    assert found == [("metarl.evolve.kind", []), ("metarl.stats", [])]


def test_library_modules_never_import_the_command_line():
    graph = _import_graph()
    offenders = [f"{module} imports {sorted(set(graph[module]) & COMMAND_LINE)}"
                 for module in graph
                 if module not in COMMAND_LINE and set(graph[module]) & COMMAND_LINE]
    assert offenders == []


def test_inner_loops_never_import_metarl():
    """The inner loops are the lower layer: metarl builds on them, never the reverse."""
    graph = _import_graph()
    offenders = [module for module in graph if module.startswith("inner_loops")
                 and any(target.startswith("metarl") for target in graph[module])]
    assert offenders == []
