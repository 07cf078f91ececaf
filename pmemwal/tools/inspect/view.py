"""Read-only inspection of a WAL directory: list its records, verify it, count it.

Nothing here writes, locks or repairs.  Segment files are opened O_RDONLY and
mapped PROT_READ, the LOCK file is never touched, so the tools work on a WAL
that a writer holds open, and on one that ``pmemwal.open`` would refuse.  They
imitate what ``open`` does (the same segment checks, the same record chain
from the first record of the oldest segment, the same torn-tail/damage test
through the native reader's ``beyond``) but report what it would raise or cut
instead of doing it:

- a *problem* makes the WAL unsound: ``open`` would raise FormatError or
  CorruptionError for it, or a segment is missing from the middle;
- a *note* is something ``open`` tidies quietly: a torn tail it would cut,
  a temp file it would remove.

The checkpoint (``CHECKPOINT``, pmemwal/checkpoint.py) is read, never written:
``verify`` reads every record as ``open(..., verify="all")`` does, so an end of
the chain before the checkpoint's end_lsn is damage (those records had been
made durable), never a torn tail, and a segment missing from the checkpoint's
oldest_segno up to the one holding its end is a problem (open refuses both).
A WAL without the file (made before checkpoints) is read as before; one whose
slots are both invalid is read so too, with a note (open warns and reads it all).

Malformed files never raise: each OSError or FormatError met reading them
becomes a Problem.  Only a path that is no WAL directory at all raises:
NotFoundError (nothing there) or FormatError (a file, or no segment files).

On a WAL that a writer is appending to, the end moves while it is read: a
record still being written looks like damage for a moment.  Before damage is
reported, the record at the end is read again; if it has become valid, the
chain is followed further.  A writer truncating the WAL removes or renames its
oldest segments: one that vanishes while it is read makes ``verify`` and
``wal_stats`` start again (``dump``, which has printed records by then, says
where it stopped and why).  Files are never truncated by pmemwal, so a mapped
segment never shrinks under the reader.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

from pmemwal import _core
from pmemwal.checkpoint import Checkpoint, CheckpointFile
from pmemwal.errors import FormatError, NotFoundError, StorageError, format_lsn
from pmemwal.segments import CHECKPOINT_NAME, RESTORING_NAME, WAL_OWN_NAMES
from pmemwal.format import (PAGE_HEADER_SIZE, PAGE_SIZE, PAGE_USABLE, SegmentHeader, first_lsn,
                            parse_segment_name, segment_name)
from pmemwal.tools.inspect.dump import RecordLines
from pmemwal.tools.inspect.results import _END, _LIVE_RETRIES, End, Problem, RecordInfo

_LSN_LIMIT = 1 << 63          # the reader takes a prev-link as a signed 64-bit number
_IGNORED = WAL_OWN_NAMES | {RESTORING_NAME}  # (verify reads a restore's result before)
_NO_SEGMENT = 1               # wal_status: WAL_NO_SEGMENT (native/wal_reader.h)


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


# ---- the view -------------------------------------------------------------------

@dataclass
class _SegmentFile:
    segno: int
    size: int = -1               # bytes, -1: unknown
    allocated: int = 0           # bytes allocated on disk
    header: SegmentHeader | None = None


class WalView(RecordLines):
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
    ``"unreadable"``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.problems: list[Problem] = []
        self.notes: list[str] = []
        self.segment_size: int | None = None
        self.wal_id: bytes | None = None
        self._files: dict[int, _SegmentFile] = {}
        self.vanished: list[int] = []
        self._maps: dict[int, mmap.mmap] = {}
        self._reader = None
        self.segments = self._list()
        self._check_headers()
        self.readable = sorted(s for s, f in self._files.items() if self._usable_file(f))
        gaps = self._check_gaps()
        self.checkpoint: Checkpoint | None = None
        self.checkpoint_state = "none"
        self._read_checkpoint(gaps)
        if self.segment_size is not None:
            wal_id_lo = int.from_bytes(self.wal_id[:4], "little")
            self._reader = _core.Reader(self.segment_size, wal_id_lo, self._segment)

    # -- opening --

    def _list(self) -> list[int]:
        if not os.path.lexists(self.path):
            raise NotFoundError(errno.ENOENT, "no such WAL directory", self.path)
        if not os.path.isdir(self.path):
            raise FormatError(f"{self.path} is not a directory (a WAL is a directory of segment files)")
        try:
            names = sorted(os.listdir(self.path))
        except OSError as exc:
            raise StorageError(exc.errno or errno.EIO,
                               f"listing {self.path}: {exc.strerror or exc}") from exc
        segnos, foreign = [], []
        for name in names:
            segno = parse_segment_name(name)
            if segno is not None:
                segnos.append(segno)
            elif name.endswith(".wal.tmp") and parse_segment_name(name[:-4]) is not None:
                self.notes.append(f"temporary file {name} (a segment being made, or left by a "
                                  "crash: open removes it)")
            elif name not in _IGNORED:
                foreign.append(name)
        if not segnos:
            what = f" (it holds {', '.join(map(repr, foreign))})" if foreign else ""
            raise FormatError(f"{self.path} holds no segment files: not a pmemwal WAL{what}")
        for name in foreign:
            self.problems.append(Problem("foreign", f"{name!r} is not part of a pmemwal WAL"))
        return segnos

    def _check_headers(self) -> None:
        for segno in self.segments:
            info = self._files[segno] = _SegmentFile(segno)
            name = segment_name(segno)
            try:
                fd = os.open(os.path.join(self.path, name), os.O_RDONLY)
                try:
                    st = os.fstat(fd)
                    info.size, info.allocated = st.st_size, st.st_blocks * 512
                    data = os.pread(fd, PAGE_SIZE, 0)
                finally:
                    os.close(fd)
            except OSError as exc:
                self._io_problem(segno, f"cannot read {name}", exc)
                continue
            try:
                header = SegmentHeader.unpack(data, name)
            except FormatError as exc:
                self.problems.append(Problem("header", str(exc).removeprefix(f"{name}: "), segno))
                continue
            if header.segno != segno:
                self.problems.append(Problem("header", f"header says segment {header.segno:016X}",
                                             segno))
                continue
            info.header = header
        # the WAL's identity: what most valid headers say (the oldest wins a tie)
        votes = Counter((f.header.segment_size, f.header.wal_id)
                        for f in self._files.values() if f.header)
        if not votes:
            return
        best = max(votes.values())
        self.segment_size, self.wal_id = next(
            (f.header.segment_size, f.header.wal_id) for f in self._files.values()
            if f.header and votes[f.header.segment_size, f.header.wal_id] == best)
        for info in self._files.values():
            self._check_identity(info)
        self.problems = [Problem(p.kind, p.reason, p.segment, p.segment * self.segment_size)
                         if p.segment is not None and p.lsn is None
                         and (p.segment + 1) * self.segment_size <= _LSN_LIMIT else p
                         for p in self.problems]

    def _check_identity(self, info: _SegmentFile) -> None:
        size, segno, header = self.segment_size, info.segno, info.header
        if header is None:
            return
        if header.wal_id != self.wal_id:
            self.problems.append(Problem("header", f"belongs to another WAL (wal_id "
                                         f"{header.wal_id.hex()}, not {self.wal_id.hex()})",
                                         segno, segno * size))
            info.header = None
        elif header.segment_size != size:
            self.problems.append(Problem("header", f"says segment size {header.segment_size}, the "
                                         f"WAL's is {size}", segno, segno * size))
            info.header = None
        elif (segno + 1) * size > _LSN_LIMIT:
            self.problems.append(Problem("header", "segment number out of range", segno))
            info.header = None
        elif info.size != size:
            short = "truncated: " if info.size < size else ""
            self.problems.append(Problem("size", f"{short}{info.size} bytes, expected {size}",
                                         segno, segno * size))

    def _usable_file(self, info: _SegmentFile) -> bool:
        return info.header is not None and info.size >= (self.segment_size or 0)

    def _check_gaps(self) -> set[int]:
        """Segments missing between two present ones; returns their numbers."""
        missing: set[int] = set()
        for before, after in zip(self.segments, self.segments[1:]):
            if after > before + 1:
                lo, hi = before + 1, after - 1
                which = f"{lo:016X}" if lo == hi else f"{lo:016X} to {hi:016X}"
                lsn = lo * self.segment_size if self.segment_size else None
                self.problems.append(Problem("gap", f"segment {which} missing between "
                                             f"{before:016X} and {after:016X}", lo, lsn))
                missing.update(range(lo, hi + 1))
        return missing

    def _read_checkpoint(self, gaps: set[int]) -> None:
        """The checkpoint, read only (after the listing: a truncation writes the one that
        raises oldest_segno before it removes a segment), and the segments it vouches for:
        from its oldest_segno to the one holding the byte before its end (recovery's check;
        the gaps between present segments are reported already)."""
        path = os.path.join(self.path, CHECKPOINT_NAME)
        if self.segment_size is None:
            return
        try:
            self.checkpoint = CheckpointFile(self.path, self.wal_id, self.segment_size).read()
        except OSError as exc:
            self.checkpoint_state = "unreadable"
            self.problems.append(Problem("io", f"cannot read {CHECKPOINT_NAME}: "
                                         f"{exc.strerror or exc}"))
            return
        if self.checkpoint is None:
            if os.path.lexists(path):
                self.checkpoint_state = "invalid"
                self.notes.append(f"{CHECKPOINT_NAME} has no valid slot (both torn or damaged, or "
                                  "another WAL's): open reads every record, with a warning")
            return
        self.checkpoint_state = "valid"
        cp, size = self.checkpoint, self.segment_size
        last_segno = cp.end_lsn // size - (cp.end_lsn % size == PAGE_SIZE + PAGE_HEADER_SIZE)
        present = set(self.segments)
        missing = [n for n in range(cp.oldest_segno, last_segno + 1)
                   if n not in present and n not in gaps
                   and not os.path.exists(os.path.join(self.path, segment_name(n)))]
        # (one that exists now was made after the listing: a writer at work)
        if not missing:
            return
        for lo, hi in _runs(missing):
            which = f"segment {lo:016X} is" if lo == hi else \
                f"segments {lo:016X} to {hi:016X} are"
            self.problems.append(Problem(
                "gap", f"{which} missing, but the checkpoint says they held records durable up "
                f"to {format_lsn(cp.end_lsn)}: deleted, with their records", lo, lo * size))

    def checkpoint_dict(self) -> dict | None:
        """The checkpoint as JSON (None: none valid)."""
        cp = self.checkpoint
        if cp is None:
            return None
        return {"end_lsn": cp.end_lsn, "last_lsn": cp.last_lsn, "oldest_segno": cp.oldest_segno,
                "clean": cp.clean, "seq": cp.seq, "time_ns": cp.time_ns}

    def describe_checkpoint(self) -> str:
        """``checkpoint: end X/X, last X/X, oldest segment 000..., clean`` (or why none)."""
        cp = self.checkpoint
        if cp is None:
            return {"none": "checkpoint: none (a WAL made before checkpoints: open reads every "
                            "record)",
                    "invalid": "checkpoint: no valid slot (open reads every record)",
                    "unreadable": "checkpoint: unreadable"}[self.checkpoint_state]
        return (f"checkpoint: end {format_lsn(cp.end_lsn)}, last {format_lsn(cp.last_lsn)}, "
                f"oldest segment {cp.oldest_segno:016X}, {'clean' if cp.clean else 'not clean'}")

    # -- reading --

    def _segment(self, segno: int) -> mmap.mmap | None:
        """The getter for the native reader: a read-only mapping, or None."""
        seg_map = self._maps.get(segno)
        if seg_map is not None:
            return seg_map
        info = self._files.get(segno)
        if info is None or not self._usable_file(info):
            return None
        try:
            fd = os.open(os.path.join(self.path, segment_name(segno)), os.O_RDONLY)
            try:
                if os.fstat(fd).st_size < self.segment_size:   # shrunk since the header check
                    raise OSError(errno.EINVAL, "file shorter than a segment")
                seg_map = mmap.mmap(fd, self.segment_size, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
        except OSError as exc:
            self._io_problem(segno, "cannot map it", exc)
            info.header = None
            self.readable.remove(segno)
            return None
        self._maps[segno] = seg_map
        return seg_map

    def _io_problem(self, segno: int, what: str, exc: OSError) -> None:
        if exc.errno == errno.ENOENT:   # a writer truncated or recycled it since the listing
            self.vanished.append(segno)
            what = "vanished while being read (a writer truncating the WAL?)"
        else:
            what = f"{what}: {exc.strerror or exc}"
        lsn = segno * self.segment_size if self.segment_size else None
        self.problems.append(Problem("io", what, segno, lsn))

    @property
    def first_segment(self) -> int | None:
        """The oldest readable segment: the chain starts at its first record."""
        return self.readable[0] if self.readable else None

    def records(self, start: int | None = None, limit: int | None = None) -> Records:
        """The valid records from ``start`` (an LSN; None: the first record of the
        oldest segment) on, at most ``limit`` of them; iterate it, then see ``.end``."""
        return Records(self, start, limit)

    def scan(self, stop_lsn: int = _END) -> Records:
        """The whole chain (up to the first record at or past ``stop_lsn``: then ``end``
        is a ``limit`` there), followed by the native reader (no records yielded): see
        the result's ``count``, ``payload_bytes``, ``first_lsn``, ``last_lsn``, ``end``."""
        result = Records(self, None, None, stop_lsn)
        for _ in result._walk(native=True):    # yields nothing: the native scan counts
            pass
        return result

    def payload(self, lsn: int) -> bytes:
        """The payload of the valid record at ``lsn`` (ValueError if it is not one)."""
        if self._reader is None:
            raise ValueError("no readable segment")
        return self._reader.payload(lsn)

    def _hole(self, lsn: int, status: int, bad_lsn: int) -> End | None:
        """The chain runs into a segment that is missing or unreadable while a later one
        exists: it stops short of the end (open raises CorruptionError there too)."""
        segno = bad_lsn // self.segment_size
        if status != _NO_SEGMENT or segno > self.segments[-1] or segno < self.segments[0]:
            return None
        known = [p.reason for p in self.problems if p.segment == segno]
        why = known[0] if known else "missing"
        return End("unreadable", lsn, f"the record at {format_lsn(lsn)} runs into segment "
                   f"{segno:016X}, which cannot be read ({why})")

    def end_problem(self, end: End) -> Problem | None:
        """The problem an End is, if any: damage to durable records."""
        if end.kind != "damage":
            return None
        return Problem("damage", end.reason, end.lsn // self.segment_size, end.lsn)

    def _classify(self, lsn: int, status: int) -> End:
        """What the first invalid position ``lsn`` after a chain is: open's test (with
        verify="all": before the checkpoint's end, it is damage)."""
        reason = _core.status_text(status)
        cp = self.checkpoint
        if cp is not None and first_lsn(self.segments[0], self.segment_size) <= lsn < cp.end_lsn:
            return End("damage", lsn, f"{reason}, before the checkpoint's end "
                       f"{format_lsn(cp.end_lsn)}: this record had been made durable",
                       durable_lsn=cp.end_lsn)
        durable, pages = self._reader.beyond(lsn, self.readable[-1],
                                             first_lsn(self.segments[0], self.segment_size))
        if durable:
            return End("damage", lsn, f"{reason}; the valid record at {format_lsn(durable)} was "
                       "written after this one was flushed", durable_lsn=durable)
        cut = len(pages) * PAGE_SIZE
        size = self.segment_size
        seg_map = self._segment(lsn // size)
        if seg_map is not None:     # the rest of the end's page (a page never crosses a segment)
            off = lsn % size
            rest = seg_map[off:off + PAGE_SIZE - lsn % PAGE_SIZE]
            if rest.count(0) != len(rest):
                cut += len(rest)
        return End("torn" if cut else "clean", lsn, reason, cut_bytes=cut)

    def usable(self, lsn: int) -> int:
        """Position of ``lsn`` in the dense record stream (page headers left out)."""
        size = self.segment_size
        seg, off = divmod(lsn, size)
        page, in_page = divmod(off, PAGE_SIZE)
        return seg * (size // PAGE_SIZE - 1) * PAGE_USABLE + (page - 1) * PAGE_USABLE + \
            max(in_page - PAGE_HEADER_SIZE, 0)

    def close(self) -> None:
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

    def __iter__(self) -> Iterator[RecordInfo]:
        return self._walk(native=False)

    def _walk(self, native: bool) -> Iterator[RecordInfo]:
        view = self._view
        reader = view._reader
        if reader is None or not view.readable:
            self.end = End("unreadable", None, "no segment file can be read")
            return
        if self.start is None:
            status, lsn = reader.first_record(view.first_segment)
            while (status == _NO_SEGMENT and view.readable
                   and lsn // view.segment_size < view.first_segment):   # the oldest vanished
                status, lsn = reader.first_record(view.first_segment)
        else:
            status, lsn = 0, self.start
        bad = lsn
        prev = -1
        retries = 0
        while True:
            if self.limit is not None and self.count >= self.limit:
                self.end = End("limit", lsn, "limit")
                return
            if status == 0 and lsn >= self.stop_lsn:
                self.end = End("limit", lsn, f"stop at {format_lsn(self.stop_lsn)}")
                return
            if status == 0:
                if native:
                    begin = lsn
                    status, lsn, last, count, nbytes, bad = reader.scan(lsn, prev, self.stop_lsn)
                    if count:
                        self._note(begin, count, nbytes, last)
                    if last:  # void records (closed ranges) move the chain, count nothing
                        prev = last
                    if status == 0:  # it stopped at stop_lsn: a limit (above), not the end
                        continue
                else:
                    status, _, nxt, prv, length, crc, _, _, bad, void = reader.read(lsn, prev)
                    if status == 0 and void:
                        prev, lsn = lsn, nxt
                        continue
                    if status == 0:
                        self._note(lsn, 1, length, lsn)
                        yield RecordInfo(lsn, length, prv, crc, nxt)
                        prev, lsn = lsn, nxt
                        continue
            if self.count == 0 and self.start is not None:
                self.end = End("bad_start", lsn, _core.status_text(status))
                return
            if not view.readable:           # the last readable file could not be mapped
                self.end = End("unreadable", lsn, "no segment file can be read")
                return
            end = view._hole(lsn, status, bad) or view._classify(lsn, status)
            if end.kind == "damage" and retries < _LIVE_RETRIES and reader.read(lsn, prev)[0] == 0:
                retries += 1                # the record at the end has become valid: a writer
                status = 0
                continue
            self.end = end
            return

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
