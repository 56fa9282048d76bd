"""Where objectives defined outside this package come from, and importing them.

An objective lives in a module that registers it (:func:`~metarl.objectives.registry.
register_objective`) when imported. Besides the modules of this package, that module can be:

* named by an experiment (``[objective] module = ...``): an importable module name
  (``"my_objectives"``, ``"mypkg.objectives"``) or a path to a ``.py`` file, relative to a
  folder (the experiment file's, or the run directory's) or absolute
  (:func:`import_objective_module`);
* an installed package's entry point in the group ``metarl.objectives``
  (:func:`load_entry_points`): each names a module to import or a callable to call. They
  are loaded once, when a name is not found or the names are listed.

A ``.py`` file is imported under a name made of its stem and its content's sha256
(:func:`file_module_name`), so the file an experiment names and the copy a run directory
keeps of it (:data:`SOURCE_DIR`) are one module: importing either again registers nothing
twice, and once a file is imported a config that records its sha256 needs the file no more.
Nothing here imports the registry, which calls :func:`load_entry_points`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
import warnings
from pathlib import Path

from metarl.plugins import load_group, one_line, reload_groups

ENTRY_POINT_GROUP = "metarl.objectives"
SOURCE_DIR = "objective_source"  # where a run directory keeps a copy of a .py objective
FILE_MODULE_PREFIX = "_metarl_objective_file"


class ObjectiveSourceError(ValueError):
    """An objective's module that cannot be imported; the message says why, in one line."""


def is_file_source(module: str) -> bool:
    """Whether ``[objective] module`` names a ``.py`` file rather than a module name."""
    return module.endswith(".py")


def source_path(module: str, folder: str | Path | None) -> Path:
    """The ``.py`` file ``module`` names: absolute, or relative to ``folder`` (the current
    directory when ``None``)."""
    path = Path(module).expanduser()
    if not path.is_absolute() and folder is not None:
        path = Path(folder) / path
    return path.absolute()


def file_sha256(path: str | Path) -> str:
    """The sha256 of the file's bytes, as 64 hex digits."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def file_module_name(path: str | Path, sha256: str) -> str:
    """The module name a ``.py`` file of that content is imported under."""
    stem = re.sub(r"\W", "_", Path(path).stem)
    return f"{FILE_MODULE_PREFIX}_{stem}_{sha256[:16]}"


def import_objective_module(module: str, folder: str | Path | None = None,
                            sha256: str | None = None) -> str:
    """Import the module ``module`` names so that it registers its objectives; returns the
    name it is imported under (``sys.modules``).

    Args:
        module: an importable module name, or a path to a ``.py`` file (ends in ``.py``).
        folder: what a relative ``.py`` path is relative to.
        sha256: the file's recorded sha256: a file of that name and content imported
            before is used without reading the file again (a run's copy may be elsewhere,
            or gone, once the run's objective is registered).

    Raises:
        ObjectiveSourceError: the file is missing or the import fails; the message (one
            line) says which and why.
    """
    if not is_file_source(module):
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure of the user's module: reported, not raised
            raise ObjectiveSourceError(f"importing module {module!r} failed "
                                       f"({one_line(error)})") from error
        return module
    path = source_path(module, folder)
    if sha256 is not None and file_module_name(path, sha256) in sys.modules:
        return file_module_name(path, sha256)
    if (path, sha256) in _CHANGED:
        return _CHANGED[path, sha256]
    if not path.is_file():
        raise ObjectiveSourceError(f"file {path} not found")
    actual = file_sha256(path)
    name = file_module_name(path, actual)
    if name not in sys.modules:
        _exec_file(name, path)
    if sha256 is not None and actual != sha256:
        warnings.warn(f"{path} has changed since it was recorded (sha256 {sha256[:12]}..., "
                      f"now {actual[:12]}...): the objective is built from the file as it "
                      "is now", UserWarning, stacklevel=2)
        _CHANGED[path, sha256] = name  # warned once per process
    return name


# (file, recorded sha256) -> the module imported from it, for files that no longer match
# what a run recorded
_CHANGED: dict[tuple[Path, str], str] = {}


def _exec_file(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ObjectiveSourceError(f"file {path} cannot be imported as a Python module")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # as a normal import: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(loaded)
    except Exception as error:  # a broken user file: reported in one line
        del sys.modules[name]
        raise ObjectiveSourceError(f"importing {path} failed ({one_line(error)})") from error


def recorded_source(module: str, folder: str | Path | None) -> tuple[str, str, Path]:
    """How a run directory records the ``.py`` file ``module`` names: ``(path inside the
    run directory, sha256, the file to copy there)``."""
    path = source_path(module, folder)
    if not path.is_file():
        raise ObjectiveSourceError(f"file {path} not found")
    return f"{SOURCE_DIR}/{path.name}", file_sha256(path), path


def with_source_folder(data: dict, folder: str | Path) -> dict:
    """Experiment data (a file's, or a run's ``config.json``) whose ``[objective]`` names a
    relative ``.py`` module, with ``objective.base_dir`` set to ``folder`` (made absolute),
    where that path is read from; other data is returned as it is."""
    objective = data.get("objective") if isinstance(data, dict) else None
    if not isinstance(objective, dict) or "base_dir" in objective:
        return data
    module = objective.get("module")
    if not isinstance(module, str) or not is_file_source(module):
        return data
    return {**data, "objective": {**objective, "base_dir": str(Path(folder).absolute())}}


def load_entry_points() -> None:
    """Load, once per process, every entry point of the group ``metarl.objectives``
    (:func:`metarl.plugins.load_group`) so that each registers its objectives."""
    load_group(ENTRY_POINT_GROUP, "objective")


def reload_entry_points() -> None:
    """Forget that the entry points were loaded (:func:`metarl.plugins.reload_groups`)."""
    reload_groups()


WHAT_TO_DO = ("put its module's folder on PYTHONPATH, install the package that defines it, "
              "or name its module with [objective] module = \"my_module\" or "
              "\"path/to/file.py\" (for a run: \"module\" in the objective of its "
              "config.json)")


def describe_source(module: str | None, folder: str | Path | None) -> str:
    """``module 'x'``, ``file /abs/x.py`` or ``no [objective] module recorded``."""
    if module is None:
        return "no [objective] module recorded"
    if is_file_source(module):
        return f"file {source_path(module, folder)}"
    return f"module {module!r}"
