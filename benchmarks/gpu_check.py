"""Every GPU measurement of the GPU issue in one run, within a time budget, as JSON files.

Parts, in this order (``--parts`` picks some), each in processes of its own so that one
failure or overrun leaves the others' results; the orchestrating process never starts JAX:

1. ``install``: the machine's packages (``pip list``); a dry run of installing the project
   (``pip install --dry-run --no-index --find-links ... -e . --report``; its requirements
   alone where no setuptools wheel is at hand to build it) from the wheel folders
   (``--wheels``, made by ``benchmarks/gpu_wheelhouse.py``), whose report must leave jax,
   jaxlib and the CUDA plugin as they are; with
   ``--install``, the install itself (if the dry run resolves; otherwise every wheel of the
   folders with ``--no-deps``, then the project with ``--no-deps``, and the JSON says so).
2. ``devices``: ``metarl devices``.
3. ``head_to_head``: ``benchmarks/vs_purejaxrl.py``'s workloads (``--workloads``),
   PureJaxRL and metarl's defaults, one process each, at ``--scale`` of their step budgets.
4. ``generation``: the blog-sized generation, ``experiments/value_distance_cartpole.toml``
   with 256 candidates x 2 seeds x 5e5 steps: ``benchmarks/evolution_overhead.py`` (the
   jitted generation against the same agents' plain training, same objective), then
   ``metarl run`` of the file for ``--generations`` generations (each line's seconds, the
   wall time between lines, and the host time between steps, below).
5. ``variants``: PureJaxRL again and metarl's other ``--variants`` on the
   ``--variant-workloads``: the A/B of the choices that differ by backend (the defaults
   resolve by backend, so on a GPU ``matmul=cpu`` and ``env_resets=presampled`` are the
   CPU's choices).
6. ``main_job``: ``metarl run experiments/value_distance_cartpole.toml``, as a user starts it,
   with the host time between steps.
7. ``throughput``: PPO's agent-steps per second by population (``benchmarks/throughput.py``).
8. ``step_cost``: ``benchmarks/step_cost.py`` on this backend (PureJaxRL, metarl's default and
   ``matmul=cpu``): FLOPs, bytes and operations per agent-step as this backend compiles them.

**Host time between steps** (``host_seconds`` of ``generation`` and ``main_job``): for each
generation after the first, the seconds from the end of the previous generation's
computation to the dispatch of its own, everything the run does on the host in between (its
line, files, checkpoint: whatever the engine does not overlap with the step). The runs go
through this script again (``--timed-run``), which wraps the evolution program's ``step``
to note when it is called and when its arrays are ready, and then runs ``metarl run``
unchanged.

Each part starts only if the time left (``--budget``, default 480 s) is at least its
estimated need, and is given at most what is left; a part skipped for time says so. Writes
``check.json`` (and each part's own JSON or log) to the folder ``--out``. ``--smoke`` runs
tiny sizes on a CPU.

    python benchmarks/gpu_check.py --out $OUT --wheels .cache/wheels/cp312/part1 \\
        .cache/wheels/cp312/part2 .cache/wheels/cp312/part3 --install --purejaxrl .cache/purejaxrl
    python benchmarks/gpu_check.py --smoke --out /tmp/check --purejaxrl .cache/purejaxrl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import vs_purejaxrl

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
PARTS = ("install", "devices", "head_to_head", "generation", "variants", "main_job",
         "throughput", "step_cost")
# seconds a part needs at least (full size, smoke) before it is started
NEEDS = {"install": (20, 5), "devices": (15, 5), "head_to_head": (60, 20),
         "generation": (150, 20), "variants": (40, 20), "main_job": (60, 30),
         "throughput": (40, 15), "step_cost": (60, 30)}
# seconds a part may take at most (full size), so that later parts keep their turn
LIMITS = {"install": 120, "devices": 60, "head_to_head": 200, "generation": 210,
          "variants": 240, "main_job": 90, "throughput": 90, "step_cost": 150}
KEPT = ("jax", "jaxlib")  # and every jax-cuda*/jax_cuda* and nvidia-* distribution
BLOG = ["es.population_size=256", "fitness.seeds_per_candidate=2",
        "inner.total_timesteps=500000"]
BLOG_SMOKE = ["es.population_size=2", "fitness.seeds_per_candidate=1",
              "inner.total_timesteps=1024", "inner.num_envs=2", "inner.num_steps=64",
              "inner.num_minibatches=2", "objective.options.hidden_sizes=[4]"]
MAIN_JOB = "experiments/value_distance_cartpole.toml"


def run(command: list[str], timeout: float, **kwargs) -> dict:
    """A command's exit code, output tails and seconds; never raises for its failure."""
    started = time.perf_counter()
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             cwd=ROOT, **kwargs)
    except subprocess.TimeoutExpired:
        return {"command": " ".join(command), "exit": "time limit", "stdout": "",
                "seconds": round(time.perf_counter() - started, 1)}
    return {"command": " ".join(command), "exit": out.returncode,
            "seconds": round(time.perf_counter() - started, 1),
            "stdout": out.stdout, "stderr_tail": out.stderr[-3000:]}


