"""Opening: segment headers checked, the mode chosen, recovery run, the core started.

Concern: the order of an open, which ``WAL.__init__`` (api.py) calls with the directory
locked.  Every segment header is cross-checked (or the first segment made), the mode
resolved (the device probe, device.py), and the end of the WAL found by recovery.py: where
it decides torn tail or damage, wipes what lies past the end and sets aside valid records
there in lost+found.  Then the native core starts at that end, persistence is chosen
(persistence.py), what recovery read is made durable and the first checkpoint is written:
from here on the WAL is in use.  A shared WAL's later openers join the state the first one
set up in the control file instead of recovering.  Sets the fields state.py declares
without a value.
"""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np

from pmemwal import _core, libpmem, lostfound
from pmemwal.checkpoint import CheckpointFile, read_any
from pmemwal.device import resolve_mode
from pmemwal.follow_file import SIZE as FOLLOW_SIZE
from pmemwal.follow_file import FollowFile
from pmemwal.errors import ConfigError, CorruptionError, FormatError, NotFoundError
from pmemwal.format import (CHECKPOINTED, DEFAULT_SEGMENT_SIZE, MAX_HEADER_CUTS, PAGE_SIZE,
                            DamagedHeaderError, SegmentHeader, first_lsn)
from pmemwal.recovery import Recovery, RecoveryWarning
from pmemwal.segments import ARCHIVE_STATUS_NAME, WAL_DATA_NAMES, storage_errors
from pmemwal.wal.peers import _OLDEST
from pmemwal.wal.rounds import BackgroundRounds
from pmemwal.wal.state import _weak
from pmemwal.warn import warn


