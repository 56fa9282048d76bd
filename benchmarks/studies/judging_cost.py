"""Where the time of judging a discovery on a suite goes: compiling, tracing, training.

For each environment asked for (``--environments``, default one cheap and one dear
environment of ``classic``) and each XLA setting (``--xla``), runs, in a fresh process with
an empty training store and an empty JAX compilation cache, as a user would::

    metarl evaluate DISCOVERY --suite <that environment alone> --tune --seeds 16

and records from ``jax.monitoring`` inside that process: every backend compilation (how
many, their seconds, and each program of half a second or more by name), the seconds spent
tracing programs and lowering them to XLA, the process's wall and CPU seconds, and the
trainings the store made. What is neither compiling, tracing nor lowering (``rest``) is the
trainings themselves and the statistics around them. Compiling runs on one thread, training
on every core, so ``compile_share`` is of the wall time.

The XLA settings: ``default`` (no ``XLA_FLAGS``: what ``metarl evaluate`` compiles with,
which since a767e5d is backend optimisation level 1 on a CPU,
:func:`metarl.programs.judging_compiler_options`; XLA's own default, level 3, before) and
``level1`` (``XLA_FLAGS=--xla_backend_optimization_level=1``, which the learning checks of
the test suite use) or ``level3`` (``XLA_FLAGS=--xla_backend_optimization_level=3``, XLA's
default, which judging compiled with before). The committed record was made at 580298b,
when ``default`` meant level 3. For each environment the output says whether the
two settings' evaluation records hold equal numbers (``records_equal``) and how many
numbers differ, timings apart.

    python benchmarks/studies/judging_cost.py --out docs/results/suites/judging_cost.json
    python benchmarks/studies/judging_cost.py --smoke --out /tmp/judging_cost_smoke.json

``--smoke``: one environment at a few thousand steps (``benchmarks/suite_evaluation.py``'s
smoke settings), 4 held-out seeds, PPO alone as the baseline, 2 tuning seeds, one widening
round, the default XLA setting only: about a minute. The full study took 8 min 14 s on the
2-core CPU alone at 580298b (2026-11-29): DiscountingChain-bsuite 70 s and 56 s,
Pendulum-v1 (the dearest environment of ``classic``) 197 s and 164 s, at the default
setting (then level 3) and at level 1.
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
from multi_env_transfer import command_line, conditions, emit, evaluation_output, failed  # noqa: E402
from suite_evaluation import SMOKE  # noqa: E402

XLA_SETTINGS = {"default": "", "level1": "--xla_backend_optimization_level=1",
                "level3": "--xla_backend_optimization_level=3"}
ENVIRONMENTS = ("DiscountingChain-bsuite", "Pendulum-v1")
SMOKE_FLAGS = ("--seeds", "4", "--baselines", "ppo", "--tune-seeds", "2",
               "--tune-rounds", "1")
# a compilation this long or longer is listed by name (the training programs; the rest are
# small helper programs)
LISTED_COMPILE_SECONDS = 0.5
# keys of an evaluation record that hold timings or the moment it was made, not results
TIMING_KEYS = ("seconds", "created", "path", "date")

# The suite of one environment, registered on import as a plugin would be.
ONE_ENVIRONMENT_SUITE = """
from metarl.suites import Suite, SuiteTask, get_suite, register_suite
SOURCE, ENV_ID, SMOKE = {source!r}, {env_id!r}, {smoke!r}
if SMOKE is None:
    [TASK] = [t for t in (*get_suite(SOURCE).train, *get_suite(SOURCE).test)
              if t.label == ENV_ID]
else:
    TASK = SuiteTask(ENV_ID, {{"env_id": ENV_ID, **SMOKE}}, "judging-cost smoke")
