"""The two engines of run kind ``evolve``, by the type of the experiment's ``[meta]`` table
(:mod:`metarl.evolve.metagradient_config`): what the commands reading a run of either need
to know of the engine that ran it (where its search started, what its fitness figure
shows). Which program runs is the run kind's (:func:`metarl.kinds.run_spec`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metarl.evolve.config import ExperimentConfig
from metarl.evolve.generation import search_start
from metarl.evolve.metagradient import metagradient_start
from metarl.evolve.metagradient_config import EvolutionMeta, MetaGradientConfig


@dataclass(frozen=True)
class Engine:
    """What a run's engine decides outside its program.

    Attributes:
        search_start: ``(objective, config) -> meta-parameters``: where the run's search
            started (``metarl evaluate RUN --start`` trains them beside its result).
        members: what one fitness of a ``metrics.jsonl`` line belongs to, as the fitness
            figure's legend names it (:func:`metarl.figures.records.plot_fitness`).
        fitness_title: the fitness figure's title after the run's name.
    """

    search_start: Callable[[Any, ExperimentConfig], Any]
    members: str
    fitness_title: str


def evolution_start(objective, config: ExperimentConfig):
    """An evolution's start: :func:`~metarl.evolve.generation.search_start` of
    ``run.seed``."""
    return search_start(objective, config.run.seed)


EVOLUTION = Engine(search_start=evolution_start, members="candidates",
                   fitness_title="fitness per generation")
# a meta-gradient run's line holds each agent's fitness over its updates of the step
METAGRADIENT = Engine(search_start=metagradient_start, members="agents",
                      fitness_title="the agents' fitness per meta-gradient step")
ENGINES: dict[type, Engine] = {EvolutionMeta: EVOLUTION, MetaGradientConfig: METAGRADIENT}


def engine_of(config: ExperimentConfig) -> Engine:
    """The :class:`Engine` of ``config``'s ``[meta]`` table."""
    return ENGINES[type(config.meta)]
