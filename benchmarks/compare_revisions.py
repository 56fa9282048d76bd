"""Inner-loop throughput of the working tree against another git revision, in one process.

These machines are shared and their speed drifts by tens of percent between runs, so a
speed-up measured in two separate runs says little. This script loads ``inner_loops`` of
``--base`` (a git revision) as a second package beside the working tree's, compiles
``jit(vmap(train))`` of both for each population size, and times them interleaved
(``--repeats`` rounds, best time each), so both see the same machine.

    python benchmarks/compare_revisions.py --base 72bbbec --populations 1 16 64

Prints one JSON document with agent-steps per second of both and their ratio.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "inner_loops"
BASE_PACKAGE = "inner_loops_base"


def load_base(revision: str, into: Path):
    """Import ``inner_loops`` as of ``revision`` under the name ``inner_loops_base``."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, f"{PACKAGE}/"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    if not listing:
        raise SystemExit(f"--base: {revision!r} has no {PACKAGE}/ package")
    target = into / BASE_PACKAGE
    target.mkdir()
    for path in listing:
        if not path.endswith(".py"):
            continue
        source = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
        source = source.replace(f"from {PACKAGE}", f"from {BASE_PACKAGE}")
        source = source.replace(f"import {PACKAGE}", f"import {BASE_PACKAGE}")
        (target / Path(path).name).write_text(source)
    sys.path.insert(0, str(into))
    return importlib.import_module(BASE_PACKAGE)


def compare(packages: dict, population: int, total_timesteps: int, repeats: int) -> dict:
    import jax

    keys = jax.random.split(jax.random.PRNGKey(0), population)
    programs, steps, compile_seconds = {}, {}, {}
    for name, package in packages.items():
        config = package.PPOConfig(total_timesteps=total_timesteps)
        started = time.perf_counter()
        programs[name] = jax.jit(jax.vmap(package.make_train(config))).lower(keys).compile()
        compile_seconds[name] = round(time.perf_counter() - started, 2)
        jax.block_until_ready(programs[name](keys))  # warm-up
        steps[name] = population * config.steps_per_agent
    best = dict.fromkeys(packages, float("inf"))
    for _ in range(repeats):
        for name, program in programs.items():
            started = time.perf_counter()
            jax.block_until_ready(program(keys))
            best[name] = min(best[name], time.perf_counter() - started)
    rates = {name: round(steps[name] / best[name]) for name in packages}
    return {
        "population": population,
        "agent_steps_per_second": rates,
        "compile_seconds": compile_seconds,
        "working_tree_over_base": round(rates["working_tree"] / rates["base"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--populations", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--total-timesteps", type=int, default=16_384,
                        help="steps per agent (default 16384 = 32 updates)")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    import jax

    with tempfile.TemporaryDirectory() as scratch:
        packages = {"base": load_base(args.base, Path(scratch)),
                    "working_tree": importlib.import_module(PACKAGE)}
        results = []
        for population in args.populations:
            results.append(compare(packages, population, args.total_timesteps, args.repeats))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    revision = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "benchmark": "compare_revisions",
        "base": revision or args.base,
        "settings": "PureJaxRL CartPole-v1: 4 envs x 128 steps, 4 epochs x 4 minibatches, "
                    "64-64 tanh; one device; best of the interleaved repeats",
        "total_timesteps_per_agent": args.total_timesteps,
        "jax": jax.__version__,
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