def normalised(name: str) -> str:
    """A distribution's name as pip compares them (``Jax_Cuda13`` -> ``jax-cuda13``)."""
    return name.lower().replace("_", "-").replace(".", "-")


def touches_jax(name: str) -> bool:
    """Whether a distribution is one the GPU machine's CUDA jax consists of."""
    name = normalised(name)
    return name in KEPT or name.startswith("jax-cuda") or name.startswith("nvidia-")


def install(wheels: list[Path], really: bool, limit: float, out: Path) -> dict:
    """The install part: packages, dry run (with its verdict), the install if asked."""
    pip = [sys.executable, "-m", "pip"]
    result: dict = {}
    listed = run(pip + ["list", "--format=json"], 60)
    result["packages"] = ({p["name"]: p["version"] for p in json.loads(listed["stdout"])}
                          if listed["exit"] == 0 else listed)
    find_links = [a for folder in wheels for a in ("--find-links", str(folder))]
    # with no index, setuptools for the editable build comes from the wheels or is here
    isolation = [] if any(folder.glob("setuptools-*.whl") for folder in wheels) else [
        "--no-build-isolation"]
    report = out / "install_report.json"
    if isolation:  # no setuptools to build the project with: resolve its requirements, as
        # pyproject.toml declares them, which is what installing it resolves
        target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "dependencies"]
    else:
        target = ["-e", "."]
    dry = run(pip + ["install", "--dry-run", "--no-index", *find_links, "--report",
                     str(report), *target], limit)
    result["dry_run"] = {k: v for k, v in dry.items() if k != "stdout"}
    if report.is_file():
        planned = json.loads(report.read_text()).get("install", [])
        names = [f"{item['metadata']['name']}=={item['metadata']['version']}"
                 for item in planned if normalised(item["metadata"]["name"]) != "metarl"]
        result["would_install"] = names
        result["would_change_jax"] = sorted(n for n in names if touches_jax(n.split("==")[0]))
        result["leaves_jax_untouched"] = not result["would_change_jax"]
    else:
        result["leaves_jax_untouched"] = None
    if really:
        if dry["exit"] == 0 and result.get("leaves_jax_untouched"):
            done = run(pip + ["install", "--no-index", *find_links, *isolation, "-e", "."],
                       limit)
            result["install"] = {"how": "resolved from the wheel folders",
                                 **{k: v for k, v in done.items() if k != "stdout"}}
        else:  # what the last GPU runs did: the wheels of what is missing, not resolved
            have = {normalised(name) for name in result["packages"]} if isinstance(
                result["packages"], dict) else set()
            files = [str(w) for folder in wheels for w in sorted(folder.glob("*.whl"))
                     if not touches_jax(w.name.split("-")[0])
                     and normalised(w.name.split("-")[0]) not in have]
            done = run(pip + ["install", "--no-deps", "--no-index", *files], limit)
            project = run(pip + ["install", "--no-deps", "--no-index", *find_links, *isolation,
                                 "-e", "."], limit)
            result["install"] = {"how": "--no-deps fallback: the dry run did not resolve or "
                                        "would have changed jax",
                                 "wheels": {k: v for k, v in done.items() if k != "stdout"},
                                 "project": {k: v for k, v in project.items()
                                             if k != "stdout"}}
    return result


