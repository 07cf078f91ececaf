"""Recovery: where a WAL being opened ends, from its checkpoint on.

Concern: the open-time scan and what it decides (docs/FORMAT.md, "The end of the
WAL" and "Checkpoint").  It reads segments through the native reader and the
checkpoint file, and writes only after deciding: the set-aside copies
(pmemwal/lostfound.py), then the zeroing of what lies past the end.  A refused
open (CorruptionError) has written nothing.

- With a valid checkpoint (pmemwal/checkpoint.py), the chain is followed from
  its end_lsn, linked to its last_lsn: the records before it were durable, so
  nothing there is read, and nothing there can be taken for a torn tail.  The
  segments from its oldest_segno to the one holding its end must exist; those
  below it (a truncation a crash cut short left them) are no part of the WAL.
- Without one (a WAL made before checkpoints, or both slots torn: said by a
  warning), or with ``verify="all"``, the chain is followed from the first
  record of the oldest segment, as before; an end found before the checkpoint's
  end_lsn is then damage to acknowledged records.  A missing CHECKPOINT whose
  segments say the WAL kept one was deleted: refused, as damage is.
- Past the end x, ``Recovery.run`` decides torn tail or damage on the native
  reader's evidence (``beyond``, native/wal_reader.c: wal_beyond): a valid
  record past x whose durable hint passes x proves that x had been flushed, and
  damage is refused (``_refuse``, CorruptionError) unless the caller asked to
  cut there.
- From a checkpoint, the header of the page that holds its end is checked
  (``_end_page_damaged``): the scan starts mid-page there and checks none.
- Any cut first sets aside the valid records past x and the pages it zeroes
  (``_set_aside``: lost+found, an entry pending until the end), then zeroes the
  rest of x's page and the later pages that may hold this cycle's bytes
  (``_wipe_beyond``), syncs them, and finishes the entry: a rerun after a crash
  in between finds the pending entry and makes no second one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pmemwal import _core, lostfound
from pmemwal.checkpoint import Checkpoint, CheckpointFile
from pmemwal.errors import CorruptionError, format_lsn, repair_hint
from pmemwal.format import PAGE_HEADER_SIZE, PAGE_SIZE, first_lsn, page_header_valid
from pmemwal.segments import WalDirectory
from pmemwal.warn import warn

VERIFY = ("checkpoint", "all")
_END = (1 << 64) - 1
_NO_SEGMENT = 1  # wal_status: WAL_NO_SEGMENT (native/wal_reader.h)


class RecoveryWarning(UserWarning):
    """Recovery did something a user should know of: a full scan for want of a valid
    checkpoint, or records set aside in lost+found."""


@dataclass(frozen=True)
class Recovered:
    """Where appending resumes, and how recovery got there (``WAL.recovery``)."""

    insert_lsn: int
    prev_lsn: int
    checkpoint_lsn: int | None   # the end_lsn recovery started from; None: a full scan
    scanned_from: int
    full_scan: str | None        # why every retained record was read, if it was
    set_aside: str | None        # the lost+found entry made, if any
    oldest_segno: int            # the oldest segment the next checkpoint may vouch for
    cuts: int = 0                # the checkpoint's count of cuts of durable records, this one's

    def as_dict(self) -> dict:
        return {"insert_lsn": self.insert_lsn, "prev_lsn": self.prev_lsn,
                "checkpoint_lsn": self.checkpoint_lsn, "scanned_from": self.scanned_from,
                "scanned_bytes": self.insert_lsn - self.scanned_from,
                "full_scan": self.full_scan, "set_aside": self.set_aside,
                "oldest_segno": self.oldest_segno, "cuts": self.cuts}


class Recovery:
    """One open's recovery of the WAL in ``directory`` (its segments ``segnos``)."""

    def __init__(self, directory: WalDirectory, segnos: list[int], segment_size: int,
                 wal_id: bytes, reader: _core.Reader,
                 segment: Callable[[int], memoryview | None], checkpoints: CheckpointFile,
                 checkpointed: bool = False, header_cuts: int = 0) -> None:
        self._dir = directory
        self._checkpointed = checkpointed  # a segment header says CHECKPOINT was kept
        self._header_cuts = header_cuts  # the highest count of cuts a segment header holds
        self._segnos = segnos
        self._size = segment_size
        self._wal_id = wal_id
        self._reader = reader
        self._segment = segment
        self._checkpoints = checkpoints

    def run(self, on_corruption: str, verify: str = "checkpoint") -> Recovered:
        self._cut_durable = False
        cp = self._checkpoints.read()
        full_scan = self._full_scan_reason(cp, verify, on_corruption)
        oldest = self._oldest(cp)  # (segments below it are no part of the WAL)
        if cp is not None and self._check_vouched_segments(cp, oldest, on_corruption):
            full_scan = full_scan or "segments the checkpoint vouches for are missing"
        if cp is not None and oldest not in self._segnos:
            return self._nothing_left(cp)
        if cp is None or not cp.clean:
            self._read_from_disk(cp.end_lsn if cp is not None and full_scan is None else 0)
        if full_scan is None and cp is not None and self._end_page_damaged(cp.end_lsn):
            full_scan = "the header of the page that holds the checkpoint's end is damaged"
        if full_scan is None and cp is not None:  # (no reason for a full scan: a checkpoint)
            start, prev = cp.end_lsn, cp.last_lsn
            status, x, last, _, _, bad = self._reader.scan(start, prev or -1, _END)
            last = last or prev
        else:
            status, start = self._reader.first_record(oldest)
            x, last, bad = start, 0, start
            if status == 0:
                status, x, last, _, _, bad = self._reader.scan(start, -1, _END)
            if cp is not None and first_lsn(oldest, self._size) <= x < cp.end_lsn:
                self._refuse(on_corruption, x, f"{_core.status_text(status)}, before the "
                             f"checkpoint's end {format_lsn(cp.end_lsn)}: this record had been "
                             "made durable")
        self._check_deleted(on_corruption, status, x, bad, cp)
        aside = None
        aside_needed = not (cp is not None and cp.clean and full_scan is None and x == cp.end_lsn)
        if aside_needed:
            # (after a clean close with nothing past it, nothing of this cycle lies past x)
            min_prev = first_lsn(self._segnos[0], self._size)
            durable, pages = self._reader.beyond(x, self._segnos[-1], min_prev)
            if durable:
                self._refuse(on_corruption, x, f"{_core.status_text(status)}; the valid record "
                             f"at {format_lsn(durable)} was written after this one was flushed")
        else:
            pages = []
        before, counts = (cp.cuts, self._cut_durable) if cp is not None else \
            self._cuts_without_checkpoint()
        cuts = before + counts
        if aside_needed:
            aside, counted = self._set_aside(x, pages, last, min_prev,
                                             _core.status_text(status), cuts if counts else None)
            if counted is not None:  # the same cut, by an open a crash stopped: counted once
                cuts = before if counted <= before else max(cuts, counted)
        if cp is not None and (x < cp.end_lsn or cuts > cp.cuts):
            self._checkpoint_cut(cp, x, last, oldest, cuts)
        self._wipe_beyond(x, pages)
        # (a crash before this: the next recovery finishes it, and the pending entries past x)
        lostfound.finish(self._dir.path, x, self._wal_id, aside)
        return Recovered(x, last, None if full_scan else start, start, full_scan, aside, oldest,
                         cuts)

    def _read_from_disk(self, start: int) -> None:
        """After an unclean end: drop the page cache's clean pages of the segments from
        ``start`` on, so that the scan reads what the disk holds.  After a failed writeback
        (EIO) Linux marks the pages clean though the disk never got them (fsyncgate); the
        writer stopped on that error, but an open in the same boot would read the records
        from those pages, take them for durable, and append after a hole the disk has.
        Dirty pages (a SIGKILLed writer's unflushed records) stay: the open syncs them
        (wal/opening.py, _persist_recovered).  Nothing to drop on tmpfs or DAX."""
        for segno in self._segnos:
            if (segno + 1) * self._size <= start:
                continue
            try:
                fd = os.open(self._dir.file(segno), os.O_RDONLY)
            except FileNotFoundError:
                continue    # (a missing segment is the scan's to report)
            try:    # the whole segment: a large folio holding start is dropped whole or not
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # (below start: synced)
            finally:
                os.close(fd)

    def _full_scan_reason(self, cp: Checkpoint | None, verify: str,
                          on_corruption: str) -> str | None:
        if cp is None:
            reason = self._no_checkpoint_reason(on_corruption)
            if reason is not None:
                warn(f"{self._dir.path}: {reason}; reading every retained record",
                     RecoveryWarning)
        if verify == "all":
            return "verify='all'"
        if cp is None:
            return reason or "no checkpoint (a WAL made before checkpoints, or never opened " \
                "to the end)"
        if cp.end_lsn < first_lsn(self._oldest(cp), self._size):
            return "the checkpoint lies below the oldest segment"
        return None

    def _no_checkpoint_reason(self, on_corruption: str) -> str | None:
        """Why there is no valid checkpoint, to be warned of (None: a WAL made before
        checkpoints); CorruptionError for a lost CHECKPOINT unless told to truncate."""
        if self._lost_checkpoint():
            reason = ("CHECKPOINT is missing, but the segments say this WAL kept one "
                      "(deleted?): without it, damage to the last acknowledged records "
                      "cannot be told from a torn tail")
            if on_corruption == "raise":
                raise CorruptionError(first_lsn(self._segnos[0], self._size), self._segnos[0],
                                      f"{reason}: put it back, or {repair_hint(self._dir.path)}"
                                      " (every record is read, and a new one written)")
            return reason
        if os.path.exists(self._checkpoints.path):
            return "no valid checkpoint slot: both are torn or damaged"
        return None

    def _oldest(self, cp: Checkpoint | None) -> int:
        """The WAL's oldest segment: the first one there is from the checkpoint's
        oldest_segno on.  Segments below it that a crash left behind a truncation hold
        nothing of the WAL (the truncation wrote the checkpoint first): not read, and
        removed once the open goes on (wal/opening.py, _tidy)."""
        if cp is None:
            return self._segnos[0]
        kept = [n for n in self._segnos if n >= cp.oldest_segno]
        return kept[0] if kept else cp.oldest_segno  # (never made: _nothing_left)

    def _nothing_left(self, cp: Checkpoint) -> Recovered:
        """No segment from the checkpoint's oldest on, and it vouches for none
        (``_check_vouched_segments`` refused otherwise): a truncation to the first byte of a
        segment not made yet wrote the checkpoint naming it, and a crash came before that
        segment was.  Every record was truncated, none is lost: the WAL goes on at that
        segment's first byte, which the open makes (wal/opening.py, _tidy)."""
        start = max(cp.end_lsn, first_lsn(cp.oldest_segno, self._size))
        last = cp.last_lsn if start == cp.end_lsn else 0
        return Recovered(start, last, start, start, None, None, cp.oldest_segno, cp.cuts)

    def _end_page_damaged(self, end: int) -> bool:
        """Whether the page that holds ``end`` has a damaged header although a record before
        end wrote it: the scan starts mid-page and checks no header there, and records
        appended after it would never read.  The records the checkpoint covers in that page
        are damaged: the full scan finds the first of them.  (At a page's first usable byte
        the header comes with the record at end, not yet written.)"""
        seg = self._segment(end // self._size)
        page = end - end % PAGE_SIZE
        if end % PAGE_SIZE == PAGE_HEADER_SIZE or seg is None:
            return False    # (a missing segment: _check_vouched_segments)
        offset = page % self._size
        return not page_header_valid(bytes(seg[offset:offset + PAGE_HEADER_SIZE]), page,
                                     int.from_bytes(self._wal_id[:4], "little"))

    def _check_vouched_segments(self, cp: Checkpoint, oldest: int, on_corruption: str) -> bool:
        """Whether a segment is missing from the checkpoint's oldest to the one holding its
        last byte (truncation writes the checkpoint that drops a segment before it removes
        it): CorruptionError, or with on_corruption="truncate" a warning, and True (the
        caller then reads every retained record from ``oldest``).  Missing below every
        segment there is (the WAL's oldest records gone, the chain from ``oldest`` whole),
        the WAL begins at ``oldest``: a cut of durable records all the same.  Missing above
        one, the scan stops at the first one missing and the WAL is cut there."""
        end = cp.end_lsn
        last_segno = end // self._size - (end % self._size == PAGE_SIZE + PAGE_HEADER_SIZE)
        present = set(self._segnos)
        missing = [n for n in range(cp.oldest_segno, last_segno + 1) if n not in present]
        if not missing:
            return False
        what = _missing_text(missing)
        reason = (f"{what}, but the checkpoint says they held records durable up to "
                  f"{format_lsn(end)}: deleted, with their records")
        none_left = oldest not in present
        if on_corruption == "raise" or none_left:
            left = " (and none of the WAL's is left)" if none_left else ""
            fix = "" if none_left else f"; {repair_hint(self._dir.path)}"
            raise CorruptionError(first_lsn(missing[0], self._size), missing[0],
                                  reason + left + fix)
        if missing[0] < oldest:
            self._cut_durable = True
            cut = (f"their records are lost, and on_corruption='truncate' lets the WAL now "
                   f"begin in segment {oldest:016X} (counted as a cut)")
        else:
            cut = "on_corruption='truncate' cuts the WAL at the first one missing"
        warn(f"{self._dir.path}: {reason}; {cut}", RecoveryWarning)
        return True

    def _lost_checkpoint(self) -> bool:
        """Whether CHECKPOINT is missing from a WAL whose segments say it kept one
        (CHECKPOINTED, pmemwal/format.py).  A new WAL's first segment says so before
        the open writes its first checkpoint: with nothing ever written in it (its first
        data page all zeros), a crash came in between, and nothing is lost."""
        if not self._checkpointed or os.path.exists(self._checkpoints.path):
            return False
        seg_map = self._segment(0) if self._segnos == [0] else None
        return seg_map is None or bool(np.frombuffer(seg_map, np.uint8, PAGE_SIZE, PAGE_SIZE).any())

    def _cuts_without_checkpoint(self) -> tuple[int, bool]:
        """With no valid checkpoint slot: the count of cuts before this recovery, and
        whether it counts as one.  A WAL made before checkpoints: none before, and one if it
        cut durable records; with both slots invalid, or CHECKPOINT lost, the highest count
        a damaged slot or a segment header still shows (the newest segment's holds the
        checkpoint's: wal/opening.py, _keep_cuts), and one, since a scan without a
        checkpoint cannot tell damage to acknowledged records from a torn tail, and may cut
        them: the count goes past every value a layer's index was stored with.  One
        recovery counts one cut at most."""
        if not os.path.exists(self._checkpoints.path) and not self._lost_checkpoint():
            return 0, self._cut_durable
        return max(self._checkpoints.damaged_cuts(), self._header_cuts), True

    def _check_deleted(self, on_corruption: str, status: int, x: int, bad: int,
                       cp: Checkpoint | None) -> None:
        """The chain ran into a segment that is missing although a later one exists
        (segments are made and recycled in order), or ended before one that is missing
        although the WAL may have gone on into it (``_deleted_past``): it was deleted, with
        its records.

        A record that merely claims to run into it proves nothing: its CRC can't be
        checked without the segment, and a header torn by a crash can pair a new
        prev-link with an old length."""
        files = self._dir.list_segments(tidy=False)  # (spares too: made in order like the rest)
        missing = bad // self._size
        if status == _NO_SEGMENT and missing not in files and files[-1] > missing:
            self._refuse(on_corruption, x, f"segment {missing:016X} is missing, but it had been "
                         "made: it was deleted, with any record in it")
            return
        deleted = self._deleted_past(x, files) if cp is None or cp.end_lsn < x else None
        if deleted is not None:  # (a checkpoint at x: a cut made there, or an open that ended there)
            self._refuse(on_corruption, x, f"segment {deleted:016X} is missing, but the WAL may "
                         f"have gone on into it (segment {deleted - 1:016X} was written to its "
                         "last page, and a later one was made): it was deleted, with any record "
                         "in it")

    def _deleted_past(self, x: int, files: list[int]) -> int | None:
        """The first segment missing past the chain's end (at ``x``) that the WAL's stream may
        have gone into: the segment before it is there and was written to its last page
        (records go on into the next once one is full), and a later segment file exists
        (segments, spares too, are made in order).  Its records may have proven the end
        damage, and ``beyond`` cannot read them: without this, a deleted segment would pass
        for a torn tail.  (A spare deleted just after a segment whose last page was written
        reads so too: a refusal that the repair's cut, which counts, settles.)"""
        present = set(files)
        wal_id_lo = int.from_bytes(self._wal_id[:4], "little")
        for segno in range(x // self._size + 1, files[-1]):
            if segno not in present and segno - 1 in present and \
                    self._dir.wrote_page(segno * self._size - PAGE_SIZE, self._size, wal_id_lo):
                return segno
        return None

    def _refuse(self, on_corruption: str, x: int, reason: str) -> None:
        """CorruptionError, or with on_corruption="truncate" a cut of durable records here."""
        self._cut_durable = True
        if on_corruption == "raise":
            raise CorruptionError(x, x // self._size,
                                  f"{reason}; {repair_hint(self._dir.path)}")

    def _checkpoint_cut(self, cp: Checkpoint, x: int, last: int, oldest: int,
                        cuts: int) -> None:
        """Before zeroing: a checkpoint that no open after a crash reads past the zeroed
        records from (a cut below the checkpoint: at the cut), and that keeps the count of
        cuts (a cut past it: at its own end, what lies below x is not synced yet); else a
        crash after the zeroing would leave a torn tail there, and the cut uncounted."""
        end, last = (x, last) if x < cp.end_lsn else (cp.end_lsn, cp.last_lsn)
        self._checkpoints.write(end, last, oldest, current=cp, cuts=cuts)

    def _set_aside(self, x: int, pages: list[int], last: int, min_prev: int, reason: str,
                   cuts: int | None) -> tuple[str | None, int | None]:
        """The lost+found entry of the cut at x (None: nothing to keep), and the count of
        cuts it records: ``cuts`` for a new one (None: the cut does not count), or for a
        pending one, made by an open that a crash stopped, the count that cut brought,
        whether or not that open's checkpoint got to keep it."""
        made = lostfound.set_aside(self._dir.path, x, pages, last, min_prev, self._segment,
                                   self._size, self._wal_id, reason, keep=self._cut_durable,
                                   cuts=cuts)
        if made is None:
            return None, None
        path, found, counted = made
        lost = _gaps(x, found)
        warn(f"{self._dir.path}: the WAL ends at {format_lsn(x)} ({reason}); "
             f"{len(found)} valid record(s) past it set aside in {path} "
             "(pmemwal lost-found)" + (f"; no valid record in {lost}: lost" if lost
                                       else ""), RecoveryWarning)
        return path, counted

    def _wipe_beyond(self, end: int, pages: list[int]) -> None:
        """Zero the rest of the end's page and the later pages ``beyond`` named.

        Whole pages: once a new record re-validates a page's header, any old
        record left in it would be readable again.
        """
        size = self._size
        writes = [(p, PAGE_SIZE) for p in pages]
        seg_map = self._segment(end // size)
        page_end = end - end % PAGE_SIZE + PAGE_SIZE
        rest = (None if seg_map is None else
                np.frombuffer(seg_map, np.uint8, page_end - end, end % size))
        if rest is not None and rest.any():
            writes.append((end, page_end - end))
        touched = {}
        try:
            for lsn, length in writes:
                segno = lsn // size
                if segno not in touched:
                    touched[segno] = os.open(self._dir.file(segno), os.O_RDWR)
                os.pwrite(touched[segno], bytes(length), lsn % size)
            for fd in touched.values():
                os.fdatasync(fd)
        finally:
            for fd in touched.values():
                os.close(fd)


def _missing_text(missing: list[int]) -> str:
    """Which segments are missing, in words: a range only where it has no gap."""
    first, last, n = missing[0], missing[-1], len(missing)
    if n == 1:
        return f"segment {first:016X} is missing"
    if last - first + 1 == n:
        return f"segments {first:016X}..{last:016X} are missing ({n})"
    if n <= 8:
        return f"segments {', '.join(f'{s:016X}' for s in missing)} are missing"
    return f"{n} of the segments from {first:016X} to {last:016X} are missing"


def _gaps(x: int, found: list[lostfound.Found]) -> str:
    """The LSN ranges from x to the last record found that no record found covers."""
    gaps: list[str] = []
    at = x
    for f in found:
        if f.lsn > at:
            gaps.append(f"{format_lsn(at)}..{format_lsn(f.lsn)}")
        at = max(at, f.next_lsn)
    return ", ".join(gaps)
