"""Every shipped discovery judged on a suite's environments, against tuned baselines.

For each discovery of the zoo (default: the evidence pages' LPO, TA-LPO, learned optimiser
and MiniGrid drift; the blog-sized value distance has its own record,
``docs/results/suite_evaluation.json``), runs, as a user would::

    metarl evaluate zoo:NAME --suite classic --tune --run-dir RUNS/NAME --cache-dir RUNS/store

one process each, all with one training store, so that a baseline two discoveries share
(tuned PPO, for every drift) is trained once. A discovery whose run directory already holds
this evaluation is not trained again (``metarl evaluate`` reuses an identical earlier
evaluation), so a stopped study is resumed by running it again.

Writes one JSON document (``--out``, and printed): per discovery its record's per-environment
and pooled rows (the ``suite`` section of ``metarl evaluate``'s record: IQM, P(improvement)
with its interval, the verdict and the knobs chosen at their grid's edge), the store's
summary line and the seconds it took; and the conditions (load average at the start and
end, revision). ``docs/render_verdicts.py`` renders its rows into
``docs/evidence/generalisation.md``.

    python benchmarks/studies/discoveries_on_suite.py --runs-dir runs/discoveries_on_classic \\
        --out docs/results/suites/discoveries_on_classic.json
    python benchmarks/studies/discoveries_on_suite.py --smoke --out /tmp/discoveries_smoke.json

``--smoke`` judges two discoveries on the two-environment suite of a few thousand steps
that ``benchmarks/suite_evaluation.py --smoke`` uses (4 held-out seeds, one baseline, 2
tuning seeds, one widening round), in a temporary directory: about 7 CPU-minutes, to
check the script.
Cost on the 2-core CPU (2026-11-29, partly beside a test run): 45 min for LPO from an
empty store and compilation cache (every environment compiles its programs), 15-29 min for
each further drift (tuned PPO and DPO from the store); the learned optimiser alone from an
empty store 36 min (49 trainings; beside parts of a test run for its first 28 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
from multi_env_transfer import (  # noqa: E402
    command_line,
    conditions,
    emit,
    evaluation_output,
    failed,
)
from suite_evaluation import SMOKE, SMOKE_SUITE  # noqa: E402

DISCOVERIES = ("lpo_cpu", "ta_lpo_cpu", "minigrid_drift", "learned_optimizer_cpu")
SMOKE_DISCOVERIES = ("lpo_cpu", "learned_optimizer_cpu")
SMOKE_FLAGS = ("--seeds", "4", "--baselines", "ppo", "--tune-seeds", "2",
               "--tune-rounds", "1")


def judge(name: str, run_dir: Path, store: Path, suite: str, flags: list[str],
          env: dict[str, str], smoke: bool = False) -> dict:
    """``metarl evaluate zoo:NAME --suite SUITE --tune`` in a process of its own; the
    record's suite rows, its path, the store's line and the seconds it took."""
    command = [sys.executable, "-m", "metarl", "evaluate", f"zoo:{name}", "--run-dir",
               str(run_dir), "--suite", suite, "--tune", "--cache-dir", str(store), *flags]
    if smoke:  # the smoke suite registers itself on import, as a plugin would
        command = [sys.executable, "-c", "import smoke_suite, sys; from metarl.cli import main;"
                   f" sys.exit(main({command[3:]!r}))"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    seconds = round(time.perf_counter() - started, 1)
    if done.returncode != 0:
        raise failed(done)
    path, reused, store_line = evaluation_output(done)
    record = json.loads(path.read_text())
    section = record["suite"]
    # an evaluation made before is reused, not trained again: its seconds are not its cost
    return {"discovery": f"zoo:{name}", "seconds": seconds,
            "reused_earlier_evaluation": reused, "record": str(path),
            "eval_seed": record["eval_seed"], "seeds": record["seeds"], "store": store_line,
            "trained_on": section["trained_on"], "pooled_over": section["pooled_over"],
            "environments": section["environments"], "pooled": section["pooled"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="classic")
    parser.add_argument("--discoveries", default=",".join(DISCOVERIES),
                        help="comma-separated zoo names (default: %(default)s)")
    parser.add_argument("--runs-dir", default=None,
                        help="where the run directories and the training store are kept and "
                             "reused (default: runs/discoveries_on_SUITE; --smoke: a "
                             "temporary directory)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from metarl.discoveries import zoo

    names = list(SMOKE_DISCOVERIES) if args.smoke else args.discoveries.split(",")
    unknown = sorted(set(names) - set(zoo.names()))
    if unknown:
        parser.error(f"--discoveries: not in the zoo: {', '.join(unknown)} "
                     f"(the zoo has {', '.join(zoo.names())})")
    started, load_start = time.perf_counter(), os.getloadavg()
    date = datetime.now(UTC).isoformat(timespec="seconds")
    runs_dir = Path(args.runs_dir or (tempfile.mkdtemp(prefix="discoveries-on-suite-")
                                      if args.smoke else ROOT / "runs" /
                                      f"discoveries_on_{args.suite}"))
    runs_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    suite, flags = args.suite, []
    if args.smoke:
        (runs_dir / "smoke_suite.py").write_text(SMOKE_SUITE.format(smoke=SMOKE))
        env["PYTHONPATH"] = os.pathsep.join([str(runs_dir), env.get("PYTHONPATH", "")])
        suite, flags = "smoke", list(SMOKE_FLAGS)
    judged = []
    for name in names:
        judged.append(judge(name, runs_dir / name, runs_dir / "store" / "trainings", suite,
                            flags, env, smoke=args.smoke))
        print(f"{name}: {judged[-1]['seconds']} s, {judged[-1]['store']}", file=sys.stderr)
    result = {
        "study": "discoveries_on_suite", "suite": suite, "smoke": args.smoke,
        "evaluate_flags": ["--suite", suite, "--tune", *flags], "runs_dir": str(runs_dir),
        "command": command_line("discoveries_on_suite.py", argv),
        "discoveries": judged,
        "conditions": conditions(date, load_start, started),
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