def devices(limit: float) -> dict:
    out = run([sys.executable, "-m", "metarl", "devices"], limit)
    return {"output": out.get("stdout", ""), "exit": out["exit"],
            "stderr_tail": out.get("stderr_tail", "")}


def generation(smoke: bool, generations: int, limit: float, out: Path) -> dict:
    """The blog-sized generation: jitted generation against plain training, then the run."""
    started = time.perf_counter()
    sets = BLOG_SMOKE if smoke else BLOG
    overhead = run([sys.executable, str(BENCHMARKS / "evolution_overhead.py"),
                    "--experiment", "experiments/value_distance_cartpole.toml",
                    "--default-devices", "--repeats", "1",
                    *[a for s in sets for a in ("--set", s)]], limit * 0.55)
    result: dict = {"overrides": sets}
    if overhead["exit"] == 0:
        result["evolution_overhead"] = json.loads(overhead["stdout"])
    else:
        result["evolution_overhead"] = {k: v for k, v in overhead.items() if k != "stdout"}
    left = limit - (time.perf_counter() - started)
    run_dir = out / "blog_generation_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    timings = out / "blog_generation_times.json"
    command = timed_run_command(
        timings, [MAIN_JOB, "--run-dir", str(run_dir), "--no-plots",
                  *[a for s in sets + [f"es.generations={generations}"] for a in ("--set", s)]])
    exit_code, wall, arrivals, tail = watch(command, run_dir / "metrics.jsonl", max(left, 1))
    lines = read_lines(run_dir / "metrics.jsonl")
    steps = [line["seconds"] for line in lines]
    between = [b - a for a, b in zip(arrivals[:-1], arrivals[1:], strict=True)]
    result["run"] = {
        "command": "metarl run experiments/value_distance_cartpole.toml "
                   + " ".join(f"--set {s}" for s in sets + [f"es.generations={generations}"]),
        "exit": exit_code, "wall_seconds": round(wall, 1), "log_tail": tail,
        "generations": len(lines),
        "step_seconds": [round(s, 3) for s in steps],
        "agent_steps_per_second": [round(line["agent_steps_per_second"] or 0)
                                   for line in lines],
        # from one line's arrival to the next: the next jitted step plus everything the run
        # does around it (metrics, meta-parameter files, checkpoint)
        "seconds_between_lines": [round(s, 3) for s in between],
        "seconds_around_steps": [round(b - s, 3) for b, s in zip(between, steps[1:],
                                                                   strict=False)],
        **host_times(timings),
    }
    return result


def main_job(smoke: bool, limit: float, out: Path) -> dict:
    """The quick start's main job end to end, as a user starts it (through
    :func:`timed_run_command`): its generations' seconds and the host time between them."""
    run_dir = out / "work" / "main_job"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    timings = out / "main_job_times.json"
    sets = ["--set", "es.generations=2"] if smoke else []
    command = timed_run_command(timings, [MAIN_JOB, "--run-dir", str(run_dir), "--no-plots",
                                          *sets])
    exit_code, wall, _, tail = watch(command, run_dir / "metrics.jsonl", limit)
    lines = read_lines(run_dir / "metrics.jsonl")
    return {"command": f"metarl run {MAIN_JOB} " + " ".join(sets), "exit": exit_code,
            "wall_seconds": round(wall, 1), "generations": len(lines),
            "generation_seconds": [round(line["seconds"], 3) for line in lines],
            "best_fitness_so_far": lines[-1]["best_fitness_so_far"] if lines else None,
            "log_tail": tail, **host_times(timings)}


