"""Benchmark targets: pmemwal and the peers a user would pick instead, on the same work.

    from pmemwal.targets import Workload, get_target
    target = get_target("sqlite")
    if target.available() is None:
        result = target.run(Workload("/dev/shm/bench-sqlite", clients=1, size=8192,
                                     duration=2.0, flush="each"))
        print(result.records_per_s, result.latency_us)

A ``Workload`` is N clients appending records of S bytes for T seconds under a
durability policy, the one ``pmemwal.bench`` knows:

- ``each``: every record is durable before its client writes the next one;
- ``group:K``: each client makes its records durable every K records;
- ``end``: nothing is made durable until the clients stop.

Whatever the policy, every record counted is durable when ``elapsed`` ends
(the final flush or commit is timed), except for ``postgres``, whose clock is
pgbench's (see its class).  ``latency_us`` is per record: the write, plus the
flush or commit when one followed that record; it is {} where a target cannot
tell it per record.

Every target removes and recreates ``workload.path`` at the start (refusing a
directory that holds anything it did not put there), keeps all its files in
it, and empties it at the end: what is left is the empty directory.  Setting
up (creating files, databases, clusters, warming a pool) is not timed.
Targets that need a package or a program that is missing say so from
``available()``; nothing optional is imported before a target runs.

Targets other than pmemwal's run one thread per client (PostgreSQL: one
pgbench connection per client), each timing every record with
``time.perf_counter_ns`` into the same latency histograms as
``pmemwal.bench``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import glob
import importlib.metadata
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

import pmemwal
from pmemwal import bench
from pmemwal.bench import BenchConfig, Latency, parse_flush, parse_size
from pmemwal.errors import ConfigError

TARGET_NAMES: tuple[str, ...] = ("buffered", "direct", "libpmemlog", "fdatasync", "sqlite",
                                 "rocksdb", "lmdb", "postgres")
EXTRA_TARGETS: tuple[str, ...] = ("auto",)  # get_target knows these too; not run by default
MARKER = ".pmemwal-target"  # put in a target's directory, so that a later run may empty it
END_COMMIT_EVERY = 10_000  # records per transaction for flush "end" (sqlite, lmdb)
_KEY = struct.Struct(">IQ")  # client id, then its record counter: each client's keys ascend
_LATENCY_GRID = 20_000  # quantile points when pmemwal's append and flush latencies are combined


class TargetError(RuntimeError):
    """A target could not run here, or its peer failed (a process exited, timed out, or
    printed nothing usable); the message says which and carries the peer's own words."""


