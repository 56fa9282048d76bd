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

The population kinds each describe themselves with a
:class:`~metarl.population.stepped_run.SteppedKind` (their module's ``RUN_KIND``) and run
on :mod:`metarl.population.stepped_run`.

Importing this module starts no JAX computation.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from metarl.config import ConfigError, apply_overrides, read_config_data
from metarl.runs.layout import CONFIG_FILE, RunError, read_json

EVOLVE, PBT, CEM_RL, DVD = "evolve", "pbt", "cem_rl", "dvd"
POPULATION_KINDS = {
    PBT: "metarl.population.pbt_run",
    CEM_RL: "metarl.population.cem_rl_run",
    DVD: "metarl.population.dvd_run",
}
KINDS = (EVOLVE, *POPULATION_KINDS)


def kind_of(data: dict[str, Any]) -> str:
    """The kind that experiment data (a file's or a run's ``config.json``) names."""
    kind = data.get("kind", EVOLVE)
    if kind not in KINDS:
        raise ConfigError(f"kind: got {kind!r}; allowed: {', '.join(KINDS)}")
    return kind


def population_kind(kind: str):
    """The :class:`~metarl.population.stepped_run.SteppedKind` of a population kind."""
    return importlib.import_module(POPULATION_KINDS[kind]).RUN_KIND


def experiment_from_dict(data: dict[str, Any]):
    """The typed, validated config of ``data``'s kind."""
    kind = kind_of(data)
    if kind != EVOLVE:
        return population_kind(kind).from_dict(data)
    from metarl.config import config_from_dict

    return config_from_dict(data)


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
    kind = config_kind(config)
    if kind != EVOLVE:
        from metarl.population.stepped_run import start_run

        return start_run(population_kind(kind), config, run_dir)
    from metarl.run import evolve

    return evolve(config, run_dir)


def resume(run_dir: str | Path, generations: int | None = None,
           accept_config_change: bool = False, trackers: tuple[str, ...] | None = None):
    """Continue the run in ``run_dir``, whatever its kind; ``trackers`` (``--track``)
    replaces ``run.trackers`` of an evolution run from here on."""
    kind = run_kind(run_dir)
    if kind != EVOLVE:
        if generations is not None:
            raise ConfigError(
                f"--generations: a {kind} run's budget also shapes its schedules "
                "(learning-rate annealing, exploration, noise decay), so it cannot be "
                "extended; start a new run to train longer")
        from metarl.population.stepped_run import resume_run

        spec = population_kind(kind)
        if trackers is not None and tuple(trackers) != spec.read_config(run_dir).run.trackers:
            raise ConfigError(
                f"--track: a {kind} run keeps the trackers it was started with "
                "(run.trackers); start it with the trackers it should use")
        return resume_run(spec, run_dir, accept_config_change)
    from metarl.run import resume as resume_evolve

    return resume_evolve(run_dir, generations, accept_config_change, trackers)


def plot(run_dir: str | Path) -> list[Path]:
    """Write the figures of the run in ``run_dir`` and return their paths."""
    kind = run_kind(run_dir)
    if kind != EVOLVE:
        return population_kind(kind).plot(run_dir)
    from metarl.plots import plot_run

    return plot_run(run_dir)
