"""One run's shared state (``_Run``): the clock, truncation by position, the checkpointer,
the progress lines, and ``measure``, which drives the clients and gathers the result.

The disk stays bounded by position, not by the clock: whenever a client's
record lands a truncation step (``keep_bytes / 4``, at least a segment) past
the last truncation, that client truncates the WAL to ``keep_bytes`` behind
the flushed LSN, between its timed records (inside the elapsed time, outside
its latency); once more after the final flush.  A clock could not keep up
with large records: at 1 MiB a 10 ms cadence let the appenders outrun the
recycled segments and create new ones.  The WAL keeps enough recycled
segments (``recycle_segments``) for the live window's swing between two
truncations, and clients that cross a step while another truncates wait for
it, so after the warm-up no segment is created or removed, whatever the
record size: the result's ``segments_after_warm_up`` (and ``stats``) count
from the end of the warm-up.  Truncation only removes durable segments, so
where clients flush rarely (``end``, large groups) the truncating client
first flushes whenever more than a step is unflushed; those flushes are
counted in ``background_flushes`` and are not in any client's latency.

The main thread meanwhile prints a pgbench-style progress line every interval
(records/s, MB/s and the mean, standard deviation and highest of the per-record
latency: append, plus the flush where one followed that record).  Ctrl-C stops the
clients as the deadline would: the result covers the run until then (``interrupted``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable, Protocol

import pmemwal
from pmemwal.device import ProbeResult
from pmemwal.tools.bench.config import BenchConfig
from pmemwal.tools.bench.interrupt import stopping_on_ctrl_c
from pmemwal.tools.bench.latency import Latency, _Timings
from pmemwal.tools.bench.report import BenchResult, format_progress


_POLL = 0.05  # s: the main thread's longest sleep, so that a failed client ends the run soon
ARCHIVE_COUNTERS = ("archive_segments", "archive_bytes", "archive_ns", "archive_failures",
                    "archive_pending")  # BenchResult.archive: wal.stats()'s, at the run's end
_GAUGES = ("archive_pending",)  # stats taken as they are at the end, not since the warm-up

Progress = Callable[[dict], None]


class Clients(Protocol):
    """What a run drives: clients.py's threads or processes.py's processes (whose
    ``process_stats`` count the processes attached and sum their background writers' CPU
    time), made by ``kind(run)``."""

    @property
    def background_flushes(self) -> int: ...
    @property
    def errors(self) -> list[BaseException]: ...
    def sleep(self, seconds: float) -> None: ...
    def process_stats(self) -> dict[str, int]: ...
    def start(self) -> None: ...
    def go(self, start: int) -> None: ...
    def halt(self) -> None: ...
    def settle(self, tick: int) -> None: ...
    def finish(self) -> None: ...
    def stop(self) -> None: ...
    def snapshots(self) -> list[tuple]: ...
    def records(self) -> list[int]: ...
    def end(self) -> tuple[int, int]: ...
    def timings(self) -> tuple[_Timings, _Timings]: ...


class _Run:
    """The state the main thread and the clients share for one run."""

    def __init__(self, config: BenchConfig, wal: pmemwal.WAL, progress: Progress | None,
                 baseline: dict[str, int]) -> None:
        self.config, self.wal, self.progress = config, wal, progress
        self.baseline = baseline  # counters before the run (the warm-up's)
        self.payload = os.urandom(config.size)
        self.deadline = 1 << 62  # ns; set for real just before the clients start, 0 stops them
        self.barrier = threading.Barrier(config.clients + 1)
        self.background_flushes = 0
        self.last_tick = (0, 0, 0, 0)  # (time ns, records, latency sum, sum of squares)
        self.ticks: list[int] | memoryview = [0]  # the progress interval, as the clients read it
        self.interrupted = False  # Ctrl-C stopped the clients before the deadline
        self.step = config.truncate_step(wal.segment_size)
        self.next_cut = wal.insert_lsn + self.step if self.step else 1 << 62  # an LSN
        self.cut_lock = threading.Lock()  # held by the truncating client
        self.stop_checkpoints = threading.Event()
        self.checkpoint_error: BaseException | None = None

    def measure(self, probe: ProbeResult | None, kind: Callable[[_Run], Clients],
                stop_on_ctrl_c: bool = False) -> BenchResult:
        """Run the clients (``kind``: threads or processes) until the deadline (or, with
        ``stop_on_ctrl_c``, Ctrl-C); the result."""
        clients = kind(self)
        start = self._drive(clients, stop_on_ctrl_c)
        if self.progress and self.config.progress_interval:
            self._tick(time.perf_counter_ns(), start, clients.snapshots(), self.ticks[0])
        return self._result(probe, clients, start)

    def _drive(self, clients: Clients, stop_on_ctrl_c: bool) -> int:
        """Start the clients (and the checkpointer) and the clock, print progress until the
        deadline, stop them all and raise the first error; the start, perf_counter_ns."""
        config = self.config
        checkpointer = threading.Thread(target=self._checkpoints, name="bench-checkpointer",
                                        daemon=True) if config.checkpoint else None
        try:
            clients.start()
            start = time.perf_counter_ns()
            self.deadline = start + int(config.duration * 1e9)
            self.last_tick = (start, 0, 0, 0)
            if checkpointer:
                checkpointer.start()
            clients.go(start)
            with stopping_on_ctrl_c(lambda: self._interrupt(clients), stop_on_ctrl_c):
                self._report_until_deadline(start, clients)
                clients.finish()
        finally:
            self.deadline = 0
            clients.stop()
            if checkpointer:
                self.stop_checkpoints.set()
                checkpointer.join()
        for error in clients.errors + [self.checkpoint_error]:
            if error is not None:
                raise error
        return start

    def _interrupt(self, clients: Clients) -> None:
        """Ctrl-C: the clients stop as at the deadline (unless that has passed, or one failed)."""
        if time.perf_counter_ns() < self.deadline:
            self.interrupted, self.deadline = True, 0
            clients.halt()

    def _result(self, probe: ProbeResult | None, clients: Clients,
                start: int) -> BenchResult:
        """What the stopped clients measured, and the WAL's counters since the warm-up."""
        config, wal = self.config, self.wal
        end, final_flush = clients.end()
        appends, flushes = clients.timings()
        self._truncate()  # untimed: leave no more than keep_bytes behind
        per_client = clients.records()
        records = sum(per_client)
        stats = {k: v if k in _GAUGES else v - self.baseline.get(k, 0)
                 for k, v in wal.stats().items()}
        stats.update(clients.process_stats())  # (clients that are processes: see theirs)
        archive = {k: stats[k] for k in ARCHIVE_COUNTERS} if config.archive else None
        return BenchResult(
            config=config, mode=wal.mode, persist_method=wal.persist_method, probe=probe,
            segment_size=wal.segment_size, records=records, bytes=records * config.size,
            elapsed=(end - start) / 1e9, final_flush_us=final_flush / 1000,
            background_flushes=self.background_flushes + clients.background_flushes,
            per_client_records=per_client,
            append_latency=Latency.of(appends), flush_latency=Latency.of(flushes),
            stats=stats, append_histogram=appends.hist, flush_histogram=flushes.hist,
            archive=archive, interrupted=self.interrupted)

    def _report_until_deadline(self, start: int, clients: Clients) -> None:
        """Progress lines, from the main thread, until the clients stop."""
        interval = int(self.config.progress_interval * 1e9) if self.progress else 0
        next_tick = start + interval if interval else 1 << 63
        poll = int(_POLL * 1e9)
        while True:
            now = time.perf_counter_ns()
            if now >= self.deadline:  # also 0 when a client failed
                return
            if now >= next_tick:
                self._end_interval(start, clients)
                next_tick += interval
            clients.sleep(max(min(next_tick, self.deadline, now + poll) - now, 0) / 1e9)

    def cut(self, lsn: int) -> None:
        """Truncate from a client whose record at ``lsn`` crossed ``next_cut``.

        Other clients that cross it meanwhile wait here rather than append on:
        a truncation slowed by the GIL or the scheduler must not let them run
        through the recycled segments and make new ones.
        """
        with self.cut_lock:
            if lsn < self.next_cut:  # another client has just truncated
                return
            self._truncate()
            assert self.step is not None, "next_cut is never crossed without a step"
            self.next_cut = lsn + self.step

    def _checkpoints(self) -> None:
        """The checkpointer thread (``checkpoint``): every interval, truncate to the redo
        point of the previous checkpoint (the flushed LSN then), keeping ``keep_bytes``
        behind the flushed LSN as well (PostgreSQL's wal_keep_size)."""
        wal, keep = self.wal, self.config.keep_bytes
        assert keep is not None, "a config that keeps everything has no checkpointer"
        redo = wal.flushed_lsn
        try:
            while not self.stop_checkpoints.wait(self.config.checkpoint):
                if wal.insert_lsn - wal.flushed_lsn > keep:  # clients that flush rarely
                    wal.flush()
                    self.background_flushes += 1
                wal.truncate(min(redo, wal.flushed_lsn - keep))
                redo = wal.flushed_lsn
        except BaseException as exc:  # reported by measure(); the clients stop at once
            self.checkpoint_error, self.deadline = exc, 0

    def _truncate(self) -> None:
        keep, wal = self.config.keep_bytes, self.wal
        if keep is None:
            return
        if wal.insert_lsn - wal.flushed_lsn > (self.step or keep):  # bounds the lag the pool covers
            wal.flush()
            self.background_flushes += 1
        if wal.flushed_lsn > keep:
            wal.truncate(wal.flushed_lsn - keep)

    def _end_interval(self, start: int, clients: Clients) -> None:
        """A progress line: records that end from here on belong to the next one; once the
        clients' snapshots hold every record of this one, its line."""
        tick = self.ticks[0]
        self.ticks[0] = tick + 1
        clients.settle(tick + 1)
        self._tick(time.perf_counter_ns(), start, clients.snapshots(), tick)

    def _tick(self, now: int, start: int, snaps: list[tuple], tick: int) -> None:
        n, total, squares = (sum(s[i] for s in snaps) for i in range(3))
        # each client's highest latency of interval ``tick``: its current one's, or the one
        # before if it has begun the next (a client with no record in it has none)
        peak = max((s[4] if s[3] == tick else s[5] if s[3] == tick + 1 else 0 for s in snaps),
                   default=0)
        t0, n0, total0, squares0 = self.last_tick
        self.last_tick = (now, n, total, squares)
        seconds, count = (now - t0) / 1e9, n - n0
        if seconds <= 0:
            return
        mean = (total - total0) / count if count else 0.0
        var = (squares - squares0) / count - mean * mean if count else 0.0
        line = {
            "elapsed": (now - start) / 1e9,
            "records_per_s": count / seconds,
            "mb_per_s": count * self.config.size / seconds / 1e6,
            "lat_ms": mean / 1e6,
            "stddev_ms": math.sqrt(max(var, 0.0)) / 1e6,
            "max_ms": peak / 1e6,
        }
        line["line"] = format_progress(**line)
        assert self.progress is not None, "ticks only with a progress callback"
        self.progress(line)
