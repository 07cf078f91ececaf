"""Simulated power loss: crash images of a live WAL, each recovered and checked.

A power cut keeps what was made durable and, of what was written but not yet
persisted, an arbitrary part.  pmemwal.tools.shadow models both sides exactly
enough to enumerate thousands of such outcomes without a power switch (the
durable shadow of the page-cache modes, the pmem tracer); this module runs the
workloads under it, takes the images at its crash points, and checks each one.

- **Kills** (``kills=True``: msync or buffered mode, on the traced core).  Now
  and then the writer dies (SIGKILL: the WAL abandoned, its files as the page
  cache holds them), and the WAL is reopened and written on.  What the reopen
  recovered is checked like an image; only its own syncs make that durable;
  crash points fall inside that recovery too, and each such image is
  recovered again.

An image's recovery must not raise, must return every acknowledged record
(by what the calls returned), and everything it returns must be exactly what
was written, in order: no damaged, no stale record.

``run_power_loss`` drives one workload (mixed sizes, records spanning pages
and segments, flushes of every kind, truncation and segment recycling; one or
more writer threads) and checks every image; ``pmemwal powerloss`` is its
command line.  With ``workload="log"`` (``--workload log``) the workload is a
``pmemwal.Log``'s (``LogWorkload``: entries appended and synced, rewinds,
compactions, resets, hard states; pmemwal.tools.torture.log_entries), each image
recovered with ``pmemwal.open_log`` and held against the model of what had been
acknowledged and what was in flight when the power went.  With ``workload="follow"``
(``--workload follow``) the records are the wal workload's and each image is held to the
durable LSN the writers had published for followers when it was taken
(FollowWorkload).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import shutil
import struct
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Protocol, TypeVar

import numpy as np

import pmemwal
from pmemwal import _core
from pmemwal.errors import ClosedError, WALError
from pmemwal.format import parse_segment_name, segment_name
from pmemwal.tools.recovery_warnings import recovery_warnings
from pmemwal.tools.torture.log_entries import Shared, Worker
from pmemwal.tools.torture.log_model import LogModel
from pmemwal.tools.shadow import (PAGE_CACHE_GRAINS, DurableShadow, Image, PmemTracer,
                                  libpmem_flush_instruction)

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

    class _Sync(Protocol):      # os.fsync, os.fdatasync
        def __call__(self, fd: FileDescriptorLike) -> None: ...

SEGMENT_SIZE = 1 << 20
# records of a WAL (Workload); entries of a Log (LogWorkload); records held to what followers
# were shown (FollowWorkload)
WORKLOADS = ("wal", "log", "follow")
RECORD_WORKLOADS = ("wal", "follow")  # a Workload's records: the setups of either apply to both
MODES = ("pmem", "msync", "buffered")
# name: run_power_loss's options (those beyond mode, threads and workload need the wal workload)
SETUPS: dict[str, dict[str, Any]] = {
    "pmem": {"mode": "pmem"}, "pmem-threads": {"mode": "pmem", "threads": 4},
    "pmem-checkpointer": {"mode": "pmem", "threads": 4, "checkpointer": True},
    "pmem-shared": {"mode": "pmem", "threads": 4, "shared": True},
    # libpmem's CLFLUSH configuration: pmem_drain is empty, only the core's own sfence
    # fences its streaming stores
    "pmem-clflush": {"mode": "pmem", "flush_instruction": "clflush"},
    "msync": {"mode": "msync"},
    "msync-kill": {"mode": "msync", "kills": True}, "buffered": {"mode": "buffered"},
    "buffered-kill": {"mode": "buffered", "kills": True},
    # page cache, 4 writers: group commit, one thread's flush while another's sync runs
    # (the traced core: crash points inside each sync, only syncs make anything durable)
    "msync-threads": {"mode": "msync", "threads": 4},
    "buffered-threads": {"mode": "buffered", "threads": 4},
    # the default run's Log: CHECKPOINT and index/ written and synced amid its steps
    "buffered-log": {"mode": "buffered", "workload": "log"},
    # the default run's followers: 4 writers' group commit, each image held to what was
    # published for followers (FollowWorkload), not only to what was acknowledged
    "msync-threads-follow": {"mode": "msync", "threads": 4, "workload": "follow"},
    # the background writer on (BACKGROUND_OPTIONS); page-cache modes on the traced core
    "pmem-background": {"mode": "pmem", "background": True},
    "msync-background": {"mode": "msync", "background": True},
    "buffered-background": {"mode": "buffered", "background": True}}
ROUND_STEPS = 20                       # pmem: operations per thread between checks of the images
KILL_RATE = 0.02                       # kills: chance that an operation ends in a SIGKILL and a reopen
RECOVERY_CRASH_RATE = 0.5              # kills: chance of a crash at each sync of the reopen's recovery
DEATH_RATE = 0.05                      # pmem-shared: chance that an operation of the mortal writer dies
CHECKPOINT_INTERVAL = 0.002            # the checkpointer thread truncates this often (seconds)
MAX_SEGMENTS = 3                       # truncate beyond this: keeps images small, recycles segments
# background=True: the WAL's own writer flushes, makes segments ahead and writes a checkpoint
# every few milliseconds while the workload runs (so its crash points fall amid all three)
BACKGROUND_OPTIONS = {"background": True, "flush_interval": 0.003, "prepare_segments": 2,
                      "checkpoint_interval": 0.005}
RETAIN_ENTRIES = 20                    # the log workload compacts to this many entries beyond it

def payload(seed: int, index: int, length: int) -> bytes:
    """The content of record ``index``: its index, then bytes regenerated from it."""
    return struct.pack("<Q", index) + hashlib.shake_128(struct.pack("<QQ", seed, index)).digest(length - 8)


@dataclass
class PowerLossReport:
    """What a run checked, and what (must not have) failed."""

    mode: str
    threads: int = 1
    workload: str = "wal"         # one of WORKLOADS
    checkpointer: bool = False    # a thread truncated while the writers ran ...
    checkpointed: int = 0         # ... this many segments
    background: bool = False      # the WAL's background writer ran ...
    background_ops: dict[str, int] = field(default_factory=dict)  # ... these file operations
    shared: bool = False          # writers through three handles of a shared WAL ...
    deaths: int = 0               # ... one of which died mid-insert this many times
    kills: int = 0                # the writer was killed and the WAL reopened this many times
    streaming: bool = False       # records streamed past the cache (the traced core) ...
    crc32c_path: str = ""         # ... by this CPU path's stores
    flush_instruction: str = ""   # pmem: the libpmem the tracer stood for
    images: int = 0
    records_written: int = 0      # the log workload: entries
    flushed_bytes: int = 0
    lost: int = 0                 # images whose recovery ended below the acknowledged LSN
    bad: int = 0                  # images whose recovery returned a record that was not written there
    recovery_errors: int = 0      # images recovery refused (it must not: every image is a crash)
    resurrected: int = 0          # the log workload: images where a removed entry came back
    wrong_state: int = 0          # the log workload: first index or hard state not as acknowledged
    recovered_beyond_ack: int = 0 # images that kept unacknowledged records too (allowed)
    published_ahead: int = 0      # the follow workload: images whose horizon, the LSN published
                                  # for followers, lay past what the calls had acknowledged
    segments_recycled: int = 0    # so images met stale pages of an earlier cycle
    recovery_warnings: int = 0    # the checker's recoveries that set records aside or read
                                  # every record (a crash may leave either): counted, not shown
    seed: int = 0                 # what reproduces the run (with its setup and image count)
    crash_points: dict[str, int] = field(default_factory=dict)
    grains: dict[int, int] = field(default_factory=dict)
    recovery_ms_mean: float = 0.0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.bad or self.recovery_errors or self.resurrected
                    or self.wrong_state)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


P = TypeVar("P")  # what a workload's images are held to (Image.acked): an LSN, or a LogModel


class Writers(Generic[P]):
    """Writers appending self-describing records, with every kind of flush.

    What ``run_power_loss`` asks of a workload (``Workload`` and ``LogWorkload``):
    ``step``, ``run_threads``, ``retain``, ``acked`` (what is acknowledged now),
    ``horizon`` (what an image taken now was promised, given what was acknowledged
    when the crashing operation began), ``check`` (of one image), ``written``.
    """

    promise = "acknowledged"  # what an image's horizon is (said in its verdict)

    def __init__(self, wal: pmemwal.WAL, seed: int) -> None:
        self.wal = wal
        self.seed = seed
        self.lsn_of: dict[int, int] = {}  # record index -> LSN, once its append returned
        self.checkpointed = 0             # segments the checkpointer thread truncated
        self._indexes = itertools.count()
        # What the calls returned, not the WAL's own claim (flushed_lsn): records below
        # acked_below were acknowledged, and nothing at or above truncated_to was truncated.
        self._promises = threading.Lock()
        self.acked_below = 0
        self.truncated_to = 0
        self._last_lsn: dict[int, int] = {}  # per thread: the LSN of its last record appended

    def _acknowledged(self, below: int) -> None:
        with self._promises:
            self.acked_below = max(self.acked_below, below)

    def _truncate(self, wal: pmemwal.WAL, lsn: int) -> int:
        with self._promises:
            self.truncated_to = max(self.truncated_to, lsn)
        return wal.truncate(lsn)

    def step(self, rng: random.Random, thread: int = 0) -> bool:
        """One operation; True when it ended with a flush."""
        wal = self.writer(thread)
        roll = rng.random()
        if roll < 0.35:
            self._append(wal, rng, 1, flush=True)
        elif roll < 0.75:
            self._append(wal, rng, 1, flush=False)
            return False
        elif roll < 0.85:
            self._append(wal, rng, rng.randrange(2, 20), flush=True)
        else:
            self._flushed(wal.flush())
        return True

    def _flushed(self, returned: int) -> None:
        """A flush() returned: every byte below what it returned, and (its promise, whatever
        it returned) every record this thread appended before it, is acknowledged."""
        self._acknowledged(max(returned, self._last_lsn.get(threading.get_ident(), -1) + 1))

    def writer(self, thread: int) -> pmemwal.WAL:
        """The handle thread ``thread`` appends through."""
        return self.wal

    def _append(self, wal: pmemwal.WAL, rng: random.Random, n: int, flush: bool) -> None:
        indexes = [next(self._indexes) for _ in range(n)]
        datas = [payload(self.seed, i, _length(rng)) for i in indexes]
        if n == 1:
            lsns = [wal.append(datas[0], flush=flush)]
        else:
            lsns = wal.append_many(datas).tolist()
        with self._promises:
            self.lsn_of.update(zip(indexes, lsns))
            self._last_lsn[threading.get_ident()] = lsns[-1]
        if flush and n == 1:
            self._acknowledged(lsns[0] + 1)  # it, and every record before it
        elif flush:
            self._flushed(wal.flush())

    def run_threads(self, threads: int, steps: int, seed: int, checkpointer: bool = False) -> None:
        """``steps`` operations in each of ``threads`` threads at once; with
        ``checkpointer``, another thread truncates to its previous redo point (the
        flushed LSN it saw last time) every CHECKPOINT_INTERVAL while they run."""
        errors: list[BaseException] = []

        def work(rng: random.Random, thread: int) -> None:
            try:
                for _ in range(steps):
                    self.step(rng, thread)
            except BaseException as exc:  # raised by the caller's thread, after the joins
                errors.append(exc)

        def checkpoint(done: threading.Event) -> None:
            redo = self.wal.flushed_lsn
            while not done.wait(CHECKPOINT_INTERVAL):
                self.checkpointed += self._truncate(self.wal, redo)
                redo = self.wal.flushed_lsn

        pool = [threading.Thread(target=work, args=(random.Random(seed * 1000 + t), t))
                for t in range(threads)]
        done = threading.Event()
        helper = threading.Thread(target=checkpoint, args=(done,)) if checkpointer else None
        for t in pool + ([helper] if helper else []):
            t.start()
        for t in pool:
            t.join()
        if helper:
            done.set()
            helper.join()
        if errors:
            raise errors[0]

    def retain(self) -> bool:
        """Keep the WAL at a few segments: truncation, then recycling, under the writer.
        True when what it wrote was made durable (nothing here: truncation syncs itself)."""
        if len(self.wal._segnos) > MAX_SEGMENTS:
            self._truncate(self.wal, self.wal.flushed_lsn)
        return False

    def acked(self) -> P:
        raise NotImplementedError

    def horizon(self, acked: P) -> P:
        raise NotImplementedError

    def check(self, image: Image, directory: Path) -> tuple[str, str]:
        raise NotImplementedError

    @property
    def written(self) -> int:
        return len(self.lsn_of)

    def close(self) -> None:
        self.wal.close()


class Workload(Writers[int]):
    """The wal workload: its images held to the LSN the calls had acknowledged."""

    reopen: Callable[[], pmemwal.WAL]  # the WAL opened again, with its options (_open_workload)

    def reopened(self, wal: pmemwal.WAL) -> str | None:
        """The writer was killed and ``wal`` reopened its WAL: what its recovery returned is
        held against the ledger like an image's (a problem is returned), then records past
        its end, never acknowledged, leave the ledger (the new writer reuses their LSNs)."""
        promised = self.horizon(self.acked_below)  # (before the new writer publishes)
        self.wal = wal
        end = wal.insert_lsn
        try:
            recovered = [(r.lsn, bytes(r.payload)) for r in wal.records()]
        except WALError as exc:
            verdict, detail = "error", f"reading it raised {type(exc).__name__}: {exc}"
        else:
            verdict, detail = held_against(recovered, end, promised, self)
        self.lsn_of = {index: lsn for index, lsn in self.lsn_of.items()
                       if lsn < max(end, self.acked_below)}
        self._last_lsn.clear()  # (the new writer reuses the LSNs past the end)
        return None if verdict in ("ok", "beyond") else f"{verdict}: {detail}"

    def acked(self) -> int:
        return self.acked_below

    def horizon(self, acked: int) -> int:
        return acked

    def check(self, image: Image, directory: Path) -> tuple[str, str]:
        return check_image(image, self, directory)


class SharedWorkload(Workload):
    """The wal workload on a shared WAL, through three handles, each a writer to the WAL as
    another process would be (its own control-file descriptor, liveness lock and process
    entry), so that one tracer sees every writer's stores.  Threads 0 and 2 append through
    the first handle, thread 1 through the second, thread 3 through a mortal one: now and
    then its insertion dies once its records are placed and before they are persisted (the
    core's "die" test hook keeps its slot taken; dropping the handle's control file then
    frees its liveness lock, as the kernel does for a dead process), and a new handle takes
    its place.  The others find it dead and close its range with void records, under the
    tracer: crashes land before, amid and after those writes."""

    def __init__(self, path: Path, options: dict, seed: int) -> None:
        self._path, self._options = path, {**options, "shared": True}
        super().__init__(pmemwal.open(path, **self._options), seed)
        self.handles = [self.wal, pmemwal.open(path, **self._options),
                        pmemwal.open(path, **self._options)]
        self.shadow: PmemTracer | None = None
        self.deaths = 0

    def trace(self, shadow: PmemTracer) -> None:
        self.shadow = shadow
        for wal in self.handles[1:]:
            shadow.attach(wal)

    def writer(self, thread: int) -> pmemwal.WAL:
        return self.handles[(0, 1, 0, 2)[thread % 4]]

    def step(self, rng: random.Random, thread: int = 0) -> bool:
        if thread % 4 == 3 and rng.random() < DEATH_RATE:
            self._die(rng)
            return True
        return super().step(rng, thread)

    def _die(self, rng: random.Random) -> None:
        mortal = self.handles[2]
        mortal._core.inject_fault("die", 0)
        try:
            self._append(mortal, rng, rng.choice((1, 1, 5)), flush=True)
        except ClosedError:
            pass
        else:
            raise AssertionError("the die hook did not fire")
        mortal._forsake()  # its liveness lock goes with its control-file descriptor
        # The flushes its insertion made were never fenced: a process that dies there may or
        # may not have had those lines written back (the images flip its unpersisted bytes
        # either way).
        shadow = self.shadow
        assert shadow is not None, "trace() comes before the first step"
        shadow.forget_thread()
        self.deaths += 1
        self.handles[2] = pmemwal.open(self._path, **self._options)
        shadow.attach(self.handles[2])

    def retain(self) -> bool:
        if len(self.wal._dir.list_segments(tidy=False)) > MAX_SEGMENTS:  # any handle made them
            self._truncate(self.wal, self.wal.flushed_lsn)
        return False

    def close(self) -> None:
        for wal in self.handles:
            wal.close()


class LogWorkload(Writers[LogModel]):
    """The log workload (``log_entries.Worker``: entries, rewinds, compactions, resets,
    hard states) on one Log, each event fed to a ``LogModel`` as it happens."""

    def __init__(self, log: pmemwal.Log, seed: int, threads: int) -> None:
        super().__init__(log.wal, seed)
        self.log = log
        self.model = LogModel()
        self._lock = threading.Lock()  # events come from every thread
        shared = Shared(log, 0, 1, self._event, _length)
        self.workers = [Worker(shared, t) for t in range(threads)]

    def _event(self, tag: str, *ints: int) -> None:
        with self._lock:
            self.model.feed(tag, ints)

    def step(self, rng: random.Random, thread: int = 0) -> bool:
        return self.workers[thread].step(rng)

    def retain(self) -> bool:
        """Compact to the last few entries when the log spans more than a few segments."""
        if len(self.wal._segnos) <= MAX_SEGMENTS:
            return False
        self.workers[0].compact(RETAIN_ENTRIES)
        return True

    def acked(self) -> LogModel:
        with self._lock:
            return self.model.copy()

    def horizon(self, acked: LogModel) -> LogModel:
        """An operation announced since ``acked`` was taken is in flight at the crash."""
        with self._lock:
            if self.model.announced == acked.announced:
                return acked
            promised = acked.copy()
            promised.in_flight = self.model.last_op
            return promised

    def check(self, image: Image, directory: Path) -> tuple[str, str]:
        """Recover the image's log and hold it against the model of when the power went."""
        _write_image(image, directory)
        chk = image.acked.recover(directory, mode="buffered")
        for verdict, failed in (("error", chk.error), ("lost", chk.lost),
                                ("resurrected", chk.resurrected), ("state", chk.state_errors),
                                ("bad", chk.garbage or chk.order)):
            if failed:
                return verdict, "; ".join(chk.problems[:3])
        return ("beyond" if chk.beyond else "ok"), ""

    @property
    def written(self) -> int:
        return sum(w.seq for w in self.workers)

    def close(self) -> None:
        self.log.close()