@dataclass(frozen=True)
class Workload:
    """What every target runs: ``clients`` writers of ``size``-byte records for ``duration`` s.

    ``size`` may be text (``"8k"``); ``flush`` is ``each``, ``end`` or ``group:K``;
    ``params`` are the target's own knobs (``Target.params`` lists them with their
    defaults).  A bad value raises ``ConfigError`` here, before any target runs.
    """

    path: str
    clients: int
    size: int
    duration: float
    flush: str = "each"
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        def fix(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        try:
            fix("path", os.fspath(self.path))
            fix("size", parse_size(self.size))
            parse_flush(self.flush)
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None
        fix("flush", str(self.flush).strip().lower())
        if not self.path:
            raise ConfigError("path: a directory is needed")
        if not (isinstance(self.clients, int) and not isinstance(self.clients, bool)
                and self.clients >= 1):
            raise ConfigError(f"clients={self.clients!r}: a whole number, 1 or more")
        if self.size < 1:
            raise ConfigError(f"size={self.size!r}: 1 byte or more")
        if not (isinstance(self.duration, (int, float)) and math.isfinite(self.duration)
                and self.duration > 0):
            raise ConfigError(f"duration={self.duration!r}: more than 0 seconds")
        if not isinstance(self.params, dict):
            raise ConfigError(f"params={self.params!r}: a dict of target options")
        fix("params", dict(self.params))

    @property
    def flush_every(self) -> int:
        """Records per client flush: 1 for ``each``, K for ``group:K``, 0 for ``end``."""
        return parse_flush(self.flush)


@dataclass
class RunResult:
    """One target's run: counts, the target's own clock, latency per record (µs)."""

    target: str
    records: int
    bytes: int  # payload bytes
    elapsed: float  # seconds, measured by the target
    latency_us: dict  # {"p50", "p99", "p999", "mean"}; {} where not known per record
    extra: dict  # versions, persist method, counters: whatever else the target knows

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed / 1e6 if self.elapsed > 0 else 0.0

    def as_dict(self) -> dict:
        """The fields plus the two rates."""
        return {**dataclasses.asdict(self), "records_per_s": self.records_per_s,
                "mb_per_s": self.mb_per_s}


class Target(Protocol):
    name: str

    def available(self) -> str | None:
        """None when the target can run here, else a one-line reason."""

    def version(self) -> str:
        """The peer's version, as text."""

    def run(self, workload: Workload) -> RunResult:
        """Run ``workload``; ConfigError for a workload this target cannot run."""


def get_target(name: str) -> Target:
    """A new target object for ``name`` (one of TARGET_NAMES, or ``auto``)."""
    factory = _TARGETS.get(str(name).strip().lower())
    if factory is None:
        raise ConfigError(f"target {name!r}: valid targets are "
                          f"{', '.join(TARGET_NAMES + EXTRA_TARGETS)}")
    return factory()


# ---- pmemwal ---------------------------------------------------------------------------------

class _PmemwalTarget:
    """pmemwal itself, through ``pmemwal.bench.run`` (the ``pmemwal bench`` command's engine).

    The WAL lives in ``PATH/wal``, opened with ``mode`` = the target's name;
    clients are threads calling ``wal.append`` and ``wal.flush(lsn)`` per the
    flush policy, with a final ``wal.flush()`` inside the elapsed time.  The
    bench keeps the disk bounded (``keep_bytes`` of WAL behind the flushed
    LSN, truncated and recycled about every 0.2 s, untimed).  ``params`` are
    BenchConfig's other fields (``segment_size``, ``insert_slots``,
    ``keep_bytes``, ...).

    The bench times append and flush apart, so the per-record latency is
    combined from the two distributions: the mean exactly, the percentiles
    assuming a record's append and flush sit at the same rank of their own
    distributions (for ``end``: the append latency alone).  Both
    distributions are in ``extra``.
    """

    name = mode = "auto"
    _FIXED = ("path", "mode", "clients", "size", "duration", "flush", "fresh",
              "progress_interval")

    @property
    def params(self) -> dict:
        return {f.name: _field_default(f) for f in dataclasses.fields(BenchConfig)
                if f.name not in self._FIXED}

    def available(self) -> str | None:
        return None

    def version(self) -> str:
        return f"pmemwal {pmemwal.__version__}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        _prepare_dir(workload.path)
        try:
            try:
                config = BenchConfig(path=os.path.join(workload.path, "wal"), mode=self.mode,
                                     clients=workload.clients, size=workload.size,
                                     duration=workload.duration, flush=workload.flush,
                                     fresh=True, progress_interval=0, **params)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            result = bench.run(config)
        finally:
            _empty_dir(workload.path)
        append, flush = result.append_latency, result.flush_latency
        return RunResult(
            target=self.name, records=result.records, bytes=result.bytes,
            elapsed=result.elapsed,
            latency_us=_combined_latency(result.append_histogram, result.flush_histogram,
                                         append, flush),
            extra={
                "version": self.version(),
                "mode": result.mode,
                "persist_method": result.persist_method,
                "probe_mode": result.probe_mode,
                "probe_reason": result.probe_reason,
                "segment_size": result.segment_size,
                "insert_slots": config.insert_slots,
                "final_flush_us": result.final_flush_us,
                "background_flushes": result.background_flushes,
                "per_client_records": result.per_client_records,
                "append_latency_us": dataclasses.asdict(append) if append else None,
                "flush_latency_us": dataclasses.asdict(flush) if flush else None,
                "latency_method": "append and flush combined at equal ranks; mean exact",
                "stats": result.stats,
                "pmem_is_pmem_force": os.environ.get("PMEM_IS_PMEM_FORCE"),
            })


class BufferedTarget(_PmemwalTarget):
    """pmemwal in buffered mode: records copied into the WAL buffer ring, written with
    pwrite and made durable with fdatasync; run as ``_PmemwalTarget`` says."""

    name = mode = "buffered"


class DirectTarget(_PmemwalTarget):
    """pmemwal in direct mode: records copied into the mapped segment files, made durable
    by libpmem's cache flushes where libpmem takes the mapping for pmem (DAX, or tmpfs
    under ``PMEM_IS_PMEM_FORCE=1``), by msync otherwise (``extra['persist_method']``
    says which); run as ``_PmemwalTarget`` says."""

    name = mode = "direct"


class AutoTarget(_PmemwalTarget):
    """pmemwal with ``mode="auto"``: ``PMEMWAL_MODE``, else the device probe picks
    buffered or direct (``extra['mode']``, ``extra['probe_reason']``); not in
    TARGET_NAMES, since it repeats one of the two."""

    name = mode = "auto"


def _combined_latency(append_hist, flush_hist, append: Latency | None,
                      flush: Latency | None) -> dict:
    """Per-record latency (µs) from pmemwal's separate append and flush distributions.

    A flushed record's latency is taken as append + flush at the same quantile
    (exact when the two are ranked alike; for ``each`` it is the sum of the
    percentiles); records without a flush count their append alone.
    """
    if append is None:
        return {}
    flushes = flush.count if flush else 0
    mean = (append.mean * append.count + (flush.mean * flushes if flush else 0.0)) / append.count
    if not flushes:
        return {"p50": append.p50, "p99": append.p99, "p999": append.p999, "mean": mean}
    u = (np.arange(_LATENCY_GRID) + 0.5) / _LATENCY_GRID
    a, f = _quantiles(append_hist, u), _quantiles(flush_hist, u)
    values = np.concatenate([a, a + f])
    weights = np.concatenate([np.full(u.size, float(max(append.count - flushes, 0))),
                              np.full(u.size, float(flushes))])
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])

    def at(percent: float) -> float:
        i = int(np.searchsorted(cumulative, cumulative[-1] * percent / 100, side="left"))
        return float(values[min(i, values.size - 1)]) / 1000

    return {"p50": at(50), "p99": at(99), "p999": at(99.9), "mean": mean}


def _quantiles(hist, u: np.ndarray) -> np.ndarray:
    """The histogram's values (ns) at quantiles ``u`` (each bucket's highest value)."""
    steps = [(item.value_iterated_to, item.count_added_in_this_iter_step)
             for item in hist.get_recorded_iterator()]
    values = np.array([v for v, _ in steps], dtype=np.float64)
    cumulative = np.cumsum([c for _, c in steps], dtype=np.float64)
    index = np.searchsorted(cumulative, u * cumulative[-1], side="left")
    return values[np.minimum(index, values.size - 1)]


# ---- threads of clients, timed per record -----------------------------------------------------

class _Client(Protocol):
    """One client thread's connection to a peer; made, used and closed in that thread."""

    def write(self) -> None:
        """Write the next record (for ``each`` targets that sync per write: durably)."""

    def sync(self) -> None:
        """Make this client's records durable (called every ``every`` records)."""

    def finish(self) -> None:
        """Make every record this client wrote durable (timed: inside elapsed)."""

    def close(self) -> None:
        """Release the connection (untimed)."""


@dataclass
class _Measured:
    records: int
    elapsed: float
    latency: Latency | None
    per_client: list[int]


