"""Environment for the subprocesses and notebook kernels that tests start.

The root conftest.py points JAX's persistent compilation cache at one directory for the whole
session; passing it on lets a child process reuse what the session already compiled.
"""

import os
import subprocess
import sys
from pathlib import Path


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


def every_core() -> set[int]:
    """The cores this test session was given, before the root conftest.py kept each
    pytest-xdist worker (and the children it starts) to its own share of them."""
    named = os.environ.get("METARL_TEST_CORES")
    return {int(core) for core in named.split(",")} if named else os.sched_getaffinity(0)


def on_every_core(code: str) -> str:
    """Python source that gives its process every core of the session back, then runs
    ``code`` (top-level statements): for the tests of one JAX device per core, which a
    worker's single core would make vacuous. (A ``preexec_fn`` would fork the threaded
    test process, which can deadlock.)"""
    return (f"import os\ntry:\n    os.sched_setaffinity(0, {sorted(every_core())})\n"
            f"except OSError:\n    pass  # never kept to fewer (root conftest.py)\n{code}")


def module_on_every_core(module: str, *args: str) -> list[str]:
    """The arguments of ``python -m module *args`` run :func:`on_every_core`."""
    argv = [module, *args]
    return [sys.executable, "-c", on_every_core(
        f"import runpy, sys\nsys.argv = {argv!r}\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")]


def env_without_device_count(**extra: str) -> dict[str, str]:
    """This process's environment minus any CPU device count the user set, plus ``extra``:
    a child then chooses its own count (the ``metarl`` CLI: one device per core). Other
    ``XLA_FLAGS`` (the suite's optimisation level) are passed on."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    env["XLA_FLAGS"] = " ".join(flag for flag in env.pop("XLA_FLAGS", "").split()
                                if not flag.startswith("--xla_force_host_platform_device_count"))
    return {**env, **extra}


def start_worker(script: Path, args: list[str], env: dict[str, str], logs: Path,
                 name: str) -> subprocess.Popen:
    """Start ``python script *args`` with its output in ``logs/name.{out,err}`` files.

    Files, not pipes: a worker that prints more than a pipe holds would block mid-run.
    The files are closed with the process (``process.logs``).
    """
    out = open(logs / f"{name}.out", "w")  # noqa: SIM115 - closed when the process ends
    err = open(logs / f"{name}.err", "w")  # noqa: SIM115
    process = subprocess.Popen([sys.executable, str(script), *args], env=env,
                               cwd=script.parent, stdout=out, stderr=err)
    process.logs = (out, err)
    return process


def stop_workers(processes: dict[str, subprocess.Popen]) -> None:
    """Kill any worker still running and close every worker's log files."""
    for process in processes.values():
        if process.poll() is None:
            process.kill()
            process.wait()
        for log in process.logs:
            log.close()
