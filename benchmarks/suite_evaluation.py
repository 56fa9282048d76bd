"""What judging one objective on a suite costs, from an empty store and from a full one.

Judges a discovery (default: the shipped ``zoo:value_distance_blog``) on every environment
of a suite (default ``classic``) against its tuned baselines (``metarl evaluate --suite
NAME --tune``, each in a process of its own, as a user runs it), twice: first with an empty
training store and an empty compilation cache, then, on a second copy of the run directory,
with the store and the compilation cache the first filled. The second is what a user's
next evaluation on the suite costs: the baselines' trainings are reused from the store, and
what was compiled before is read from JAX's compilation cache. Targets on the 2-core CPU:
at most 15 minutes from an empty store, at most a third of that with the baselines stored.

    python benchmarks/suite_evaluation.py --out docs/results/suite_evaluation.json
    python benchmarks/suite_evaluation.py --smoke --out /tmp/suite_smoke.json

Environments are judged two at a time (``--jobs 2``, one per core): one compiles, on one
core, while the other trains.

``--smoke`` judges on a two-environment suite of a few thousand steps with 4 seeds, one
baseline, 2 tuning seeds and one widening round, to check the script end to end. Prints one
JSON document (and writes it with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from main_job_ab import children_cpu_seconds  # beside this script

TARGET_EMPTY_SECONDS = 15 * 60
TARGET_CACHED_FRACTION = 1 / 3
SMOKE = {"num_envs": 4, "num_steps": 32, "total_timesteps": 2048, "hidden_sizes": [16],
         "update_epochs": 2, "num_minibatches": 2}


SMOKE_SUITE = """
from metarl.suites import Suite, SuiteTask, register_suite
SMOKE = {smoke!r}
register_suite(Suite(
    "smoke", 1, "two environments at a few thousand steps",
    (SuiteTask("CartPole-v1", {{"env_id": "CartPole-v1", **SMOKE}}, "benchmark smoke"),),
    (SuiteTask("Catch-bsuite", {{"env_id": "Catch-bsuite", **SMOKE}}, "benchmark smoke"),)))
"""


def _judge(run_dir: Path, store_dir: Path, suite: str, seeds: int, flags: list[str],
           smoke_module: Path | None) -> dict:
    """One ``metarl evaluate RUN_DIR --suite SUITE`` in a process of its own (as a user
    runs it), with the store in ``store_dir`` (and JAX's compilation cache beside it)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("JAX_COMPILATION_CACHE_DIR", "METARL_CACHE_DIR")}
    command = ["metarl", "evaluate", str(run_dir), "--suite", suite, "--seeds", str(seeds),
               "--cache-dir", str(store_dir / "trainings"), *flags]
    if smoke_module is not None:  # the smoke suite registers as a plugin would, on import
        env["PYTHONPATH"] = os.pathsep.join([str(smoke_module.parent),
                                             env.get("PYTHONPATH", "")])
        command = [sys.executable, "-c", "import smoke_suite, sys; from metarl.cli import main; "
                   f"sys.exit(main({command[1:]!r}))"]
    started, cpu = time.perf_counter(), children_cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - started, children_cpu_seconds() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    summary = [line for line in done.stdout.splitlines() if line.startswith("training store")]
    record = max((run_dir / "evaluations").glob("*.json"), key=lambda p: int(p.stem))
    report = json.loads(record.read_text())
    return {"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
            "store": summary[-1] if summary else None,
            "record": str(record), "eval_seed": report["eval_seed"],
            "environments": report["suite"]["environments"],
            "pooled": report["suite"]["pooled"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--discovery", default="zoo:value_distance_blog")
    parser.add_argument("--suite", default="classic")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--jobs", type=int, default=2,
                        help="environments judged at once (metarl evaluate --jobs; default "
                             "2, one per core of the 2-core CPU)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="materialise the discovery into DIR and keep it: its first "
                             "evaluation's record and figure stay there")
    args = parser.parse_args(argv)

    from metarl.discoveries.materialise import materialise

    work = Path(tempfile.mkdtemp(prefix="suite-evaluation-"))
    smoke_module = None
    if args.smoke:
        smoke_module = work / "smoke_suite.py"
        smoke_module.write_text(SMOKE_SUITE.format(smoke=SMOKE))
    suite, seeds = ("smoke", 4) if args.smoke else (args.suite, args.seeds)
    flags = ["--jobs", str(args.jobs)] + ([] if args.no_tune else ["--tune"])
    if args.smoke and not args.no_tune:  # one baseline, 2 tuning seeds, one widening round
        flags += ["--baselines", "l2", "--tune-seeds", "2", "--tune-rounds", "1"]
    first, _ = materialise(args.discovery, args.keep or work / "first")
    second = work / "second"
    shutil.copytree(first, second)
    store_dir = work / "store"
    load_before = os.getloadavg()
    empty = _judge(first, store_dir, suite, seeds, flags, smoke_module)
    cached = _judge(second, store_dir, suite, seeds, flags, smoke_module)
    result = {
        "benchmark": "suite_evaluation", "discovery": args.discovery, "suite": suite,
        "seeds": seeds, "tune": not args.no_tune, "jobs": args.jobs, "smoke": args.smoke,
        "command": " ".join([sys.executable, *sys.argv]),
        "empty_store": empty, "stored_baselines": cached,
        "cached_fraction": round(cached["seconds"] / empty["seconds"], 3),
        "targets": {"empty_store_seconds": TARGET_EMPTY_SECONDS,
                    "cached_fraction": TARGET_CACHED_FRACTION},
        "meets_targets": {
            "empty_store": empty["seconds"] <= TARGET_EMPTY_SECONDS,
            "stored_baselines": cached["seconds"] / empty["seconds"] <= TARGET_CACHED_FRACTION},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "revision": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                   capture_output=True, text=True,
                                   cwd=Path(__file__).parent).stdout.strip() or None,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
