"""The experiments shipped with metarl, found by name.

The shipped experiments are the repository's ``experiments/*.toml``; a wheel carries them as
the package data ``metarl/_experiments/`` (``setup.py`` copies them there when it builds).
``metarl run value_distance_cartpole`` and ``load_experiment("value_distance_cartpole")``
(:mod:`metarl.kinds`) read one by its name, with or without ``.toml``, wherever they run;
a path that names an existing file always wins over a name (:func:`experiment_path`).
``metarl run --list`` names them all (:func:`shipped_experiments`).

Reading these files builds nothing and starts no JAX computation.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from metarl.config import ConfigError

SUFFIX = ".toml"
PACKAGE_DATA = "_experiments"  # inside the installed package: metarl/_experiments/*.toml
CHECKOUT_FOLDER = "experiments"  # beside the package in a source checkout
LIST_HINT = "`metarl run --list` names every shipped experiment"


def shipped_folder() -> Path | None:
    """The folder the shipped experiments are read from: the package data of an installed
    wheel, else the ``experiments/`` folder of the source checkout that metarl is imported
    from (an editable install); ``None`` when there is neither."""
    package = Path(__file__).resolve().parent
    for folder in (package / PACKAGE_DATA, package.parent / CHECKOUT_FOLDER):
        if folder.is_dir():
            return folder
    return None


def shipped_experiments() -> dict[str, Path]:
    """``{name: file}`` of every shipped experiment, sorted by name (a file's name is its
    stem: ``value_distance_cartpole`` for ``value_distance_cartpole.toml``)."""
    folder = shipped_folder()
    if folder is None:
        return {}
    return {path.stem: path for path in sorted(folder.glob(f"*{SUFFIX}")) if path.is_file()}


def experiment_path(path_or_name: str | Path) -> Path:
    """The experiment file that ``path_or_name`` names: the file itself where one exists at
    that path, else the shipped experiment of that name (``value_distance_cartpole`` or
    ``value_distance_cartpole.toml``). Raises :class:`ConfigError`, one line, naming the
    close matches among the shipped experiments where there is neither."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    shipped = shipped_experiments()
    is_name = path.parent == Path(".") and path.suffix in ("", SUFFIX)
    if is_name and path.stem in shipped:
        return shipped[path.stem]
    if not is_name:
        hint = (f"; {path.stem!r} is a shipped experiment: `metarl run {path.stem}` reads it"
                if path.stem in shipped and path.suffix == SUFFIX else "")
        raise ConfigError(f"config file not found: {path}{hint}")
    if not shipped:
        raise ConfigError(f"config file not found: {path}, and no shipped experiments are "
                          f"installed to look its name up in (metarl/{PACKAGE_DATA} is "
                          "missing)")
    close = difflib.get_close_matches(path.stem, list(shipped), n=3)
    matches = f"close matches: {', '.join(close)}; " if close else ""
    raise ConfigError(f"no file {path} and no shipped experiment {path.stem!r}: "
                      f"{matches}{LIST_HINT}")
