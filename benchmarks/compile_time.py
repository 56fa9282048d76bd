"""Compile time and run time of the learners' programs at XLA's backend optimisation levels.

On the CPU, compilation dominates short runs and the test suite, so the suite compiles at
XLA's backend optimisation level 1 rather than its default 3 (``conftest.py``). This script
checks that choice: for each level, in a fresh child process with the persistent
compilation cache off, it compiles ``jit(vmap(init + advance))`` of each learner for a small
population, times the compilation and the best of ``--repeats`` runs, and fingerprints the
results: ``identical_to_first`` says whether the level computed bit for bit what the first
level did, and ``max_difference_to_first`` the largest absolute difference of any output
(parameters, optimiser and environment state, metrics) where it did not.

    python benchmarks/compile_time.py                         # levels 3 and 1, all learners
    python benchmarks/compile_time.py --levels 3 2 1 --algorithms ppo td3 --population 16

A level may be given twice (``--levels 1 1``): each entry is its own child process, so
that shows whether one level compiles to the same results from one process to the next.

Prints one JSON document: per learner, one row per ``--levels`` entry in order, with its
compile and run seconds and the ratios of the first entry's times to its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Small but complete runs of each learner: long enough that the run time is not noise.
SETTINGS = {
    "ppo": {"total_timesteps": 32_768},
    "dqn": {"total_timesteps": 8_192},
    "td3": {"total_timesteps": 2_048, "learning_starts": 512},
    "sac": {"total_timesteps": 2_048, "learning_starts": 512},
}


def settings_for(algorithm: str, total_timesteps: int | None) -> dict:
    """The learner's config fields: :data:`SETTINGS`, with ``total_timesteps`` if given."""
    if total_timesteps is None:
        return dict(SETTINGS[algorithm])
    return {**SETTINGS[algorithm], "total_timesteps": total_timesteps}


def measure(algorithm: str, population: int, repeats: int, outputs: str,
            total_timesteps: int | None = None) -> dict:
    """Compile and run one learner's population program in this process; its outputs
    (every leaf of the final states and metrics) are saved to the ``outputs`` ``.npz``."""
    import jax
    import numpy as np

    from inner_loops import get_algorithm, make_learner

    config = get_algorithm(algorithm).config_class(**settings_for(algorithm, total_timesteps))
    learner = make_learner(config)

    def run(key):
        return learner.advance(learner.init(key))

    keys = jax.random.split(jax.random.PRNGKey(0), population)
    started = time.perf_counter()
    compiled = jax.jit(jax.vmap(run)).lower(keys).compile()
    compile_seconds = time.perf_counter() - started
    timings = []
    for _ in range(repeats + 1):  # the first run warms up
        started = time.perf_counter()
        results = jax.block_until_ready(compiled(keys))
        timings.append(time.perf_counter() - started)
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(results))]
    np.savez(outputs, *leaves)
    digest = hashlib.sha256()
    for leaf in leaves:
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return {"compile_seconds": round(compile_seconds, 2),
            "run_seconds": round(min(timings[1:]), 3),
            "fingerprint": digest.hexdigest()[:16]}


def max_difference(first: str, other: str) -> float:
    """The largest absolute difference between two children's saved outputs (floats)."""
    import numpy as np

    with np.load(first) as a, np.load(other) as b:
        return max((float(np.max(np.abs(a[name].astype(np.float64) - b[name])))
                    for name in a.files if a[name].size and a[name].dtype.kind == "f"),
                   default=0.0)


def in_child(algorithm: str, level: int, population: int, repeats: int, outputs: str,
             total_timesteps: int | None, xla_flags: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(XLA_FLAGS=f"--xla_backend_optimization_level={level} {xla_flags}".strip(),
               JAX_ENABLE_COMPILATION_CACHE="false", JAX_NUM_CPU_DEVICES="1",
               TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run(
        [sys.executable, __file__, "--child", algorithm, str(population), str(repeats),
         outputs, str(total_timesteps or 0)],
        env=env, capture_output=True, text=True,
    )
    if child.returncode != 0:  # the child's own error (say, a setting its config refuses)
        raise SystemExit(f"{algorithm} at level {level} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        algorithm, population, repeats, outputs, total = sys.argv[2:7]
        print(json.dumps(measure(algorithm, int(population), int(repeats), outputs,
                                 int(total) or None)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[3, 1],
                        help="XLA backend optimisation levels; ratios are against the first")
    parser.add_argument("--algorithms", nargs="+", default=list(SETTINGS),
                        choices=list(SETTINGS))
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-timesteps", type=int, default=None,
                        help="steps per agent for every learner (default: SETTINGS)")
    parser.add_argument("--xla-flags", default="",
                        help="more XLA_FLAGS for every child, after the level (default: none)")
    args = parser.parse_args()
    if not 0 <= min(args.levels) <= max(args.levels) <= 3:
        parser.error("--levels: XLA's backend optimisation levels are 0 to 3")

    results = {}
    folder = tempfile.mkdtemp(prefix="compile_time_")
    for algorithm in args.algorithms:
        outputs = [os.path.join(folder, f"{algorithm}_{index}.npz")
                   for index in range(len(args.levels))]
        rows = []
        for level, path in zip(args.levels, outputs, strict=True):
            rows.append({"level": level, **in_child(algorithm, level, args.population,
                                                    args.repeats, path,
                                                    args.total_timesteps, args.xla_flags)})
            print(json.dumps({algorithm: rows[-1]}), file=sys.stderr, flush=True)
        first = rows[0]
        for row, path in zip(rows, outputs, strict=True):
            row["compile_ratio_first_over_this"] = round(
                first["compile_seconds"] / row["compile_seconds"], 2)
            row["run_ratio_first_over_this"] = round(
                first["run_seconds"] / row["run_seconds"], 2)
            row["identical_to_first"] = row["fingerprint"] == first["fingerprint"]
            row["max_difference_to_first"] = max_difference(outputs[0], path)
        results[algorithm] = rows

    shutil.rmtree(folder)
    import jax
    from _per_device import cpu  # beside this script

    print(json.dumps({
        "benchmark": "compile_time",
        "command": "python " + " ".join(["benchmarks/compile_time.py", *sys.argv[1:]]),
        **cpu(),
        "jax": jax.__version__,
        "population": args.population,
        "xla_flags": args.xla_flags,
        "settings": {name: settings_for(name, args.total_timesteps)
                     for name in args.algorithms},
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