class FollowWorkload(Workload):
    """The wal workload, each image held to what followers were shown: followers in other
    processes (pmemwal.follow, pmemwal.open(readonly=True)) read every record below the
    durable LSN the writers publish in the FOLLOW file, and may act on it at once, so a record
    they were shown must survive a power cut as an acknowledged one does.  The wal workload
    holds each image to what the calls had acknowledged, which a writer that publishes too
    early (before its sync) still keeps; this one holds it to the durable LSN published when
    it was taken, read through the writer's mapping of the FOLLOW file before the image."""

    promise = "published for followers"

    def __init__(self, wal: pmemwal.WAL, seed: int) -> None:
        super().__init__(wal, seed)
        self.published = 0  # the FOLLOW file's durable LSN, as last read
        self.ahead = 0      # images checked whose horizon lay past what the calls acknowledged
        self._acked_at: dict[int, int] = {}  # horizon -> what was acknowledged when it was read

    def horizon(self, acked: int) -> int:
        """The published durable LSN now: a follower may have read everything below it.
        (Between a writer's kill and its successor's open no writer maps the file: what the
        dead one published last holds.)"""
        follow = self.wal._follow
        if follow is not None:
            self.published = follow.durable_lsn
        self._acked_at.setdefault(self.published, self.acked_below)
        return self.published

    def check(self, image: Image, directory: Path) -> tuple[str, str]:
        self.ahead += image.acked > self._acked_at.get(image.acked, image.acked)
        return super().check(image, directory)


