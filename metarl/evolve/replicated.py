"""Replicated evolution: ``[es] evolution_seeds = N`` independent evolutions of one
experiment, run as one program.

**What a seed is.** Evolution seed ``i`` is exactly the ordinary run of the experiment with
``run.seed = base + i`` (``base``: the experiment's ``run.seed``) and
``es.evolution_seeds = 1`` (:func:`seed_config`), and its run directory says so in its own
``config.json``. When fitness is normalised by baselines that the run measures
(``fitness.normalize_by_baseline`` without ``baseline_returns``, or
``fitness.tune_baseline``), they are measured (tuned) once, from ``PRNGKey(base + 1)`` as
seed 0 alone would, and shared by every seed: each seed's config then gives them as
``fitness.baseline_returns`` (``tune_baseline`` off, the tuning record kept in its
``baseline_tuning.json``), so that it still describes exactly the run it is.

**Layout** (:mod:`metarl.runs.replicates`)::

    PARENT/replicates.json   the seeds' names, N, the base seed, the experiment config, the
                             shared baselines
    PARENT/seed_0 ... seed_{N-1}/
                             ordinary evolution run directories: ``metarl resume``,
                             ``evaluate``, ``plot`` and ``compare`` take each as it is
    PARENT/evaluations/      verdicts across the seeds (:func:`evaluate_replicated`)

**One program.** The ``N`` :class:`~metarl.evolve.generation.EvolutionState` s are stacked
on a leading axis and one jitted step advances them all (:class:`ReplicatedEvolution`):
the ES ask is ``vmap``-ed over the states, the ``N x C`` candidates are flattened so that
:func:`~metarl.evolve.fitness.evaluate_candidates` trains all ``N * C * S`` agents of an
environment in one call (chunked and sharded as any population), and the tell is
``vmap``-ed back. Every seed records its own generations in its own directory
(:func:`metarl.runs.engine.train_jointly`: its lock, metrics, checkpoints,
meta-parameter files, status). Seed ``i`` of a joint run equals its run alone to float
rounding: every agent's learning curve is the same bit for bit, but its mean return, fused
into a program for ``N * C * S`` agents rather than ``C * S``, may round differently (about
one float32 ulp of the fitness on the tiny test experiment; ``docs/guides/runs.md``). A
joint run resumed equals the uninterrupted joint run bit for bit, whatever generation each
seed resumes from.

**Resume** (:func:`resume_replicated`, ``metarl resume PARENT``): every seed continues from
its own newest usable checkpoint, by the rules of :mod:`metarl.runs.resume`. Seeds that
stopped at different generations (killed between their saves, or one resumed alone further)
are continued jointly all the same: each joint step advances every seed from its own state,
and a seed records the step only while it has generations left, so the ones behind catch up
while the others are carried along unrecorded. Seeds whose configs no longer agree in
anything compiled (a change accepted in one of them alone) are continued one after the other
instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from inner_loops.population import check_population_memory
from metarl import distributed
from metarl.evolve.compare import Comparison, pooled_verdicts, summarise_run, verdicts
from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.evaluate import SEEN_MARK, SEEN_NOTE, evaluate_runs
from metarl.evolve.generation import Evolution, EvolutionState, step_program_key
from metarl.evolve.judging import text_table
from metarl.evolve.kind import RUN_KIND, EvolveProgram, RunResult
from metarl.objectives.sources import with_source_folder
from metarl.programs import shared_program
from metarl.runs import engine
from metarl.runs.config_history import config_changes, format_changes
from metarl.runs.evaluations import saved_evaluation
from metarl.runs.layout import CONFIG_FILE, RunError
from metarl.runs.lock import hold_run_lock
from metarl.runs.replicates import (
    read_replicates,
    replicate_dirs,
    replicate_names,
    write_replicates,
)
from metarl.runs.resume import had_checkpoints, notify
from metarl.runs.start import copy_files, create_run_dir, started_run
from metarl.sharding import put_replicated, replicate
from metarl.stats import OUTCOMES

__all__ = ["ReplicatedEvolution", "ReplicatedProgram", "ReplicatedRun",
           "evaluate_replicated", "format_replicated_evaluation", "resume_replicated",
           "seed_config", "start_replicated"]

# fields that may differ between seeds continued together: they shape nothing compiled
JOINT_FREE_FIELDS = ("run.seed", "es.generations", "run.trackers")


def seed_config(config: ExperimentConfig, index: int, baselines=None) -> ExperimentConfig:
    """Evolution seed ``index``'s own config: ``config`` with ``run.seed`` raised by
    ``index`` and ``es.evolution_seeds = 1``; with ``baselines`` (``[E]`` returns measured
    once for every seed) also ``fitness.baseline_returns = baselines`` and
    ``tune_baseline`` off. With sampled tasks (``fitness.tasks_per_generation`` below the
    number of tasks) and no ``fitness.task_seed``, ``task_seed`` is set to ``config``'s
    ``run.seed``: every seed draws the same task sequence, jointly or alone."""
    fitness = config.fitness
    if config.samples_tasks and fitness.task_seed is None:
        fitness = dataclasses.replace(fitness, task_seed=config.run.seed)
    if baselines is not None:
        fitness = dataclasses.replace(
            fitness, baseline_returns=tuple(float(b) for b in baselines),
            tune_baseline=False)
    return config.replace(
        run=dataclasses.replace(config.run, seed=config.run.seed + index),
        es=dataclasses.replace(config.es, evolution_seeds=1), fitness=fitness)


class ReplicatedEvolution:
    """``N`` evolutions of one experiment as one pure program over their stacked states.

    The static parts (objective, strategy, learners, mesh) are one
    :class:`~metarl.evolve.generation.Evolution`'s (seed 0's config: they do not depend
    on the seed). ``step`` is the jitted :meth:`generation`, compiled once for ``N``.
    """

    def __init__(self, config: ExperimentConfig, count: int, mesh=None):
        self.count = count
        self.evolution = Evolution(seed_config(config, 0), mesh)  # checks the config
        self.mesh = self.evolution.mesh
        cfg = self.evolution.config
        runs = count * cfg.es.population_size * cfg.fitness.seeds_per_candidate
        for learner in self.evolution.learners:  # the joint population, before allocating
            check_population_memory(learner, runs, cfg.run.chunk_size,
                                    1 if self.mesh is None else self.mesh.devices.size)
        self.step = shared_program(step_program_key(cfg, "replicated", count, self.mesh),
                                   lambda: jax.jit(self.generation))
        # one small program each, rather than one per leaf and seed
        self._stack = jax.jit(lambda states: jax.tree.map(lambda *leaves: jnp.stack(leaves),
                                                          *states))
        self._split = jax.jit(lambda states: [
            jax.tree.map(lambda leaf, index=index: leaf[index], states)
            for index in range(count)])

    def stack(self, states: list[EvolutionState]) -> EvolutionState:
        """``N`` states -> one whose every leaf has the leading axis ``[N]``."""
        stacked = self._stack(list(states))
        return put_replicated(stacked, self.mesh) if self.mesh is not None else stacked

    def split(self, states: EvolutionState) -> list[EvolutionState]:
        """The ``N`` seeds' states (each what its run alone holds)."""
        return self._split(states)

    def generation(self, states: EvolutionState) -> tuple[EvolutionState, dict]:
        """One generation of every seed: ``states [N]`` -> ``(states [N], metrics)``, the
        metrics of :meth:`Evolution.generation` with a leading ``[N]`` axis. Pure; jit it.

        Shapes: ``N`` seeds, ``C`` candidates, ``S`` training seeds per candidate, ``E``
        environments. The asks give ``[N, C]`` candidates and ``[N, E, C, S, 2]`` keys,
        trained as ``N * C`` candidates (``[E, N*C, S, 2]`` keys) by
        :meth:`Evolution.score`; its ``[N*C, S, E]`` returns are told back as
        ``[N, C, S, E]``.

        With sampled tasks (``fitness.tasks_per_generation = K < E``) every seed trains
        the ``K`` tasks that seed 0's generation draws (:meth:`Evolution.sample_tasks`, not
        batched, so that only those tasks train): the seeds must be at the same generation
        (:meth:`ReplicatedProgram.combine` checks it), and share the task stream
        (:func:`seed_config`), so these are each seed's own tasks."""
        evolution, count = self.evolution, self.count
        asked = jax.vmap(evolution.ask)(states)
        candidates = asked.run_keys.shape[2]
        population = jax.tree.map(lambda x: x.reshape(count * candidates, *x.shape[2:]),
                                  asked.population)
        run_keys = _joint_keys(asked.run_keys)
        if evolution.truncation_updates is None:
            tasks = evolution.sample_tasks(states.generation[0])
            scores = evolution.score(population, run_keys, states.baselines, tasks)
            states, metrics = jax.vmap(evolution.tell)(states, asked,
                                                       _per_seed(scores, count, candidates))
        else:  # truncated evolution: the N evolutions' carried agents train as one
            carried, scores = evolution.score_truncation(population, run_keys,
                                                         _joint_agents(states.truncation))
            told, metrics = jax.vmap(evolution.tell)(states, asked,
                                                     _per_seed(scores, count, candidates))
            states, metrics = jax.vmap(evolution.end_truncation)(
                states, told, metrics, _agents_per_seed(carried, count))
        if self.mesh is not None:
            states, metrics = replicate((states, metrics), self.mesh)
        return states, metrics


