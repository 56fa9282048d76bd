"""Subprocess for the crash tests: run `metarl run`, optionally freezing inside a save or a
generation.

Usage: ``python _kill_worker.py PAUSE_AT_STEP [run] metarl-run-args...``.

With ``PAUSE_AT_GENERATION > 0`` the orbax save of that generation stops after its files are
written into orbax's temporary directory and before the checkpoint is committed, prints
``PAUSED_IN_SAVE`` and sleeps, so the test can SIGKILL the process in the middle of a save.
With ``METARL_TEST_PAUSE_WITHIN`` set, only a save
inside a directory of that name pauses (one seed of a joint run).

With ``METARL_TEST_PAUSE_IN_GENERATION = N`` an evolution run stops inside generation ``N``
instead: its jitted step (every rung of it, with ``es.rungs > 1``: the rungs are one
program) has been dispatched and nothing of it is written yet (no line in
``metrics.jsonl``, no meta-parameter files, no checkpoint ``N``); the worker prints
``PAUSED_IN_GENERATION`` and sleeps, so the test can SIGKILL it there. The engine writes
generation ``N - 1``'s line and checkpoint while generation ``N`` computes, so the pause
waits until they are written before it says so.

Nothing in metarl itself is changed: only orbax's handler, the evolution program's
``step`` and the engine's ``RunLedger.write`` are wrapped, here.
"""

import os
import sys
import threading
import time

import orbax.checkpoint as ocp

from metarl.cli import main

pause_at = int(sys.argv[1])
within = os.environ.get("METARL_TEST_PAUSE_WITHIN", "")  # only a save inside this directory
original_finalize = ocp.StandardCheckpointHandler.finalize


def finalize_then_freeze(self, directory):
    original_finalize(self, directory)
    tmp_dir = directory.parent.name  # "<step>.orbax-checkpoint-tmp-<n>"
    if ("orbax-checkpoint-tmp" in tmp_dir and int(tmp_dir.split(".")[0]) == pause_at
            and (not within or within in directory.parts)):
        print("PAUSED_IN_SAVE", flush=True)
        time.sleep(600)


if pause_at > 0:
    ocp.StandardCheckpointHandler.finalize = finalize_then_freeze

pause_in_generation = int(os.environ.get("METARL_TEST_PAUSE_IN_GENERATION") or 0)
if pause_in_generation > 0:
    from metarl.evolve.kind import EvolveProgram
    from metarl.runs import engine

    original_step = EvolveProgram.step
    original_write = engine.RunLedger.write
    previous_written = threading.Event()

    def write_then_note(self):
        step = self.done_steps if self.pending is not None else None
        original_write(self)
        if step == pause_in_generation - 1:
            previous_written.set()

    def step_then_freeze(self, state):
        # the state before the step is ready (the engine waited for it): reading its
        # generation does not wait for the step dispatched below
        generation = self.completed(state) + 1
        state, record = original_step(self, state)
        if generation == pause_in_generation:
            if generation > 1:
                previous_written.wait(600)
            print("PAUSED_IN_GENERATION", flush=True)
            time.sleep(600)
        return state, record

    engine.RunLedger.write = write_then_note
    EvolveProgram.step = step_then_freeze

args = sys.argv[2:]
sys.exit(main(args if args[:1] == ["run"] else ["run", *args]))
