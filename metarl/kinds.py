"""Run kinds by name: which config an experiment file builds, and which code starts,
continues, plots and evaluates a run directory of it.

An experiment file says its kind with a top-level ``kind = "..."``; files without one are
evolution experiments (``"evolve"``), as every file was before kinds existed. A run
directory's kind is the ``kind`` of its ``config.json`` (evolution runs write none).

- ``evolve``: :mod:`metarl.run` (meta-evolution of a learned objective);
- ``pbt``: :mod:`metarl.population.pbt_run` (population-based training);
- ``cem_rl``: :mod:`metarl.population.cem_rl_run` (the cross-entropy method over TD3
  actors sharing a critic);
- ``dvd``: :mod:`metarl.population.dvd_run` (TD3 actors trained to be diverse).

Each kind describes itself with a :class:`~metarl.runs.engine.RunKind` (its module's
``RUN_KIND``), and all run on :mod:`metarl.runs.engine`.

Importing this module starts no JAX computation.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from metarl.config import ConfigError, apply_overrides, read_config_data
from metarl.runs.layout import CONFIG_FILE, RunError, read_json

EVOLVE, PBT, CEM_RL, DVD = "evolve", "pbt", "cem_rl", "dvd"
KIND_MODULES = {
    EVOLVE: "metarl.run",
    PBT: "metarl.population.pbt_run",
    CEM_RL: "metarl.population.cem_rl_run",
    DVD: "metarl.population.dvd_run",
}
KINDS = tuple(KIND_MODULES)


def kind_of(data: dict[str, Any]) -> str:
    """The kind that experiment data (a file's or a run's ``config.json``) names."""
    kind = data.get("kind", EVOLVE)
    if kind not in KINDS:
        raise ConfigError(f"kind: got {kind!r}; allowed: {', '.join(KINDS)}")
    return kind


def kind_spec(kind: str):
    """The :class:`~metarl.runs.engine.RunKind` of ``kind``."""
    return importlib.import_module(KIND_MODULES[kind]).RUN_KIND


def experiment_from_dict(data: dict[str, Any]):
    """The typed, validated config of ``data``'s kind."""
    return kind_spec(kind_of(data)).from_dict(data)


def load_experiment(path: str | Path, overrides: list[str] | None = None):
    """Load, override (``--set`` style) and validate an experiment file of any kind."""
    return experiment_from_dict(apply_overrides(read_config_data(path), overrides or []))


def config_kind(config) -> str:
    return getattr(config, "kind", EVOLVE)


def run_kind(run_dir: str | Path) -> str:
    """The kind of the run in ``run_dir`` (:class:`RunError` when it is not a run)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    data = read_json(run_dir / CONFIG_FILE)
    if not isinstance(data, dict):
        raise RunError(f"{run_dir} is not a metarl run: it has no readable {CONFIG_FILE}")
    try:
        return kind_of(data)
    except ConfigError as error:
        raise RunError(f"{run_dir / CONFIG_FILE}: {error}") from None


def start(config, run_dir: str | Path | None = None):
    """Start a run of ``config`` (any kind) in ``run_dir`` (a fresh directory by default)."""
    from metarl.runs.engine import start_run

    return start_run(kind_spec(config_kind(config)), config, run_dir)


def resume(run_dir: str | Path, generations: int | None = None,
           accept_config_change: bool = False, trackers: tuple[str, ...] | None = None):
    """Continue the run in ``run_dir``, whatever its kind (:func:`metarl.runs.engine.
    resume_run`): ``generations`` extends an evolution run's budget (other kinds refuse
    it), ``trackers`` (``--track``) replaces ``run.trackers`` from here on."""
    from metarl.runs.engine import resume_run

    return resume_run(kind_spec(run_kind(run_dir)), run_dir, generations,
                      accept_config_change, trackers)


def plot(run_dir: str | Path) -> list[Path]:
    """Write the figures of the run in ``run_dir`` and return their paths."""
    return kind_spec(run_kind(run_dir)).plot(run_dir)