def _joint_keys(run_keys: jax.Array) -> jax.Array:
    """``[N, E, C, S, 2]`` -> ``[E, N * C, S, 2]`` (evolution-major)."""
    run_keys = jnp.swapaxes(run_keys, 0, 1)
    return run_keys.reshape(run_keys.shape[0], -1, *run_keys.shape[3:])


def _per_seed(scores, count: int, candidates: int):
    """Scores of ``N * C`` candidates as ``N`` evolutions' ``[N, C, ...]``."""
    return scores.replace(
        returns=scores.returns.reshape(count, candidates, *scores.returns.shape[1:]),
        valid=scores.valid.reshape(count, candidates, *scores.valid.shape[1:]),
        reached=None if scores.reached is None else scores.reached.reshape(count,
                                                                           candidates),
        hyperparameters={  # [E, N*C, S] -> [N, E, C, S]
            name: jnp.swapaxes(values.reshape(values.shape[0], count, candidates,
                                              values.shape[-1]), 0, 1)
            for name, values in scores.hyperparameters.items()},
        tasks=None if scores.tasks is None else jnp.broadcast_to(  # [K] -> [N, K]
            scores.tasks, (count, *scores.tasks.shape)))


def _joint_agents(stacked):
    """``N`` evolutions' carried agents (leaves ``[N, C * S, ...]``, keys ``[N, E, C, S,
    2]``) as one population of ``N * C * S`` agents (keys ``[E, N * C, S, 2]``)."""
    return stacked.replace(
        agents=jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), stacked.agents),
        run_keys=_joint_keys(stacked.run_keys))


