"""The "pbt" run kind: experiment files checked on load, a run directory written end to end,
a run killed (SIGKILL, in a subprocess) inside a checkpoint save and resumed into the very
run that was never interrupted, resume after the end, and the command line.

Every PPO run here uses one tiny config, so its segment compiles once and later runs (and the
subprocess, through JAX's persistent compilation cache) reuse it.
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
from metarl.config import ConfigError, read_config_data
from metarl.evolve.config import config_from_dict
from metarl.kinds import load_experiment, load_run, resume, run_kind, start
from metarl.population.pbt import train_pbt
from metarl.population.pbt_run import PBTExperimentConfig, evaluate_pbt_run, pbt_config_from_dict
from metarl.runs.config_history import ConfigChangedError
from metarl.runs.layout import read_metrics
from metarl.runs.listing import run_info

SEGMENTS = 4
TINY = """
kind = "pbt"
name = "tiny_pbt"
[inner]
algorithm = "ppo"
env_id = "CartPole-v1"
num_envs = 2
num_steps = 16
total_timesteps = 512
hidden_sizes = [8]
update_epochs = 1
num_minibatches = 1
[pbt]
population_size = 4
segment_updates = 4
exploit_fraction = 0.25
[pbt.priors.learning_rate]
low = 1e-4
high = 1e-2
log = true
[run]
checkpoint_every = 1
keep_checkpoints = 2
progress = false
"""


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "tiny_pbt.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def reference(tiny_file, tmp_path_factory):
    """An uninterrupted run of SEGMENTS segments."""
    return start(load_experiment(tiny_file), tmp_path_factory.mktemp("runs") / "reference")


def tree_equal(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def same_lines(run_dir: Path, reference: Path) -> None:
    keys = ("segment", "fitness", "hypers", "source", "replaced", "returns", "agent_steps")
    ours, theirs = read_metrics(run_dir), read_metrics(reference)
    assert len(ours) == len(theirs) == SEGMENTS
    for mine, want in zip(ours, theirs, strict=True):
        assert json.dumps({k: mine[k] for k in keys}) == json.dumps({k: want[k] for k in keys})


# --------------------------------------------------------------------------------------
# experiment files


def test_a_pbt_file_loads_typed_and_round_trips(tiny_file):
    config = load_experiment(tiny_file, ["pbt.explore='resample'"])
    assert isinstance(config, PBTExperimentConfig) and config.kind == "pbt"
    assert type(config.inner).__name__ == "PPOConfig" and config.num_segments == SEGMENTS
    prior = config.pbt.priors["learning_rate"]
    assert (prior.low, prior.high, prior.log) == (1e-4, 1e-2, True)
    assert config.pbt.explore == "resample"
    assert pbt_config_from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.to_dict()["kind"] == "pbt"


@pytest.mark.parametrize(("overrides", "message"), [
    (["pbt.populaton_size=8"], r"pbt\.populaton_size: unknown field; allowed: population_size"),
    (["pbt.exploit_fraction=0.7"], r"pbt\.exploit_fraction: must lie in \(0, 0\.5\]"),
    (["pbt.population_size=2"], r"pbt\.population_size: 2 members with exploit_fraction"),
    (["pbt.segment_updates=3"], r"pbt\.segment_updates: 3 does not divide the 16 updates"),
    (["pbt.priors.learning_rate.high=1e-5"], r"pbt\.priors\.learning_rate\.low: must be below"),
    (["pbt.priors.learning_rate.lg=true"], r"pbt\.priors\.learning_rate\.lg: unknown field"),
    (["pbt.priors.hidden_sizes={low=4, high=8}"],
     r"pbt\.priors\.hidden_sizes: not a traced hyperparameter of ppo; allowed: learning_rate"),
    (["pbt.priors.gamma={low=0.9, high=1.5}"], r"pbt\.priors\.gamma\.high: 1\.5 is not a valid"),
    (["pbt.perturb_factors=[0.8, nan]"], r"pbt\.perturb_factors\[1\]: must be a finite"),
    (["inner.algorithm='a2c'"], r"inner\.algorithm: unknown 'a2c'; allowed: .*ppo"),
    (["es.generations=3"], r"es: a pbt experiment has no \[es\] table"),
    (["pbt.copy_buffer=false"], r"pbt\.copy_buffer: false keeps each member's own replay "
                                r"buffer, and ppo has none"),
    (["pbt.copy_buffer=1"], r"pbt\.copy_buffer: expected true or false"),
    (["kind='cem'"], r"kind: got 'cem'; allowed: evolve, pbt, cem_rl, dvd"),
])
def test_bad_pbt_files_name_the_field(tiny_file, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(tiny_file, overrides)


def test_evolution_files_stay_evolution_and_refuse_to_read_a_pbt_file(tiny_file):
    evolve_file = Path(__file__).parents[1] / "experiments" / "lpo_cartpole_tiny.toml"
    assert type(load_experiment(evolve_file)).__name__ == "ExperimentConfig"
    assert type(load_experiment(evolve_file, ["kind='evolve'"])).__name__ == "ExperimentConfig"
    with pytest.raises(ConfigError, match=r"kind: expected 'evolve' here, got 'pbt'"):
        config_from_dict(read_config_data(tiny_file))


# --------------------------------------------------------------------------------------
# a run end to end


def test_a_pbt_run_writes_its_directory_and_equals_train_pbt(reference, tiny_file):
    run_dir = reference.run_dir
    lines = read_metrics(run_dir)
    assert [line["segment"] for line in lines] == list(range(1, SEGMENTS + 1))
    first = lines[0]
    for key in ("agent_steps", "best_return", "median_return", "mean_return", "fitness",
                "hypers", "source", "replaced", "exploited", "agent_steps_per_second"):
        assert key in first, key
    assert first["agent_steps"] == 4 * 4 * 32 and len(first["fitness"]) == 4
    assert len(first["hypers"]["learning_rate"]) == 4
    assert sum(first["replaced"]) == 1 and not any(lines[-1]["replaced"])
    best = max(lines, key=lambda line: (line["best_return"], -line["segment"]))["segment"]
    kept = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())
    assert kept == sorted({3, 4, best})  # the latest run.keep_checkpoints and the best
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    info = run_info(run_dir)
    assert (info.state, info.generation, info.budget) == ("finished", SEGMENTS, SEGMENTS)
    # the same population as the library's train_pbt from the run's seed
    config = load_experiment(tiny_file)
    direct = train_pbt(reference.program.learner, config.pbt, jax.random.PRNGKey(0),
                       chunk_size=config.run.chunk_size)
    assert [r["hypers"] for r in direct.history] == [line["hypers"] for line in lines]
    tree_equal(direct.states, reference.states)
    # a run reads back from its checkpoint as it ended
    loaded = load_run(run_dir)
    tree_equal(loaded.state, reference.state)
    assert int(loaded.state["segment"]) == SEGMENTS


def test_plot_and_evaluate_a_pbt_run(reference, capsys):
    run_dir = reference.run_dir
    assert main(["plot", str(run_dir)]) == 0
    assert (run_dir / "plots" / "pbt.png").stat().st_size > 10_000
    report = evaluate_pbt_run(run_dir)
    assert report["method"] == "training_return"  # PPO has no deterministic evaluation
    assert [m["return"] for m in report["members"]] == read_metrics(run_dir)[-1]["fitness"]
    assert len(report["members"][0]["lineage"]) == SEGMENTS
    assert evaluate_pbt_run(run_dir)["reused"]
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--seeds", "4"]) == 2
    assert "--seeds: only for evolution runs" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# kill and resume



@pytest.mark.timeout(400)
def test_a_run_killed_inside_a_save_resumes_into_the_uninterrupted_run(
        tiny_file, reference, tmp_path, capsys):
    run_dir = tmp_path / "killed"
    kill_inside_save(3, ["run", str(tiny_file), "--run-dir", str(run_dir), "--no-plots"])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()
                  if p.name.isdigit()) == ["1", "2"]
    assert len(read_metrics(run_dir)) == 3  # written before the save it died in

    assert main(["resume", str(run_dir), "--no-plots"]) == 0
    assert "skipping incomplete checkpoint" in capsys.readouterr().err
    same_lines(run_dir, reference.run_dir)
    tree_equal(load_run(run_dir).state, reference.state)
    assert list((run_dir / "damaged-checkpoints").iterdir())  # moved aside, not deleted


def test_resume_after_the_end_changes_nothing_and_cannot_extend(reference, tmp_path, capsys):
    run_dir = tmp_path / "done"
    shutil.copytree(reference.run_dir, run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    result = resume(run_dir)
    assert "has finished its 4 segments; nothing to continue" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == before
    tree_equal(result.state, reference.state)
    assert main(["resume", str(run_dir), "--generations", "8"]) == 2
    assert "--generations: a pbt run's budget also shapes its schedules" in \
        capsys.readouterr().err


def test_resume_refuses_a_changed_config_unless_accepted(reference, tmp_path):
    run_dir = tmp_path / "changed"
    shutil.copytree(reference.run_dir, run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    saved["pbt"]["perturb_factors"] = [0.5, 2.0]
    (run_dir / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigChangedError, match=r"pbt\.perturb_factors"):
        resume(run_dir)


# --------------------------------------------------------------------------------------
# the command line


def test_metarl_run_starts_a_pbt_file(tiny_file, reference, tmp_path, capsys):
    run_dir = tmp_path / "cli"
    assert main(["run", str(tiny_file), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "segments: 4" in out and "pbt.png" in out
    same_lines(run_dir, reference.run_dir)
    assert run_kind(run_dir) == "pbt"
    assert main(["run", str(tiny_file), "--run-dir", str(run_dir)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["runs", str(tmp_path)]) == 0
    assert "finished  4/4" in capsys.readouterr().out


SAC_TINY = """
kind = "pbt"
name = "sac_tiny"
[inner]
algorithm = "sac"
env_id = "Pendulum-v1"
total_timesteps = 1280
buffer_size = 1280
num_envs = 2
train_frequency = 8
gradient_steps = 2
batch_size = 16
learning_starts = 64
actor_hidden_sizes = [8]
critic_hidden_sizes = [8]
eval_episodes = 2
[pbt]
population_size = 4
segment_updates = 20
[pbt.priors.actor_learning_rate]
low = 3e-4
high = 3e-3
log = true
[run]
progress = false
"""


def test_an_off_policy_population_compiles_its_segment_once_and_evaluates_greedily(tmp_path):
    path = tmp_path / "sac_tiny.toml"
    path.write_text(SAC_TINY)
    result = start(load_experiment(path), tmp_path / "sac")
    assert len(result.history) == 4
    # the initial population is placed and typed as every segment returns it
    assert result.program.segment._cache_size() == 1
    report = evaluate_pbt_run(result.run_dir)
    assert report["method"] == "deterministic" and report["episodes"] == 2
    scores = [m["return"] for m in report["members"]]
    assert len(scores) == 4 and all(np.isfinite(scores)) and all(s < 0 for s in scores)
    assert scores != [m["training_return"] for m in report["members"]]


def test_a_longer_budget_continues_only_as_an_accepted_and_recorded_change(reference, tmp_path):
    run_dir = tmp_path / "longer"
    shutil.copytree(reference.run_dir, run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    saved["inner"]["total_timesteps"] = 768  # 24 updates: 6 segments instead of 4
    (run_dir / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigChangedError, match=r"inner\.total_timesteps 512 -> 768"):
        resume(run_dir)
    result = resume(run_dir, accept_config_change=True)
    assert [line["segment"] for line in result.history] == list(range(1, 7))
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
              if "event" in json.loads(line)]
    assert events[0]["event"] == "config_change" and events[0]["after_step"] == SEGMENTS
    same = read_metrics(run_dir)[:SEGMENTS]
    assert [line["fitness"] for line in same] == \
        [line["fitness"] for line in read_metrics(reference.run_dir)]


def test_a_run_that_never_reached_a_checkpoint_starts_again_from_the_beginning(
        reference, tmp_path, capsys):
    run_dir = tmp_path / "never_saved"
    run_dir.mkdir()
    shutil.copy(reference.run_dir / "config.json", run_dir / "config.json")
    result = resume(run_dir)
    assert "no complete checkpoint" in capsys.readouterr().err
    same_lines(run_dir, reference.run_dir)
    tree_equal(result.state, reference.state)


def test_every_segment_reaches_the_run_configs_trackers(tiny_file, tmp_path, monkeypatch):
    import metarl.runs.trackers

    logged, figures, closed = [], [], []

    class Recorder:
        def log(self, step, metrics):
            logged.append((step, metarl.runs.trackers.scalars(metrics)))

        def log_figure(self, step, tag, path):
            figures.append((step, tag, path.name))

        def close(self):
            closed.append(True)

    monkeypatch.setattr(metarl.runs.trackers, "open_trackers",
                        lambda names, run_dir, name, config: [Recorder() for _ in names])
    config = load_experiment(tiny_file)
    # run.trackers (the field the run config gains for evolution runs), set by hand here
    object.__setattr__(config.run, "trackers", ("tensorboard",))
    start(config, tmp_path / "tracked")
    assert [step for step, _ in logged] == list(range(1, SEGMENTS + 1)) and closed == [True]
    assert {"best_return", "median_return", "hypers/learning_rate/mean"} <= set(logged[0][1])
    assert figures == [(SEGMENTS, "plots/pbt", "pbt.png")]  # the run's figure, at the end
