"""A run directory packed into one file, to carry it to another machine and continue it
there (``metarl pack RUN_DIR`` / ``metarl unpack FILE``).

:func:`pack_run` writes a gzipped tar whose one top-level entry is the run directory
(a run, or a parent of replicated runs with its seeds): every file but ``run.lock``, whose
lock means something only on the machine of the process holding it. Checkpoints, metrics,
config and its history, status, meta-parameter files, evaluations, plots and damaged
checkpoints all travel, so ``metarl resume`` continues the unpacked run exactly as it would
have continued the original on the same backend. It refuses a directory that a process is
writing (its lock, or a seed's, is held) and holds the locks while it reads, so that no run
starts writing meanwhile; the archive is written under a temporary name and renamed.

:func:`unpack_run` restores one into a folder. It refuses to overwrite an existing directory,
and refuses archives whose members would land outside it (absolute paths, ``..``), links
and special files, more than one top-level entry, or a top level that is not a run. It
extracts into a temporary directory beside the target and renames it at the end, so a failed
unpack leaves no half-written run.

Nothing here starts JAX.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from metarl.runs.layout import CONFIG_FILE, LOCK_FILE, RunError, temporary_path
from metarl.runs.lock import RunLockedError, acquire, describe_holder, lock_holder
from metarl.runs.replicates import REPLICATES_FILE

SUFFIX = ".tar.gz"
# Checkpoints are float arrays, which gzip barely shrinks; its fastest level packs them
# several times faster than the default for nearly the same size.
COMPRESSLEVEL = 1


def _is_run(directory: Path) -> bool:
    return (directory / CONFIG_FILE).is_file() or (directory / REPLICATES_FILE).is_file()


def default_archive(run_dir: str | Path) -> Path:
    """Where :func:`pack_run` writes by default: ``<run_dir>.tar.gz`` beside the run."""
    run_dir = Path(run_dir).resolve()
    return run_dir.with_name(run_dir.name + SUFFIX)


def _lock_all(run_dir: Path, stack: contextlib.ExitStack) -> None:
    """Hold the lock of ``run_dir`` and of every run below it (a parent's seeds), or
    refuse naming the process that writes one."""
    for directory in sorted({run_dir} | {path.parent for path in run_dir.rglob(LOCK_FILE)}):
        holder = lock_holder(directory)
        if holder is not None:
            raise RunLockedError(
                f"{directory} is being written by {describe_holder(holder)}; pack it once "
                "that run has stopped (SIGTERM stops it cleanly)")
        try:
            stack.enter_context(acquire(directory, "metarl pack"))
        except RunLockedError as error:
            raise RunLockedError(f"{error}; pack it once that run has stopped") from None


def pack_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Pack ``run_dir`` into one ``.tar.gz`` (default :func:`default_archive`); returns its
    path. Raises :class:`~metarl.runs.layout.RunError` for a missing directory or one that
    is not a run, :class:`~metarl.runs.lock.RunLockedError` for a run being written, and
    for an archive that exists already."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run directory not found: {run_dir}")
    if not _is_run(run_dir):
        raise RunError(f"{run_dir} is not a metarl run: it has no {CONFIG_FILE} or "
                       f"{REPLICATES_FILE}")
    out = Path(out) if out is not None else default_archive(run_dir)
    if out.exists():
        raise RunError(f"{out} exists already; choose another file with -o FILE")
    if not out.parent.is_dir():
        raise RunError(f"cannot write {out}: folder {out.parent} not found")
    if out.resolve().is_relative_to(run_dir.resolve()):
        raise RunError(f"{out} lies inside the run directory it would pack; write it "
                       "elsewhere with -o FILE")
    name = run_dir.resolve().name

    def leave_out_lock(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if PurePosixPath(member.name).name == LOCK_FILE else member

    tmp = temporary_path(out)
    with contextlib.ExitStack() as stack:
        _lock_all(run_dir, stack)
        try:
            with tarfile.open(tmp, "w:gz", compresslevel=COMPRESSLEVEL) as archive:
                archive.add(run_dir, arcname=name, filter=leave_out_lock)
            os.replace(tmp, out)
        except OSError as error:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise RunError(f"could not write {out}: {error.strerror or error}") from error
    return out


def _check_members(members: list[tarfile.TarInfo], archive: Path) -> str:
    """The archive's one top-level name, or a :class:`RunError` naming a member that
    :func:`unpack_run` refuses."""
    tops = set()
    for member in members:
        path = PurePosixPath(member.name)
        if path.is_absolute() or member.name.startswith(("/", "\\")):
            raise RunError(f"{archive}: refusing member {member.name!r}: an absolute path")
        if ".." in path.parts:
            raise RunError(f"{archive}: refusing member {member.name!r}: it climbs out of "
                           "the folder with '..'")
        if not (member.isfile() or member.isdir()):
            raise RunError(f"{archive}: refusing member {member.name!r}: only files and "
                           "folders are unpacked, not links or special files")
        tops.add(path.parts[0] if path.parts else "")
    if len(tops) != 1 or "" in tops or "." in tops:
        raise RunError(f"{archive} does not hold one run directory (its top level: "
                       f"{', '.join(sorted(tops)) or 'nothing'})")
    return tops.pop()


def unpack_run(archive: str | Path, into: str | Path = ".") -> Path:
    """Unpack a run packed by :func:`pack_run` into the folder ``into`` (created if needed);
    returns the run directory. Raises :class:`~metarl.runs.layout.RunError` when the
    archive is missing, unreadable or refused (module doc), or the run directory exists."""
    archive, into = Path(archive), Path(into)
    if not archive.is_file():
        raise RunError(f"archive not found: {archive}")
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            name = _check_members(members, archive)
            names = {PurePosixPath(member.name) for member in members}
            if not {PurePosixPath(name, CONFIG_FILE), PurePosixPath(name, REPLICATES_FILE)
                    } & names:
                raise RunError(f"{archive} does not hold a metarl run: {name}/ has no "
                               f"{CONFIG_FILE} or {REPLICATES_FILE}")
            target = into / name
            if target.exists():
                raise RunError(f"{target} exists already; unpack into another folder with "
                               "--into DIR")
            try:
                into.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise RunError(f"cannot create {into}: {error.strerror or error}") from error
            staging = into / f".{name}.unpack-{os.getpid()}"
            try:
                # the "data" filter refuses again what _check_members refused, and drops
                # permissions that a run's files never need (set-uid, ...)
                tar.extractall(staging, members=members, filter="data")
                os.rename(staging / name, target)
            except OSError as error:
                raise RunError(f"could not unpack {archive} into {into}: "
                               f"{error.strerror or error}") from error
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except (tarfile.TarError, EOFError, OSError) as error:
        raise RunError(f"{archive} is not a readable .tar.gz of a run ({error})") from None
    return target