def _agents_per_seed(joint, count: int):
    """The inverse of :func:`_joint_agents`."""
    keys = joint.run_keys.reshape(joint.run_keys.shape[0], count, -1,
                                  *joint.run_keys.shape[2:])
    return joint.replace(
        agents=jax.tree.map(lambda x: x.reshape(count, -1, *x.shape[1:]), joint.agents),
        run_keys=jnp.swapaxes(keys, 0, 1))


class ReplicatedProgram(engine.JointProgram):
    """:class:`ReplicatedEvolution` as the joint program of
    :func:`metarl.runs.engine.train_jointly`: each seed's own
    :class:`~metarl.evolve.kind.EvolveProgram` writes its lines and files."""

    def __init__(self, config: ExperimentConfig, count: int, mesh=None):
        self.replicated = ReplicatedEvolution(config, count, mesh)
        self.agent_steps_per_step = count * self.replicated.evolution.agent_steps_per_generation

    def combine(self, states: list[EvolutionState]) -> EvolutionState:
        """The seeds' states stacked. With sampled tasks they must be at one generation
        (every seed trains the tasks of the same generation number; a
        :class:`~metarl.runs.layout.RunError` otherwise, which :func:`resume_replicated`
        avoids by continuing such seeds one after the other)."""
        if self.replicated.evolution.config.samples_tasks:
            generations = sorted({int(state.generation) for state in states})
            if len(generations) > 1:
                raise RunError(f"seeds at generations {generations} cannot train jointly "
                               "with fitness.tasks_per_generation: each generation's tasks "
                               "are drawn once for every seed")
        return self.replicated.stack(states)

    def step(self, states: EvolutionState) -> tuple[EvolutionState, dict[str, Any]]:
        states, metrics = self.replicated.step(states)
        record = jax.device_get({"metrics": metrics,
                                 "best_fitness_so_far": states.best_fitness})
        return states, record

    def split(self, states: EvolutionState, record: dict[str, Any]
              ) -> list[tuple[EvolutionState, dict[str, Any]]]:
        return [(state, jax.tree.map(lambda values, index=index: values[index], record))
                for index, state in enumerate(self.replicated.split(states))]