class _Clients:
    """Runs ``workload.clients`` threads, each looping ``write`` (and ``sync`` every
    ``every`` records) until the deadline, then ``finish``; like pmemwal.bench's loop."""

    def __init__(self, workload: Workload, every: int, open_client: Callable[[int], _Client]):
        self.workload, self.every, self.open_client = workload, every, open_client
        self.deadline = 1 << 62  # ns; set once every client is ready, 0 stops them
        self.start = 0
        # the last client to get ready starts the clock, then all are released at once
        self.barrier = threading.Barrier(workload.clients, action=self._start_clock)
        self.records = [0] * workload.clients
        self.ends = [0] * workload.clients
        self.timings = [bench._Timings() for _ in range(workload.clients)]
        self.errors: list[BaseException] = []

    def _start_clock(self) -> None:
        self.start = time.perf_counter_ns()
        self.deadline = self.start + int(self.workload.duration * 1e9)

    def measure(self) -> _Measured:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True,
                                    name=f"pmemwal-target-{i}")
                   for i in range(self.workload.clients)]
        try:
            for thread in threads:
                thread.start()
        except BaseException:
            self.deadline = 0
            self.barrier.abort()
            raise
        finally:
            for thread in threads:
                if thread.ident is not None:
                    thread.join()
        if self.errors:
            raise self.errors[0]
        timings = bench._Timings()
        for t in self.timings:
            timings.add(t)
        return _Measured(records=sum(self.records),
                         elapsed=(max(self.ends) - self.start) / 1e9,
                         latency=Latency.of(timings), per_client=list(self.records))

    def _client(self, index: int) -> None:
        client = None
        try:
            client = self.open_client(index)
            self.barrier.wait()
            self.records[index] = self._loop(client, self.timings[index])
            client.finish()
            self.ends[index] = time.perf_counter_ns()
        except threading.BrokenBarrierError:
            pass  # another client failed to get ready; its error is raised
        except BaseException as error:  # stop everyone; measure() re-raises it
            self.errors.append(error)
            self.deadline = 0
            self.barrier.abort()
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()

    def _loop(self, client: _Client, timings: bench._Timings) -> int:
        write, sync, every, now = client.write, client.sync, self.every, time.perf_counter_ns
        samples = timings.samples
        add = samples.append
        n = 0
        countdown = every
        while True:
            t0 = now()
            if t0 >= self.deadline:
                break
            write()
            if every:
                countdown -= 1
                if not countdown:
                    countdown = every
                    sync()
            add(now() - t0)
            n += 1
            if len(samples) >= bench._DRAIN_EVERY:
                timings.drain()
        timings.drain()
        return n


def _thread_result(target: Target, workload: Workload, measured: _Measured, **extra) -> RunResult:
    lat = measured.latency
    return RunResult(
        target=target.name, records=measured.records, bytes=measured.records * workload.size,
        elapsed=measured.elapsed,
        latency_us={"p50": lat.p50, "p99": lat.p99, "p999": lat.p999, "mean": lat.mean}
        if lat else {},
        extra={"version": target.version(), "per_client_records": measured.per_client,
               "latency_stddev_us": lat.stddev if lat else None,
               "latency_max_us": lat.max if lat else None, **extra})


class _Nothing:
    """Default no-op client steps."""

    def sync(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


# ---- libpmemlog -----------------------------------------------------------------------------

_PMEMLOG_SONAME = "libpmemlog.so.1"
_ENOSPC = 28

# name: (restype, argtypes), every libpmemlog function used
_PMEMLOG_FUNCTIONS: dict[str, tuple[object, tuple[object, ...]]] = {
    "pmemlog_check_version": (ctypes.c_char_p, (ctypes.c_uint, ctypes.c_uint)),
    "pmemlog_errormsg": (ctypes.c_char_p, ()),
    "pmemlog_create": (ctypes.c_void_p, (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint)),
    "pmemlog_close": (None, (ctypes.c_void_p,)),
    "pmemlog_append": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)),
    "pmemlog_tell": (ctypes.c_longlong, (ctypes.c_void_p,)),
    "pmemlog_rewind": (None, (ctypes.c_void_p,)),
    "pmemlog_nbyte": (ctypes.c_size_t, (ctypes.c_void_p,)),
}


@functools.cache
def _pmemlog() -> ctypes.CDLL | str:
    """libpmemlog, declared; or why it cannot be used."""
    try:
        lib = ctypes.CDLL(_PMEMLOG_SONAME, use_errno=True)
        for name, (restype, argtypes) in _PMEMLOG_FUNCTIONS.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as error:
        return (f"{_PMEMLOG_SONAME} cannot be loaded ({error}): install the Debian package "
                "libpmemlog1 (PMDK)")
    mismatch = lib.pmemlog_check_version(1, 0)
    if mismatch:
        return f"{_PMEMLOG_SONAME}: {mismatch.decode(errors='replace')}"
    return lib


