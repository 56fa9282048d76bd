"""Send a run's metrics and figures to the experiment trackers people already use.

Two trackers, each an optional extra that metarl never requires:

- ``"tensorboard"`` (``pip install "metarl[tensorboard]"``): event files in
  ``<run_dir>/tensorboard``; ``tensorboard --logdir <run_dir>`` shows them.
- ``"wandb"`` (``pip install "metarl[wandb]"``): a Weights & Biases run. Without network or
  an account, ``WANDB_MODE=offline`` (the default here unless ``WANDB_MODE`` is set) writes
  it to ``<run_dir>/wandb``, to upload later with ``wandb sync``.

Every tracker takes scalar metrics per step (generation or segment) and figures as PNG
files; lists in the metrics (a value per candidate) are summarised by their mean, min and
max, and non-numbers are left out.

Runs switch them on with ``run.trackers = ["tensorboard", "wandb"]`` in the experiment
file or ``--track NAME`` on the command line; :class:`RunTrackers` is what a run kind's
loop calls. A resumed run keeps writing to the same TensorBoard folder and the same W&B run
(its id is kept in ``<run_dir>/wandb-run-id``).
"""

from __future__ import annotations

import importlib
import math
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from metarl.config import TRACKERS
from metarl.runs.layout import RunError

EXTRAS = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb")}


class TrackerError(RunError):
    """A tracker was asked for that this installation cannot provide (the command line
    exits with code 2, as for other setup errors)."""


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def log_figure(self, step: int, name: str, path: Path) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers in ``metrics`` as ``name -> float``: nested mappings become
    ``outer/inner``, lists of numbers their ``/mean``, ``/min`` and ``/max`` (finite
    entries only); booleans count as 0/1; everything else is left out."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(scalars(value, f"{name}/"))
        elif isinstance(value, bool | int | float):
            flat[name] = float(value)
        elif isinstance(value, list | tuple) and value and all(
                isinstance(v, bool | int | float) for v in value):
            finite = [float(v) for v in value if math.isfinite(float(v))]
            if finite:
                flat[f"{name}/mean"] = sum(finite) / len(finite)
                flat[f"{name}/min"] = min(finite)
                flat[f"{name}/max"] = max(finite)
    return flat


class TensorBoardTracker:
    """Scalars and images in TensorBoard event files under ``log_dir``."""

    def __init__(self, log_dir: Path, config: Mapping[str, Any]):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(log_dir))
        self.writer.add_text("config", _as_markdown(config), 0)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in scalars(metrics).items():
            if math.isfinite(value):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_figure(self, step: int, name: str, path: Path) -> None:
        import matplotlib.image

        image = matplotlib.image.imread(path)
        self.writer.add_image(name, image[..., :3], step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run, offline unless ``WANDB_MODE`` says otherwise."""

    ID_FILE = "wandb-run-id"

    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]):
        import wandb

        self.wandb = wandb
        id_file = run_dir / self.ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "metarl"), name=name,
                              dir=str(run_dir), config=dict(config), id=run_id,
                              resume="allow", mode=os.environ.get("WANDB_MODE", "offline"),
                              reinit=True)
        if not id_file.is_file():
            id_file.write_text(run_id + "\n")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log({k: v for k, v in scalars(metrics).items() if math.isfinite(v)}, step=step)

    def log_figure(self, step: int, name: str, path: Path) -> None:
        self.run.log({name: self.wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


def check_trackers(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` if each is a known tracker whose package is installed; otherwise a
    :class:`TrackerError` naming the tracker and the extra that installs it."""
    names = tuple(names)
    for name in names:
        if name not in TRACKERS:
            raise TrackerError(f"tracker {name!r} is unknown; allowed: {', '.join(TRACKERS)}")
        module, extra = EXTRAS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise TrackerError(f"tracker {name!r} needs the {module} package: "
                               f'pip install "metarl[{extra}]"') from None
    return names


def open_trackers(names: Iterable[str], run_dir: str | Path, run_name: str,
                  config: Mapping[str, Any]) -> list[Tracker]:
    """One tracker per name, writing under ``run_dir``; ``config`` is recorded with them."""
    run_dir = Path(run_dir)
    trackers: list[Tracker] = []
    for name in check_trackers(names):
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir / "tensorboard", config))
        else:
            trackers.append(WandbTracker(run_dir, run_name, config))
    return trackers


class RunTrackers:
    """The trackers of one run, for a run kind's loop: :meth:`log` after every step
    (generation or segment), :meth:`log_figures` at the end, :meth:`close` always.

    With no names, or on a process other than the one that writes the run's files, every
    method does nothing. Opening checks every tracker first, so a missing extra is one clear
    :class:`TrackerError` before anything is trained.
    """

    def __init__(self, names: Iterable[str], run_dir: str | Path, run_name: str,
                 config: Mapping[str, Any], primary: bool = True):
        names = tuple(names)
        self.trackers = open_trackers(names, run_dir, run_name, config) if (
            names and primary) else []

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def log_figures(self, step: int, paths: Iterable[Path]) -> None:
        """Each PNG of ``paths`` under ``plots/<file name without .png>``."""
        for path in paths:
            path = Path(path)
            if path.suffix == ".png":
                for tracker in self.trackers:
                    tracker.log_figure(step, f"plots/{path.stem}", path)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def _as_markdown(config: Mapping[str, Any]) -> str:
    import json

    return "```\n" + json.dumps(config, indent=1, default=str) + "\n```"