@dataclass
class ReplicatedRun:
    """What starting or continuing replicated evolutions leaves.

    Attributes:
        run_dir: the parent directory.
        config: the experiment config (``es.evolution_seeds = N``).
        members: each seed's :class:`~metarl.evolve.kind.RunResult`, in order.
        program: the joint :class:`ReplicatedProgram` that ran (``None`` when the seeds
            were continued one after the other).
    """

    run_dir: Path
    config: ExperimentConfig
    members: list[RunResult]
    program: ReplicatedProgram | None = None


def _shared_baselines(config: ExperimentConfig, mesh=None
                      ) -> tuple[list[float] | None, dict[str, Any] | None]:
    """The normalising baselines every seed shares and their tuning record, measured as
    seed 0 alone measures them (``(None, None)`` when fitness does not need them)."""
    fitness = config.fitness
    if not (fitness.tune_baseline or (fitness.normalize_by_baseline
                                      and not fitness.baseline_returns)):
        return None, None
    baselines, tuning = EvolveProgram(seed_config(config, 0), mesh).normalising_baselines()
    return [float(b) for b in np.asarray(baselines, np.float64)], tuning


def _recorded_or_measured_baselines(parent: Path, data: dict[str, Any],
                                    config: ExperimentConfig, mesh=None):
    """The shared baselines recorded in ``replicates.json``, or measured now and recorded
    there (a parent killed while measuring them has none yet)."""
    if "baselines" in data:
        return data["baselines"], data.get("baseline_tuning")
    baselines, tuning = _shared_baselines(config, mesh)
    if distributed.is_primary():
        write_replicates(parent, RUN_KIND.name, data["config"], data["count"],
                         data["base_seed"], baselines=baselines, baseline_tuning=tuning)
    return baselines, tuning


def _check_fresh_parent(parent: Path, config: ExperimentConfig) -> dict[str, Any] | None:
    """Refuse to start in a directory that holds a run, replicates of another config, or
    replicates that reached a checkpoint; returns the ``replicates.json`` of the same
    experiment left by a start that never got that far (it starts again), else ``None``."""
    if (parent / CONFIG_FILE).exists():
        raise RunError(f"{parent} holds a run (it has a {CONFIG_FILE}); choose another "
                       "directory for replicated evolutions")
    try:
        data = read_replicates(parent)
    except RunError:
        return None
    changes = [change for change in config_changes(RUN_KIND.normalize(data["config"]),
                                                   RUN_KIND.normalize(config.to_dict()))
               if change[0] not in RUN_KIND.budget_fields]
    if changes:
        raise RunError(f"{parent} holds replicated runs of another config (it differs in "
                       f"{format_changes(changes)}); `metarl resume {parent}` continues "
                       "them, or choose another directory")
    if any(had_checkpoints(parent / name) for name in data["replicates"]):
        raise RunError(f"{parent} already holds replicated runs; continue them with "
                       f"`metarl resume {parent}` or choose another directory")
    return data


