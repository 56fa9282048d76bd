"""Objectives by name, each with what it means: the loss slots it fills, the algorithms it
fits, the baselines it is compared with and how a run of it is drawn.

Each objective module registers a factory ``(**options) -> Objective`` with the
:func:`register_objective` decorator; experiments build objectives by name with
:func:`make_objective`, and evaluation and plotting read the declaration
(:func:`get_objective`) instead of knowing objectives by name. The package's ``__init__``
imports every module of the package, so adding an objective is one new file in
``metarl/objectives/`` and nothing else.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inner_loops.objective import ALL_SLOTS, SLOTS, Objective

ObjectiveFactory = Callable[..., Objective]


@dataclass(frozen=True)
class RunFigureRequest:
    """What an objective's ``plot`` hook gets to draw a run's learned loss.

    Attributes:
        run_name: the experiment's name, for titles.
        candidates: ``"mean"`` (the search distribution's centre) and/or ``"best"`` (the
            best candidate seen) -> whole meta-parameters ``{"policy": ..., "value": ...}``
            as float32 arrays (also ``"optimizer"`` for a learned optimiser); only those saved in
            the run.
        options: the objective's options from the experiment file.
        inner: the first ``[inner]`` config of the run (its algorithm's config dataclass).
        generation: generations finished.
    """

    run_name: str
    candidates: Mapping[str, Any]
    options: Mapping[str, Any]
    inner: Any
    generation: int

    @staticmethod
    def label(which: str) -> str:
        """How a candidate is named in titles and legends."""
        return CANDIDATE_LABELS.get(which, which)


CANDIDATE_LABELS = {"mean": "search mean", "best": "best candidate"}


# (request) -> {file stem: matplotlib Figure}; a run's report (metarl.evolve.report) writes
# ``plots/<stem>.png``.
RunFigures = Callable[[RunFigureRequest], dict[str, Any]]

# (whole meta-parameters {"policy": ..., "value": ...[, "optimizer": ...]}, the objective's
# options) -> {slot: plain function of the slot's inputs} (a value distance d(x), a drift
# (ratio, advantage), an optax transformation), pure and jit/vmap/grad-able; keyword-only
# arguments named after fields of the algorithm's config (clip_eps) are bound by
# metarl.discoveries.load from the run's first [inner] table. Slots left out are their
# loss bound to the meta-parameters.
Portable = Callable[[Any, Mapping[str, Any]], dict[str, Callable[..., Any]]]


@dataclass(frozen=True)
class Tunable:
    """One knob a tuned evaluation (``metarl evaluate --tune``) searches over, and its grid.

    Attributes:
        name: a field of the algorithm's traced ``Hyperparams`` (``learning_rate``,
            ``vf_coef``, ``clip_eps``, ...), or, with ``option``, an option of the
            objective's factory (DPO's ``alpha``).
        values: the grid, in the order it is searched.
        relative: the values are multiples of the run's own setting of ``name`` (a
            learning rate ``x 1/3, x 1, x 3``); otherwise they are absolute values.
        shared: the knob belongs to training rather than to this objective (the learning
            rate): the evolved objective is tuned over the shared knobs of its baselines,
            with the same budget (:mod:`metarl.evolve.tuning`).
        option: ``name`` is an option of the objective, not a hyperparameter. The loss term
            of ``slot`` reads it from its meta-parameters when they hold it
            (``meta_params.get(name, option_value)``), so a sweep traces it and every grid
            value trains in one program; its ``init`` still returns ``{}``, so evolution
            sees nothing to learn.
        slot: the slot whose term reads the option (default: the objective's only slot).
        fallbacks: hyperparameters searched in place of ``name``, the first the algorithm
            has, where it has no ``name``: the learning rate of TD3's and SAC's critic,
            which a value loss trains, is ``critic_learning_rate``.
        low, high: the open interval of valid values (``None``: unbounded on that side),
            in the units of ``values`` (multiples of the run's setting where ``relative``).
            A tuned evaluation widens a grid whose best setting is at its edge
            (:mod:`metarl.evolve.tuning`) only while the next value stays inside it.
    """

    name: str
    values: tuple[float, ...]
    relative: bool = False
    shared: bool = False
    option: bool = False
    slot: str | None = None
    fallbacks: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tunable: a knob needs a name, got {self.name!r}")
        values = tuple(self.values)
        if not values or any(isinstance(v, bool) or not isinstance(v, int | float)
                             or not math.isfinite(v) for v in values):
            raise ValueError(f"tunable {self.name}: values must be finite numbers, got "
                             f"{self.values!r}")
        if len(set(values)) != len(values):
            raise ValueError(f"tunable {self.name}: values must be distinct, got {values!r}")
        object.__setattr__(self, "values", tuple(float(v) for v in values))
        outside = [v for v in values if not self.allows(v)]
        if outside:
            raise ValueError(f"tunable {self.name}: values {outside} lie outside its valid "
                             f"range ({self.low}, {self.high})")
        if self.slot is not None and self.slot not in SLOTS:
            raise ValueError(f"tunable {self.name}: slot must be one of {SLOTS}, got "
                             f"{self.slot!r}")


    def allows(self, value: float) -> bool:
        """Whether ``value`` lies inside the open interval (``low``, ``high``)."""
        return ((self.low is None or value > self.low)
                and (self.high is None or value < self.high))


# The knobs the shipped objectives share: grids documented in docs/guides/objectives.md.
LEARNING_RATE = Tunable("learning_rate", (1 / 3, 1.0, 3.0), relative=True, shared=True,
                        fallbacks=("critic_learning_rate",), low=0.0)
VF_COEF = Tunable("vf_coef", (0.03, 0.1, 0.3, 1.0), low=0.0)


@dataclass(frozen=True)
class RegisteredObjective:
    """One registered objective and its declaration.

    Attributes:
        name: what experiment files write as ``[objective] name``.
        factory: ``(**options) -> Objective``.
        slots: the slots it fills (``"policy"``, ``"value"``, ``"optimizer"``); the
            algorithm fills the rest with its own losses (and Adam).
        algorithms: the algorithms it fits; ``None``: any algorithm with its slots.
        baselines: registered objectives ``metarl evaluate`` compares it with by default
            (those that fit the run's algorithm).
        plot: draws a run's learned loss (see :data:`RunFigures`); ``None``: nothing to draw.
        tunables: what ``metarl evaluate --tune`` searches over when this objective is a
            baseline (:class:`Tunable`); the grid is their product.
        portable: turns meta-parameters into plain functions (:data:`Portable`), what
            :func:`metarl.load_objective` returns for each slot; ``None``: each slot is
            its loss bound to the meta-parameters.
    """

    name: str
    factory: ObjectiveFactory
    slots: tuple[str, ...]
    algorithms: tuple[str, ...] | None = None
    baselines: tuple[str, ...] = ()
    plot: RunFigures | None = None
    tunables: tuple[Tunable, ...] = ()
    portable: Portable | None = None

    @property
    def description(self) -> str:
        """The first line of the factory's docstring."""
        return (inspect.getdoc(self.factory) or "").split("\n", 1)[0]

    def fits(self, algorithm: str, algorithm_slots: tuple[str, ...]) -> bool:
        """Whether it can train with ``algorithm``, whose loss slots are ``algorithm_slots``."""
        listed = self.algorithms is None or algorithm in self.algorithms
        return listed and all(slot in algorithm_slots for slot in self.slots)

    def build(self, **options) -> Objective:
        """The objective with ``options`` (keyword arguments of the factory).

        Raises:
            ValueError: an option the factory does not accept (named), or a factory that
                fills other slots than it declared.
        """
        _check_options(self.name, self.factory, options)
        key = _built_key(self, options)
        if key in _BUILT:
            return _BUILT[key]
        objective = self.factory(**options)
        if objective.slots != self.slots:
            raise ValueError(f"objective {self.name!r} declares slots {list(self.slots)} but its "
                             f"factory filled {list(objective.slots)}")
        objective = dataclasses.replace(objective, algorithms=self.algorithms, label=self.name)
        if key is not None:
            _BUILT[key] = objective
        return objective


# Every objective built, by declaration and options: an equal request returns the same
# (immutable) Objective, so programs traced from it can be shared by key
# (metarl.programs) instead of being traced and compiled again.
_BUILT: dict[tuple, Objective] = {}


def _built_key(declaration: RegisteredObjective, options: dict[str, Any]) -> tuple | None:
    """The key of ``options`` in ``_BUILT``, or ``None`` (not kept) for options that are
    not plain data (numbers, strings, lists, tables), whose text could not tell them apart."""
    try:
        return declaration, json.dumps(options, sort_keys=True, allow_nan=True)
    except TypeError:
        return None


_REGISTRY: dict[str, RegisteredObjective] = {}


def register_objective(
    name: str,
    *,
    slots: tuple[str, ...],
    algorithms: tuple[str, ...] | None = None,
    baselines: tuple[str, ...] = (),
    plot: RunFigures | None = None,
    tunables: tuple[Tunable, ...] = (),
    portable: Portable | None = None,
) -> Callable[[ObjectiveFactory], ObjectiveFactory]:
    """Decorator registering ``factory(**options) -> Objective`` under ``name``.

    Args:
        name: the objective's name.
        slots: the slots its objectives fill (a subset of ``("policy", "value",
            "optimizer")``).
        algorithms: the algorithms it fits (``None``: any that has ``slots``).
        baselines: objectives to compare it with in ``metarl evaluate``.
        plot: how a run of it is drawn (:data:`RunFigures`).
        tunables: the knobs and grids a tuned evaluation searches (:class:`Tunable`);
            an option knob must be an argument of the factory.
        portable: ``(meta_params, options) -> {slot: function}``, the objective's
            meta-parameters as plain functions of their inputs (:data:`Portable`).

    Registering a different factory under a taken name is an error; re-registering the same
    function (e.g. when its module is reloaded) replaces the old entry.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an objective name must be a non-empty string, got {name!r}")
    slots = tuple(slots)
    if not slots or any(slot not in ALL_SLOTS for slot in slots):
        raise ValueError(f"objective {name!r}: slots must be a non-empty subset of "
                         f"{ALL_SLOTS}, got {slots!r}")
    slots = tuple(slot for slot in ALL_SLOTS if slot in slots)  # canonical order
    tunables = _checked_tunables(name, slots, tunables)

    def decorator(factory: ObjectiveFactory) -> ObjectiveFactory:
        options = inspect.signature(factory).parameters
        unknown = [t.name for t in tunables if t.option and t.name not in options]
        if unknown:
            raise ValueError(f"objective {name!r}: tunable option(s) {unknown} are not "
                             f"arguments of {factory.__qualname__}")
        previous = _REGISTRY.get(name)
        if previous is not None and (
            previous.factory.__module__ != factory.__module__
            or previous.factory.__qualname__ != factory.__qualname__
        ):
            raise ValueError(
                f"objective name {name!r} is already registered by "
                f"{previous.factory.__module__}.{previous.factory.__qualname__}"
            )
        _REGISTRY[name] = RegisteredObjective(
            name, factory, slots, None if algorithms is None else tuple(algorithms),
            tuple(baselines), plot, tunables, portable,
        )
        return factory

    return decorator


def _checked_tunables(name: str, slots: tuple[str, ...], tunables) -> tuple[Tunable, ...]:
    """``tunables`` as a tuple, each option's slot filled in; the errors name the knob."""
    checked = []
    for tunable in tuple(tunables):
        if not isinstance(tunable, Tunable):
            raise ValueError(f"objective {name!r}: tunables must be Tunable, got {tunable!r}")
        if tunable.option:
            if tunable.relative:
                raise ValueError(f"objective {name!r}: option {tunable.name!r} cannot be "
                                 "relative (only hyperparameters have a run's own value)")
            slot = tunable.slot
            if slot is None and len(slots) == 1:
                slot = slots[0]
            if slot not in slots:
                raise ValueError(f"objective {name!r}: option {tunable.name!r} needs a slot "
                                 f"among {list(slots)}, got {tunable.slot!r}")
            tunable = dataclasses.replace(tunable, slot=slot)
        checked.append(tunable)
    names = [t.name for t in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"objective {name!r}: a tunable is named twice in {names}")
    return tuple(checked)


def available_objectives() -> list[str]:
    """Sorted names of all registered objectives, those of installed plugins included
    (:func:`metarl.objectives.sources.load_entry_points`)."""
    from metarl.objectives.sources import load_entry_points

    load_entry_points()
    return sorted(_REGISTRY)


def get_objective(name: str) -> RegisteredObjective:
    """The declaration registered as ``name`` (installed plugins are loaded the first time
    a name is not found); the error lists the registered names."""
    if name not in _REGISTRY:
        from metarl.objectives.sources import load_entry_points

        load_entry_points()
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown objective {name!r}; available objectives: "
            + ", ".join(available_objectives())
        )
    return _REGISTRY[name]


def make_objective(name: str, **options) -> Objective:
    """Build the objective registered as ``name`` with the factory's keyword arguments.

    Raises:
        ValueError: if ``name`` is not registered (the message lists the available names) or
            an option is not accepted by the factory (the message names it).
    """
    return get_objective(name).build(**options)


def _check_options(name: str, factory: ObjectiveFactory, options: dict[str, Any]) -> None:
    signature = inspect.signature(factory)
    parameters = signature.parameters
    takes_var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if not takes_var_kwargs:
        accepted = [
            p.name
            for p in parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise ValueError(
                f"objective {name!r} got unexpected keyword argument(s) "
                + ", ".join(repr(k) for k in unknown)
                + "; accepted: "
                + (", ".join(accepted) if accepted else "none")
            )
    try:
        signature.bind(**options)
    except TypeError as error:
        raise ValueError(f"bad arguments for objective {name!r}: {error}") from error
