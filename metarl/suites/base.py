"""The shape of a suite: :class:`SuiteTask`, :class:`Suite` and the registry they go in."""


from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metarl.config import ConfigError, build_inner

__all__ = ["Suite", "SuiteTask", "register_suite", "registered", "same_settings"]

TRAIN, TEST = "train", "test"


@dataclass(frozen=True)
class SuiteTask:
    """One environment of a suite.

    Attributes:
        label: the task's name in tables and records (its ``env_id``).
        inner: the ``[inner]`` table it trains with: ``env_id``, ``env_params`` and the
            algorithm's settings (``algorithm`` defaults to ``"ppo"``).
        source: where the settings come from (a public config, or a calibration record
            under ``docs/results/``).
        ceiling: the best return an episode can give, where known (calibration measures
            the room tuned PPO leaves below it).
    """

    label: str
    inner: Mapping[str, Any]
    source: str
    ceiling: float | None = None

    def config(self, settings: Mapping[str, Any] | None = None) -> Any:
        """The task's ``[inner]`` config, with ``settings`` (field -> value) on top."""
        return build_inner({**self.inner, **(settings or {})}, f"suite task {self.label}")


def same_settings(env_ids: tuple[str, ...], settings: Mapping[str, Any], source: str
                  ) -> tuple[SuiteTask, ...]:
    """Tasks that differ only in their environment: each labelled by its ``env_id``,
    trained with ``settings``."""
    return tuple(SuiteTask(env_id, {"env_id": env_id, **settings}, source)
                 for env_id in env_ids)


@dataclass(frozen=True)
class Suite:
    """A named, versioned list of environments (module docstring).

    Attributes:
        name, version: how records and tables name it.
        description: one line for ``metarl suites``.
        train: the meta-train side (an experiment's ``[[inner]]`` tasks).
        test: the meta-test side (its ``[[held_out]]`` tasks).
        device: ``"cpu"`` (sized for a 2-core CPU) or ``"gpu"``.
        extra: the pip extra its environments need (``"brax"``), or ``None``.
        modules: Python modules its environments import (checked before training).
        calibration: the record showing its budgets leave room below the ceiling.
    """

    name: str
    version: int
    description: str
    train: tuple[SuiteTask, ...]
    test: tuple[SuiteTask, ...]
    device: str = "cpu"
    extra: str | None = None
    modules: tuple[str, ...] = ()
    calibration: str | None = None

    @property
    def tasks(self) -> tuple[SuiteTask, ...]:
        """Every task: the meta-train side, then the meta-test side."""
        return self.train + self.test

    def side(self, label: str) -> str:
        """``"train"`` or ``"test"``: the side task ``label`` is on."""
        return TRAIN if label in {task.label for task in self.train} else TEST

    def configs(self, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{label: [inner] config}`` of every task (``settings`` on top of each)."""
        self.check_installed()
        return {task.label: task.config(settings) for task in self.tasks}

    def check_installed(self) -> None:
        """Refuse, naming the pip extra, when an environment package is missing."""
        missing = [module for module in self.modules if importlib.util.find_spec(module) is None]
        if missing:
            raise ConfigError(
                f"suite {self.name!r} needs {', '.join(missing)}: install the extra with "
                f"pip install 'metarl[{self.extra}]'" if self.extra else
                f"suite {self.name!r} needs {', '.join(missing)}")

    def to_dict(self) -> dict[str, Any]:
        """What a record keeps of the suite: name, version and each side's labels."""
        return {"name": self.name, "version": self.version,
                "train": [task.label for task in self.train],
                "test": [task.label for task in self.test]}


_SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    """Make ``suite`` known by its name (a second suite of the same name is refused)."""
    if suite.name in _SUITES and _SUITES[suite.name] != suite:
        raise ValueError(f"suite {suite.name!r} is registered already")
    labels = [task.label for task in suite.tasks]
    if len(set(labels)) != len(labels):
        raise ValueError(f"suite {suite.name!r}: task labels repeat: {labels}")
    _SUITES[suite.name] = suite
    return suite


def registered() -> dict[str, Suite]:
    """The registered suites by name (shipped ones once :mod:`metarl.suites` loaded them)."""
    return _SUITES