def _new_seed(parent: Path, name: str, config: ExperimentConfig, stack, command: str,
              mesh=None, tuning=None) -> engine.JointMember:
    """Create seed directory ``parent/name`` for ``config`` (its lock held in ``stack``)
    and its initial state (the objective's ``.py`` module copied in, as a run's)."""
    config, files = config.recorded_in(parent / name)
    program = RUN_KIND.make_program(config, mesh)
    stack.enter_context(started_run(
        parent / name, config.to_dict(), command=command, normalize=RUN_KIND.normalize,
        budget_fields=RUN_KIND.budget_fields, files=files, kind=RUN_KIND.name,
        budget=program.steps))
    state = program.init()  # the config gives the shared baselines: nothing is measured
    program.baseline_tuning = tuning  # kept as baseline_tuning.json after generation 1
    return engine.JointMember(parent / name, program, state)


def start_replicated(config: ExperimentConfig, run_dir: str | Path | None = None,
                     mesh=None) -> ReplicatedRun:
    """Start ``config.es.evolution_seeds`` evolutions of ``config`` in the parent
    ``run_dir`` (a fresh directory by default) and train them together to their budget.

    Raises :class:`~metarl.runs.layout.RunError` when the directory holds a run or other
    replicates (or is in use), and :class:`~metarl.runs.layout.RunStopped` when a seed
    stopped itself (after the others have finished).
    """
    from metarl.runs.trackers import check_trackers

    count = config.es.evolution_seeds
    parent = Path(run_dir) if run_dir is not None else engine.new_run_dir(config)
    parent = Path(distributed.agree(str(parent)))
    config, files = config.recorded_in(parent)  # the parent keeps the objective's module too
    joint = ReplicatedProgram(config, count, mesh)  # checks the config fully first
    check_trackers(config.run.trackers)
    command = f"metarl run --run-dir {parent} --evolution-seeds {count}"
    create_run_dir(parent, "metarl-replicates-mkdir")
    with hold_run_lock(parent, command), contextlib.ExitStack() as stack:
        earlier = _check_fresh_parent(parent, config)
        if distributed.is_primary():
            copy_files(parent, files)
        if earlier is not None and "baselines" in earlier:
            baselines, tuning = earlier["baselines"], earlier.get("baseline_tuning")
        else:
            if distributed.is_primary():
                write_replicates(parent, RUN_KIND.name, config.to_dict(), count,
                                 config.run.seed)
            baselines, tuning = _shared_baselines(config, mesh)
        if distributed.is_primary():
            write_replicates(parent, RUN_KIND.name, config.to_dict(), count, config.run.seed,
                             baselines=baselines, baseline_tuning=tuning)
        members = [_new_seed(parent, name, seed_config(config, index, baselines), stack,
                             command, mesh, tuning)
                   for index, name in enumerate(replicate_names(count))]
        runs = engine.train_jointly(RUN_KIND, joint, members, config.name)
    return ReplicatedRun(parent, config, runs, joint)


def _joinable(configs: list[ExperimentConfig]) -> list[tuple[str, Any, Any]]:
    """How the seeds' configs differ in anything compiled (empty: one joint program fits
    them all)."""
    first = configs[0].to_dict()
    return [change for other in configs[1:]
            for change in config_changes(first, other.to_dict())
            if change[0] not in JOINT_FREE_FIELDS]


