"""The background writer: asynchronous flushes and the segment pipeline.

One thread per WAL.  It wakes every ``flush_interval`` seconds, at once
when the native core reports (through an eventfd) that an insertion entered
a new segment, and at once when a file leaves the WAL directory or is renamed
over (inotify; not for the WAL's own truncations: ``own_removals``), and then

1. keeps ``prepare_segments`` segments ahead of the insert position created
   (or recycled), fully allocated, mapped and pre-faulted, and attached to
   the core, so that appenders never create a file or take a first-touch
   page fault (seed 003: on tmpfs the faults, not the copy, set the pace);
2. checks that no segment file it holds was deleted, and stops the writer
   if one was: writes to a deleted file succeed, and what they made
   "durable" vanishes with it.  Checking here rather than in every flush
   keeps a system call off the commit path.  The check runs after a change
   in the directory, within microseconds of it (a truncation's own renames
   and removals are left out of the watch, and checked right after it), and
   at least every ``flush_interval`` whatever woke it (a file deleted while
   it was being brought in, or where inotify is missing: every round), so a
   flush that races it, or at worst that interval, is what can be
   acknowledged in between;
3. flushes what was appended without a flush, so that asynchronously
   committed records become durable within ``flush_interval``.

Its waits are poll() timeouts, relative and monotonic: a wall-clock jump does
not delay or hurry a flush.

Everything it does runs with the GIL released in native code or system
calls, apart from a little bookkeeping per segment.
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from pmemwal.errors import ClosedError


_IN_MOVED_FROM, _IN_MOVED_TO, _IN_DELETE, _IN_DELETE_SELF = 0x40, 0x80, 0x200, 0x400
# (<sys/inotify.h>) a file deleted, renamed away, or replaced by one renamed over it
_REMOVALS = _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO
_libc = ctypes.CDLL(None, use_errno=True)


def watch_removals(directory: str) -> int:
    """An inotify descriptor that becomes readable when a file leaves ``directory``
    (deleted, renamed away or renamed over), or -1 where inotify is not available."""
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd >= 0 and _libc.inotify_add_watch(fd, os.fsencode(directory), _REMOVALS) < 0:
        os.close(fd)
        fd = -1
    return fd


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


class BackgroundWriter:
    """Runs ``prepare()``, ``check()`` and ``flush()`` in a daemon thread until ``stop()``.

    ``check()`` runs after a change in the watched directory, and at least every
    ``flush_interval``; one that failed runs again the next round."""

    def __init__(self, prepare: Callable[[], None], check: Callable[[], None],
                 flush: Callable[[], None], flush_interval: float, name: str,
                 watch: str | None = None) -> None:
        self._prepare = prepare
        self._check = check
        self._flush = flush
        self._interval = flush_interval
        self.notify_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._descriptors = threading.Lock()  # wake() against stop() closing them
        self._watch = os.fsencode(watch) if watch else b""
        self._watch_fd = watch_removals(watch) if watch else -1
        self._check_due = True  # files may have gone before the watch began
        self._next_check = 0.0  # (monotonic) when the check runs even without an event
        self._watch_quiet = False  # own_removals could not restore the watch: retried
        self._stopping = False
        self.error: BaseException | None = None
        self._cpu_ns = 0
        self._clock: int | None = None  # the thread's CPU clock while it runs
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        try:
            self._rounds()
        finally:  # the clock names the thread's id, which a later thread may get
            self._cpu_ns = time.thread_time_ns()
            self._clock = None

    def _rounds(self) -> None:
        poller = select.poll()
        for fd in (self.notify_fd, self._watch_fd):
            if fd >= 0:
                poller.register(fd, select.POLLIN)
        try:
            while not self._stopping:
                fired = [fd for fd, _ in poller.poll(self._interval * 1000)]
                for fd in fired:
                    _drain(fd)  # eventfd or inotify: either way, one round now
                if self._stopping:
                    break
                if self._watch_quiet:  # a restore that failed (own_removals): again
                    self._watch_quiet = not self._watch_mask(_REMOVALS)
                self._step(self._prepare)
                now = time.monotonic()
                if self._check_due or self._watch_fd < 0 or self._watch_fd in fired or \
                        now >= self._next_check:
                    self._check_due = False  # (before the check: one due meanwhile runs next)
                    self._next_check = now + self._interval
                    if not self._step(self._check):
                        self._check_due = True
                self._step(self._flush)
        except ClosedError:
            return

    def _step(self, step: Callable[[], None]) -> bool:
        """Run one step of a round: whether it ran through.  A failure (e.g. no space for a
        new segment) is kept for appenders that need what it did, and skips none of the
        others."""
        try:
            step()
            return True
        except ClosedError:
            raise
        except Exception as exc:
            self.error = exc
            return False

    @contextmanager
    def own_removals(self) -> Iterator[None]:
        """Around the WAL's own renames and removals (a truncation's): the watch reports
        none of them (each woke a round that took the GIL from the appenders: four for a
        truncation recycling two segments), and a check is due after, which also finds a
        segment someone else deleted meanwhile (it looks at the files, not the events)."""
        self._watch_mask(_IN_DELETE_SELF)
        try:
            yield
        finally:
            self._watch_quiet = not self._watch_mask(_REMOVALS)  # (failed: each round retries)
            self._check_due = True

    def _watch_mask(self, mask: int) -> bool:
        """Set what the watch reports; whether that worked (or there is no watch)."""
        with self._descriptors:  # (stop() closing it meanwhile)
            return self._watch_fd < 0 or _libc.inotify_add_watch(self._watch_fd, self._watch,
                                                                 mask) >= 0

    def cpu_ns(self) -> int:
        """CPU time this writer's thread has used (all of it, once the thread has ended)."""
        clock = self._clock
        if clock is not None:
            try:
                return time.clock_gettime_ns(clock)
            except OSError:  # ending: it has stored its total, or is about to
                pass
        return self._cpu_ns

    def is_current(self) -> bool:
        """Whether the caller runs on this writer's thread (a listener it called)."""
        return threading.current_thread() is self._thread

    def wake(self) -> None:
        """Have the thread run a round now; nothing once it is stopped (any thread may
        call this, racing stop())."""
        with self._descriptors:
            if self.notify_fd >= 0:
                os.eventfd_write(self.notify_fd, 1)

    def stop(self) -> None:
        """Wake the thread, wait for it to finish its round, and release its descriptors."""
        self._stopping = True
        self.wake()
        self._thread.join()
        with self._descriptors:
            for fd in (self.notify_fd, self._watch_fd):
                if fd >= 0:
                    os.close(fd)
            self.notify_fd = self._watch_fd = -1
