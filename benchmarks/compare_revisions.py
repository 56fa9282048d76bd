"""Inner-loop throughput of the working tree against another git revision, in one process.

These machines are shared and their speed drifts by tens of percent between runs, so a
speed-up measured in two separate runs says little. This script loads ``inner_loops`` of
``--base`` (a git revision) as a second package beside the working tree's, compiles
``jit(vmap(train))`` of both for each population size, and times them interleaved
(``--repeats`` rounds), so both see the same machine. ``--devices 2`` shards each
population over two CPU devices (one per core) with :func:`metarl.sharding.train_population`,
as ``metarl`` runs it.

    python benchmarks/compare_revisions.py --base 72bbbec --populations 1 16 64
    python benchmarks/compare_revisions.py --base HEAD --populations 64 --devices 2 --repeats 12

Prints one JSON document with agent-steps per second of both (best and median of the
repeats) and their ratios.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
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


def compare(packages: dict, population: int, total_timesteps: int, repeats: int,
            devices: int) -> dict:
    import jax

    from metarl import sharding

    mesh = sharding.population_mesh(devices) if devices > 1 else None
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    programs, steps, compile_seconds = {}, {}, {}
    for name, package in packages.items():
        config = package.PPOConfig(total_timesteps=total_timesteps)
        train = package.make_train(config)
        started = time.perf_counter()
        programs[name] = jax.jit(
            lambda keys, train=train: sharding.train_population(train, keys, mesh=mesh)
        ).lower(keys).compile()
        compile_seconds[name] = round(time.perf_counter() - started, 2)
        jax.block_until_ready(programs[name](keys))  # warm-up
        steps[name] = population * config.steps_per_agent
    seconds = {name: [] for name in packages}
    for _ in range(repeats):
        for name, program in programs.items():
            started = time.perf_counter()
            jax.block_until_ready(program(keys))
            seconds[name].append(time.perf_counter() - started)
    best = {name: round(steps[name] / min(t)) for name, t in seconds.items()}
    median = {name: round(steps[name] / statistics.median(t)) for name, t in seconds.items()}
    return {
        "population": population,
        "devices": devices,
        "agent_steps_per_second": best,
        "median_agent_steps_per_second": median,
        "compile_seconds": compile_seconds,
        "working_tree_over_base": round(best["working_tree"] / best["base"], 3),
        "median_working_tree_over_base": round(
            median["working_tree"] / median["base"], 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--populations", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--total-timesteps", type=int, default=16_384,
                        help="steps per agent (default 16384 = 32 updates)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--devices", type=int, default=1,
                        help="CPU devices to shard each population over (default 1)")
    args = parser.parse_args()
    from metarl import sharding

    sharding.use_cpu_cores(args.devices)
    import jax

    with tempfile.TemporaryDirectory() as scratch:
        packages = {"base": load_base(args.base, Path(scratch)),
                    "working_tree": importlib.import_module(PACKAGE)}
        results = []
        for population in args.populations:
            results.append(compare(packages, population, args.total_timesteps, args.repeats,
                                   args.devices))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    revision = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "benchmark": "compare_revisions",
        "base": revision or args.base,
        "settings": "PureJaxRL CartPole-v1: 4 envs x 128 steps, 4 epochs x 4 minibatches, "
                    "64-64 tanh; best and median of the interleaved repeats",
        "total_timesteps_per_agent": args.total_timesteps,
        "jax": jax.__version__,
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
