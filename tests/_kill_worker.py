"""Subprocess for the crash tests: run `metarl run`, optionally freezing inside a save.

Usage: ``python _kill_worker.py PAUSE_AT_STEP [run] metarl-run-args...``.

With ``PAUSE_AT_GENERATION > 0`` the orbax save of that generation stops after its files are
written into orbax's temporary directory and before the checkpoint is committed, prints
``PAUSED_IN_SAVE`` and sleeps, so the test can SIGKILL the process in the middle of a save.
With ``METARL_TEST_PAUSE_WITHIN`` set, only a save
inside a directory of that name pauses (one seed of a joint run). Nothing in metarl itself is
changed: only orbax's handler is wrapped, here.
"""

import os
import sys
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

args = sys.argv[2:]
sys.exit(main(args if args[:1] == ["run"] else ["run", *args]))
