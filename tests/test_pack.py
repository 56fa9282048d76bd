"""A run directory that travels (:mod:`metarl.runs.archive`): ``metarl pack`` writes it into
one ``.tar.gz``, ``metarl unpack`` restores it elsewhere, and the resumed copy continues bit
for bit; what each refuses (a run being written, an existing directory or file, archives
that would write outside their folder); and a run continued on another backend, warned about
and recorded.

Every run is the tiny evolution of ``tests/_tiny_evolution.py``, whose compiled generation
the other run-directory tests share.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from _tiny_evolution import GENERATIONS

from metarl.cli import main
from metarl.kinds import load_experiment, load_run, resume, start
from metarl.runs import engine
from metarl.runs.archive import pack_run, unpack_run
from metarl.runs.layout import RunError, read_metrics, read_metrics_and_events
from metarl.runs.lock import RunLockedError, acquire
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, load_meta_params

TIMINGS = ("seconds", "agent_steps_per_second", "time")


@pytest.fixture(scope="module")
def reference(tiny_config_file, tmp_path_factory) -> Path:
    """An uninterrupted run of GENERATIONS generations."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference"
    start(load_experiment(tiny_config_file), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def one_generation(tiny_config_file, tmp_path_factory) -> Path:
    """The same experiment after its first generation."""
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    start(load_experiment(tiny_config_file, ["es.generations=1"]), run_dir)
    return run_dir


def lines(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in read_metrics(run_dir)]


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Every line but its timings, the meta-parameter files and the final state, bit for
    bit."""
    assert lines(run_dir) == lines(reference)
    for name in (BEST_FILE, MEAN_FILE):
        for mine, want in zip(jax.tree.leaves(load_meta_params(run_dir / name)),
                              jax.tree.leaves(load_meta_params(reference / name)), strict=True):
            np.testing.assert_array_equal(mine, want)
    for mine, want in zip(jax.tree.leaves(load_run(run_dir).state),
                          jax.tree.leaves(load_run(reference).state), strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(want))


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file()}


def test_a_packed_run_unpacks_elsewhere_and_resumes_bit_for_bit(one_generation, reference,
                                                                tmp_path, capsys):
    here = shutil.copytree(one_generation, tmp_path / "here" / "tiny")
    archive = tmp_path / "carried.tar.gz"
    assert main(["pack", str(here), "-o", str(archive)]) == 0
    assert f"packed {here} into {archive}" in capsys.readouterr().out
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert all(name == "tiny" or name.startswith("tiny/") for name in names)
    assert "tiny/run.lock" not in names and "tiny/checkpoints/1/state/_METADATA" in names

    there = tmp_path / "elsewhere"
    assert main(["unpack", str(archive), "--into", str(there)]) == 0
    assert f"unpacked {there / 'tiny'}; `metarl resume {there / 'tiny'}`" in \
        capsys.readouterr().out
    # every file but the lock, unchanged
    assert files(there / "tiny") == {name: data for name, data in files(here).items()
                                     if name != "run.lock"}
    assert not [p for p in there.iterdir() if p.name != "tiny"]  # no staging left behind
    result = resume(there / "tiny", generations=GENERATIONS)
    assert int(result.state.generation) == GENERATIONS
    assert_same_run(there / "tiny", reference)


def test_pack_writes_beside_the_run_by_default_and_never_over_a_file(one_generation,
                                                                     tmp_path):
    run_dir = shutil.copytree(one_generation, tmp_path / "tiny")
    archive = pack_run(run_dir)
    assert archive == tmp_path / "tiny.tar.gz" and archive.is_file()
    with pytest.raises(RunError, match=r"tiny\.tar\.gz exists already; choose another"):
        pack_run(run_dir)
    with pytest.raises(RunError, match="lies inside the run directory"):
        pack_run(run_dir, run_dir / "self.tar.gz")
    with pytest.raises(RunError, match="is not a metarl run"):
        pack_run(tmp_path)
    with pytest.raises(RunError, match="run directory not found"):
        pack_run(tmp_path / "missing")
    assert not list(tmp_path.glob(".*.tmp"))


def test_pack_refuses_a_run_being_written(one_generation, tmp_path, capsys):
    run_dir = shutil.copytree(one_generation, tmp_path / "tiny")
    with acquire(run_dir, "metarl resume tiny"):
        with pytest.raises(RunLockedError, match=r"is being written by process \d+ .*pack it "
                                                  r"once that run has stopped"):
            pack_run(run_dir)
        assert main(["pack", str(run_dir)]) == 2
        assert "metarl pack: error:" in capsys.readouterr().err
    assert not (tmp_path / "tiny.tar.gz").exists()
    assert pack_run(run_dir).is_file()  # once the writer has gone


def test_unpack_never_overwrites_a_run_directory(one_generation, tmp_path, capsys):
    archive = pack_run(one_generation, tmp_path / "tiny.tar.gz")
    into = tmp_path / "there"
    (into / "tiny").mkdir(parents=True)
    (into / "tiny" / "mine.txt").write_text("keep")
    with pytest.raises(RunError, match=r"there/tiny exists already; unpack into another"):
        unpack_run(archive, into)
    assert main(["unpack", str(archive), "--into", str(into)]) == 2
    assert "metarl unpack: error:" in capsys.readouterr().err
    assert [p.name for p in (into / "tiny").iterdir()] == ["mine.txt"]


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"{}") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(("members", "message"), [
    ([_file("run/config.json"), _file("/etc/evil")], "'/etc/evil': an absolute path"),
    ([_file("run/config.json"), _file("run/../../evil")], "climbs out of the folder"),
    ([_file("run/config.json"), _link("run/escape", "/etc/passwd")],
     "only files and folders are unpacked"),
    ([_file("run/config.json"), _link("run/hard", "/etc/passwd", tarfile.LNKTYPE)],
     "only files and folders are unpacked"),
    ([_file("run/config.json"), _file("other/config.json")], "does not hold one run "
                                                             "directory"),
    ([_file("run/notes.txt")], "does not hold a metarl run"),
])
def test_unpack_refuses_archives_that_would_write_outside_or_are_no_run(members, message,
                                                                        tmp_path):
    archive = _archive(tmp_path / "bad.tar.gz", members)
    into = tmp_path / "into"
    with pytest.raises(RunError, match=message):
        unpack_run(archive, into)
    assert not into.exists() or not list(into.iterdir())
    assert not (tmp_path / "etc").exists() and not (tmp_path.parent / "evil").exists()


def test_unpack_refuses_what_is_not_an_archive(tmp_path):
    (tmp_path / "run.tar.gz").write_bytes(b"not a tar at all")
    with pytest.raises(RunError, match="is not a readable .tar.gz of a run"):
        unpack_run(tmp_path / "run.tar.gz", tmp_path / "into")
    with pytest.raises(RunError, match="archive not found"):
        unpack_run(tmp_path / "missing.tar.gz", tmp_path / "into")


def test_a_run_resumed_on_another_backend_is_warned_about_and_recorded(
        one_generation, tmp_path, monkeypatch):
    """The backend is in ``status.json`` and every checkpoint; a run continued on another
    one (here a GPU, as far as the engine can tell, and back) is warned about each time
    (its numbers will no longer repeat an uninterrupted run) and each change recorded as a
    ``backend_change`` event, not refused."""
    run_dir = shutil.copytree(one_generation, tmp_path / "tiny")
    here = engine.current_backend()
    assert json.loads((run_dir / "status.json").read_text())["backend"] == here
    assert here["platform"] == jax.default_backend() and here["jax"] == jax.__version__
    gpu = {"platform": "gpu", "device_kind": "NVIDIA H200", "jax": "0.11.2"}
    monkeypatch.setattr(engine, "current_backend", lambda: gpu)
    with pytest.warns(UserWarning, match=rf"checkpointed on {here['platform']} .* and resumes "
                                         r"on gpu \(NVIDIA H200, jax 0\.11\.2\)"):
        resume(run_dir, generations=2)  # checkpoint 2 written "on the GPU"
    assert json.loads((run_dir / "status.json").read_text())["backend"] == gpu
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=r"checkpointed on gpu \(NVIDIA H200, jax 0\.11\.2\) "
                                         r"and resumes on .*will differ"):
        resume(run_dir, generations=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same backend again: nothing to say
        resume(run_dir, generations=4)
    events = [line for line in read_metrics_and_events(run_dir) if "event" in line]
    assert [(e["event"], e["after_step"], e["from"], e["to"]) for e in events] == [
        ("backend_change", 1, here, gpu), ("backend_change", 2, gpu, here)]
    assert json.loads((run_dir / "status.json").read_text())["backend"] == here
    assert [line["generation"] for line in read_metrics(run_dir)] == [1, 2, 3, 4]
