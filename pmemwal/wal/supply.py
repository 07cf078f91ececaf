"""The segment supply: segments made, opened, mapped and attached to the core, in number order.

Concern: bringing segment N when it is wanted, by an appender that reached it (the core's
``segment_callback``), the background writer making it ahead (rounds.py), a truncation
recycling a file into it (truncation.py) or a reader.  A segment is claimed under the
segment lock (``_arriving``: whoever else wants it waits for its event), and its file is
made, opened and mapped outside it, so that several are on their way at once; files appear
in number order, since a crash leaving a later segment without an earlier one reads as a
deleted segment.  Sets ``_segnos``, ``_segments``, ``_arriving`` and ``_read_cache``; makes
files through segments.py's WalDirectory; never removes one (truncation.py does).
"""

from __future__ import annotations

import errno
import os
import threading

from pmemwal import _core
from pmemwal.errors import ClosedError, StorageError
from pmemwal.segments import Segment, storage_errors
from pmemwal.wal.peers import SharedSegments

_READ_CACHE = 16  # read-only segment mappings kept for readers
# Seconds of appends the attached segments ahead cover.  The background writer arms the next
# ones when an insertion enters a segment, but it needs the GIL for that, and behind a thread
# that holds it between native calls it waits for the switch interval (5 ms) at times, more
# than once: at 1 MiB records an appender went through 4-7 segments in such a wait.
_ARM_AHEAD = 0.02
_ARM_AHEAD_MAX = 16  # segments: armed ones count as in use, which recovery after a crash reads


