"""Experiment trackers: metrics and figures reach TensorBoard event files and an offline
Weights & Biases run; a tracker whose package is missing is a clear error."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from metarl.runs import trackers
from metarl.runs.trackers import TrackerError, check_trackers, open_trackers, scalars

METRICS = [
    {"generation": 1, "fitness": [1.0, 3.0, float("nan")], "mean_fitness": 2.0,
     "mean_return": {"CartPole-v1": 20.0}, "devices": 2, "note": "text is left out"},
    {"generation": 2, "fitness": [2.0, 6.0, 4.0], "mean_fitness": 4.0,
     "mean_return": {"CartPole-v1": 30.0}, "devices": 2, "note": "still left out"},
]


def test_scalars_flatten_summarise_and_skip_what_is_not_a_number():
    flat = scalars(METRICS[0])
    assert flat["fitness/mean"] == 2.0 and flat["fitness/min"] == 1.0
    assert flat["fitness/max"] == 3.0
    assert flat["mean_return/CartPole-v1"] == 20.0 and flat["mean_fitness"] == 2.0
    assert "note" not in flat and not any(math.isnan(v) for v in flat.values())


def figure_file(tmp_path):
    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([0, 1], [1, 0])
    path = tmp_path / "fitness.png"
    fig.savefig(path)
    return path


def test_tensorboard_event_files_hold_the_metrics_and_the_figure(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [tracker] = open_trackers(["tensorboard"], tmp_path, "run", {"es": {"sigma": 0.1}})
    for line in METRICS:
        tracker.log(line["generation"], line)
    tracker.log_figure(2, "plots/fitness", figure_file(tmp_path))
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"),
                              size_guidance={"images": 0, "scalars": 0}).Reload()
    mean = events.Scalars("mean_fitness")
    assert [(e.step, e.value) for e in mean] == [(1, 2.0), (2, 4.0)]
    assert [e.value for e in events.Scalars("fitness/max")] == [3.0, 6.0]
    assert [e.value for e in events.Scalars("mean_return/CartPole-v1")] == [20.0, 30.0]
    [image] = events.Images("plots/fitness")
    assert image.step == 2 and image.width == 200 and image.height == 200


def test_wandb_offline_run_is_written_in_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    [tracker] = open_trackers(["wandb"], tmp_path, "tiny", {"es": {"sigma": 0.1}})
    for line in METRICS:
        tracker.log(line["generation"], line)
    tracker.log_figure(2, "plots/fitness", figure_file(tmp_path))
    tracker.close()
    [run] = list((tmp_path / "wandb").glob("offline-run-*"))
    [records] = list(run.glob("run-*.wandb"))  # what `wandb sync` uploads
    # W&B's service process may still be writing the records after finish() under load
    deadline = time.monotonic() + 30.0
    data = records.read_bytes()
    while b"mean_fitness" not in data and time.monotonic() < deadline:
        time.sleep(0.5)
        data = records.read_bytes()
    for key in (b"mean_fitness", b"fitness/max", b"mean_return/CartPole-v1", b"sigma"):
        assert key in data, key
    assert list((run / "files" / "media" / "images").rglob("fitness_2_*.png"))


def test_unknown_or_missing_trackers_are_named(monkeypatch):
    with pytest.raises(TrackerError, match="tracker 'mlflow' is unknown; allowed: "
                                           "tensorboard, wandb"):
        check_trackers(["mlflow"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the package were not installed
    with pytest.raises(TrackerError, match=r'needs the wandb package: pip install '
                                           r'"metarl\[wandb\]"'):
        check_trackers(["wandb"])
    assert check_trackers(["tensorboard"]) == ("tensorboard",)
    assert np.isclose(trackers.scalars({"x": [True, False]})["x/mean"], 0.5)


def test_run_trackers_are_validated_by_name():
    from metarl.config import ConfigError
    from metarl.evolve.config import config_from_dict

    with pytest.raises(ConfigError, match=r"run.trackers\[1\]: got 'mlflow'; allowed: "
                                          "tensorboard, wandb"):
        config_from_dict({"run": {"trackers": ["tensorboard", "mlflow"]}})
    with pytest.raises(ConfigError, match="run.trackers: a tracker is named twice"):
        config_from_dict({"run": {"trackers": ["wandb", "wandb"]}})
    assert config_from_dict({"run": {"trackers": ["wandb"]}}).run.trackers == ("wandb",)


def test_a_run_and_its_resume_log_every_generation_and_the_figures(tmp_path, monkeypatch,
                                                                    capsys):
    """``metarl run --track tensorboard`` logs each generation's metrics and, at the end,
    the run's figures; ``metarl resume --track tensorboard --track wandb`` continues the
    same TensorBoard folder and adds an offline W&B run (a change of trackers is allowed on
    resume and recorded).

    Both commands run in this process (the command line's own ``main``): two processes would
    each spend about 5 CPU-seconds importing jax, gymnax and metarl and tracing the
    generation again, where here the resume reuses the run's program."""
    import json

    import jax
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from metarl.cli import main

    # JAX started before the command: it then keeps this process's one device, rather than
    # exposing one per core to the rest of the session
    jax.device_count()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    repo = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    # the tiny setting of tests/test_plots.py and the notebooks (full generations: 4 updates
    # per agent are too few for the file's successive halving)
    tiny = ["es.population_size=2", "inner.total_timesteps=2048", "es.rungs=1",
            "run.progress=false"]
    evolve = ["run", str(repo / "experiments" / "value_distance_cartpole.toml"), "--run-dir",
              str(run_dir), "--set", "es.generations=2", "--track", "tensorboard"]
    for override in tiny:
        evolve += ["--set", override]
    assert main(evolve) == 0, capsys.readouterr()
    assert json.loads((run_dir / "config.json").read_text())["run"]["trackers"] == [
        "tensorboard"]
    resume = ["resume", str(run_dir), "--generations", "3", "--track", "tensorboard",
              "--track", "wandb"]
    assert main(resume) == 0, capsys.readouterr()

    events = EventAccumulator(str(run_dir / "tensorboard"),
                              size_guidance={"images": 0, "scalars": 0}).Reload()
    assert [e.step for e in events.Scalars("best_fitness_so_far")] == [1, 2, 3]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in events.Scalars("mean_fitness")] == pytest.approx(
        [line["mean_fitness"] for line in metrics if "generation" in line])
    image_steps = sorted(e.step for e in events.Images("plots/fitness"))
    assert image_steps == [2, 3]  # the figures at the end of each command
    [wandb_run] = list((run_dir / "wandb").glob("offline-run-*"))
    assert (run_dir / "wandb-run-id").read_text().strip() in wandb_run.name
    history = [json.loads(line) for line in
               (run_dir / "config_history.jsonl").read_text().splitlines()]
    assert any(entry.get("event") == "trackers" for entry in history)
