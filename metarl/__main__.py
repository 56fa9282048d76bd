"""``python -m metarl ...``: the same command line as ``metarl ...``."""

import sys

from metarl.cli import main

sys.exit(main())