def timed_run_command(timings: Path, run_args: list[str]) -> list[str]:
    """The command of ``metarl run RUN_ARGS`` through :func:`timed_run`, which writes the
    steps' times to ``timings``."""
    return [sys.executable, str(Path(__file__).resolve()), "--timed-run", str(timings),
            "run", *run_args]


def timed_run(timings: Path, cli_args: list[str]) -> int:
    """``metarl CLI_ARGS`` in this process, the evolution program's ``step`` wrapped to note,
    per step, when it is called (dispatched) and when its arrays are ready (the engine
    waits for them in the same thread right after, so the wrap delays nothing); the
    ``[dispatched, ready]`` pairs (``time.perf_counter``) go to ``timings`` as JSON.
    Returns the command's exit code."""
    import jax

    from metarl.cli import main as metarl
    from metarl.evolve.kind import EvolveProgram

    times: list[list[float]] = []
    original = EvolveProgram.step

    def step(self, state):
        dispatched = time.perf_counter()
        out = jax.block_until_ready(original(self, state))
        times.append([dispatched, time.perf_counter()])
        return out

    EvolveProgram.step = step
    try:
        code = metarl(cli_args)
    finally:
        timings.write_text(json.dumps({"steps": times}) + "\n")
    return code


def host_times(timings: Path) -> dict:
    """From :func:`timed_run`'s file: per step its computation's seconds (dispatch to
    ready), and per step after the first the host seconds before it (from the previous
    step's end to its dispatch)."""
    try:
        steps = json.loads(timings.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return {"host_seconds": None}
    host = [b[0] - a[1] for a, b in zip(steps[:-1], steps[1:], strict=True)]
    return {"step_compute_seconds": [round(b - a, 4) for a, b in steps],
            "host_seconds": [round(h, 4) for h in host],
            "host_seconds_median": round(statistics.median(host), 4) if host else None}


def watch(command: list[str], metrics: Path, limit: float):
    """Run ``command``, noting when each line of ``metrics`` appears (polled every 20 ms).
    Returns ``(exit code or "time limit", wall seconds, arrival times, log tail)``."""
    started = time.perf_counter()
    arrivals: list[float] = []
    with open(metrics.parent.with_suffix(".log"), "w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        while process.poll() is None and time.perf_counter() - started < limit:
            time.sleep(0.02)
            count = len(read_lines(metrics))
            arrivals += [time.perf_counter()] * (count - len(arrivals))
        if process.poll() is None:
            process.terminate()
            process.wait(30)
            exit_code: int | str = "time limit"
        else:
            exit_code = process.returncode
        log.seek(0)
        tail = log.read()[-1500:]
    return exit_code, time.perf_counter() - started, arrivals, tail


def read_lines(path: Path) -> list[dict]:
    """The complete lines of a ``metrics.jsonl`` (one being written is left out)."""
    if not path.is_file():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            break
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder for the JSON")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--budget", type=float, default=480,
                        help="seconds for everything (default 480)")
    parser.add_argument("--wheels", type=Path, nargs="*", default=[],
                        help="wheel folders (benchmarks/gpu_wheelhouse.py) to install from")
    parser.add_argument("--install", action="store_true",
                        help="install the project from --wheels (else only the dry run)")
    parser.add_argument("--purejaxrl", type=Path,
                        help="the folder with PureJaxRL's ppo.py and wrappers.py")
    parser.add_argument("--workloads", nargs="+", choices=sorted(vs_purejaxrl.WORKLOADS),
                        default=list(vs_purejaxrl.WORKLOADS))
    parser.add_argument("--variants", nargs="+",
                        default=["default", "matmul=cpu", "env_resets=presampled",
                                 "final_values=none", "final_values=in_rollout",
                                 "shuffle=permutation", "final_values=none+shuffle=permutation"],
                        help="metarl variants for the head-to-head (vs_purejaxrl.py)")
    parser.add_argument("--variant-workloads", nargs="+",
                        choices=sorted(vs_purejaxrl.WORKLOADS),
                        default=["cartpole_512", "spaceinvaders_8"],
                        help="workloads that run every variant; the others run 'default' "
                             "only")
    parser.add_argument("--scale", type=float, default=0.25,
                        help="head-to-head step budgets times this (default 0.25; 1 for the "
                             "table's sizes and returns)")
    parser.add_argument("--generations", type=int, default=3,
                        help="generations of the blog-sized run (default 3)")
    parser.add_argument("--populations", type=int, nargs="+", default=[1, 256, 4096])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for a CPU")
    args = parser.parse_args()
    if {"head_to_head", "variants", "step_cost"} & set(args.parts):
        vs_purejaxrl.check_purejaxrl_folder(parser, args.purejaxrl)
    vs_purejaxrl.check_variants(parser, args.variants)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # programs compiled once on this machine are read back by later processes
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path("/tmp") / "metarl-gpu-check-cache"))
    os.environ.update(env)
    report: dict = {"benchmark": "gpu_check", "smoke": args.smoke,
                    "command": " ".join(["python", "benchmarks/gpu_check.py"] + sys.argv[1:]),
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "budget_seconds": args.budget, "parts": {}}

    def write() -> None:
        report["wall_seconds"] = round(time.perf_counter() - started, 1)
        (args.out / "check.json").write_text(json.dumps(report, indent=1) + "\n")

    def left() -> float:
        return args.budget - (time.perf_counter() - started)

    for part in args.parts:
        need = NEEDS[part][1 if args.smoke else 0]
        if left() < need:
            report["parts"][part] = {"skipped": f"time budget: {left():.0f} s left, the part "
                                                f"needs about {need} s"}
            write()
            continue
        limit = min(LIMITS[part] * (1 if not args.smoke else 2), left())
        begun = time.perf_counter()
        print(f"gpu_check: {part} (up to {limit:.0f} s)", file=sys.stderr, flush=True)
        if part == "install":
            result = install(args.wheels, args.install and not args.smoke, limit, args.out)
        elif part == "devices":
            result = devices(limit)
        elif part in ("head_to_head", "variants"):
            # head_to_head: PureJaxRL and metarl's default on every workload; variants:
            # metarl's other variants on the variant workloads (PureJaxRL measured again
            # there, so that each comparison has its own alternation)
            result = {"environment": vs_purejaxrl.child_environment(env), "scale": args.scale}
            deadline = time.perf_counter() + limit
            names = (args.workloads if part == "head_to_head"
                     else [w for w in args.variant_workloads if w in args.workloads])
            variants = (["default"] if part == "head_to_head"
                        else [v for v in args.variants if v != "default"])
            result["workloads"] = {}
            for name in names:
                result["workloads"].update(vs_purejaxrl.head_to_head(
                    [name], variants, 1, args.smoke, args.scale, 0, args.purejaxrl,
                    deadline, limit, env,
                    log=lambda line: print(line[:300], file=sys.stderr, flush=True)))
                report["parts"][part] = result
                write()
        elif part == "generation":
            result = generation(args.smoke, 2 if args.smoke else args.generations, limit,
                                args.out)
        elif part == "main_job":
            result = main_job(args.smoke, limit, args.out)
        elif part == "step_cost":
            counted = run([sys.executable, str(BENCHMARKS / "step_cost.py"), "--purejaxrl",
                           str(args.purejaxrl), "--variants", "default", "matmul=cpu",
                           "--out", str(args.out / "step_cost.json")]
                          + (["--smoke", "--settings", "cartpole"] if args.smoke else []),
                          limit)
            result = {k: v for k, v in counted.items() if k != "stdout"}
        else:
            import gpu_experiments

            result = {"results": gpu_experiments.run_throughput(
                [2] if args.smoke else args.populations, 1024 if args.smoke else 131_072,
                limit)}
        result["part_seconds"] = round(time.perf_counter() - begun, 1)
        report["parts"][part] = result
        write()
    write()
    print(json.dumps({part: sorted(value) for part, value in report["parts"].items()}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--timed-run"]:  # a child of the generation and main_job parts
        sys.exit(timed_run(Path(sys.argv[2]), sys.argv[3:]))
    main()
