"""Build a folder of wheels that installs metarl on a GPU machine without a package index.

A GPU machine usually comes with its own CUDA build of jax (jax, jaxlib and a
``jax-cuda12-plugin`` / ``jax-cuda13-plugin`` with its ``-pjrt``), and may reach no package
index. Run this on a machine that reaches one: it downloads, for each target Python
(``--python``, default 3.11 and 3.12; Linux x86_64 manylinux wheels), every wheel that
installing the project needs (its dependencies from ``pyproject.toml``, their
dependencies, and setuptools for the editable build), at the versions CI tests
(``.ci/constraints.txt``), then removes jax, jaxlib, the CUDA plugins and NVIDIA's
libraries (``--exclude`` more), which the GPU machine keeps its own of. ``--head-to-head``
adds what PureJaxRL's ``ppo.py`` imports beyond metarl's needs (distrax and
tensorflow-probability, for ``benchmarks/vs_purejaxrl.py``).

    python benchmarks/gpu_wheelhouse.py --out .cache/wheels
    python benchmarks/gpu_wheelhouse.py --out .cache/wheels --python 3.12 --head-to-head \
        --exclude tensorstore --split 60

On the GPU machine (folder ``wheels/cp312`` for Python 3.12)::

    pip install --dry-run --no-index --find-links wheels/cp312 -e . --report report.json
    pip install --no-index --find-links wheels/cp312 -e .
    metarl devices

The dry run's report lists what would be installed: jax, jaxlib and the plugin must not be
among it (``benchmarks/gpu_check.py`` checks that). Prints one JSON line per Python: the
folder, its wheels and their size.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what a CUDA jax install brings; the GPU machine keeps its own
KEPT_ON_TARGET = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
                  "jax-cuda13-pjrt", "nvidia-*")
# what jax itself requires, so that any machine with a jax has it
JAX_REQUIRES = ("numpy", "scipy", "ml-dtypes", "opt-einsum")
HEAD_TO_HEAD = ("distrax", "tfp-nightly")
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_34_x86_64", "linux_x86_64")


def project_requirements() -> list[str]:
    """The project's ``dependencies`` (from ``pyproject.toml``)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"]) + list(data["build-system"]["requires"])


def distribution_name(wheel: str) -> str:
    """A wheel file's project name, normalised (``jax_cuda13_plugin-0.11.2-...`` ->
    ``jax-cuda13-plugin``)."""
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def excluded(name: str, patterns) -> bool:
    for pattern in patterns:
        pattern = re.sub(r"[-_.]+", "-", pattern).lower()
        if pattern.endswith("*") and name.startswith(pattern[:-1]) or name == pattern:
            return True
    return False


def download(requirements: list[str], python: str, folder: Path) -> None:
    """``pip download`` of ``requirements`` and their dependencies, as binary wheels for
    CPython ``python`` on Linux x86_64, at CI's versions where CI pins them.

    A project the index has only as source (rliable) is built into a wheel here
    (``pip wheel --no-deps``; such projects are pure Python) and the download tried again,
    with the folder as a place to find it."""
    tag = "cp" + python.replace(".", "")
    constraints = ["-c", str(ROOT / ".ci" / "constraints.txt")]
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
               "--python-version", python, "--implementation", "cp", "--abi", tag,
               "--abi", "abi3", "--abi", "none", *constraints, "--find-links", str(folder),
               "-d", str(folder)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    built: set[str] = set()
    while True:
        out = subprocess.run(command + requirements, capture_output=True, text=True)
        if out.returncode == 0:
            return
        missing = re.search(r"No matching distribution found for (\S+)", out.stderr)
        if missing is None or missing.group(1) in built:
            sys.exit(out.stderr[-3000:])
        built.add(missing.group(1))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *constraints,
                        "-w", str(folder), missing.group(1)], check=True,
                       stdout=subprocess.DEVNULL)


def split(wheels: list[Path], limit: float) -> list[tuple[str, float]]:
    """Move ``wheels`` into subfolders ``part1``, ``part2`` ... of their folder, each at most
    ``limit`` MiB where a wheel alone is not larger (largest first, each into the first part
    it fits). Returns each part's folder and size."""
    parts: list[list] = []  # [folder, MiB]
    for wheel in sorted(wheels, key=lambda w: w.stat().st_size, reverse=True):
        size = wheel.stat().st_size / 2**20
        target = next((part for part in parts if part[1] + size <= limit), None)
        if target is None:
            target = [wheel.parent / f"part{len(parts) + 1}", 0.0]
            target[0].mkdir(exist_ok=True)
            parts.append(target)
        wheel.rename(target[0] / wheel.name)
        target[1] += size
    return [(str(folder), size) for folder, size in parts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "wheels",
                        help="the folder to fill, one subfolder per Python (cp311, cp312)")
    parser.add_argument("--python", nargs="+", default=["3.11", "3.12"])
    parser.add_argument("--head-to-head", action="store_true",
                        help="also PureJaxRL's imports (distrax, tensorflow-probability)")
    parser.add_argument("--exclude", nargs="*", default=[],
                        help="more projects the GPU machine has (names; a trailing * "
                             "matches a prefix), e.g. tensorstore where it has orbax")
    parser.add_argument("--with-jax-requirements", action="store_true",
                        help="keep numpy, scipy, ml-dtypes and opt-einsum, which any "
                             "machine with jax has (left out by default)")
    parser.add_argument("--split", type=float, default=None, metavar="MIB",
                        help="spread the wheels over subfolders part1, part2 ... of at most "
                             "MIB each (a transfer limit); install with one --find-links each")
    args = parser.parse_args()
    kept = (*KEPT_ON_TARGET, *args.exclude,
            *(() if args.with_jax_requirements else JAX_REQUIRES))
    requirements = [r for r in project_requirements()
                    if not excluded(re.split(r"[<>=!~;\[ ]", r)[0], KEPT_ON_TARGET)]
    if args.head_to_head:
        requirements += list(HEAD_TO_HEAD)
    for python in args.python:
        folder = args.out / ("cp" + python.replace(".", ""))
        folder.mkdir(parents=True, exist_ok=True)
        download(requirements, python, folder)
        removed = []
        for wheel in sorted(folder.glob("*.whl")):
            if excluded(distribution_name(wheel.name), kept):
                wheel.unlink()
                removed.append(wheel.name)
        sizes = {w.name: w.stat().st_size / 2**20 for w in folder.glob("*.whl")}
        parts = split(sorted(folder.glob("*.whl")), args.split) if args.split else []
        print(json.dumps({
            "python": python, "folder": str(folder), "wheels": len(sizes),
            "mebibytes": round(sum(sizes.values()), 1),
            "parts": [f"{part} {size:.1f} MiB" for part, size in parts],
            "removed": removed,
            "largest": [f"{name} {size:.1f} MiB" for name, size in
                        sorted(sizes.items(), key=lambda item: -item[1])[:8]],
        }))


if __name__ == "__main__":
    main()
