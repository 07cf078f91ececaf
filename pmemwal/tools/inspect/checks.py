"""The WAL directory checked as ``open`` checks it, before a record is read.

``DirectoryChecks`` (a base of WalView, view.py) lists the directory (segment files,
temp files open would remove, foreign files), reads each segment's header, size and
identity (the WAL's: what most valid headers say), finds the segments missing between
two present ones, and reads the checkpoint (read only) and the segments it vouches for.
What it finds are Problems and notes; a file that cannot be read is a problem too, and
one gone since the listing (a writer truncating the WAL) is also ``vanished``.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from dataclasses import dataclass

from pmemwal.checkpoint import Checkpoint, CheckpointFile
from pmemwal.errors import FormatError, NotFoundError, StorageError, format_lsn
from pmemwal.format import (CHECKPOINTED, PAGE_HEADER_SIZE, PAGE_SIZE, SegmentHeader, first_lsn,
                            parse_segment_name, segment_name)
from pmemwal.segments import CHECKPOINT_NAME, RESTORING_NAME, WAL_OWN_NAMES, is_wal_own_name
from pmemwal.tools.inspect.results import Problem

_LSN_LIMIT = 1 << 63          # the reader takes a prev-link as a signed 64-bit number
_IGNORED = WAL_OWN_NAMES


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def require_wal_directory(path: str) -> None:
    """NotFoundError when nothing is at ``path``, FormatError when it is not a directory: what
    every tool says of a PATH that cannot be a WAL."""
    if not os.path.lexists(path):
        raise NotFoundError(errno.ENOENT, "no such WAL directory", path)
    if not os.path.isdir(path):
        raise FormatError(f"{path} is not a directory (a WAL is a directory of segment files)")


@dataclass
class _SegmentFile:
    segno: int
    size: int = -1               # bytes, -1: unknown
    allocated: int = 0           # bytes allocated on disk
    header: SegmentHeader | None = None


class DirectoryChecks:
    """The segment files, their headers and the checkpoint of directory ``path``, checked
    (the attributes are described at WalView)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.problems: list[Problem] = []
        self.notes: list[str] = []
        self.segment_size: int | None = None
        self.wal_id: bytes | None = None
        self._files: dict[int, _SegmentFile] = {}
        self.vanished: list[int] = []
        self.segments = self._list()
        self._check_headers()
        self.readable = sorted(s for s, f in self._files.items() if self._usable_file(f))
        gaps = self._check_gaps()
        self.checkpoint: Checkpoint | None = None
        self.checkpoint_state = "none"
        self._read_checkpoint(gaps)

    def _list(self) -> list[int]:
        require_wal_directory(self.path)
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
            elif name == RESTORING_NAME:   # (restore.py verifies its result before it goes)
                self.problems.append(Problem("restore", f"a restore cut short ({name} is "
                                             "there): open refuses it; run the restore again, "
                                             "which starts over"))
            elif name not in _IGNORED and not is_wal_own_name(name):
                foreign.append(name)
        if not segnos:
            what = f" (it holds {', '.join(map(repr, foreign))})" if foreign else ""
            raise FormatError(f"{self.path} holds no segment files: not a pmemwal WAL{what}")
        for name in foreign:
            self.notes.append(f"{name!r} is not part of a pmemwal WAL: open ignores it")
        return segnos

    def _check_headers(self) -> None:
        for segno in self.segments:
            info = self._files[segno] = _SegmentFile(segno)
            info.header = self._read_header(info)
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

    def _read_header(self, info: _SegmentFile) -> SegmentHeader | None:
        """The segment's header, its size and allocation noted in ``info`` (None: a problem)."""
        segno = info.segno
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
            return None
        try:
            header = SegmentHeader.unpack(data, name)
        except FormatError as exc:
            self.problems.append(Problem("header", str(exc).removeprefix(f"{name}: "), segno))
            return None
        if header.segno != segno:
            self.problems.append(Problem("header", f"header says segment {header.segno:016X}",
                                         segno))
            return None
        return header

    def _check_identity(self, info: _SegmentFile) -> None:
        size, wal_id, segno, header = self.segment_size, self.wal_id, info.segno, info.header
        if header is None:
            return
        assert size is not None and wal_id is not None, "a valid header gave the WAL's"
        if header.wal_id != wal_id:
            self.problems.append(Problem("header", f"belongs to another WAL (wal_id "
                                         f"{header.wal_id.hex()}, not {wal_id.hex()})",
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

    def _added(self, segno: int) -> _SegmentFile | None:
        """A segment file made since the listing (a writer went on: ``dump --follow`` reads
        on), checked as a listed one; None while it is not there or not sound, which is no
        problem of the WAL (a segment being recycled), so none is noted."""
        info = _SegmentFile(segno)
        known = len(self.problems)
        info.header = self._read_header(info)
        self._check_identity(info)
        del self.problems[known:]
        if not self._usable_file(info):
            return None
        self._files[segno] = info
        self.segments.append(segno)
        self.readable.append(segno)
        return info

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

    def _kept_checkpoint(self) -> bool:
        """Whether a segment header says the WAL kept a CHECKPOINT (CHECKPOINTED), but for
        a new WAL's only segment with nothing written in it (recovery's exception: a crash
        before the first checkpoint)."""
        flagged = any(f.header is not None and f.header.flags & CHECKPOINTED
                      for f in self._files.values())
        if not flagged or self.segments != [0]:
            return flagged
        try:
            with open(os.path.join(self.path, segment_name(0)), "rb") as f:
                f.seek(PAGE_SIZE)
                return any(f.read(PAGE_SIZE))
        except OSError:
            return True

    def _read_checkpoint(self, gaps: set[int]) -> None:
        """The checkpoint, read only (after the listing: a truncation writes the one that
        raises oldest_segno before it removes a segment), and the segments it vouches for:
        from its oldest_segno to the one holding the byte before its end (recovery's check;
        the gaps between present segments are reported already)."""
        path = os.path.join(self.path, CHECKPOINT_NAME)
        if self.segment_size is None or self.wal_id is None:    # (both come from a header)
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
            elif self._kept_checkpoint():
                first = self.segments[0]    # (where the open that refuses it names it)
                self.problems.append(Problem(
                    "damage", f"{CHECKPOINT_NAME} is missing, but the segment headers say the "
                    "WAL kept one (deleted?): damage to the last acknowledged records cannot be "
                    "told from a torn tail", first,
                    first_lsn(first, self.segment_size) if self.segment_size else None))
            return
        self.checkpoint_state = "valid"
        cp, size = self.checkpoint, self.segment_size
        below = [n for n in self.segments if n < cp.oldest_segno]
        if below:
            self.notes.append(f"segments {below[0]:016X}..{below[-1]:016X} lie below the "
                              "checkpoint's oldest (a truncation a crash cut short): no part "
                              "of the WAL, which open removes")
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

    def _io_problem(self, segno: int, what: str, exc: OSError) -> None:
        if exc.errno == errno.ENOENT:   # a writer truncated or recycled it since the listing
            self.vanished.append(segno)
            what = "vanished while being read (a writer truncating the WAL?)"
        else:
            what = f"{what}: {exc.strerror or exc}"
        lsn = segno * self.segment_size if self.segment_size else None
        self.problems.append(Problem("io", what, segno, lsn))
