"""Run a benchmark's measurement once per CPU device count, each in a child process.

JAX fixes its CPU device count when it starts, so a script that compares device counts
runs itself again with ``--child`` and ``JAX_NUM_CPU_DEVICES`` set, once per count; the
child prints one JSON line, which :func:`run_children` collects (echoing it to stderr as
it arrives). Also: the machine's CPU, for the report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence

CHILD_FLAG = "--child"


def run_children(script: str, devices: Sequence[int], arguments: Sequence[object]) -> list[dict]:
    """``[result per device count]``: ``script --child <arguments...>`` run with JAX
    exposing that many CPU devices; the device count is passed after ``arguments``' first
    entry, as the children of these scripts expect (``population devices ...``)."""
    results = []
    for count in devices:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env["JAX_NUM_CPU_DEVICES"] = str(count)
        first, *rest = [str(a) for a in arguments]
        child = subprocess.run([sys.executable, script, CHILD_FLAG, first, str(count), *rest],
                               env=env, capture_output=True, text=True, check=True)
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def population_benchmark(script: str, description: str, measure: Callable[..., dict],
                         population: int, devices: Sequence[int]):
    """The command line of a benchmark of one population per device count.

    In a child (``--child population devices total_timesteps repeats``) prints
    ``measure(population, devices, total_timesteps, repeats)`` as JSON and returns
    ``None``; otherwise parses ``--population``, ``--devices``, ``--total-timesteps`` and
    ``--repeats`` (defaults: ``population``, ``devices``, PureJaxRL's 5e5, 3), runs the
    children and returns ``(args, results)``.
    """
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        size, count, total, repeats = map(int, sys.argv[2:6])
        print(json.dumps(measure(size, count, total, repeats)))
        return None
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--population", type=int, default=population)
    parser.add_argument("--devices", type=int, nargs="+", default=list(devices))
    parser.add_argument("--total-timesteps", type=int, default=500_000,
                        help="environment steps per agent (PureJaxRL: 5e5)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = run_children(script, args.devices, [args.population, args.total_timesteps,
                                                  args.repeats])
    return args, results


def cpu() -> dict:
    """The CPU's model name and whether it has AVX-512 BF16 instructions (Linux)."""
    name, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name") and name == platform.processor():
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line
    except OSError:
        pass
    return {"cpu": name, "avx512_bf16": "avx512_bf16" in flags.split()}
