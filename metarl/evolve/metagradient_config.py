"""The ``[meta]`` table of an evolution experiment: which engine discovers the objective.

.. code-block:: toml

    [meta]
    method = "metagradient"   # "evolution" (default): the [es] table's strategy
    steps = 200               # meta-gradient steps: the run's budget
    unroll = 4                # inner updates each meta-gradient differentiates through
    agents = 8                # agents trained side by side, each giving a meta-gradient
    learning_rate = 1e-3      # of the meta-optimiser (Adam by default)

The table is a tagged union: ``method`` picks its type, :class:`EvolutionMeta` for
``"evolution"`` (the default, also when the table is absent: nothing else is set here, and
the run is the evolution it always was) or :class:`MetaGradientConfig` for
``"metagradient"`` (:func:`meta_from_dict`), and a field of the other type is refused as an
unknown field naming the method it belongs to. A meta-gradient run differentiates through
the agents' own updates (:mod:`metarl.evolve.metagradient`); it has no evolution strategy,
so the ``[es]`` table must be left out, and of ``[fitness]`` only ``metric`` and
``final_fraction`` apply (they score the agents' returns and, as for evolution, ``metarl
evaluate``'s held-out seeds). Every field is documented on :class:`MetaGradientConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from inner_loops.registry import algorithm_of
from inner_loops.validation import (
    check_choice,
    check_non_negative,
    check_positive,
    check_positive_int,
)
from metarl.config import ConfigError, build_table

EVOLUTION = "evolution"
METAGRADIENT = "metagradient"
METHODS = (EVOLUTION, METAGRADIENT)
STAGGERS = ("uniform", "none")
OPTIMIZERS = ("adam", "sgd")
# what the updated agent is scored by (metarl.evolve.metagradient.meta_loss)
META_OBJECTIVES = ("actor_critic", "policy", "value_error")


def meta_from_dict(data: Any, path: str = "meta") -> EvolutionMeta | MetaGradientConfig:
    """The ``[meta]`` table ``data`` as the type its ``method`` picks (:data:`META_TYPES`;
    ``"evolution"`` when it names none). A field of another method's type is refused as an
    unknown field that names the method it belongs to."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table, got {data!r}")
    method = check_choice(f"{path}.method", data.get("method", EVOLUTION), METHODS,
                          ConfigError)

    def belongs_to(name: str) -> str:
        owners = [other for other, cls in META_TYPES.items()
                  if name in {field.name for field in fields(cls)}]
        return (f" with meta.method = {method!r}; a setting of meta.method = "
                f"{owners[0]!r}" if owners else "")

    return build_table(META_TYPES[method], data, path, unknown_note=belongs_to)


def _check_method(method: Any, expected: str) -> None:
    """The ``method`` a ``[meta]`` type was built with is its own (:func:`meta_from_dict`
    picks the type from it; only building the type directly can get it wrong)."""
    if method != expected:
        raise ConfigError(f"meta.method: this [meta] table is one of method {expected!r}, "
                          f"got {method!r} (meta_from_dict picks the table's type from its "
                          "method)")


@dataclass(frozen=True)
class EvolutionMeta:
    """``[meta]`` of an evolution (``method = "evolution"``, the default, also when the
    table is absent): the ``[es]`` table's strategy searches, and this table sets nothing
    else.

    Attributes:
        method: ``"evolution"``.
    """

    method: str = EVOLUTION

    def __post_init__(self):
        _check_method(self.method, EVOLUTION)

    def check_experiment(self, config) -> None:
        """An evolution reads every table of its experiment: nothing of ``config`` to
        refuse."""

    def omit_unused(self, data: dict[str, Any]) -> None:
        """Leave ``[meta]`` out of ``data``, the saved form of an experiment: an
        evolution's ``config.json`` reads as it did before ``[meta]`` existed."""
        del data["meta"]


