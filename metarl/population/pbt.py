"""Population-based training (PBT) of any registered algorithm, one jit per segment.

The population advances ``segment_updates`` updates at a time (one vmapped, chunked and
optionally sharded call on the learner's ``advance``). After each segment the members are
ranked by their recent return; each member of the bottom ``exploit_fraction`` copies the
**whole state** of a member drawn uniformly from those of the top ``exploit_fraction`` that
scored strictly more than it did (parameters, target networks, optimiser state, environment
state, replay buffer, key: it continues exactly as its source would) and its
hyperparameters, then *explores*: each hyperparameter
with a prior is multiplied by one of ``perturb_factors`` (a step on the log scale) or drawn
afresh from its prior, and clipped to the prior's bounds. A bottom member that no top member
beats (a tie, e.g. a population at CartPole's maximum return of 500) is kept as it is.
Training, ranking, copying and exploring of one segment are one jitted function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from inner_loops.population import AUTO, ChunkSize, select_members
from inner_loops.validation import check_choice, check_in_range, check_positive_int
from metarl.population import priors as priors_lib
from metarl.population.priors import Prior

EXPLORE_MODES = ("perturb", "resample")


@dataclass(frozen=True)
class PBTConfig:
    """How the population trains, ranks and copies.

    Attributes:
        population_size: members trained together.
        segment_updates: updates between two exploit steps.
        exploit_fraction: the bottom fraction copies from the top fraction, in ``(0, 0.5]``.
        explore: ``"perturb"`` (multiply by one of ``perturb_factors``) or ``"resample"``
            (draw from the prior).
        perturb_factors: factors a perturbed hyperparameter is multiplied by.
        fitness_window: a member's score is its mean episode return over the last this many
            updates of the segment.
        reseed_copies: give each member that copies another a fresh PRNG key (the state's
            ``key`` field) instead of its source's, so that copies explore with their own
            noise rather than repeating their source's; off by default, when a copy
            continues exactly as its source would.
        copy_buffer: a member that copies another takes its source's replay buffer with the
            rest of the state (the default: it continues exactly as its source would);
            ``False`` keeps the member's own buffer, so the copy learns from the
            experience it gathered itself (off-policy algorithms only).
        priors: hyperparameter name -> :class:`~metarl.population.priors.Prior`; members
            start from draws of them, and only these hyperparameters are explored.
    """

    population_size: int = 8
    segment_updates: int = 10
    exploit_fraction: float = 0.25
    explore: str = "perturb"
    perturb_factors: tuple[float, ...] = (0.8, 1.2)
    fitness_window: int = 1
    priors: Mapping[str, Prior] = field(default_factory=dict)
    reseed_copies: bool = False
    copy_buffer: bool = True

    def __post_init__(self):
        check_positive_int("pbt.population_size", self.population_size)
        check_positive_int("pbt.segment_updates", self.segment_updates)
        check_positive_int("pbt.fitness_window", self.fitness_window)
        check_in_range("pbt.exploit_fraction", self.exploit_fraction, 0.0, 0.5, low_open=True)
        check_choice("pbt.explore", self.explore, EXPLORE_MODES)
        if not self.perturb_factors:
            raise ValueError("pbt.perturb_factors: give at least one factor")
        for index, factor in enumerate(self.perturb_factors):
            check_in_range(f"pbt.perturb_factors[{index}]", factor, 1e-6, 1e6)
        if self.num_exploited < 1:
            raise ValueError(
                f"pbt.population_size: {self.population_size} members with exploit_fraction "
                f"{self.exploit_fraction} leave no member to copy; use at least "
                f"{int(-(-1 // self.exploit_fraction))} members or a larger fraction")
        for name in ("reseed_copies", "copy_buffer"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"pbt.{name}: expected true or false, got "
                                 f"{getattr(self, name)!r}")
        for name, prior in self.priors.items():
            if not isinstance(prior, Prior):
                raise ValueError(f"pbt.priors.{name}: expected a Prior, got {prior!r}")

    @property
    def num_exploited(self) -> int:
        """Members replaced (and members copied from) at each exploit step."""
        return int(self.population_size * self.exploit_fraction)


class ExploitRecord(NamedTuple):
    """What one exploit step did, per member ``[P]``.

    Attributes:
        source: the member each one is now a copy of (itself when kept).
        replaced: whether it was replaced (and explored).
    """

    source: jax.Array
    replaced: jax.Array


def recent_return(metrics: dict[str, jax.Array], window: int) -> jax.Array:
    """Mean episode return of each member over the last ``window`` updates; ``[P, U] ->
    [P]``. NaN (no episode finished, or a diverged member) ranks last."""
    return jnp.nanmean(metrics["episode_return"][:, -window:], axis=-1)


def exploit_and_explore(key: jax.Array, fitness: jax.Array, states: Any, hypers: Any,
                        config: PBTConfig, exploit: jax.Array | bool = True
                        ) -> tuple[Any, Any, ExploitRecord]:
    """One PBT step.

    The ``config.num_exploited`` lowest-scoring members (ties ranked in member order) are
    the candidates for replacement, as many highest-scoring ones the donors. A candidate is
    replaced only by a donor whose score is strictly higher than its own, drawn uniformly
    from those; a candidate that no donor beats (tied with all of them) is kept, its
    hyperparameters unexplored. NaN scores count as ``-inf``: a NaN member is replaced by
    a finite donor, and a population without a finite score is left as it is.

    Args:
        key: PRNG key.
        fitness: ``[P]`` scores (higher is better; NaN ranks last).
        states: the population's states, leading axis ``[P]``.
        hypers: the population's hyperparameters (a NamedTuple of ``[P]`` arrays).
        config: fractions, explore mode, priors.
        exploit: ``False`` leaves the population as it is (e.g. after the last segment).

    Returns ``(states, hypers, record)``.
    """
    size = fitness.shape[0]
    count = config.num_exploited
    score = jnp.where(jnp.isnan(fitness), -jnp.inf, fitness)
    order = jnp.argsort(score, stable=True)  # worst first; ties keep member order
    bottom, top = order[:count], order[size - count:]
    choice_key, explore_key = jax.random.split(key)
    # ``top`` ascends in score, so the donors that beat a candidate are a suffix of it
    better = jnp.sum(score[top][None, :] > score[bottom][:, None], axis=1)  # [count]
    draw = jax.random.randint(choice_key, (count,), 0, jnp.maximum(better, 1))
    # when every donor beats every candidate: top[randint(0, count)], the draw as it always was
    donors = top[count - jnp.maximum(better, 1) + draw]
    members = jnp.arange(size)
    replaced = (jnp.zeros(size, bool).at[bottom].set(better > 0)) & jnp.asarray(exploit)
    source = jnp.where(replaced, members.at[bottom].set(donors), members)
    copied_states = select_members(states, source)
    if not config.copy_buffer:
        copied_states = keep_own_buffers(copied_states, states)
    states = copied_states
    if config.reseed_copies:  # a key of its own (fold_in leaves the other draws as they were)
        states = reseed_members(jax.random.fold_in(key, 1), states, replaced)
    copied = select_members(hypers, source)
    if config.explore == "perturb":
        explored = priors_lib.perturb(explore_key, config.priors, copied, config.perturb_factors)
    else:
        explored = priors_lib.sample(explore_key, config.priors, copied)
    hypers = jax.tree.map(lambda new, old: jnp.where(replaced, new, old), explored, copied)
    return states, hypers, ExploitRecord(source.astype(jnp.int32), replaced)


def place_population(states: Any, hypers: Any, mesh) -> tuple[Any, Any]:
    """Constrain (inside ``jit``) a population to the placement every segment returns:
    states split along the agent axis over ``mesh`` (replicated when the population does
    not divide evenly), hyperparameters replicated. With one placement from the first
    segment on, the segment compiles once, and a restored population is placed alike."""
    from jax.sharding import NamedSharding, PartitionSpec

    from metarl import sharding

    if mesh is None or sharding.num_shards(mesh) == 1:
        return states, hypers
    size = jax.tree.leaves(states)[0].shape[0]
    spec = (PartitionSpec(tuple(mesh.axis_names))
            if size % sharding.num_shards(mesh) == 0 else PartitionSpec())
    states = jax.lax.with_sharding_constraint(states, NamedSharding(mesh, spec))
    return states, sharding.replicate(hypers, mesh)


def keep_own_buffers(copied: Any, own: Any) -> Any:
    """``copied`` (a population after copying) with every
    :class:`~inner_loops.replay.ReplayBuffer` taken from ``own`` (the population before):
    each member keeps its own buffer whatever else it copied. A member kept as it was is its
    own source, so only the copies change."""
    from inner_loops.replay import ReplayBuffer

    def is_buffer(node) -> bool:
        return isinstance(node, ReplayBuffer)

    if not any(is_buffer(node) for node in jax.tree.leaves(copied, is_leaf=is_buffer)):
        raise ValueError("pbt.copy_buffer: false needs a learner with a replay buffer (DQN, "
                         "TD3, SAC); this one has none")
    return jax.tree.map(lambda new, old: old if is_buffer(new) else new, copied, own,
                        is_leaf=is_buffer)


def reseed_members(key: jax.Array, states: Any, members: jax.Array) -> Any:
    """``states`` with a fresh PRNG key for every member where ``members [P]`` is true: the
    leaves named ``key`` (raw ``uint32 [P, 2]`` keys, the learner contract's state key)."""
    found = []

    def fresh(path, leaf):
        last = path[-1] if path else None
        name = getattr(last, "name", getattr(last, "key", None))
        if name != "key" or leaf.dtype != jnp.uint32 or leaf.ndim != 2:
            return leaf
        found.append(name)
        new = jax.random.split(jax.random.fold_in(key, len(found)), leaf.shape[0])
        return jnp.where(members[:, None], new.astype(leaf.dtype), leaf)

    states = jax.tree_util.tree_map_with_path(fresh, states)
    if not found:
        raise ValueError("pbt.reseed_copies: the learner's state has no `key` field of raw "
                         "uint32 keys to replace")
    return states


def make_segment(learner, config: PBTConfig, chunk_size: ChunkSize = AUTO, mesh=None):
    """The jitted ``segment(states, hypers, key, exploit) -> (states, hypers, metrics,
    fitness, record)``: ``segment_updates`` updates of the whole population, then one
    :func:`exploit_and_explore`. ``mesh`` shards the population over devices
    (:func:`place_population`)."""
    from metarl import sharding

    def segment(states, hypers, key, exploit):
        states, metrics = sharding.advance_population(
            learner, states, None, hypers, config.segment_updates, chunk_size, mesh)
        fitness = recent_return(metrics, config.fitness_window)
        states, hypers, record = exploit_and_explore(key, fitness, states, hypers, config,
                                                     exploit)
        states, hypers = place_population(states, hypers, mesh)
        return states, hypers, metrics, fitness, record

    return jax.jit(segment)


def initial_population(learner, config: PBTConfig, key: jax.Array,
                       chunk_size: ChunkSize = AUTO, mesh=None) -> tuple[Any, Any]:
    """Fresh states and hyperparameters of ``config.population_size`` members: the
    learner's hyperparameters with every field that has a prior drawn from it."""
    from metarl import sharding

    priors_lib.check_priors(config.priors, learner.default_hypers)
    hypers_key, init_key = jax.random.split(key)
    hypers = jax.tree.map(
        lambda x: jnp.broadcast_to(x, (config.population_size, *jnp.shape(x))),
        learner.default_hypers)
    hypers = priors_lib.sample(hypers_key, config.priors, hypers)
    keys = jax.random.split(init_key, config.population_size)

    def init(keys, hypers):
        # strongly typed, as every segment returns them (learner.init)
        states = sharding.init_population(learner, keys, None, hypers, chunk_size, mesh)
        return place_population(states, hypers, mesh)

    return jax.jit(init)(keys, hypers)


@dataclass(frozen=True)
class PBTResult:
    """A finished PBT run.

    Attributes:
        states, hypers: the final population (leading axis ``[P]``).
        history: one dict per segment: ``fitness [P]``, ``hypers`` (name -> ``[P]`` values
            trained with in the segment), ``source [P]`` and ``replaced [P]`` of the exploit
            step that followed it, ``returns [P, U]`` episode returns per update.
    """

    states: Any
    hypers: Any
    history: list[dict[str, Any]]


def num_segments(learner, config: PBTConfig) -> int:
    """Segments in the learner's budget; ``segment_updates`` must divide it."""
    if learner.num_updates % config.segment_updates:
        raise ValueError(
            f"pbt.segment_updates: {config.segment_updates} does not divide the "
            f"{learner.num_updates} updates of the budget")
    return learner.num_updates // config.segment_updates


def train_pbt(learner, config: PBTConfig, key: jax.Array, chunk_size: ChunkSize = AUTO,
              mesh=None) -> PBTResult:
    """Train a population with PBT over the learner's whole budget (no exploit after the
    last segment)."""
    segments = num_segments(learner, config)
    init_key, key = jax.random.split(key)
    states, hypers = initial_population(learner, config, init_key, chunk_size, mesh)
    segment = make_segment(learner, config, chunk_size, mesh)
    history = []
    for index, segment_key in enumerate(jax.random.split(key, segments)):
        trained_with = hypers
        states, hypers, metrics, fitness, record = segment(
            states, hypers, segment_key, jnp.asarray(index < segments - 1))
        history.append(segment_record(trained_with, metrics, fitness, record))
    return PBTResult(states, hypers, history)


def segment_record(hypers, metrics, fitness, record: ExploitRecord) -> dict[str, Any]:
    """One segment of :attr:`PBTResult.history` as plain Python lists."""
    hypers, metrics, fitness, record = jax.device_get((hypers, metrics, fitness, record))
    return {
        "fitness": [float(f) for f in fitness],
        "hypers": {name: [float(v) for v in values]
                   for name, values in hypers._asdict().items()},
        "source": [int(s) for s in record.source],
        "replaced": [bool(r) for r in record.replaced],
        "returns": [[float(r) for r in row] for row in metrics["episode_return"]],
    }


def lineage(history: list[dict[str, Any]], member: int) -> list[int]:
    """The members that ``member`` descends from, one per segment, oldest first: entry
    ``s`` is whose state it carried during segment ``s``."""
    chain = [member]
    for record in reversed(history[:-1]):
        chain.append(record["source"][chain[-1]])
    return chain[::-1]
