"""The write benchmark: N client threads append records of one size for T seconds.

    from pmemwal.tools.bench import BenchConfig, run
    result = run(BenchConfig("/dev/shm/pmemwal-bench", size=8192, flush="each"),
                 progress=lambda p: print(p["line"]))
    print(result.report())

Every client appends the same preallocated payload in a tight loop and times
each append and each flush with ``time.perf_counter_ns``, into two latency
histograms of its own (submission and sync apart, as fio reports them).  The
flush policy is ``each`` (every record committed with ``append(data,
flush=True)``, one native call, timed as the append latency), ``group:K``
(a flush after every K records of that client) or ``end`` (once, after the
clients stop; that final flush is part of the elapsed time).  Before the clock
starts the WAL is filled once and truncated, so the run appends into recycled,
mapped segments as a long-running log does.

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

With ``processes`` the clients are processes instead of threads (direct mode, the
WAL opened with ``shared=True`` in each and in the main process): started with
multiprocessing's "spawn", each opens the WAL and reports ready, and the clock
starts once all have, so that their start-up is not timed.  Each runs the same
loop as a thread does, then its own final flush; ``elapsed`` runs from the common
start to the last of those flushes' ends.  Client 0 alone truncates (the others
do not wait for it); a checkpointer thread runs in the main process.  Each
process sends back its counts and its HdrHistograms (encoded), merged into one
result, and copies its progress into shared memory every 10 ms for the
progress lines.  The main process holds the WAL open (warm-up, truncation after
the run, counters) without a background writer.  A script that runs them needs
the ``if __name__ == "__main__":`` guard: "spawn" imports the main module again.

With ``archive`` (an fsspec URL, ``archive_options`` its storage options) the WAL
archives every complete segment as it runs.  Truncation keeps the segments not archived
yet, so the warm-up waits until the archive has taken its own (failing at once if an
upload fails) and truncates again: the run starts with none pending.  ``BenchResult.archive``
has the archive counters at the end of the run (``archive_segments``, ``archive_bytes``,
``archive_ns``, ``archive_failures`` since the warm-up; ``archive_pending``, the complete
segments still waiting, as it is then); an archive slower than the appenders shows as
``archive_pending`` and as segments created instead of recycled.

The main thread meanwhile prints a pgbench-style progress line every interval
(records/s, MB/s and the mean and standard deviation of the per-record
latency: append, plus the flush where one followed that record).

Latencies are first kept in arrays and folded into the HdrHistograms in
batches (rounded to the histogram's 3 significant digits with numpy): a pure
Python ``record_value`` per sample costs more than an append does.

MB is 10**6 bytes; sizes given as text (``8k``, ``16MiB``) are powers of 1024.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import tempfile
import threading
import time
import traceback
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

import pmemwal
from pmemwal import _core
from pmemwal.device import ProbeResult
from pmemwal.errors import ArchiveError, ConfigError, LockedError
from pmemwal.format import DEFAULT_SEGMENT_SIZE, parse_segment_name
from pmemwal.segments import LOCK_NAME, WAL_OWN_NAMES, Segment, WalDirectory
from pmemwal.tools._extras import require
from pmemwal.wal import (DEFAULT_BUFFER_SIZE, DEFAULT_FLUSH_INTERVAL, DEFAULT_GIL_RELEASE_SIZE,
                         DEFAULT_MAX_WAL_SIZE, MODES, check_wal_options)

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram

FLUSH_POLICIES = ("each", "end", "group:K")
DEFAULT_PATH = "/dev/shm/pmemwal-bench"
DEFAULT_KEEP = 256 << 20
_POLL = 0.05  # s: the main thread's longest sleep, so that a failed client ends the run soon
_PUBLISH = 0.01  # s: how often a client process copies its progress into shared memory
ARCHIVE_COUNTERS = ("archive_segments", "archive_bytes", "archive_ns", "archive_failures",
                    "archive_pending")  # BenchResult.archive: wal.stats()'s, at the run's end
_GAUGES = ("archive_pending",)  # stats taken as they are at the end, not since the warm-up
ARCHIVE_WAIT = 600.0  # s the warm-up waits for the archive to take its segments
HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS = 1, 60_000_000_000, 3  # ns: 1 ns to 60 s
_DRAIN_EVERY = 1 << 16  # latency samples kept per client before folding into its histogram
_SUB_BUCKET_BITS = 11  # 3 significant digits: 2048 sub-buckets, resolution 2**(bitlen - 11)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE_RE = re.compile(r"(\d+)\s*(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)

Progress = Callable[[dict], None]


def parse_size(text: str | int) -> int:
    """Bytes from ``8192``, ``"8k"``, ``"8KiB"``, ``"16m"``, ``"1G"`` (k/m/g are powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text}: must not be negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size {text!r}: expected an integer or text such as 8k, 16m, 1g")
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"size {text!r}: expected a whole number of bytes with an optional "
                         "unit k, m or g (KiB, MiB, GiB), e.g. 8192, 8k, 16MiB, 1g")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def parse_keep(text: str | int | None) -> int | None:
    """``--keep``: a size, or ``"all"`` (None: nothing is ever truncated)."""
    if text is None or (isinstance(text, str) and text.strip().lower() == "all"):
        return None
    return parse_size(text)


