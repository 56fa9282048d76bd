"""Shipped experiments travel: found by name wherever metarl runs, listed by ``metarl run
--list``, and carried in the wheel as package data (``setup.py``, :mod:`metarl.shipped`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from _subprocess_env import jax_cache_env

from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.metagradient_config import MetaGradientConfig
from metarl.kinds import load_experiment
from metarl.shipped import experiment_path, shipped_experiments

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "experiments").glob("*.toml"))
NAMES = [path.stem for path in FILES]
# The main job cut to one generation of 2 candidates, 4 PPO updates each: the program
# tests/test_plots.py's `metarl run` compiles too (the session's compilation cache keeps it).
TINY_RUN = ["es.generations=1", "es.population_size=2", "inner.total_timesteps=2048",
            "es.rungs=1", "run.progress=false"]
# what a source tree must hold to build the wheel
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "metarl",
                "inner_loops", "experiments")


def test_the_shipped_experiments_are_the_experiments_folders_toml_files():
    assert list(shipped_experiments()) == NAMES
    assert all(path.suffix == ".toml" for path in shipped_experiments().values())
    assert "metagradient_cartpole" in NAMES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_shipped_experiment_loads_by_name_as_by_path(path):
    assert experiment_path(path.stem).resolve() == path
    assert experiment_path(path.name).resolve() == path
    by_path = load_experiment(path, ["run.seed=7"])
    assert load_experiment(path.stem, ["run.seed=7"]) == by_path
    assert load_experiment(path.name) == load_experiment(path)


def test_an_existing_file_wins_over_a_name(tmp_path, monkeypatch):
    mine = tmp_path / "value_distance_cartpole.toml"
    mine.write_text((ROOT / "experiments" / "lpo_cartpole_tiny.toml").read_text())
    monkeypatch.chdir(tmp_path)
    assert load_experiment("value_distance_cartpole.toml").name == "lpo_cartpole_tiny"
    # no file at the bare name's path: the shipped experiment
    assert load_experiment("value_distance_cartpole").name == "value_distance_cartpole"


def test_an_unknown_name_names_close_matches_and_the_list():
    with pytest.raises(ConfigError) as error:
        load_experiment("value_distance_cartpol")
    message = str(error.value)
    assert "\n" not in message
    assert "close matches: value_distance_cartpole, " in message
    assert "`metarl run --list`" in message


def test_a_missing_path_is_not_looked_up_by_name(tmp_path):
    missing = tmp_path / "value_distance_cartpole.toml"
    with pytest.raises(ConfigError, match=r"config file not found: .*value_distance_cartpole"
                                          r"\.toml; 'value_distance_cartpole' is a shipped"):
        load_experiment(missing)


def test_the_command_line_refuses_an_unknown_name_in_one_line(capsys):
    assert main(["run", "lpo_cartpole_tinny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("metarl run: error: no file lpo_cartpole_tinny and no shipped "
                          "experiment 'lpo_cartpole_tinny': close matches: lpo_cartpole_tiny")


def test_run_list_names_every_shipped_experiment_with_its_kind(capsys):
    assert main(["run", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES
    for line, path in zip(lines, FILES, strict=True):
        data = tomllib.loads(path.read_text())
        name, kind, description = line.split(maxsplit=2)
        assert kind == data.get("kind", "evolve")
        assert description == data["description"].splitlines()[0]


def test_every_shipped_experiment_describes_itself():
    for path in FILES:
        description = tomllib.loads(path.read_text()).get("description", "")
        assert len(description.split()) >= 4, f"{path.name}: no meaningful description"


def test_run_list_takes_no_experiment(capsys):
    assert main(["run", "value_distance_cartpole", "--list"]) == 2
    assert "--list: lists the shipped experiments and runs none" in capsys.readouterr().err


def test_the_metagradient_experiment_is_the_metagradient_engine():
    config = load_experiment("metagradient_cartpole")
    assert isinstance(config.meta, MetaGradientConfig)
    assert config.objective.name == "value_distance"
    assert config.inner[0].env_id == "CartPole-v1"
    assert (config.meta.steps, config.meta.unroll, config.meta.agents) == (150, 4, 8)


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the source tree (the repository's own build/ folder, which
    setuptools never empties, stays out of it), built with this environment's setuptools."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    source.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("metarl-*.whl")
    return wheel


def test_a_wheel_carries_the_experiments_and_runs_one_by_name(tmp_path):
    wheel = _build_wheel(tmp_path)
    packed = zipfile.ZipFile(wheel).namelist()
    data = sorted(name for name in packed if name.startswith("metarl/_experiments/"))
    assert data == [f"metarl/_experiments/{path.name}" for path in FILES]  # no scripts
    assert not [name for name in packed if name.startswith("experiments/")]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-deps", "--no-index", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    elsewhere = tmp_path / "elsewhere"  # no experiments/ here or above
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(jax_cache_env())

    def venv_python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=600)

    # where metarl and its experiments come from, then `metarl run --list`, in one process
    listed = venv_python("-c", "import metarl, metarl.shipped, metarl.cli; "
                               "print(metarl.__file__); print(metarl.shipped.shipped_folder()); "
                               "metarl.cli.main(['run', '--list'])")
    assert listed.returncode == 0, listed.stderr
    module, folder, *lines = listed.stdout.splitlines()
    assert Path(module).is_relative_to(venv) and not Path(module).is_relative_to(ROOT)
    assert Path(folder) == Path(module).parent / "_experiments"
    assert [line.split()[0] for line in lines] == NAMES

    run_dir = tmp_path / "run"
    command = ["-m", "metarl", "run", "value_distance_cartpole", "--run-dir", str(run_dir),
               "--no-plots"]
    for override in TINY_RUN:
        command += ["--set", override]
    done = venv_python(*command)
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1
    assert json.loads((run_dir / "config.json").read_text())["name"] == "value_distance_cartpole"
