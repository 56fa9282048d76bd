"""Run by every Python process the test suite starts, and by the suite itself.

The root conftest.py puts this folder first on ``PYTHONPATH``, so Python imports this module
at start-up in each CLI run, worker and notebook kernel a test starts; conftest.py runs it
for the pytest process.

Tracing a JAX program makes a great many short-lived Python objects, and the cyclic garbage
collector's default (a pass every 700 net allocations) spent a fifth of the CPU of
tests/test_run_directories.py and test_pbt_run.py (118.6 -> 96.5 user CPU-s, cold cache).
Reference counting frees nearly all of those objects; cycles are still collected, only less
often.
"""

import gc

gc.set_threshold(100_000, 50, 50)
