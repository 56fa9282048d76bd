"""Learned and fixed RL objectives, built by name.

Every module of this package is imported automatically (see below), and each registers its
objective factories with :func:`register_objective`, declaring the slots they fill, the
algorithms they fit, their baselines, how a run of them is drawn and what a tuned evaluation
searches (:class:`Tunable`); so a new objective is a single new file here. Build one with
``make_objective("lpo", hidden_sizes=(128,))``, read a declaration with
:func:`get_objective` and list the names with :func:`available_objectives`. Registered by
the modules shipped here:

* ``"ppo"``: PPO's clipped surrogate and clipped L2 value loss (:mod:`.l2`).
* ``"l2"``: the plain value loss ``0.5 mean((v - t)^2)``, any critic (:mod:`.l2`).
* ``"huber"``: the Huber value loss (threshold 1), any critic (:mod:`.l2`).
* ``"value_distance"``: a learned value distance ``mean(d(v - t))``, any critic
  (:mod:`.value_distance`).
* ``"lpo"``: learned policy optimisation drift ``-mean(rA - drift(r, A))`` (:mod:`.lpo`).
* ``"ta_lpo"``: the temporally-aware LPO drift ``drift(r, A, n/N)`` (:mod:`.ta_lpo`).
* ``"dpo"``: the closed-form discovered drift of DPO (:mod:`.dpo`).
* ``"symbolic"``, ``"symbolic_drift"``: a value distance or drift written as an expression,
  e.g. one distilled from an evolved network (:mod:`.symbolic`).
* ``"learned_optimizer"``: a per-parameter MLP reshaping Adam's update, filling the
  ``"optimizer"`` slot (PPO) and starting at Adam (:mod:`.learned_optimizer`).
* ``"open_optimizer"``: the same with OPEN's dormancy, layer-position and learned-noise
  inputs (:mod:`.open_optimizer`).

Objectives defined elsewhere register the same way from their own module: an experiment
names it with ``[objective] module = "my_objectives"`` (or ``"path/to/file.py"``), and
installed packages declare theirs as entry points of the group ``metarl.objectives``
(:mod:`.sources`); a run keeps what it needs to import it again in every later command.
"""

from __future__ import annotations

import importlib
import pkgutil

from metarl.objectives.registry import (
    Tunable,
    available_objectives,
    get_objective,
    make_objective,
    register_objective,
)


def _import_all_modules() -> None:
    """Import every public module of this package so that each registers its objectives."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_import_all_modules()

__all__ = ["Tunable", "available_objectives", "get_objective", "make_objective",
           "register_objective"]