def _length(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.6:
        return rng.randrange(8, 300)
    if roll < 0.95:
        return rng.randrange(300, 20_000)
    return rng.randrange(20_000, 300_000)  # spans pages, often segments


def _write_image(image: Image, directory: Path) -> None:
    """The image's segment files and other files (``index/`` among them), alone in
    ``directory``."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for segno, data in image.segments.items():
        (directory / segment_name(segno)).write_bytes(data)
    for name, data in image.files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
        if image.sizes.get(name, 0) > len(data):  # a sparse tail (a Log's chunk files)
            os.truncate(directory / name, image.sizes[name])


def check_image(image: Image, workload: Ledger, directory: Path) -> tuple[str, str]:
    """Recover one crash image; ("ok"|"beyond"|"lost"|"bad"|"error", detail).

    Every record returned must carry content its index regenerates, at the LSN
    its append returned (a stale record of an earlier cycle has another), once
    and in LSN order; every record acknowledged when the power went (by what the
    calls returned) must come back, but those in segments a truncation asked for
    removed; and recovery must end at or past the acknowledged LSN.
    """
    _write_image(image, directory)
    try:
        with pmemwal.open(directory, mode="buffered", create=False, background=False) as wal:
            recovered = [(r.lsn, bytes(r.payload)) for r in wal.records()]
            end = wal.insert_lsn
    except WALError as exc:
        return "error", f"recovery raised {type(exc).__name__}: {exc}"
    return held_against(recovered, end, image.acked, workload)


class Ledger(Protocol):
    """What a recovery is held to (``held_against``): the records' seed, the LSN each
    append returned, what the calls promised, and where truncation was asked to cut."""

    seed: int
    lsn_of: dict[int, int]
    promise: str
    truncated_to: int
    wal: pmemwal.WAL


def held_against(recovered: list[tuple[int, bytes]], end: int, acked: int,
                 workload: Ledger) -> tuple[str, str]:
    """check_image's verdict on what a recovery returned (``(lsn, payload)`` pairs, and
    where it ended), ``acked`` being the LSN acknowledged when the power went."""
    seen, last = set(), -1
    for lsn, data in recovered:
        index = struct.unpack_from("<Q", data)[0] if len(data) >= 8 else -1
        if (index in seen or data != payload(workload.seed, index, len(data))
                or workload.lsn_of.get(index, lsn) != lsn or lsn <= last):
            return "bad", f"the record at LSN {lsn:#x} is not one written there"
        seen.add(index)
        last = lsn
    if end < acked:
        return "lost", f"recovery ends at {end:#x}, {acked:#x} had been {workload.promise}"
    kept_from = workload.truncated_to - workload.truncated_to % workload.wal.segment_size
    lost = sorted((lsn, index) for index, lsn in list(workload.lsn_of.items())
                  if kept_from <= lsn < acked and index not in seen)
    if lost:
        return "lost", (f"{len(lost)} {workload.promise} record(s) did not come back, the "
                        f"first at LSN {lost[0][0]:#x}")
    return ("beyond" if end > acked else "ok"), ""


def run_power_loss(mode: str, images: int, *, threads: int = 1, seed: int = 0,
                   directory: str | None = None, crash_rate: float = 0.2,
                   keep_failures: str | None = None,
                   progress: Callable[[int], None] | None = None,
                   workload: str = "wal", checkpointer: bool = False,
                   shared: bool = False, kills: bool = False, streaming: bool = False,
                   flush_instruction: str | None = None, mutations: int = 0,
                   background: bool = False) -> PowerLossReport:
    """Crash ``images`` times at random moments of a workload in ``mode`` and check each.

    ``mode`` is ``"pmem"`` (direct, traced flush/drain), ``"msync"`` (direct)
    or ``"buffered"``.  ``threads`` writers append at once (in the page-cache
    modes on the traced core only, where only the WAL's syncs make anything
    durable: a crash point falls inside every sync, any thread's, while the
    others append and flush, and an image holds what the calls had returned
    when it was taken).  ``crash_rate`` is the chance of a crash
    image at each crash point (the first point of each kind is always taken).
    Failing images are copied under ``keep_failures`` if given.  ``workload`` is
    ``"wal"`` (records) or ``"log"`` (a pmemwal.Log: entries, rewinds, compactions,
    resets, states).
    ``checkpointer`` (pmem, wal workload) adds a thread that truncates while the
    writers run, so crashes land amid recycling.  ``shared`` (pmem, wal workload, 4
    threads or more) writes a shared WAL through three handles, one of which dies
    mid-insert now and then (``SharedWorkload``).  ``kills`` (wal workload, one handle,
    msync or buffered mode, traced core) kills the writer now and then and reopens the
    WAL, whose recovery must make durable what it takes (``_kill_and_reopen``): a
    crash, a reopen with more appends, then a power cut, in one run; crash points fall
    inside those recoveries too.  ``background`` (wal workload, one handle) runs the
    WAL's background writer (``BACKGROUND_OPTIONS``): its asynchronous flushes, the
    segments it makes and arms ahead and its checkpoints every few milliseconds land
    under the model, with crash points inside them (kinds marked "(background)"); in
    msync or buffered mode on the traced core only.

    On the traced core (``PMEMWAL_TRACED_CORE=1``): ``streaming`` (pmem) streams records
    past the cache as pmem mode does on real pmem, every streaming store traced;
    ``flush_instruction`` picks the libpmem the tracer stands for (default: by
    ``PMEM_NO_CLWB``/``PMEM_NO_CLFLUSHOPT``, as libpmem); the page-cache modes count
    only what the WAL's syncs covered; ``mutations`` (``_core.TRACE_*`` bits) put a
    persistence bug back into the core, for the tests that show each one caught.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
    if threads < 1 or (threads > 1 and mode != "pmem" and (kills or not _core.TRACED)):
        # the regular core's page-cache model counts everything durable once a flush
        # returns: with other writers' syncs in flight, nothing it takes would be exact
        raise ValueError(f"threads={threads}: 1, or more in pmem mode or on the traced core "
                         "(PMEMWAL_TRACED_CORE=1), without kills")
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r}: one of {', '.join(WORKLOADS)}")
    if checkpointer and (mode != "pmem" or workload not in RECORD_WORKLOADS):
        raise ValueError("checkpointer=True: pmem mode and the wal or follow workload only")
    if shared and (mode != "pmem" or workload != "wal" or threads < 4):
        raise ValueError("shared=True: pmem mode, the wal workload and 4 threads or more")
    if kills and (workload not in RECORD_WORKLOADS or shared or mode == "pmem"
                  or not _core.TRACED):
        # pmem: a kill between operations finds every insertion drained, nothing for the
        # reopen to sync; the regular core's page-cache model counts everything a flush
        # returned for durable, the killed writer's unsynced pages too
        raise ValueError("kills=True: the wal or follow workload on one handle, in msync or buffered "
                         "mode, on the traced core (PMEMWAL_TRACED_CORE=1)")
    if streaming and mode != "pmem":
        raise ValueError("streaming=True: pmem mode only")
    if background and (workload not in RECORD_WORKLOADS or shared or kills or checkpointer):
        raise ValueError("background=True: the wal or follow workload on one handle, without kills "
                         "or a checkpointer thread")
    if background and mode != "pmem" and not _core.TRACED:
        # the regular core's page-cache model takes everything as durable when a step's
        # flush returns (settle): the background writer's syncs return at no step's end
        raise ValueError(f"background=True in {mode} mode: on the traced core only "
                         "(PMEMWAL_TRACED_CORE=1), which reports each of the writer's syncs")
    report = PowerLossReport(mode, threads, workload, checkpointer, shared=shared, seed=seed,
                             background=background,
                             streaming=streaming,
                             flush_instruction=(flush_instruction or libpmem_flush_instruction()
                                                if mode == "pmem" else ""),
                             crc32c_path=_core.CRC32C_IMPL if streaming else "")
    rng = np.random.default_rng(seed)
    root = Path(tempfile.mkdtemp(prefix="pmemwal-powerloss-", dir=directory or _default_dir()))
    queue: list[Image] = []
    t0 = time.perf_counter()
    following: DurableShadow | None = None
    try:
        work = _open_workload(workload, root / "wal", mode, seed, threads, shared, kills,
                              background)
        wal = work.wal
        shadow = _shadow_for(mode, wal, rng, crash_rate, lambda where: queue.append(
            shadow.image(work.horizon(work.acked()), where)), flush_instruction=flush_instruction,
            streaming=streaming, mutations=mutations)
        following = shadow
        shadow.follow_files()  # CHECKPOINT, index/: each write and sync
        if isinstance(work, SharedWorkload):  # (shared: pmem mode only)
            assert isinstance(shadow, PmemTracer)
            work.trace(shadow)
        if threads > 1 and mode != "pmem":
            # crash points only in syncs, one per flush that is not coalesced: at the rate
            # of the operations' crash points (a quarter of it per sync would spend most
            # of the run writing, few images per round)
            shadow.crash_rate = crash_rate
        step_rng = random.Random(seed)
        kill_rng = random.Random(f"{seed}/kills")  # (apart: the images' draws do not move it)
        rounds = 0
        while report.images < images:
            if mode == "pmem":  # crash points come from the tracer, inside the operations
                work.run_threads(threads, ROUND_STEPS, seed + rounds, checkpointer)
            elif threads > 1:  # from the traced syncs: any thread's, while the others run
                work.run_threads(threads, ROUND_STEPS, seed + rounds)
                current = work.wal.insert_lsn // work.wal.segment_size
                shadow.remember((current - 1, current))
            else:
                acked = work.acked()
                crash = rng.random() < crash_rate  # drawn first: the step may take it (arm)
                take = lambda where="mid-flush": shadow.image(work.horizon(acked), where)  # noqa: E731
                if crash:
                    shadow.arm(take)
                flushed = work.step(step_rng)
                if crash:
                    # a flush's writes may or may not have landed; it was not acknowledged yet
                    queue.append(shadow.disarm() or take("mid-flush" if flushed else "between"))
                if flushed:
                    shadow.settle()
                current = work.wal.insert_lsn // work.wal.segment_size
                shadow.remember((current - 1, current))  # (where the last steps wrote)
            if kills and kill_rng.random() < KILL_RATE:  # (page-cache modes: a step)
                report.kills += 1
                with recovery_warnings() as said:
                    problem = _kill_and_reopen(work, shadow)
                report.recovery_warnings += len(said)
                if problem:
                    report.lost += 1
                    report.failures.append(f"the reopen after kill {report.kills}: {problem}")
            rounds += 1
            if shadow.errors:
                raise RuntimeError(f"the persist tracer failed:\n{shadow.errors[0]}")
            _raise_background_error(work.wal)
            if work.retain():
                shadow.settle()
            _check_queue(queue[:images - report.images], work, root / "image", report,
                         keep_failures, progress)
            queue.clear()
        report.records_written = work.written
        report.flushed_bytes = work.wal.flushed_lsn  # (the last handle: kills reopen it)
        report.segments_recycled = work.wal.stats()["segments_recycled"]
        report.checkpointed = work.checkpointed
        report.deaths = getattr(work, "deaths", 0)
        report.published_ahead = getattr(work, "ahead", 0)
        work.close()
        report.background_ops = dict(shadow.background_ops)
    finally:
        if following is not None:
            following.stop_following()
        shutil.rmtree(root, ignore_errors=True)
    report.seconds = time.perf_counter() - t0
    return report


