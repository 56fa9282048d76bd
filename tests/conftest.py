"""Shared test fixtures and a count of XLA compilations (the process-wide settings, such as
the persistent compilation cache, live in the root ``conftest.py``).

On the CPU compilation dominates the cost of this suite (a PPO ``train`` compiles in seconds
and then runs in milliseconds), so every backend compilation is recorded through
``jax.monitoring`` and summarised at the end of the run: how many, how long in total, and
which tests paid the most (gathered from every worker when pytest-xdist runs the suite in
several processes). Tests can use the :func:`compilations` fixture to assert that
something does *not* recompile (e.g. new hyperparameter values are traced, not static).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field

import jax
import pytest
from _tiny_evolution import TINY

# The event jax records around every backend (XLA) compilation, and the one recording what
# a hit in the persistent compilation cache (switched on by the root conftest.py) saved.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"


@dataclass
class CompileLog:
    """Every backend compilation of this session: ``(test id, function name, seconds)``."""

    events: list[tuple[str, str, float]] = field(default_factory=list)
    saved_seconds: float = 0.0
    cache_hits: int = 0
    current_test: str = "<collection>"

    def record(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.events.append((self.current_test, str(kwargs.get("fun_name", "?")), duration))
        elif event == CACHE_SAVED_EVENT:
            self.cache_hits += 1
            self.saved_seconds += duration

    def count(self) -> int:
        return len(self.events)


_LOG = CompileLog()
jax.monitoring.register_event_duration_secs_listener(_LOG.record)


@pytest.fixture(scope="session")
def compilations() -> CompileLog:
    """The session's :class:`CompileLog`; compare ``count()`` before and after a call."""
    return _LOG


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _LOG.current_test = item.nodeid
    try:
        return (yield)
    finally:
        _LOG.current_test = "<fixtures>"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _LOG.current_test = item.nodeid + " (setup)"
    try:
        return (yield)
    finally:
        _LOG.current_test = "<fixtures>"


def pytest_sessionfinish(session):
    # Under pytest-xdist each worker process keeps its own log; it hands it to the
    # controlling process, which prints one summary for the whole suite.
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["compile_log"] = {
            "events": _LOG.events, "cache_hits": _LOG.cache_hits,
            "saved_seconds": _LOG.saved_seconds,
        }


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    worker_log = getattr(node, "workeroutput", {}).get("compile_log")
    if worker_log:
        _LOG.events.extend(tuple(event) for event in worker_log["events"])
        _LOG.cache_hits += worker_log["cache_hits"]
        _LOG.saved_seconds += worker_log["saved_seconds"]


def pytest_terminal_summary(terminalreporter):
    if not _LOG.events:
        return
    per_test: dict[str, list[float]] = defaultdict(list)
    for test, _, seconds in _LOG.events:
        per_test[test].append(seconds)
    total = sum(s for _, _, s in _LOG.events)
    terminalreporter.section("XLA compilations")
    terminalreporter.write_line(
        f"{len(_LOG.events)} backend compilations, {total:.1f} s in total "
        f"({_LOG.cache_hits} persistent-cache hits saved {_LOG.saved_seconds:.1f} s); "
        "costliest tests:"
    )
    ranked = sorted(per_test.items(), key=lambda kv: -sum(kv[1]))
    for test, seconds in ranked[:8]:
        terminalreporter.write_line(f"{sum(seconds):7.1f} s {len(seconds):4d} x  {test}")
    # For finding where the suite's time goes: every compilation, to a JSON file.
    dump = os.environ.get("METARL_COMPILE_LOG")
    if dump:
        with open(dump, "w") as file:
            json.dump([list(event) for event in _LOG.events], file)


@pytest.fixture(scope="session")
def key() -> jax.Array:
    """A fixed PRNG key; tests split it rather than invent seeds."""
    return jax.random.PRNGKey(0)


@pytest.fixture(scope="module")
def tiny_config_file(tmp_path_factory):
    """The tiny evolution experiment of ``tests/_tiny_evolution.py`` as a TOML file."""
    path = tmp_path_factory.mktemp("config") / "tiny.toml"
    path.write_text(TINY)
    return path
