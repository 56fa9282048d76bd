"""``metarl run | resume | evaluate | plot | distill | compare | sweep | runs | pack | unpack
| devices``: the command line of the toolkit, and the only module that parses arguments and
chooses devices. ``run`` starts an experiment file of any kind (:mod:`metarl.kinds`), or a
shipped experiment by name (:mod:`metarl.shipped`; ``run --list`` names them);
``resume``, ``evaluate``, ``plot`` and ``distill`` read the kind of the run directory.
``pack RUN_DIR [-o FILE]`` writes a run directory into one ``.tar.gz`` and ``unpack FILE
[--into DIR]`` restores it, to continue it on another machine (:mod:`metarl.runs.archive`).
``export RUN_DIR [-o FILE]`` writes an evolution run's discovery as one portable ``.npz``
(:mod:`metarl.discoveries`), ``zoo`` lists the discoveries shipped with metarl, and
``evaluate`` also takes such a file or ``zoo:<name>`` in place of a run directory.

``run`` and ``resume`` take ``--time-limit DURATION`` (``90s``, ``9m``, ``1h30m``, or
seconds), counted from the command's start: the run stops cleanly before it runs out. They
also stop cleanly on SIGTERM or SIGINT, within seconds even in the middle of a long
generation, whose work is then lost; a second signal ends the process at once
(:mod:`metarl.runs.stopping`).

Exit codes: 0 success; 2 a config or run-directory error (one line on stderr naming the
problem, no traceback: a bad field, a directory in use or holding another run, no usable
checkpoint, a refused config change, a full disk); 3 a run that stopped itself (e.g.
``run.max_invalid_generations`` generations in a row with every candidate invalid); 4 a
run stopped by its time limit or a signal, its last completed generation or segment
checkpointed: ``metarl resume RUN_DIR`` continues it exactly (128 + the signal's number
after a second signal).

For several processes (one per node), start ``metarl --distributed run ...`` in each:
it initialises ``jax.distributed`` (:mod:`metarl.distributed`) and then runs the command;
only process 0 writes files and prints.

On the CPU the command line exposes one JAX device per core (``--cpu-devices``), and runs
shard their population over every device (``run.shard``, on by default), so all cores work.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Only modules that leave JAX unstarted are imported here: the CPU device count can only be
# set before JAX's first computation, and importing gymnax (through metarl.config) runs one.
from metarl import distributed, sharding


def _run(args) -> int:
    from metarl.kinds import EVOLVE, config_kind, load_experiment, start

    if args.list or args.config is None:
        return _list_shipped(args)
    overrides = list(args.set)
    if args.track:
        overrides.append(f"run.trackers={list(args.track)!r}")
    config = load_experiment(args.config, overrides)
    if args.evolution_seeds is not None:
        if config_kind(config) != EVOLVE:
            from metarl.config import ConfigError

            raise ConfigError(f"--evolution-seeds: only evolution experiments (kind = "
                              f"\"evolve\") run several evolution seeds; {args.config} is a "
                              f"{config_kind(config)!r} experiment")
        overrides.append(f"es.evolution_seeds={args.evolution_seeds!r}")
        config = load_experiment(args.config, overrides)  # validated: es.evolution_seeds
    return _report(start(config, args.run_dir, time_limit=_time_left(args)), args.no_plots)


def _list_shipped(args) -> int:
    """``metarl run --list``: every shipped experiment (:mod:`metarl.shipped`), one line
    each: its name, its kind and the first line of its description."""
    from metarl.config import ConfigError, read_config_data
    from metarl.kinds import kind_of
    from metarl.shipped import LIST_HINT, shipped_experiments

    if not args.list:
        raise ConfigError(f"name an experiment file or a shipped experiment; {LIST_HINT}")
    if args.config is not None:
        raise ConfigError(f"--list: lists the shipped experiments and runs none; drop "
                          f"{args.config} or --list")
    rows = []
    for name, path in shipped_experiments().items():
        data = read_config_data(path)
        description = str(data.get("description") or name).strip().splitlines()[0]
        rows.append((name, kind_of(data), description))
    if not rows:
        raise ConfigError("--list: no shipped experiments are installed (metarl/_experiments "
                          "is missing)")
    name_width = max(len(name) for name, _, _ in rows)
    kind_width = max(len(kind) for _, kind, _ in rows)
    for name, kind, description in rows:
        print(f"{name:<{name_width}}  {kind:<{kind_width}}  {description}")
    return 0


def _resume(args) -> int:
    from metarl.kinds import resume

    trackers = None if args.track is None else tuple(args.track)
    return _report(resume(args.run_dir, args.generations, args.accept_config_change, trackers,
                          time_limit=_time_left(args)), args.no_plots)


def _time_limit(text: str) -> float:
    """``--time-limit``'s value in seconds (an argparse error naming the forms otherwise)."""
    from metarl.runs.stopping import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _time_left(args) -> float | None:
    """What is left of ``--time-limit`` after the command's start (imports, devices,
    config): the budget counts from when the command started."""
    if args.time_limit is None:
        return None
    return max(args.time_limit - (time.monotonic() - args.started), 1e-3)


