"""``metarl export RUN_DIR``: write an evolution run's discovery as one portable file.

The file (:mod:`metarl.discoveries.fileformat`) holds the candidate's meta-parameters and
its card (:mod:`metarl.discoveries.card`); by default it is written to
``./<experiment name>-<which>.npz`` in the current folder, and an existing file is never
replaced unless asked (``force``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarl.discoveries.card import discovery_of
from metarl.discoveries.fileformat import discovery_bytes, write_discovery
from metarl.runs.layout import CONFIG_FILE, RunError, read_json


@dataclass(frozen=True)
class Exported:
    """What :func:`export_run` wrote.

    Attributes:
        path: the file.
        card: its card, as written.
        size: its size in bytes.
    """

    path: Path
    card: dict[str, Any]
    size: int


def default_path(run_dir: str | Path, which: str = "mean") -> Path:
    """``./<experiment name>-<which>.npz`` (the name from the run's ``config.json``)."""
    data = read_json(Path(run_dir) / CONFIG_FILE)
    name = data.get("name") if isinstance(data, dict) else None
    return Path(f"{name or Path(run_dir).name}-{which}.npz")


def export_bytes(run_dir: str | Path, which: str = "mean", caveats: Sequence[str] = ()
                 ) -> tuple[bytes, dict[str, Any]]:
    """The discovery file of ``run_dir``'s ``which`` candidate as bytes, and its card;
    nothing is written (:func:`~metarl.discoveries.card.discovery_of` says what is
    refused)."""
    meta_params, card = discovery_of(run_dir, which, caveats)
    return discovery_bytes(meta_params, card)


def export_run(run_dir: str | Path, which: str = "mean", out: str | Path | None = None,
               force: bool = False, caveats: Sequence[str] = ()) -> Exported:
    """Write the discovery file of ``run_dir``'s ``which`` candidate to ``out`` (default
    :func:`default_path`).

    Raises:
        RunError: ``out`` exists and ``force`` is false, or its folder does not; or what
            :func:`~metarl.discoveries.card.discovery_of` refuses (a parent of replicated
            runs, a run of another kind, a missing meta-parameters file).
    """
    path = Path(out) if out is not None else default_path(run_dir, which)
    if path.exists() and not force:
        raise RunError(f"{path} exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise RunError(f"cannot write {path}: folder {path.parent} does not exist")
    meta_params, card = discovery_of(run_dir, which, caveats)
    try:
        written = write_discovery(path, meta_params, card, force=force)
    except FileExistsError:
        raise RunError(f"{path} exists; pass --force to overwrite it") from None
    return Exported(path, written, path.stat().st_size)


def summary(exported: Exported) -> str:
    """One line: what the file holds and how it was judged."""
    card = exported.card
    objective = card["objective"]
    tree = card["meta_params"]["tree"]
    numbers = sum(_count(entry["shape"]) for entry in tree)
    found = card["found_under"]
    verdicts = card["verdicts"]
    judged = (f"{len(verdicts['comparisons'])} comparisons in {verdicts['evaluations']} "
              "evaluation(s)" if verdicts["evaluations"] else "not evaluated")
    return (f"{card['name']} ({card['candidate']} candidate, generation "
            f"{card['generation']}): objective {objective['name']} filling "
            f"{'+'.join(objective['slots'])}, {numbers} numbers in {len(tree)} arrays, found "
            f"on {', '.join(found['environments'])} with {', '.join(found['algorithms'])}; "
            f"{judged}; {exported.size / 1024:.1f} KiB")


def _count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count
