"""The read-only view of a WAL: its segments mapped PROT_READ and the record chain followed.

``WalView`` stacks the directory's checks (checks.py: what open checks before it reads a
record) and the dump's lines (dump.py) on the reading: segment files opened O_RDONLY and
mapped PROT_READ for the native reader, the chain from the first record of the oldest
segment, and open's torn-tail/damage test through the reader's ``beyond``, reported as
an End (results.py) instead of acted on.  ``Records`` walks the chain: record by record
(``dump``), or counted by the native scan (``verify``).

On a WAL that a writer is appending to, the end moves while it is read: a record still
being written looks like damage for a moment.  Before damage is reported, the record at
the end is read again; if it has become valid, the chain is followed further.  Files are
never truncated by pmemwal, so a mapped segment never shrinks under the reader.
"""

from __future__ import annotations

import errno
import mmap
import os
from functools import partial
from typing import Iterator

from pmemwal import _core
from pmemwal.errors import format_lsn
from pmemwal.format import (PAGE_HEADER_SIZE, PAGE_SIZE, PAGE_USABLE, first_lsn, page_names_its_place,
                            segment_name)
from pmemwal.lostfound import Found, records_past
from pmemwal.segments import file_holds_pages
from pmemwal.tools.inspect.checks import DirectoryChecks
from pmemwal.tools.inspect.dump import RecordLines
from pmemwal.tools.inspect.results import _END, _LIVE_RETRIES, End, Problem, RecordInfo

_NO_SEGMENT = 1               # wal_status: WAL_NO_SEGMENT (native/wal_reader.h)
_BATCH, _BATCH_BYTES = 4096, 1 << 20  # records (payload bytes) one native read takes at most
_record_info = partial(tuple.__new__, RecordInfo)  # (RecordInfo(*fields), in C)