def resume_replicated(run_dir: str | Path, generations: int | None = None,
                      accept_config_change: bool = False,
                      trackers: tuple[str, ...] | None = None, mesh=None) -> ReplicatedRun:
    """Continue every seed of the parent ``run_dir`` from its own newest usable checkpoint
    (:func:`metarl.runs.engine.prepare_resume`: the rules, options and records of
    ``metarl resume`` for each), jointly (see the module docstring for seeds at different
    generations). A seed whose directory was never created starts from the beginning."""
    parent = Path(run_dir)
    data = read_replicates(parent)
    config = config_from_dict(with_source_folder(data["config"], parent))
    if generations is not None:
        config = config.replace(es=dataclasses.replace(config.es, generations=generations))
    dirs = replicate_dirs(parent)
    for seed_dir in dirs:
        if (seed_dir / CONFIG_FILE).is_file():
            engine.check_resumable(RUN_KIND, seed_dir, generations, trackers)
    command = f"metarl resume {parent}"
    with hold_run_lock(parent, command), contextlib.ExitStack() as stack:
        members = []
        for index, seed_dir in enumerate(dirs):
            if (seed_dir / CONFIG_FILE).is_file():
                stack.enter_context(hold_run_lock(seed_dir, command))
                members.append(engine.prepare_resume(RUN_KIND, seed_dir, generations,
                                                     accept_config_change, trackers, mesh))
                continue
            notify(f"{seed_dir} was never created (the start was interrupted): starting it "
                   "from the beginning")
            baselines, tuning = _recorded_or_measured_baselines(parent, data, config, mesh)
            seeded = seed_config(config, index, baselines)
            if trackers is not None:
                seeded = seeded.replace(run=dataclasses.replace(seeded.run,
                                                                trackers=tuple(trackers)))
            members.append(_new_seed(parent, seed_dir.name, seeded, stack, command, mesh,
                                     tuning))
        differing = _joinable([member.program.config for member in members])
        reached = sorted({int(member.state.generation) for member in members})
        joint = None
        if differing:
            notify(f"the seeds of {parent} no longer share one config "
                   f"({format_changes(differing[:3])}): continuing them one after the other")
        elif members[0].program.config.samples_tasks and len(reached) > 1:
            notify(f"the seeds of {parent} are at generations {reached} and sample "
                   "their tasks per generation (fitness.tasks_per_generation), which one "
                   "joint step draws for all: continuing them one after the other")
        else:
            joint = ReplicatedProgram(members[0].program.config, len(members), mesh)
            runs = engine.train_jointly(RUN_KIND, joint, members, config.name)
        if joint is None:
            runs = [engine.train_member(RUN_KIND, member) for member in members]
    return ReplicatedRun(parent, config, runs, joint)


