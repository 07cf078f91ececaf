"""Archiving completed segments: the writer's side, and the archiver process.

The writer's background thread (``Archiver.tick``, a few system calls a round)
gives every complete segment a ``.ready`` status file (pmemwal/archive.py) and
wakes the *archiver process*, a child started on the first segment to archive,
which ships ``.ready`` segments oldest first, renames each to ``.done``, and
reports every attempt on a pipe.  A process and not a thread, as PostgreSQL's
archiver is: uploads run in Python (fsspec, s3fs), and a thread would hold the
GIL the appenders need between their native calls; in a process they share
nothing with the append path but CPU.  It dies with the writer (a parent-death
signal), killing a command it runs; the status files say where a new one
resumes.

It runs at nice 10: where the CPUs are busy, the appenders come first, and the archive
falls behind (up to ``archive_max_pending``) rather than slow the commits.

A shared WAL's processes each start one; a lock in ``archive_status/`` lets one
work at a time, and the next takes over when its writer closes or dies.

A failure is retried, oldest segment first, after a backoff that doubles from
0.1 s to ``archive_backoff`` seconds; each is counted and kept in the segment's
``.error`` file.  The writer reads the status files to keep truncation below the
oldest unarchived segment, and refuses a new segment once ``archive_max_pending``
bytes of complete segments wait to be archived.
"""

from __future__ import annotations

import ctypes
import fcntl
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from pmemwal.archive import ArchiveStatus, file_crc, open_archive, running_commands
from pmemwal.errors import ArchiveError
from pmemwal.format import segment_name
from pmemwal.warn import warn

_PR_SET_PDEATHSIG = 1
ARCHIVER_LOCK = "ARCHIVER"  # in archive_status/: held by the one archiver that works
NICE = 10  # the archiver yields the CPU to the appenders when both want it
_IDLE_POLL = 1.0          # the archiver looks at archive_status/ this often without a wake-up
_FIRST_BACKOFF = 0.1
_RESTART_INTERVAL = 1.0   # an archiver that died is started again at most this often


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """The archiver process's stdin or stdout: a pipe (it is started with both PIPE)."""
    assert stream is not None
    return stream


