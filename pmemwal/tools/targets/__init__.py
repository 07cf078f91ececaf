"""Benchmark targets: pmemwal and the peers a user would pick instead, on the same work.

    from pmemwal.tools.targets import Workload, get_target
    target = get_target("sqlite")
    if target.available() is None:
        result = target.run(Workload("/dev/shm/bench-sqlite", clients=1, size=8192,
                                     duration=2.0, flush="each"))
        print(result.records_per_s, result.latency_us)

A ``Workload`` is N clients appending records of S bytes for T seconds under a
durability policy, the one ``pmemwal.tools.bench`` knows:

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

Every target runs one thread per client (PostgreSQL: one pgbench connection per
client; ``direct-procs``: one process per client, each opening the WAL with
``shared=True``), each timing every record with ``time.perf_counter_ns`` into the
same latency histograms as ``pmemwal.tools.bench``.

This package holds the shared API (Workload, RunResult, Target, TargetError,
get_target); ``common`` the client threads and helpers the targets share; and
one module per target: ``pmemwal_modes`` (buffered, direct, auto, direct-procs),
``libpmemlog``, ``fdatasync``, ``sqlite``, ``rocksdb``, ``lmdb``, ``postgres``,
each imported when its target is first made.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Protocol

from pmemwal.errors import ConfigError
from pmemwal.tools.bench import parse_flush, parse_size

TARGET_NAMES: tuple[str, ...] = ("buffered", "direct", "libpmemlog", "fdatasync", "sqlite",
                                 "rocksdb", "lmdb", "postgres")
EXTRA_TARGETS: tuple[str, ...] = ("auto", "direct-procs")  # get_target knows these too;
                                                             # not run by default
MARKER = ".pmemwal-target"  # put in a target's directory, so that a later run may empty it
END_COMMIT_EVERY = 10_000  # records per transaction for flush "end" (sqlite, lmdb)
_KEY = struct.Struct(">IQ")  # client id, then its record counter: each client's keys ascend


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
    """A new target object for ``name`` (one of TARGET_NAMES or EXTRA_TARGETS)."""
    entry = _TARGETS.get(str(name).strip().lower())
    if entry is None:
        raise ConfigError(f"target {name!r}: valid targets are "
                          f"{', '.join(TARGET_NAMES + EXTRA_TARGETS)}")
    module, cls = entry
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


# name: (module of this package, class); a target's module is imported when one is made
_TARGETS: dict[str, tuple[str, str]] = {
    "buffered": ("pmemwal_modes", "BufferedTarget"),
    "direct": ("pmemwal_modes", "DirectTarget"),
    "auto": ("pmemwal_modes", "AutoTarget"),
    "direct-procs": ("pmemwal_modes", "DirectProcsTarget"),
    "libpmemlog": ("libpmemlog", "LibpmemlogTarget"),
    "fdatasync": ("fdatasync", "FdatasyncTarget"),
    "sqlite": ("sqlite", "SqliteTarget"),
    "rocksdb": ("rocksdb", "RocksdbTarget"),
    "lmdb": ("lmdb", "LmdbTarget"),
    "postgres": ("postgres", "PostgresTarget"),
}
