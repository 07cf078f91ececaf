"""The WAL: open and recover, append, flush, read, truncate, close.

Opening a WAL locks its directory, checks every segment header, then finds
the end: it follows the record chain from the first record of the oldest
segment to the first position that fails validation.  What lies past that
point decides what it is (native/wal_reader.c): a torn tail is cut, damage to
records that had been flushed raises CorruptionError unless the caller asked
to cut there too.  Before appending resumes, the rest of the end's page and
any later page that still looks current, or holds a record of this cycle
under an older cycle's header, are wiped, so that no old byte can ever
follow a new record as if it belonged to it.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import mmap
import os
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from pmemwal import _core, libpmem
from pmemwal.archive import DEFAULT_COMMAND_TIMEOUT
from pmemwal.archiver import Archiver
from pmemwal.background import BackgroundWriter
from pmemwal.checkpoint import Checkpoint, CheckpointFile
from pmemwal.control import ControlFile
from pmemwal.device import (FORCE_ENV_VAR, ProbeResult, force_ignored, fs_type, probe,
                            resolve_mode, stream_min)
from pmemwal.errors import (ClosedError, ConfigError, CorruptionError, FormatError, NotFoundError,
                            StorageError, format_lsn)
from pmemwal.format import (DEFAULT_SEGMENT_SIZE, MAX_RECORD_LIMIT, PAGE_SIZE, first_lsn,
                            is_valid_segment_size)
from pmemwal.growth import GrowthPace
from pmemwal.recovery import VERIFY, Recovery
from pmemwal.segments import Segment, WalDirectory, storage_errors

MODES = ("auto", "buffered", "direct")
SYNC_METHODS = {
    "fdatasync": _core.PERSIST_FDATASYNC,
    "fsync": _core.PERSIST_FSYNC,
    "open_datasync": _core.PERSIST_DSYNC,
}
ON_CORRUPTION = ("raise", "truncate")
PERSIST = ("auto", "pmem", "msync")  # direct mode: how records become durable
INSERTION = ("parallel", "serial")  # how insertions overlap (seed 004)
DEFAULT_BUFFER_SIZE = 16 << 20
DEFAULT_MAX_RECORD_SIZE = 64 << 20
DEFAULT_FLUSH_INTERVAL = 0.05
DEFAULT_MAX_WAL_SIZE = 1 << 30
DEFAULT_MAX_PENDING = 4 << 30  # archive_max_pending
# A checkpoint a second, or every 64 MiB flushed: after a crash, open reads at most about
# that much (0.02-0.1 s at the scan rates of docs/PERFORMANCE.md, "Recovery and open time"),
# for one small synced write a second.
DEFAULT_CHECKPOINT_INTERVAL = 1.0
DEFAULT_CHECKPOINT_BYTES = 64 << 20
_CHECKPOINT_MIN_GAP = 0.01  # seconds: checkpoints for bytes come no closer (a synced write each)
# Appends smaller than this keep the GIL while they insert (and persist): giving it up and
# taking it back costs more than the insertion.  Two threads at 8 KiB and 16 KiB ran
# 1.02-1.31x faster keeping it, at 64 KiB 1.3x faster giving it up, 32 KiB was a draw
# (docs/PERFORMANCE.md, "Threads and processes"; 8 KiB before issue 29: the history is in
# docs/notes/2026-12-performance-notebook.md §8.1 and §15.3).
DEFAULT_GIL_RELEASE_SIZE = 32 << 10
_END = (1 << 64) - 1
_READ_CACHE = 16  # read-only segment mappings kept for readers
_OLDEST = 8       # _core.Core.shared: the oldest segment a shared WAL's truncations left
# Segments made ahead (or kept as spares) at most: the core's table of attached segments is
# indexed by number modulo SEG_TABLE, and one that far ahead would evict the current one.
_MAX_AHEAD = _core.SEG_TABLE // 4
_BRINGS_PER_ROUND = 4  # segments a background round makes or attaches before its flush
_SHARED: weakref.WeakSet[WAL] = weakref.WeakSet()  # shared WALs open in this process


def _after_fork_in_child() -> None:
    """A child of fork() has copies of the parent's shared WALs: they refuse all work
    (ClosedError) and never touch the state and locks the parent's copy owns."""
    for wal in list(_SHARED):
        wal._forsake()
    _SHARED.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class Record:
    """A record read back: its LSN, its payload, and the LSN of the record before it."""

    lsn: int
    payload: memoryview
    prev_lsn: int


def open(path: str | os.PathLike[str], *, mode: str = "auto", create: bool = True,
         segment_size: int | None = None, insert_slots: int = 8,
         buffer_size: int = DEFAULT_BUFFER_SIZE, max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
         sync_method: str = "fdatasync", on_corruption: str = "raise",
         recycle_segments: int = 2, background: bool = True,
         flush_interval: float = DEFAULT_FLUSH_INTERVAL,
         prepare_segments: int = 2, prefault: bool = True,
         gil_release_size: int = DEFAULT_GIL_RELEASE_SIZE,
         max_wal_size: int = DEFAULT_MAX_WAL_SIZE, preallocate: int = 0,
         persist: str = "auto", insertion: str = "parallel", shared: bool = False,
         archive: str | None = None, archive_command: str | None = None,
         restore_command: str | None = None, archive_options: dict | None = None,
         archive_timeout: float = DEFAULT_COMMAND_TIMEOUT,
         archive_max_pending: int = DEFAULT_MAX_PENDING, archive_backoff: float = 10.0,
         checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
         checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES, verify: str = "checkpoint") -> WAL:
    """Open (or create) the WAL in directory ``path``; see ``WAL`` for the options."""
    return WAL(path, mode=mode, create=create, segment_size=segment_size,
               insert_slots=insert_slots, buffer_size=buffer_size,
               max_record_size=max_record_size, sync_method=sync_method,
               on_corruption=on_corruption, recycle_segments=recycle_segments,
               background=background, flush_interval=flush_interval,
               prepare_segments=prepare_segments, prefault=prefault,
               gil_release_size=gil_release_size, max_wal_size=max_wal_size,
               preallocate=preallocate, persist=persist, insertion=insertion, shared=shared,
               archive=archive, archive_command=archive_command, restore_command=restore_command,
               archive_options=archive_options, archive_timeout=archive_timeout,
               archive_max_pending=archive_max_pending, archive_backoff=archive_backoff,
               checkpoint_interval=checkpoint_interval, checkpoint_bytes=checkpoint_bytes,
               verify=verify)


