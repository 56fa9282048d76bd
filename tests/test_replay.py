"""Tests of the in-jit replay buffer :mod:`inner_loops.replay`.

Contents against a plain-Python circular buffer (wraparound, batched adds), sampling only
from the filled part and uniformly over it, one buffer per agent under ``vmap``, and the
memory figure and error computed from shapes alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inner_loops import replay
from inner_loops.envs import make_env
from inner_loops.off_policy import Transition, example_transition


class Item:
    """An example transition with two leaves of different shapes and dtypes."""

    @staticmethod
    def example():
        return {"x": jax.ShapeDtypeStruct((2,), jnp.float32),
                "i": jax.ShapeDtypeStruct((), jnp.int32)}

    @staticmethod
    def batch(values):
        """Transitions numbered by ``values [n]``: ``x = [v, -v]``, ``i = v``."""
        values = np.asarray(values)
        return {"x": jnp.asarray(np.stack([values, -values], -1), jnp.float32),
                "i": jnp.asarray(values, jnp.int32)}


add = jax.jit(replay.add)
sample = jax.jit(replay.sample, static_argnums=2)


def reference_contents(batches, capacity):
    """Slot contents of a circular buffer after adding ``batches`` (lists of ids), by
    writing one id at a time; ``-1`` marks an empty slot."""
    slots, position = [-1] * capacity, 0
    for batch in batches:
        for value in batch:
            slots[position] = value
            position = (position + 1) % capacity
    return slots, position


def test_add_wraps_around_and_overwrites_the_oldest():
    buffer = replay.init(5, Item.example())
    assert buffer.capacity == 5
    assert int(buffer.size) == 0 and int(buffer.position) == 0
    for step, expected_size, expected_position in [(0, 2, 2), (1, 4, 4), (2, 5, 1), (3, 5, 3)]:
        buffer = add(buffer, Item.batch([10 * step + 1, 10 * step + 2]))
        assert int(buffer.size) == expected_size
        assert int(buffer.position) == expected_position
    # ids written in order 1 2 11 12 21 22 31 32 into 5 slots
    np.testing.assert_array_equal(buffer.storage["i"], [22, 31, 32, 12, 21])
    np.testing.assert_array_equal(buffer.storage["x"][:, 1], -np.array([22, 31, 32, 12, 21]))


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 7), sizes=st.lists(st.integers(1, 7), max_size=6))
def test_contents_match_a_python_circular_buffer(capacity, sizes):
    sizes = [min(n, capacity) for n in sizes]
    batches, next_id = [], 1
    for n in sizes:
        batches.append(list(range(next_id, next_id + n)))
        next_id += n
    buffer = replay.init(capacity, Item.example())
    for batch in batches:
        buffer = replay.add(buffer, Item.batch(batch))
    slots, position = reference_contents(batches, capacity)
    stored = np.where(np.array(slots) < 0, 0, slots)
    np.testing.assert_array_equal(buffer.storage["i"], stored)
    assert int(buffer.position) == position
    assert int(buffer.size) == min(capacity, sum(sizes))


def test_adding_more_than_the_capacity_at_once_is_an_error():
    buffer = replay.init(3, Item.example())
    with pytest.raises(ValueError, match=r"^capacity: 3 .* 4 transitions"):
        replay.add(buffer, Item.batch([1, 2, 3, 4]))


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True])
def test_capacity_must_be_a_positive_integer(capacity):
    with pytest.raises(ValueError, match=r"^capacity: must be a positive integer"):
        replay.init(capacity, Item.example())


def test_sampling_draws_only_filled_slots_and_uniformly():
    """7 of 100 slots filled: every sample is one of the 7, each about equally often (a
    chi-square test, 6 degrees of freedom; 22.5 is its 99.9% quantile)."""
    buffer = add(replay.init(100, Item.example()), Item.batch(np.arange(1, 8)))
    batch = sample(buffer, jax.random.PRNGKey(0), 7000)
    ids = np.asarray(batch["i"])
    assert set(np.unique(ids)) == set(range(1, 8))
    np.testing.assert_array_equal(np.asarray(batch["x"])[:, 0], ids)  # leaves stay paired
    counts = np.bincount(ids, minlength=8)[1:]
    chi2 = ((counts - 1000.0) ** 2 / 1000.0).sum()
    assert chi2 < 22.5, counts


def test_sampling_a_full_buffer_reaches_every_slot():
    buffer = replay.init(6, Item.example())
    for start in (1, 5, 9):  # 12 ids into 6 slots: the newest six survive
        buffer = add(buffer, Item.batch(np.arange(start, start + 4)))
    ids = np.asarray(sample(buffer, jax.random.PRNGKey(1), 3000)["i"])
    assert set(np.unique(ids)) == set(range(7, 13))


def test_index_batches_for_a_run_of_gradient_steps():
    """``sample_index_batches`` draws ``[num_batches, batch_size]`` slots of the filled part
    at once, each row read with ``gather`` as ``sample`` reads one batch."""
    buffer = add(replay.init(50, Item.example()), Item.batch(np.arange(1, 6)))
    indices = jax.jit(replay.sample_index_batches, static_argnums=(2, 3))(
        buffer, jax.random.PRNGKey(2), 400, 8)
    assert indices.shape == (400, 8) and indices.dtype == jnp.int32
    assert set(np.unique(np.asarray(indices))) == set(range(5))  # only the filled slots
    rows = jax.vmap(lambda row: replay.gather(buffer, row))(indices[:3])
    np.testing.assert_array_equal(np.asarray(rows["i"]), np.asarray(indices[:3]) + 1)
    np.testing.assert_array_equal(np.asarray(rows["x"])[..., 1], -np.asarray(rows["i"]))


def test_one_buffer_per_agent_under_vmap():
    """Three agents, each adding its own transitions and sampling with its own key: the
    vmapped buffers equal the agents' buffers built one by one."""
    agents, capacity = 3, 4

    def run(offset, key):
        buffer = replay.init(capacity, Item.example())
        for step in range(3):  # wraps: 6 transitions into 4 slots
            values = offset + 10 * step + jnp.arange(2)
            buffer = replay.add(buffer, {"x": jnp.stack([values, -values], -1).astype(jnp.float32),
                                         "i": values.astype(jnp.int32)})
        return buffer, replay.sample(buffer, key, 5)

    offsets = jnp.array([100, 200, 300])
    keys = jax.random.split(jax.random.PRNGKey(2), agents)
    buffers, batches = jax.jit(jax.vmap(run))(offsets, keys)
    assert buffers.storage["x"].shape == (agents, capacity, 2)
    assert buffers.position.tolist() == [2] * agents
    for agent in range(agents):
        alone, alone_batch = run(offsets[agent], keys[agent])
        np.testing.assert_array_equal(buffers.storage["i"][agent], alone.storage["i"])
        np.testing.assert_array_equal(batches["i"][agent], alone_batch["i"])
        assert np.all(np.asarray(batches["i"][agent]) // 100 == agent + 1)


# ----------------------------------------------------------------------------- memory


def test_transition_bytes_of_an_environment():
    """CartPole: obs and next_obs 4 float32 each, an int32 action, a float32 reward and a
    bool: 16 + 4 + 4 + 16 + 1 = 41 bytes."""
    example = example_transition(make_env("CartPole-v1").spec)
    assert isinstance(example, Transition)
    assert replay.transition_bytes(example) == 41
    assert replay.population_buffer_bytes(16, 10_000, example) == 16 * 10_000 * 41
    pendulum = example_transition(make_env("Pendulum-v1").spec)
    assert replay.transition_bytes(pendulum) == 12 + 4 + 4 + 12 + 1  # a [1] float32 action


def test_population_bytes_allocate_nothing(compilations):
    """A terabyte-sized population is only a number: ``eval_shape`` traces, runs nothing."""
    example = {"obs": jax.ShapeDtypeStruct((84, 84, 4), jnp.uint8)}
    before = compilations.count()
    figure = replay.population_buffer_bytes(1024, 1_000_000, example)
    assert figure == 1024 * 1_000_000 * 84 * 84 * 4
    assert compilations.count() == before


def test_check_buffer_memory_passes_what_fits_and_names_the_options():
    example = Item.example()  # 12 bytes per transition
    assert replay.check_buffer_memory(4, 1000, example, available=100_000) == 48_000
    with pytest.raises(MemoryError) as info:
        replay.check_buffer_memory(64, 1_000_000, example, available=2**29)
    message = str(info.value)
    # 64 x 1e6 x 12 bytes = 768e6 bytes = 732.4 MiB; 80% of 512 MiB holds 559240 slots
    # per agent, or 35 agents at this capacity
    for words in ("732.4 MiB", "64 agents x capacity 1000000 x 12 bytes per transition",
                  "512.0 MiB", "smaller capacity (at most 559240", "chunk_size (at most 35 ",
                  "more devices"):
        assert words in message, message


def test_check_buffer_memory_reads_the_host_memory():
    available = replay.available_memory_bytes()
    assert available is not None and available > 0
    example = Item.example()
    replay.check_buffer_memory(1, 10, example)  # 120 bytes always fit
    too_many = 2 * available // 12 + 1
    with pytest.raises(MemoryError, match="smaller capacity"):
        replay.check_buffer_memory(1, too_many, example)


def test_format_bytes():
    assert replay.format_bytes(512) == "512 B"
    assert replay.format_bytes(1536) == "1.5 KiB"
    assert replay.format_bytes(3 * 2**30) == "3.0 GiB"