class Archiver:
    """The writer's side of archiving for one WAL directory: status files for complete
    segments, the archiver process, its reports, and the limits they set."""

    def __init__(self, wal_dir: str, spec: dict, segment_size: int, oldest: int,
                 max_pending: int, backoff: float) -> None:
        self.description = open_archive(spec).description  # checks the options here (ConfigError)
        self.status = ArchiveStatus(wal_dir)
        self._wal_dir, self._spec, self._size = wal_dir, spec, segment_size
        self._max_pending, self._backoff = max_pending, backoff
        self._lock = threading.Lock()
        self._marked_below = oldest    # complete segments below this have a status file
        self._archived_below = oldest  # segments below this are archived (or truncated)
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = -_RESTART_INTERVAL
        self._pending_output = b""
        self.last_error: str | None = None
        self.counters = {"archive_segments": 0, "archive_found": 0, "archive_bytes": 0,
                         "archive_ns": 0, "archive_failures": 0, "archive_gone": 0,
                         "archiver_starts": 0, "truncate_kept_unarchived": 0}

    # ---- the background writer's round ---------------------------------------

    def tick(self, oldest: int, flushed_lsn: int) -> None:
        """Give the segments completed since the last round a status file and have the
        archiver ship them (starting it the first time: from the background writer's
        thread, whose end, with the WAL's, is what its parent-death signal follows);
        read its reports."""
        with self._lock:
            complete_below = flushed_lsn // self._size
            start = max(self._marked_below, oldest)
            new = [s for s in range(start, complete_below) if self.status.mark_ready(s)]
            self._marked_below = max(self._marked_below, complete_below)
            self._read_reports()
            waiting = self._refresh() < self._marked_below
            if new or (waiting and (self._proc is None or self._proc.poll() is not None)):
                self._wake()  # (starting an archiver where the last one died)

    def _refresh(self) -> int:
        """Move the archived mark past the segments that became ``.done`` (lock held).
        The archiver renames .ready to .done and then syncs: this process may see the
        rename first, so it syncs the directory itself before a truncation acts on it (a
        crash in between would leave a .ready for a segment that is gone)."""
        below = self._archived_below
        while below < self._marked_below and self.status.is_done(below):
            below += 1
        if below > self._archived_below:
            self.status.sync()  # first: should it fail, the mark stays where it was
            self._archived_below = below
        return self._archived_below

    def archived_below(self, oldest: int) -> int:
        """The oldest segment not archived yet: truncation stops below it."""
        with self._lock:
            self._archived_below = max(self._archived_below, oldest)  # (a shared WAL's peers
            self._marked_below = max(self._marked_below, oldest)      # may truncate past us)
            return self._refresh()

    def kept(self, n: int) -> None:
        """A truncation kept ``n`` segments it would have removed, for the archive."""
        with self._lock:
            self.counters["truncate_kept_unarchived"] += n

    def check_room(self, segno: int, oldest: int) -> None:
        """ArchiveError (ENOSPC) if making segment ``segno`` would leave more than
        archive_max_pending bytes of complete segments waiting for the archive."""
        if (segno - self._archived_below) * self._size <= self._max_pending:
            return
        waiting = segno - self.archived_below(oldest)
        if waiting * self._size > self._max_pending:
            raise ArchiveError(errno.ENOSPC, f"{waiting} segments ({waiting * self._size} bytes) "
                               f"wait for the archive {self.description}, more than "
                               f"archive_max_pending={self._max_pending}: no new segment until it "
                               f"takes them (last error: {self.last_error or 'none yet'})")

    def forget(self, segno: int) -> None:
        """Segment ``segno`` was truncated: its status goes."""
        self.status.forget(segno)

    # ---- the archiver process -----------------------------------------------------

    def _wake(self) -> None:
        """Have the archiver look at the status files, starting it if none runs (lock held)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            proc = self._start()
            if proc is None:
                return
        try:
            os.write(_pipe(proc.stdin).fileno(), b"\0")
        except (BlockingIOError, BrokenPipeError):
            pass  # a wake-up already waits in the pipe, or it died: the next round starts another

    def _start(self) -> subprocess.Popen[bytes] | None:
        """A new archiver process, unless one was started less than a second ago (lock held)."""
        if time.monotonic() - self._started_at < _RESTART_INTERVAL:
            return None
        self._started_at = time.monotonic()
        self._collect()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pmemwal._archiver_process", self._wal_dir,
             json.dumps(self._spec), str(self._backoff), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        os.set_blocking(_pipe(self._proc.stdin).fileno(), False)
        os.set_blocking(_pipe(self._proc.stdout).fileno(), False)
        self.counters["archiver_starts"] += 1
        return self._proc

    def _read_reports(self) -> None:
        """Fold the archiver's reports (JSON lines) into the counters (lock held)."""
        proc = self._proc
        if proc is None:
            return
        try:
            while data := os.read(_pipe(proc.stdout).fileno(), 65536):
                self._pending_output += data
        except BlockingIOError:
            pass
        *lines, self._pending_output = self._pending_output.split(b"\n")
        for line in lines:
            report = json.loads(line)  # (the archiver's stdout goes to stderr: only reports here)
            if report["ok"]:
                self.counters["archive_segments" if report["uploaded"] else "archive_found"] += 1
                self.counters["archive_bytes"] += report["bytes"] if report["uploaded"] else 0
                self.counters["archive_ns"] += report["ns"]
            elif report.get("gone"):
                self.counters["archive_gone"] += 1
                warn(f"pmemwal archiving: {report['error']}", RuntimeWarning)
            else:
                self.counters["archive_failures"] += 1
                self.last_error = report["error"]

    def _collect(self) -> None:
        """Stop the archiver process, if any, and read its last reports (lock held)."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # it kills a command it runs, and exits
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._read_reports()
        self._proc, self._pending_output = None, b""  # (a line it left unfinished goes too)
        _pipe(proc.stdin).close()
        _pipe(proc.stdout).close()

    # ---- for the WAL's callers ------------------------------------------------

    def wait(self, oldest: int, flushed_lsn: int, timeout: float | None) -> bool:
        """Wait until every segment complete at ``flushed_lsn`` is archived; False at
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        target = flushed_lsn // self._size
        while self.archived_below(oldest) < target:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def stats(self) -> dict[str, int]:
        """The counters since open, and ``archive_pending``: complete segments not archived."""
        with self._lock:
            self._read_reports()
            pending = max(0, self._marked_below - self._refresh())
            return {**self.counters, "archive_pending": pending}

    def summary(self) -> dict:
        """What the status files say, with this writer's archive and limit."""
        return {"archive": self.description, "max_pending_bytes": self._max_pending,
                **self.status.summary(self._size),
                "archiver_running": self._proc is not None and self._proc.poll() is None}

    def close(self) -> None:
        with self._lock:
            self._collect()


