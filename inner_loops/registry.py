"""Algorithms by name: ``"ppo"`` -> its config class and the function that builds it.

Each algorithm module calls :func:`register_algorithm` once, at import. The modules shipped
with metarl are listed in :data:`BUILTIN_MODULES` and imported the first time a name is
looked up, so importing this package builds nothing. Adding an algorithm is one module (a
config dataclass and a ``build(config, objective) -> Learner``) plus one line in
:data:`BUILTIN_MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inner_loops.learner import Learner
from inner_loops.objective import OPTIMIZER_SLOT, Objective

DEFAULT_ALGORITHM = "ppo"

# name -> module that registers it (imported on first look-up)
BUILTIN_MODULES = {
    "ppo": "inner_loops.ppo",
    "recurrent_ppo": "inner_loops.recurrent_ppo",
    "dqn": "inner_loops.dqn",
    "td3": "inner_loops.td3",
    "sac": "inner_loops.sac",
}

BuildFn = Callable[[Any, "Objective | None"], Learner]


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm.

    Attributes:
        name: what experiment files write as ``algorithm = "..."``.
        config_class: its frozen, validated config dataclass.
        build: ``(config, objective | None) -> Learner``; ``None`` means the algorithm's
            own default losses.
        slots: the slots an objective may fill: loss slots (``"policy"``, ``"value"``)
            and ``"optimizer"`` when an objective's update rule may replace its Adam.
        description: one line for listings.
    """

    name: str
    config_class: type
    build: BuildFn
    slots: tuple[str, ...]
    description: str = ""


_REGISTRY: dict[str, Algorithm] = {}


def register_algorithm(name: str, config_class: type, build: BuildFn,
                       slots: tuple[str, ...], description: str = "") -> Algorithm:
    """Register ``name``; registering another config class under a taken name is an error."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an algorithm name must be a non-empty string, got {name!r}")
    previous = _REGISTRY.get(name)
    if previous is not None and previous.config_class.__qualname__ != config_class.__qualname__:
        raise ValueError(f"algorithm {name!r} is already registered with "
                         f"{previous.config_class.__qualname__}")
    algorithm = Algorithm(name, config_class, build, tuple(slots), description)
    _REGISTRY[name] = algorithm
    return algorithm


def _load_builtins() -> None:
    for module in BUILTIN_MODULES.values():
        importlib.import_module(module)


def available_algorithms() -> list[str]:
    """Sorted names of every registered algorithm."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; the error lists the registered names."""
    if name not in _REGISTRY:
        _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"algorithm: unknown {name!r}; allowed: "
                         f"{', '.join(available_algorithms())}")
    return _REGISTRY[name]


def algorithm_of(config: Any) -> Algorithm:
    """The algorithm whose config class ``config`` is an instance of."""
    _load_builtins()
    for algorithm in _REGISTRY.values():
        if type(config) is algorithm.config_class:
            return algorithm
    raise ValueError(f"{type(config).__name__} is the config of no registered algorithm; "
                     f"registered: {', '.join(sorted(_REGISTRY))}")


def check_objective_fits(objective: Objective | None, algorithm: Algorithm) -> None:
    """Raise ``ValueError`` naming both when ``objective`` cannot train with ``algorithm``:
    it fills a slot the algorithm does not have (a loss slot, or the optimiser slot of an
    algorithm that always uses Adam), or does not list the algorithm."""
    if objective is None:
        return
    extra = [slot for slot in objective.slots if slot not in algorithm.slots]
    listed = objective.algorithms is None or algorithm.name in objective.algorithms
    if extra or not listed:
        losses = [slot for slot in extra if slot != OPTIMIZER_SLOT]
        if OPTIMIZER_SLOT in extra:
            why = (f"it fills the {OPTIMIZER_SLOT} slot (a learned update rule in place of "
                   f"Adam), which {algorithm.name} does not have (its slots: "
                   f"{', '.join(algorithm.slots)})")
        elif losses:
            why = (f"it fills the {', '.join(losses)} loss slot(s), which {algorithm.name} "
                   f"does not have (its slots: {', '.join(algorithm.slots)})")
        else:
            why = f"it applies to {', '.join(objective.algorithms)} only"
        raise ValueError(f"objective {objective.name!r} does not fit algorithm "
                         f"{algorithm.name!r}: {why}")


def make_learner(config: Any, objective: Objective | None = None) -> Learner:
    """Build the :class:`~inner_loops.learner.Learner` of ``config``'s algorithm."""
    algorithm = algorithm_of(config)
    check_objective_fits(objective, algorithm)
    return algorithm.build(config, objective)