class WAL:
    """A write-ahead log in a directory of segment files: one writer process, or several
    that all open it with ``shared=True``.

    Options (each has a default that suits most uses):

    - ``mode``: ``"buffered"`` (WAL buffer ring, pwrite + sync), ``"direct"``
      (segments mapped, records copied straight in, persisted with libpmem or
      msync) or ``"auto"`` (``PMEMWAL_MODE``, else the device probe decides).
    - ``create``: make the directory and a new WAL when there is none.
    - ``segment_size``: bytes per segment file, a power of two from 1 MiB to
      1 GiB; None means the WAL's own (16 MiB for a new one).
    - ``insert_slots``: concurrent insertions that can be in progress (1..256).
    - ``buffer_size``: buffered mode's WAL buffer ring, a multiple of 8 KiB.
    - ``max_record_size``: the largest payload accepted (up to 1 GiB).
    - ``sync_method``: buffered mode's ``fdatasync``, ``fsync`` or ``open_datasync``.
    - ``persist``: how direct mode makes records durable: ``"auto"`` by libpmem's
      cache flush where libpmem takes the mapping for persistent memory (DAX, or
      ``PMEM_IS_PMEM_FORCE=1``), by ``msync`` otherwise; ``"msync"`` always by
      ``msync`` (the kernel's path, as on a file system without DAX: what
      seed 003's non-DAX runs measured), ``"pmem"`` only by cache flush, a
      ConfigError where the mapping is not persistent memory.  Buffered mode
      takes ``"auto"`` only: it persists with ``sync_method``.
    - ``insertion``: ``"parallel"`` (a record's space is reserved in one short step and
      its checksum and copy run beside other insertions, in up to ``insert_slots`` at
      once) or ``"serial"`` (reserving, checksum and copy all under one lock, one
      insertion at a time: PostgreSQL's WALInsertLock before 9.4, seed 004's "before",
      to measure parallel insertion against).
    - ``shared``: several processes append to this WAL at once, each opening it with
      ``shared=True`` (docs/SHARED.md).  They share the insert position, insertion
      slots and flushed position through ``CONTROL``, a file in the WAL directory
      that each maps, and a process that dies mid-insert never blocks the others:
      the first to wait for it closes its range.  Direct mode only (``mode="auto"``
      means direct here: msync where the mapping is not persistent memory); the
      processes must agree on ``segment_size`` and take the first opener's
      ``insert_slots``.  A WAL open without it in one process is LockedError here,
      and the other way round.  After ``fork()`` the child cannot use the parent's
      WAL (ClosedError): it opens the WAL itself.
    - ``archive``: an fsspec URL (``"s3://bucket/wal"``, ``"file:///mnt/arch"``) that every
      complete segment is copied to, off the append path, and checked after (docs/ARCHIVE.md;
      ``pip install 'pmemwal[archive]'``).  Truncation then never removes or recycles a
      segment before it is archived.  ``archive_options``: the fsspec file system's
      options (``{"client_kwargs": {"endpoint_url": ...}}`` for an S3-compatible server).
    - ``archive_command``: archive with a shell command instead, in PostgreSQL's
      convention (``"cp %p /mnt/arch/%f"``; exit status 0 means archived), stopped after
      ``archive_timeout`` seconds; ``restore_command`` (``"cp /mnt/arch/%f %p"``), when
      given, reads each archived segment back to compare it.
    - ``archive_max_pending``: bytes of complete segments that may wait for the archive
      (it is unreachable, or refuses them); past it, appends that need a new segment get
      ArchiveError (a StorageError, ENOSPC) naming the archive, until it catches up.
    - ``archive_backoff``: the longest pause, in seconds, between retries of a failed
      archiving (the pause doubles from 0.1 s).
    - A shared WAL's processes each run an archiver if they pass an archive option (the
      same one, as they must): one works at a time, the others wait to take over.
    - ``on_corruption``: ``"raise"`` CorruptionError when damaged durable
      records are followed by more, or ``"truncate"`` the WAL at the damage.  Either way,
      valid records past where recovery ends the WAL are first set aside in
      ``lost+found/`` (``pmemwal lost-found``), never only zeroed.
    - ``checkpoint_interval``, ``checkpoint_bytes``: the background writer writes a
      checkpoint (``CHECKPOINT``: where the next open starts reading, and below which
      every record is known durable) when this many seconds have passed, or this many
      bytes were flushed, since the last one; a clean close and ``truncate`` write one
      too, and ``checkpoint()`` on demand.  After a crash, open reads about what was
      flushed since the last checkpoint; after a clean close, nothing.
    - ``verify``: ``"checkpoint"`` (open reads from the checkpoint on; a record before
      it is checked when read) or ``"all"`` (open reads every retained record, and an end
      before the checkpoint's is CorruptionError: the check ``pmemwal verify`` makes).
    - ``recycle_segments``: truncated segments kept, renamed, for reuse, beyond
      the ``prepare_segments`` the background writer keeps ready; at least this
      many, and 2.5 times as many as the WAL advances between two truncations (an
      estimate, as PostgreSQL sizes its recycling), within ``max_wal_size``.
    - ``max_wal_size``: bytes of segments, retained and recycled together, past
      which truncation removes segments instead of recycling them (it never
      removes a segment that was not truncated); a WAL not truncated yet makes
      at most a quarter of it ahead.
    - ``preallocate``: bytes of WAL made ready when it is opened, ahead of the
      insert position (segments created, allocated, mapped and attached), so
      that appending that much creates no segment: a log kept whole up to that
      size appends at steady-state speed (like a libpmemlog pool's size).
    - ``background``: run the background writer (asynchronous flushes and
      segment preparation); without it appenders create segments themselves.
    - ``flush_interval``: seconds between the background writer's flushes.
    - ``prepare_segments``: segments kept ready ahead of the insert position, at
      least.  Until its first truncation a WAL (not shared) keeps ready what it
      grows by in max(0.1 s, 4 times its slowest recent segment make)
      (pmemwal/growth.py): a log that grows slower than the machine makes
      segments never waits for one.
    - ``prefault``: map direct-mode segments with every page faulted in
      (MADV_POPULATE_WRITE), write buffered-mode ones with zeros when made
      (PostgreSQL's wal_init_zero), and prepare them ahead; False lets
      appenders take the first-touch faults (what seed 003 measured).
    - ``gil_release_size``: appends (a batch: its total payload) of at least this
      many bytes give up the GIL before copying; smaller ones keep it unless they
      must wait (for a slot, another insertion, a system call), since handing the
      GIL over costs more than inserting them.  0 always gives it up.
    """

    def __init__(self, path: str | os.PathLike[str], *, mode: str = "auto", create: bool = True,
                 segment_size: int | None = None, insert_slots: int = 8,
                 buffer_size: int = DEFAULT_BUFFER_SIZE,
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE, sync_method: str = "fdatasync",
                 on_corruption: str = "raise", recycle_segments: int = 2,
                 background: bool = True, flush_interval: float = DEFAULT_FLUSH_INTERVAL,
                 prepare_segments: int = 2, prefault: bool = True,
                 gil_release_size: int = DEFAULT_GIL_RELEASE_SIZE,
                 max_wal_size: int = DEFAULT_MAX_WAL_SIZE, preallocate: int = 0,
                 persist: str = "auto", insertion: str = "parallel", shared: bool = False,
                 archive: str | None = None, archive_command: str | None = None,
                 restore_command: str | None = None, archive_options: dict | None = None,
                 archive_timeout: float = DEFAULT_COMMAND_TIMEOUT,
                 archive_max_pending: int = DEFAULT_MAX_PENDING,
                 archive_backoff: float = 10.0,
                 checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
                 checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
                 verify: str = "checkpoint") -> None:
        _check_options(mode, segment_size, insert_slots, buffer_size, max_record_size,
                       sync_method, on_corruption, recycle_segments, flush_interval,
                       prepare_segments, gil_release_size, max_wal_size, preallocate, persist,
                       insertion, shared)
        _check_checkpoint_options(checkpoint_interval, checkpoint_bytes, verify)
        archive_spec = _archive_spec(archive, archive_command, restore_command, archive_options,
                                     archive_timeout, archive_max_pending, archive_backoff,
                                     background)
        self._archiver: Archiver | None = None
        self._insertion = insertion
        self._background: BackgroundWriter | None = None
        self._prepare_segments = prepare_segments if prefault else 0
        self._prefault = prefault
        self._closed = True
        self._core_closed = False
        self._segments: dict[int, Segment] = {}
        self._read_cache: OrderedDict[int, Segment] = OrderedDict()
        self._seg_lock = threading.RLock()      # the segment table; appenders may need it
        self._truncate_lock = threading.Lock()  # one truncation at a time; appenders never take it
        self._arriving: dict[int, threading.Event] = {}  # segments being made, opened or recycled
        self._retired: dict[tuple[int, int], Segment] = {}  # shared: truncated, mapped, by inode
        self._counters = {"segments_created": 0, "segments_recycled": 0, "segments_removed": 0,
                          "segments_prefaulted": 0, "segment_make_ns": 0, "checkpoints": 0,
                          "segment_waits": 0}
        self._checkpoint_interval = checkpoint_interval
        self._checkpoint_bytes = checkpoint_bytes
        self._checkpoint_lock = threading.Lock()  # one checkpoint written at a time
        self._checkpoint: Checkpoint | None = None    # the last one this process read or wrote
        self._cuts = 0  # recoveries that cut durable records (checkpoint.py: cuts)
        self._checkpoint_time = time.monotonic()
        self._position_before = (0, 0)  # the background's position snapshot of its last round
        self._checkpoint_listeners: list = []  # called after each background checkpoint
        self._sync_method = sync_method
        self._persist = persist
        self._recycle_segments = recycle_segments
        self._max_wal_size = max_wal_size
        self._truncation_distance = 0.0  # bytes appended between two truncations: the largest, decaying
        self._typical_distance = 0.0     # the same, a plain moving average
        self._last_truncation_lsn: int | None = None
        self._growth = GrowthPace()  # until the first truncation: how far ahead to make segments
        self._notify_ahead = self._prepare_segments
        self._control: ControlFile | None = None
        self._dir = WalDirectory(os.fspath(path), create, shared=shared)
        try:
            if shared:
                self._control = ControlFile(self._dir.path)
                with self._control.files_lock():
                    self._open(mode, segment_size, on_corruption, insert_slots, buffer_size,
                               max_record_size, gil_release_size, verify)
            else:
                self._open(mode, segment_size, on_corruption, insert_slots, buffer_size,
                           max_record_size, gil_release_size, verify)
            if archive_spec is not None:
                self._archiver = Archiver(self._dir.path, archive_spec, self.segment_size,
                                          self._segnos[0], archive_max_pending, archive_backoff)
            self._preallocate(preallocate)
            if background:
                self._start_background(flush_interval)
                if self._archiver is not None:
                    self._background.wake()  # its first round marks what completed before
        except BaseException:
            self._release()
            raise
        self._closed = False
        if shared:
            _SHARED.add(self)

    # ---- opening -------------------------------------------------------------

    def _open(self, mode: str, segment_size: int | None, on_corruption: str, insert_slots: int,
              buffer_size: int, max_record_size: int, gil_release_size: int,
              verify: str) -> None:
        """Check the segments, choose the mode, recover and start the core.  A shared WAL
        (the files lock held) is recovered by the process that finds no other has it
        open, which rebuilds the control file; the others join the state it set up."""
        first = self._dir.lock_shared() if self._control is not None else True
        self._open_segments(segment_size, create=first)
        if self._control is not None and mode == "auto":
            mode = "direct"  # the mode shared writing has (msync where not pmem)
        self.mode, self._verdict = resolve_mode(mode, self._dir.path)  # (a brief probe)
        self._verdict_full = False
        if self._control is not None and self.mode != "direct":
            raise ConfigError("shared=True works in direct mode only: sharing buffered mode's "
                              "ring between processes would cost a copy to shared memory and a "
                              "cross-process write lock (docs/SHARED.md)")
        self._direct = self.mode == "direct"
        self._map_sync = bool(self._verdict and self._verdict.map_sync)
        self._reader = _core.Reader(self.segment_size, self._wal_id_lo, _weak(self, "_segment_buffer"))
        self._checkpoints = CheckpointFile(self._dir.path, self.wal_id, self.segment_size)
        self.recovery: dict | None = None
        insert_lsn = prev_lsn = 0
        if first:
            with storage_errors(f"syncing {self._dir.path}"):
                self._dir.sync()  # what a killed writer renamed into place, before it is used
            recovered = Recovery(self._dir, self._segnos, self.segment_size, self.wal_id,
                                 self._reader, self._segment_buffer, self._checkpoints)
            result = recovered.run(on_corruption, verify)
            insert_lsn, prev_lsn, self.recovery = result.insert_lsn, result.prev_lsn, result.as_dict()
            self._cuts = result.cuts
        self._start_core(insert_slots, buffer_size, max_record_size, gil_release_size,
                         insert_lsn, prev_lsn, first)
        if first:  # from here on the WAL is in use: no longer cleanly closed (pg_control's state)
            self._persist_recovered(self.recovery["scanned_from"], insert_lsn)
            self._write_checkpoint(insert_lsn, prev_lsn, oldest=self.recovery["oldest_segno"],
                                   exact=True)
        else:
            self._checkpoint = self._checkpoints.read()
            self._cuts = self._checkpoint.cuts if self._checkpoint is not None else 0
        if self._control is not None and first:
            self._dir.share_lock()

    def _open_segments(self, segment_size: int | None, create: bool = True) -> None:
        """Read and cross-check every segment header, or create the first segment."""
        self._segnos = self._dir.list_segments()
        if not self._segnos:
            if not self._dir.may_create or not create:
                raise NotFoundError(errno.ENOENT, "no WAL in this directory (create=False)",
                                    self._dir.path)
            self.segment_size = segment_size or DEFAULT_SEGMENT_SIZE
            self.wal_id = os.urandom(16)
            self._dir.create(0, self.segment_size, self.wal_id)
            self._segnos = [0]
        else:
            headers = self._dir.read_headers(self._segnos)
            first = headers[0][0]
            for segno, (header, size) in zip(self._segnos, headers):
                if header.wal_id != first.wal_id or header.segment_size != first.segment_size:
                    raise FormatError(f"{self._dir.file(segno)} belongs to another WAL")
                if size != header.segment_size:
                    raise FormatError(f"{self._dir.file(segno)} is {size} bytes, "
                                      f"expected {header.segment_size}")
            if segment_size is not None and segment_size != first.segment_size:
                raise ConfigError(f"segment_size={segment_size}, but the WAL at {self._dir.path} "
                                  f"was made with {first.segment_size}")
            self.segment_size, self.wal_id = first.segment_size, first.wal_id
        self._wal_id_lo = int.from_bytes(self.wal_id[:4], "little")

    def _start_core(self, insert_slots: int, buffer_size: int, max_record_size: int,
                    gil_release_size: int, insert_lsn: int, prev_lsn: int,
                    first: bool = True) -> None:
        if self._direct:
            self._ring = None
        else:  # the WAL buffer ring: anonymous shared memory seen as a numpy array
            self._ring_map = mmap.mmap(-1, buffer_size)
            self._ring = np.frombuffer(self._ring_map, dtype=np.uint8)
        self._core = _core.Core(segment_size=self.segment_size, wal_id_lo=self._wal_id_lo,
                                direct=self._direct, ring=self._ring, insert_slots=insert_slots,
                                max_record_size=max_record_size,
                                segment_callback=_weak(self, "_segment_needed"),
                                gil_release_size=gil_release_size)
        if self._control is not None:
            control = self._control
            mapping = (control.rebuild if first else control.join)(self.wal_id, self.segment_size)
            self._core.share(mapping, control.fd, first)
        if first:
            self._core.set_position(insert_lsn, prev_lsn)
            if self._control is not None:
                self._core.shared(_OLDEST, self._segnos[0])
        self._core.set_serial(self._insertion == "serial")
        # The per-record calls go straight to C: a Python frame here would cost
        # as much as appending a small record (the methods below document them).
        self.append = self._core.append
        self.append_prefixed = self._core.append_prefixed
        self.flush = self._core.flush
        self.max_record_size = max_record_size
        self._choose_persist(self._core.insert_lsn // self.segment_size)

    def _choose_persist(self, segno: int) -> None:
        """libpmem's cache flush where the mapping is pmem, msync otherwise (or as the
        ``persist`` option says); or the sync method."""
        self.stream_min: int | None = None  # pmem: records streamed from this size on
        if not self._direct:
            if self._persist != "auto":
                raise ConfigError(f"persist={self._persist!r}: buffered mode persists with "
                                  f"sync_method ({self._sync_method}); persist is direct mode's")
            self.persist_method = self._sync_method
            self._core.set_persist(SYNC_METHODS[self._sync_method])
            return
        self._ensure_segment(segno)
        lib = libpmem.load()
        pmem = self._persist != "msync" and lib is not None and \
            self._flushes_persist(self._segments[segno])
        if self._persist == "pmem" and not pmem:
            why = ("libpmem is not installed" if lib is None else
                   "libpmem does not take this mapping for persistent memory (no DAX)")
            raise ConfigError(f"persist='pmem': {why}; PMEM_IS_PMEM_FORCE=1 emulates it on "
                              "tmpfs, persist='auto' uses msync here")
        if self._control is not None:
            pmem = self._agree_persist(pmem)
        if pmem:
            self.persist_method = "pmem"
            self.stream_min = stream_min()
            self._core.set_persist(_core.PERSIST_PMEM, lib.addr_flush, lib.addr_drain,
                                   self.stream_min)
        else:
            self.persist_method = "msync"
            self._core.set_persist(_core.PERSIST_MSYNC)

    @functools.cached_property
    def _fs_type(self) -> str | None:
        """The WAL directory's file system type (read once: every segment made or attached
        asks, and reading the mount table costs 0.4 ms)."""
        return fs_type(self._dir.path)

    def _flushes_persist(self, seg: Segment) -> bool:
        """Whether cache flushes make stores to segment ``seg``'s mapping durable: it is
        MAP_SYNC (the probe's scratch file may be DAX where this file is not: XFS and ext4
        set DAX per inode), or libpmem takes it for persistent memory."""
        lib = libpmem.load()
        if lib is None or seg.map_sync:
            return lib is not None
        if not lib.is_pmem(libpmem.buffer_address(seg.map), len(seg.map)):
            return False
        if force_ignored(self._fs_type, False):
            warnings.warn(f"{FORCE_ENV_VAR}=1 is set, but {self._dir.path} is on "
                          f"{self._fs_type}, not DAX: cache flushes would leave "
                          "records in the page cache, so this WAL persists by msync",
                          RuntimeWarning, stacklevel=2)
            return False
        return True

    def _agree_persist(self, pmem: bool) -> bool:
        """A shared WAL: every process persists the same way, as the first one chose.  One
        persisting by cache flush moves the flushed position past records it only waited
        for, which in a process using msync are not synced yet: a process that would use
        cache flushes follows msync, and one that cannot flush caches is refused."""
        wanted = _core.PERSIST_PMEM if pmem else _core.PERSIST_MSYNC
        agreed = self._core.agree_persist(wanted) == _core.PERSIST_PMEM
        if pmem and not agreed and self._persist == "pmem":
            raise ConfigError("persist='pmem', but the processes sharing this WAL persist by "
                              "msync, as the first of them chose")
        if agreed and not pmem:
            raise ConfigError("the processes sharing this WAL persist by cache flush (pmem), and "
                              "this one cannot (persist='msync', no libpmem, or a mapping libpmem "
                              "does not take for pmem: PMEM_IS_PMEM_FORCE must match)")
        return agreed

    def _preallocate(self, nbytes: int) -> None:
        """Make ready the segments that appending ``nbytes`` from here will reach."""
        if nbytes == 0:
            return  # none: appenders and the background writer attach them as they come
        insert = self._core.insert_lsn
        for segno in range(insert // self.segment_size,
                           (insert + nbytes - 1) // self.segment_size + 1):
            self._ensure_segment(segno)

    def _start_background(self, flush_interval: float) -> None:
        self._background = BackgroundWriter(_weak(self, "_prepare_ahead"), _weak(self, "_flush_async"),
                                            flush_interval, f"pmemwal-writer {self._dir.path}",
                                            watch=self._dir.path)
        self._core.set_notify(self._background.notify_fd, self._notify_ahead)  # (and at the
        # first insertion: segments ahead are made once the WAL grows, not at the first
        # timed round)

    def _prepare_ahead(self) -> None:
        """Background: have the next segments ready and attached (those a truncation is
        recycling into place are left to it), as many as the most of:

        - prepare_segments;
        - until this process's first truncation, the WAL's growth over a few times the
          slowest recent make (growth.py), within a quarter of max_wal_size: a log that
          keeps everything fills them no faster than the machine makes them, and a burst
          or a slower make does not reach the end of them.  A shared WAL makes only
          prepare_segments of them and attaches the rest as other processes make or
          recycle them (one of them may be truncating: spares made here would be its
          surplus);
        - after it, what is left of twice the typical distance between two truncations
          once the WAL's advance since the last one is taken off.  Truncation alone cannot
          build that pool: in a steady state it recycles as many segments as the appenders
          used since the last one.  Taking the advance off leaves the next truncation to
          refill what the appenders use, so the background makes segments only for a WAL
          outrunning its truncations (then kept: the late truncation raises the spare
          target), never ones the next truncation removes as surplus.  Those made ahead
          before the first truncation count as its spares, so it removes what it cuts
          rather than recycle more than the pool needs.

        The core wakes this writer when an insertion enters a segment and any of that many
        after it is missing, so each segment taken starts the making of the next.  A round
        brings a few segments, then flushes, and goes on in the next round."""
        if self._closed or self._core.error or not self._prepare_segments or self._truncating():
            return
        insert = self._core.insert_lsn
        current = insert // self.segment_size
        self._growth.observe(insert)
        with self._seg_lock:
            growing = self._growing()
            ahead, make_ahead = self._segments_wanted_ahead(insert, growing)
        if ahead != self._notify_ahead and self._background is not None:
            self._notify_ahead = ahead
            self._core.set_notify(self._background.notify_fd, ahead)
        brought = 0
        for segno in range(current, current + ahead + 1):
            if growing and not self._growing() or self._truncating():
                return  # a truncation came meanwhile: its pool, not the growth, decides
            if segno in self._segments or segno in self._arriving:
                continue
            if segno > current + make_ahead and segno not in self._segnos and \
                    not os.path.exists(self._dir.file(segno)):
                return  # attached only once another process makes it
            if brought == _BRINGS_PER_ROUND and self._background is not None:
                self._background.wake()  # the round's flush first, then the rest
                return
            self._ensure_segment(segno)
            self._count("segments_prefaulted")
            brought += 1

    def _segments_wanted_ahead(self, insert: int, growing: bool) -> tuple[int, int]:
        """_prepare_ahead's depth, and how many of it this process may make (the rest it
        only attaches); segment lock held."""
        current = insert // self.segment_size
        retained = sum(1 for s in self._segnos if s <= current)
        shared_growth = self._control is not None and self._last_truncation_lsn is None
        if growing or shared_growth:
            ahead = min(self._growth.segments_ahead(self.segment_size),
                        self._max_wal_size // self.segment_size // 4, _MAX_AHEAD)
        else:
            since = insert - self._last_truncation_lsn
            ahead = self._spares_within(2 * self._typical_distance - since, retained)
        ahead = min(max(self._prepare_segments, ahead), _MAX_AHEAD)
        return ahead, self._prepare_segments if shared_growth else ahead

    def _growing(self) -> bool:
        """Whether truncate() has not been called since the WAL was opened (a call that cuts
        nothing counts: it starts the distance to the next) and the WAL is not shared: its
        segments made ahead then follow its growth.  (A shared WAL's follow it only as far
        as prepare_segments; further, it attaches what others made: _prepare_ahead.)"""
        return self._last_truncation_lsn is None and self._control is None

    def _flush_async(self) -> None:
        """Background: check the segments, then make asynchronously appended records durable."""
        if self._closed or self._core.error:
            return
        if self._control is not None:
            self._core.reap_dead()  # a peer that died mid-insert, even if nobody waits for it
        if not self._truncating():
            self._check_segments()
        position = self._core.position()
        flushed = self._core.flushed_lsn
        if position[0] != flushed:
            flushed = self._core.flush_ready()
        self._background_checkpoint(position, flushed)
        if self._archiver is not None:
            self._archiver.tick(self._oldest_segment(), self._core.flushed_lsn)

    def _truncating(self) -> bool:
        """Whether a truncation is doing its file work.  Its own renames and removals wake
        the background writer (inotify), two for each segment recycled; a round then
        would only take the segment lock and the GIL from it (at 1 MiB records, 10 % of
        the appenders' rate), so the writer sits those out and truncate() wakes it once
        when done, for the check and the pipeline."""
        return self._truncate_lock.locked()

    def _check_segments(self) -> None:
        """Stop the writer once an attached segment file has been deleted: records
        written to it would vanish with it (background.py: when this runs)."""
        self._drop_truncated()
        with self._seg_lock:
            for seg in self._segments.values():
                if os.fstat(seg.fd).st_nlink == 0 and seg.segno >= self._oldest_shared():
                    self._core.stop(errno.ENOENT, f"segment file {seg.segno:016X} was deleted "
                                    "under the writer")
                    return

    # ---- checkpoints (pmemwal/checkpoint.py) -------------------------------------

    def checkpoint(self) -> int:
        """Make everything appended so far durable and write a checkpoint there; returns its
        LSN.  The next open reads from it on, and takes any invalid record before it for
        damage (CorruptionError), never for the end of the WAL.  The background writer
        writes one every ``checkpoint_interval`` seconds or ``checkpoint_bytes`` bytes."""
        self._check_open()
        return self._write_checkpoint(*self._flushed_position()).end_lsn

    @property
    def cuts(self) -> int:
        """How many recoveries of this WAL cut records that had been durable (opened with
        ``on_corruption="truncate"``): an index of the records that a layer made before a
        cut describes other records after it (pmemwal.Log compares it)."""
        return self._cuts

    def position(self) -> tuple[int, int]:
        """(insert LSN, LSN of the last record appended, 0 if none), read together: where a
        layer keeping an index of its own stands (pmemwal.Log's index checkpoints)."""
        self._check_open()
        return self._core.position()

    @property
    def probe(self) -> ProbeResult | None:
        """The device probe that chose the mode (mode ``"auto"``), else None.  The open
        takes the verdict only; the report's fields (CPU, governor) are read when asked."""
        if self._verdict is not None and not self._verdict_full:
            verdict = self._verdict
            self._verdict = dataclasses.replace(
                probe(self._dir.path), recommended_mode=verdict.recommended_mode,
                persist_method=verdict.persist_method, reason=verdict.reason,
                calibration=verdict.calibration)
            self._verdict_full = True
        return self._verdict

    def on_writer_thread(self) -> bool:
        """Whether the caller runs on this WAL's background writer (in a checkpoint
        listener), where ``close`` must not be called: it waits for that thread to end."""
        background = getattr(self, "_background", None)
        return background is not None and background.is_current()

    def add_checkpoint_listener(self, listener) -> None:
        """Call ``listener(end_lsn)`` from the background writer's thread after each
        checkpoint it writes: a layer with an index of its own (pmemwal.Log) stores it at
        the WAL's pace.  The listener must not wait for anything close() holds."""
        self._checkpoint_listeners.append(listener)

    def _persist_recovered(self, start: int, end: int) -> None:
        """Make the records recovery read past the checkpoint durable before a checkpoint
        names them: after a SIGKILL they may lie in the page cache (or, on pmem, in CPU
        caches) only, unsynced.  At most what was flushed since the last checkpoint."""
        size = self.segment_size
        lib = libpmem.load() if self.persist_method == "pmem" else None
        for segno in range(start // size, (end - 1) // size + 1) if end > start else ():
            if segno not in self._segnos:
                continue
            lo, hi = max(start, segno * size) % size, min(end - segno * size, size)
            if lib is not None:  # (the mapping may be a reader's, read-only)
                address = np.frombuffer(self._segment_buffer(segno), np.uint8).ctypes.data
                lib.persist(address + lo, hi - lo)
            with storage_errors(f"syncing segment {segno:016X}"):
                fd = os.open(self._dir.file(segno), os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)

    def _flushed_position(self) -> tuple[int, int]:
        """The insert position and the last record before it, with everything below made
        durable: a pair a checkpoint can name."""
        insert, last = self._core.position()
        if last:
            self._core.flush(last)
        return insert, last

    def _durable_point(self) -> tuple[int, int]:
        """A pair a checkpoint can name without flushing (truncation does not flush): the
        flushed LSN, and the record that ends there, found by following the record headers
        from the last checkpoint (records this WAL flushed: no CRC, a cost per record, at most
        about ``checkpoint_bytes`` of them: truncation and the background writer move it on).
        Flushes only when that chain is not there to follow (a peer truncated the
        checkpoint's segment)."""
        flushed, cp = self._core.flushed_lsn, self._checkpoint
        if cp is not None and cp.end_lsn == flushed:
            return flushed, cp.last_lsn
        oldest = first_lsn(self._oldest_segment(), self.segment_size)
        if cp is not None and oldest <= cp.end_lsn < flushed:
            status, end, last, _, _, _ = self._reader.scan(cp.end_lsn, cp.last_lsn or -1,
                                                           flushed, False)
            if status == 0 and end == flushed:
                return flushed, last or cp.last_lsn
        return self._flushed_position()

    def _background_checkpoint(self, position: tuple[int, int], flushed: int) -> None:
        """Background, after its flush: a checkpoint when one is due, at the position taken
        before the flush or, when an insertion still in progress held that back, at the one
        of the round before (long since complete)."""
        last = self._checkpoint
        before, self._position_before = self._position_before, position
        since = time.monotonic() - self._checkpoint_time
        if last is not None and since < self._checkpoint_interval and (
                flushed - last.end_lsn < self._checkpoint_bytes or since < _CHECKPOINT_MIN_GAP):
            return
        for end, prev in (position, before):
            if end and end <= flushed and (last is None or end > last.end_lsn):
                if self._write_checkpoint(end, prev, background=True) is not None:
                    for listener in self._checkpoint_listeners:
                        listener(end)
                return

    def _write_checkpoint(self, end: int, last: int, oldest: int = 0, clean: bool = False,
                          exact: bool = False, background: bool = False) -> Checkpoint | None:
        """Write a checkpoint naming ``end`` (durable: the caller flushed it), the record
        ``last`` that ends there, and the oldest segment kept: ``oldest`` or the oldest
        retained, whichever is higher.  A shared WAL's processes write it in turn (files
        lock), each never below what another wrote; ``exact``: recovery's, where it ended
        the WAL, which a cut may have moved below the last checkpoint.  A ``background``
        round's is dropped once close is under way (close writes the last)."""
        shared = self._control is not None
        # the files lock first: a shared truncation holds it when it writes one
        with (self._control.files_lock() if shared else nullcontext()), self._checkpoint_lock:
            if background and self._core_closed:
                return None  # close has written the last one
            current = self._checkpoints.read() if shared or self._checkpoint is None \
                else self._checkpoint
            oldest = max(oldest, self._oldest_segment())
            if current is not None and not exact:
                if current.end_lsn > end:  # written meanwhile, by a truncation or a peer
                    end, last = current.end_lsn, current.last_lsn
                oldest = max(oldest, current.oldest_segno)
                if (current.end_lsn, current.last_lsn, current.oldest_segno, current.clean) == \
                        (end, last, oldest, clean):
                    self._checkpoint = current
                    return current
            self._checkpoint = self._checkpoints.write(end, last, oldest, clean, current,
                                                       self._cuts)
            self._checkpoint_time = time.monotonic()
            self._count("checkpoints")
            return self._checkpoint

    # ---- segments (called by the native core, with the GIL) -------------------

    def _segment_needed(self, segno: int) -> None:
        """The core's call: an appender (or a flush) reached segment ``segno`` before it was
        attached, and waits for it (counted: the background writer should have made it)."""
        self._count("segment_waits")
        self._ensure_segment(segno)

    def _ensure_segment(self, segno: int) -> None:
        """Open (creating it if needed) segment ``segno`` and attach it to the core.

        A segment below the oldest one was truncated: a stale request for it
        (the insert position has moved past it since) is ignored, never
        answered by creating the segment again.  Files are made, opened and
        mapped outside the segment lock, so that several segments can be on
        their way at once (an appender and the background writer, each its own);
        a request for one that is on its way waits for it.
        """
        while True:
            with self._seg_lock:
                todo = self._claim_segments(segno)
            if isinstance(todo, threading.Event):
                todo.wait()
            elif todo:
                self._make_segments(todo)
            else:
                return

    def _claim_segments(self, segno: int) -> threading.Event | list[tuple[int, bool]] | None:
        """Under the segment lock: None when ``segno`` is attached (or truncated); the event of
        its arrival when another thread brings it; else the segments this thread must bring,
        as (number, whether to create the file), claimed.  Segments are made in order: an
        appender whose reservation reached this one may ask before the one that reserved the
        segment below, and a crash leaving a later segment without an earlier one reads as a
        deleted segment."""
        if self._core_closed:
            raise ClosedError("the WAL is closed")
        if segno < self._segnos[0] or segno < self._oldest_shared():
            return None
        if segno in self._arriving:
            return self._arriving[segno]
        if segno in self._segments:
            if hasattr(self, "_core"):
                seg = self._segments[segno]
                self._core.attach(segno, seg.fd, seg.map)
            return None
        if self._archiver is not None and hasattr(self, "_core") and \
                segno > self._core.insert_lsn // self.segment_size:
            self._archiver.check_room(segno, self._oldest_segment())
        if segno in self._segnos or self._made_by_peer(segno):
            todo = [(segno, False)]
        else:
            todo = [(n, True) for n in range(min(segno, self._segnos[-1] + 1), segno + 1)]
            self._segnos.extend(n for n, _ in todo)
            self._segnos.sort()
        for n, _ in todo:
            self._arriving[n] = threading.Event()
        return todo

    def _make_segments(self, todo: list[tuple[int, bool]]) -> None:
        """Create (where asked), open and map the claimed segments, then attach them."""
        for i, (segno, create) in enumerate(todo):
            try:
                started = 0
                if create:
                    self._await_lower(segno)
                    started = time.perf_counter_ns()
                    create = self._create_segment(segno)
                dsync = not self._direct and self._sync_method == "open_datasync"
                if not create and self._control is not None:
                    # Made by another process, which may have renamed it into place and not
                    # yet synced the directory: the entry must be durable before records in
                    # the segment are acknowledged here (it syncs under the files lock, which
                    # this thread cannot wait for under the segment lock: a sync of its own).
                    with storage_errors(f"syncing {self._dir.path}"):
                        self._dir.sync()
                seg = None if create else self._recycled_here(segno)
                try:
                    seg = seg or Segment(self._dir.file(segno), segno, self.segment_size,
                                         writable=True, dsync=dsync)
                except StorageError as exc:
                    if exc.errno != errno.ENOENT or segno >= self._oldest_shared():
                        raise
                    self._truncated_meanwhile(todo[i:])  # another process truncated it
                    return
                if self._direct:  # (at open: from where appending goes on)
                    insert = self._core.insert_lsn if hasattr(self, "_core") else 0
                    seg.mapping(populate=self._prefault, sync=self._map_sync,
                                populate_from=insert - segno * self.segment_size
                                if insert // self.segment_size == segno else 0)
                    if getattr(self, "persist_method", None) == "pmem" and \
                            not self._flushes_persist(seg):
                        seg.close()  # cache flushes to it would not be durable: loudly
                        raise StorageError(errno.EOPNOTSUPP, f"segment {segno:016X} maps "
                                           "through the page cache (no MAP_SYNC: not DAX, "
                                           "unlike the WAL's first segment), where this WAL "
                                           "persists by cache flush: reopen it (or use "
                                           "persist='msync')", self._dir.file(segno))
            except BaseException:
                with self._seg_lock:  # the rest were never made: nobody may wait for them
                    for n, created in todo[i:]:
                        if created:
                            self._segnos.remove(n)
                        self._arriving.pop(n).set()
                raise
            self._arrived(segno, seg, created=create,
                          make_ns=time.perf_counter_ns() - started if create else 0)

    def _truncated_meanwhile(self, rest: list[tuple[int, bool]]) -> None:
        """A shared WAL: the segments claimed in ``rest`` went in another process's
        truncation before this one opened them (a request for one is stale: the insert
        position had passed it): nobody waits for them."""
        with self._seg_lock:
            for n, _ in rest:
                if n in self._segnos:
                    self._segnos.remove(n)
                self._arriving.pop(n).set()

    def _create_segment(self, segno: int) -> bool:
        """Make segment ``segno``'s file; in a shared WAL, under the files lock and only
        if no other process made it first.  Returns whether this call made it."""
        if self._control is None:
            self._dir.create(segno, self.segment_size, self.wal_id,
                             zero_fill=self._prefault and not self._direct)
            return True
        with self._control.files_lock():
            if os.path.exists(self._dir.file(segno)):
                return False
            self._dir.create(segno, self.segment_size, self.wal_id)
            return True

    def _made_by_peer(self, segno: int) -> bool:
        """A shared WAL: whether another process made segment ``segno`` (it is then added to
        this one's list; segment lock held)."""
        if self._control is None or segno < self._oldest_shared():
            return False
        if not os.path.exists(self._dir.file(segno)):
            return False
        self._segnos.append(segno)
        self._segnos.sort()
        return True

    def _oldest_segment(self) -> int:
        """The oldest segment not truncated (by any process of a shared WAL)."""
        return max(self._segnos[0], self._oldest_shared())

    def _oldest_shared(self) -> int:
        """A shared WAL: the oldest segment the processes' truncations left (0 otherwise)."""
        if self._control is None or self._core_closed or not hasattr(self, "_core"):
            return 0  # (recovery reads before the core exists: the first opener, alone)
        return self._core.shared(_OLDEST)

    def _drop_truncated(self) -> None:
        """A shared WAL: let go of the segments another process truncated (they are
        removed, or renamed to a future number, under our mappings)."""
        if self._control is None:
            return
        with self._seg_lock:
            oldest = self._oldest_shared()
            if oldest <= self._segnos[0]:
                return
            for segno in [n for n in self._read_cache if n < oldest]:
                self._read_cache.pop(segno).close()
            for segno in [n for n in self._segments if n < oldest]:
                self._core.detach(segno)
                self._retire(self._segments.pop(segno))
            for inode, seg in list(self._retired.items()):
                if os.fstat(seg.fd).st_nlink == 0:  # removed, not recycled
                    del self._retired[inode]
                    seg.close()
            self._segnos = [n for n in self._segnos if n >= oldest] or [oldest]

    def _retire(self, seg: Segment) -> None:
        """Keep a truncated segment's mapping: another process may have recycled its file to
        a future number, which this one will then map without mapping it again."""
        if seg.map is None:
            seg.close()
        else:
            self._retired[seg.inode] = seg

    def _recycled_here(self, segno: int) -> Segment | None:
        """A shared WAL: when segment ``segno``'s file is one this process still has mapped
        under the number it had before another process recycled it (the same inode), that
        segment, taken over: mapping and pre-faulting 16 MiB again in every process for
        every segment would cost about as much as appending into it at 64 KiB records."""
        if self._control is None:
            return None
        try:
            st = os.stat(self._dir.file(segno))
        except FileNotFoundError:
            return None
        inode, oldest = (st.st_dev, st.st_ino), self._oldest_shared()
        with self._seg_lock:
            for old in [n for n, seg in self._segments.items() if n < oldest]:
                self._core.detach(old)
                self._retire(self._segments.pop(old))
            return self._retired.pop(inode, None)

    def _lower_made(self, segno: int) -> None:
        """Before a recycled file becomes segment ``segno``: the segments below it that this
        process has on their way exist.  One process's WAL waits for them; a shared WAL
        holds the files lock here, which they need, so it makes their files itself (the
        threads bringing them then find them made)."""
        if self._control is None:
            self._await_lower(segno)
            return
        with self._seg_lock:
            lower = sorted(n for n in self._arriving if n < segno)
        for n in lower:
            if not os.path.exists(self._dir.file(n)):
                self._dir.create(n, self.segment_size, self.wal_id)

    def _await_lower(self, segno: int) -> None:
        """Wait until no segment below ``segno`` is still on its way (made or recycled by
        another thread): files appear in number order, so that a crash never leaves a
        later segment without an earlier one, which reopening takes for a deleted one."""
        while True:
            with self._seg_lock:
                lower = [event for n, event in self._arriving.items() if n < segno]
                below = segno - 1
                if not lower and self._segnos and self._segnos[0] <= below \
                        and below not in self._segnos:  # its making failed: no gap either
                    raise StorageError(errno.ENOENT, f"segment {below:016X} could not be made, "
                                       f"so {segno:016X} is not made after it",
                                       self._dir.file(below))
            if not lower:
                return
            lower[0].wait()

    def _arrived(self, segno: int, seg: Segment, *, created: bool = False,
                 recycled: bool = False, make_ns: int = 0) -> None:
        """A segment made (in ``make_ns``), opened or recycled into place: into the table
        and attached."""
        with self._seg_lock:
            if self._core_closed:
                seg.close()
            else:
                seg.segno = segno
                self._segments[segno] = seg
                if hasattr(self, "_core"):
                    self._core.attach(segno, seg.fd, seg.map)
            self._count("segments_created", created)
            self._count("segments_recycled", recycled)
            self._count("segment_make_ns", make_ns)
            if make_ns:
                self._growth.made(make_ns / 1e9)
            self._arriving.pop(segno).set()

    def _segment_buffer(self, segno: int) -> mmap.mmap | None:
        """A mapping of segment ``segno`` for reading, or None when it does not exist.

        A segment on its way in (the background writer opening an existing file, which
        after a reopen can be the one the WAL ends in) is waited for: it exists, and
        answering None would make the reader report it missing."""
        while (arriving := self._arriving.get(segno)) is not None:
            arriving.wait()
        with self._seg_lock:
            seg = self._segments.get(segno)
            if seg is not None and seg.map is not None:
                return seg.map
            seg = self._read_cache.get(segno)
            if seg is None:
                if (segno not in self._segnos and not self._made_by_peer(segno)) or segno in self._arriving:
                    return None
                seg = Segment(self._dir.file(segno), segno, self.segment_size, writable=False)
                self._read_cache[segno] = seg
                while len(self._read_cache) > _READ_CACHE:
                    self._read_cache.popitem(last=False)[1].close()
            self._read_cache.move_to_end(segno)
            return seg.mapping()

    # ---- the API -------------------------------------------------------------

    def append(self, data, flush: bool = False) -> int:
        """Append one record (any bytes-like object, not copied first); returns its LSN.

        ``flush=True`` makes it durable before returning (a commit, in one native call).
        """
        return self._core.append(data, flush)

    def append_prefixed(self, prefix, data) -> int:
        """Append one record whose payload is ``prefix`` (a multiple of 8 bytes) followed by
        ``data``, neither copied together first; returns its LSN.  For a layer that puts its
        own header before its caller's payload (pmemwal.log)."""
        return self._core.append_prefixed(prefix, data)

    def append_many(self, records: Sequence) -> np.ndarray:
        """Append a sequence of records in one native call; returns their LSNs (uint64)."""
        return np.frombuffer(self._core.append_many(records), dtype=np.uint64)

    def flush(self, lsn: int | None = None) -> int:
        """Make every record up to and including the one at ``lsn`` (None: all) durable.

        Returns the flushed LSN: every byte below it is durable.
        """
        return self._core.flush(lsn)

    def records(self, start: int | None = None) -> Iterator[Record]:
        """The records from ``start`` (a record's LSN; None: the oldest) to the end.

        What was appended before the call is flushed first, then read back
        (once an error stopped the writer: what had been flushed).  Payloads
        are read-only views of the segments where a record lies in one page
        (valid until the segment is truncated), bytes otherwise.
        """
        prev, chosen = -1, start is not None
        bounds = self._read_bounds(start)
        if bounds is None:
            return
        lsn, end = bounds
        while lsn < end:
            status, _, next_lsn, prev_lsn, length, _, _, payload_lsn, _, void = self._reader.read(lsn, prev)
            if status:
                reason = _core.status_text(status)
                if chosen and prev == -1:
                    raise ValueError(f"no valid record at LSN {format_lsn(lsn)}: {reason}")
                raise CorruptionError(lsn, lsn // self.segment_size, reason)
            if not void:  # a void record is a range a dead writer left: no record
                yield Record(lsn, self._payload(lsn, length, payload_lsn), prev_lsn)
            prev, lsn = lsn, next_lsn

    def _read_bounds(self, start: int | None) -> tuple[int, int] | None:
        """(first LSN, end) of a read from ``start`` (None: the oldest record), after
        flushing what was appended (once the writer stopped: up to what had been flushed);
        None when there is no record to start from."""
        self._check_open()
        end = self._core.flushed_lsn if self._core.error else self._core.flush()
        self._drop_truncated()
        if start is None:
            status, start = self._reader.first_record(self._segnos[0])
            if status:
                return None
        return start, end

    def record(self, lsn: int) -> Record:
        """The record at ``lsn``, whose append has returned; ValueError if none is there.

        Direct mode reads it in place, durable or not.  Buffered mode flushes up to it
        first when it is not yet (the record is in the WAL buffer, not in its file); so
        does direct mode when the read fails there, as an earlier insertion may still be
        writing the header of the page the record starts in.
        """
        self._check_open()
        unflushed = lsn >= self._core.flushed_lsn and not self._core.error
        if unflushed and not self._direct:
            self._core.flush(lsn)
        status, _, _, prev_lsn, length, _, _, payload_lsn, _, void = self._reader.read(lsn, -1)
        if status and unflushed and self._direct:
            self._core.flush(lsn)
            status, _, _, prev_lsn, length, _, _, payload_lsn, _, void = self._reader.read(lsn, -1)
        if void:
            raise ValueError(f"no record at LSN {format_lsn(lsn)}: a void range (its writer died "
                             "before finishing it)")
        if status:
            raise ValueError(f"no valid record at LSN {format_lsn(lsn)}: {_core.status_text(status)}")
        return Record(lsn, self._payload(lsn, length, payload_lsn), prev_lsn)

    def record_heads(self, head_bytes: int, start: int | None = None,
                     batch: int = 1 << 16) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The records from ``start`` (None: the oldest) to the end, in batches, as arrays:
        LSNs (uint64), payload lengths (uint32) and each payload's first ``head_bytes`` bytes
        (a uint8 array of shape (n, head_bytes), zero-filled past a shorter payload).

        Each record is validated as ``records()`` does, in one native call per batch: what
        an index over the records' own headers is built from (pmemwal.log).
        """
        prev = -1
        bounds = self._read_bounds(start)
        if bounds is None:
            return
        lsn, end = bounds
        while lsn < end:
            status, lsn, last, lsns, lengths, heads = self._reader.heads(lsn, prev, end, head_bytes,
                                                                         batch)
            if lsns:
                yield (np.frombuffer(lsns, np.uint64), np.frombuffer(lengths, np.uint32),
                       np.frombuffer(heads, np.uint8).reshape(-1, head_bytes))
            if last:  # where the chain stands, void records included
                prev = last
            if status:
                raise CorruptionError(lsn, lsn // self.segment_size, _core.status_text(status))

    def _payload(self, lsn: int, length: int, payload_lsn: int) -> memoryview:
        if payload_lsn < 0:
            return memoryview(self._reader.payload(lsn))
        off = payload_lsn % self.segment_size
        view = memoryview(self._segment_buffer(payload_lsn // self.segment_size)).toreadonly()
        return view[off:off + length]

    def truncate(self, before_lsn: int) -> int:
        """Remove or recycle the segments wholly below ``before_lsn`` (and the flushed LSN).

        Returns how many segments went.  Appenders do not wait for it: the segment table
        changes under the segment lock, and the files are renamed, rewritten, removed and
        synced after it is released (an appender that reaches a segment still being
        recycled into place waits for that one).  Truncations run one at a time.
        """
        self._check_open()
        with self._truncate_lock:
            if self._core_closed:  # close ran since the check (it holds this lock to close)
                raise ClosedError("the WAL is closed")
            cut = self._archived_cut(min(before_lsn, self.flushed_lsn) // self.segment_size)
            cut = min(cut, self._segnos[-1])  # the newest segment stays (the flushed LSN can
            # lie at the first byte of one not made yet)
            if self._control is None:
                if cut > self._oldest_segment():  # the checkpoint first: see checkpoint.py
                    self._write_checkpoint(*self._durable_point(), oldest=cut)
                with self._seg_lock:
                    plan = self._release_below(cut)
                self._recycle_or_remove(plan)
            else:
                plan = self._truncate_shared(cut)
        background = self._background
        if plan and background is not None:
            background.wake()  # the round it sat out (_truncating), now that it would not
        return len(plan)

    def _archived_cut(self, cut: int) -> int:
        """``cut`` lowered to the oldest segment not archived yet, counting what that keeps."""
        if self._archiver is None:
            return cut
        archived = self._archiver.archived_below(self._oldest_segment())
        if archived < cut:
            self._archiver.kept(sum(1 for s in self._segnos if archived <= s < cut))
        return min(cut, archived)

    def _truncate_shared(self, cut: int) -> list[tuple[int, int | None, Segment | None]]:
        """A shared WAL's truncation: under the files lock, with the segment list read
        again (other processes make segments too), the checkpoint naming ``cut`` written
        (its point found before the lock: finding it may flush, and a flush may wait for a
        peer's insertion that needs the lock for a segment) and the oldest segment raised
        first, so that the
        others take what goes as truncated, not as deleted under them.  Nothing to cut
        takes no lock: processes that truncate often would keep one that waits to open the
        WAL or make a segment from ever getting it (flock is not fair)."""
        if cut <= self._oldest_shared():
            return []
        position = self._durable_point()
        with self._control.files_lock():
            self._write_checkpoint(*position, oldest=cut)
            self._core.shared(_OLDEST, cut)
            with self._seg_lock:  # our own mappings of what goes are recycled with it
                on_disk = self._dir.list_segments(tidy=False)
                self._segnos = sorted(set(on_disk) | set(self._arriving))
                plan = self._release_below(cut)
            self._recycle_or_remove(plan)
        return plan

    def _release_below(self, cut: int) -> list[tuple[int, int | None, Segment | None]]:
        """Take the segments below ``cut`` out of the table (segment lock held): for each,
        (its number, the future number it is recycled to or None to remove it, its open
        Segment if any).  Future numbers are reserved at once, so that no appender makes a
        new file under one while the recycled file is renamed into it."""
        current = self.insert_lsn // self.segment_size
        self._estimate_distance(self.insert_lsn)  # (one that cuts nothing starts a distance)
        victims = [s for s in self._segnos if s < cut]
        spares = sum(1 for s in self._segnos if s > current)
        target = self._spare_target(sum(1 for s in self._segnos if cut <= s <= current))
        plan = []
        for segno in victims:
            self._core.detach(segno)
            cached = self._read_cache.pop(segno, None)
            if cached is not None:
                cached.close()
            self._segnos.remove(segno)
            new = None
            if spares < target:
                new = self._segnos[-1] + 1
                self._segnos.append(new)
                self._arriving[new] = threading.Event()
                spares += 1
            plan.append((segno, new, self._segments.pop(segno, None)))
        return plan

    def _recycle_or_remove(self, plan: list[tuple[int, int | None, Segment | None]]) -> None:
        """The file work of a truncation, oldest segment first (a crash part-way leaves the
        oldest ones gone, never a gap); the segment lock is not held."""
        for i, (segno, new, seg) in enumerate(plan):
            try:
                if new is None:
                    if seg is not None:
                        seg.close()
                    self._dir.remove(segno)
                    self._count("segments_removed")
                else:
                    self._lower_made(new)
                    self._dir.recycle(segno, new, self.segment_size, self.wal_id,
                                      seg.fd if seg else -1)
                    self._recycled(new, seg)
                if self._archiver is not None:
                    self._archiver.forget(segno)
            except BaseException:
                self._abandon_recycling(plan[i:])
                raise

    def _recycled(self, new: int, seg: Segment | None) -> None:
        """A recycled file is in place as segment ``new``: an open one stays open and
        mapped, and is attached, so the writer finds its pages allocated and faulted in."""
        if seg is not None:
            self._arrived(new, seg, recycled=True)
            return
        with self._seg_lock:
            self._count("segments_recycled")
            self._arriving.pop(new).set()

    def _abandon_recycling(self, rest: list[tuple[int, int | None, Segment | None]]) -> None:
        """A truncation failed: the future numbers it had not filled are free again (an
        appender reaching one makes a new file), and their old files stay where they are."""
        with self._seg_lock:
            for _, new, seg in rest:
                if seg is not None:
                    seg.close()
                if new is not None and new in self._arriving:
                    self._segnos.remove(new)
                    self._arriving.pop(new).set()

    def _estimate_distance(self, insert_lsn: int) -> None:
        """Fold the WAL's advance since the last truncation into the estimates: a larger
        one is taken at once, a smaller one decays it slowly (PostgreSQL's
        CheckPointDistanceEstimate), so a burst does not leave the next one short; and
        the moving average, which never exceeds it.  The decay is 2 % a truncation, not
        PostgreSQL's 10 %: its checkpoints are minutes apart, ours can be 20 ms, and at
        10 % a late truncation was forgotten within a fraction of a second, so the
        spares it had the background make were removed and made again."""
        if self._last_truncation_lsn is not None:
            distance = insert_lsn - self._last_truncation_lsn
            largest, typical = self._truncation_distance, self._typical_distance
            self._truncation_distance = (distance if distance > largest
                                         else 0.98 * largest + 0.02 * distance)
            self._typical_distance = 0.9 * typical + 0.1 * distance if typical else distance
        self._last_truncation_lsn = insert_lsn

    def _spare_target(self, retained: int) -> int:
        """Future segments a truncation keeps, recycled or made ahead by the background
        writer: those for 2.5 times the largest recent distance, at least
        recycle_segments, plus the background writer's pipeline.  PostgreSQL keeps about
        2.2 times (checkpoint_completion_target and 10 %) for a checkpoint that comes
        late; the background writer makes segments up to twice the typical distance, and
        the margin between the two absorbs truncations that come a few segments early or
        late, which would otherwise have one make what the other removes."""
        wanted = self._spares_within(2.5 * self._truncation_distance, retained)
        return max(self._recycle_segments, wanted) + self._pipeline_depth()

    def _spares_within(self, nbytes: float, retained: int) -> int:
        """Segments for ``nbytes`` of WAL, within max_wal_size beside the ``retained``
        segments."""
        room = self._max_wal_size // self.segment_size - retained
        return max(0, min(self._segments_for(nbytes), room, _MAX_AHEAD))

    def _segments_for(self, nbytes: float) -> int:
        """Segments that ``nbytes`` of WAL fill, rounded up."""
        return -(-int(nbytes) // self.segment_size)

    def _pipeline_depth(self) -> int:
        """Future segments the background writer keeps ready (they count as spares)."""
        return self._prepare_segments if self._background is not None else 0

    def stats(self) -> dict[str, int]:
        """Counters since open.

        ``records``; ``bytes`` (WAL stream bytes: headers and padding included)
        and ``payload_bytes``; ``slot_wait_ns`` (insertions waiting for an
        insertion slot) and ``insert_wait_ns`` (the appenders' flushes waiting for
        insertions in progress), the two sides of the ``insert_slots`` trade-off, and
        ``background_wait_ns`` (the background writer's flushes waiting so, which
        delays no caller: apart, so that one client's run reads 0 in the other two);
        ``flushes`` done, ``flush_requests`` and ``coalesced`` requests that an
        earlier flush had already covered (group commit); ``writes`` (pwrite,
        msync calls); ``segments_created``, ``_recycled``, ``_removed`` and
        ``_prefaulted`` (made ready ahead by the background writer);
        ``checkpoints`` written (``wal.recovery`` says where this open started reading);
        ``stream_fences``: insertions that streamed past the cache (direct mode on pmem) and
        were fenced after it;
        ``segment_make_ns``, the time threads spent making the created ones (allocated,
        written, mapped and pre-faulted: bytes created over it is the pace at which this
        machine grows the WAL); ``segment_waits``: appends that reached a segment not
        attached yet and made it or waited for it (0 when the background writer keeps up).  A shared WAL's counters count across its processes;
        ``processes`` is how many have it open, ``processes_reaped`` how many died and were
        cleaned up after (both 0 for a WAL open in one process).
        """
        self._check_open()
        counters = {name: self._core.shared(i) for i, name in enumerate(self._counters)} \
            if self._control is not None else self._counters
        archiving = self._archiver.stats() if self._archiver is not None else {}
        return {**self._core.stats(), **counters, **archiving}

    def archive_status(self) -> dict | None:
        """None without archiving; else the archive, the ready (waiting), done and failed
        segment counts, the oldest unarchived segment, the bytes waiting and the limit,
        the last error, and whether the archiver process runs."""
        self._check_open()
        return self._archiver.summary() if self._archiver is not None else None

    def wait_archived(self, timeout: float | None = None) -> bool:
        """Wait until every segment complete now (all below the flushed LSN's segment) is
        archived; False if ``timeout`` seconds pass first.  Without archiving, True."""
        self._check_open()
        if self._archiver is None:
            return True
        if self._background is not None:
            self._background.wake()
        return self._archiver.wait(self._oldest_segment(), self.flushed_lsn, timeout)

    def _count(self, name: str, n: int = 1) -> None:
        """Add to one of the WAL's own counters (a shared WAL's are in the control file)."""
        if self._control is not None and not self._core_closed and hasattr(self, "_core"):
            self._core.shared(list(self._counters).index(name), n)
        else:
            self._counters[name] += n

    def close(self) -> None:
        """Flush what was appended, then release everything; closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        point = None
        try:
            if not self._core.error:  # everything appended so far, made durable
                point = self._flushed_position()
                self._write_checkpoint(*point)
        finally:
            self._release(point)

    def _forsake(self) -> None:
        """In a child after fork() (see _after_fork_in_child)."""
        self._closed = self._core_closed = True
        self._forked = True
        self._background = None  # its thread is the parent's
        if hasattr(self, "_core"):
            self._core.forsake()
        if self._control is not None:
            self._control.forsake()

    def _release(self, point: tuple[int, int] | None = None) -> None:
        _SHARED.discard(self)
        with self._truncate_lock, self._seg_lock:  # no segment is attached after this
            self._core_closed = True
            if hasattr(self, "_core"):
                self._core.close()
                self._mark_clean(point)
        if self._background is not None:  # after the core: no appender can notify it now
            self._background.stop()
            self._background = None
        if self._control is not None:  # after the core and the background writer (the
            self._control.close()      # mapping outlives calls in flight: module.c, Core_close)
        if self._archiver is not None:  # after the background writer, which wakes it
            self._archiver.close()
        with self._seg_lock:  # (a truncation or an appender may still be on its way out)
            segments = [seg for table in (self._segments, self._read_cache, self._retired)
                        for seg in table.values()]
            for table in (self._segments, self._read_cache, self._retired):
                table.clear()
        for seg in segments:
            seg.close()
        self._dir.close()

    def _mark_clean(self, point: tuple[int, int] | None) -> None:
        """Close, the core closed and truncations shut out: a one-process WAL with nothing
        appended past ``point`` (close's checkpoint) gets it again as CLEAN, so that the
        next open reads nothing past it.  A shared WAL's other processes may append on: its
        checkpoint is never clean."""
        if point is None or self._control is not None or self._core.error or \
                self._core.insert_lsn != point[0]:
            return
        try:
            self._write_checkpoint(*point, clean=True)
        except StorageError:
            pass  # close's checkpoint stands; the next open searches past it, as after a crash

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the WAL was opened before fork(): a child process opens it again"
                              if getattr(self, "_forked", False) else "the WAL is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def insert_lsn(self) -> int:
        """LSN the next record will get."""
        return self._core.insert_lsn

    @property
    def flushed_lsn(self) -> int:
        """Every byte below this LSN is durable."""
        return self._core.flushed_lsn

    @property
    def path(self) -> str:
        return self._dir.path

    @property
    def first_lsn(self) -> int:
        """LSN of the first usable byte of the oldest segment."""
        if not self._closed:
            self._drop_truncated()  # a shared WAL: what other processes truncated
        return first_lsn(self._segnos[0], self.segment_size)

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"insert {format_lsn(self.insert_lsn)}"
        return f"<pmemwal.WAL {self.path} {self.mode}/{self.persist_method} {state}>"


def _weak(obj: object, method: str):
    """A callable for the native core that does not keep ``obj`` alive (no cycle)."""
    ref = weakref.ref(obj)

    def call(*args):
        target = ref()
        if target is None:
            raise ClosedError("the WAL is gone")
        return getattr(target, method)(*args)

    return call


def check_wal_options(mode: str = "auto", segment_size: int | None = None, insert_slots: int = 8,
                      buffer_size: int = DEFAULT_BUFFER_SIZE,
                      max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
                      sync_method: str = "fdatasync", on_corruption: str = "raise",
                      recycle_segments: int = 2, flush_interval: float = DEFAULT_FLUSH_INTERVAL,
                      prepare_segments: int = 2,
                      gil_release_size: int = DEFAULT_GIL_RELEASE_SIZE,
                      max_wal_size: int = DEFAULT_MAX_WAL_SIZE, preallocate: int = 0,
                      persist: str = "auto", insertion: str = "parallel",
                      shared: bool = False) -> None:
    """ConfigError for an option pmemwal.open would refuse, checked before opening
    anything (benchmarks check a grid's options before its first run)."""
    _check_options(mode, segment_size, insert_slots, buffer_size, max_record_size, sync_method,
                   on_corruption, recycle_segments, flush_interval, prepare_segments,
                   gil_release_size, max_wal_size, preallocate, persist, insertion, shared)


def _check_checkpoint_options(interval: float, nbytes: int, verify: str) -> None:
    if not interval > 0:
        raise ConfigError(f"checkpoint_interval={interval!r}: seconds, more than 0")
    if not isinstance(nbytes, int) or nbytes < 1:
        raise ConfigError(f"checkpoint_bytes={nbytes!r}: a positive number of bytes")
    if verify not in VERIFY:
        raise ConfigError(f"verify={verify!r}: one of {', '.join(VERIFY)}")


def _archive_spec(url: str | None, command: str | None, restore_command: str | None,
                  options: dict | None, timeout: float, max_pending: int, backoff: float,
                  background: bool) -> dict | None:
    """The archiver's description of the archive options (None: no archiving), checked."""
    if url is None and command is None:
        if restore_command is not None or options is not None:
            raise ConfigError("restore_command and archive_options go with archive or archive_command")
        return None
    if url is not None and command is not None:
        raise ConfigError("archive (a URL) or archive_command, not both")
    if not background:
        raise ConfigError("archiving needs the background writer (background=True): it hands "
                          "complete segments to the archiver")
    if not 0 < timeout <= 86400:
        raise ConfigError(f"archive_timeout={timeout}: seconds, above 0 and at most a day")
    if max_pending < 0:
        raise ConfigError(f"archive_max_pending={max_pending}: bytes, 0 or more")
    if not 0.1 <= backoff <= 3600:
        raise ConfigError(f"archive_backoff={backoff}: seconds, from 0.1 to 3600")
    if url is not None:
        return {"url": url, "storage_options": options}
    if "%p" not in command:
        raise ConfigError(f"archive_command={command!r} names no %p (the segment's path)")
    return {"command": command, "restore_command": restore_command, "timeout": timeout}


def _check_options(mode: str, segment_size: int | None, insert_slots: int, buffer_size: int,
                   max_record_size: int, sync_method: str, on_corruption: str,
                   recycle_segments: int, flush_interval: float, prepare_segments: int,
                   gil_release_size: int, max_wal_size: int, preallocate: int,
                   persist: str, insertion: str, shared: bool = False) -> None:
    def choose(name: str, value: str, valid) -> None:
        if value not in valid:
            raise ConfigError(f"{name}={value!r}: valid values are {', '.join(valid)}")

    choose("mode", mode, MODES)
    choose("sync_method", sync_method, tuple(SYNC_METHODS))
    choose("on_corruption", on_corruption, ON_CORRUPTION)
    choose("persist", persist, PERSIST)
    choose("insertion", insertion, INSERTION)
    if shared and mode == "buffered":
        raise ConfigError("shared=True works in direct mode only (mode='direct' or 'auto')")
    if segment_size is not None and not is_valid_segment_size(segment_size):
        raise ConfigError(f"segment_size={segment_size}: a power of two from 1 MiB to 1 GiB")
    if not 1 <= insert_slots <= 256:
        raise ConfigError(f"insert_slots={insert_slots}: from 1 to 256")
    if buffer_size % PAGE_SIZE or buffer_size < 16 * PAGE_SIZE:
        raise ConfigError(f"buffer_size={buffer_size}: a multiple of {PAGE_SIZE}, 16 pages or more")
    if not 0 <= max_record_size <= MAX_RECORD_LIMIT:
        raise ConfigError(f"max_record_size={max_record_size}: from 0 to {MAX_RECORD_LIMIT}")
    if recycle_segments < 0:
        raise ConfigError(f"recycle_segments={recycle_segments}: 0 or more")
    if not 0 < flush_interval <= 60:
        raise ConfigError(f"flush_interval={flush_interval}: seconds, above 0 and at most 60")
    if not 0 <= prepare_segments <= 64:
        raise ConfigError(f"prepare_segments={prepare_segments}: from 0 to 64")
    if not 0 <= gil_release_size < 1 << 64:
        raise ConfigError(f"gil_release_size={gil_release_size}: bytes, 0 or more")
    if max_wal_size < 0:
        raise ConfigError(f"max_wal_size={max_wal_size}: bytes, 0 or more")
    if preallocate < 0:
        raise ConfigError(f"preallocate={preallocate}: bytes, 0 or more")