def _open_workload(workload: str, path: Path, mode: str, seed: int, threads: int,
                   shared: bool = False, kills: bool = False,
                   background: bool = False) -> Writers[Any]:
    """A fresh WAL (or Log) at ``path`` for ``mode``, with the workload that writes it.
    With ``kills``, no segment is recycled: a reopen then finds zeros past the records it
    recovers, so nothing but its own syncs can make them durable (in a recycled segment,
    wiping the stale bytes past the end syncs the file as a side effect)."""
    options: dict[str, Any] = {"mode": "buffered" if mode == "buffered" else "direct",
                               "segment_size": SEGMENT_SIZE, "background": False,
                               "recycle_segments": 0 if kills else 1, "prepare_segments": 0,
                               **(BACKGROUND_OPTIONS if background else {})}
    if workload == "log":
        return LogWorkload(pmemwal.open_log(path, **options), seed, threads)
    if shared:
        return SharedWorkload(path, options, seed)
    work = (FollowWorkload if workload == "follow" else Workload)(pmemwal.open(path, **options),
                                                                  seed)
    work.reopen = lambda: pmemwal.open(path, **options)
    return work


def _raise_background_error(wal: pmemwal.WAL) -> None:
    """The background writer keeps what failed in a round and tries again next round: under
    the model that is a failure of the run, as the tracer's own are."""
    writer = getattr(wal, "_background", None)
    if writer is not None and writer.error is not None:
        raise RuntimeError(f"the background writer failed: {writer.error!r}") from writer.error