def parse_flush(text: str) -> int:
    """Records per client flush: ``"each"`` -> 1, ``"group:K"`` -> K, ``"end"`` -> 0."""
    policy = str(text).strip().lower()
    if policy == "each":
        return 1
    if policy == "end":
        return 0
    kind, colon, count = policy.partition(":")
    if kind == "group" and colon and count.isdigit() and int(count) >= 1:
        return int(count)
    raise ValueError(f"flush policy {text!r}: expected each, end or group:K "
                     "(K a whole number of records, 1 or more), e.g. group:16")


@dataclass
class BenchConfig:
    """One benchmark run's parameters; sizes may be given as text (``"8k"``)."""

    path: str = DEFAULT_PATH
    mode: str = "auto"  # "auto", "buffered" or "direct"
    clients: int = 1  # threads appending (processes, with ``processes``)
    size: int = 8192  # bytes per record
    duration: float = 5.0  # seconds of appending
    flush: str = "each"  # "each", "end" or "group:K"
    segment_size: int | None = None  # None: the WAL's default
    insert_slots: int = 8
    prefault: bool = True  # segments mapped pre-faulted and prepared ahead (WAL option)
    persist: str = "auto"  # direct mode's persistence: "auto", "pmem" or "msync" (WAL option)
    cold: bool = False  # no warm-up: the run starts on a fresh WAL, its segments new
    # the other pmemwal.open options, passed on as they are (see pmemwal.WAL)
    buffer_size: int = DEFAULT_BUFFER_SIZE  # buffered mode's ring
    sync_method: str = "fdatasync"  # buffered mode's
    background: bool = True
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    prepare_segments: int = 2
    gil_release_size: int = DEFAULT_GIL_RELEASE_SIZE
    max_wal_size: int = DEFAULT_MAX_WAL_SIZE
    preallocate: int = 0
    insertion: str = "parallel"  # or "serial": one insertion at a time (seed 004's before)
    keep_bytes: int | None = DEFAULT_KEEP  # WAL kept behind the flushed LSN, truncated
                                           # every truncate_step appended; None: all
    checkpoint: float = 0.0  # s between truncations by a checkpointer thread; 0: by the clients
                             # (with keep_bytes None: nothing is truncated either way)
    fresh: bool = True  # delete the WAL directory first (it must hold only a WAL)
    keep_wal: bool = False  # leave the WAL behind after the run (else removed, on Ctrl-C too)
    progress_interval: float = 1.0  # seconds between progress lines; 0: none
    rate: float = 0.0  # records/s each client appends at most (paced: a given load); 0: no limit
    processes: bool = False  # the clients are processes, each opening the WAL with shared=True
                             # (mode "direct" only); False: threads of this process
    archive: str | None = None  # an fsspec URL complete segments are archived to (WAL option)
    archive_options: dict | None = None  # its storage options (WAL option)

    def __post_init__(self) -> None:
        self.path = os.fspath(self.path)
        self.size = parse_size(self.size)
        if self.segment_size is not None:
            self.segment_size = parse_size(self.segment_size)
        self.keep_bytes = parse_keep(self.keep_bytes)
        if not self.checkpoint >= 0:
            raise ConfigError(f"checkpoint={self.checkpoint!r}: 0 or more seconds")
        if self.keep_bytes is None:
            self.checkpoint = 0.0  # nothing to truncate (a grid may pair keep=all with any)
        self.flush = str(self.flush).strip().lower()
        parse_flush(self.flush)
        if self.mode not in MODES:
            raise ConfigError(f"mode={self.mode!r}: valid values are {', '.join(MODES)}")
        for name in ("buffer_size", "max_wal_size", "preallocate", "gil_release_size"):
            setattr(self, name, parse_size(getattr(self, name)))
        options = self.wal_options()
        # booleans: nothing to check; the archive's options pmemwal.open checks itself
        for name in ("prefault", "background", "archive", "archive_options"):
            del options[name]
        check_wal_options(mode=self.mode, segment_size=self.segment_size,
                          insert_slots=self.insert_slots, **options)
        if not (isinstance(self.clients, int) and self.clients >= 1):
            raise ConfigError(f"clients={self.clients!r}: 1 or more")
        if not self.duration > 0:
            raise ConfigError(f"duration={self.duration!r}: more than 0 seconds")
        if not self.rate >= 0:
            raise ConfigError(f"rate={self.rate!r}: records/s, 0 (no limit) or more")
        if not self.progress_interval >= 0:
            raise ConfigError(f"progress_interval={self.progress_interval!r}: 0 or more seconds")
        if self.processes and self.mode != "direct":
            raise ConfigError(f"processes=True: mode='direct' only (a WAL shared by processes "
                              f"runs in direct mode), not {self.mode!r}")
        if self.archive_options is not None and self.archive is None:
            raise ConfigError("archive_options go with archive (a URL)")
        if self.archive is not None and self.processes:
            raise ConfigError("archive: the bench archives from its own process only, not with "
                              "processes=True (the main process there runs no background writer)")

    def wal_options(self) -> dict:
        """The pmemwal.open options this config passes on as they are."""
        return {name: getattr(self, name) for name in (
            "prefault", "persist", "buffer_size", "sync_method", "background", "flush_interval",
            "prepare_segments", "gil_release_size", "max_wal_size", "preallocate",
            "insertion", "archive", "archive_options")}

    @property
    def flush_every(self) -> int:
        """Records per client flush; 0 for ``end``."""
        return parse_flush(self.flush)

    def truncate_step(self, segment_size: int) -> int | None:
        """Bytes appended between the clients' truncations (None: no truncation, or a
        checkpointer's): a quarter of ``keep_bytes``, so the disk holds little beyond
        it, but at least a segment, the least a truncation removes."""
        if self.keep_bytes is None or self.checkpoint:
            return None
        return max(segment_size, self.keep_bytes // 4)

    def recycle_segments(self, segment_size: int) -> int:
        """The WAL's ``recycle_segments``: spares enough that appending between two
        truncations never needs a new segment, and each truncation recycles every
        segment it drops.  The live window swings by up to two steps (one of
        appending, one the flushed LSN may lag behind it) plus the records the
        clients have in flight when the step is crossed."""
        step = self.truncate_step(segment_size)
        if step is None:
            return 2  # the WAL's default (a checkpointer's pool follows its distance)
        swing = 2 * step + self.clients * self.size
        return -(-swing // segment_size) + 1


@dataclass(frozen=True)
class Latency:
    """A latency distribution in microseconds."""

    count: int
    mean: float
    stddev: float
    min: float
    p50: float
    p99: float
    p999: float
    max: float

    @classmethod
    def of(cls, timings: _Timings) -> Latency | None:
        hist, count = timings.hist, timings.hist.get_total_count()
        if count == 0:
            return None
        mean = timings.total / count
        stddev = math.sqrt(max(timings.squares / count - mean * mean, 0.0))
        return cls(count=count, mean=mean / 1000, stddev=stddev / 1000,
                   min=hist.get_min_value() / 1000,
                   p50=hist.get_value_at_percentile(50) / 1000,
                   p99=hist.get_value_at_percentile(99) / 1000,
                   p999=hist.get_value_at_percentile(99.9) / 1000,
                   max=hist.get_max_value() / 1000)

    def line(self) -> str:
        return (f"p50 {self.p50:.2f}  p99 {self.p99:.2f}  p99.9 {self.p999:.2f}  "
                f"max {self.max:.2f}  (mean {self.mean:.2f}, stddev {self.stddev:.2f}, "
                f"{self.count} samples)")


@dataclass
class BenchResult:
    """What ``run`` measured; ``report()`` for people, ``as_dict()`` for machines."""

    config: BenchConfig
    mode: str  # the mode the WAL ran in
    persist_method: str
    probe: ProbeResult | None
    segment_size: int
    records: int
    bytes: int
    elapsed: float  # seconds, from the clients' start to the end of the final flush
    final_flush_us: float
    background_flushes: int
    per_client_records: list[int]
    append_latency: Latency | None
    flush_latency: Latency | None  # None when no client flushed
    stats: dict[str, int]  # the WAL's counters since the end of the warm-up
    append_histogram: HdrHistogram = field(repr=False, compare=False)
    flush_histogram: HdrHistogram = field(repr=False, compare=False)
    fresh_segment_rate: float | None = None  # bytes/s this machine makes segments (keep=all)
    archive: dict[str, int] | None = None  # the archive counters at the run's end (archive only)

    @property
    def archive_rate(self) -> float | None:
        """Bytes/s the archiver moved while it worked: the bytes it uploaded in the run over
        the time it spent on them (``archive_ns``: upload and read-back check)."""
        a = self.archive
        return a["archive_bytes"] / a["archive_ns"] * 1e9 if a and a["archive_ns"] else None

    @property
    def archived_per_s(self) -> float | None:
        """Bytes/s archived over the run's elapsed time."""
        return self.archive["archive_bytes"] / self.elapsed if self.archive else None

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed / 1e6

    @property
    def segments_after_warm_up(self) -> dict[str, int]:
        """Segments ``created``, ``recycled`` and ``removed`` during the run; a steady
        state creates and removes none."""
        return {k: self.stats.get(f"segments_{k}", 0) for k in ("created", "recycled", "removed")}

    @property
    def making_rate(self) -> float | None:
        """Bytes/s at which this run's WAL made its new segments (their bytes over the
        time spent making them, ``segment_make_ns``), or None when it made none."""
        made_ns = self.stats.get("segment_make_ns", 0)
        return self.segments_after_warm_up["created"] * self.segment_size / made_ns * 1e9 \
            if made_ns else None

    @property
    def probe_mode(self) -> str | None:
        return self.probe.recommended_mode if self.probe else None

    @property
    def probe_reason(self) -> str | None:
        return self.probe.reason if self.probe else None

    def as_dict(self) -> dict:
        """Everything, JSON-safe; the histograms HdrHistogram-encoded (base64)."""
        probe = self.probe.as_dict() if self.probe else None
        if probe:
            probe = {k: list(v) if isinstance(v, tuple) else v for k, v in probe.items()}
        return {
            "config": dataclasses.asdict(self.config),
            "mode": self.mode,
            "persist_method": self.persist_method,
            "probe": probe,
            "segment_size": self.segment_size,
            "records": self.records,
            "bytes": self.bytes,
            "elapsed": self.elapsed,
            "records_per_s": self.records_per_s,
            "mb_per_s": self.mb_per_s,
            "final_flush_us": self.final_flush_us,
            "background_flushes": self.background_flushes,
            "per_client_records": list(self.per_client_records),
            "append_latency_us": _asdict(self.append_latency),
            "flush_latency_us": _asdict(self.flush_latency),
            "segments_after_warm_up": self.segments_after_warm_up,
            "fresh_segment_bytes_per_s": self.fresh_segment_rate,
            "segment_making_bytes_per_s": self.making_rate,
            "stats": dict(self.stats),
            "archive": dict(self.archive) if self.archive else None,
            "archive_bytes_per_s": self.archive_rate,
            "archived_bytes_per_s": self.archived_per_s,
            "append_histogram": _encode(self.append_histogram),
            "flush_histogram": _encode(self.flush_histogram),
        }

    def report(self) -> str:
        """The summary: parameters, then throughput, then latency, then counters."""
        c = self.config
        step = c.truncate_step(self.segment_size)
        if c.keep_bytes is None:
            keep = "all (never truncated)"
        elif c.checkpoint:
            keep = (f"{_size_text(c.keep_bytes)}, and from the previous redo point (a "
                    f"checkpointer thread truncates every {c.checkpoint * 1e3:g} ms)")
        else:
            keep = f"{_size_text(c.keep_bytes)} (truncated every {_size_text(step)} appended)"
        fs = f" ({self.probe.fs_type})" if self.probe and self.probe.fs_type else ""
        lines = [
            ("mode", self.mode if c.mode == self.mode else f"{self.mode} (asked: {c.mode})"),
            ("persist method", self.persist_method),
            ("crc32c path", _core.CRC32C_IMPL),
            ("clients", f"{c.clients} processes" if c.processes else c.clients),
            ("record size", f"{c.size} bytes"),
            ("flush policy", c.flush),
            ("duration", f"{c.duration:g} s"),
            ("path", c.path + fs),
            ("segment size", _size_text(self.segment_size)),
            ("insert slots", c.insert_slots),
            ("prefault", "yes" if c.prefault else "no"),
            ("warm-up", "none (cold: a fresh WAL, its segments made as it goes)" if c.cold
             else "the WAL filled once and truncated: the run starts on recycled segments"),
            ("keep", keep),
        ]
        if self.probe:
            lines.append(("probe verdict", f"{self.probe.recommended_mode}/"
                                           f"{self.probe.persist_method}: {self.probe.reason}"))
        lines += [
            ("records", self.records),
            ("bytes", f"{self.bytes} ({self.bytes / 1e6:.1f} MB)"),
            ("elapsed", f"{self.elapsed:.3f} s (final flush {self.final_flush_us:.1f} usec)"),
            ("throughput", f"{self.records_per_s:.1f} rec/s, {self.mb_per_s:.1f} MB/s"),
        ]
        if len(self.per_client_records) > 1:
            lines.append(("records per client", " ".join(map(str, self.per_client_records))))
        commit = self.config.flush_every == 1
        lines.append(("commit latency (usec)" if commit else "append latency (usec)",
                      self.append_latency.line() if self.append_latency else "-"))
        lines.append(("flush latency (usec)", self.flush_latency.line() if self.flush_latency
                      else "- (in the commit)" if commit else "- (no client flushes)"))
        lines.append(("background flushes", self.background_flushes))
        appended = self.bytes / self.elapsed
        if self.fresh_segment_rate:
            lines.append(("fresh segments", f"{self.fresh_segment_rate / 1e6:.0f} MB/s made here "
                          f"(this run appended {appended / self.fresh_segment_rate:.2f}x that)"))
        if self.making_rate and c.keep_bytes is None:
            lines.append(("segments made", f"at {self.making_rate / 1e6:.0f} MB/s in this run "
                          f"(appended {appended / self.making_rate:.2f}x that)"))
        if self.archive:
            a, rate = self.archive, self.archive_rate
            lines.append(("archive", f"{a['archive_segments']} segments, "
                          f"{a['archive_bytes'] / 1e6:.1f} MB archived ("
                          + (f"{rate / 1e6:.1f} MB/s while archiving, " if rate else "")
                          + f"{self.archived_per_s / 1e6:.1f} MB/s over the run); "
                          f"{a['archive_failures']} failures, {a['archive_pending']} segments "
                          f"pending at the end"))
        lines.append(("segments", ", ".join(f"{n} {k}" for k, n in
                                            self.segments_after_warm_up.items())
                      + " after warm-up"))
        lines.append(("wal counters", "(after warm-up)"))
        lines += [(f"  {k}", v) for k, v in self.stats.items()]
        width = max(len(k) for k, _ in lines) + 1
        return "\n".join(f"{k + ':':<{width}} {v}".rstrip() for k, v in lines)


def format_progress(elapsed: float, records_per_s: float, mb_per_s: float,
                    lat_ms: float, stddev_ms: float) -> str:
    """A pgbench-style progress line."""
    return (f"progress: {elapsed:.1f} s, {records_per_s:.1f} rec/s, {mb_per_s:.1f} MB/s, "
            f"lat {lat_ms:.3f} ms stddev {stddev_ms:.3f}")


def run(config: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """Run the benchmark ``config`` describes; ``progress(dict)`` gets each progress line.

    The dict has ``elapsed`` (s), ``records_per_s``, ``mb_per_s``, ``lat_ms``,
    ``stddev_ms`` (of the interval) and ``line`` (the same, formatted).  The
    last line covers the remainder of the run, so a run shorter than one
    interval still gets one.
    """
    _hdr_histogram()  # the 'bench' extra, before anything is touched
    if config.fresh:
        remove_wal_dir(config.path)
    recycle = config.recycle_segments(config.segment_size or DEFAULT_SEGMENT_SIZE)
    try:
        wal = _open_wal(config)
        try:
            probe = wal.probe or pmemwal.probe(wal.path)
            baseline = wal.stats() if config.cold else _warm_up(
                wal, config.keep_bytes, recycle, config.truncate_step(wal.segment_size))
            result = _Run(config, wal, progress, baseline).measure(probe)
        finally:
            wal.close()
    finally:
        if not config.keep_wal:  # a run's WAL can be GiBs of RAM on /dev/shm
            remove_wal_dir(config.path)
    if config.keep_bytes is None:  # the WAL grew: against the pace this machine makes segments
        rate = fresh_segment_rate(os.path.dirname(os.path.abspath(config.path)), wal.segment_size,
                                  wal.mode, config.prefault)
        result = dataclasses.replace(result, fresh_segment_rate=rate)
    return result


def _open_wal(config: BenchConfig, client: bool = False) -> pmemwal.WAL:
    """The WAL ``config`` describes, as the run's main process or (``client``) a client
    process opens it.  With ``processes`` the main process appends only in the warm-up, so
    it runs no background writer: it would map and prefault every segment the clients
    reach, a third process's work on their CPUs."""
    options = config.wal_options()
    if config.processes and not client:
        options["background"] = False
    return pmemwal.open(config.path, mode=config.mode, create=not client,
                        segment_size=config.segment_size, insert_slots=config.insert_slots,
                        recycle_segments=config.recycle_segments(
                            config.segment_size or DEFAULT_SEGMENT_SIZE),
                        shared=config.processes, **options)


def fresh_segment_rate(parent: str, segment_size: int, mode: str = "direct", prefault: bool = True,
                       count: int = 8) -> float:
    """Bytes/s at which this machine makes segments in a scratch directory under ``parent``
    as a WAL in ``mode`` does (created, allocated and synced; with ``prefault``, direct
    mode's mapped with every page faulted in, buffered mode's written with zeros): the
    most a WAL that is never truncated can grow by."""
    path = tempfile.mkdtemp(prefix=".pmemwal-fresh-", dir=parent)
    directory = WalDirectory(path, create=True)
    try:
        t0 = time.perf_counter()
        for segno in range(count):
            directory.create(segno, segment_size, bytes(16), zero_fill=prefault and mode == "buffered")
            segment = Segment(directory.file(segno), segno, segment_size, writable=True)
            if prefault and mode == "direct":
                segment.mapping(populate=True)
            segment.close()
        return count * segment_size / (time.perf_counter() - t0)
    finally:
        directory.close()
        shutil.rmtree(path, ignore_errors=True)


def _warm_up(wal: pmemwal.WAL, keep: int | None, recycle: int,
             step: int | None = None) -> dict[str, int]:
    """Fill the WAL once and truncate it, so the run starts on recycled, mapped
    segments, as a long-running log would (and as the peers start on warm files);
    returns the counters to subtract from the run's.

    It appends enough past ``keep`` that the truncation fills the whole pool:
    the ``recycle`` spares, the background writer's prepared ones (the WAL's
    default 2) and the segment in progress.  With ``keep`` None (a log that keeps
    everything) it only appends: the run goes on growing the WAL.
    """
    chunk, spare = bytes(1 << 20), (recycle + 4) * wal.segment_size
    target = wal.insert_lsn + (keep or 0) + spare
    while wal.insert_lsn < target:
        wal.append_many([chunk] * 8)
    if keep is None:  # a log that keeps everything: it grows from here, never truncated
        return wal.stats()
    wal.truncate(wal.flush() - keep)  # the retained window is full from the start
    # Until that first truncation the WAL made segments ahead for its growth (wal/rounds.py:
    # _prepare_ahead); they count as spares, and truncations remove what they cut until
    # they are used: use them here, truncating every ``step`` as the run will, until a
    # truncation recycles what it cuts (the pool the run settles into).
    step = step or max(wal.segment_size, keep // 4)  # (a checkpointer's run: as the clients')
    for _ in range(_segments_ahead(wal)):
        target = wal.insert_lsn + step
        while wal.insert_lsn < target:
            wal.append(chunk)
        removed = wal.stats()["segments_removed"]
        if wal.truncate(wal.flush() - keep) and wal.stats()["segments_removed"] == removed:
            break
    if wal.archive_status() is not None:
        # truncation kept the segments the archive has not taken yet: wait for it, and
        # truncate again, so that the run starts with none pending and a full pool
        deadline = time.monotonic() + ARCHIVE_WAIT
        while not wal.wait_archived(0.1):
            status = wal.archive_status()
            if status["failed"] or time.monotonic() > deadline:  # no waiting on retries
                raise ArchiveError(errno.EIO, f"the warm-up's segments were not archived to "
                                   f"{status['archive']} ({status['ready']} waiting): "
                                   f"{status['last_error'] or f'not in {ARCHIVE_WAIT:g} s'}")
        wal.truncate(wal.flushed_lsn - keep)
    return wal.stats()


def _segments_ahead(wal: pmemwal.WAL) -> int:
    """Segment files past the one being appended to."""
    current = wal.insert_lsn // wal.segment_size
    return sum(1 for name in os.listdir(wal.path)
               if name.endswith(".wal") and int(name[:16], 16) > current)


def remove_wal_dir(path: str) -> None:
    """Delete the WAL directory ``path``, refusing one that holds anything else or is in use."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise ConfigError(f"{path} is not a directory")
    names = os.listdir(path)
    strangers = [n for n in names if n not in WAL_OWN_NAMES
                 and parse_segment_name(n.removesuffix(".tmp")) is None]
    if strangers:
        raise ConfigError(f"{path} holds {strangers[0]!r}, which is not part of a pmemwal WAL: "
                          "refusing to delete it (choose another path)")
    if LOCK_NAME in names:  # do not pull a WAL from under its writer
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"{path} is open in another writer") from None
        finally:
            os.close(fd)
    for name in names:
        if os.path.isdir(os.path.join(path, name)):  # archive_status/, lost+found/
            shutil.rmtree(os.path.join(path, name))
        else:
            os.unlink(os.path.join(path, name))
    os.rmdir(path)


class _Client(threading.Thread):
    """One appending thread; ``snapshot`` is (records, latency sum, latency sum of squares).
    A client process runs ``loop`` in its main thread (the object is never started)."""

    def __init__(self, run: _Run, index: int) -> None:
        super().__init__(name=f"pmemwal-bench-{index}", daemon=True)
        self.run_ = run
        self.snapshot = (0, 0, 0)
        self.appends, self.flushes = _Timings(), _Timings()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.run_.barrier.wait()
            self.loop()
        except BaseException as error:  # stop everyone; the main thread re-raises it
            self.error = error
            self.run_.deadline = 0

    def loop(self) -> None:
        """Append until ``run_.deadline`` (ns), timing each append and flush."""
        r = self.run_
        append, flush, now = r.wal.append, r.wal.flush, time.perf_counter_ns
        payload, every = r.payload, r.config.flush_every
        appends, flushes = self.appends, self.flushes
        append_ns = appends.samples
        add_append, add_flush = append_ns.append, flushes.samples.append
        n = total = squares = 0
        countdown = every
        commit = every == 1  # flush each: append(data, flush=True), one call timed as one
        interval = int(1e9 / r.config.rate) if r.config.rate else 0
        due = now()
        while True:
            t0 = now()
            if interval:  # paced: wait for this record's turn (one running late goes at once)
                due += interval
                if due > t0:
                    time.sleep((due - t0) / 1e9)
                    t0 = now()
            if t0 >= r.deadline:
                break
            lsn = append(payload, commit)
            t1 = now()
            lat = t1 - t0
            add_append(lat)
            if every and not commit:
                countdown -= 1
                if not countdown:
                    countdown = every
                    flush(lsn)
                    t2 = now()
                    add_flush(t2 - t1)
                    lat = t2 - t0
            n += 1
            total += lat
            squares += lat * lat
            self.snapshot = (n, total, squares)
            if lsn >= r.next_cut:  # a step appended since the last truncation
                r.cut(lsn)
            if len(append_ns) >= _DRAIN_EVERY:
                appends.drain()
                flushes.drain()
        appends.drain()
        flushes.drain()


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
        self.step = config.truncate_step(wal.segment_size)
        self.next_cut = wal.insert_lsn + self.step if self.step else 1 << 62  # an LSN
        self.cut_lock = threading.Lock()  # held by the truncating client
        self.stop_checkpoints = threading.Event()
        self.checkpoint_error: BaseException | None = None

    def measure(self, probe: ProbeResult | None) -> BenchResult:
        config, wal = self.config, self.wal
        clients = (_Processes if config.processes else _Threads)(self)
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
        if self.progress and config.progress_interval:
            self._tick(time.perf_counter_ns(), start, clients.snapshots())
        end, final_flush = clients.end()
        appends, flushes = clients.timings()
        self._truncate()  # untimed: leave no more than keep_bytes behind
        per_client = clients.records()
        records = sum(per_client)
        stats = {k: v if k in _GAUGES else v - self.baseline.get(k, 0)
                 for k, v in wal.stats().items()}
        if config.processes:  # a gauge: those attached during the run, this one included
            stats["processes"] = clients.attached
        archive = {k: stats[k] for k in ARCHIVE_COUNTERS} if config.archive else None
        return BenchResult(
            config=config, mode=wal.mode, persist_method=wal.persist_method, probe=probe,
            segment_size=wal.segment_size, records=records, bytes=records * config.size,
            elapsed=(end - start) / 1e9, final_flush_us=final_flush / 1000,
            background_flushes=self.background_flushes + clients.background_flushes,
            per_client_records=per_client,
            append_latency=Latency.of(appends), flush_latency=Latency.of(flushes),
            stats=stats, append_histogram=appends.hist, flush_histogram=flushes.hist,
            archive=archive)

    def _report_until_deadline(self, start: int, clients: _Threads | _Processes) -> None:
        """Progress lines, from the main thread, until the clients stop."""
        interval = int(self.config.progress_interval * 1e9) if self.progress else 0
        next_tick = start + interval if interval else 1 << 63
        poll = int(_POLL * 1e9)
        while True:
            now = time.perf_counter_ns()
            if now >= self.deadline:  # also 0 when a client failed
                return
            if now >= next_tick:
                self._tick(now, start, clients.snapshots())
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
            self.next_cut = lsn + self.step

    def _checkpoints(self) -> None:
        """The checkpointer thread (``checkpoint``): every interval, truncate to the redo
        point of the previous checkpoint (the flushed LSN then), keeping ``keep_bytes``
        behind the flushed LSN as well (PostgreSQL's wal_keep_size)."""
        wal, keep = self.wal, self.config.keep_bytes
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

    def _tick(self, now: int, start: int, snaps: list[tuple]) -> None:
        n, total, squares = (sum(s[i] for s in snaps) for i in range(3))
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
        }
        line["line"] = format_progress(**line)
        self.progress(line)


class _Threads:
    """The clients as threads of this process (``measure`` drives them, as ``_Processes``)."""

    background_flushes = 0  # those of the truncating client are the run's own

    def __init__(self, run: _Run) -> None:
        self.run_ = run
        self.clients = [_Client(run, i) for i in range(run.config.clients)]
        self.sleep = time.sleep

    def start(self) -> None:
        for client in self.clients:
            client.start()

    def go(self, start: int) -> None:
        self.run_.barrier.wait()

    def finish(self) -> None:
        for client in self.clients:
            client.join()

    def stop(self) -> None:
        self.run_.barrier.abort()  # frees clients still waiting if the start itself failed
        for client in self.clients:
            if client.ident is not None:
                client.join()

    @property
    def errors(self) -> list[BaseException]:
        return [client.error for client in self.clients if client.error is not None]

    def snapshots(self) -> list[tuple]:
        return [client.snapshot for client in self.clients]

    def records(self) -> list[int]:
        return [client.snapshot[0] for client in self.clients]

    def end(self) -> tuple[int, int]:
        """The final flush, once the clients stopped: when it ended (ns), how long it took."""
        t = time.perf_counter_ns()
        self.run_.wal.flush()
        end = time.perf_counter_ns()
        return end, end - t

    def timings(self) -> tuple[_Timings, _Timings]:
        appends, flushes = _Timings(), _Timings()
        for client in self.clients:
            appends.add(client.appends)
            flushes.add(client.flushes)
        return appends, flushes


class _Processes:
    """The clients as processes (``processes``), started with multiprocessing's "spawn".

    Each (``_client_process``) sends "ready" once its WAL is open, waits for ``go``,
    then runs ``_Client.loop`` and its final flush and sends its result; an error
    anywhere is sent instead and raised here, the other processes terminated.
    """

    def __init__(self, run: _Run) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.run_, n = run, run.config.clients
        self.counts = ctx.RawArray("d", 3 * n)  # each client's snapshot, copied every _PUBLISH
        self.clock = ctx.RawArray("q", 1)  # the deadline, perf_counter_ns (one clock for all)
        self.go_event = ctx.Event()
        pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
        self.conns = [receive for receive, _ in pipes]
        self.sends = [send for _, send in pipes]  # closed here once started: EOF if one dies
        self.procs = [ctx.Process(target=_client_process, name=f"pmemwal-bench-{i}", daemon=True,
                                  args=(run.config, i, self.counts, self.clock, self.go_event,
                                        send))
                      for i, (_, send) in enumerate(pipes)]
        self.results: dict[int, dict] = {}
        self.errors: list[BaseException] = []  # raised as they come
        self.attached = 0

    def start(self) -> None:
        for proc, send in zip(self.procs, self.sends):
            proc.start()
            send.close()
        for i, conn in enumerate(self.conns):
            if self._receive(i, conn) != "ready":
                raise ChildProcessError(f"bench client process {i}: expected 'ready'")

    def go(self, start: int) -> None:
        self.clock[0] = self.run_.deadline
        self.go_event.set()
        self.attached = self.run_.wal.stats().get("processes", 0)

    def sleep(self, seconds: float | None) -> None:
        """Wait up to ``seconds`` for results, taking those that came (raising an error)."""
        pending = [c for i, c in enumerate(self.conns) if i not in self.results]
        for conn in multiprocessing.connection.wait(pending, seconds):
            self._receive(self.conns.index(conn), conn)

    def finish(self) -> None:
        while len(self.results) < len(self.conns):
            self.sleep(None)

    def stop(self) -> None:
        done = len(self.results) == len(self.procs)
        for proc in self.procs:
            if proc.pid is None:
                continue
            proc.join(None if done else 0)  # on failure, no waiting for the others
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self.conns + self.sends:
            conn.close()

    def _receive(self, i: int, conn) -> str:
        try:
            kind, value = conn.recv()
        except EOFError:
            self.procs[i].join(1)
            raise ChildProcessError(f"bench client process {i} exited (code "
                                    f"{self.procs[i].exitcode}) without a result") from None
        if kind == "error":
            raise value
        if kind == "done":
            self.results[i] = value
        return kind

    def snapshots(self) -> list[tuple]:
        c = self.counts
        return [(c[3 * i], c[3 * i + 1], c[3 * i + 2]) for i in range(len(self.procs))]

    def records(self) -> list[int]:
        return [self.results[i]["records"] for i in range(len(self.procs))]

    @property
    def background_flushes(self) -> int:
        return sum(r["background_flushes"] for r in self.results.values())

    def end(self) -> tuple[int, int]:
        """When the last client's final flush ended (ns) and how long that flush took."""
        last = max(self.results.values(), key=lambda r: r["end_ns"])
        return last["end_ns"], last["flush_ns"]

    def timings(self) -> tuple[_Timings, _Timings]:
        appends, flushes = _Timings(), _Timings()
        for result in self.results.values():
            appends.add_state(result["appends"])
            flushes.add_state(result["flushes"])
        return appends, flushes


def _client_process(config: BenchConfig, index: int, counts, clock, go, conn) -> None:
    """A client process (``_Processes``): open the shared WAL, say "ready", wait for
    ``go``, run the client loop until the deadline in ``clock``, flush, send the result."""
    try:
        with _open_wal(config, client=True) as wal:
            run = _Run(config, wal, None, {})
            if index:
                run.next_cut = 1 << 62  # client 0 alone truncates
            client = _Client(run, index)
            mine = memoryview(counts).cast("B").cast("d")[3 * index:3 * index + 3]
            stop = threading.Event()

            def publish() -> None:
                mine[0], mine[1], mine[2] = client.snapshot

            def publisher() -> None:
                while not stop.wait(_PUBLISH):
                    publish()

            conn.send(("ready", None))
            go.wait()
            run.deadline = clock[0]
            thread = threading.Thread(target=publisher, name="bench-publisher", daemon=True)
            thread.start()
            try:
                client.loop()
                t = time.perf_counter_ns()
                wal.flush()
                end = time.perf_counter_ns()
            finally:
                stop.set()
                thread.join()
            publish()
            conn.send(("done", {
                "records": client.snapshot[0], "end_ns": end, "flush_ns": end - t,
                "background_flushes": run.background_flushes,
                "appends": client.appends.state(), "flushes": client.flushes.state()}))
    except BaseException as error:
        error.add_note(f"in bench client process {index}:\n{traceback.format_exc()}")
        try:
            conn.send(("error", error))
        except Exception:  # an exception that does not pickle
            conn.send(("error", ChildProcessError(f"bench client process {index}: {error!r}")))
    finally:
        conn.close()


class _Timings:
    """Latency samples (ns): an array the hot loop appends to, folded in batches
    into an HdrHistogram and exact sums (for the mean and standard deviation,
    which hdrh computes slowly and only to its buckets' precision)."""

    def __init__(self) -> None:
        self.samples = array("q")
        self.hist = _hdr_histogram()(HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS)
        self.total = 0.0
        self.squares = 0.0

    def drain(self) -> None:
        """Fold the samples in and empty the array.

        Each sample is first rounded down to its histogram bucket's lowest
        value, so that one ``record_value(value, count)`` per distinct bucket
        suffices.
        """
        if not self.samples:
            return
        values = np.frombuffer(self.samples, dtype=np.int64).copy()  # no view outlives the clear
        np.maximum(values, HIST_LOWEST, out=values)
        as_float = values.astype(np.float64)
        self.total += float(as_float.sum())
        # (not np.dot: a BLAS call wakes OpenBLAS's worker threads, which then spin for a
        # while after it, taking 40 % of a core from the appenders on 2 cores)
        self.squares += float(np.square(as_float).sum())
        _, bitlen = np.frexp(as_float)  # exact for values below 2**53
        shift = np.maximum(bitlen - _SUB_BUCKET_BITS, 0).astype(np.int64)
        buckets, counts = np.unique((values >> shift) << shift, return_counts=True)
        for value, count in zip(buckets.tolist(), counts.tolist()):
            self.hist.record_value(value, count)
        del self.samples[:]

    def add(self, other: _Timings) -> None:
        self.hist.add(other.hist)
        self.total += other.total
        self.squares += other.squares

    def state(self) -> tuple[str | None, float, float]:
        """What ``add_state`` takes, picklable: the histogram encoded, and the sums."""
        return _encode(self.hist), self.total, self.squares

    def add_state(self, state: tuple[str | None, float, float]) -> None:
        encoded, total, squares = state
        if encoded:
            self.hist.decode_and_add(encoded)
        self.total += total
        self.squares += squares


def _hdr_histogram() -> type[HdrHistogram]:
    """hdrh's HdrHistogram (the 'bench' extra), imported on first use."""
    return require("hdrh.histogram", "bench", "pmemwal bench").HdrHistogram


def _asdict(latency: Latency | None) -> dict | None:
    return dataclasses.asdict(latency) if latency else None


def _encode(hist: HdrHistogram) -> str | None:
    if hist.get_total_count() == 0:
        return None
    encoded = hist.encode()
    return encoded.decode("ascii") if isinstance(encoded, bytes) else encoded


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"
