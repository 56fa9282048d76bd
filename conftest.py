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
os.environ.setdefault("MPLBACKEND", "Agg")
# Cache entries built on this very host make XLA log a spurious CPU-feature mismatch.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
