"""Subprocess for the SIGTERM tests: ``metarl ARGS`` as the command line runs it, with its
second step held in flight.

Usage: ``python _held_step.py MODULE:PROGRAM metarl-args...`` (``PROGRAM`` the run kind's
program class, e.g. ``metarl.evolve.kind:EvolveProgram``).

Step 2 dispatches the kind's real step and then, in the same call (the engine's worker
thread), an XLA loop of small matrix products that would keep a CPU core busy for hours
(compiled during step 1); the worker prints ``HOLDING_IN_STEP 2`` just before it starts that
loop and waits for it, as a long step waits for its arrays. So a signal sent shortly after
that line lands while step 2 trains inside a jitted computation, however fast the machine,
and no step of the run needs to be slow (the test's uninterrupted reference and the resume
run the real steps only). The computation never ends by itself, so only the command
line's exit that does not wait for a step in flight (``os._exit``, as from ``python -m
metarl``) ends the process with code 4: calling ``main(argv)`` instead, whose interpreter
exit tears JAX down under the running loop, ended in SIGABRT (tried once).

Nothing in metarl itself is changed: only the program's ``step`` is wrapped, here, before
the command line runs exactly as ``python -m metarl`` runs it (``main()`` reading
``sys.argv``).
"""

import importlib
import sys

import jax
import jax.numpy as jnp

HELD_STEP = 2
module_name, class_name = sys.argv[1].split(":")
program = getattr(importlib.import_module(module_name), class_name)
original_step = program.step


def busy_for_hours(x):
    # 2**31 - 1 products of a 32 x 32 matrix: hours of one core at any CPU's speed
    return jax.lax.fori_loop(0, 2**31 - 1, lambda _, y: jnp.tanh(y @ y), x)


compiled = {}


def step_then_hold(self, state):
    # the state before the step is ready (the engine waited for it): reading its step does
    # not wait for the step dispatched below
    step = self.completed(state) + 1
    out = original_step(self, state)
    start = jnp.full((32, 32), 0.01, jnp.float32)
    if step == HELD_STEP - 1:  # JAX has started: compile the loop now, not inside step 2
        compiled["busy"] = jax.jit(busy_for_hours).lower(start).compile()
    if step == HELD_STEP:
        # printed first: on a backend that runs a computation in the dispatching thread the
        # call below does not return
        print("HOLDING_IN_STEP", step, flush=True)
        jax.block_until_ready(compiled["busy"](start))
    return out


program.step = step_then_hold

from metarl.cli import main  # noqa: E402 - after the wrap, as the command line imports it

sys.argv = ["metarl", *sys.argv[2:]]
sys.exit(main())