def _pack(args) -> int:
    from metarl.runs.archive import pack_run

    print(f"packed {args.run_dir} into {pack_run(args.run_dir, args.out)}")
    return 0


def _unpack(args) -> int:
    from metarl.runs.archive import unpack_run

    run_dir = unpack_run(args.archive, args.into)
    print(f"unpacked {run_dir}; `metarl resume {run_dir}` continues it")
    return 0


def _report(result, no_plots: bool) -> int:
    """Summarise a finished run (and plot it) on the process that owns the files."""
    if not distributed.is_primary():
        return 0
    from metarl.kinds import config_kind, kind_spec

    members = getattr(result, "members", None)  # replicated evolution: a parent of seeds
    if members is not None:
        print(f"parent directory: {result.run_dir} ({len(members)} evolution seeds)")
    for run in members if members is not None else [result]:
        print(kind_spec(config_kind(run.config)).describe_run(run))
        if run.plots:  # drawn already, for the trackers
            print(f"plots: {', '.join(str(p) for p in run.plots)}")
        elif not no_plots and run.history:
            _plot_quietly(run.run_dir)
    return 0


DEFAULT_TUNE_SEED = 20_011  # metarl.evolve.tuning.DEFAULT_TUNE_SEED (not imported: JAX)
TUNE_STATISTICS = ("iqm", "mean")  # metarl.evolve.tuning.TUNE_STATISTICS, likewise
DEFAULT_TUNE_BY = "iqm"  # metarl.evolve.tuning.DEFAULT_TUNE_BY, likewise
EVOLVE_ONLY_OPTIONS = (  # (flag, keyword of evaluate_run, default on the command line)
    ("--env", "env_ids", []), ("--seeds", "seeds", 16), ("--baselines", "baselines", None),
    ("--which", "which", "mean"), ("--total-timesteps", "total_timesteps", None),
    ("--tune", "tune", False), ("--tune-seeds", "tune_seeds", 8),
    ("--tune-seed", "tune_seed", DEFAULT_TUNE_SEED), ("--tune-grid", "tune_grid", []),
    ("--tune-by", "tune_by", DEFAULT_TUNE_BY), ("--tune-rounds", "tune_rounds", 3),
    ("--across", "across", None), ("--distilled", "distilled", []), ("--start", "start", False),
    ("--suite", "suite", None), ("--jobs", "jobs", 1))


def _evaluate(args) -> int:
    from metarl.kinds import EVOLVE, evaluate, evaluate_together, format_evaluation, run_kind

    args.run_dirs = _discovery_run_dirs(args)
    options = {"rerun": args.rerun}
    if args.eval_seed is not None:  # else each kind's own rule (evolution: a fresh root)
        options["eval_seed"] = args.eval_seed
    given = {flag: (name, getattr(args, name)) for flag, name, default in EVOLVE_ONLY_OPTIONS
             if getattr(args, name) != default}
    kinds = {run_kind(run_dir) for run_dir in args.run_dirs}
    if given and kinds != {EVOLVE}:
        from metarl.config import ConfigError

        kind = sorted(kinds - {EVOLVE})[0]
        raise ConfigError(f"{', '.join(given)}: only for evolution runs; a {kind} run is "
                          "evaluated on its final population (--eval-seed, --rerun)")
    options.update(given.values())
    if options.get("baselines"):
        options["baselines"] = options["baselines"].split(",")
    if options.get("tune_grid"):
        from metarl.sweep import parse_grid

        axes = [parse_grid(text, "--tune-grid") for text in options["tune_grid"]]
        options["tune_grid"] = {axis.name: list(axis.values) for axis in axes}
        if len(options["tune_grid"]) != len(axes):
            from metarl.config import ConfigError

            raise ConfigError("--tune-grid: a knob is given twice")
    if options.get("across"):
        from metarl.sweep import parse_grid

        axis = parse_grid(options["across"], "--across")
        options["across"] = {axis.name: list(axis.values)}
    if EVOLVE in kinds:  # baselines trained once, kept for every later evaluation
        from metarl.evolve.store import TrainingStore

        options["store"] = (TrainingStore() if args.no_cache else
                            TrainingStore(args.cache_dir) if args.cache_dir else
                            TrainingStore.default())
        if not args.no_cache:
            _keep_compiled_programs(options["store"])
    elif args.no_cache or args.cache_dir:
        from metarl.config import ConfigError

        raise ConfigError("--cache-dir, --no-cache: only for evolution runs")
    if len(args.run_dirs) == 1:
        reports = [evaluate(args.run_dirs[0], **options)]
    else:
        reports = evaluate_together(args.run_dirs, **options)
    for run_dir, report in zip(args.run_dirs, reports, strict=True):
        if len(args.run_dirs) > 1:
            print(f"== {run_dir}")
        print(format_evaluation(run_dir, report))
        if report.get("reused"):
            print(f"reusing {report['path']}: the same evaluation was made before; pass "
                  "--rerun to compute it again and replace it")
        elif report.get("replaced"):
            print(f"replaced {report['path']} with this new evaluation (--rerun)")
        else:
            print(f"saved {report['path']}")
        if report.get("suite_figure"):
            print(f"suite figure: {report['suite_figure']}")
    if "store" in options:
        print(options["store"].summary())
    return 0


