"""Run one experiment as several processes (hosts) with :mod:`jax.distributed`.

Every process runs the same program on the same config. After :func:`initialize`,
``jax.devices()`` lists the devices of *all* processes, so a run with ``run.shard = true``
splits each generation's population over every device of every host
(:mod:`metarl.sharding`); every process computes the same (replicated) ES state, so only
the training runs are divided and their metrics gathered. Every process must run the same
JAX computations in the same order (including orbax checkpoint saves, which process 0
writes); only process 0 should write other files (:func:`is_primary`). :func:`barrier`
and :func:`agree` help keep the processes in step.

Settings, from the arguments of :func:`initialize` or else the environment:

- ``METARL_COORDINATOR``: ``host:port`` of process 0's coordinator service;
- ``METARL_NUM_PROCESSES``: how many processes take part;
- ``METARL_PROCESS_ID``: this process's rank, ``0 .. num_processes - 1``;
- ``METARL_LOCAL_DEVICE_IDS``: optional comma-separated local devices this process uses,
  or ``all``.

When none is given, :func:`jax.distributed.initialize` auto-detects the cluster (SLURM,
Open MPI, Kubernetes, Cloud TPU). Under SLURM with one task per node, every GPU of the node
is used (JAX alone would give each process one GPU). From the shell, the command line's
``--distributed`` flag calls :func:`initialize` first::

    srun metarl --distributed evolve experiments/x.toml
"""

from __future__ import annotations

import os

import jax

ENV_COORDINATOR = "METARL_COORDINATOR"
ENV_NUM_PROCESSES = "METARL_NUM_PROCESSES"
ENV_PROCESS_ID = "METARL_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "METARL_LOCAL_DEVICE_IDS"


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None


def _parse_device_ids(raw: str, source: str) -> list[int]:
    if raw.strip().lower() == "all":
        return []
    try:
        return [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"{source}: expected comma-separated integers or 'all', got {raw!r}"
        ) from None


def _slurm_one_task_per_node() -> bool:
    """Whether SLURM started exactly one task on every node of this step.

    ``SLURM_STEP_TASKS_PER_NODE`` (or ``SLURM_TASKS_PER_NODE``) reads like ``1(x4)`` or
    ``2,1``: tasks per node, ``(xN)`` repeating the count over N nodes.
    """
    raw = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get(
        "SLURM_TASKS_PER_NODE", "")
    counts = [entry.split("(")[0].strip() for entry in raw.split(",") if entry.strip()]
    return bool(counts) and all(count == "1" for count in counts)


def is_initialized() -> bool:
    """Whether :func:`jax.distributed.initialize` has run in this process."""
    return jax.distributed.is_initialized()