register_suite(Suite("judging-cost", 1, "one environment of " + SOURCE, (TASK,), ()))
"""

# The child process: listens to jax.monitoring, runs the command line, writes what it heard.
CHILD = """
import json, sys, time
import jax
heard = {{"compile": [], "trace": 0.0, "lower": 0.0}}
def listen(event, seconds, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        heard["compile"].append([str(kwargs.get("fun_name", "?")), seconds])
    elif event == "/jax/core/compile/jaxpr_trace_duration":
        heard["trace"] += seconds
    elif event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
        heard["lower"] += seconds
jax.monitoring.register_event_duration_secs_listener(listen)
import one_environment_suite
from metarl.cli import main
wall, cpu = time.perf_counter(), time.process_time()
code = main({argv!r})
heard["wall"], heard["cpu"] = time.perf_counter() - wall, time.process_time() - cpu
with open({heard_path!r}, "w") as file:
    json.dump(heard, file)
sys.exit(code)
"""


def judge_once(discovery: str, suite: str, env_id: str, xla: str, flags: list[str],
               work: Path, smoke: bool) -> tuple[dict, dict]:
    """One evaluation in a fresh process from empty caches: its costs, and its record."""
    work.mkdir(parents=True)
    (work / "one_environment_suite.py").write_text(ONE_ENVIRONMENT_SUITE.format(
        source=suite, env_id=env_id, smoke=SMOKE if smoke else None))
    env = {key: value for key, value in os.environ.items() if key != "METARL_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(work), env.get("PYTHONPATH", "")])
    env["JAX_COMPILATION_CACHE_DIR"] = str(work / "jax-compilation")
    env["XLA_FLAGS"] = XLA_SETTINGS[xla]
    argv = ["evaluate", discovery, "--run-dir", str(work / "run"), "--suite", "judging-cost",
            "--tune", "--cache-dir", str(work / "store"), *flags]
    heard_path = work / "heard.json"
    child = CHILD.format(argv=argv, heard_path=str(heard_path))
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise failed(done)
    record_path, _, store_line = evaluation_output(done)
    heard = json.loads(heard_path.read_text())
    compile_seconds = sum(seconds for _, seconds in heard["compile"])
    listed = [{"program": name, "seconds": round(seconds, 2)}
              for name, seconds in heard["compile"] if seconds >= LISTED_COMPILE_SECONDS]
    rest = heard["wall"] - compile_seconds - heard["trace"] - heard["lower"]
    cost = {
        "environment": env_id, "xla": xla, "xla_flags": XLA_SETTINGS[xla],
        "wall_seconds": round(heard["wall"], 1), "cpu_seconds": round(heard["cpu"], 1),
        "compilations": len(heard["compile"]), "compile_seconds": round(compile_seconds, 1),
        "compile_share": round(compile_seconds / heard["wall"], 3),
        "programs_listed": listed,
        "listed_compile_seconds": round(sum(p["seconds"] for p in listed), 1),
        "trace_seconds": round(heard["trace"], 1), "lower_seconds": round(heard["lower"], 1),
        "rest_seconds": round(rest, 1), "store": store_line,
    }
    return cost, json.loads(record_path.read_text())


def numbers_differing(first, second) -> int:
    """How many numbers of two evaluation records differ (timings and dates apart); a
    difference in structure counts as one."""
    if isinstance(first, dict) and isinstance(second, dict):
        if first.keys() != second.keys():
            return 1
        return sum(numbers_differing(first[key], second[key]) for key in first
                   if not any(part in key for part in TIMING_KEYS))
    if isinstance(first, list) and isinstance(second, list):
        if len(first) != len(second):
            return 1
        return sum(numbers_differing(a, b) for a, b in zip(first, second, strict=True))
    return int(first != second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--discovery", default="zoo:lpo_cpu")
    parser.add_argument("--suite", default="classic")
    parser.add_argument("--environments", nargs="+", default=list(ENVIRONMENTS))
    parser.add_argument("--xla", nargs="+", choices=sorted(XLA_SETTINGS),
                        default=["level3", "default"])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from metarl.config import ConfigError
    from metarl.suites import get_suite

    try:
        suite = get_suite(args.suite)
    except ConfigError as error:  # it names the suites there are
        parser.error(f"--suite: {error}")
    known = [task.label for task in (*suite.train, *suite.test)]
    environments, settings = args.environments, args.xla
    flags = ["--seeds", str(args.seeds)]
    if args.smoke:
        environments, settings, flags = ["CartPole-v1"], ["default"], list(SMOKE_FLAGS)
    unknown = sorted(set(environments) - set(known))
    if unknown:
        parser.error(f"--environments: not in suite {args.suite!r}: {', '.join(unknown)} "
                     f"(it has {', '.join(known)})")
    started, load_start = time.perf_counter(), os.getloadavg()
    date = datetime.now(UTC).isoformat(timespec="seconds")
    costs, comparisons = [], []
    with tempfile.TemporaryDirectory(prefix="judging-cost-") as work:
        for env_id in environments:
            records = {}
            for xla in settings:
                cost, records[xla] = judge_once(args.discovery, args.suite, env_id, xla,
                                                flags, Path(work) / f"{env_id}-{xla}",
                                                args.smoke)
                costs.append(cost)
                print(f"{env_id} {xla}: {cost['wall_seconds']} s, compiling "
                      f"{cost['compile_seconds']} s", file=sys.stderr)
            if len(records) == 2:
                differing = numbers_differing(*records.values())
                comparisons.append({"environment": env_id, "settings": list(records),
                                    "records_equal": differing == 0,
                                    "numbers_differing": differing})
    emit({"study": "judging_cost", "discovery": args.discovery, "suite": args.suite,
          "smoke": args.smoke, "evaluate_flags": ["--tune", *flags],
          "command": command_line("judging_cost.py", argv), "costs": costs,
          "xla_comparisons": comparisons,
          "conditions": conditions(date, load_start, started)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
