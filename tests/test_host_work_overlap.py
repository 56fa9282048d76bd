"""A step's host work beside the next step (:mod:`metarl.runs.engine`): the checkpoint of
generation ``k`` is saved while generation ``k + 1`` computes, the run directory is the one
the same run writes with the two in turn (the order a multi-process run keeps), and
``metrics.jsonl`` grows by appending one line a step; a last line cut short by a kill is
skipped by readers and gone after a resume, and an append that fails leaves the file as it
was.

The kill-and-resume guarantees themselves are the run-directory tests' (``test_runs.py``,
``test_run_directories.py``, ``test_stop_on_time.py``, ...), which run on the overlapped
engine.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import jax
import pytest
from _tiny_evolution import GENERATIONS
from test_stop_on_time import assert_same_run as assert_same_files_and_state
from test_stop_on_time import checkpoints

from metarl.evolve.kind import EvolveProgram
from metarl.kinds import load_experiment, resume, start
from metarl.runs import engine, layout
from metarl.runs.checkpoint import RunCheckpointer
from metarl.runs.layout import DiskFullError, read_jsonl, read_metrics
from metarl.runs.listing import run_info

WAIT = 30.0  # seconds a wrapped step or save waits for the other thread at most


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """:func:`test_stop_on_time.assert_same_run` (lines but their timings, meta-parameter
    files, the newest checkpoint's whole state, bit for bit) and the same checkpoints
    kept."""
    assert_same_files_and_state(run_dir, reference)
    assert checkpoints(run_dir) == checkpoints(reference)


@pytest.fixture(scope="module")
def overlapped(tiny_config_file, tmp_path_factory):
    """The tiny evolution (a checkpoint every generation), with what happens in which
    order noted: ``("start", k)`` and ``("end", k)`` around generation ``k``'s step (in
    the worker thread), ``("save", k, started_beside)`` when checkpoint ``k`` is saved (in
    the main thread). Each step ``k + 1`` waits for checkpoint ``k`` to be saved, and the
    save waits for step ``k + 1`` to have started (at most ``WAIT`` seconds): with the
    engine overlapping them both happen at once; an engine that saved before starting the
    next step would note ``started_beside = False``."""
    events: list[tuple] = []
    started = {k: threading.Event() for k in range(1, GENERATIONS + 2)}
    saved = {k: threading.Event() for k in range(GENERATIONS + 1)}
    saved[0].set()
    step, save = EvolveProgram.step, RunCheckpointer.save

    def noted_step(self, state):
        generation = self.completed(state) + 1
        events.append(("start", generation))
        started[generation].set()
        saved[generation - 1].wait(WAIT)
        out = jax.block_until_ready(step(self, state))
        events.append(("end", generation))
        return out

    def noted_save(self, generation, *args, **kwargs):
        beside = (generation == GENERATIONS  # the last has no next step
                  or started[generation + 1].wait(WAIT))
        events.append(("save", generation, beside))
        save(self, generation, *args, **kwargs)
        saved[generation].set()

    run_dir = tmp_path_factory.mktemp("overlap") / "overlapped"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EvolveProgram, "step", noted_step)
        patch.setattr(RunCheckpointer, "save", noted_save)
        start(load_experiment(tiny_config_file), run_dir)
    return run_dir, events


def test_each_checkpoint_is_saved_while_the_next_generation_computes(overlapped):
    _, events = overlapped
    saves = [event for event in events if event[0] == "save"]
    assert [event[1] for event in saves] == list(range(1, GENERATIONS + 1))
    assert all(beside for _, _, beside in saves), saves
    for k in range(1, GENERATIONS):
        assert (events.index(("start", k + 1)) < events.index(("save", k, True))
                < events.index(("end", k + 1))), events


def test_the_run_is_the_one_written_with_host_work_and_steps_in_turn(
        overlapped, tiny_config_file, tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "overlaps_host_work", lambda: False)
    in_turn = tmp_path / "in_turn"
    start(load_experiment(tiny_config_file), in_turn)
    assert_same_run(overlapped[0], in_turn)


def test_metrics_grow_by_one_appended_line_a_step(tiny_config_file, tmp_path, monkeypatch):
    """One whole write when the run starts writing (it may find lines a killed process
    left), then one append per generation."""
    writes, appends = [], []
    whole, append = engine.write_metrics, engine.append_metrics
    monkeypatch.setattr(engine, "write_metrics", lambda run_dir, history, *args, **kwargs: (
        writes.append(len(history)), whole(run_dir, history, *args, **kwargs))[1])
    monkeypatch.setattr(engine, "append_metrics", lambda run_dir, line: (
        appends.append(line["generation"]), append(run_dir, line))[1])
    run_dir = tmp_path / "appended"
    start(load_experiment(tiny_config_file, ["es.generations=3"]), run_dir)
    assert (writes, appends) == ([1], [2, 3])
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2, 3]


def test_a_last_line_cut_short_is_skipped_and_gone_after_the_resume(
        overlapped, tiny_config_file, tmp_path):
    """A process killed inside an append leaves part of a line without its newline: the
    readers skip it, ``metarl runs`` lists the run at its last whole line, and the resume
    writes the file anew from its checkpoint, then continues into the uninterrupted run."""
    run_dir = tmp_path / "torn"
    start(load_experiment(tiny_config_file, ["es.generations=2"]), run_dir)
    metrics = run_dir / "metrics.jsonl"
    whole = metrics.read_text()
    with open(metrics, "a") as handle:
        handle.write(json.dumps(read_metrics(run_dir)[-1])[:40])
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2]
    assert run_info(run_dir).generation == 2
    resume(run_dir, generations=GENERATIONS)
    text = metrics.read_text()
    assert text.startswith(whole) and text.endswith("}\n")
    assert_same_run(run_dir, overlapped[0])


def test_read_jsonl_skips_only_a_last_line_without_its_newline(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{"a": 2}')  # whole, its newline not yet written
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')  # damage inside is an error
    with pytest.raises(ValueError):
        read_jsonl(path)
    path.write_text('{"a": 1}\n{"a": \n')  # a last line with its newline was written whole
    with pytest.raises(ValueError):
        read_jsonl(path)


def test_an_append_that_fails_cuts_the_file_back(tmp_path, monkeypatch):
    """A full disk in the middle of the line: the part written is removed again and the
    error names the file and the way out."""
    path = tmp_path / "metrics.jsonl"
    layout.append_line(path, {"generation": 1})
    before = path.read_bytes()
    write = os.write

    def half_then_full(fd, data):
        if len(data) > 1:
            return write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(layout.os, "write", half_then_full)
    with pytest.raises(DiskFullError, match=r"disk full: could not write .*metrics\.jsonl"):
        layout.append_line(path, {"generation": 2, "fitness": [1.0, 2.0]}, tmp_path)
    assert path.read_bytes() == before
    monkeypatch.undo()
    layout.append_line(path, {"generation": 2})
    assert read_jsonl(path) == [{"generation": 1}, {"generation": 2}]