def _check_queue(queue: list[Image], work: Writers[Any], path: Path, report: PowerLossReport,
                 keep_failures: str | None, progress: Callable[[int], None] | None) -> None:
    for image in queue:
        t1 = time.perf_counter()
        with recovery_warnings() as said:
            verdict, detail = work.check(image, path)
        report.recovery_warnings += len(said)
        elapsed_ms = 1000 * (time.perf_counter() - t1)
        report.recovery_ms_mean += (elapsed_ms - report.recovery_ms_mean) / (report.images + 1)
        _count(report, image, verdict, detail, path, keep_failures)
        if progress:
            progress(1)



# setups left out of ``pmemwal powerloss``'s default run (cost): named with --setups
NOT_DEFAULT = ("buffered-background",)


def wal_workload_only(setup: str) -> bool:
    """Whether ``setup`` is for the wal run only (a checkpointer, a shared WAL, kills; or a
    workload of its own, which ``--workload log`` runs in its every setup)."""
    return bool(set(SETUPS[setup]) - {"mode", "threads"})


def applies(setup: str, workload: str) -> bool:
    """Whether ``setup`` runs with ``workload``: every setup with the wal workload; with the
    follow workload, those on one WAL (not the shared WAL's, nor one naming its workload);
    with the log workload, those of mode and threads alone."""
    if workload == "wal":
        return True
    if workload == "follow":
        return not {"shared", "workload"} & set(SETUPS[setup])
    return not wal_workload_only(setup)