class Opening(BackgroundRounds):
    """The opening room (see the module docstring)."""

    def _open(self, mode: str, segment_size: int | None, on_corruption: str, insert_slots: int,
              buffer_size: int, max_record_size: int, gil_release_size: int,
              verify: str) -> None:
        """Check the segments, choose the mode, recover and start the core.  A shared WAL
        (the files lock held) is recovered by the process that finds no other has it
        open, which rebuilds the control file; the others join the state it set up."""
        first = self._dir.lock_shared() if self._control is not None else True
        self._opening_alone = first and self._control is not None
        damaged, spares = self._open_segments(segment_size, create=first)
        # readers elsewhere see a writer from here on (and read only what it publishes)
        self._follow = follow = FollowFile.for_writer(self._dir.path, self.wal_id,
                                                      self.segment_size, alone=first)
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
        self.recovery = None
        insert_lsn = prev_lsn = 0
        if first:
            with storage_errors(f"syncing {self._dir.path}"):
                self._dir.sync()  # what a killed writer renamed into place, before it is used
            in_use = [n for n in self._segnos if n not in spares]  # (spares hold nothing)
            recovered = Recovery(self._dir, in_use or self._segnos[:1], self.segment_size,
                                 self.wal_id, self._reader, self._segment_buffer,
                                 self._checkpoints, checkpointed=self._checkpointed,
                                 header_cuts=self._header_cuts)
            result = recovered.run(on_corruption, verify)
            insert_lsn, prev_lsn, self.recovery = result.insert_lsn, result.prev_lsn, result.as_dict()
            self._cuts = self._dir.cuts = result.cuts
            if self._control is not None:  # (a shared WAL keeps no spare: _arm_spares)
                self._arm_spares(spares)
            self._tidy(result.oldest_segno)  # (recovery decided: from here on files change)
            if min(self._cuts, MAX_HEADER_CUTS) > self._header_cuts:
                self._keep_cuts(damaged)
        self._start_core(insert_slots, buffer_size, max_record_size, gil_release_size,
                         insert_lsn, prev_lsn, first)
        if first:  # from here on the WAL is in use: no longer cleanly closed (pg_control's state)
            self._persist_recovered(result.scanned_from, insert_lsn)
            self._write_checkpoint(insert_lsn, prev_lsn, oldest=result.oldest_segno, exact=True)
            follow.opened_alone(insert_lsn, self._segnos[0])  # (durable: just above)
            self._set_aside_spares(damaged)  # (last: an open refused before moves nothing)
            self._fill_gaps(insert_lsn)
        else:
            self._checkpoint = self._checkpoints.read()
            self._cuts = self._checkpoint.cuts if self._checkpoint is not None else 0
            self._dir.cuts = self._cuts
        if self._control is not None and first:
            self._dir.share_lock()
        self._opening_alone = False
        self._opened_at = self._core.insert_lsn

    def _open_segments(self, segment_size: int | None,
                       create: bool = True) -> tuple[dict[int, str], set[int]]:
        """Read and cross-check every segment header, or create the first segment.  Returns
        the damaged spares (``_damaged_spares``), left out of ``_segnos``, and the segments
        whose header says spare (nothing written since they were made or recycled: recovery
        passes them by)."""
        self._segnos = self._dir.list_segments(tidy=False)  # (an open may yet refuse)
        spares: dict[int, str] = {}
        flagged: set[int] = set()
        if not self._segnos:
            if self._checkpoint_without_segments(segment_size):
                return spares, flagged
            self._refuse_without_segments()
            if not self._dir.may_create or not create:
                raise NotFoundError(errno.ENOENT, "no WAL in this directory (create=False)",
                                    self._dir.path)
            self.segment_size = segment_size or DEFAULT_SEGMENT_SIZE
            self.wal_id = os.urandom(16)
            # (its CHECKPOINT follows before any record: see Recovery, _lost_checkpoint)
            self._dir.create(0, self.segment_size, self.wal_id, flags=CHECKPOINTED)
            self._made_here = self._control is None  # (a failed open undoes it: api.py)
            self._segnos = [0]
            self._checkpointed = True
        else:
            headers = self._dir.read_headers(self._segnos)
            first = headers[0][0]
            if isinstance(first, FormatError):
                raise first
            spares = self._damaged_spares(headers, first, create)
            for segno, (header, size) in zip(self._segnos, headers):
                if segno in spares:
                    continue
                if isinstance(header, FormatError):
                    raise header
                if header.wal_id != first.wal_id or header.segment_size != first.segment_size:
                    raise FormatError(f"{self._dir.file(segno)} belongs to another WAL")
                if header.spare:
                    flagged.add(segno)
                if size != header.segment_size:
                    raise FormatError(f"{self._dir.file(segno)} is {size} bytes, "
                                      f"expected {header.segment_size}")
            if segment_size is not None and segment_size != first.segment_size:
                raise ConfigError(f"segment_size={segment_size}, but the WAL at {self._dir.path} "
                                  f"was made with {first.segment_size}")
            self.segment_size, self.wal_id = first.segment_size, first.wal_id
            self._checkpointed = any(isinstance(header, SegmentHeader) and header.flags & CHECKPOINTED
                                    for header, _ in headers)
            self._header_cuts = max(header.cuts for header, _ in headers
                                    if isinstance(header, SegmentHeader))
            self._segnos = [n for n in self._segnos if n not in spares]
        self._wal_id_lo = int.from_bytes(self.wal_id[:4], "little")
        return spares, flagged

    def _damaged_spares(self, headers: list[tuple[SegmentHeader | FormatError, int]],
                        first: SegmentHeader, recovering: bool) -> dict[int, str]:
        """The segments after the first whose header does not read (DamagedHeaderError) or
        whose file has the wrong size, but which hold nothing of the WAL (a spare, made
        ahead or recycled, never written since: ``_holds_nothing``): {number: what is
        wrong}.  They hold nothing of the WAL, so they do not keep it from opening:
        recovery leaves them out, and they are set aside once the open is decided
        (``_set_aside_spares``).  Any other damage is refused (FormatError), as is a
        damaged spare of a shared WAL that others have open (``recovering`` False: one of
        them may have it in use)."""
        spares = {}
        wal_id_lo = int.from_bytes(first.wal_id[:4], "little")
        for segno, (header, size) in list(zip(self._segnos, headers))[1:]:
            if isinstance(header, DamagedHeaderError):
                why = str(header)
            elif isinstance(header, FormatError):
                continue  # (it reads, and says what this WAL refuses: refused below)
            elif size != first.segment_size and header.wal_id == first.wal_id:
                why = f"{self._dir.file(segno)} is {size} bytes, expected {first.segment_size}"
            else:
                continue
            if recovering and self._holds_nothing(segno, size, first.segment_size, wal_id_lo):
                spares[segno] = why
        return spares

    def _holds_nothing(self, segno: int, file_size: int, size: int, wal_id_lo: int) -> bool:
        """Whether segment ``segno``, whose header or size is damaged, holds nothing of the
        WAL: no page written since its file became this segment (segments.py's
        ``holds_pages``).  A whole file has all its pages to tell (a spare whose arm tore
        as the writer reached it holds none, wherever the writer stood below).  A file cut
        short may have lost the pages that would: then only if the WAL's stream never
        reached it, the segment below there with its last page unwritten (records went
        into it once the segment below was full: a record that ends in it began there)."""
        if self._dir.holds_pages(segno, size, wal_id_lo):
            return False
        if file_size == size:
            return True
        return segno - 1 in self._segnos and \
            not self._dir.wrote_page(segno * size - PAGE_SIZE, size, wal_id_lo)

    def _set_aside_spares(self, spares: dict[int, str]) -> None:
        """Copy the damaged spares recovery left out into lost+found, each an entry of its
        own that lists no record, and say so (RecoveryWarning); a new spare (in use, in a
        shared WAL) then replaces each file, renamed over it, so that the numbers keep no
        gap (a segment missing below one there reads as deleted).  The open's last file
        change, once the WAL is in use (its checkpoint written): an open refused before
        it, by recovery or by any later step, moves nothing.  Before a shared WAL's
        others can join it, which would refuse a damaged spare, and before segments are
        made (preallocate): one made at a damaged spare's number would replace its file."""
        for segno, why in spares.items():
            if segno in self._segnos:
                continue  # a segment made at its number since replaced the file, which held nothing
            reason = (f"{why}: a spare past the end of the WAL, holding none of its records, "
                      "set aside")
            path = lostfound.set_aside_segment(self._dir.path, segno, self.segment_size,
                                               self.wal_id, reason)
            self._dir.create(segno, self.segment_size, self.wal_id, spare=self._control is None)
            self._segnos = sorted([*self._segnos, segno])
            warn(f"{self._dir.path}: {reason} in {path}", RecoveryWarning)

    def _fill_gaps(self, insert_lsn: int) -> None:
        """Make a spare at each segment number missing from the insert position's segment
        on, below a segment file there is: a spare deleted, or a segment deleted whose loss
        recovery cut before.  Past the end nothing durable lies (recovery decided), and
        numbers with no gap keep a later open from reading the hole as a deletion
        (recovery.py, ``_check_deleted``).  The open that recovers (a shared WAL's first
        process, under its files lock: no other makes segments meanwhile); a shared WAL
        keeps no spare, so its fill is in use (as ``_set_aside_spares``)."""
        if not self._segnos:
            return
        for segno in range(insert_lsn // self.segment_size, self._segnos[-1]):
            if segno not in self._segnos:
                self._dir.create(segno, self.segment_size, self.wal_id,
                                 spare=self._control is None)
                self._segnos = sorted([*self._segnos, segno])

    def _checkpoint_without_segments(self, segment_size: int | None) -> bool:
        """Whether a valid CHECKPOINT vouches for no segment (its end at or below the first
        byte of its oldest segment): a truncation to the first byte of a segment not made
        yet removed every older one, and a crash came before that segment was made.  No
        record was lost: the WAL is the checkpoint's (its id, its LSNs, its count of cuts),
        and its oldest segment is made once recovery has decided (``_tidy``)."""
        found = read_any(self._dir.path)
        if found is None:
            return False
        wal_id, size, cp = found
        if cp.end_lsn > first_lsn(cp.oldest_segno, size):
            return False    # (it vouches for segments: _refuse_without_segments)
        if segment_size is not None and segment_size != size:
            raise ConfigError(f"segment_size={segment_size}, but the WAL at {self._dir.path} "
                              f"was made with {size}")
        self.segment_size, self.wal_id = size, wal_id
        self._wal_id_lo = int.from_bytes(wal_id[:4], "little")
        self._checkpointed = True
        return True

    def _arm_spares(self, spares: set[int]) -> None:
        """A shared WAL's first opener, the files lock held: take into use every spare a
        writer that did not share the WAL left (header rewritten without SPARE and synced,
        segments.py's ``arm``), before another process can join.  Shared, no segment is
        made or recycled a spare, so none is armed while others run: one that read another
        process's arming from the page cache before its sync could attach the segment and
        acknowledge records in it while SPARE was still on disk, which recovery passes by.
        Armed spares read as segments in use that hold none of this cycle's pages."""
        for segno in sorted(spares):
            with storage_errors(f"opening {self._dir.file(segno)}"):
                fd = os.open(self._dir.file(segno), os.O_RDWR)
            try:
                self._dir.arm(segno, self.segment_size, self.wal_id, fd)
            finally:
                os.close(fd)

    def _refuse_without_segments(self) -> None:
        """No segment file, but what a WAL keeps beside its segments is there: they were
        deleted, with every record.  A new WAL made over them (another id) would hide that,
        and its checkpoint would replace the one that names what was lost."""
        left = [name for name in WAL_DATA_NAMES
                if os.path.exists(os.path.join(self._dir.path, name))]
        if left:
            raise CorruptionError(0, 0, f"{self._dir.path} holds {', '.join(left)} but no "
                                  "segment file: the segments were deleted, with their records "
                                  "(restore them, or remove what is left to make a new WAL here)")

    def _tidy(self, oldest: int) -> None:
        """Once recovery has decided (an open that refuses changes no file): remove the
        temp files of a segment being made or recycled, and the segments below ``oldest``
        that a crash left behind a truncation (its checkpoint names ``oldest``: they hold
        nothing of the WAL; removed oldest first, as truncation does, with their archive
        status, archiving or not).  Segment ``oldest`` is made if it never was (Recovery,
        _nothing_left)."""
        self._dir.list_segments(tidy=True)
        status = None
        if self._segnos and self._segnos[0] < oldest and \
                os.path.isdir(os.path.join(self._dir.path, ARCHIVE_STATUS_NAME)):
            from pmemwal.archive import ArchiveStatus
            status = ArchiveStatus(self._dir.path, create=False)
        self._forget_mappings()
        while self._segnos and self._segnos[0] < oldest:
            segno = self._segnos.pop(0)
            cached = self._read_cache.pop(segno, None)
            if cached is not None:
                cached.close()
            self._dir.remove(segno)
            if status is not None:
                status.forget(segno)
        if not self._segnos:    # (the checkpoint's oldest was never made: Recovery, _nothing_left)
            self._dir.create(oldest, self.segment_size, self.wal_id)
            self._segnos = [oldest]
            self._header_cuts = min(self._cuts, MAX_HEADER_CUTS)  # (its header holds them)

    def _keep_cuts(self, damaged: dict[int, str]) -> None:
        """Give a segment header the count of cuts recovery raised, before a checkpoint names
        it (a count kept in the checkpoint alone would go with a deleted CHECKPOINT, and come
        back to a value a layer's index was stored with: Recovery, _cuts_without_checkpoint).
        The next segment is made past the newest, a spare (in use, in a shared WAL), as every
        segment is made: a temp file renamed into place, so that a crash at any point leaves
        every header there was whole.  Truncation never removes the newest segment, and
        every segment made, recycled or taken into use later holds the count, so some header
        always does.  ``damaged``: the damaged spares still to be set aside, left alone."""
        newest = max([self._segnos[-1], *damaged]) + 1
        self._dir.create(newest, self.segment_size, self.wal_id, spare=self._control is None)
        self._segnos.append(newest)
        self._header_cuts = min(self._cuts, MAX_HEADER_CUTS)

    def _start_core(self, insert_slots: int, buffer_size: int, max_record_size: int,
                    gil_release_size: int, insert_lsn: int, prev_lsn: int,
                    first: bool = True) -> None:
        if self._direct:
            self._ring = None
        else:  # the WAL buffer ring: anonymous shared memory seen as a numpy array
            self._ring_map = mmap.mmap(-1, buffer_size)
            self._ring = np.frombuffer(self._ring_map, dtype=np.uint8)
        self._core = _core.Core(segment_size=self.segment_size, wal_id_lo=self._wal_id_lo,
                                direct=self._direct,
                                ring=None if self._ring is None else self._ring.data,
                                insert_slots=insert_slots, max_record_size=max_record_size,
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
        assert self._follow is not None
        self._core.set_progress(self._follow.fd, FOLLOW_SIZE)  # each flush publishes its LSN
        # The per-record calls go straight to C: a Python frame here would cost
        # as much as appending a small record (the methods below document them).
        self.append = self._core.append
        self.append_prefixed = self._core.append_prefixed
        self.flush = self._core.flush
        self.max_record_size = max_record_size
        segno = self._core.insert_lsn // self.segment_size
        if self._direct:  # mapped first: its mapping decides how records persist
            self._ensure_segment(segno)
        self._choose_persist(self._segments[segno] if self._direct else None)

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
                address = np.frombuffer(self._segment_map(segno), np.uint8).ctypes.data
                lib.persist(address + lo, hi - lo)
            with storage_errors(f"syncing segment {segno:016X}"):
                fd = os.open(self._dir.file(segno), os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