class WalView(DirectoryChecks, RecordLines):
    """A read-only view of the WAL in directory ``path`` (a context manager).

    ``segments``: the segment numbers present (all segment files, readable or
    not); ``readable``: those whose header, size and identity check out, the
    only ones records are read from; ``segment_size`` and ``wal_id`` (None when
    no header is valid); ``problems`` and ``notes`` found so far (reading
    records can add problems: a file that cannot be mapped); ``vanished``: the
    segments that were listed but gone when read (a writer truncating the WAL:
    ``verify`` and ``wal_stats`` look again when there are any); ``checkpoint``: the
    valid checkpoint slot with the highest seq (None: no file, or no valid slot, which
    ``checkpoint_state`` tells apart: ``"valid"``, ``"none"``, ``"invalid"``,
    ``"unreadable"``); ``read_new_segments``: set, segment files made after the listing
    are read too (checked as listed ones when first needed).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self._reader: _core.Reader | None = None
        self.read_new_segments = False     # (dump --follow: a writer adds segments as it goes)
        super().__init__(path)
        if self.segment_size is not None and self.wal_id is not None:  # (both, from a header)
            wal_id_lo = int.from_bytes(self.wal_id[:4], "little")
            self._reader = _core.Reader(self.segment_size, wal_id_lo, self._segment)

    # -- reading --

    @property
    def _size(self) -> int:
        """The segment size, where records are read: a view has a reader only with it."""
        assert self.segment_size is not None, "no segment header is valid"
        return self.segment_size

    @property
    def _live_reader(self) -> _core.Reader:
        """The native reader, where records are read (a view of no valid segment has none)."""
        assert self._reader is not None, "no segment file can be read"
        return self._reader

    def _segment(self, segno: int) -> mmap.mmap | None:
        """The getter for the native reader: a read-only mapping, or None."""
        seg_map = self._maps.get(segno)
        if seg_map is not None:
            return seg_map
        info = self._files.get(segno)
        if info is None and self.read_new_segments and segno > self.segments[-1]:
            info = self._added(segno)
        if info is None or not self._usable_file(info):
            return None
        try:
            fd = os.open(os.path.join(self.path, segment_name(segno)), os.O_RDONLY)
            try:
                if os.fstat(fd).st_size < self._size:   # shrunk since the header check
                    raise OSError(errno.EINVAL, "file shorter than a segment")
                seg_map = mmap.mmap(fd, self._size, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
        except OSError as exc:
            self._io_problem(segno, "cannot map it", exc)
            info.header = None
            self.readable.remove(segno)
            return None
        self._maps[segno] = seg_map
        return seg_map

    @property
    def first_segment(self) -> int | None:
        """The oldest readable segment of the WAL: the chain starts at its first record.
        Segments below the checkpoint's oldest_segno (a truncation a crash cut short left
        them) are no part of it, as recovery reads it."""
        oldest = self.checkpoint.oldest_segno if self.checkpoint is not None else 0
        kept = [segno for segno in self.readable if segno >= oldest]
        return kept[0] if kept else (self.readable[0] if self.readable else None)

    def records(self, start: int | None = None, limit: int | None = None,
                stop_lsn: int = _END) -> Records:
        """The valid records from ``start`` (an LSN; None: the first record of the
        oldest segment) on, at most ``limit`` of them, up to the first at or past
        ``stop_lsn``; iterate it, then see ``.end``."""
        return Records(self, start, limit, stop_lsn)

    def scan(self, stop_lsn: int = _END) -> Records:
        """The whole chain (up to the first record at or past ``stop_lsn``: then ``end``
        is an ``end`` there), followed by the native reader (no records yielded): see
        the result's ``count``, ``payload_bytes``, ``first_lsn``, ``last_lsn``, ``end``."""
        result = Records(self, None, None, stop_lsn)
        for _ in result._walk(native=True):    # yields nothing: the native scan counts
            pass
        return result

    def record_info(self, lsn: int, prev_lsn: int, length: int) -> RecordInfo:
        """The RecordInfo of a record known to be valid (one a follower handed over, with its
        prev-link and length); its CRC is -1 when it no longer reads here (truncated)."""
        if self._reader is not None:
            status, _, next_lsn, _, got_length, crc = self._reader.read(lsn, prev_lsn)[:6]
            if status == 0 and got_length == length:
                return RecordInfo(lsn, length, prev_lsn, crc, next_lsn)
        return RecordInfo(lsn, length, prev_lsn, -1, 0)

    def payload(self, lsn: int) -> bytes:
        """The payload of the valid record at ``lsn`` (ValueError if it is not one)."""
        if self._reader is None:
            raise ValueError("no readable segment")
        return self._reader.payload(lsn)

    def _hole(self, lsn: int, status: int, bad_lsn: int) -> End | None:
        """The chain runs into a segment that is missing or unreadable while a later one
        exists: it stops short of the end (open raises CorruptionError there too)."""
        segno = bad_lsn // self._size
        if status != _NO_SEGMENT or segno > self.segments[-1] or segno < self.segments[0]:
            return None
        known = [p.reason for p in self.problems if p.segment == segno]
        why = known[0] if known else "missing"
        return End("unreadable", lsn, f"the record at {format_lsn(lsn)} runs into segment "
                   f"{segno:016X}, which cannot be read ({why})")

    def end_problem(self, end: End) -> Problem | None:
        """The problem an End is, if any: damage to durable records."""
        if end.kind != "damage" or end.lsn is None:     # (damage is at an LSN)
            return None
        return Problem("damage", end.reason, end.lsn // self._size, end.lsn)

    def _classify(self, lsn: int, status: int) -> End:
        """What the first invalid position ``lsn`` after a chain is: open's test (with
        verify="all": before the checkpoint's end, it is damage)."""
        reason = _core.status_text(status)
        cp, size = self.checkpoint, self._size
        if cp is not None and first_lsn(self.segments[0], size) <= lsn < cp.end_lsn:
            return End("damage", lsn, f"{reason}, before the checkpoint's end "
                       f"{format_lsn(cp.end_lsn)}: this record had been made durable",
                       durable_lsn=cp.end_lsn)
        durable, pages = self._live_reader.beyond(lsn, self.readable[-1],
                                                  first_lsn(self.segments[0], size))
        if durable:
            return End("damage", lsn, f"{reason}; the valid record at {format_lsn(durable)} was "
                       "written after this one was flushed", durable_lsn=durable)
        cut = len(pages) * PAGE_SIZE
        seg_map = self._segment(lsn // size)
        if seg_map is not None:     # the rest of the end's page (a page never crosses a segment)
            off = lsn % size
            rest = seg_map[off:off + PAGE_SIZE - lsn % PAGE_SIZE]
            if rest.count(0) != len(rest):
                cut += len(rest)
        return End("torn" if cut else "clean", lsn, reason, cut_bytes=cut)

    def past_end(self, end: int, last: int) -> list[Found]:
        """The valid records past the chain's ``end`` (``last``: the chain's last record) that
        a cut there would set aside in lost+found: recovery's search (``beyond``, then
        lostfound.records_past), read-only."""
        if self._reader is None:
            return []
        floor = first_lsn(self.segments[0], self._size)
        _, pages = self._reader.beyond(end, self.readable[-1], floor)
        return records_past(end, pages, last, floor, self._segment, self._size, self._id_lo)

    def wrote_last_page(self, segno: int) -> bool:
        """Whether segment ``segno``'s last data page was written (its header names its
        place): the WAL's stream reached it (recovery's test for a deleted segment after it,
        recovery.py)."""
        size = self._size
        seg_map = self._segment(segno)
        if seg_map is None:
            return False
        return page_names_its_place(bytes(seg_map[size - PAGE_SIZE:size - PAGE_SIZE + 24]),
                                    (segno + 1) * size - PAGE_SIZE, self._id_lo)

    def holds_pages(self, segno: int) -> bool:
        """Whether segment file ``segno`` has a data page written since it became that
        segment (open's test of a damaged file: a spare holds none, segments.py)."""
        return file_holds_pages(os.path.join(self.path, segment_name(segno)), segno,
                                self._size, self._id_lo)

    @property
    def _id_lo(self) -> int:
        """The WAL id's first 4 bytes, as page headers hold them (where records are read)."""
        assert self.wal_id is not None, "no segment header is valid"
        return int.from_bytes(self.wal_id[:4], "little")

    def usable(self, lsn: int) -> int:
        """Position of ``lsn`` in the dense record stream (page headers left out)."""
        size = self._size
        seg, off = divmod(lsn, size)
        page, in_page = divmod(off, PAGE_SIZE)
        return seg * (size // PAGE_SIZE - 1) * PAGE_USABLE + (page - 1) * PAGE_USABLE + \
            max(in_page - PAGE_HEADER_SIZE, 0)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.forget()  # (the buffers it keeps between reads: the maps close next)
        self._reader = None
        for seg_map in self._maps.values():
            seg_map.close()
        self._maps.clear()

    def __enter__(self) -> WalView:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Records:
    """The records of a view from a start on; iterating yields RecordInfo.

    Once iterated: ``count``, ``payload_bytes``, ``first_lsn`` and ``last_lsn``
    (None without records), and ``end`` (an End: why it stopped).
    """

    def __init__(self, view: WalView, start: int | None, limit: int | None,
                 stop_lsn: int = _END) -> None:
        self._view, self.start, self.limit, self.stop_lsn = view, start, limit, stop_lsn
        self.count = self.payload_bytes = 0
        self.first_lsn: int | None = None
        self.last_lsn: int | None = None
        self.end: End | None = None

    @property
    def ended(self) -> End:
        """``end``, once the records were read through (which always sets it)."""
        assert self.end is not None, "the records were not read through yet"
        return self.end

    def __iter__(self) -> Iterator[RecordInfo]:
        return self._walk(native=False)

    def _walk(self, native: bool) -> Iterator[RecordInfo]:
        view = self._view
        reader = view._reader
        if reader is None or not view.readable:
            self.end = End("unreadable", None, "no segment file can be read")
            return
        status, lsn = self._first(reader)
        bad = lsn
        prev = -1
        retries = 0
        while True:
            if self.limit is not None and self.count >= self.limit:
                self.end = End("limit", lsn, "limit")
                return
            if status == 0 and lsn >= self.stop_lsn:
                self.end = End("end", lsn, f"--end {format_lsn(self.stop_lsn)} reached")
                return
            if status == 0:
                if native:
                    begin = lsn
                    status, lsn, last, count, nbytes, bad = reader.scan(lsn, prev, self.stop_lsn)
                    if count:
                        self._note(begin, count, nbytes, last)
                    if last:  # void records (closed ranges) move the chain, count nothing
                        prev = last
                    if status == 0:  # it stopped at stop_lsn: an "end" (above), not the chain's
                        continue
                else:
                    room = _BATCH if self.limit is None else min(_BATCH, self.limit - self.count)
                    status, lsn, last, bad, arrays = reader.fill(lsn, prev, self.stop_lsn, room,
                                                                 _BATCH_BYTES)
                    yield from self._batch(arrays)
                    if last:  # void records (closed ranges) move the chain, yield nothing
                        prev = last
                    if status == 0:
                        continue
            end = self._stopped(lsn, status, bad)
            if end.kind == "damage" and retries < _LIVE_RETRIES and reader.read(lsn, prev)[0] == 0:
                retries += 1                # the record at the end has become valid: a writer
                status = 0
                continue
            self.end = end
            return

    def _batch(self, arrays: tuple[memoryview, ...]) -> Iterator[RecordInfo]:
        """The records of one native batch (Reader.fill), noted as read."""
        lsn_a, prev_a, length_a, _, _, crc_a, next_a = arrays
        lsns, prevs, nexts = (a.cast("Q").tolist() for a in (lsn_a, prev_a, next_a))
        lengths, crcs = (a.cast("I").tolist() for a in (length_a, crc_a))
        if lsns:
            self._note(lsns[0], len(lsns), sum(lengths), lsns[-1])
        return map(_record_info, zip(lsns, lengths, prevs, crcs, nexts))

    def _first(self, reader: _core.Reader) -> tuple[int, int]:
        """(status, lsn) where the walk begins: at ``start``, or at the first record of the
        oldest readable segment (the next one's, while the oldest vanish under it)."""
        if self.start is not None:
            return 0, self.start
        view = self._view
        first = view.first_segment
        while True:
            assert first is not None, "the walk starts while a segment is readable"
            status, lsn = reader.first_record(first)
            first = view.first_segment      # (None: no segment is readable any more)
            if not (status == _NO_SEGMENT and first is not None
                    and lsn // view._size < first):     # the oldest vanished: the next one's
                return status, lsn

    def _stopped(self, lsn: int, status: int, bad: int) -> End:
        """Why the chain stops at ``lsn``, the first position that does not read (``status``
        from the reader; ``bad``: where it found the fault)."""
        view = self._view
        if self.count == 0 and self.start is not None:
            return End("bad_start", lsn, _core.status_text(status))
        if not view.readable:           # the last readable file could not be mapped
            return End("unreadable", lsn, "no segment file can be read")
        return view._hole(lsn, status, bad) or view._classify(lsn, status)

    def _note(self, lsn: int, count: int, nbytes: int, last: int) -> None:
        if self.first_lsn is None:
            self.first_lsn = lsn
        self.count += count
        self.payload_bytes += nbytes
        self.last_lsn = last

    def summary(self) -> dict:
        """The counts and the end, for a summary line or a JSON object."""
        end = self.end
        return {"type": "summary", "records": self.count, "payload_bytes": self.payload_bytes,
                "first_lsn": self.first_lsn, "last_lsn": self.last_lsn,
                "end_lsn": end.lsn if end else None, "stopped": end.kind if end else None,
                "reason": end.describe(self._view.segment_size) if end else None,
                "problems": [p.as_dict() for p in self._view.problems],
                "checkpoint": self._view.checkpoint_dict()}
