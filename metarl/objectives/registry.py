"""Name -> factory registry of objectives.

Each objective module registers a factory ``(**kwargs) -> Objective`` under a short name with
the :func:`register_objective` decorator; experiments then build objectives by name with
:func:`make_objective`. The package's ``__init__`` imports every module of the package, so
adding an objective is one new file in ``metarl/objectives/`` and nothing else.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from inner_loops.objective import Objective

ObjectiveFactory = Callable[..., Objective]

_REGISTRY: dict[str, ObjectiveFactory] = {}


def register_objective(name: str) -> Callable[[ObjectiveFactory], ObjectiveFactory]:
    """Decorator registering ``factory(**kwargs) -> Objective`` under ``name``.

    Registering a different factory under a taken name is an error; re-registering the same
    function (e.g. when its module is reloaded) replaces the old entry.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an objective name must be a non-empty string, got {name!r}")

    def decorator(factory: ObjectiveFactory) -> ObjectiveFactory:
        previous = _REGISTRY.get(name)
        if previous is not None and (
            previous.__module__ != factory.__module__
            or previous.__qualname__ != factory.__qualname__
        ):
            raise ValueError(
                f"objective name {name!r} is already registered by "
                f"{previous.__module__}.{previous.__qualname__}"
            )
        _REGISTRY[name] = factory
        return factory

    return decorator


def available_objectives() -> list[str]:
    """Sorted names of all registered objectives."""
    return sorted(_REGISTRY)


def make_objective(name: str, **kwargs) -> Objective:
    """Build the objective registered as ``name`` with the factory's keyword arguments.

    Raises:
        ValueError: if ``name`` is not registered (the message lists the available names) or
            a keyword argument is not accepted by the factory (the message names it).
    """
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown objective {name!r}; available objectives: "
            + ", ".join(available_objectives())
        )
    factory = _REGISTRY[name]
    signature = inspect.signature(factory)
    parameters = signature.parameters
    takes_var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if not takes_var_kwargs:
        accepted = [
            p.name
            for p in parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise ValueError(
                f"objective {name!r} got unexpected keyword argument(s) "
                + ", ".join(repr(k) for k in unknown)
                + "; accepted: "
                + (", ".join(accepted) if accepted else "none")
            )
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise ValueError(f"bad arguments for objective {name!r}: {error}") from error
    return factory(**kwargs)
