"""Builds metarl with its shipped experiments (everything else is in pyproject.toml).

The shipped experiments stay at the repository's top level, ``experiments/*.toml``, where
users and the documentation expect them; a wheel carries them as the package data
``metarl/_experiments/``, where :mod:`metarl.shipped` finds them once installed. (An
editable install reads ``experiments/`` itself.) The folder's ``.py`` files are scripts and
stay behind.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "experiments"
TARGET = ("metarl", "_experiments")  # metarl.shipped.PACKAGE_DATA, inside the package


class BuildWithExperiments(build_py):
    """``build_py`` that also copies ``experiments/*.toml`` into the built package."""

    def run(self):
        super().run()
        if not self._editable():
            self._copy_experiments()

    def _editable(self) -> bool:
        return getattr(self, "editable_mode", False)

    def _experiments(self) -> list[Path]:
        found = sorted(SOURCE.glob("*.toml"))
        if not found:  # a wheel without them fails `metarl run NAME`: refuse to build one
            raise RuntimeError(f"no shipped experiments in {SOURCE} to build into the wheel")
        return found

    def _copy_experiments(self) -> None:
        target = Path(self.build_lib).joinpath(*TARGET)
        self.mkpath(str(target))
        for source in self._experiments():
            self.copy_file(str(source), str(target / source.name))

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if self._editable():
            return outputs
        target = Path(self.build_lib).joinpath(*TARGET)
        return [*outputs, *(str(target / source.name) for source in self._experiments())]


setup(cmdclass={"build_py": BuildWithExperiments})