@dataclass(frozen=True)
class MetaGradientConfig:
    """``[meta]`` of a meta-gradient run (``method = "metagradient"``): gradient descent
    through the agents' own updates (:mod:`metarl.evolve.metagradient`).

    Attributes:
        method: ``"metagradient"``.
        steps: meta-gradient steps, the run's budget (``metarl resume RUN --generations N``
            extends it to ``N``); a line of ``metrics.jsonl`` per step.
        unroll: ``K``, the inner updates each meta-gradient differentiates through: every
            step advances each agent ``K`` PPO updates under the current meta-parameters,
            then scores the updated agent (``objective``) on a fresh rollout and
            backpropagates through the ``K`` updates. Longer unrolls see further effects
            of the learned loss, at a cost in memory (linear in ``K`` with ``remat``) and
            in the gradient's variance.
        agents: agents trained side by side; the meta-gradient is their mean.
        lifetime: updates an agent trains before it is replaced by a fresh one (its
            learning rate annealing and training progress ``n / N`` run over the
            ``[inner]`` budget ``N`` as always). Default ``0``: the ``[inner]`` budget,
            ``total_timesteps / (num_envs * num_steps)`` updates. At most that budget, and
            a multiple of ``unroll``.
        stagger: ``"uniform"`` (default): agent ``i`` of ``A`` is first replaced after
            ``(i + 1) / A`` of a lifetime (rounded to whole unrolls), so from then on the
            agents are spread over every stage of training, as in LPG; ``"none"``: all
            agents start and restart together.
        optimizer: the meta-optimiser, ``"adam"`` (default) or ``"sgd"``.
        learning_rate: its step size.
        max_grad_norm: the meta-gradient is clipped to this global norm before the
            optimiser sees it; ``0``: not clipped.
        objective: what the updated agent is scored by, on a fresh rollout of its own
            whose advantages and value targets (GAE, with the agent's ``gamma`` and
            ``gae_lambda``) are held fixed: ``"actor_critic"`` (default; PPO's objective at
            ratio 1, i.e. the policy gradient, plus ``vf_coef`` times the critic's squared
            error against the rollout's lambda-returns, less ``ent_coef`` times the
            entropy), ``"policy"`` (the policy gradient and entropy terms only) or
            ``"value_error"`` (the critic's squared error alone: for a value distance).
        validation_rollouts: rollouts of the ``[inner]`` length the updated agent is scored
            on (one after the other, ``R``): more average out more of the returns' noise, at
            the cost of their environment steps and one forward pass each. Default 1.
        init_noise: the search starts at the objective's initialisation (as evolution's
            does) plus Gaussian noise of this standard deviation on every meta-parameter.
            An objective whose initialisation is a flat point of its loss (LPO's drift
            with ``ppo_init`` or ``zero_init``: ``relu(net - 1e-4)`` with ``net = 0``
            everywhere) has a meta-gradient of exactly zero there and never moves without
            it; such a start is refused with ``0``. Default ``0``.
        remat: recompute each inner update in the backward pass instead of storing its
            intermediate values (``jax.checkpoint``): memory linear in ``unroll`` at
            about one more forward pass of compute. Default on.
        rollout_gradient: also differentiate through what the inner rollouts produce
            (their log-probabilities, values, GAE targets, and continuous actions through
            the environment's dynamics): the exact derivative of the meta-objective, as
            finite differences measure it. Default off: rollouts are data, as in LPG.
    """

    method: str = METAGRADIENT
    steps: int = 100
    unroll: int = 4
    agents: int = 8
    lifetime: int = 0
    stagger: str = "uniform"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    objective: str = "actor_critic"
    validation_rollouts: int = 1
    init_noise: float = 0.0
    remat: bool = True
    rollout_gradient: bool = False

    def __post_init__(self):
        _check_method(self.method, METAGRADIENT)
        for name in ("steps", "unroll", "agents", "validation_rollouts"):
            check_positive_int(f"meta.{name}", getattr(self, name), ConfigError)
        if isinstance(self.lifetime, bool) or not isinstance(self.lifetime, int) or (
                self.lifetime < 0):
            raise ConfigError(f"meta.lifetime: must be a non-negative integer (0: the "
                              f"[inner] budget), got {self.lifetime!r}")
        if self.lifetime and self.lifetime % self.unroll:
            raise ConfigError(f"meta.lifetime: {self.lifetime} updates are not whole unrolls "
                              f"of meta.unroll = {self.unroll}; choose a multiple of "
                              f"{self.unroll}")
        check_choice("meta.stagger", self.stagger, STAGGERS, ConfigError)
        check_choice("meta.optimizer", self.optimizer, OPTIMIZERS, ConfigError)
        check_choice("meta.objective", self.objective, META_OBJECTIVES, ConfigError)
        check_positive("meta.learning_rate", self.learning_rate, ConfigError)
        check_non_negative("meta.max_grad_norm", self.max_grad_norm, ConfigError)
        check_non_negative("meta.init_noise", self.init_noise, ConfigError)
        for name in ("remat", "rollout_gradient"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"meta.{name}: expected true or false, got "
                                  f"{getattr(self, name)!r}")

    def check_experiment(self, config) -> None:
        """A meta-gradient run has no evolution strategy and scores one PPO task: the
        settings of ``config`` (an :class:`~metarl.evolve.config.ExperimentConfig`) that
        would not apply are refused, each named."""
        meta = f"a meta-gradient run (meta.method = {METAGRADIENT!r})"
        default_es = type(config.es)()
        for field in fields(config.es):
            if getattr(config.es, field.name) != getattr(default_es, field.name):
                raise ConfigError(f"es.{field.name}: {meta} has no evolution strategy, so "
                                  "no [es] table; its settings are in [meta] (its budget "
                                  "meta.steps)")
        default_fitness = type(config.fitness)()
        for field in fields(config.fitness):
            if (field.name not in ("metric", "final_fraction")
                    and getattr(config.fitness, field.name) != getattr(default_fitness,
                                                                        field.name)):
                raise ConfigError(f"fitness.{field.name}: not a setting of {meta}; of "
                                  "[fitness] it reads metric and final_fraction only")
        if len(config.inner) != 1:
            raise ConfigError(f"inner: {meta} trains on one [inner] task; got "
                              f"{len(config.inner)} (held-out tasks go in [[held_out]])")
        algorithm = algorithm_of(config.inner[0]).name
        if algorithm != "ppo":
            raise ConfigError(f"inner.algorithm: {meta} differentiates through PPO's "
                              f"updates; got {algorithm!r}")

    def omit_unused(self, data: dict[str, Any]) -> None:
        """Leave ``[es]`` out of ``data``, the saved form of an experiment: there is none
        (:meth:`check_experiment` keeps it at its defaults)."""
        del data["es"]


# the type of a [meta] table, by its method
META_TYPES: dict[str, type[EvolutionMeta] | type[MetaGradientConfig]] = {
    EVOLUTION: EvolutionMeta, METAGRADIENT: MetaGradientConfig}
