"""``metarl.load_objective``: a discovery as plain JAX functions.

A discovery is a discovery file (``metarl export``), an evolution run directory, or a zoo
entry (``"zoo:<name>"``, :mod:`metarl.discoveries.zoo`). :func:`load_objective` returns a
:class:`LoadedObjective` whose slot attributes are plain functions of the inputs the slot
reads (the card's ``inputs`` says what they mean and where the algorithm computes them)::

    import metarl
    found = metarl.load_objective("zoo:value_distance_blog")
    found.value(x)                        # d(x), elementwise over any shape
    drift = metarl.load_objective("zoo:lpo_cpu").policy
    drift(ratio, advantage)               # LPO; TA-LPO: drift(ratio, advantage, progress)

How an objective's meta-parameters become these functions is declared by the objective
(``register_objective(..., portable=...)``); keyword-only arguments of those functions
named after a field of the run's algorithm config (``clip_eps``) are bound from the
experiment's first ``[inner]`` table. A slot the objective fills without a portable form is
its loss bound to the meta-parameters, ``(LossInputs) -> []``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

from inner_loops.objective import ALL_SLOTS, OPTIMIZER_SLOT, LossInputs, Objective
from metarl.discoveries import zoo
from metarl.discoveries.export import export_bytes
from metarl.discoveries.fileformat import DiscoveryFileError, read_discovery
from metarl.objectives import get_objective
from metarl.objectives.sources import (
    ObjectiveSourceError,
    import_objective_module,
    is_file_source,
)

ZOO_PREFIX = "zoo:"


@dataclass(frozen=True, eq=False)
class LoadedObjective:
    """A discovered objective, its meta-parameters bound.

    Attributes:
        name: the registered objective's name (``value_distance``, ``lpo``, ...).
        card: the discovery's card (plain JSON data: objective, inputs of each slot, what
            it was found under, its verdicts, caveats).
        meta_params: the whole meta-parameters ``{"policy": ..., "value": ...}`` (and
            ``"optimizer"``), float32 ``jnp`` arrays.
        slots: the slots the objective fills.
        objective: the metarl :class:`~inner_loops.objective.Objective`, for training with
            metarl's own algorithms.
        value: for a value distance ``d(x)``, elementwise over errors ``x = value - target``
            of any shape; ``None`` when the objective leaves the value loss to the
            algorithm.
        policy: for LPO ``drift(ratio, advantage)``, for TA-LPO ``drift(ratio, advantage,
            progress)``, broadcasting ``[...]`` inputs (``clip_eps`` bound from the run's
            config); ``None`` when the objective leaves the policy loss to the algorithm.
        optimizer: for a learned optimiser, the ``optax.GradientTransformationExtraArgs``
            it builds: ``init(params)``, then ``update(grads, state, params, progress=p,
            key=k)`` with ``p`` the fraction of training done in ``[0, 1]`` and ``k`` a
            PRNG key (both required by the learned rules); ``None`` for Adam.

    Every function is pure and can be ``jax.jit``-ed, ``jax.vmap``-ed and differentiated.
    """

    name: str
    card: dict[str, Any]
    meta_params: Any
    slots: tuple[str, ...]
    objective: Objective
    value: Callable[..., jax.Array] | None = None
    policy: Callable[..., jax.Array] | None = None
    optimizer: optax.GradientTransformationExtraArgs | None = None

    def loss(self, slot: str) -> Callable[[LossInputs], jax.Array]:
        """The ``slot``'s loss ``(LossInputs) -> []`` bound to the meta-parameters, exactly
        the loss metarl's algorithms minimise (``"policy"`` or ``"value"``).

        Raises:
            ValueError: a slot the objective does not fill, or the optimiser slot (an
                update rule, not a loss: use :attr:`optimizer`).
        """
        if slot not in ALL_SLOTS:
            raise ValueError(f"slot: got {slot!r}; allowed: {', '.join(ALL_SLOTS)}")
        if slot not in self.slots:
            raise ValueError(f"objective {self.name!r} does not fill the {slot} slot (it "
                             f"fills {', '.join(self.slots)})")
        if slot == OPTIMIZER_SLOT:
            raise ValueError("the optimizer slot is an update rule, not a loss: use "
                             ".optimizer")
        return functools.partial(getattr(self.objective, f"{slot}_loss"), self.meta_params)


def load_objective(source: str | Path, which: str | None = None) -> LoadedObjective:
    """Load a discovery: a discovery file, an evolution run directory, or ``"zoo:<name>"``.

    Args:
        source: the ``.npz`` file ``metarl export`` wrote, a run directory (its card is
            made in memory, nothing written), or a zoo entry ``"zoo:<name>"``.
        which: the run directory's candidate, ``"mean"`` (default) or ``"best"``; a file
            holds one candidate, and a ``which`` that names the other is refused.

    Raises:
        DiscoveryFileError: a damaged, foreign or newer file, or meta-parameters that do
            not fit their objective.
        ValueError: an unknown zoo name (the message lists the zoo), or an objective that
            is not registered in this process (the message names the module that
            registers it where the card records one).
    """
    text = str(source)
    if text.startswith(ZOO_PREFIX):
        card, meta_params = read_discovery(zoo.entry_path(text[len(ZOO_PREFIX):]))
    elif Path(source).is_dir():
        data, _ = export_bytes(source, which or "mean")
        card, meta_params = read_discovery(data)
    else:
        card, meta_params = read_discovery(Path(source))
    if which is not None and which != card.get("candidate"):
        raise ValueError(f"which: {source} holds the {card.get('candidate')} candidate, not "
                         f"{which!r}")
    return bound_objective(card, meta_params)


def bound_objective(card: Mapping[str, Any], meta_params: Any) -> LoadedObjective:
    """The :class:`LoadedObjective` of a card and its meta-parameters (numpy or JAX
    arrays in the objective's structure)."""
    table = card["objective"]
    name, options = table["name"], dict(table.get("options") or {})
    try:
        declaration = get_objective(name)
    except ValueError as error:
        declaration = _registered_from_card(name, table.get("module"), error)
    objective = declaration.build(**options)
    meta_params = _fitted(name, objective, meta_params)
    functions = declaration.portable(meta_params, options) if declaration.portable else {}
    inner = _first_inner(card)
    slots = {}
    for slot in objective.slots:
        if slot in functions:
            slots[slot] = _bound(functions[slot], inner)
        elif slot == OPTIMIZER_SLOT:
            slots[slot] = objective.optimizer_transformation(meta_params)
        else:
            slots[slot] = functools.partial(getattr(objective, f"{slot}_loss"), meta_params)
    return LoadedObjective(name=name, card=dict(card), meta_params=meta_params,
                           slots=objective.slots, objective=objective, **slots)


def _registered_from_card(name: str, module: str | None, error: ValueError):
    """The declaration of ``name`` once the module the card records is imported.

    Only a module *name* is imported (an installed package, or one on the path): the file
    itself never carries code. An objective defined in a ``.py`` file must be imported by
    the user first, or loaded from its run directory, which keeps a copy of the file.
    """
    if not module:
        raise ValueError(f"{error}; the card records no module that registers it") from None
    if is_file_source(module):
        raise ValueError(
            f"{error}; the card says it was defined in the file {module!r}, which a discovery "
            "file does not carry: import that file first, or load the run directory "
            "(it keeps a copy)") from None
    try:
        import_objective_module(module)
    except ObjectiveSourceError as failure:
        raise ValueError(f"objective {name!r}: the card says module {module!r} registers it, "
                         f"and {failure}; install its package or put it on PYTHONPATH"
                         ) from None
    return get_objective(name)


def _fitted(name: str, objective: Objective, meta_params: Any) -> Any:
    """``meta_params`` as float32 ``jnp`` arrays, checked against the objective's own."""
    template = objective.init(jax.random.PRNGKey(0))
    meta_params = jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float32), meta_params)
    expected, found = jax.tree.structure(template), jax.tree.structure(meta_params)
    if expected != found:
        raise DiscoveryFileError(f"the meta-parameters do not fit objective {name!r} with "
                                 f"the card's options: expected {expected}, found {found}")
    for want, got in zip(jax.tree.leaves(template), jax.tree.leaves(meta_params),
                         strict=True):
        if jnp.shape(want) != jnp.shape(got):
            raise DiscoveryFileError(f"the meta-parameters do not fit objective {name!r}: a "
                                     f"leaf has shape {jnp.shape(got)}, the objective's "
                                     f"{jnp.shape(want)}")
    return meta_params


def _first_inner(card: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = ((card.get("found_under") or {}).get("experiment") or {}).get("inner") or [{}]
    return inner[0] if isinstance(inner, list) else inner


def _bound(function: Any, inner: Mapping[str, Any]) -> Any:
    """``function`` with its keyword-only arguments that name a field of the algorithm's
    config bound to the run's values (PPO's ``clip_eps``)."""
    if not callable(function) or isinstance(function, optax.GradientTransformation):
        return function
    parameters = inspect.signature(function).parameters.values()
    settings = {p.name: inner[p.name] for p in parameters
                if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in inner}
    return functools.partial(function, **settings) if settings else function
