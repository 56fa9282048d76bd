"""Execute the notebooks with their default knobs and save the executed copies, figures
included, to ``docs/notebooks/``, so that readers of the repository see every figure
without running anything.

    python notebooks/render.py                 # every notebook
    python notebooks/render.py 01_quickstart   # some of them

Each copy records the SHA-256 of its source notebook's cells (``metadata.metarl.source``);
``tests/test_notebooks.py`` checks that every copy matches its source, so a notebook edited
without rendering it again fails the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks"
RENDERED = ROOT / "docs" / "notebooks"
CELL_TIMEOUT = 1800


def source_digest(path: Path) -> str:
    """SHA-256 of a notebook's cell types and sources (not of outputs or metadata)."""
    notebook = json.loads(path.read_text())
    cells = [(cell["cell_type"], "".join(cell["source"])) for cell in notebook["cells"]]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


def render(path: Path) -> Path:
    """Execute ``path`` in a fresh ``python3`` kernel started in ``notebooks/`` (the
    notebooks write their runs to temporary folders) and write the executed copy to
    ``docs/notebooks/``."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # figures inline
    NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(SOURCES)}}, env=env).execute()
    notebook.metadata["metarl"] = {"source": source_digest(path)}
    RENDERED.mkdir(parents=True, exist_ok=True)
    out = RENDERED / path.name
    nbformat.write(notebook, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    args = parser.parse_args(argv)
    paths = sorted(SOURCES.glob("*.ipynb"))
    if args.names:
        wanted = {name.removesuffix(".ipynb") for name in args.names}
        unknown = wanted - {p.stem for p in paths}
        if unknown:
            parser.error(f"no such notebook: {', '.join(sorted(unknown))}; available: "
                         f"{', '.join(p.stem for p in paths)}")
        paths = [p for p in paths if p.stem in wanted]
    for path in paths:
        started = time.perf_counter()
        out = render(path)
        print(f"{out.relative_to(ROOT)}  ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
