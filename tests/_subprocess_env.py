"""Environment for the subprocesses and notebook kernels that tests start.

The root conftest.py points JAX's persistent compilation cache at one directory for the whole
session; passing it on lets a child process reuse what the session already compiled.
"""

import os


def jax_cache_env() -> dict[str, str]:
    """Variables that turn on the session's persistent compilation cache in a child."""
    return {
        "JAX_COMPILATION_CACHE_DIR": os.environ["JAX_COMPILATION_CACHE_DIR"],
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        # XLA logs a spurious CPU-feature mismatch for every program it loads from a cache
        # that was built on this very host; keep those lines out of the output.
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
