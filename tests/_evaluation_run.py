"""A tiny evolution experiment and its run directory written by hand, for the tests of
evaluation (tuned baselines, robust fitness): an evaluation needs no evolution, and the
learned value distance starts exactly at L2. The tests share one ``[inner]`` table, so
their programs have the same shapes."""

from __future__ import annotations

import json

import jax

from metarl.evolve.config import config_from_dict
from metarl.runs.meta_params import MEAN_FILE, save_meta_params

TINY = {
    "name": "tiny_evaluation",
    "objective": {"name": "value_distance", "options": {"hidden_sizes": [8]}},
    "inner": {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32,
              "total_timesteps": 2048, "update_epochs": 2, "num_minibatches": 2,
              "hidden_sizes": [16], "learning_rate": 0.005},
}


def write_run(run_dir, data=TINY):
    """``run_dir`` (created) as evaluation reads it: ``config.json`` of ``data`` and the
    objective's initial meta-parameters as the search mean."""
    run_dir.mkdir(parents=True)
    config = config_from_dict(data)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    save_meta_params(run_dir / MEAN_FILE, config.objective.build().init(jax.random.PRNGKey(0)))
    return run_dir
