"""Subprocess of ``tests/test_distributed.py``: one process of a multi-process generation.

``python tests/_distributed_worker.py distributed`` joins a :mod:`jax.distributed` run
configured by the ``METARL_COORDINATOR`` / ``METARL_NUM_PROCESSES`` / ``METARL_PROCESS_ID``
environment variables (gloo collectives on the CPU; the test binds the coordinator to
127.0.0.1), shards the generations of the experiment in ``_sharding_worker.experiment``
over the devices of every process, and prints one JSON object.

``python tests/_distributed_worker.py reference`` runs the same experiment in one process
on one device, without :mod:`jax.distributed`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

from metarl import distributed


def main(mode: str) -> None:
    # A hang prints every thread's stack and exits, so the test fails with a reason.
    faulthandler.dump_traceback_later(float(os.environ.get("WORKER_WATCHDOG", "250")),
                                      exit=True)
    if mode == "distributed":
        distributed.initialize(initialization_timeout=60)
    import jax
    from _sharding_worker import run_generations  # same directory as this script

    started = time.perf_counter()
    result = run_generations(shard=mode == "distributed")
    result.update(
        mode=mode,
        process_index=distributed.process_index(),
        process_count=distributed.process_count(),
        is_primary=distributed.is_primary(),
        local_devices=jax.local_device_count(),
        devices=jax.device_count(),
        total_seconds=time.perf_counter() - started,
    )
    print(json.dumps(result), flush=True)
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "distributed")
