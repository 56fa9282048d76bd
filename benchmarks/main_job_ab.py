"""The README's main job (quick start, first command) of the working tree against a git revision.

``benchmarks/compare_revisions.py`` times the inner loop alone; this times the whole job a
user starts: configuration, compilation, every generation, checkpoints and metrics, as one
``metarl run`` process each. The base revision is checked out into a temporary work tree and
run with ``PYTHONPATH`` pointing at it; runs alternate (base, working tree, base, ...), so both
see the same machine, and each starts from an empty JAX compilation cache.

    python benchmarks/main_job_ab.py --base 278f762 --rounds 2 --out docs/results/main_job_ab.json

The job trains full generations (``--set es.rungs=1``; ``--rungs`` chooses another number),
as the experiment file does and did when ``docs/results/main_job_ab_*.json`` were measured.
A base revision older than ``[es] rungs`` gets no override, and it trains full generations
anyway.

Prints one JSON document: the wall and CPU seconds of every run, the load average before
each, each run's best fitness per generation, and whether the two revisions agree on them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "experiments/value_distance_cartpole.toml"


def job_command(run_dir: Path, verb: str, rungs: int | None) -> list[str]:
    """The main job's command line; ``rungs``: the ``es.rungs`` override, or ``None`` for a
    revision that has no such field."""
    command = [sys.executable, "-m", "metarl.cli", verb, EXPERIMENT, "--run-dir", str(run_dir),
               "--no-plots", "--set", "run.progress=false"]
    return command + ([] if rungs is None else ["--set", f"es.rungs={rungs}"])


def knows_rungs(source: Path) -> bool:
    """Whether the package tree ``source`` has ``[es] rungs`` (successive halving)."""
    config = source / "metarl" / "evolve" / "config.py"
    return config.is_file() and "rungs: int" in config.read_text()


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(source: Path, run_dir: Path, cache: Path, verb: str, rungs: int) -> dict:
    """Run the main job from the package tree ``source``; its seconds and fitness curve."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    env.update(PYTHONPATH=str(source), JAX_COMPILATION_CACHE_DIR=str(cache))
    load = os.getloadavg()[0]
    cpu_before, started = children_cpu_seconds(), time.perf_counter()
    if not knows_rungs(source):
        if rungs != 1:
            raise SystemExit(f"--rungs {rungs}: {source} has no [es] rungs")
        rungs = None
    done = subprocess.run(job_command(run_dir, verb, rungs), cwd=source, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the main job failed in {source}:\n{done.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_seconds": round(wall, 2),
            "cpu_seconds": round(children_cpu_seconds() - cpu_before, 2),
            "load_before": round(load, 2),
            "best_fitness": [round(m["best_fitness_so_far"], 4) for m in metrics]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each revision, alternating (default 2)")
    parser.add_argument("--base-verb", default="run",
                        help="CLI verb that starts the job at the base revision (default run)")
    parser.add_argument("--rungs", type=int, default=1,
                        help="es.rungs of the job (default 1: full generations, as the "
                             "recorded comparisons ran)")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    revision = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT,
                              capture_output=True, text=True)
    if revision.returncode != 0:
        parser.error(f"--base: {args.base!r} is not a revision of this repository")
    base_revision = revision.stdout.strip()
    runs = {"base": [], "working_tree": []}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        base_tree = scratch / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            for round_ in range(args.rounds):
                for name, source, verb in (("base", base_tree, args.base_verb),
                                           ("working_tree", ROOT, "run")):
                    tag = f"{name}-{round_}"
                    result = run_job(source, scratch / tag, scratch / f"cache-{tag}", verb,
                                     args.rungs)
                    runs[name].append(result)
                    print(json.dumps({tag: result}), file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)],
                           cwd=ROOT, capture_output=True)
    curves = {tuple(run["best_fitness"]) for name in runs for run in runs[name]}
    median_wall = {name: statistics.median(r["wall_seconds"] for r in rs)
                   for name, rs in runs.items()}
    report = {
        "benchmark": "main_job_ab",
        "base": base_revision,
        "command": " ".join(job_command(Path("DIR"), "run", args.rungs)[1:]),
        "order": ", ".join(["base, working tree"] * args.rounds),
        "runs": runs,
        "median_wall_seconds": median_wall,
        "working_tree_over_base_wall": round(median_wall["working_tree"] / median_wall["base"],
                                             3),
        "same_fitness_every_generation": len(curves) == 1,
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
