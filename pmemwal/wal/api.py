"""The WAL's face: open, append, flush, read, stats and close.

Concern: what a caller holds.  ``WAL`` is the public class; its methods here are the ones a
record passes through from ``append`` to the reader (the per-record calls go straight to the
native core: module.c's Core, then native/wal_insert.c and wal_flush.c), and the life of the object: ``__init__`` locks the directory
and opens (opening.py), ``close`` writes the last checkpoint and releases everything in
order.  The rest of the WAL lives in rooms below this one, each a module of this package
(state.py lists them): persistence, a shared WAL's peers, the segment supply, checkpoints,
truncation, the background writer's rounds and opening.
"""

from __future__ import annotations

import operator
import os
import weakref
from typing import TYPE_CHECKING, Any, Literal, Sequence, Unpack, overload

import numpy as np

from pmemwal._core import Record
from pmemwal.archive import DEFAULT_COMMAND_TIMEOUT
from pmemwal.control import ControlFile, archive_tag
from pmemwal.device import chosen_mode
from pmemwal.errors import StorageError, format_lsn
from pmemwal.format import first_lsn
from pmemwal.segments import WalDirectory
from pmemwal.wal.opening import Opening
from pmemwal.readonly import ReadOnlyWAL
from pmemwal.reading import Reading
from pmemwal.wal.options import (DEFAULT_BUFFER_SIZE, DEFAULT_CHECKPOINT_BYTES,
                                 DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_FLUSH_INTERVAL,
                                 DEFAULT_GIL_RELEASE_SIZE, DEFAULT_MAX_FOLLOWER_LAG,
                                 DEFAULT_MAX_PENDING,
                                 DEFAULT_MAX_RECORD_SIZE, DEFAULT_MAX_WAL_SIZE,
                                 DEFAULT_WAIT_TIMEOUT, archive_spec, check_checkpoint_options,
                                 WALOptions, check_follower_lag, check_wait_timeout,
                                 check_wal_options)
from pmemwal.wal.state import COUNTERS

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_SHARED: weakref.WeakSet[WAL] = weakref.WeakSet()  # shared WALs open in this process


def _after_fork_in_child() -> None:
    """A child of fork() has copies of the parent's shared WALs: they refuse all work
    (ClosedError) and never touch the state and locks the parent's copy owns."""
    for wal in list(_SHARED):
        wal._forsake()
    _SHARED.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@overload
def open(path: str | os.PathLike[str], *, readonly: Literal[True]) -> ReadOnlyWAL: ...


@overload
def open(path: str | os.PathLike[str], *, readonly: Literal[False] = False,
         **options: Unpack[WALOptions]) -> WAL: ...


def open(path: str | os.PathLike[str], *, readonly: bool = False, mode: str = "auto", create: bool = True,
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
         restore_command: str | None = None, archive_options: dict[str, Any] | None = None,
         archive_timeout: float = DEFAULT_COMMAND_TIMEOUT,
         archive_max_pending: int = DEFAULT_MAX_PENDING, archive_backoff: float = 10.0,
         checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
         checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES, verify: str = "checkpoint",
         wait_timeout: float | None = DEFAULT_WAIT_TIMEOUT,
         max_follower_lag_bytes: int = DEFAULT_MAX_FOLLOWER_LAG) -> WAL | ReadOnlyWAL:
    """Open (or create) the WAL in directory ``path``; see ``WAL`` for the options.

    ``readonly=True`` opens it for reading only, with no other option: no lock, no writes,
    no recovery, beside a live writer or none (``pmemwal.readonly.ReadOnlyWAL``)."""
    if readonly:
        return ReadOnlyWAL(path)
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
               verify=verify, wait_timeout=wait_timeout,
               max_follower_lag_bytes=max_follower_lag_bytes)


