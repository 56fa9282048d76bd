"""``python -m metarl.discoveries.zoo [--rebuild] [--results DIR]``: list the zoo, or
regenerate its files from the run directories under ``docs/results/``."""

from __future__ import annotations

import argparse
import sys

from metarl.discoveries.zoo import MAX_ZOO_BYTES, RESULTS_DIR, listing, rebuild


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metarl.discoveries.zoo")
    parser.add_argument("--rebuild", action="store_true",
                        help="export every entry again from its run directory")
    parser.add_argument("--results", default=str(RESULTS_DIR),
                        help=f"the folder of run directories (default {RESULTS_DIR})")
    args = parser.parse_args(argv)
    if args.rebuild:
        written = rebuild(args.results)
        total = sum(path.stat().st_size for path in written)
        for path in written:
            print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB)")
        print(f"the zoo: {total / 1024:.1f} KiB (at most {MAX_ZOO_BYTES / 1024:.0f} KiB)")
        if total > MAX_ZOO_BYTES:
            print("the zoo is over its size limit", file=sys.stderr)
            return 1
    for text in listing():
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
