"""The "cem_rl" and "dvd" run kinds: experiment files checked on load, a run directory
that holds the same population as the library's ``train_cem_rl`` / ``train_dvd``, resume
from a mid-run checkpoint and after a SIGKILL inside a save into the uninterrupted run,
plots, evaluation and the command line.

Both kinds run one tiny config each (the shapes of tests/test_cem_rl.py and
tests/test_dvd.py), so each compiles its step once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from _kill import kill_inside_save

from metarl.cli import main
from metarl.config import ConfigError
from metarl.kinds import kind_spec, load_experiment, run_kind
from metarl.population.cem_rl import train_cem_rl
from metarl.population.dvd import train_dvd
from metarl.population.method_config import MethodExperimentConfig
from metarl.runs.config_history import ConfigChangedError
from metarl.runs.engine import load_run, resume_run, start_run
from metarl.runs.layout import read_metrics
from metarl.runs.listing import run_info

INNER = """
[inner]
env_id = "Pendulum-v1"
env_params = { max_steps_in_episode = 20 }
actor_hidden_sizes = [16, 16]
critic_hidden_sizes = [16, 16]
batch_size = 16
buffer_size = 1000
eval_episodes = 2
"""
FILES = {
    "cem_rl": INNER + """learning_starts = 100
[cem_rl]
population_size = 4
num_elites = 2
generations = 4
gradient_steps = 4
init_std = 0.1
""",
    "dvd": INNER + """num_envs = 1
