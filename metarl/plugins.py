"""Plugins: installed packages that register objectives or suites through entry points.

A package declares, in its ``pyproject.toml``, an entry point in the group ``metarl.objectives``
or ``metarl.suites`` naming a module to import or a callable (``module:function``) to call;
either registers what it defines. :func:`load_group` loads a group once per process.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings

__all__ = ["load_group", "one_line", "reload_groups"]

_LOADED: set[str] = set()


def one_line(error: BaseException) -> str:
    """``error`` as one line: its type and its message with whitespace folded."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def load_group(group: str, what: str) -> None:
    """Load, once per process, every entry point of ``group``: a module is imported, a
    callable called. A plugin that fails gives one warning naming it (as a ``what``
    plugin) and is skipped."""
    if group in _LOADED:
        return
    _LOADED.add(group)
    for entry_point in importlib.metadata.entry_points(group=group):
        try:
            loaded = entry_point.load()
            if entry_point.attr is not None and callable(loaded):
                loaded()
        except Exception as error:  # a broken plugin must not stop the others or the run
            distribution = getattr(entry_point.dist, "name", None) or "an installed package"
            warnings.warn(f"{what} plugin {entry_point.name!r} ({entry_point.value}, from "
                          f"{distribution}) failed to load and is skipped: "
                          f"{one_line(error)}", UserWarning, stacklevel=3)


def reload_groups() -> None:
    """Forget which groups were loaded: the next lookup loads them again (after a package
    was installed into the running process, and for tests)."""
    _LOADED.clear()
    importlib.invalidate_caches()
