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
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

TRACKERS = ("tensorboard", "wandb")
EXTRAS = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb")}


class TrackerError(RuntimeError):
    """A tracker was asked for that this installation cannot provide."""


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

    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "metarl"), name=name,
                              dir=str(run_dir), config=dict(config),
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit=True)

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


def _as_markdown(config: Mapping[str, Any]) -> str:
    import json

    return "```\n" + json.dumps(config, indent=1, default=str) + "\n```"