train_frequency = 4
gradient_steps = 8
total_timesteps = 160
learning_starts = 16
[dvd]
population_size = 3
segment_updates = 10
""",
}
RUN = """[run]
checkpoint_every = 1
keep_checkpoints = 4
progress = false
"""
STEPS = 4  # generations (cem_rl) or segments (dvd) of both tiny runs


def experiment_text(kind: str) -> str:
    return f'kind = "{kind}"\nname = "tiny_{kind}"\n' + FILES[kind] + RUN


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("config")
    paths = {}
    for kind in FILES:
        paths[kind] = folder / f"tiny_{kind}.toml"
        paths[kind].write_text(experiment_text(kind))
    return paths


@pytest.fixture(scope="module")
def references(files, tmp_path_factory) -> dict[str, object]:
    """An uninterrupted run of each kind."""
    root = tmp_path_factory.mktemp("runs")
    return {kind: start_run(kind_spec(kind), load_experiment(path), root / kind)
            for kind, path in files.items()}


def tree_equal(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def same_lines(run_dir: Path, reference: Path) -> None:
    """Every line of ``metrics.jsonl`` equal, but for timings."""
    timing = {"seconds", "agent_steps_per_second", "time"}
    ours, theirs = read_metrics(run_dir), read_metrics(reference)
    assert len(ours) == len(theirs) == STEPS
    for mine, want in zip(ours, theirs, strict=True):
        assert json.dumps({k: v for k, v in mine.items() if k not in timing}) == \
            json.dumps({k: v for k, v in want.items() if k not in timing})


# --------------------------------------------------------------------------------------
# experiment files


@pytest.mark.parametrize("kind", ["cem_rl", "dvd"])
def test_a_file_loads_typed_and_round_trips(files, kind):
    config = load_experiment(files[kind], [f"{kind}.population_size=6"])
    assert isinstance(config, MethodExperimentConfig) and config.kind == kind
    assert type(config.inner).__name__ == "TD3Config"  # algorithm "td3" by default
    assert config.method.population_size == 6 and config.name == f"tiny_{kind}"
    data = json.loads(json.dumps(config.to_dict()))
    assert data["kind"] == kind and "inner" not in data[kind]
    assert kind_spec(kind).from_dict(data) == config


@pytest.mark.parametrize("kind, overrides, message", [
    ("cem_rl", ["cem_rl.num_elites=8"], r"cem_rl\.num_elites: 8 elites need at least"),
    ("cem_rl", ["cem_rl.populaton_size=8"], r"cem_rl\.populaton_size: unknown field"),
    ("cem_rl", ["inner.algorithm='sac'"], r"inner: needs a TD3 config .* got 'sac'"),
    ("cem_rl", ["inner.env_id='CartPole-v1'"], r"inner\.env_id: td3 needs continuous"),
    ("cem_rl", ["cem_rl.inner={tau=0.1}"], r"cem_rl\.inner: TD3's settings go in the top"),
    ("cem_rl", ["dvd.population_size=3"], r"dvd: a cem_rl experiment has no \[dvd\] table"),
    ("cem_rl", ["generations=3"], r"generations: unknown field; allowed: kind, name"),
    ("dvd", ["dvd.population_size=1"], r"dvd\.population_size: diversity needs at least 2"),
    ("dvd", ["dvd.segment_updates=3"], r"dvd\.segment_updates: 3 does not divide the 40"),
    ("dvd", ["dvd.length_scale=nan"], r"dvd\.length_scale: must be a finite number"),
    ("dvd", ["inner.tau=2.0"], r"inner\.tau"),
])
def test_bad_files_name_the_field(files, kind, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config = load_experiment(files[kind], overrides)
        kind_spec(kind).build(config, None)  # the environment is checked here


def test_the_kind_must_be_one_of_the_known_ones(files):
    with pytest.raises(ConfigError, match=r"kind: got 'cem'; allowed: evolve, pbt, cem_rl, dvd"):
        load_experiment(files["dvd"], ["kind='cem'"])


# --------------------------------------------------------------------------------------
# a run end to end


@pytest.mark.parametrize("kind", ["cem_rl", "dvd"])
def test_a_run_writes_its_directory_and_equals_the_library_run(references, files, kind):
    reference = references[kind]
    run_dir = reference.run_dir
    lines = read_metrics(run_dir)
    step_key = kind_spec(kind).step_key
    assert [line[step_key] for line in lines] == list(range(1, STEPS + 1))
    for key in ("best_return_so_far", "agent_steps", "agent_steps_per_second", "finite"):
        assert key in lines[0], key
    info = run_info(run_dir)
    assert (info.state, info.generation, info.budget) == ("finished", STEPS, STEPS)
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [1, 2, 3, 4]
    # the same population as the library's training function from the run's seed
    method = load_experiment(files[kind]).method
    train = train_cem_rl if kind == "cem_rl" else train_dvd
    direct = train(method, jax.random.PRNGKey(0))
    tree_equal(direct.state, reference.state)
    recorded = [{k: line[k] for k in direct.history[0]} for line in lines]
    assert json.dumps(recorded) == json.dumps(direct.history)
    tree_equal(load_run(kind_spec(kind), run_dir).state, reference.state)


@pytest.mark.parametrize("kind", ["cem_rl", "dvd"])
def test_resume_from_a_mid_run_checkpoint_equals_the_uninterrupted_run(references, tmp_path,
                                                                       kind, capsys):
    reference = references[kind]
    run_dir = tmp_path / "rolled-back"
    shutil.copytree(reference.run_dir, run_dir)
    for step in (3, 4):  # as if the process had died right after checkpoint 2
        shutil.rmtree(run_dir / "checkpoints" / str(step), ignore_errors=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")
    assert main(["resume", str(run_dir), "--no-plots"]) == 0
    assert "run directory" in capsys.readouterr().out
    same_lines(run_dir, reference.run_dir)
    tree_equal(load_run(kind_spec(kind), run_dir).state, reference.state)


@pytest.mark.timeout(400)
def test_a_cem_rl_run_killed_inside_a_save_resumes_into_the_uninterrupted_run(
        files, references, tmp_path, capsys):
    run_dir = tmp_path / "killed"
    kill_inside_save(3, ["run", str(files["cem_rl"]), "--run-dir", str(run_dir), "--no-plots"])
    assert len(read_metrics(run_dir)) == 3  # written before the save it died in
    assert main(["resume", str(run_dir), "--no-plots"]) == 0
    assert "skipping incomplete checkpoint" in capsys.readouterr().err
    same_lines(run_dir, references["cem_rl"].run_dir)
    tree_equal(load_run(kind_spec("cem_rl"), run_dir).state,
               references["cem_rl"].state)


def test_a_population_run_resumed_with_a_tracker_logs_the_rest_and_its_figure(
        references, tmp_path):
    """``--track`` on resume works for every kind: the change is recorded, the steps after
    the checkpoint reach TensorBoard, the figure follows at the end, and training is the
    same as without the tracker."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "tracked"
    shutil.copytree(references["dvd"].run_dir, run_dir)
    for step in (3, 4):
        shutil.rmtree(run_dir / "checkpoints" / str(step))
    assert main(["resume", str(run_dir), "--track", "tensorboard", "--no-plots"]) == 0
    same_lines(run_dir, references["dvd"].run_dir)
    assert json.loads((run_dir / "config.json").read_text())["run"]["trackers"] == [
        "tensorboard"]
    history = [json.loads(line) for line in
               (run_dir / "config_history.jsonl").read_text().splitlines()]
    [change] = [entry for entry in history if entry.get("event") == "trackers"]
    assert change["after_step"] == 2 and change["changes"] == [
        {"field": "run.trackers", "old": [], "new": ["tensorboard"]}]
    events = EventAccumulator(str(run_dir / "tensorboard"),
                              size_guidance={"images": 0, "scalars": 0}).Reload()
    lines = read_metrics(run_dir)
    assert [(e.step, e.value) for e in events.Scalars("median_return")] == [
        (line["segment"], pytest.approx(line["median_return"])) for line in lines[2:]]
    [image] = events.Images("plots/dvd")
    assert image.step == STEPS