class SegmentSupply(SharedSegments):
    """The supply room (see the module docstring)."""

    def _segment_needed(self, segno: int) -> None:
        """The core's call: an appender (or a flush) reached segment ``segno`` before it was
        attached, and waits for it (counted: the background writer should have made it)."""
        self._count("segment_waits")
        self._needed = max(self._needed, segno)  # (attached however far ahead: _near)
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
        self._drop_truncated()  # a shared WAL: the list made new ones starts above what went
        if segno < self._segnos[0] or segno < self._oldest_shared():
            return None
        if segno in self._arriving:
            return self._arriving[segno]
        if segno in self._segments:
            self._attach(segno, self._segments[segno])
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
                growth, started, spare = self._growth, 0.0, False  # (timed by the pace's clock)
                if create:
                    self._await_lower(segno)
                    started = growth.clock()
                    spare = self._control is None and not self._near(segno)
                    create = self._create_segment(segno, spare)
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
                    if seg is None:
                        seg = Segment(self._dir.file(segno), segno, self.segment_size,
                                      writable=True, dsync=dsync)
                        seg.spare = spare if create else self._dir.is_spare(segno)
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
                self._arrived(segno, seg, created=create,
                              make_s=growth.clock() - started if create else 0.0)
            except BaseException:
                self._abandon_claims(todo[i:])
                raise

    def _abandon_claims(self, todo: list[tuple[int, bool]]) -> None:
        """Bringing a claimed segment failed: those still on their way were never made (a
        segment that arrived and failed to attach is in the table, its arrival told), so
        nobody may wait for them, and the numbers to create are free again."""
        with self._seg_lock:
            for n, created in todo:
                if n in self._arriving:
                    if created:
                        self._segnos.remove(n)
                    self._arriving.pop(n).set()

    def _create_segment(self, segno: int, spare: bool = False) -> bool:
        """Make segment ``segno``'s file; in a shared WAL, under the files lock and only
        if no other process made it first, nor truncated past it since it was claimed
        (truncations raise the oldest segment under this lock: a file made below it would
        be an old segment back from the dead).  Returns whether this call made it.  (The
        first process, opening alone, makes it over a file there: a damaged spare recovery
        left out, which no other process made.)"""
        if self._control is None:
            self._dir.create(segno, self.segment_size, self.wal_id,
                             zero_fill=self._prefault and not self._direct, spare=spare)
            return True
        with self._control.files_lock():
            if segno < self._oldest_shared() or \
                    (os.path.exists(self._dir.file(segno)) and not self._opening_alone):
                return False
            self._dir.create(segno, self.segment_size, self.wal_id)
            return True

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
                 recycled: bool = False, make_s: float = 0.0) -> None:
        """A segment made (in ``make_s`` seconds), opened or recycled into place: into the
        table and attached.  Its arrival is told whatever happens: a spare whose arming
        fails (``_attach``) stays in the table, a spare still, and the next request for it
        arms it again; those waiting for it go on and make that request."""
        with self._seg_lock:
            try:
                if self._core_closed:
                    seg.close()
                else:
                    seg.segno = segno
                    self._segments[segno] = seg
                    self._attach(segno, seg)
            finally:
                self._count("segments_created", created)
                self._count("segments_recycled", recycled)
                self._count("segment_make_ns", round(make_s * 1e9))
                if created:
                    self._growth.made(make_s)
                self._arriving.pop(segno).set()

    def _near(self, segno: int) -> bool:
        """Whether segment ``segno`` is one the writer may append to soon: past the insert
        position, or past the furthest one the core asked for (a batch reserved at once
        reaches further than the insert position read here), by at most prepare_segments
        (one at least) or what the WAL fills in _ARM_AHEAD seconds at its recent pace (at
        most _ARM_AHEAD_MAX).  Those are attached to the core; a spare further out stays a
        spare, which recovery need not read."""
        if not hasattr(self, "_core"):
            return True  # (the open: the segment it goes on in)
        current = max(self._core.insert_lsn // self.segment_size, self._needed)
        paced = min(self._growth.segments_within(_ARM_AHEAD, self.segment_size), _ARM_AHEAD_MAX)
        return segno <= current + max(self._prepare_segments, 1, paced)

    def _attach(self, segno: int, seg: Segment) -> None:
        """Attach segment ``segno`` to the core (segment lock held) when it is near; a spare
        is armed first (segments.py: its header rewritten and synced before the writer
        can store to it), one further out is left as it is."""
        if not hasattr(self, "_core"):
            return
        if seg.spare:
            if not self._near(segno):
                return
            self._dir.arm(segno, self.segment_size, self.wal_id, seg.fd)
            seg.spare = False
        self._core.attach(segno, seg.fd, seg.map)

    def _segment_buffer(self, segno: int) -> memoryview | None:
        """A view of segment ``segno``'s mapping for reading, or None when it does not exist.

        The view is taken under the segment lock: from then on the mapping cannot be
        unmapped (a truncation or the read cache closing it leaves it to the view), so a
        reader in one thread never reads through a mapping another thread let go."""
        while True:
            with self._seg_lock:
                if segno not in self._arriving:
                    seg = self._mapped_for_reading(segno)
                    return None if seg is None else memoryview(seg.map)  # type: ignore[arg-type]
            self._await_arrival(segno)

    def _await_arrival(self, segno: int) -> None:
        """Wait until segment ``segno`` is not on its way in (the background writer opening an
        existing file, which after a reopen can be the one the WAL ends in): it exists, and
        answering None would make the reader report it missing."""
        while (arriving := self._arriving.get(segno)) is not None:
            arriving.wait()

    def _mapped_for_reading(self, segno: int) -> Segment | None:
        """Under the segment lock: segment ``segno``, mapped (``seg.map`` is set), for reading
        (the attached one, or one in the read cache), or None when it does not exist.
        ClosedError once close began releasing the segments: a mapping made after it would
        never be let go, nor its payload views detached."""
        if self._core_closed:
            raise ClosedError("the WAL is closed")
        seg = self._segments.get(segno)
        if seg is not None and seg.map is not None:
            return seg
        seg = self._read_cache.get(segno)
        if seg is None:
            if segno not in self._segnos and not self._made_by_peer(segno):
                return None
            seg = Segment(self._dir.file(segno), segno, self.segment_size, writable=False)
            self._trim_read_cache()
            self._read_cache[segno] = seg
        self._read_cache.move_to_end(segno)
        if seg.map is None:
            seg.mapping()
            seg.close_fd()  # the mapping keeps the pages: one descriptor less per cached one
        return seg

    def _trim_read_cache(self) -> None:
        """Make room for one more mapping: close the least recently read past _READ_CACHE."""
        if len(self._read_cache) >= _READ_CACHE:
            self._forget_mappings()
        while len(self._read_cache) >= _READ_CACHE:
            self._read_cache.pop(next(iter(self._read_cache))).close()


    def _segment_map(self, segno: int) -> memoryview:
        """_segment_buffer for a segment that exists; StorageError if a truncation took it
        meanwhile."""
        mapping = self._segment_buffer(segno)
        if mapping is None:
            raise StorageError(errno.ENOENT, f"segment {segno:016X} was truncated meanwhile",
                               self._dir.file(segno))
        return mapping

    def _preallocate(self, nbytes: int) -> None:
        """Make ready the segments that appending ``nbytes`` from here will reach."""
        if nbytes == 0:
            return  # none: appenders and the background writer attach them as they come
        insert = self._core.insert_lsn
        for segno in range(insert // self.segment_size,
                           (insert + nbytes - 1) // self.segment_size + 1):
            self._ensure_segment(segno)

    def _check_segments(self) -> None:
        """Stop the writer once an attached segment file has been deleted: records
        written to it would vanish with it (background.py: when this runs)."""
        self._drop_truncated()
        with self._seg_lock:
            oldest = self._oldest_shared()
            kept = {seg.fd: seg for seg in self._segments.values() if seg.segno >= oldest}
            deleted = kept.get(_core.unlinked(list(kept)))
            if deleted is not None:
                self._core.stop(errno.ENOENT, f"segment file {deleted.segno:016X} was deleted "
                                "under the writer")