def _mapped_file(fragment: str) -> str | None:
    """The path of the first file mapped in this process whose name contains ``fragment``."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if fragment in os.path.basename(path):
                return path
    return None


class LibpmemlogTarget:
    """PMDK's libpmemlog, called through ctypes: ``pmemlog_append`` into one pool.

    One pool file of ``pool_size`` (256 MiB) in PATH, shared by all clients
    (libpmemlog serializes appends with its own lock; each ctypes call releases
    the GIL).  ``pmemlog_append`` persists before it returns (pmem_persist
    where libpmem takes the mapping for pmem, e.g. tmpfs under
    ``PMEM_IS_PMEM_FORCE=1`` or DAX; msync otherwise), so every record is
    durable on return whatever the flush policy: ``group`` and ``end`` run
    the same calls as ``each``.  When the pool is full, the client that hit
    ENOSPC calls ``pmemlog_rewind`` and appends again (inside that record's
    latency).  With ``warm`` (default), the pool is filled once and rewound
    before the clock starts, so no append meets a first-touch page fault.
    """

    name = "libpmemlog"
    params = {"pool_size": 256 << 20, "warm": True}

    def available(self) -> str | None:
        lib = _pmemlog()
        return lib if isinstance(lib, str) else None

    def version(self) -> str:
        if self.available():
            return ""
        path = _mapped_file("libpmemlog") or _PMEMLOG_SONAME
        return f"PMDK {_src_version(path) or 'libpmemlog API 1'}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        pool_size = _size_param(params, "pool_size")
        if pool_size < 8 << 20:
            raise ConfigError(f"pool_size={pool_size}: 8 MiB or more")
        if workload.size > pool_size // 4:
            raise ConfigError(f"size={workload.size}: at most a quarter of pool_size "
                              f"({pool_size} bytes)")
        lib = _available_or_raise(self, _pmemlog)
        _prepare_dir(workload.path)
        pool = None
        try:
            pool_path = os.path.join(workload.path, "pool.log")
            pool = lib.pmemlog_create(os.fsencode(pool_path), pool_size, 0o600)
            if not pool:
                raise TargetError(f"pmemlog_create({pool_path}): "
                                  f"{(lib.pmemlog_errormsg() or b'').decode(errors='replace')}")
            usable = lib.pmemlog_nbyte(pool)
            if params["warm"]:
                _fill_pmemlog(lib, pool, usable)
            rewinds = [0]
            payload = os.urandom(workload.size)

            class Client(_Nothing):
                def write(self) -> None:
                    tries = 0
                    while lib.pmemlog_append(pool, payload, len(payload)) != 0:
                        # full: rewind and append again; another client may refill the
                        # pool between our rewind and our append, so try a few times
                        tries += 1
                        if ctypes.get_errno() != _ENOSPC or tries > 8:
                            raise TargetError(f"pmemlog_append: {_pmemlog_error(lib)}")
                        lib.pmemlog_rewind(pool)
                        rewinds[0] += 1

            measured = _Clients(workload, 0, lambda i: Client()).measure()
            return _thread_result(
                self, workload, measured, pool_size=pool_size, pool_usable=usable,
                rewinds=rewinds[0], warm=bool(params["warm"]), library=_mapped_file("libpmemlog"),
                pmem_is_pmem_force=os.environ.get("PMEM_IS_PMEM_FORCE"),
                durability="pmemlog_append persists before returning: every policy is 'each'")
        finally:
            if pool:
                lib.pmemlog_close(pool)
            _empty_dir(workload.path)


def _fill_pmemlog(lib: ctypes.CDLL, pool: int, usable: int) -> None:
    """Append 1 MiB pieces until the pool is full, then rewind: every page touched once."""
    piece = bytes(1 << 20)
    while lib.pmemlog_tell(pool) + len(piece) <= usable:
        if lib.pmemlog_append(pool, piece, len(piece)) != 0:
            break
    lib.pmemlog_rewind(pool)


def _pmemlog_error(lib: ctypes.CDLL) -> str:
    return (lib.pmemlog_errormsg() or b"").decode(errors="replace") or os.strerror(
        ctypes.get_errno())


def _src_version(path: str) -> str | None:
    """The PMDK release embedded in a PMDK library file (see pmemwal.libpmem)."""
    from pmemwal import libpmem
    return libpmem._src_version(path)


# ---- pwrite + fdatasync ---------------------------------------------------------------------

class FdatasyncTarget:
    """A plain loop: ``os.pwrite`` of each record, ``os.fdatasync`` per the flush policy.

    Each client has its own file in PATH, pre-zeroed to ``file_size`` (64 MiB)
    and synced before the clock starts, so the loop never extends a file or
    allocates blocks; records are written back to back and wrap to offset 0
    at the end of the file.  ``each``: fdatasync after every pwrite;
    ``group:K``: after every K; ``end``: once per client when it stops.
    """

    name = "fdatasync"
    params = {"file_size": 64 << 20}

    def available(self) -> str | None:
        return None if hasattr(os, "fdatasync") else "os.fdatasync is missing on this platform"

    def version(self) -> str:
        return f"{os.uname().sysname} {os.uname().release}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        file_size = _size_param(params, "file_size")
        if workload.size > file_size:
            raise ConfigError(f"size={workload.size}: larger than file_size={file_size}")
        _prepare_dir(workload.path)
        payload, size = os.urandom(workload.size), workload.size
        every = workload.flush_every

        class Client(_Nothing):
            def __init__(self, index: int) -> None:
                path = os.path.join(workload.path, f"client-{index}.dat")
                self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    zeros = bytes(1 << 20)
                    for offset in range(0, file_size, len(zeros)):
                        os.pwrite(self.fd, zeros[:file_size - offset], offset)
                    os.fsync(self.fd)
                except BaseException:
                    os.close(self.fd)
                    raise
                self.offset, self.unsynced = 0, False

            def write(self) -> None:
                os.pwrite(self.fd, payload, self.offset)
                self.offset += size
                if self.offset + size > file_size:
                    self.offset = 0
                self.unsynced = True

            def sync(self) -> None:
                os.fdatasync(self.fd)
                self.unsynced = False

            def finish(self) -> None:
                if self.unsynced:
                    self.sync()

            def close(self) -> None:
                os.close(self.fd)

        try:
            measured = _Clients(workload, every, Client).measure()
        finally:
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, file_size=file_size,
                              durability=_policy_text(workload, "fdatasync"))


# ---- SQLite ---------------------------------------------------------------------------------

class SqliteTarget:
    """SQLite (the stdlib sqlite3 module), WAL journal mode, ``synchronous=FULL``.

    One database ``PATH/log.db`` with ``log(id INTEGER PRIMARY KEY, data
    BLOB)``; one connection per client thread; every record is one row,
    ``INSERT INTO log(data) VALUES (?)``.  ``each``: autocommit, one durable
    transaction per insert; ``group:K``: ``BEGIN IMMEDIATE``, K inserts,
    ``COMMIT``; ``end``: the same with K = ``end_commit_every`` (10000), so
    that one transaction's WAL stays bounded, and the last one committed
    when the client stops.  Writers wait for each other through
    ``busy_timeout`` (ms).  The table grows for the whole run.
    """

    name = "sqlite"
    params = {"busy_timeout": 30_000, "end_commit_every": END_COMMIT_EVERY}

    def available(self) -> str | None:
        try:
            import sqlite3  # noqa: F401
        except ImportError as error:
            return f"the sqlite3 module is missing ({error})"
        return None

    def version(self) -> str:
        import sqlite3
        return f"SQLite {sqlite3.sqlite_version}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        every = workload.flush_every if workload.flush != "end" else _count_param(
            params, "end_commit_every")
        busy = _count_param(params, "busy_timeout")
        import sqlite3
        _prepare_dir(workload.path)
        db = os.path.join(workload.path, "log.db")
        payload = os.urandom(workload.size)
        try:
            setup = sqlite3.connect(db, isolation_level=None)
            try:
                mode = setup.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                setup.execute("CREATE TABLE log(id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
            finally:
                setup.close()

            class Client(_Nothing):
                def __init__(self, index: int) -> None:
                    self.conn = sqlite3.connect(db, isolation_level=None, timeout=busy / 1000)
                    self.conn.execute("PRAGMA synchronous=FULL")
                    self.conn.execute(f"PRAGMA busy_timeout={busy}")
                    self.cursor = self.conn.cursor()
                    self.open = False

                def write(self) -> None:
                    if every == 1:
                        self.cursor.execute("INSERT INTO log(data) VALUES (?)", (payload,))
                        return
                    if not self.open:
                        self.cursor.execute("BEGIN IMMEDIATE")
                        self.open = True
                    self.cursor.execute("INSERT INTO log(data) VALUES (?)", (payload,))

                def sync(self) -> None:
                    if self.open:
                        self.cursor.execute("COMMIT")
                        self.open = False

                def finish(self) -> None:
                    self.sync()

                def close(self) -> None:
                    self.conn.close()

            measured = _Clients(workload, every if every > 1 else 0, Client).measure()
        finally:
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, journal_mode=mode, synchronous="FULL",
                              records_per_transaction=every,
                              durability=f"a transaction of {every} insert(s), committed "
                                         "with synchronous=FULL")


# ---- RocksDB --------------------------------------------------------------------------------

class RocksdbTarget:
    """RocksDB through rocksdict: one ``Rdict`` in raw mode, shared by the client threads.

    Every record is a put of key (client id: 4 bytes, counter: 8 bytes,
    big-endian, so each client's keys ascend) and the record as value, into
    RocksDB's default options otherwise.  ``each``: ``put`` with
    ``WriteOptions.sync=True``; ``group:K``: K puts in a ``WriteBatch``
    written with ``sync=True``; ``end``: puts with ``sync=False`` (the WAL is
    written, not synced), then ``flush_wal(sync=True)`` when a client stops.
    """

    name = "rocksdb"
    params: dict = {}

    def available(self) -> str | None:
        return _missing("rocksdict", "rocksdict")

    def version(self) -> str:
        return f"rocksdict {_dist_version('rocksdict')}"

    def run(self, workload: Workload) -> RunResult:
        _check_params(self, workload)
        _available_or_raise(self)
        from rocksdict import Options, Rdict, WriteBatch, WriteOptions
        _prepare_dir(workload.path)
        path = os.path.join(workload.path, "db")
        payload, every = os.urandom(workload.size), workload.flush_every
        synced, unsynced = WriteOptions(), WriteOptions()
        synced.sync, unsynced.sync = True, False
        db = engine = None
        try:
            db = Rdict(path, Options(raw_mode=True))

            class Client(_Nothing):
                def __init__(self, index: int) -> None:
                    self.index, self.n = index, 0
                    self.batch = WriteBatch(raw_mode=True)

                def write(self) -> None:
                    key = _KEY.pack(self.index, self.n)
                    self.n += 1
                    if every == 1:
                        db.put(key, payload, synced)
                    elif every:
                        self.batch.put(key, payload)
                    else:
                        db.put(key, payload, unsynced)

                def sync(self) -> None:
                    db.write(self.batch, synced)  # consumes the batch
                    self.batch = WriteBatch(raw_mode=True)

                def finish(self) -> None:
                    if every > 1 and not self.batch.is_empty():
                        self.sync()
                    elif every == 0:
                        db.flush_wal(True)

            measured = _Clients(workload, every if every > 1 else 0, Client).measure()
        finally:
            if db is not None:
                db.close()
                engine = _rocksdb_engine_version(path)
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, rocksdb_version=engine,
                              durability=_policy_text(workload, "a synced write"))


def _rocksdb_engine_version(path: str) -> str | None:
    """RocksDB's own version, from the first lines of its LOG file."""
    with contextlib.suppress(OSError), open(os.path.join(path, "LOG"), errors="replace") as log:
        for _ in range(20):
            found = re.search(r"RocksDB version: (\S+)", log.readline())
            if found:
                return found.group(1)
    return None


# ---- LMDB -----------------------------------------------------------------------------------

class LmdbTarget:
    """LMDB through py-lmdb: one ``Environment`` (``map_size`` 1 GiB), shared by the clients.

    Every record is a put of key (client id, counter, big-endian) and the
    record.  ``each``: one write transaction per put, committed with the
    environment's ``sync=True`` (an fdatasync per commit); ``group:K``: a
    transaction per K puts; ``end``: the environment opened ``sync=False``,
    a transaction per ``end_commit_every`` (10000) puts (fewer where that
    many would take over an eighth of the map), and
    ``env.sync(True)`` when a client stops.  LMDB lets one write transaction
    run at a time; the others wait.  To wrap, after a commit that leaves the
    database's pages above a third of the map, the committing client empties
    the database (``drop``, in its own transaction, inside that record's
    latency), and the freed pages are reused.
    """

    name = "lmdb"
    params = {"map_size": 1 << 30, "end_commit_every": END_COMMIT_EVERY}

    def available(self) -> str | None:
        return _missing("lmdb", "lmdb")

    def version(self) -> str:
        try:
            import lmdb
        except ImportError:
            return "not installed"
        return f"LMDB {'.'.join(map(str, lmdb.version()))} (py-lmdb {lmdb.__version__})"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        map_size = _size_param(params, "map_size")
        if workload.size > map_size // 16:
            raise ConfigError(f"size={workload.size}: at most map_size/16 ({map_size // 16})")
        # pages a record takes: its own overflow pages when large, part of a leaf page if not
        footprint = -(-(workload.size + 16) // 4096) * 4096 if workload.size > 2000 \
            else 2 * (workload.size + 32)
        if workload.flush == "end":  # a transaction must fit in the map with room to spare
            every = max(1, min(_count_param(params, "end_commit_every"),
                               map_size // 8 // footprint))
        else:
            every = workload.flush_every
            if every * footprint > map_size // 4:
                raise ConfigError(f"lmdb: a transaction of {every} records of {workload.size} "
                                  f"bytes needs about {every * footprint} bytes of map: give a "
                                  f"map_size of at least {every * footprint * 4}")
        _available_or_raise(self)
        import lmdb
        _prepare_dir(workload.path)
        try:
            env = lmdb.Environment(os.path.join(workload.path, "env"), map_size=map_size,
                                   sync=workload.flush != "end", metasync=True, lock=True,
                                   max_dbs=0)
        except BaseException:
            _empty_dir(workload.path)
            raise
        payload = os.urandom(workload.size)
        limit = map_size // 3
        # check the database's size about every map_size/64 bytes of records
        check_every = max(1, map_size // 64 // (workload.size + 64))
        drops = [0]

        def wrap_if_full() -> None:
            with env.begin(write=True) as txn:
                st = txn.stat()
                if (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) \
                        * st["psize"] > limit:
                    txn.drop(env.open_db(), delete=False)
                    drops[0] += 1

        try:
            class Client(_Nothing):
                def __init__(self, index: int) -> None:
                    self.index, self.n, self.txn, self.since_check = index, 0, None, 0

                def write(self) -> None:
                    key = _KEY.pack(self.index, self.n)
                    self.n += 1
                    if every == 1:
                        with env.begin(write=True) as txn:
                            txn.put(key, payload)
                        self._committed(1)
                        return
                    if self.txn is None:
                        self.txn = env.begin(write=True)
                    self.txn.put(key, payload)

                def sync(self) -> None:
                    if self.txn is not None:
                        self.txn.commit()
                        self.txn = None
                        self._committed(every)

                def _committed(self, records: int) -> None:
                    self.since_check += records
                    if self.since_check >= check_every:
                        self.since_check = 0
                        wrap_if_full()

                def finish(self) -> None:
                    self.sync()
                    if workload.flush == "end":
                        env.sync(True)

                def close(self) -> None:
                    if self.txn is not None:
                        self.txn.abort()

            try:
                measured = _Clients(workload, every if every > 1 else 0, Client).measure()
            except lmdb.MapFullError as error:
                raise TargetError(f"lmdb: {error} (map_size={map_size}: give a larger one, "
                                  "e.g. params={'map_size': '4g'})") from None
        finally:
            env.close()
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, map_size=map_size, drops=drops[0],
                              records_per_transaction=every,
                              durability=f"a write transaction of {every} put(s), "
                                         + ("sync=False, env.sync(True) at the end"
                                            if workload.flush == "end" else "sync=True"))


# ---- PostgreSQL -----------------------------------------------------------------------------

_PG_PROGRAMS = ("initdb", "pg_ctl", "postgres", "pgbench", "psql")
_PG_TIMEOUT = {"initdb": 120, "start": 90, "stop": 60, "psql": 60, "version": 20}
_SUN_PATH_MAX = 107  # bytes of a unix socket path, NUL excluded


class PostgresTarget:
    """PostgreSQL's own WAL, under pgbench: a throwaway cluster in PATH.

    initdb (trust auth, C locale, ``--no-sync``) into ``PATH/data``, as the
    ``os_user`` (``postgres``) when run as root, since PostgreSQL refuses root;
    started listening only on a unix socket in PATH with ``fsync=on`` and
    ``synchronous_commit`` on (off for ``end``), plus ``settings``.  Then
    ``pgbench -n -c CLIENTS -j CLIENTS -T SECONDS`` runs a script whose
    transaction emits one transactional WAL message per record,
    ``SELECT pg_logical_emit_message(true, 'x', repeat('0', SIZE))``
    (``group:K``: K of them between BEGIN and COMMIT, K records per
    transaction).  pgbench's ``-T`` takes whole seconds, so the duration is
    rounded up; ``elapsed`` is pgbench's own (transactions / tps, initial
    connections excluded).  ``end``: commits are asynchronous (the WAL
    writer flushes every 200 ms); one synchronous commit after pgbench makes
    everything durable, untimed, its time in ``extra['final_flush_s']``.
    ``latency_us`` is per transaction from pgbench's log (``-l``), so per
    record except for ``group``, where it is {} and the transaction
    latency is in ``extra``.  The cluster is stopped (``-m immediate``) and
    removed, whatever happens.
    """

    name = "postgres"
    params = {"port": 5433, "os_user": "postgres", "settings": {}}

    def available(self) -> str | None:
        bins = _pg_bin_dir()
        if bins is None:
            return ("PostgreSQL server programs (initdb, pg_ctl, postgres, pgbench, psql) are "
                    "not on PATH nor in /usr/lib/postgresql/*/bin: install postgresql")
        if os.geteuid() == 0:
            return _runas_problem(self.params["os_user"])
        return None

    def version(self) -> str:
        bins = _pg_bin_dir()
        if bins is None:
            return ""
        return _pg_version(bins)

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        port = params["port"]
        if not (isinstance(port, int) and 1024 <= port <= 65535):
            raise ConfigError(f"port={port!r}: 1024..65535")
        settings = params["settings"]
        if not isinstance(settings, dict):
            raise ConfigError(f"settings={settings!r}: a dict of PostgreSQL settings")
        user = str(params["os_user"])
        socket_path = os.path.join(os.path.abspath(workload.path), f".s.PGSQL.{port}")
        if len(os.fsencode(socket_path)) > _SUN_PATH_MAX:
            raise ConfigError(f"path {workload.path!r} is too long for PostgreSQL's unix socket "
                              f"({socket_path}: over {_SUN_PATH_MAX} bytes): choose a shorter one")
        bins = _pg_bin_dir()
        if bins is None:
            raise TargetError(f"postgres cannot run here: {self.available()}")
        as_root = os.geteuid() == 0
        problem = _runas_problem(user) if as_root else None
        if problem:
            raise TargetError(f"postgres cannot run here: {problem}")
        as_user = _runas(user) if as_root else (lambda cmd: cmd)
        root = os.path.abspath(workload.path)
        _prepare_dir(root)
        owner = os.stat(root)
        data = os.path.join(root, "data")
        started = False
        try:
            if as_root:
                account = pwd.getpwnam(user)
                for name in [root] + [os.path.join(root, n) for n in os.listdir(root)]:
                    os.chown(name, account.pw_uid, account.pw_gid)
            os.chmod(root, 0o700)
            _call(self, "initdb", as_user([f"{bins}/initdb", "-D", data, "-A", "trust", "-U",
                                           "postgres", "--no-sync", "-E", "UTF8", "--locale=C"]),
                  _PG_TIMEOUT["initdb"],
                  hint=f" (the {user} user must be able to reach {root}: choose a directory "
                       "under /dev/shm or /tmp)" if as_root else "")
            each_sync = "off" if workload.flush == "end" else "on"
            conf = {"listen_addresses": "", "unix_socket_directories": root, "port": port,
                    "fsync": "on", "synchronous_commit": each_sync,
                    "max_connections": max(20, workload.clients + 10), **settings}
            with open(os.path.join(data, "postgresql.conf"), "a") as f:
                f.write("\n# pmemwal.targets\n")
                for key, value in conf.items():
                    f.write(f"{key} = '{str(value).replace(chr(39), chr(39) * 2)}'\n")
            log = os.path.join(root, "postgres.log")
            started = True  # from here on, stop it whatever happens
            _call(self, "pg_ctl start", as_user([f"{bins}/pg_ctl", "-D", data, "-l", log, "-w",
                                                 "-t", "60", "start"]),
                  _PG_TIMEOUT["start"], log=log)
            every = workload.flush_every or 1
            message = f"SELECT pg_logical_emit_message(true, 'x', repeat('0', {workload.size}));"
            script = os.path.join(root, "records.sql")
            with open(script, "w") as f:
                f.write("\n".join(["BEGIN;", *[message] * every, "COMMIT;"]
                                  if workload.flush_every > 1 else [message]) + "\n")
            seconds = max(1, math.ceil(workload.duration))
            conn = ["-h", root, "-p", str(port), "-U", "postgres"]
            clients = str(workload.clients)
            out = _call(self, "pgbench",
                        [f"{bins}/pgbench", "-n", *conn, "-c", clients, "-j", clients,
                         "-T", str(seconds), "-f", script, "-l",
                         f"--log-prefix={os.path.join(root, 'pgbench_log')}", "postgres"],
                        seconds + 120, cwd=root)
            report = _parse_pgbench(out)
            final_flush = None
            if workload.flush == "end":
                t = time.perf_counter()
                _call(self, "psql", [f"{bins}/psql", *conn, "-X", "-q", "-d", "postgres", "-c",
                             "SET synchronous_commit = on; "
                             "SELECT pg_logical_emit_message(true, 'x', '')"],
                      _PG_TIMEOUT["psql"])
                final_flush = time.perf_counter() - t
            txn_latency = _pgbench_latencies(root)
        finally:
            if started:
                _pg_stop(bins, data, as_user)
            _empty_dir(root)
            with contextlib.suppress(OSError):
                os.chown(root, owner.st_uid, owner.st_gid)
                os.chmod(root, stat.S_IMODE(owner.st_mode))
        transactions, tps = report["transactions"], report["tps"]
        records = transactions * every
        lat = txn_latency
        lat_dict = {"p50": lat.p50, "p99": lat.p99, "p999": lat.p999, "mean": lat.mean} \
            if lat else {}
        return RunResult(
            target=self.name, records=records, bytes=records * workload.size,
            elapsed=transactions / tps if tps > 0 else float(seconds),
            latency_us={} if workload.flush_every > 1 else lat_dict,
            extra={"version": self.version(), "transactions": transactions, "tps": tps,
                   "records_per_transaction": every, "pgbench_seconds": seconds,
                   "latency_average_ms": report.get("latency_ms"),
                   "failed_transactions": report.get("failed", 0),
                   "transaction_latency_us": lat_dict,
                   "synchronous_commit": each_sync, "final_flush_s": final_flush,
                   "settings": {k: str(v) for k, v in conf.items()}})


@functools.cache
def _pg_bin_dir() -> str | None:
    """A directory holding every PostgreSQL program used: PATH's, else the newest Debian one."""
    candidates = []
    found = shutil.which("initdb")
    if found:
        candidates.append(os.path.dirname(os.path.realpath(found)))

    def numeric(path: str) -> tuple:
        version = os.path.basename(os.path.dirname(path))
        return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=numeric, reverse=True)
    for directory in candidates:
        if all(os.access(os.path.join(directory, p), os.X_OK) for p in _PG_PROGRAMS):
            return directory
    return None


@functools.cache
def _pg_version(bins: str) -> str:
    try:
        out = subprocess.run([f"{bins}/postgres", "--version"], capture_output=True, text=True,
                             timeout=_PG_TIMEOUT["version"]).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"PostgreSQL\)?\s*(\S+)", out)
    return f"PostgreSQL {found.group(1)}" if found else out.strip()


def _runas_problem(user: str) -> str | None:
    """Why we (root) cannot run programs as ``user``, or None."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return (f"running as root, which PostgreSQL refuses, and there is no {user!r} user to "
                "run it as (install postgresql, which creates one, or run as a normal user)")
    if not (shutil.which("runuser") or shutil.which("su")):
        return f"running as root, and neither runuser nor su is here to run PostgreSQL as {user}"
    return None


def _runas(user: str) -> Callable[[list[str]], list[str]]:
    """What turns a command into one that runs it as ``user`` (we are root)."""
    runuser = shutil.which("runuser")
    if runuser:
        return lambda cmd: [runuser, "-u", user, "--", *cmd]
    su = shutil.which("su") or "su"
    return lambda cmd: [su, "-s", "/bin/sh", user, "-c", shlex.join(cmd)]


def _call(target: Target, what: str, cmd: list[str], timeout: float, *,
          cwd: str | None = None, log: str | None = None, hint: str = "") -> str:
    """Run ``cmd`` in its own process group; its stdout, or TargetError with its words.

    On a timeout the whole group is killed, so no child of it is left behind.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TargetError(f"{target.name}: {what} took more than "
                          f"{timeout:g} s and was killed") from None
    if proc.returncode != 0:
        words = (err.strip() or out.strip()).splitlines()[-6:]
        if log:
            with contextlib.suppress(OSError), open(log, errors="replace") as f:
                words += f.read().splitlines()[-6:]
        raise TargetError(f"{target.name}: {what} failed "
                          f"(exit {proc.returncode}){hint}: " + " | ".join(words))
    return out


def _pg_stop(bins: str, data: str, as_user: Callable[[list[str]], list[str]]) -> None:
    """Stop the cluster (immediate); kill the postmaster from its pid file if that fails."""
    pid_file = os.path.join(data, "postmaster.pid")
    try:
        subprocess.run(as_user([f"{bins}/pg_ctl", "-D", data, "-m", "immediate", "-w", "-t",
                                "30", "stop"]), capture_output=True,
                       timeout=_PG_TIMEOUT["stop"], stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass
    pid = None
    with contextlib.suppress(OSError, ValueError, IndexError), open(pid_file) as f:
        pid = int(f.readline())
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)  # the postmaster we started; its children then exit
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def _parse_pgbench(out: str) -> dict:
    patterns = {"transactions": r"number of transactions actually processed: (\d+)",
                "tps": r"tps = ([\d.]+)", "latency_ms": r"latency average = ([\d.]+) ms",
                "failed": r"number of failed transactions: (\d+)"}
    report: dict = {}
    for key, pattern in patterns.items():
        found = re.search(pattern, out)
        if found:
            report[key] = float(found.group(1)) if "." in found.group(1) or key == "tps" \
                else int(found.group(1))
    if "transactions" not in report or "tps" not in report:
        raise TargetError("postgres: pgbench printed no transaction count or tps: "
                          + " | ".join(out.strip().splitlines()[-6:]))
    if report["transactions"] == 0:
        raise TargetError("postgres: pgbench ran no transaction")
    return report


def _pgbench_latencies(root: str) -> Latency | None:
    """Per-transaction latency from pgbench's -l logs (third column, µs)."""
    timings = bench._Timings()
    for name in sorted(glob.glob(os.path.join(root, "pgbench_log.*"))):
        with open(name) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2].isdigit():
                    timings.samples.append(int(fields[2]) * 1000)
                    if len(timings.samples) >= bench._DRAIN_EVERY:
                        timings.drain()
    timings.drain()
    return Latency.of(timings)


# ---- shared helpers -------------------------------------------------------------------------

def _prepare_dir(path: str) -> None:
    """Make ``path`` an empty directory holding only our marker.

    An existing directory must be empty or hold our marker (a run of ours
    made it): anything else is refused, never deleted.
    """
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            raise ConfigError(f"{path} exists and is not a directory")
        names = os.listdir(path)
        if names and MARKER not in names:
            raise ConfigError(f"{path} holds {sorted(names)[0]!r} and was not made by a "
                              "pmemwal target: refusing to delete it (choose an empty or "
                              "new directory)")
        _empty_dir(path)
    else:
        os.makedirs(path)
    with open(os.path.join(path, MARKER), "w") as f:
        f.write("made by pmemwal.targets: emptied by the next run\n")


def _empty_dir(path: str) -> None:
    """Remove everything in ``path`` (the marker last), leaving the empty directory."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path):
            if entry.name == MARKER:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, MARKER))


def _check_params(target, workload: Workload) -> dict:
    """The target's params with the workload's applied; ConfigError for unknown names."""
    known = target.params
    unknown = sorted(set(workload.params) - set(known))
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"{target.name}: unknown parameter {unknown[0]!r} (valid: {valid})")
    return {**known, **workload.params}


def _size_param(params: dict, name: str) -> int:
    try:
        value = parse_size(params[name])
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None
    if value < 1:
        raise ConfigError(f"{name}={params[name]!r}: 1 or more")
    return value


def _count_param(params: dict, name: str) -> int:
    value = params[name]
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{name}={value!r}: a whole number, 1 or more")
    return value


def _field_default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _policy_text(workload: Workload, sync: str) -> str:
    every = workload.flush_every
    if every == 1:
        return f"{sync} after every record"
    if every:
        return f"{sync} after every {every} records of a client"
    return f"{sync} once per client, when it stops"


@functools.cache
def _missing(module: str, distribution: str) -> str | None:
    """Why ``module`` cannot be imported (one line), or None."""
    try:
        __import__(module)
    except ImportError as error:
        return (f"{distribution} is not installed ({error}): "
                "pip install -e '.[peers]' (or ./setup.sh --peers)")
    return None


def _available_or_raise(target, loader: Callable[[], object] | None = None):
    reason = target.available()
    if reason:
        raise TargetError(f"{target.name} cannot run here: {reason}")
    return loader() if loader else None


def _dist_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


_TARGETS: dict[str, Callable[[], Target]] = {
    "buffered": BufferedTarget,
    "direct": DirectTarget,
    "auto": AutoTarget,
    "libpmemlog": LibpmemlogTarget,
    "fdatasync": FdatasyncTarget,
    "sqlite": SqliteTarget,
    "rocksdb": RocksdbTarget,
    "lmdb": LmdbTarget,
    "postgres": PostgresTarget,
}
