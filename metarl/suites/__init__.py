"""Suites: named, versioned lists of environments to judge a discovery where it was not found.

A :class:`Suite` holds a meta-train side and a meta-test side, each a tuple of
:class:`SuiteTask`: an ``[inner]`` table (environment, its parameters and the algorithm's
settings under which PPO is known to learn there) and the source of those settings. An
experiment can take a suite in place of its tasks (``suite = "minatar"``: the meta-train
side becomes its ``[[inner]]`` tasks, the meta-test side its ``[[held_out]]`` ones), and
``metarl evaluate RUN --suite NAME`` judges a run or an exported objective on every
environment of a suite (:mod:`metarl.evolve.suite_verdicts`).

Shipped suites (one module each): ``classic`` (gymnax classic control and bsuite, sized for
a CPU, budgets calibrated below each environment's ceiling), ``minatar`` (DiscoGen's split
at PureJaxRL's MinAtar settings) and ``brax`` (locomotion, GPU-sized). Add one with
:func:`register_suite`; a suite's ``version`` changes whenever its tasks or settings do, so
records name exactly what they were judged on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metarl.config import ConfigError
from metarl.plugins import load_group
from metarl.suites.base import Suite, SuiteTask, register_suite, registered

__all__ = ["Suite", "SuiteTask", "available_suites", "get_suite", "register_suite",
           "suite_experiment_tasks"]


ENTRY_POINT_GROUP = "metarl.suites"


def _load_shipped() -> None:
    """The shipped suites, and those installed packages register through the entry-point
    group ``metarl.suites`` (:mod:`metarl.plugins`)."""
    from metarl.suites import brax, classic, minatar  # noqa: F401  (they register)

    load_group(ENTRY_POINT_GROUP, "suite")


def available_suites() -> list[str]:
    """The registered suites' names, sorted."""
    _load_shipped()
    return sorted(registered())


def get_suite(name: str) -> Suite:
    """The suite ``name``; an unknown name is refused with the known ones."""
    _load_shipped()
    if not isinstance(name, str) or name not in registered():
        raise ConfigError(f"suite: unknown {name!r}; known suites: "
                          f"{', '.join(sorted(registered()))} (metarl suites lists them)")
    return registered()[name]


def suite_experiment_tasks(value: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """An experiment's ``suite`` entry as its ``([[inner]], [[held_out]])`` configs.

    ``value`` is a suite's name, or a table ``{name = "...", settings = {...}, train =
    [...]}`` whose ``settings`` (``[inner]`` field -> value, e.g. a smaller
    ``total_timesteps`` for a smoke run) apply to every task of both sides, and whose
    ``train`` (labels of meta-train tasks) keeps only those tasks as ``[[inner]]``, in the
    suite's order: a search on part of the meta-train side, held out on the same meta-test
    side (the tasks of the meta-train side it leaves out are in neither)."""
    train = None
    if isinstance(value, str):
        name, settings = value, {}
    elif isinstance(value, Mapping):
        unknown = set(value) - {"name", "settings", "train"}
        if unknown or "name" not in value:
            raise ConfigError(f"suite: expected a suite's name or a table with name, "
                              f"settings and train, got {dict(value)!r}")
        name, settings = value["name"], value.get("settings", {})
        if not isinstance(settings, Mapping):
            raise ConfigError(f"suite.settings: expected a table, got {settings!r}")
        train = value.get("train")
    else:
        raise ConfigError(f"suite: expected a suite's name, got {value!r}")
    suite = get_suite(name)
    suite.check_installed()
    tasks = suite.train if train is None else _kept(suite, train)
    return (tuple(task.config(settings) for task in tasks),
            tuple(task.config(settings) for task in suite.test))


def _kept(suite: Suite, train: Any) -> tuple[SuiteTask, ...]:
    """The tasks of ``suite``'s meta-train side that ``suite.train`` names (a non-empty list
    of distinct labels of that side), in the suite's order."""
    labels = [task.label for task in suite.train]
    if (not isinstance(train, list | tuple) or not train
            or not all(isinstance(label, str) for label in train)):
        raise ConfigError(f"suite.train: expected a non-empty list of task labels of suite "
                          f"{suite.name!r}'s meta-train side ({', '.join(labels)}), got "
                          f"{train!r}")
    unknown = [label for label in train if label not in labels]
    if unknown:
        raise ConfigError(f"suite.train: {', '.join(map(repr, unknown))} not on suite "
                          f"{suite.name!r}'s meta-train side ({', '.join(labels)})")
    if len(set(train)) != len(train):
        raise ConfigError(f"suite.train: a task is named twice in {list(train)!r}")
    return tuple(task for task in suite.train if task.label in train)
