"""Subprocess of ``tests/test_distributed.py``: one process of a ``metarl --distributed``
command, reporting what this process saw.

Usage: ``python tests/_distributed_worker.py REPORT [metarl arguments...]``. It runs the
command line (:func:`metarl.cli.main`) unchanged and keeps a JSON object in the file
``REPORT``, written before the command starts and again after every generation it records
(``metarl --distributed`` ends its process itself once every process has finished): this
process's rank, process count and devices, every generation it recorded (the generation's
fitness and the ES mean after it, as this process holds them) and how many programs the
jitted generation step was traced into. Only process 0 writes a run's files,
so without this report the other processes' view could not be checked. ``RunLedger.record``
is wrapped here; nothing in metarl itself changes.

With ``WORKER_SIGNAL_AFTER=N`` in its environment, the process sends itself SIGTERM once it
has recorded generation ``N`` (and gives the signal a moment to be noticed), as a scheduler
that signals one process of a job would.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

import jax
import numpy as np

from metarl import distributed
from metarl.cli import main
from metarl.runs import engine

report: dict = {"generations": []}
record_step = engine.RunLedger.record


def write_report() -> None:
    path = sys.argv[1]
    with open(f"{path}.tmp", "w") as handle:
        json.dump(report, handle)
    os.replace(f"{path}.tmp", path)


def record_and_report(ledger, state, record, seconds):
    line = record_step(ledger, state, record, seconds)
    report.update(
        process_index=distributed.process_index(),
        process_count=distributed.process_count(),
        is_primary=distributed.is_primary(),
        local_devices=jax.local_device_count(),
        devices=jax.device_count(),
        step_programs=ledger.program.evolution.step._cache_size(),
    )
    # The flat ES mean is a replicated array: each process reads its own copy, no computation
    mean = np.asarray(jax.device_get(state.es_state.mean), np.float64)
    report["generations"].append({"generation": line["generation"],
                                  "fitness": line["fitness"], "mean": mean.tolist()})
    write_report()
    if line["generation"] == int(os.environ.get("WORKER_SIGNAL_AFTER") or 0):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the stop's watcher thread takes the signal meanwhile
    return line


if __name__ == "__main__":
    # A hang prints every thread's stack and exits, so the test fails with a reason.
    faulthandler.dump_traceback_later(float(os.environ.get("WORKER_WATCHDOG", "360")),
                                      exit=True)
    engine.RunLedger.record = record_and_report
    write_report()
    code = main(sys.argv[2:])
    write_report()  # reached only without --distributed
    sys.exit(code)
