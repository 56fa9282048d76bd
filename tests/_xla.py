"""The XLA settings of the suite and of the tests that train for long.

The root ``conftest.py`` compiles everything at XLA's backend optimisation level 0 without
its "fusion emitters": the tiny programs that most tests run compile 2-5 times faster
(a tiny evolution generation: 10.6 s of compile CPU at level 1, 2.1 s so), and run slower,
which only matters where a test trains for long. Those tests, and those that check bit-for-bit
equalities the library promises under its default code generation, ask for it back here.
"""

from __future__ import annotations

import os

# What the learning checks compile with: level 1 (as fast to run as the default level 3,
# a third quicker to compile) and XLA's default code generation.
LEARNING_XLA_FLAGS = "--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=true"
LEARNING_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1,
                             "xla_cpu_use_fusion_emitters": True}
# Level 0 (quick to compile) with the default code generation, whose results the
# train == init + advance equalities are stated for.
EXACT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0,
                          "xla_cpu_use_fusion_emitters": True}
_SUITE_FLAGS = ("--xla_backend_optimization_level", "--xla_cpu_use_fusion_emitters")


def learning_env() -> dict[str, str]:
    """This process's environment with the learning checks' XLA flags in place of the
    suite's (other flags, such as a device count, are kept)."""
    env = dict(os.environ)
    kept = [flag for flag in env.get("XLA_FLAGS", "").split()
            if not flag.startswith(_SUITE_FLAGS)]
    env["XLA_FLAGS"] = " ".join([*kept, LEARNING_XLA_FLAGS])
    return env