def parse_setups(text: str) -> tuple[str, ...]:
    """"pmem,msync" -> ("pmem", "msync"); ValueError naming the valid setups."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in SETUPS]
    if bad or not names:
        raise ValueError(f"unknown setup {', '.join(bad) or text!r}: choose from {', '.join(SETUPS)}")
    return names


def table(reports: list[PowerLossReport]) -> str:
    """The reports as a Markdown table, one row per setup (with the log workload's columns
    when one of them ran it)."""
    log = any(r.workload == "log" for r in reports)
    mixed = log and any(r.workload != "log" for r in reports)
    columns = [("setup", lambda r: (r.mode if r.threads == 1 else f"{r.mode} x{r.threads} writers")
                + (", log workload" if mixed and r.workload == "log" else "")
                + (" + checkpointer" if r.checkpointer else "")
                + (" + background writer" if r.background else "")
                + (f", shared by 3 handles, {r.deaths} died mid-insert" if r.shared else "")
                + (f", {r.kills} kills and reopens" if r.kills else "")
                + (f", streaming ({r.crc32c_path}, {r.flush_instruction})" if r.streaming else "")),
               ("images", lambda r: f"{r.images:,}"),
               (f"{'entries' if log else 'records'} written", lambda r: f"{r.records_written:,}"),
               ("lost", lambda r: r.lost),
               *([("resurrected", lambda r: r.resurrected),
                  ("wrong state", lambda r: r.wrong_state)] if log else []),
               ("bad", lambda r: r.bad), ("recovery errors", lambda r: r.recovery_errors),
               *([("held past acknowledged", lambda r: f"{r.published_ahead:,}")]
                 if any(r.workload == "follow" for r in reports) else []),
               ("kept more than acknowledged", lambda r: f"{r.recovered_beyond_ack:,}"),
               ("segments recycled", lambda r: r.segments_recycled),
               ("recovery ms (mean)", lambda r: f"{r.recovery_ms_mean:.1f}"),
               ("seconds", lambda r: f"{r.seconds:.0f}")]
    rows = ["| " + " | ".join(name for name, _ in columns) + " |",
            "|" + "---|" * len(columns)]
    rows += ["| " + " | ".join(str(cell(r)) for _, cell in columns) + " |" for r in reports]
    return "\n".join(rows)


def _shadow_for(mode: str, wal: pmemwal.WAL, rng: np.random.Generator, crash_rate: float,
                on_crash: Callable[[str], None], *, flush_instruction: str | None = None,
                streaming: bool = False, mutations: int = 0) -> DurableShadow:
    if mode == "pmem":
        # a crash point per flush and drain call: far more of them than of operations
        return PmemTracer(wal, rng, crash_rate / 10, on_crash, flush_instruction=flush_instruction,
                          streaming=streaming, mutations=mutations)
    # msync even where libpmem would say pmem
    shadow = DurableShadow(wal, rng, PAGE_CACHE_GRAINS, crash_rate / 4, on_crash,
                           _core.PERSIST_MSYNC if mode == "msync" else None)
    if _core.TRACED:
        shadow.trace_syncs(mutations)
    elif mutations:
        raise ValueError("mutations are put into the traced core only: PMEMWAL_TRACED_CORE=1")
    return shadow


def _kill_and_reopen(work: Writers[Any], shadow: DurableShadow) -> str | None:
    """A SIGKILL of the writer, then an open of its WAL that goes on appending.

    The killed process never fences again: its pending flushes stay unpersisted, while
    its files keep every store (CPU caches and the page cache outlive a process).  The
    open's recovery reads those records; only the syncs it makes (each file it
    fdatasyncs, each CHECKPOINT slot it writes) put them into the durable shadow, and a
    crash point falls before each: a crash inside recovery, its image recovered in turn.
    Records past where recovery ended were never there for the new writer; they leave
    the ledger, and the acknowledgements made before the kill stay promised.  What the
    reopen recovered is checked like an image (its problem is returned).
    """
    assert isinstance(work, Workload), "kills: the wal or follow workload"
    old = work.wal
    old._forsake()
    old._dir.close()  # the kernel drops a dead process's locks
    shadow.handles = []
    with _recovery_traced(shadow):
        wal = work.reopen()
    shadow.wal = wal
    shadow.attach(wal)
    with shadow.lock:
        for segno in wal._segnos:
            if segno not in shadow.segments:  # made by the open (synced as it made it)
                shadow.track(segno)
    return work.reopened(wal)


@contextmanager
def _recovery_traced(shadow: DurableShadow) -> Iterator[None]:
    """While a WAL opens: a segment file it fdatasyncs (or fsyncs) is durable as it
    is (a CHECKPOINT slot it writes is followed as every write of the WAL's other files)."""
    fdatasync, fsync = os.fdatasync, os.fsync
    on_crash = shadow.on_crash
    assert on_crash is not None, "a run's shadow takes crash images"

    def synced(sync: _Sync) -> _Sync:
        def call(fd: FileDescriptorLike) -> None:
            if shadow.rng.random() < RECOVERY_CRASH_RATE:
                on_crash("in recovery")
            sync(fd)
            fd = fd if isinstance(fd, int) else fd.fileno()
            segno = parse_segment_name(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            if segno is not None and segno in shadow.segments:
                shadow.track(segno)
        return call

    os.fdatasync, os.fsync = synced(fdatasync), synced(fsync)
    try:
        yield
    finally:
        os.fdatasync, os.fsync = fdatasync, fsync


_FAILURE_COUNTERS = {"lost": "lost", "bad": "bad", "error": "recovery_errors",
                     "resurrected": "resurrected", "state": "wrong_state"}


def _count(report: PowerLossReport, image: Image, verdict: str, detail: str, path: Path,
           keep_failures: str | None) -> None:
    report.images += 1
    report.crash_points[image.where] = report.crash_points.get(image.where, 0) + 1
    report.grains[image.grain] = report.grains.get(image.grain, 0) + 1
    if verdict == "beyond":
        report.recovered_beyond_ack += 1
    elif verdict != "ok":
        counter = _FAILURE_COUNTERS[verdict]
        setattr(report, counter, getattr(report, counter) + 1)
        message = f"image {report.images} ({image.where}, grain {image.grain}): {verdict}: {detail}"
        if keep_failures:
            kept = Path(keep_failures) / f"{report.mode}-{report.images}"
            shutil.copytree(path, kept, dirs_exist_ok=True)
            message += f" (kept in {kept})"
        report.failures.append(message)


def _default_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
