"""Run kinds by name, and the one Python entry point for each action on a run of any kind.

An experiment file says its kind with a top-level ``kind = "..."``; files without one are
evolution experiments (``"evolve"``). A run directory's kind is the ``kind`` of its
``config.json`` (evolution runs write none).

- ``evolve``: :mod:`metarl.evolve` (meta-evolution of a learned objective);
- ``pbt``: :mod:`metarl.population.pbt_run` (population-based training);
- ``cem_rl``: :mod:`metarl.population.cem_rl_run` (the cross-entropy method over TD3
  actors sharing a critic);
- ``dvd``: :mod:`metarl.population.dvd_run` (TD3 actors trained to be diverse).

Each kind describes itself with a :class:`~metarl.runs.engine.RunKind` (its module's
``RUN_KIND``), and all run on :mod:`metarl.runs.engine`. From Python::

    from metarl.kinds import evaluate, evaluate_together, load_experiment, plot, resume, start

    result = start(load_experiment("experiments/value_distance_cartpole.toml"))
    resume(result.run_dir, generations=20)      # evolution runs may extend their budget
    resume(result.run_dir, time_limit="9m")     # stops cleanly in time (RunInterrupted)
    report = evaluate(result.run_dir, seeds=8)  # options as the kind's evaluate takes them
    tuned = evaluate(result.run_dir, tune=True)  # baselines tuned first (evolution runs)
    robust = evaluate(result.run_dir, across={"learning_rate": [1e-4, 3e-4, 1e-3]})
    both = evaluate_together([result.run_dir, other_run], tune=True)  # baselines trained once
    plot(result.run_dir)
    distill(result.run_dir, candidate="best")  # closed-form formulas of the evolved function

An evolution experiment with ``[es] evolution_seeds = N > 1`` starts ``N`` evolutions as one
program (:mod:`metarl.evolve.replicated`) in a parent directory of ``N`` ordinary run
directories; ``resume``, ``evaluate`` (a verdict across the seeds), ``read_config`` and
``plot`` take the parent too, and every seed directory on its own.

Importing this module starts no JAX computation.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

from metarl.config import ConfigError, apply_overrides, read_config_data
from metarl.objectives.sources import with_source_folder
from metarl.runs.engine import load_run as engine_load_run
from metarl.runs.engine import resume_run, start_run
from metarl.runs.layout import CONFIG_FILE, RunError, read_json
from metarl.runs.replicates import is_replicated, read_replicates, replicate_dirs
from metarl.runs.stopping import stop_conditions
from metarl.shipped import experiment_path

EVOLVE, PBT, CEM_RL, DVD = "evolve", "pbt", "cem_rl", "dvd"
KIND_MODULES = {
    EVOLVE: "metarl.evolve.kind",
    PBT: "metarl.population.pbt_run",
    CEM_RL: "metarl.population.cem_rl_run",
    DVD: "metarl.population.dvd_run",
}
KINDS = tuple(KIND_MODULES)
# the run kind of an evolution experiment by its [meta] table's method (its engine): the
# same experiment files and run directories, another program and budget field
ENGINE_MODULES = {
    "evolution": KIND_MODULES[EVOLVE],
    "metagradient": "metarl.evolve.metagradient_kind",
}


def kind_of(data: dict[str, Any]) -> str:
    """The kind that experiment data (a file's or a run's ``config.json``) names."""
    kind = data.get("kind", EVOLVE)
    if kind not in KINDS:
        raise ConfigError(f"kind: got {kind!r}; allowed: {', '.join(KINDS)}")
    return kind


def kind_spec(kind: str):
    """The :class:`~metarl.runs.engine.RunKind` of ``kind``."""
    return importlib.import_module(KIND_MODULES[kind]).RUN_KIND


def run_spec(config):
    """The :class:`~metarl.runs.engine.RunKind` a run of ``config`` trains on: its kind's,
    or for an evolution experiment its engine's, by ``meta.method`` (:data:`ENGINE_MODULES`:
    with ``"metagradient"``, :mod:`metarl.evolve.metagradient_kind`, another program and
    budget field, every file of the run the same)."""
    kind = config_kind(config)
    if kind == EVOLVE:
        return importlib.import_module(ENGINE_MODULES[config.meta.method]).RUN_KIND
    return kind_spec(kind)


def run_dir_spec(run_dir: str | Path):
    """:func:`run_spec` of the run in ``run_dir``."""
    spec = kind_spec(run_kind(run_dir))
    return run_spec(spec.read_config(run_dir)) if spec.name == EVOLVE else spec


def experiment_from_dict(data: dict[str, Any]):
    """The typed, validated config of ``data``'s kind."""
    return kind_spec(kind_of(data)).from_dict(data)


