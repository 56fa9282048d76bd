"""metarl: discover RL objectives by evolution; train populations of agents in one jit.

Importing metarl (or any of its modules) changes no JAX or XLA setting and starts no JAX
computation. On a CPU, JAX exposes one device unless asked for more: the ``metarl`` command
exposes one per core (``--cpu-devices``), and a script or notebook that wants its sharded
populations on every core calls :func:`use_cpu_cores` first, before anything computes with
JAX::

    import metarl
    metarl.use_cpu_cores()          # one CPU device per core (or use_cpu_cores(n))

Runs of every kind start, continue, evaluate and draw through :mod:`metarl.kinds`.
A discovery (a file ``metarl export`` wrote, a run directory, or ``"zoo:<name>"``) loads as
plain JAX functions with :func:`load_objective` (:mod:`metarl.discoveries.load`), which is
imported on first use, so that importing ``metarl`` stays cheap.
"""

from metarl.sharding import use_cpu_cores

__all__ = ["load_objective", "use_cpu_cores"]


def __getattr__(name: str):
    if name == "load_objective":
        from metarl.discoveries.load import load_objective

        return load_objective
    raise AttributeError(f"module 'metarl' has no attribute {name!r}")