def test_resume_refuses_a_changed_config_and_a_longer_budget(references, tmp_path, capsys):
    run_dir = tmp_path / "changed"
    shutil.copytree(references["dvd"].run_dir, run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    saved["dvd"]["length_scale"] = 2.0
    (run_dir / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigChangedError, match=r"dvd\.length_scale"):
        resume_run(kind_spec("dvd"), run_dir)
    assert main(["resume", str(run_dir), "--generations", "8"]) == 2
    assert "--generations: a dvd run's budget also shapes its schedules" in \
        capsys.readouterr().err


# --------------------------------------------------------------------------------------
# plots, evaluation and the command line


@pytest.mark.parametrize("kind, figure", [("cem_rl", "cem_rl.png"), ("dvd", "dvd.png")])
def test_plot_and_evaluate(references, kind, figure, capsys):
    run_dir = references[kind].run_dir
    assert main(["plot", str(run_dir)]) == 0
    assert (run_dir / "plots" / figure).stat().st_size > 10_000
    assert main(["evaluate", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "deterministic episodes" in out and "saved" in out
    report = kind_spec(kind).evaluate(run_dir, 10_007)
    assert report["reused"] and report["method"] == "deterministic"
    assert np.isfinite(report["mean"])
    if kind == "dvd":
        assert len(report["members"]) == 3
        assert report["diversity"] == read_metrics(run_dir)[-1]["diversity"]
    else:
        assert len(report["returns"]) == 2  # inner.eval_episodes
    assert main(["evaluate", str(run_dir), "--seeds", "4"]) == 2
    assert f"--seeds: only for evolution runs; a {kind} run" in capsys.readouterr().err
    assert main(["evaluate", str(run_dir), str(run_dir)]) == 2
    assert f"takes evolution runs only; not: {run_dir} (a {kind} run)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("kind", ["cem_rl", "dvd"])
def test_metarl_run_starts_a_file_of_the_kind(files, references, tmp_path, capsys, kind):
    run_dir = tmp_path / "cli"
    assert main(["run", str(files[kind]), "--run-dir", str(run_dir), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"run directory: {run_dir}" in out and "environment steps" in out
    assert run_kind(run_dir) == kind
    same_lines(run_dir, references[kind].run_dir)