def load_experiment(path: str | Path, overrides: list[str] | None = None):
    """Load, override (``--set`` style) and validate an experiment file of any kind: a path,
    or where no file exists there the name of a shipped experiment
    (``"value_distance_cartpole"``, :mod:`metarl.shipped`). A relative ``[objective] module
    = "x.py"`` is read from the file's folder."""
    path = experiment_path(path)
    data = apply_overrides(read_config_data(path), overrides or [])
    return experiment_from_dict(with_source_folder(data, Path(path).parent))


def config_kind(config) -> str:
    return getattr(config, "kind", EVOLVE)


def is_parent(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is a parent of replicated evolutions
    (:mod:`metarl.runs.replicates`) rather than a run directory."""
    return is_replicated(run_dir) and not (Path(run_dir) / CONFIG_FILE).is_file()


def run_kind(run_dir: str | Path) -> str:
    """The kind of the run in ``run_dir`` (:class:`RunError` when it is not a run); of a
    parent of replicated runs, the kind of its runs."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    if is_parent(run_dir):
        return kind_of({"kind": read_replicates(run_dir).get("kind", EVOLVE)})
    data = read_json(run_dir / CONFIG_FILE)
    if not isinstance(data, dict):
        raise RunError(f"{run_dir} is not a metarl run: it has no readable {CONFIG_FILE}")
    try:
        return kind_of(data)
    except ConfigError as error:
        raise RunError(f"{run_dir / CONFIG_FILE}: {error}") from None


def start(config, run_dir: str | Path | None = None, mesh=None,
          time_limit: float | str | None = None):
    """Start a run of ``config`` (any kind's, e.g. from :func:`load_experiment`) in
    ``run_dir`` (default: a fresh ``<run.output_dir>/<name>-<time>``) and train it to its
    budget (:func:`metarl.runs.engine.start_run`); ``mesh`` overrides the devices a
    sharded run uses. Returns the kind's :class:`~metarl.runs.engine.SteppedRun`.

    An evolution experiment with ``es.evolution_seeds = N > 1`` starts ``N`` evolutions
    together in the parent ``run_dir``
    (:func:`metarl.evolve.replicated.start_replicated`), and returns a
    :class:`~metarl.evolve.replicated.ReplicatedRun`.

    The run stops cleanly before ``time_limit`` (seconds, or ``"9m"``, ``"1h30m"``) runs
    out, and on SIGTERM or SIGINT (:mod:`metarl.runs.stopping`), raising
    :class:`~metarl.runs.layout.RunInterrupted` with its last completed step checkpointed:
    :func:`resume` continues it exactly."""
    with stop_conditions(time_limit):
        if config_kind(config) == EVOLVE and config.es.evolution_seeds > 1:
            from metarl.evolve.replicated import start_replicated

            return start_replicated(config, run_dir, mesh)
        return start_run(run_spec(config), config, run_dir, mesh)


def resume(run_dir: str | Path, generations: int | None = None,
           accept_config_change: bool = False, trackers: tuple[str, ...] | None = None,
           mesh=None, time_limit: float | str | None = None):
    """Continue the run in ``run_dir``, whatever its kind (:func:`metarl.runs.engine.
    resume_run`): ``generations`` extends an evolution run's budget (other kinds refuse
    it), ``trackers`` (``--track``) replaces ``run.trackers`` from here on, ``time_limit``
    and the signals stop it as in :func:`start`. A parent of replicated evolutions
    continues every seed (:func:`metarl.evolve.replicated.resume_replicated`)."""
    with stop_conditions(time_limit):
        if is_parent(run_dir):
            from metarl.evolve.replicated import resume_replicated

            return resume_replicated(run_dir, generations, accept_config_change, trackers,
                                     mesh)
        return resume_run(run_dir_spec(run_dir), run_dir, generations,
                          accept_config_change, trackers, mesh)


def load_run(run_dir: str | Path):
    """Read the run in ``run_dir`` back (its newest usable checkpoint, config and history)
    without running or changing anything."""
    if is_parent(run_dir):
        names = ", ".join(str(d) for d in replicate_dirs(run_dir))
        raise RunError(f"{run_dir} is a parent of replicated runs; load each of them: {names}")
    return engine_load_run(run_dir_spec(run_dir), run_dir)


def read_config(run_dir: str | Path):
    """The validated config of the run in ``run_dir``, whatever its kind (of a parent of
    replicated runs, the experiment as started, ``es.evolution_seeds`` included)."""
    if is_parent(run_dir):
        data = with_source_folder(read_replicates(run_dir)["config"], run_dir)
        return kind_spec(run_kind(run_dir)).from_dict(data)
    return kind_spec(run_kind(run_dir)).read_config(run_dir)


def evaluate(run_dir: str | Path, **options) -> dict[str, Any]:
    """Evaluate the run in ``run_dir`` by its kind's rules and save the record under
    ``evaluations/`` (an identical evaluation made before is reused unless
    ``rerun=True``). Every kind takes ``eval_seed`` and ``rerun``; an evolution run also
    takes the options of :func:`metarl.evolve.evaluate.evaluate_run` (``seeds``,
    ``baselines``, ``which``, ``tune``, ``tune_seeds``, ``across``, ...). An option the kind
    does not take is a :class:`~metarl.config.ConfigError` naming it.

    A parent of replicated evolutions takes the same options: every seed is evaluated and
    one verdict across them saved in the parent
    (:func:`metarl.evolve.replicated.evaluate_replicated`)."""
    spec = kind_spec(run_kind(run_dir))
    _check_evaluation_options(spec, options)
    if is_parent(run_dir):
        from metarl.evolve.replicated import evaluate_replicated

        return evaluate_replicated(run_dir, **options)
    return spec.evaluate(run_dir, **options)


def evaluate_together(run_dirs: list[str | Path], **options) -> list[dict[str, Any]]:
    """Evaluate several evolution runs with the same ``options`` (as :func:`evaluate`
    takes them), each saved in its own ``evaluations/``, training every baseline once
    (:func:`metarl.evolve.evaluate.evaluate_runs`): evolution seeds started apart, or
    variants of one experiment such as LPO and TA-LPO. Every directory must be an
    evolution run; a parent of replicated evolutions is evaluated on its own
    (:func:`evaluate`). Returns the reports in the order of ``run_dirs``."""
    wrong = []
    for run_dir in run_dirs:
        kind = run_kind(run_dir)
        if is_parent(run_dir):
            wrong.append(f"{run_dir} (a parent of replicated evolutions)")
        elif kind != EVOLVE:
            wrong.append(f"{run_dir} (a {kind} run)")
    if wrong:
        raise ConfigError(f"evaluating several runs together (sharing their baselines) takes "
                          f"evolution runs only; not: {', '.join(wrong)}")
    _check_evaluation_options(kind_spec(EVOLVE), options)
    from metarl.evolve.evaluate import evaluate_runs

    return evaluate_runs(run_dirs, **options)


def _check_evaluation_options(spec, options: dict[str, Any]) -> None:
    """A :class:`~metarl.config.ConfigError` naming any option the kind's evaluation does
    not take (the tuning and across-a-knob options with why)."""
    accepted = [name for name, parameter in inspect.signature(spec.evaluate).parameters.items()
                if name != "run_dir" and parameter.kind != parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    tuning = [name for name in unknown if name.startswith("tune")]
    if tuning:
        raise ConfigError(f"{', '.join(tuning)}: a {spec.name} run cannot be tuned: tuning "
                          "searches the settings of the objectives an evolved objective is "
                          "compared with, so only evolution runs take it")
    if "across" in unknown:
        raise ConfigError(f"across: a {spec.name} run cannot be evaluated across a "
                          "hyperparameter: that trains the objectives an evolution run "
                          "compares, so only evolution runs take it")
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not an evaluation option of a {spec.name} "
                          f"run; it takes {', '.join(accepted)}")


def format_evaluation(run_dir: str | Path, report: dict[str, Any]) -> str:
    """An evaluation ``report`` of the run in ``run_dir`` as its kind's table (of a parent
    of replicated evolutions, the verdict across its seeds)."""
    if is_parent(run_dir):
        from metarl.evolve.replicated import format_replicated_evaluation

        return format_replicated_evaluation(report)
    return kind_spec(run_kind(run_dir)).format_evaluation(report)


def plot(run_dir: str | Path) -> list[Path]:
    """Write the figures of the run in ``run_dir`` to its ``plots/`` and return their
    paths (of a parent of replicated runs: every seed's, in its own ``plots/``)."""
    if is_parent(run_dir):
        return [path for seed_dir in replicate_dirs(run_dir)
                if (seed_dir / CONFIG_FILE).is_file() for path in plot(seed_dir)]
    return kind_spec(run_kind(run_dir)).plot(run_dir)


def distill(run_dir: str | Path, **options) -> dict[str, Any]:
    """Fit closed-form formulas to the evolved function of the evolution run in ``run_dir``
    and save them (:func:`metarl.evolve.distill.distill_run`, whose options it takes:
    ``candidate``, ``max_complexity``, ``samples``, ``seeds``, ...). A parent of replicated
    evolutions is distilled seed by seed; other kinds have no evolved function."""
    if is_parent(run_dir):
        names = ", ".join(str(d) for d in replicate_dirs(run_dir))
        raise RunError(f"{run_dir} is a parent of replicated runs; distil each of them: "
                       f"{names}")
    kind = run_kind(run_dir)
    if kind != EVOLVE:
        raise RunError(f"{run_dir} is a {kind} run; only evolution runs have an evolved "
                       "function to distil")
    from metarl.evolve.distill import distill_run

    return distill_run(run_dir, **options)