def evaluate_replicated(run_dir: str | Path, rerun: bool = False, **options
                        ) -> dict[str, Any]:
    """Evaluate every seed of the parent ``run_dir`` on the same held-out seeds, then judge
    the evolved objective against each baseline across the seeds.

    Each seed is evaluated by :func:`metarl.evolve.evaluate.evaluate_runs` with
    ``options`` (``seeds``, ``baselines``, ``tune``, ``across``, ...) and saved in its own
    directory as a run alone would be, all on one held-out root (without ``eval_seed``, one
    that no earlier evaluation of the parent or of any seed used); the baselines (and their
    tuning) do not depend on the evolution seed, so they are trained once and their rows
    reused for every seed.
    The verdict across seeds (:func:`metarl.evolve.compare.pooled_verdicts`: per
    environment and baseline, how many seeds were judged better / no difference found /
    worse, and the IQM and P(improvement) with 95% intervals over evolution seeds x
    held-out seeds, the held-out seed the resampling unit) is saved in the parent's
    ``evaluations/<n>.json`` (reused when the same evaluation was made before, unless
    ``rerun``). Returns that record, with ``seed_reports`` (each seed's report) added.
    """
    parent = Path(run_dir)
    dirs = replicate_dirs(parent)
    missing = [str(d) for d in dirs if not (d / CONFIG_FILE).is_file()]
    if missing:
        raise RunError(f"{parent}: seed directories not created yet: {', '.join(missing)}; "
                       f"`metarl resume {parent}` runs them")
    reports = evaluate_runs(dirs, rerun=rerun, avoid_roots_of=[parent], **options)
    spec = {"replicates": [d.name for d in dirs], "seed_specs": [r["spec"] for r in reports]}

    def compute() -> dict[str, Any]:
        comparison = Comparison(tuple(summarise_run(d, d.name, records=[r])
                                      for d, r in zip(dirs, reports, strict=True)), {})
        found = verdicts(comparison)
        pooled = pooled_verdicts(comparison, found)
        return {
            "replicates": [d.name for d in dirs],
            "seed_records": [r["path"] for r in reports],
            "objective": reports[0].get("objective"),
            "metric": reports[0].get("metric"),
            "seeds": reports[0].get("seeds"),
            "eval_seed": reports[0].get("eval_seed"),
            "eval_seed_reused": any(bool(r.get("eval_seed_reused")) for r in reports),
            **({"held_out_tasks": reports[0]["held_out_tasks"]}
               if reports[0].get("held_out_tasks") else {}),
            "verdicts": [dataclasses.asdict(v) for v in found],
            "pooled": [{"env_id": p.env_id, "evolved": p.evolved, "baseline": p.baseline,
                        "counts": p.counts, "evolution_seeds": p.runs,
                        "evolved_iqm": p.evolved_iqm.to_dict(),
                        "baseline_iqm": p.baseline_iqm.to_dict(),
                        "probability_of_improvement": p.probability.to_dict(),
                        "paired": p.paired, "verdict": p.outcome} for p in pooled],
        }

    report = saved_evaluation(parent, spec, compute, rerun)
    return {**report, "seed_reports": reports}


def format_replicated_evaluation(report: dict[str, Any]) -> str:
    """A verdict across seeds as tables: each seed's verdict against each baseline, then
    per environment and baseline the seeds' counts and the pooled IQM and P(improvement)
    with their 95% intervals."""
    def interval(estimate: dict[str, float]) -> str:
        return f"{estimate['value']:.2f} [{estimate['low']:.2f}, {estimate['high']:.2f}]"

    held_out = set(report.get("held_out_tasks") or ())

    def task(label: str) -> str:
        return f"{label} (held out)" if label in held_out else label

    rows = [("seed", "environment", "objective", "vs baseline", "P(improvement)",
             "verdict")]
    seen = SEEN_MARK if report.get("eval_seed_reused") else ""
    rows += [(v["run"], task(v["env_id"]), v["evolved"], v["baseline"],
              f"{v['probability']:.2f} [{v['low']:.2f}, {v['high']:.2f}]",
              v["outcome"] + seen) for v in report["verdicts"]]
    blocks = [f"{len(report['replicates'])} evolution seeds, each evaluated on the same "
              f"{report.get('seeds')} held-out seeds (eval seed {report.get('eval_seed')}); "
              "every seed's own table is in its evaluations/\n" + text_table(rows)]
    rows = [("environment", "objective", "vs baseline", *OUTCOMES, "IQM objective",
             "IQM baseline", "P(improvement)", "verdict (all seeds)")]
    rows += [(task(p["env_id"]), p["evolved"], p["baseline"],
              *(str(p["counts"][o]) for o in OUTCOMES), interval(p["evolved_iqm"]),
              interval(p["baseline_iqm"]), interval(p["probability_of_improvement"]),
              p["verdict"] + seen) for p in report["pooled"]]
    blocks.append("across evolution seeds: seeds judged better / no difference found / "
                  "worse, and IQM and P(improvement) over evolution seeds x held-out seeds "
                  "(95% intervals, the held-out seed resampled)\n" + text_table(rows))
    if seen:
        blocks.append(f"{SEEN_MARK.strip()} {SEEN_NOTE} (root {report.get('eval_seed')})")
    return "\n\n".join(blocks)

