"""Experiment files of the run kinds over a population of TD3 actors sharing one critic:
``cem_rl`` (:mod:`.cem_rl_run`) and ``dvd`` (:mod:`.dvd_run`).

Such a file has four parts; the method's table is named after the kind:

.. code-block:: toml

    kind = "cem_rl"              # or "dvd"
    name = "cem_rl_pendulum"
    [inner]                      # TD3's settings (algorithm "td3", the only one allowed)
    env_id = "Pendulum-v1"
    [cem_rl]                     # CEMRLConfig's fields but inner ([dvd]: DvDConfig's)
    population_size = 10
    [run]                        # RunConfig: seed, checkpoint_every, keep_checkpoints, ...

``run.chunk_size`` and ``run.shard`` do not apply: the actors share one critic and one
replay buffer, and the whole population trains as one program on one device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metarl.config import (
    ConfigError,
    RunConfig,
    build_table,
    inner_to_dict,
    plain,
    refuse_tables,
    single_inner,
)


@dataclass(frozen=True)
class MethodExperimentConfig:
    """An experiment of a population method over TD3 actors.

    Attributes:
        kind: ``"cem_rl"`` or ``"dvd"``.
        method: the method's config (:class:`~metarl.population.cem_rl.CEMRLConfig` or
            :class:`~metarl.population.dvd.DvDConfig`), holding the TD3 settings as
            ``inner``.
        name: used for the run directory.
        description: free text.
        run: see :class:`~metarl.config.RunConfig`; ``checkpoint_every`` counts the kind's
            steps (generations or segments), ``max_invalid_generations`` stops the run
            after that many steps in a row in which no member stayed valid.
    """

    kind: str
    method: Any
    name: str = ""
    description: str = ""
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.kind)

    @property
    def inner(self):
        """The TD3 settings."""
        return self.method.inner

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form that :func:`method_config_from_dict` reads back to an equal
        config."""
        method = {f.name: getattr(self.method, f.name)
                  for f in dataclasses.fields(self.method) if f.name != "inner"}
        return plain({"kind": self.kind, "name": self.name, "description": self.description,
                      "inner": inner_to_dict(self.method.inner), self.kind: method,
                      "run": dataclasses.asdict(self.run)})

    def replace(self, **changes) -> MethodExperimentConfig:
        return dataclasses.replace(self, **changes)


def method_config_from_dict(kind: str, method_class: type, data: dict[str, Any]
                            ) -> MethodExperimentConfig:
    """Build and validate the experiment of ``kind`` from plain data (``kind`` is optional
    in ``data``; if present it must be ``kind``). Errors name the field's path in the file."""
    data = dict(data)
    given = data.pop("kind", kind)
    if given != kind:
        raise ConfigError(f"kind: expected {kind!r} here, got {given!r}")
    refuse_tables(data, kind, ("inner", kind))
    inner = single_inner(data.pop("inner", {}), kind, algorithm="td3")
    table = data.pop(kind, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{kind}: expected a table, got {table!r}")
    if "inner" in table:
        raise ConfigError(f"{kind}.inner: TD3's settings go in the top-level [inner] table")
    try:
        method = build_table(method_class, {**table, "inner": inner}, kind)
    except ConfigError as error:  # the method's own messages already start with its kind
        text = str(error).replace(f"{kind}.{kind}.", f"{kind}.")
        raise ConfigError(text.replace(f"{kind}.inner", "inner")) from None
    run = build_table(RunConfig, data.pop("run", {}), "run")
    unknown = sorted(set(data) - {"name", "description"})
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown field; allowed: kind, name, description, "
                          f"inner, {kind}, run")
    return build_table(MethodExperimentConfig,
                       {**data, "kind": kind, "method": method, "run": run}, "")


def shared_method_programs(config: MethodExperimentConfig, kind: str,
                           make: Callable[[Any], Any], jit_step: Callable[[Any], Any]
                           ) -> tuple[Any, Any, Any]:
    """``(run, jitted step, jitted init)`` of the method ``make(config.method)`` builds,
    traced and compiled once for every program of an equal config in a process
    (:func:`metarl.programs.shared_program`); ``jit_step(run)`` jits its generation or
    segment. A setting the method refuses is a :class:`ConfigError` naming its field."""
    import jax

    from metarl.programs import program_key, shared_program

    def build():
        try:
            run = make(config.method)
        except ValueError as error:
            raise ConfigError(str(error).removeprefix(f"{kind}.")) from None
        return run, jit_step(run), jax.jit(run.init)

    return shared_program(program_key(config, kind), build)