def resolve_settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: list[int] | str | None = None,
) -> dict:
    """The keyword arguments :func:`initialize` passes to :func:`jax.distributed.initialize`.

    Arguments left ``None`` come from the ``METARL_*`` environment variables; the three
    of coordinator, process count and process id must be all set or all unset (unset: JAX
    detects the cluster). ``local_device_ids="all"`` (or ``METARL_LOCAL_DEVICE_IDS=all``)
    gives this process every local device, as does a SLURM step with one task per node:
    JAX's SLURM detection would otherwise give each process only the GPU numbered
    ``SLURM_LOCALID`` (right for one process per GPU, wrong for one per node).
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_int(ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(ENV_PROCESS_ID)
    if isinstance(local_device_ids, str):
        local_device_ids = _parse_device_ids(local_device_ids, "local_device_ids")
    elif local_device_ids is None and os.environ.get(ENV_LOCAL_DEVICE_IDS, "").strip():
        local_device_ids = _parse_device_ids(os.environ[ENV_LOCAL_DEVICE_IDS],
                                             ENV_LOCAL_DEVICE_IDS)
    elif local_device_ids is None and "SLURM_LOCALID" in os.environ \
            and _slurm_one_task_per_node():
        local_device_ids = []  # every local device (JAX treats an empty list as no limit)
    given = [v is not None for v in (coordinator_address, num_processes, process_id)]
    if any(given) and not all(given):
        raise ValueError(
            "distributed: set all of coordinator address, number of processes and process id "
            f"(arguments or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}), or none "
            "of them to let JAX detect the cluster"
        )
    if num_processes is not None:
        if num_processes < 1:
            raise ValueError(f"num_processes: must be positive, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ValueError(
                f"process_id: must lie in 0..{num_processes - 1}, got {process_id}"
            )
    return {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
        "local_device_ids": local_device_ids,
    }


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: list[int] | str | None = None,
    cpu_collectives: str | None = "gloo",
    initialization_timeout: int = 300,
    coordinator_bind_address: str | None = None,
) -> None:
    """Join this process to a multi-process JAX run; call before any other JAX work.

    Arguments left ``None`` come from the ``METARL_*`` environment variables (module
    docstring); if those are unset too, JAX auto-detects the cluster (e.g. SLURM's
    ``SLURM_*`` variables under ``srun``). A second call does nothing. See
    :func:`resolve_settings` for the rules.

    Args:
        coordinator_address: ``host:port`` of process 0 (reachable from every process).
        num_processes: number of processes in the run.
        process_id: this process's rank.
        local_device_ids: restrict this process to these local devices; ``"all"``: none
            hidden.
        cpu_collectives: collectives backend for CPU devices (``"gloo"``; ``None`` keeps
            JAX's default). GPUs use NCCL whatever this says.
        initialization_timeout: seconds to wait for every process to join.
        coordinator_bind_address: where process 0's coordinator listens (JAX's default:
            every interface, or ``JAX_COORDINATOR_BIND_ADDRESS``), e.g. ``127.0.0.1:PORT``
            for a single-machine run.
    """
    if is_initialized():
        return
    settings = resolve_settings(coordinator_address, num_processes, process_id,
                                local_device_ids)
    if cpu_collectives is not None:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    # JAX's preemption service catches SIGTERM in C++ for a protocol metarl does not use
    # (multihost_utils.reached_preemption_sync_point); runs stop on SIGTERM through
    # metarl.runs.stopping, whose processes agree at every step. Left on, it would swallow
    # a SIGTERM that arrives before a run installs its handler (the job would then run on
    # until SIGKILL), and it keeps a key-value request of every process pending at the
    # coordinator until shutdown.
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(
        **settings,
        initialization_timeout=initialization_timeout,
        coordinator_bind_address=coordinator_bind_address,
    )


def shutdown() -> None:
    """Leave the multi-process run (a no-op when not initialised)."""
    if is_initialized():
        jax.distributed.shutdown()


def process_index() -> int:
    """This process's rank (0 without distributed mode)."""
    return jax.process_index()


def process_count() -> int:
    """Number of processes in the run (1 without distributed mode)."""
    return jax.process_count()


def is_primary() -> bool:
    """True on the one process that should write run files and print summaries."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier called ``name`` (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def largest(value: int) -> int:
    """The largest of every process's ``value`` (``value`` itself for one process): how
    processes that each may have a reason to stop agree on one (:mod:`metarl.runs.stopping`)."""
    if jax.process_count() == 1:
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray([value], np.int32))
    return int(np.max(np.asarray(gathered)))


def agree(text: str, max_bytes: int = 4096) -> str:
    """Process 0's ``text`` on every process (e.g. a run directory named by the clock)."""
    if jax.process_count() == 1:
        return text
    import numpy as np
    from jax.experimental import multihost_utils

    data = text.encode()
    if len(data) > max_bytes:
        raise ValueError(f"agree: {len(data)} bytes of text exceed max_bytes={max_bytes}")
    buffer = np.zeros(max_bytes + 4, np.uint8)
    buffer[:4] = np.frombuffer(np.uint32(len(data)).tobytes(), np.uint8)
    buffer[4:4 + len(data)] = np.frombuffer(data, np.uint8)
    shared = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    size = int(np.frombuffer(shared[:4].tobytes(), np.uint32)[0])
    return shared[4:4 + size].tobytes().decode()
