"""Session-wide test settings shared by every test (and the subprocesses tests start).

Compilation dominates on the CPU, so JAX's persistent compilation cache is switched on: a
program compiled once (say the tiny generation step) is reused by later tests and by the
subprocesses that the kill, CLI, sharding and notebook tests start.
"""

import os
import tempfile
from pathlib import Path

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / "metarl-test-jax-cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# XLA's backend optimisation level 1 instead of its default 3: the learners' programs
# compile about a third faster and run as fast, with the same results up to float rounding
# (benchmarks/compile_time.py). Inherited by the subprocesses and notebook kernels
# that tests start; a test that sets its own level keeps it.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1"
    ).strip()
os.environ.setdefault("MPLBACKEND", "Agg")
# Cache entries built on this very host make XLA log a spurious CPU-feature mismatch.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