def _keep_compiled_programs(store) -> None:
    """Keep what evaluations compile in JAX's persistent compilation cache, beside the
    store (``<store>/../jax-compilation``), unless a cache was chosen already
    (``JAX_COMPILATION_CACHE_DIR`` or jax's config): on a CPU an evaluation spends most of
    its time compiling, and the next evaluation of the same objective, in a new process,
    then compiles little."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir",
                      str(store.directory.parent / "jax-compilation"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def _discovery_run_dirs(args) -> list[str]:
    """``evaluate``'s sources with every discovery (a file ``metarl export`` wrote, or
    ``zoo:<name>``) replaced by the run directory it is materialised in
    (:mod:`metarl.discoveries.materialise`); ``--which`` follows the discoveries' candidate
    unless given."""
    from metarl.config import ConfigError
    from metarl.discoveries.fileformat import DiscoveryFileError
    from metarl.discoveries.materialise import is_discovery, materialise

    sources = [source for source in args.run_dirs if is_discovery(source)]
    if args.into is not None and len(sources) != 1:
        raise ConfigError("--run-dir: names the folder of one discovery file or zoo entry; "
                          f"got {len(sources)} among {', '.join(args.run_dirs)}")
    run_dirs, candidates = [], set()
    for source in args.run_dirs:
        if source not in sources:
            run_dirs.append(source)
            continue
        try:
            run_dir, card = materialise(source, args.into)
        except DiscoveryFileError as error:
            raise ConfigError(str(error)) from None
        except ValueError as error:  # an unknown zoo name: the message lists the zoo
            raise ConfigError(str(error)) from None
        candidates.add(card["candidate"])
        print(f"discovery {source}: evaluated as the run directory {run_dir}")
        run_dirs.append(str(run_dir))
    if candidates:
        if args.which != "mean" and candidates != {args.which}:
            raise ConfigError(f"--which {args.which}: the discovery holds the "
                              f"{', '.join(sorted(candidates))} candidate only")
        if len(candidates) > 1:
            raise ConfigError("evaluating discoveries of different candidates (mean and best) "
                              "together; evaluate them one at a time")
        args.which = candidates.pop()
    return run_dirs


def _export(args) -> int:
    from metarl.discoveries.export import export_run, summary

    exported = export_run(args.run_dir, args.which, args.out, args.force)
    if not exported.card["verdicts"]["evaluations"]:
        print(f"metarl export: {args.run_dir} was never evaluated: the file says so "
              "(metarl evaluate RUN_DIR judges it)", file=sys.stderr)
    print(f"wrote {exported.path}")
    print(summary(exported))
    return 0


def _zoo(args) -> int:
    from metarl.discoveries.zoo import listing

    for line in listing():
        print(line)
    return 0


def _suites(args) -> int:
    from metarl.suites import available_suites, get_suite

    if args.calibrate:
        return _calibrate(args)
    for name in available_suites():
        suite = get_suite(name)
        print(f"{suite.name} (v{suite.version}, {suite.device}): {suite.description}")
        for side, tasks in (("meta-train", suite.train), ("meta-test", suite.test)):
            for task in tasks:
                print(f"  {side:<10} {task.label:<24} {task.inner['total_timesteps']:>11,} "
                      f"steps  {task.source}")
    return 0


def _calibrate(args) -> int:
    import json

    from metarl.evolve.calibrate import calibrate_suite
    from metarl.suites import get_suite

    budgets = [int(float(text)) for text in args.budgets.split(",")] if args.budgets else None
    load = os.getloadavg()
    record = calibrate_suite(get_suite(args.calibrate), budgets, progress=print)
    record["conditions"] = {
        "command": "metarl suites --calibrate " + args.calibrate
                   + (f" --budgets {args.budgets}" if args.budgets else "")
                   + (f" --out {args.out}" if args.out else ""),
        "cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d")}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"saved {args.out}")
    return 0


def _runs(args) -> int:
    from metarl.runs.listing import format_runs, list_runs

    root = Path(args.dir)
    if not root.is_dir():
        from metarl.runs.layout import RunError

        raise RunError(f"directory not found: {root}")
    print(format_runs(list_runs(root), root))
    return 0


def _record_numbers(text: str) -> list[int]:
    """``--evaluation 3`` or ``--evaluation 3,2,2``: record numbers of 1 or more."""
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(
            f"expected N or N,N,... (record numbers of evaluations/<N>.json), got {text!r}")
    return numbers


def _compare(args) -> int:
    from datetime import datetime

    from metarl.evolve.compare import (
        between_runs,
        compare_runs,
        format_comparison,
        pooled_verdicts,
        save_comparison,
    )

    comparison = compare_runs(args.run_dirs, args.evaluation)
    # the bootstrapped verdicts, computed once for the table, the JSON and the figures
    pooled, between = pooled_verdicts(comparison), between_runs(comparison)
    print(format_comparison(comparison, pooled, between))
    if not args.no_plots:
        out = args.out or Path(args.run_dirs[0]).parent / (
            f"compare-{datetime.now():%Y%m%d-%H%M%S}")
        written = save_comparison(comparison, out, pooled, between)
        print(f"saved {', '.join(str(path) for path in written)}")
    return 0


def _sweep(args) -> int:
    from datetime import datetime

    from metarl.kinds import EVOLVE, config_kind, load_experiment
    from metarl.sweep import format_sweep, parse_grid, run_sweep, save_sweep

    config = load_experiment(args.config, args.set)
    if config_kind(config) != EVOLVE:
        from metarl.config import ConfigError

        raise ConfigError(f"kind: sweep trains an evolution experiment's first [inner] table "
                          f"with its objective; {args.config} is a {config_kind(config)!r} "
                          "experiment")
    grid = [parse_grid(text) for text in args.grid]
    report = run_sweep(config, grid, args.seeds, args.seed)
    if not distributed.is_primary():
        return 0
    out = args.out or Path(config.run.output_dir) / (
        f"{config.name}-sweep-{datetime.now():%Y%m%d-%H%M%S}")
    written = save_sweep(report, out, plots=not args.no_plots)
    print(format_sweep(report))
    print(f"{report['agents']} agents ({report['agent_steps']:,} agent-steps) trained as one "
          f"program in {report['train_seconds']:.1f} s after {report['compile_seconds']:.1f} s "
          "of compilation")
    print(f"saved {', '.join(str(path) for path in written)}")
    return 0


def _devices(args) -> int:
    import jax

    devices = jax.devices()
    print(f"{len(devices)} {devices[0].platform} device(s) in {jax.process_count()} "
          f"process(es); this process has {jax.local_device_count()}:")
    for device in jax.local_devices():
        print(f"  {device}")
    return 0


def _plot(args) -> int:
    from metarl.kinds import plot

    for path in plot(args.run_dir):
        print(path)
    return 0


def _distill(args) -> int:
    from metarl.evolve.distill import format_distillation, write_experiment
    from metarl.kinds import distill

    if args.write_experiment is not None and args.no_fit:
        path = write_experiment(args.run_dir, args.write_experiment, args.candidate)
        print(f"saved {path}")
        return 0
    entry = distill(args.run_dir, candidate=args.candidate,
                    max_complexity=args.max_complexity, samples=args.samples,
                    seeds=args.seeds, total_timesteps=args.total_timesteps)
    print(format_distillation(entry))
    print(f"saved {', '.join([entry['path'], *entry['plots']])}")
    if args.write_experiment is not None:
        print(f"saved {write_experiment(args.run_dir, args.write_experiment, args.candidate)}")
    return 0


def _plot_quietly(run_dir) -> None:
    from metarl.kinds import plot

    paths = plot(run_dir)
    print(f"plots: {', '.join(str(p) for p in paths)}")


TRACKER_CHOICES = ("tensorboard", "wandb")


def _add_set(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config field, e.g. --set {example} (values parsed "
                             "as TOML; repeatable)")


def _add_time_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--time-limit", type=_time_limit, default=None, metavar="DURATION",
        help="stop cleanly before this much time has passed since the command started "
             "(e.g. 90s, 9m, 1h30m, 2h, or seconds): after the last generation or segment "
             "that fits, checkpointed, with exit code 4; `metarl resume` continues it")


def _add_run_commands(commands) -> None:
    """``run`` and ``resume``: the commands that train."""
    run = commands.add_parser(
        "run", help="start a run of any kind from an experiment file (kind = \"evolve\", "
                    "the default, \"pbt\", \"cem_rl\" or \"dvd\")")
    run.add_argument("config", nargs="?",
                     help="experiment file, e.g. experiments/value_distance_cartpole.toml, "
                          "or the name of a shipped experiment, e.g. value_distance_cartpole "
                          "(a file at that path wins)")
    run.add_argument("--list", action="store_true",
                     help="name the shipped experiments, one a line: name, kind, "
                          "description; runs nothing")
    _add_set(run, "es.generations=5")
    run.add_argument("--run-dir", default=None,
                     help="where to write the run (default: <run.output_dir>/<name>-<time>)")
    run.add_argument("--no-plots", action="store_true", help="skip the plots at the end")
    _add_time_limit(run)
    run.add_argument("--evolution-seeds", type=int, default=None, metavar="N",
                     help="run N independent evolutions of an evolution experiment as one "
                          "program: --run-dir becomes a parent of N ordinary run directories "
                          "seed_0 ... seed_{N-1} (run.seed + i); the same as "
                          "es.evolution_seeds in the experiment file")
    run.add_argument("--track", action="append", default=[], metavar="TRACKER",
                     choices=TRACKER_CHOICES,
                     help="send metrics and figures to tensorboard or wandb (offline unless "
                          "WANDB_MODE says otherwise); repeatable; the same as run.trackers "
                          "in the experiment file")
    run.set_defaults(handler=_run)

    resume = commands.add_parser("resume", help="continue a run from its latest checkpoint "
                                                "(a parent of evolution seeds: every seed)")
    resume.add_argument("run_dir")
    resume.add_argument("--generations", type=int, default=None,
                        help="total generations to reach (default: the config's; evolution "
                             "runs only)")
    resume.add_argument("--accept-config-change", action="store_true",
                        help="continue although config.json differs from the config saved "
                             "in the checkpoint in more than es.generations or run.trackers; "
                             "the change is recorded in metrics.jsonl and config_history.jsonl")
    resume.add_argument("--no-plots", action="store_true")
    _add_time_limit(resume)
    resume.add_argument("--track", action="append", default=None, metavar="TRACKER",
                        choices=TRACKER_CHOICES,
                        help="send metrics and figures to these trackers from here on "
                             "(repeatable; default: the run's run.trackers)")
    resume.set_defaults(handler=_resume)


def _add_reading_commands(commands) -> None:
    """``evaluate``, ``plot``, ``distill``, ``compare``, ``runs``, ``pack`` and ``unpack``: the
    commands over saved runs."""
    evaluate = commands.add_parser(
        "evaluate", help="train fresh agents with the evolved objective and baselines (a "
                         "parent of evolution seeds: every seed, and one verdict across them; "
                         "a pbt, cem_rl or dvd run: evaluate its final population)"
    )
    evaluate.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                          help="a run directory; several evolution runs (seeds started "
                               "apart, variants of one experiment) are evaluated with the "
                               "same options and their baselines trained once; a discovery "
                               "file (metarl export) or zoo:NAME is evaluated as a run "
                               "directory made from it (see --run-dir)")
    evaluate.add_argument("--env", dest="env_ids", action="append", default=[],
                          help="environment id or task label (repeatable; default: the "
                               "run's [[inner]] tasks, then its [[held_out]] ones)")
    evaluate.add_argument("--seeds", type=int, default=16, help="held-out seeds (default 16)")
    evaluate.add_argument("--baselines", default=None,
                          help="comma-separated fixed objectives (default: those the "
                               "objective declares that fit the run's algorithm)")
    evaluate.add_argument("--distilled", type=int, action="append", default=[],
                          metavar="K",
                          help="also train formula K of the run's distill.json (metarl "
                               "distill) for the evaluated candidate as a fixed objective, "
                               "judged against the network it came from (repeatable)")
    evaluate.add_argument("--which", default="mean", choices=("mean", "best"),
                          help="evaluate the search mean (default) or the best candidate")
    evaluate.add_argument("--start", action="store_true",
                          help="also train the meta-parameters the search started from (row "
                               "'start', tuned like the evolved objective with --tune): the "
                               "evolved objective is judged against it, which says whether "
                               "the search did anything its starting point did not")
    evaluate.add_argument("--run-dir", dest="into", default=None, metavar="DIR",
                          help="with a discovery file or zoo entry: the folder to write it "
                               "into as a run directory and evaluate it there (default: "
                               "$XDG_CACHE_HOME/metarl/discoveries/<id>, ~/.cache without it)")
    evaluate.add_argument("--eval-seed", type=int, default=None,
                          help="root of the held-out key stream. Evolution runs: by default "
                               "an identical earlier evaluation's, else a root no earlier "
                               "evaluation of the run used (held-out seeds are looked at "
                               "once); give one to reproduce a record: a new evaluation on "
                               "a root used before is marked as judged on seen seeds. Other "
                               "kinds: default 10007")
    evaluate.add_argument("--total-timesteps", type=int, default=None,
                          help="override the training budget per agent")
    evaluate.add_argument("--rerun", action="store_true",
                          help="compute an evaluation that was made before again, replacing "
                               "its record (by default it is reused)")
    evaluate.add_argument("--tune", action="store_true",
                          help="first tune every objective over its declared grid on tuning "
                               "seeds (the evolved objective over the shared knobs, with the "
                               "same budget), widening a grid whose choice is at its edge "
                               "(--tune-rounds), then also evaluate each at its chosen "
                               "setting: rows '<objective> (tuned)'")
    evaluate.add_argument("--tune-seeds", type=int, default=8,
                          help="tuning seeds per setting (default 8, at least 2)")
    evaluate.add_argument("--tune-seed", type=int, default=DEFAULT_TUNE_SEED,
                          help=f"root of the tuning key stream (default {DEFAULT_TUNE_SEED}; "
                               "not --eval-seed, run.seed or run.seed + 1)")
    evaluate.add_argument("--tune-grid", action="append", default=[], metavar="KNOB=V1,V2,...",
                          help="replace a knob's grid for every objective that declares it, "
                               "e.g. --tune-grid vf_coef=0.01,0.1,1 or learning_rate=0.5,1,2 "
                               "(multiples of the run's learning rate); repeatable")
    evaluate.add_argument("--tune-rounds", type=int, default=3,
                          help="with --tune: the cap of widening rounds (default 3; 0: the "
                               "declared grids only). A knob chosen at an edge of its grid is "
                               "followed one step further (the grid's own ratio, the evolved "
                               "objective's by the baselines' largest; within the "
                               "knob's valid range) on the tuning seeds and the objective "
                               "tuned again; then every objective gets as many settings in "
                               "all as the one with most. A knob still at an edge at the cap "
                               "is named")
    evaluate.add_argument("--tune-by", default=DEFAULT_TUNE_BY, choices=TUNE_STATISTICS,
                          help="the statistic over the tuning seeds that chooses each "
                               "setting: iqm (default), the interquartile mean, the mean of "
                               "the middle half of the seeds, which the held-out verdicts "
                               "use and which a few failed seeds of heavy-tailed returns "
                               "(Acrobot) do not sway; or mean, the plain mean (how "
                               "evaluations were tuned before this option; their records "
                               "have no tune_by)")
    evaluate.add_argument("--across", default=None, metavar="KNOB=V1,V2,...",
                          help="also train every objective at each value of one traced "
                               "hyperparameter on the held-out seeds, e.g. --across "
                               "learning_rate=1e-4,3e-4,1e-3: per-value IQM in the record "
                               "and plots/across_<n>.png, one line per objective")
    evaluate.add_argument("--suite", default=None, metavar="NAME",
                          help="judge on every environment of a suite (metarl suites lists "
                               "them) at its settings: per-environment verdicts, then one "
                               "pooled verdict over the environments the run never trained "
                               "on, and plots/suite_<n>.png")
    evaluate.add_argument("--jobs", type=int, default=1, metavar="N",
                          help="environments trained at once, each in a thread (default "
                               "1): on a CPU one compiles while another trains; the "
                               "results are those of one at a time")
    evaluate.add_argument("--cache-dir", default=None, metavar="DIR",
                          help="where trainings that do not depend on the evolved objective "
                               "(baselines, their tuning, the untrained policy) are kept and "
                               "reused exactly by later evaluations (default: "
                               "$METARL_CACHE_DIR, else ~/.cache/metarl/trainings)")
    evaluate.add_argument("--no-cache", action="store_true",
                          help="train everything afresh; keep nothing on disk")
    evaluate.set_defaults(handler=_evaluate)

    plot = commands.add_parser("plot", help="draw the learned objective and the run as PNGs")
    plot.add_argument("run_dir")
    plot.set_defaults(handler=_plot)

    distill = commands.add_parser(
        "distill", help="fit closed-form formulas to an evolution run's evolved function "
                        "on the inputs training visits; saves distill.json, distill.tex "
                        "and plots")
    distill.add_argument("run_dir")
    distill.add_argument("--candidate", default="mean", choices=("mean", "best"))
    distill.add_argument("--max-complexity", type=int, default=6, metavar="N",
                         help="most terms in a formula (default 6)")
    distill.add_argument("--samples", type=int, default=20_000, metavar="N",
                         help="recorded inputs to fit on, 20%% of them held out (default "
                              "20000)")
    distill.add_argument("--seeds", type=int, default=2,
                         help="agents trained per [inner] table to record inputs (default 2)")
    distill.add_argument("--total-timesteps", type=int, default=None,
                         help="override those agents' budget")
    distill.add_argument("--write-experiment", type=int, default=None, metavar="K",
                         help="also write distilled_<candidate>_<K>.json, an experiment "
                              "with formula K (0: the simplest) as the symbolic objective")
    distill.add_argument("--no-fit", action="store_true",
                         help="with --write-experiment: use the saved distill.json")
    distill.set_defaults(handler=_distill)

    compare = commands.add_parser(
        "compare", help="tabulate several runs, the settings in which they differ, and draw "
                        "their fitness and learned functions together")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                         help="run directories; a parent of evolution seeds stands for its "
                              "seeds")
    compare.add_argument("--out", default=None,
                         help="folder for the figures and table (default: compare-<time> "
                              "beside the first run)")
    compare.add_argument("--no-plots", action="store_true", help="print the table only")
    compare.add_argument("--evaluation", type=_record_numbers, default=None,
                         metavar="N[,N...]",
                         help="read each run's held-out scores from evaluations/<N>.json "
                              "alone: one N for every run, or one per RUN_DIR in order "
                              "(default: the latest evaluation of each environment and "
                              "objective), so that a comparison made earlier can be made "
                              "again after later evaluations")
    compare.set_defaults(handler=_compare)

    runs = commands.add_parser(
        "runs", help="list run directories: state (running, finished, stopped, "
                     "interrupted), generation reached, best fitness, start time")
    runs.add_argument("dir", nargs="?", default="runs",
                      help="a run directory or a folder of them (default: runs)")
    runs.set_defaults(handler=_runs)

    pack = commands.add_parser(
        "pack", help="write a run directory into one .tar.gz to continue it elsewhere "
                     "(refused while a process writes the run)")
    pack.add_argument("run_dir", help="a run directory, or a parent of evolution seeds")
    pack.add_argument("-o", "--out", default=None, metavar="FILE",
                      help="the archive to write (default: RUN_DIR.tar.gz beside the run)")
    pack.set_defaults(handler=_pack)

    unpack = commands.add_parser(
        "unpack", help="restore a run directory packed by `metarl pack`; `metarl resume` "
                       "then continues it")
    unpack.add_argument("archive", metavar="FILE")
    unpack.add_argument("--into", default=".", metavar="DIR",
                        help="the folder to unpack into (default: the current one); an "
                             "existing run directory there is never overwritten")
    unpack.set_defaults(handler=_unpack)

    export = commands.add_parser(
        "export", help="write an evolution run's discovered objective as one portable .npz "
                       "file (meta-parameters and a card: objective, inputs, what it was "
                       "found under, verdicts); metarl.load_objective(FILE) loads it")
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--which", default="mean", choices=("mean", "best"),
                        help="the search mean (default) or the best candidate")
    export.add_argument("-o", "--out", default=None, metavar="FILE",
                        help="the file to write (default: ./<experiment name>-<which>.npz)")
    export.add_argument("--force", action="store_true", help="overwrite an existing file")
    export.set_defaults(handler=_export)

    zoo = commands.add_parser(
        "zoo", help="list the discoveries shipped with metarl (metarl.load_objective"
                    "(\"zoo:NAME\"), metarl evaluate zoo:NAME): name, objective, where it "
                    "was found, verdicts against the tuned baselines")
    zoo.set_defaults(handler=_zoo)

    suites = commands.add_parser(
        "suites", help="list the environment suites a discovery is judged on (metarl "
                       "evaluate --suite NAME): each side's environments, budgets and the "
                       "source of their settings")
    suites.add_argument("--calibrate", default=None, metavar="NAME",
                        help="train tuned PPO and the untrained policy on every environment "
                             "of suite NAME and say how far below the ceiling tuned PPO "
                             "stays (the record that justifies a suite's budgets)")
    suites.add_argument("--budgets", default=None, metavar="N1,N2,...",
                        help="with --calibrate: steps per agent to try on every environment "
                             "(default: each environment's own)")
    suites.add_argument("--out", default=None, metavar="FILE",
                        help="with --calibrate: write the record as JSON")
    suites.set_defaults(handler=_suites)


def _add_tool_commands(commands) -> None:
    """``sweep`` and ``devices``."""
    sweep = commands.add_parser(
        "sweep", help="train every combination of a hyperparameter grid × seeds as one "
                      "vmapped population and tabulate the results")
    sweep.add_argument("config", help="evolution experiment file: its first [inner] table "
                                      "and its objective are what is swept")
    sweep.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                       help="a traced hyperparameter and its values, e.g. "
                            "--grid inner.learning_rate=1e-4,3e-4,1e-3 (repeatable: the "
                            "combinations of all of them are trained)")
    sweep.add_argument("--seeds", type=int, default=8, help="seeds per combination (default 8)")
    sweep.add_argument("--seed", type=int, default=0, help="first PRNG seed")
    _add_set(sweep, "inner.total_timesteps=16384")
    sweep.add_argument("--out", default=None,
                       help="output folder (default: <run.output_dir>/<name>-sweep-<time>)")
    sweep.add_argument("--no-plots", action="store_true", help="write the table only")
    sweep.set_defaults(handler=_sweep)

    devices = commands.add_parser(
        "devices", help="list the JAX devices a run would shard its population over"
    )
    devices.set_defaults(handler=_devices)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metarl", description="Discover RL objectives by evolution and train "
                                   "populations of agents.")
    parser.add_argument(
        "--distributed", action="store_true",
        help="join a multi-process run (one process per host) with jax.distributed before "
             "the command: the cluster is detected (SLURM, ...) or read from "
             "METARL_COORDINATOR, METARL_NUM_PROCESSES and METARL_PROCESS_ID",
    )
    parser.add_argument(
        "--cpu-devices", type=int, default=None, metavar="N",
        help="JAX CPU devices to expose (default: one per core, unless JAX_NUM_CPU_DEVICES "
             "or XLA_FLAGS already set a count); a sharded run splits its population over "
             "them, which is how it uses every core",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run_commands(commands)
    _add_reading_commands(commands)
    _add_tool_commands(commands)
    return parser


def _show_warnings_as_lines(command: str):
    """Warnings (a skipped damaged checkpoint, a changed device count) as one line each."""
    import warnings

    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UserWarning):
            print(f"metarl {command}: warning: {message}", file=file or sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    return original


# they read and write files only: JAX need not start
FILE_COMMANDS = ("runs", "pack", "unpack", "zoo")
STOPPED_EXIT_CODE = 4  # a run stopped by its time limit or a signal, resumable


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this process's); returns the exit code.

    A run stopped while a step was in flight (a signal, or a time limit the step would
    overrun) leaves that step's computation running: from the real command line
    (``argv`` omitted) the process then ends at once, its files written and its lock
    released, instead of waiting for it; called with ``argv``, as from Python, it returns
    and the abandoned step finishes in the background. With ``--distributed`` the process
    always ends here, once every process has finished (``os._exit`` with the exit code).
    """
    import warnings

    started = time.monotonic()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started = started
    if args.command in FILE_COMMANDS:
        return _guarded(args)
    try:
        sharding.use_cpu_cores(args.cpu_devices)  # before JAX's first computation
    except ValueError as error:
        parser.error(f"--cpu-devices: {error}")
    except RuntimeError:
        # called from a program in which JAX already runs: its devices stay as they are
        if args.cpu_devices is not None:
            parser.error("--cpu-devices: JAX has already started in this process; call "
                         "metarl.sharding.use_cpu_cores() before its first computation")
    if args.distributed:
        try:
            distributed.initialize()
        except ValueError as error:
            parser.error(f"--distributed: {error}")
    original = _show_warnings_as_lines(args.command)
    try:
        code = _guarded(args)
    finally:
        warnings.showwarning = original
        if args.distributed:
            distributed.shutdown()
    if args.distributed or (getattr(args, "abandoned", False) and argv is None):
        # Everything of the command is written and synced, and its lock released, by now.
        # A process of a multi-process run ends here: once another process has gone (the
        # coordinator, say), the interpreter's own exit can hang for good while it
        # destroys XLA's CPU collectives and the distributed client, with no Python frame
        # left to see; shutdown() above has already waited for every process to finish.
        # A run that abandoned a step in flight ends here too: leaving normally would wait
        # for that XLA computation (JAX's exit handlers tear the backend down).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _guarded(args) -> int:
    """Run the command; errors the user can act on become one line and an exit code."""
    from metarl.config import ConfigError
    from metarl.runs.layout import RunError, RunInterrupted, RunStopped

    try:
        return args.handler(args)
    except (ConfigError, RunError) as error:
        print(f"metarl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except RunStopped as stop:
        print(f"metarl {args.command}: {stop}", file=sys.stderr)
        return 3
    except RunInterrupted as stop:
        print(f"metarl {args.command}: {stop}", file=sys.stderr)
        args.abandoned = stop.abandoned
        return STOPPED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
