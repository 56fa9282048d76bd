"""Checks of config values, shared by every config class of ``inner_loops`` and ``metarl``.

Each check takes the dotted ``path`` of the field (``"es.sigma"``, ``"learning_rate"``) so
that its error names it, and the exception class to raise (``ValueError`` by default;
``metarl.config`` passes its ``ConfigError``). Numbers must be finite: a NaN or infinite
setting is always a mistake, and one that would otherwise only show as a run whose every
candidate is invalid.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(path: str, value: Any, error: type[Exception] = ValueError) -> int:
    """``value`` if it is an integer ``>= 1`` (``True`` is not an integer here)."""
    if not _is_int(value) or value < 1:
        raise error(f"{path}: must be a positive integer, got {value!r}")
    return value


def check_non_negative_int(path: str, value: Any, error: type[Exception] = ValueError) -> int:
    """``value`` if it is an integer ``>= 0``."""
    if not _is_int(value) or value < 0:
        raise error(f"{path}: must be a non-negative integer, got {value!r}")
    return value


def check_finite(path: str, value: Any, error: type[Exception] = ValueError) -> float:
    """``value`` as a ``float`` if it is a finite real number (not a bool, NaN or ±inf)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{path}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise error(f"{path}: must be a finite number, got {value!r}")
    return float(value)


def check_positive(path: str, value: Any, error: type[Exception] = ValueError) -> float:
    """``value`` if it is a finite number ``> 0``."""
    value = check_finite(path, value, error)
    if not value > 0:
        raise error(f"{path}: must be positive, got {value!r}")
    return value


def check_non_negative(path: str, value: Any, error: type[Exception] = ValueError) -> float:
    """``value`` if it is a finite number ``>= 0``."""
    value = check_finite(path, value, error)
    if not value >= 0:
        raise error(f"{path}: must be >= 0, got {value!r}")
    return value


def check_in_range(path: str, value: Any, low: float, high: float, *,
                   low_open: bool = False, high_open: bool = False,
                   error: type[Exception] = ValueError) -> float:
    """``value`` if it is a finite number in the interval from ``low`` to ``high``
    (closed unless ``low_open`` / ``high_open``)."""
    value = check_finite(path, value, error)
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise error(f"{path}: must lie in {interval}, got {value!r}")
    return value


def check_choice(path: str, value: Any, allowed: Iterable[str],
                 error: type[Exception] = ValueError) -> str:
    """``value`` if it is one of ``allowed``; the error lists them."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise error(f"{path}: got {value!r}; allowed: {', '.join(allowed)}")
    return value


def check_widths(path: str, value: Any, error: type[Exception] = ValueError) -> tuple[int, ...]:
    """Layer widths as a tuple of positive integers."""
    try:
        widths = tuple(value)
    except TypeError:
        raise error(f"{path}: expected a list of layer widths, got {value!r}") from None
    if not all(_is_int(w) and w >= 1 for w in widths):
        raise error(f"{path}: widths must be positive integers, got {value!r}")
    return widths
