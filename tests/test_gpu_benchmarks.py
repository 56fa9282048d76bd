"""The GPU measurements' scripts, checked on the CPU at tiny sizes.

- ``benchmarks/vs_purejaxrl.py`` against a stand-in of PureJaxRL's ``ppo.py`` written here
  (its ``make_train(config)`` interface, its ``wrappers`` import and its gymnax 0.0.x-style
  five-value ``step``), so that the suite needs no fetched code: the harness runs each side
  in its own process, reads both sides' returns alike and writes the JSON.
- ``benchmarks/gpu_check.py --smoke`` with a subset of its parts (install dry run,
  ``metarl devices``, head-to-head, the blog-sized generation at tiny sizes); the main job and
  throughput parts are left out here, to keep the test near a minute of CPU: they are
  ``benchmarks/gpu_experiments.py``'s, which its own test covers. About 72 CPU-s, nearly
  all of it its processes' imports and tracing: its head-to-head at ``--scale 1`` runs
  the programs the ``vs_purejaxrl.py`` test above compiled (persistent cache), and on one
  CPU device, as on one GPU, the generation's ``metarl run`` reads the generation that
  ``evolution_overhead.py`` compiled (79.6 CPU-s before both).
- ``benchmarks/step_cost.py``'s count of an optimised HLO module, against hand-counted work.
- ``benchmarks/gpu_wheelhouse.py``'s naming, exclusion and splitting of wheels.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _subprocess_env import env_without_device_count, jax_cache_env

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# PureJaxRL's interface, trained by nobody: every 4th step of every environment ends an
# episode whose return is the update's number (1, 2, ...), so the last 5% of updates' mean
# return is known by hand. It steps one gymnax environment through the five-value step
# PureJaxRL's wrappers expect, and imports from wrappers.py as ppo.py does.
STAND_IN = '''
import gymnax
import jax
import jax.numpy as jnp
from wrappers import LogWrapper


def make_train(config):
    updates = config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    shape = (updates, config["NUM_STEPS"], config["NUM_ENVS"])
    env, params = gymnax.make(config["ENV_NAME"])
    env = LogWrapper(env)

    def train(rng):
        obs, state = env.reset(rng, params)
        obs, state, reward, done, info = env.step(rng, state, 0, params)  # five values
        step = jnp.arange(config["NUM_STEPS"])[None, :, None]
        ended = jnp.broadcast_to(step % 4 == 3, shape)
        update = jnp.arange(1, updates + 1, dtype=jnp.float32)[:, None, None]
        returns = jnp.broadcast_to(update, shape) + 0.0 * reward
        return {"runner_state": state,
                "metrics": {"returned_episode": ended, "returned_episode_returns": returns}}

    return train
'''
WRAPPERS = '''
class LogWrapper:
    def __init__(self, env):
        self._env = env

    def reset(self, key, params):
        return self._env.reset(key, params)

    def step(self, key, state, action, params):
        obs, state, reward, done, info = self._env.step(key, state, action, params)
        return obs, state, reward, done, info
'''


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("purejaxrl")
    (folder / "ppo.py").write_text(STAND_IN)
    (folder / "wrappers.py").write_text(WRAPPERS)
    return folder


def _load(name):
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(args: list[str], timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                         timeout=timeout, env=env_without_device_count(**jax_cache_env(), **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_vs_purejaxrl_measures_both_sides_in_their_own_processes(stand_in, tmp_path):
    out = tmp_path / "h2h.json"
    _run([str(BENCHMARKS / "vs_purejaxrl.py"), "--purejaxrl", str(stand_in), "--smoke",
          "--workloads", "cartpole_512", "--variants", "default", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["environment"]["backend"] == "cpu" and report["environment"]["jax"]
    row = report["workloads"]["cartpole_512"]
    sides = {(m["side"], m["variant"]) for m in row["measurements"]}
    assert sides == {("purejaxrl", None), ("metarl", "default")}
    for measurement in row["measurements"]:
        assert measurement["agents"] == 4 and measurement["steps_per_agent"] == 2048
        assert measurement["agent_steps_per_second"] > 0 and measurement["compile_seconds"] > 0
    # 2048 steps of 4 envs x 128 are 4 updates; the last 5% of them is the last one, whose
    # episodes all returned 4
    assert row["sides"]["purejaxrl"]["final_return_mean"] == 4.0
    assert row["sides"]["purejaxrl"]["final_return_std"] == 0.0
    assert math.isfinite(row["sides"]["metarl:default"]["final_return_mean"])
    ratio = row["metarl_over_purejaxrl"]["metarl:default"]
    assert ratio == round(row["sides"]["metarl:default"]["best_agent_steps_per_second"]
                          / row["sides"]["purejaxrl"]["best_agent_steps_per_second"], 3)


def test_vs_purejaxrl_reads_returns_alike_and_refuses_a_wrong_folder(tmp_path):
    import numpy as np

    harness = _load("vs_purejaxrl")
    # 20 updates: the last 5% is the last update; one without an ended episode is skipped
    curve = np.full((2, 20), 1.0)
    curve[0, -1], curve[1, -1] = 7.0, np.nan
    assert harness.final_return(curve)[0] == 7.0 and math.isnan(harness.final_return(curve)[1])
    ended = np.zeros((1, 2, 3, 2), bool)
    ended[0, 0, 1, :] = True
    returns = np.ones((1, 2, 3, 2)) * 5.0
    per_update = harness.purejaxrl_update_returns({"returned_episode": ended,
                                                   "returned_episode_returns": returns})
    assert per_update[0, 0] == 5.0 and math.isnan(per_update[0, 1])
    assert harness.parse_variant("final_values=none+shuffle=permutation") == {
        "final_values": "none", "shuffle": "permutation"}
    assert harness.order_of_round([1, 2, 3], 1) == [3, 2, 1]
    out = subprocess.run([sys.executable, str(BENCHMARKS / "vs_purejaxrl.py"), "--purejaxrl",
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "has no ppo.py or wrappers.py" in out.stderr


def test_gpu_check_smoke_writes_every_part_it_ran(stand_in, tmp_path):
    """One CPU device for every process, and the head-to-head at the sizes of the
    ``vs_purejaxrl.py`` test above, so that programs compiled once are read back from the
    persistent cache (module doc)."""
    out = tmp_path / "check"
    _run([str(BENCHMARKS / "gpu_check.py"), "--smoke", "--out", str(out), "--purejaxrl",
          str(stand_in), "--parts", "install", "devices", "head_to_head", "generation",
          "--workloads", "cartpole_512", "--variant-workloads", "cartpole_512",
          "--variants", "default", "--scale", "1"], JAX_NUM_CPU_DEVICES="1")
    report = json.loads((out / "check.json").read_text())
    parts = report["parts"]
    assert set(parts) == {"install", "devices", "head_to_head", "generation"}
    # everything is installed here: resolving the project with no index changes nothing
    assert parts["install"]["dry_run"]["exit"] == 0
    assert parts["install"]["leaves_jax_untouched"] is True
    assert parts["install"]["would_install"] == []
    assert "jax" in parts["install"]["packages"]
    assert "cpu device(s)" in parts["devices"]["output"]
    h2h = parts["head_to_head"]["workloads"]["cartpole_512"]
    assert {m["side"] for m in h2h["measurements"]} == {"purejaxrl", "metarl"}
    assert {m["steps_per_agent"] for m in h2h["measurements"]} == {2048}  # --scale 1
    assert all("error" not in m for m in h2h["measurements"])
    overhead = parts["generation"]["evolution_overhead"]
    assert overhead["agents"] == 2 and overhead["generation_agent_steps_per_second"] > 0
    ran = parts["generation"]["run"]
    assert ran["exit"] == 0 and ran["generations"] == 2
    assert len(ran["seconds_between_lines"]) == 1 and len(ran["seconds_around_steps"]) == 1


def test_gpu_check_skips_what_the_budget_cannot_hold(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--smoke",
                          "--out", str(tmp_path), "--budget", "3", "--parts", "devices",
                          "main_job"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    parts = json.loads((tmp_path / "check.json").read_text())["parts"]
    assert parts["devices"]["skipped"].startswith("time budget")
    assert parts["main_job"]["skipped"].startswith("time budget")


def test_step_cost_counts_each_loop_body_as_often_as_it_runs():
    import jax
    import jax.numpy as jnp

    step_cost = _load("step_cost")

    def body(carry, x):
        return jnp.tanh(carry @ carry + x), None

    def program(carry, xs):
        return jax.lax.scan(body, carry, xs)[0]

    compiled = jax.jit(program).lower(jnp.ones((8, 8)), jnp.ones((7, 8, 8))).compile()
    tallies, notes = step_cost.count(compiled.as_text(),
                                     lambda loops: "loop" if loops else "outside")
    assert not notes
    loop = tallies["loop"]
    assert loop.dots == 7  # one 8x8 product per step
    # per step: the product (2 * 8 * 8 * 8) and an add and a tanh over 64 elements, plus
    # the loop counter's add and compare
    assert 7 * (1024 + 2 * 64) <= loop.flops <= 7 * (1024 + 2 * 64) + 7 * 4
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, list) else xla
    assert xla["flops"] < loop.flops / 3  # XLA's own count has the body once


def test_wheelhouse_names_excludes_and_splits_wheels(tmp_path):
    wheelhouse = _load("gpu_wheelhouse")
    assert wheelhouse.distribution_name("jax_cuda13_plugin-0.11.2-cp312-none.whl") == (
        "jax-cuda13-plugin")
    kept = wheelhouse.KEPT_ON_TARGET
    assert wheelhouse.excluded("jax-cuda13-pjrt", kept)
    assert wheelhouse.excluded("nvidia-cublas", kept)
    assert not wheelhouse.excluded("jaxopt", kept) and not wheelhouse.excluded("flax", kept)
    sizes = {"a": 5, "b": 4, "c": 3, "d": 2}  # MiB
    for name, size in sizes.items():
        (tmp_path / f"{name}-1-py3-none-any.whl").write_bytes(b"x" * size * 2**20)
    parts = wheelhouse.split(sorted(tmp_path.glob("*.whl")), 7)
    assert [round(size) for _, size in parts] == [7, 7]
    assert sorted(p.name[0] for p in (tmp_path / "part1").iterdir()) == ["a", "d"]
    assert sorted(p.name[0] for p in (tmp_path / "part2").iterdir()) == ["b", "c"]
    assert wheelhouse.project_requirements()[0].startswith("jax>=")
    check = _load("gpu_check")  # what its install part must never change
    assert check.touches_jax("jax_cuda13_plugin") and check.touches_jax("JAX")
    assert check.touches_jax("nvidia-cudnn-cu13") and not check.touches_jax("jaxopt")