# ---- the archiver process ---------------------------------------------------------

def _exit_on_term(signum, frame) -> None:
    for pgid in list(running_commands):  # a command hanging on would outlive us
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(0)


def _die_with(parent: int) -> None:
    """Be sent SIGTERM when the writer dies (SIGKILL included), and exit if it is gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def archive_ready(status: ArchiveStatus, archive, wal_dir: str, attempts: dict[int, int],
                  report) -> bool:
    """Ship the ``.ready`` segments, oldest first; False at the first failure."""
    for segno in status.entries()["ready"]:
        name = segment_name(segno)
        started = time.monotonic_ns()
        if not os.path.exists(os.path.join(wal_dir, name)):
            # Truncated after a .done that a crash then lost, or marked ready just as a
            # truncation removed it: nothing is left to ship, and retrying it forever
            # would stop every later segment (shipped oldest first) from being archived.
            status.drop_ready(segno)
            report({"segno": segno, "ok": False, "gone": True,
                    "error": f"{name} has a .ready status but is gone from {wal_dir} (a "
                             "truncation removed it): its status is dropped"})
            continue
        try:
            crc, size = file_crc(os.path.join(wal_dir, name))
            uploaded = archive.store(os.path.join(wal_dir, name), name, crc, size)
        except (ArchiveError, OSError) as exc:
            attempts[segno] = attempts.get(segno, 0) + 1
            message = str(exc) if isinstance(exc, ArchiveError) else f"{name}: {exc}"
            status.set_failed(segno, attempts[segno], message)
            report({"segno": segno, "ok": False, "error": message, "attempts": attempts[segno]})
            return False
        status.set_done(segno)
        attempts.pop(segno, None)
        report({"segno": segno, "ok": True, "uploaded": uploaded, "bytes": size,
                "ns": time.monotonic_ns() - started})
    return True


def main(argv: list[str]) -> int:
    wal_dir, spec, backoff_max, parent = argv[0], json.loads(argv[1]), float(argv[2]), int(argv[3])
    signal.signal(signal.SIGTERM, _exit_on_term)
    _die_with(parent)
    os.nice(NICE)
    archive = open_archive(spec)
    status = ArchiveStatus(wal_dir)
    lock = os.open(os.path.join(status.path, ARCHIVER_LOCK),
                   os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a shared WAL's other archivers wait here to take over
    attempts: dict[int, int] = {}
    delay, retry_at = 0.0, 0.0

    reports = os.dup(1)
    os.dup2(2, 1)  # what a library prints goes to stderr, not among the reports

    def report(event: dict) -> None:
        os.write(reports, json.dumps(event).encode() + b"\n")

    while True:
        now = time.monotonic()
        readable, _, _ = select.select([0], [], [], max(retry_at - now, 0) if delay else _IDLE_POLL)
        if readable and not os.read(0, 4096):
            return 0  # the writer closed the pipe
        if time.monotonic() < retry_at:
            continue
        if archive_ready(status, archive, wal_dir, attempts, report):
            delay = 0.0
        else:
            delay = min(backoff_max, max(_FIRST_BACKOFF, 2 * delay))
            retry_at = time.monotonic() + delay