class WAL(Reading, Opening):
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
      PostgreSQL's non-volatile WAL buffer proposal measured without DAX), ``"pmem"`` only by cache flush, a
      ConfigError where the mapping is not persistent memory.  Buffered mode
      takes ``"auto"`` only: it persists with ``sync_method``.
    - ``insertion``: ``"parallel"`` (a record's space is reserved in one short step and
      its checksum and copy run beside other insertions, in up to ``insert_slots`` at
      once) or ``"serial"`` (reserving, checksum and copy all under one lock, one
      insertion at a time: PostgreSQL's WALInsertLock before 9.4,
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
    - ``on_corruption``: ``"raise"`` CorruptionError when damaged records are known
      durable (before the checkpoint, or followed by a record reserved after the flush
      that covered them), or ``"truncate"`` the WAL at the damage.  Either way,
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
      estimate, as PostgreSQL sizes its recycling), within ``max_wal_size``; 256 spares
      at most, with those, whatever this says (the core attaches 1,024 segments at once).
    - ``max_wal_size``: bytes of segments, retained and recycled together, past
      which truncation removes segments instead of recycling them (it never
      removes a segment that was not truncated); a WAL not truncated yet makes
      at most a quarter of it ahead.
    - ``preallocate``: bytes of WAL made ready when it is opened, ahead of the
      insert position (segments created, allocated and mapped; attached as
      spares are, when the insert position comes near), so that appending that
      much creates no segment: a log kept whole up to that size appends at
      steady-state speed (like a libpmemlog pool's size).
    - ``background``: run the background writer (asynchronous flushes and
      segment preparation); without it appenders create segments themselves.
    - ``flush_interval``: seconds between the background writer's flushes.
    - ``prepare_segments``: segments kept ready ahead of the insert position, at
      least, once the WAL grows: one still within the first eighth of the segment it was
      opened in (at a pace that does not reach the next one soon) has none, so that a
      few records take one segment; the append past that eighth wakes the background
      writer, which makes them.  Until its first truncation a WAL (not shared) keeps ready what it
      grows by in max(0.1 s, 4 times its slowest recent segment make)
      (pmemwal/growth.py): a log that grows slower than the machine makes
      segments never waits for one.  Those further out than prepare_segments (one
      at least) stay spares, which recovery after a crash does not read; the
      background writer takes each into use (a header write and a sync) as the
      insert position comes near.
    - ``prefault``: map direct-mode segments with every page faulted in
      (MADV_POPULATE_WRITE), write buffered-mode ones with zeros when made
      (PostgreSQL's wal_init_zero), and prepare them ahead; False lets
      appenders take the first-touch faults (what the non-volatile WAL buffer proposal
      measured).
    - ``gil_release_size``: appends (a batch: its total payload) of at least this
      many bytes give up the GIL before copying; smaller ones keep it unless they
      must wait (for a slot, another insertion, a system call), since handing the
      GIL over costs more than inserting them.  0 always gives it up.
    - ``wait_timeout``: seconds that an append, a flush (``flush``, ``append(...,
      flush=True)``, ``checkpoint``, ``records``) or ``close`` waits for one other writer
      (another process of a shared WAL, or a thread of this one) that holds an insertion
      below what it needs, or the reservation lock, and is alive but does not run (stopped
      by SIGSTOP or a debugger, a paused container); then StalledWriterError, naming its
      pid (None: wait as long as it takes).  A writer that died never holds anyone up.
    - ``max_follower_lag_bytes``: how far (in bytes of WAL) a named follower
      (``pmemwal.follow(path, name=...)``) may fall behind the flushed end and still hold
      back ``truncate``; one further behind is marked lost (FollowerLostError when it
      next reads) and holds nothing back.  Default 1 GiB; 0: a named follower is marked
      lost by the first truncation that reaches its records.
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
                 restore_command: str | None = None, archive_options: dict[str, Any] | None = None,
                 archive_timeout: float = DEFAULT_COMMAND_TIMEOUT,
                 archive_max_pending: int = DEFAULT_MAX_PENDING,
                 archive_backoff: float = 10.0,
                 checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
                 checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
                 verify: str = "checkpoint",
                 wait_timeout: float | None = DEFAULT_WAIT_TIMEOUT,
                 max_follower_lag_bytes: int = DEFAULT_MAX_FOLLOWER_LAG) -> None:
        check_wal_options(mode, segment_size, insert_slots, buffer_size, max_record_size,
                          sync_method, on_corruption, recycle_segments, flush_interval,
                          prepare_segments, gil_release_size, max_wal_size, preallocate, persist,
                          insertion, shared)
        check_checkpoint_options(checkpoint_interval, checkpoint_bytes, verify)
        check_wait_timeout(wait_timeout)
        check_follower_lag(max_follower_lag_bytes)
        archiving = archive_spec(archive, archive_command, restore_command, archive_options,
                                 archive_timeout, archive_max_pending, archive_backoff, background)
        self._init_state(insertion=insertion, prepare_segments=prepare_segments,
                         prefault=prefault, sync_method=sync_method, persist=persist,
                         recycle_segments=recycle_segments, max_wal_size=max_wal_size,
                         checkpoint_interval=checkpoint_interval,
                         checkpoint_bytes=checkpoint_bytes)
        self._max_follower_lag = max_follower_lag_bytes
        chosen_mode(mode)  # (a bad PMEMWAL_MODE refused before a file is made)
        self._dir = WalDirectory(os.fspath(path), create, shared=shared)
        try:
            if shared:
                self._dir.refuse_unshared_writer()  # (before CONTROL is made in its WAL)
                self._control = ControlFile(self._dir.path, archive_tag(archiving))
                with self._control.files_lock():
                    self._open(mode, segment_size, on_corruption, insert_slots, buffer_size,
                               max_record_size, gil_release_size, verify)
            else:
                self._open(mode, segment_size, on_corruption, insert_slots, buffer_size,
                           max_record_size, gil_release_size, verify)
            self._core.set_wait_timeout(wait_timeout or 0)
            if archiving is not None:  # (only a WAL that archives loads the archiver)
                from pmemwal.archiver import Archiver
                self._archiver = Archiver(self._dir.path, archiving, self.segment_size,
                                          self._segnos[0], archive_max_pending, archive_backoff)
            self._preallocate(preallocate)
            if background:
                self._start_background(flush_interval)
                if self._archiver is not None and self._background is not None:
                    self._background.wake()  # its first round marks what completed before
        except BaseException:
            self._release(undo_create=self._made_here)
            raise
        self._closed = False
        if shared:
            _SHARED.add(self)

    def append(self, data: ReadableBuffer, flush: bool = False) -> int:
        """Append one record (any bytes-like object, not copied first); returns its LSN.

        ``flush=True`` makes it durable before returning (a commit, in one native call).
        """
        return self._core.append(data, flush)

    def append_prefixed(self, prefix: ReadableBuffer, data: ReadableBuffer) -> int:
        """Append one record whose payload is ``prefix`` (a multiple of 8 bytes) followed by
        ``data``, neither copied together first; returns its LSN.  For a layer that puts its
        own header before its caller's payload (pmemwal.log)."""
        return self._core.append_prefixed(prefix, data)

    def append_many(self, records: Sequence[ReadableBuffer]) -> np.ndarray:
        """Append a sequence of records in one native call; returns their LSNs (uint64)."""
        return np.frombuffer(self._core.append_many(records), dtype=np.uint64)

    def flush(self, lsn: int | None = None) -> int:
        """Make every record up to and including the one at ``lsn`` (None: all) durable.

        Returns the flushed LSN: every byte below it is durable.  A writer that holds an
        insertion below ``lsn`` and is alive but does not run: StalledWriterError after
        ``wait_timeout`` seconds; a signal's exception (KeyboardInterrupt) as it comes.
        """
        return self._core.flush(lsn)

    def _read_end(self) -> int:
        """Reading: where a read from now ends (what was appended, flushed first; once an
        error stopped the writer, what had been flushed)."""
        return self._core.flushed_lsn if self._core.error else self._core.flush()

    def _readable_end(self) -> int:
        """Reading: below it every record may be read."""
        return self._core.flushed_lsn

    def _reach(self, lsn: int) -> None:
        """Reading: make the record at ``lsn`` (appended) readable: flushed."""
        if lsn >= self._core.flushed_lsn and not self._core.error:
            self._core.flush(lsn)

    def record(self, lsn: int) -> Record:
        """The record at ``lsn``, whose append has returned.

        ValueError if no record starts there, CorruptionError if the one there is
        damaged, TruncatedError if a truncation took it.  The payload is a read-only
        memoryview of the record's own copy, validated as it was copied: it pins no
        segment and outlives the WAL.  ``read_many`` reads many LSNs in one call.

        Direct mode reads it in place, durable or not.  Buffered mode flushes up to it
        first when it is not yet (the record is in the WAL buffer, not in its file); so
        does direct mode when the read fails there, as an earlier insertion may still be
        writing the header of the page the record starts in.
        """
        if self._closed:
            self._check_open()
        unflushed = lsn >= self._core.flushed_lsn and not self._core.error
        if unflushed and not self._direct:
            self._core.flush(operator.index(lsn))
        try:
            status, _, record = self._reader.record(lsn)
            if status and unflushed and self._direct:
                self._core.flush(operator.index(lsn))
                status, _, record = self._reader.record(lsn)
        except OverflowError:  # (a negative int, or one past 64 bits)
            raise ValueError(f"no record at LSN {lsn}: LSNs are 0..2**64-1") from None
        if status:
            raise self._record_error(lsn, status)
        if self._control is not None:
            self._check_copied(lsn)
        return record  # type: ignore[return-value]  # (a record when status is 0)

    def _check_copied(self, lsn: int) -> None:
        """For a shared WAL: TruncatedError when a truncation took ``lsn``'s segment before
        its records from ``lsn`` on were copied.  Another process truncates knowing nothing
        of this one's reads, and raises the shared oldest segment before it touches a file:
        copies checked against it afterwards hold the records' own bytes."""
        if self._control is not None and lsn // self.segment_size < self._oldest_shared() and \
                (truncated := self._truncated(lsn)) is not None:  # (the lock only then)
            raise truncated

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
        ``background_cpu_ns``: the CPU time this process's background writer has used
        (0 without one): its share of a core, beside the appenders' throughput, is what
        the WAL costs beyond the callers' own threads.
        """
        self._check_open()
        counters = {name: self._core.shared(i) for i, name in enumerate(COUNTERS)} \
            if self._control is not None else self._counters
        archiving = self._archiver.stats() if self._archiver is not None else {}
        background = self._background
        return {**self._core.stats(), **counters, **archiving,
                "background_cpu_ns": background.cpu_ns() if background is not None else 0}

    def archive_status(self) -> dict[str, Any] | None:
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

    def close(self) -> None:
        """Flush what was appended, then release everything; closing twice is fine.

        After a read found damage (CorruptionError), with nothing appended since the
        open, the checkpoint stays as the open wrote it: an open or a read that refused
        changes no file.

        Another writer that is alive and does not run (a stopped process of a shared WAL)
        holding that flush up past ``wait_timeout``: StalledWriterError, raised after
        everything is released (the WAL is closed; what was not flushed is up to the other
        processes' flushes).  Calls of other threads still waiting in the core then end
        with ClosedError."""
        if self._closed:
            return
        self._closed = True
        point = None
        try:
            if not self._core.error and not (self._damage_read and
                                             self._core.insert_lsn == self._opened_at):
                point = self._flushed_position()  # everything appended so far, made durable
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
        if self._follow is not None:  # (the descriptor's copy: the parent's locks stay)
            os.close(self._follow.fd)
            self._follow = None

    def _release(self, point: tuple[int, int] | None = None, undo_create: bool = False) -> None:
        """Let go of everything the WAL holds, the directory lock last; ``undo_create``: an
        open that made the WAL failed, and what it made goes first (under the lock)."""
        _SHARED.discard(self)
        with self._truncate_lock:
            with self._seg_lock:  # no segment is attached after this
                self._core_closed = True
            if hasattr(self, "_core"):  # (without the segment lock: the core's close waits
                self._core.close()      # for calls in flight, which may need it to give up)
                self._mark_clean(point)
        if self._background is not None:  # after the core: no appender can notify it now
            self._background.stop()
            self._background = None
        if self._control is not None:  # after the core and the background writer (the
            self._control.close()      # mapping outlives calls in flight: module.c, Core_close)
        if self._follow is not None:   # the same; readers see no writer from here on
            self._follow.close()
            self._follow = None
        if self._archiver is not None:  # after the background writer, which wakes it
            self._archiver.close()
        with self._seg_lock:  # (a truncation or an appender may still be on its way out)
            self._forget_mappings()
            segments = [seg for table in (self._segments, self._read_cache, self._retired)
                        for seg in table.values()]
            for table in (self._segments, self._read_cache, self._retired):
                table.clear()
        try:
            for seg in segments:
                seg.close()
        finally:
            if undo_create:
                self._dir.undo_create()
            self._dir.close()  # (the directory lock: let go whatever failed above)

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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"insert {format_lsn(self.insert_lsn)}"
        return f"<pmemwal.WAL {self.path} {self.mode}/{self.persist_method} {state}>"
