"""metarl: discover RL objectives by evolution; train populations of agents in one jit.

Importing metarl exposes one JAX CPU device per core when JAX has not started yet
(:func:`metarl.sharding.use_cpu_cores`), so sharded runs use every core of a CPU machine
without further setup. Choose another count with ``JAX_NUM_CPU_DEVICES``, or by calling
``use_cpu_cores(n)`` before JAX's first computation.
"""

from metarl.sharding import use_cpu_cores


def _use_cpu_cores_if_unstarted() -> None:
    try:
        use_cpu_cores()
    except RuntimeError:
        pass  # JAX already computes in this process: its devices stay as they are


_use_cpu_cores_if_unstarted()

__all__ = ["use_cpu_cores"]
