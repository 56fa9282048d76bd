"""Runs that stop on time: a time limit, and the signals (SIGTERM, SIGINT) that end jobs.

A run trains under :func:`stop_conditions` (``metarl run|resume --time-limit``,
:func:`metarl.kinds.start` / :func:`~metarl.kinds.resume` with ``time_limit``), and the
engine (:mod:`metarl.runs.engine`) asks its :class:`Stopper` whether to go on:

- **Between steps** (:meth:`Stopper.before_step`): it stops after a signal, or when the
  time left is less than what the next step may need: ``MARGIN`` times the longest cycle so
  far (a step, with the host work the engine does while it computes and after it), plus
  the longest checkpoint save (the stop writes one), plus ``EXIT_SECONDS``. Under
  :mod:`jax.distributed` every process asks at the same step and they agree (the largest
  reason wins), so all stop at that step.
- **While a step trains** (:func:`start_step`, then :meth:`InFlight.wait`): the step runs
  in a worker thread, so that the main thread can do the previous step's host work beside
  it (:mod:`metarl.runs.engine`) and then wait for it in polls of ``POLL_SECONDS``, reacting
  although the step is inside a jitted XLA computation (a Python signal handler runs only
  between bytecodes of the main thread, and a wait in ``jax.block_until_ready`` is in C++).
  On a signal, or when the time left only covers the stop itself, the step is *abandoned*:
  its result is never used, the engine saves the last completed step from the state it
  still holds (steps donate no buffers) and the process exits without waiting for the
  computation (:mod:`metarl.cli`). One process alone only: processes of a
  multi-process run cannot agree while one of them is inside a collective computation, so
  they stop at the end of the step in flight.
- **A second signal** ends the process at once (exit code 128 + the signal's number),
  whatever the main thread is doing: a thread reads the signal from the wakeup file
  descriptor that CPython's C-level handler writes to, so it is not delayed by a main thread
  blocked in C. Files are replaced atomically and orbax commits a checkpoint by renaming
  its temporary directory, so the run still resumes from its last complete checkpoint.

Importing this module starts no JAX computation.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Steps of one run are one compiled program over the same shapes, so they take about the
# same time; the longest so far also covers a step that compiles (the first in a process).
# The margin absorbs what varies: other work on a shared machine, a slower disk, and a
# step that compiles again.
MARGIN = 1.5
EXIT_SECONDS = 5.0  # what a stop takes besides its checkpoint: status, trackers, exit
UNMEASURED_SAVE_SECONDS = 5.0  # a checkpoint save, before this process has timed one
POLL_SECONDS = 0.1  # how often the main thread looks up from a step in flight

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``: ``90``, ``90s``, ``9m``, ``2h``, ``1h30m``, ``1.5h`` (a
    :class:`ValueError` naming the accepted forms otherwise; it must be positive)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        raw = str(text).strip().lower()
        try:
            seconds = float(raw)
        except ValueError:
            parts = _DURATION.findall(raw)
            units = [unit for _, unit in parts]
            if (not parts or "".join(f"{n}{u}" for n, u in parts) != raw
                    or len(set(units)) != len(units)
                    or units != sorted(units, key=list(_UNITS).index)):
                raise ValueError(f"{text!r} is not a duration; write seconds (5400), or "
                                 "hours, minutes and seconds such as 90s, 9m, 2h, 1h30m"
                                 ) from None
            seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{text!r}: a time limit must be a positive, finite duration")
    return seconds


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def monotonic() -> float:
    """The clock a :class:`Stopper` reads by default (seconds)."""
    return time.monotonic()


class Stopper:
    """When a run should stop: its deadline (``time_limit`` seconds from now, or none),
    the first stopping signal received, and the durations it was told of.

    ``clock`` gives seconds (default :func:`monotonic`); every duration the rule compares
    is taken with it.
    """

    def __init__(self, time_limit: float | None = None,
                 clock: Callable[[], float] | None = None):
        self.clock = clock or monotonic
        self.deadline = None if time_limit is None else self.clock() + time_limit
        self.signal: int | None = None
        self.signals = 0
        self.longest_cycle = 0.0  # a step, with the host work beside and after it
        self.longest_save: float | None = None
        self._lock = threading.Lock()

    # ---- what happened

    def received(self, signum: int) -> int:
        """Note a stopping signal; returns how many have arrived (the first is kept)."""
        with self._lock:
            self.signals += 1
            if self.signal is None:
                self.signal = signum
            return self.signals

    def left(self) -> float:
        """Seconds until the deadline (infinite without a time limit)."""
        return float("inf") if self.deadline is None else self.deadline - self.clock()

    def note_cycle(self, seconds: float) -> None:
        self.longest_cycle = max(self.longest_cycle, seconds)

    def note_save(self, seconds: float) -> None:
        self.longest_save = max(self.longest_save or 0.0, seconds)

    def save_estimate(self) -> float:
        return UNMEASURED_SAVE_SECONDS if self.longest_save is None else self.longest_save

    # ---- the rule

    def need_for_next_step(self) -> float:
        """Seconds the next step and a stop after it may take."""
        return MARGIN * self.longest_cycle + self.save_estimate() + EXIT_SECONDS

    def local_reason(self, next_step: bool, must_save: bool) -> str | None:
        """Why this process would stop now (``None``: go on). ``next_step``: between steps
        (is there time for another?); otherwise a step is in flight (is there time left
        for the stop?). ``must_save``: the last completed step has no checkpoint yet."""
        if self.signal is not None:
            return signal_name(self.signal)
        if self.deadline is None:
            return None
        left = self.left()
        if next_step and left < self.need_for_next_step():
            return (f"the time limit ({_seconds_left(left)}; the next step and a stop "
                    f"after it may take {self.need_for_next_step():.0f} s)")
        if not next_step and left < (self.save_estimate() if must_save else 0) + EXIT_SECONDS:
            return f"the time limit ({_seconds_left(left)}: enough to stop, not to go on)"
        return None

    def before_step(self, must_save: bool) -> str | None:
        """Whether to stop before the next step, agreed by every process of a
        multi-process run (any process's reason stops them all; a signal outranks the
        time limit)."""
        from metarl import distributed

        reason = self.local_reason(True, must_save)
        if distributed.process_count() == 1:
            return reason
        code = (0 if reason is None else 1 if self.signal is None else 1 + self.signal)
        agreed = distributed.largest(code)
        if agreed == 0:
            return None
        if reason is not None and code == agreed:
            return reason
        return (signal_name(agreed - 1) + " (received by another process)" if agreed > 1
                else "the time limit of another process")

    def abandon_reason(self, must_save: bool) -> str | None:
        """Whether to abandon the step in flight (never in a multi-process run)."""
        from metarl import distributed

        if distributed.process_count() > 1:
            return None
        return self.local_reason(False, must_save)


def _seconds_left(left: float) -> str:
    return f"{left:.0f} s left" if left > 0 else "it has run out"


_active: Stopper | None = None


def current() -> Stopper:
    """The stopper of the run training now (one that never stops outside
    :func:`stop_conditions`)."""
    return _active if _active is not None else Stopper()


class _SignalWatch:
    """SIGTERM and SIGINT told to ``stopper`` from a thread of their own (module doc)."""

    def __init__(self, stopper: Stopper):
        self.stopper = stopper
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
        try:
            self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            for signum in SIGNALS:
                # The Python-level handler only keeps the default action (death) away:
                # the C-level handler behind it writes the signal to the wakeup fd at
                # once, and the thread below acts on it.
                signal.signal(signum, _ignore)
        except BaseException:
            self._restore()
            raise
        self._thread = threading.Thread(target=self._watch, name="metarl-signals",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == 0:  # close()
                    return
                if signum not in SIGNALS:  # another handler's signal (SIGALRM, ...)
                    continue
                name = signal_name(signum)
                if self.stopper.received(signum) > 1:
                    os.write(2, f"metarl: a second signal ({name}): exiting at once; the run "
                                "resumes from its last complete checkpoint\n".encode())
                    os._exit(128 + signum)
                os.write(2, f"metarl: {name} received: stopping cleanly (a second signal "
                            "ends the process at once)\n".encode())

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            # a handler installed outside Python (jax.distributed's preemption notifier
            # catches SIGTERM) reads as None and cannot be put back: the default it is
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def close(self) -> None:
        self._restore()
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self._previous_fd)
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")
        self._thread.join(timeout=5)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


def _ignore(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    """See :class:`_SignalWatch`."""


@contextlib.contextmanager
def stop_conditions(time_limit: float | str | None = None) -> Iterator[Stopper]:
    """Train under a time limit (seconds, or a duration :func:`parse_duration` reads;
    ``None``: none) and stop cleanly on SIGTERM or SIGINT, for the ``with`` block.

    Signals are caught only when this is entered from the main thread (Python delivers
    them there). Inside another ``stop_conditions`` block this is that block's stopper.
    """
    global _active
    if _active is not None:
        yield _active
        return
    try:
        seconds = None if time_limit is None else parse_duration(time_limit)
    except ValueError as error:
        from metarl.config import ConfigError  # not at the top: it imports gymnax

        raise ConfigError(f"time_limit: {error}") from None
    stopper = Stopper(seconds)
    watch = (_SignalWatch(stopper) if threading.current_thread() is threading.main_thread()
             else None)
    _active = stopper
    try:
        yield stopper
    finally:
        _active = None
        if watch is not None:
            watch.close()


@dataclass
class StepOutcome:
    """What :meth:`InFlight.wait` came back with: the step's ``value`` (ready) and the
    ``seconds`` from its start to the moment it was ready, or why it was ``abandoned`` in
    flight."""

    value: Any = None
    abandoned: str | None = None
    seconds: float | None = None


class InFlight:
    """A step started by :func:`start_step`, computing in a worker thread."""

    def __init__(self, step: Callable[[], Any]):
        import jax

        self._box: dict[str, Any] = {}
        self._done = threading.Event()
        self.started = time.perf_counter()

        def work() -> None:
            try:
                self._box["value"] = jax.block_until_ready(step())
            except BaseException as error:  # noqa: BLE001 - handed to the main thread
                self._box["error"] = error
            finally:
                self._box["finished"] = time.perf_counter()
                self._done.set()

        # a daemon: an abandoned step must not keep the interpreter from exiting
        threading.Thread(target=work, name="metarl-step", daemon=True).start()

    def wait(self, stopper: Stopper, must_save: bool) -> StepOutcome:
        """Wait until the step's arrays are ready, looking up every ``POLL_SECONDS`` to ask
        ``stopper`` whether to abandon it (module doc). An error of the step is raised
        here."""
        while not self._done.wait(POLL_SECONDS):
            reason = stopper.abandon_reason(must_save)
            if reason is not None:
                return StepOutcome(abandoned=reason)
        if "error" in self._box:
            raise self._box["error"]
        return StepOutcome(self._box["value"],
                           seconds=self._box["finished"] - self.started)


def start_step(step: Callable[[], Any]) -> InFlight:
    """Start ``step()`` in a worker thread, which also waits there until its arrays are
    ready; :meth:`InFlight.wait` collects it."""
    return InFlight(step)
