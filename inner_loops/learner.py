"""The contract every inner-loop algorithm implements: ``init``, ``advance``, ``train``.

An algorithm (PPO, DQN, ...) built for one config and one objective is a :class:`Learner`,
three pure functions over arrays:

- ``init(key, meta_params, hypers) -> state``: a fresh agent. ``state`` is one pytree (a
  ``flax.struct.dataclass``) holding everything that changes while it trains: network and
  target parameters, optimiser state, environment state, normaliser statistics, replay
  buffer, episode bookkeeping, PRNG key and the update counter ``update_count``.
- ``advance(state, meta_params, hypers, num_updates) -> (state, metrics)``: ``num_updates``
  more updates (a static Python ``int``). Schedules (learning-rate annealing, exploration,
  training progress ``n / N``) read ``state.update_count`` and the config's budget
  :attr:`Learner.num_updates`, never the length of the segment, so advancing ``k`` then
  ``N - k`` updates gives the same agent as advancing ``N`` at once.
- ``train(key, meta_params, hypers) -> metrics``: ``init`` then ``advance`` over the whole
  budget; what meta-evolution calls.

``meta_params`` are the objective's meta-parameters (``{"policy": ..., "value": ...}``) and
``hypers`` the algorithm's numeric hyperparameters (a NamedTuple of ``[]`` arrays); both
default to the objective's initialisation and the config's values when ``None``. Both are
traced, so a population can vary them under ``vmap``; everything that sets an array shape
lives in the config and is static.

``metrics`` is a dict of ``[num_updates]`` arrays. Every algorithm reports at least
``episode_return`` (mean return of the episodes finished during the update, carried forward
when none finished, NaN before the first) and ``finite`` (every loss of the update was
finite); fitness and evaluation read only these two.

An algorithm may also offer ``evaluate(state, key) -> metrics``: deterministic episodes
(greedy or mean action) of the agent's current policy, reported as ``eval_return`` and
``eval_length`` (``[]`` each) so they are never mistaken for the training returns, which
come from the exploring policy.

A population is the same pytree with a leading agent axis: see :mod:`inner_loops.population`
for ``vmap``, chunking and editing members, and :mod:`metarl.sharding` for devices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from inner_loops.envs import EnvSpec
from inner_loops.objective import Objective
from inner_loops.validation import check_positive_int

InitFn = Callable[[jax.Array, Any, Any], Any]
AdvanceFn = Callable[[Any, Any, Any, int], tuple[Any, dict[str, jax.Array]]]
EvaluateFn = Callable[[Any, jax.Array], dict[str, jax.Array]]


def strong_types(tree: Any) -> Any:
    """``tree`` with every leaf a strongly typed array of its own dtype, values unchanged;
    on host values and inside a trace alike.

    A jitted function is traced and compiled again for every new input type, and JAX counts
    a leaf's weak type (a Python scalar's) as part of it. Environment resets leave some
    leaves weakly typed (gymnax Pendulum's ``last_u``, step counters, running statistics'
    counts), while an update returns them strongly typed and orbax restores every leaf
    strongly typed: typed alike, a fresh, an advanced and a restored state share one
    compiled ``advance``."""
    return jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.asarray(leaf).dtype), tree)


@dataclass(frozen=True, eq=False)
class Learner:
    """One algorithm built for one config and objective (see the module docstring).

    Attributes:
        algorithm: the registered name (``"ppo"``, ...).
        config: the algorithm's config dataclass.
        objective: the losses it trains with, the algorithm's defaults filled in.
        spec: the environment's :class:`~inner_loops.envs.EnvSpec`.
        num_updates: updates in the whole budget (what ``train`` runs).
        steps_per_update: environment steps one agent takes per update.
        init_fn: ``(key, meta_params, hypers) -> state``, arguments already resolved.
        advance_fn: ``(state, meta_params, hypers, num_updates) -> (state, metrics)``.
        default_meta_params: ``objective.init(PRNGKey(0))``.
        default_hypers: the config's hyperparameters as ``[]`` float32 arrays.
        evaluate_fn: ``(state, key) -> {"eval_return": [], "eval_length": [], ...}``,
            deterministic episodes of the current policy; ``None`` when the algorithm has
            none.
    """

    algorithm: str
    config: Any
    objective: Objective
    spec: EnvSpec
    num_updates: int
    steps_per_update: int
    init_fn: InitFn
    advance_fn: AdvanceFn
    default_meta_params: Any
    default_hypers: Any
    evaluate_fn: EvaluateFn | None = None

    @property
    def steps_per_agent(self) -> int:
        """Environment steps one agent takes over the whole budget."""
        return self.num_updates * self.steps_per_update

    def _resolve(self, meta_params, hypers):
        return (self.default_meta_params if meta_params is None else meta_params,
                self.default_hypers if hypers is None else hypers)

    def init(self, key: jax.Array, meta_params=None, hypers=None):
        """A fresh agent state from ``key`` (``[2]`` or a typed key), typed as ``advance``
        returns it (:func:`strong_types`), so one compiled ``advance`` serves both."""
        meta_params, hypers = self._resolve(meta_params, hypers)
        return strong_types(self.init_fn(key, meta_params, hypers))

    def advance(self, state, meta_params=None, hypers=None, num_updates: int | None = None):
        """``num_updates`` more updates (default: the whole budget); returns
        ``(state, metrics)`` with ``[num_updates]`` metrics. ``num_updates`` is static:
        ``jax.jit(learner.advance, static_argnames="num_updates")``."""
        meta_params, hypers = self._resolve(meta_params, hypers)
        num_updates = self.num_updates if num_updates is None else num_updates
        check_positive_int("num_updates", num_updates)
        return self.advance_fn(state, meta_params, hypers, num_updates)

    def train(self, key: jax.Array, meta_params=None, hypers=None) -> dict[str, jax.Array]:
        """``init`` then ``advance`` over the whole budget; metrics ``[num_updates]``."""
        meta_params, hypers = self._resolve(meta_params, hypers)
        state = self.init_fn(key, meta_params, hypers)
        _, metrics = self.advance_fn(state, meta_params, hypers, self.num_updates)
        return metrics

    def evaluate(self, state, key: jax.Array) -> dict[str, jax.Array]:
        """Deterministic episodes (greedy or mean action) of ``state``'s current policy:
        ``eval_return`` and ``eval_length``, ``[]`` each (see the module docstring)."""
        if self.evaluate_fn is None:
            raise ValueError(f"algorithm {self.algorithm!r} has no deterministic evaluation")
        return self.evaluate_fn(state, key)
