"""Session-wide test settings shared by every test (and the subprocesses tests start).

Compilation dominates on the CPU, so JAX's persistent compilation cache is switched on: a
program compiled once (say the tiny generation step) is reused by later tests and by the
subprocesses that the kill, CLI, sharding and notebook tests start.
"""

import gc
import os
import tempfile
from pathlib import Path

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / "metarl-test-jax-cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# XLA's backend optimisation level 0 and its older (non-"fusion emitter") code generation:
# the suite's tiny programs compile 2-5x faster and their results agree to float rounding;
# they run slower, which only the learning checks notice, and those ask for the defaults
# back (tests/_xla.py). Each program's machine code is generated in one piece rather than
# split for threads that a worker, kept to one core below, cannot run at once (5% less CPU
# on three algorithm files). Inherited by the subprocesses and notebook kernels tests
# start; a test that sets its own flags keeps them.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
        + " --xla_cpu_parallel_codegen_split_count=1"
    ).strip()
os.environ.setdefault("MPLBACKEND", "Agg")
# Each pytest-xdist worker keeps to its own share of the cores, and so do the subprocesses and
# notebook kernels it starts. XLA sizes its thread pools (running and compiling) by the cores a
# process may use: two workers that each spread their tiny programs over both cores spent 7%
# more wall time and 6% more CPU on the same tests (docs/guides/testing.md).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    # Tests of "one device per core" give their child processes every core back from here
    # (tests/_subprocess_env.py).
    os.environ.setdefault("METARL_TEST_CORES", ",".join(map(str, _cores)))
    _index = int(_worker[2:])
    _count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", len(_cores)))
    try:
        os.sched_setaffinity(0, _cores[_index::_count] or [_cores[_index % len(_cores)]])
    except OSError:  # a sandbox that forbids it: the workers share the cores, as before
        pass
# `metarl evaluate` keeps baseline trainings in the user's cache folder; a test session keeps
# them in a folder of its own, empty at its start, so no test reads an earlier session's.
os.environ["METARL_CACHE_DIR"] = tempfile.mkdtemp(prefix="metarl-test-trainings-")
# Cache entries built on this very host make XLA log a spurious CPU-feature mismatch.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Tracing a program makes a great many short-lived Python objects; the cyclic garbage
# collector's default (a pass every 700 net allocations) spent a fifth of the CPU of
# tests/test_run_directories.py and test_pbt_run.py (118.6 -> 96.5 user CPU-s, cold cache).
# Reference counting frees nearly all of them; cycles are still collected, only less often.
gc.set_threshold(100_000, 50, 50)
