"""An objective's options checked against its factory before anything is built.

``[objective] options`` are keyword arguments of the registered factory. :func:`check_options`
refuses a name the factory does not take, listing those it does, and a value that does not
fit the argument's annotation where the annotation is simple: ``bool``, ``int``, ``float``,
``str``, sequences of ``int``/``float`` and these ``| None``. Other annotations (callables,
mappings, classes, missing ones) are left to the factory.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_SEQUENCES = (collections.abc.Sequence, list, tuple)


def accepted_options(factory: Callable[..., Any]) -> list[str] | None:
    """The keyword arguments ``factory`` takes, in order; ``None`` when it takes any
    (``**kwargs``)."""
    parameters = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in _KEYWORD_KINDS]


def check_options(name: str, factory: Callable[..., Any], options: dict[str, Any]) -> None:
    """Check ``options`` against ``factory``'s signature and simple annotations.

    Raises:
        ValueError: ``options.<key>: ...`` naming the first bad option and, for an unknown
            one, the accepted ones.
    """
    accepted = accepted_options(factory)
    if accepted is not None:
        for key in options:
            if key not in accepted:
                raise ValueError(f"options.{key}: not an option of objective {name!r}; "
                                 f"accepted: {', '.join(sorted(accepted)) or 'none'}")
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # an annotation that does not resolve: the factory checks its own
        hints = {}
    for key, value in options.items():
        if key in hints:
            problem = _mismatch(value, hints[key])
            if problem is not None:
                raise ValueError(f"options.{key}: objective {name!r} expects {problem}, got "
                                 f"{value!r}")


def _mismatch(value: Any, annotation: Any) -> str | None:
    """What ``annotation`` wants, when ``value`` does not fit it; ``None`` when it fits or
    the annotation is not one checked here."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        wants = []
        for member in members:
            if member is type(None):
                if value is None:
                    return None
                wants.append("nothing (none)")
                continue
            problem = _mismatch(value, member)
            if problem is None:
                return None
            wants.append(problem)
        return " or ".join(wants)
    if annotation is bool:
        return None if isinstance(value, bool) else "true or false"
    if annotation is int:
        return None if _is_int(value) else "an integer"
    if annotation is float:
        return None if _is_number(value) else "a number"
    if annotation is str:
        return None if isinstance(value, str) else "a string"
    if origin in _SEQUENCES or annotation in _SEQUENCES:
        return _sequence_mismatch(value, annotation, origin)
    return None


def _sequence_mismatch(value: Any, annotation: Any, origin: Any) -> str | None:
    args = typing.get_args(annotation)
    item = args[0] if args and (origin is not tuple or len(args) == 1
                                or (len(args) == 2 and args[1] is Ellipsis)) else None
    if item not in (int, float):
        return None  # sequences of anything else (or fixed tuples): the factory decides
    check, label = (_is_int, "integers") if item is int else (_is_number, "numbers")
    if isinstance(value, list | tuple) and all(check(v) for v in value):
        return None
    return f"a list of {label}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
