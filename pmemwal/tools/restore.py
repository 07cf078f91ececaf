"""Restore: a WAL directory rebuilt from archived segments (``pmemwal restore``, or
``pmemwal.tools.restore.restore(dest, source)``).

Segments are fetched oldest first (from an fsspec URL, or one by one through a
``restore_command``), each into ``<name>.tmp`` (which open removes, should a
crash leave one), its header checked against its name, its size and the first
segment's WAL id, then renamed into place.  Restoring stops at the first
segment the archive lacks (a gap), at a segment that fails its checks, or past
``until``.  Then the record chain is followed as ``verify`` and open do: the
WAL is cut at the first record at or past ``until``, or at damage, by zeroing
its segment from there and leaving later segments out, so that it opens with
exactly the records before that point.  A record that runs into a segment the
archive lacks is a torn tail, which open cuts.  Every file and the directory are
synced before restore returns, and the segments restored whole get ``.done``
archive status: opened with the same archive, the WAL does not ship them again.
All of it happens under a ``RESTORING`` marker file in ``dest``, which open refuses, removed
(and the directory synced) once the result verifies: a restore cut short leaves a directory
that does not open, and a rerun clears it and starts over.

A WAL restored with ``until`` (or cut at damage) goes on from the cut with new
records: archive it to a new place, since its segment at the cut will differ
from the archived one (the archive refuses to overwrite it).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import asdict, dataclass, field

from pmemwal.archive import (DEFAULT_COMMAND_TIMEOUT, ArchiveStatus, CommandArchive, FsspecArchive,
                             fsync_path)
from pmemwal.errors import ArchiveError, ConfigError, FormatError, format_lsn
from pmemwal.checkpoint import CheckpointFile
from pmemwal.format import HEADER_SIZE, SegmentHeader, first_lsn, segment_name
from pmemwal.segments import RESTORING_NAME, make_directories, sync_directory
from pmemwal.tools.inspect import WalView, verify

_END = (1 << 64) - 1



@dataclass
class RestoreReport:
    """What ``restore`` did: the segments it restored, why it stopped, where it cut the
    WAL (None: nowhere), and the records the result holds."""

    source: str
    dest: str
    segments: list[int] = field(default_factory=list)
    stopped: str = ""
    cut_lsn: int | None = None
    records: int = 0
    first_lsn: int | None = None
    last_lsn: int | None = None
    end_lsn: int | None = None

    def as_dict(self) -> dict:
        return {**asdict(self), "segments": [segment_name(s) for s in self.segments]}

    def summary_line(self) -> str:
        span = (f"{segment_name(self.segments[0])}..{segment_name(self.segments[-1])}"
                if self.segments else "none")
        cut = f", cut at {format_lsn(self.cut_lsn)}" if self.cut_lsn is not None else ""
        end = format_lsn(self.end_lsn) if self.end_lsn is not None else "-"
        return (f"restored {len(self.segments)} segments ({span}), {self.records} records, "
                f"end {end}{cut}; stopped: {self.stopped}")


def restore(dest: str | os.PathLike[str], source: str | None = None, *,
            restore_command: str | None = None, until: int | None = None,
            start_segment: int | None = None, storage_options: dict | None = None,
            timeout: float = DEFAULT_COMMAND_TIMEOUT) -> RestoreReport:
    """Rebuild the WAL directory ``dest`` (absent or empty) from an archive.

    ``source``: the fsspec URL the WAL archived to (``archive=``), or ``restore_command``
    (PostgreSQL's convention: ``"cp /mnt/arch/%f %p"``, exit status 0 when it fetched the
    segment).  ``until``: leave out every record at or past this LSN.  ``start_segment``:
    the first segment to restore (default: the oldest the archive lists; 0 with a
    restore_command).  ``storage_options`` go to fsspec; ``timeout`` limits each command.

    Raises ArchiveError when the archive cannot be read or holds no usable segment.
    """
    if (source is None) == (restore_command is None):
        raise ConfigError("restore from a source URL or with a restore_command (one of them)")
    if until is not None and until < 0:
        raise ConfigError(f"until={until}: an LSN, 0 or more")
    dest = os.path.abspath(os.fspath(dest))
    names = os.listdir(dest) if os.path.isdir(dest) else []
    if os.path.exists(dest) and (not os.path.isdir(dest) or
                                 (names and RESTORING_NAME not in names)):
        raise ConfigError(f"{dest} exists and is not an empty directory: restore makes a new WAL")
    # Built in place under a RESTORING marker, which open refuses, removed once the result
    # verifies: a restore cut short (a crash) leaves no WAL that opens (with records at or
    # past ``until``, or part of the archive), and a rerun clears it and starts over.
    if RESTORING_NAME in names:
        _clear(dest)
    make_directories(dest, mode=0o700)
    marker = os.path.join(dest, RESTORING_NAME)
    with open(marker, "wb") as f:
        os.fsync(f.fileno())
    sync_directory(dest)
    archive = (FsspecArchive(source, storage_options) if source is not None
               else CommandArchive(None, restore_command, timeout))
    report = RestoreReport(archive.description, dest)
    _restore_into(dest, archive, report, until, start_segment)
    os.unlink(marker)       # the commit point: from here on it is a WAL
    sync_directory(dest)
    return report


def _clear(dest: str) -> None:
    """Empty ``dest``: what a restore cut short left (its marker last)."""
    for name in sorted(os.listdir(dest), key=lambda n: n == RESTORING_NAME):
        path = os.path.join(dest, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    sync_directory(dest)


def _restore_into(dest: str, archive, report: RestoreReport, until: int | None,
                  start_segment: int | None) -> None:
    fetcher = _Fetcher(archive, dest, report, start_segment)
    while fetcher.next(until):
        pass
    if not report.segments:
        raise ArchiveError(errno.ENOENT,
                           f"{archive.description} holds no usable segment: {report.stopped}")
    header = fetcher.header
    assert header is not None, "a segment fetched has its header kept"
    while True:
        with WalView(dest) as view:
            scanned = view.scan(until if until is not None else _END)
            end = scanned.end
        # (a scan says where it ended; only one that could read no segment has no LSN)
        assert end is not None and end.lsn is not None, "the fetched segments are readable"
        if (until is not None and end.kind in ("clean", "torn") and end.lsn < until
                and not fetcher.done and fetcher.next(None)):
            continue  # the last record before `until` runs into the next segment: fetch it
        break
    size = header.segment_size
    if end.kind == "end" and end.lsn // size > report.segments[-1]:
        pass  # the first record at or past `until` starts in a segment not fetched: none here
    elif end.kind in ("end", "damage"):
        _cut(dest, end.lsn, size, report)
        if end.kind == "damage":
            where = end.describe(size)
            report.stopped = f"damage in the archived segments: {where}"
    _finish(dest, report, header, end.lsn, scanned.last_lsn)


class _Fetcher:
    """Fetches the archive's segments into ``dest`` one at a time, in order."""

    def __init__(self, archive, dest: str, report: RestoreReport, start: int | None) -> None:
        self.archive, self.dest, self.report = archive, dest, report
        self.listed = set(archive.segments()) if isinstance(archive, FsspecArchive) else None
        if start is None:
            start = min(self.listed) if self.listed else 0
        self.segno = start
        self.header: SegmentHeader | None = None
        self.done = False  # at a gap, a bad segment or the archive's end (not at `until`)

    def next(self, until: int | None) -> bool:
        """Fetch the next segment; False (and ``report.stopped`` says why) at the end."""
        if self.done:
            return False
        segno, name = self.segno, segment_name(self.segno)
        size = self.header.segment_size if self.header else None
        if until is not None and size and segno * size >= until:
            self.report.stopped = f"until {format_lsn(until)}"
            return False
        if self.listed is not None and segno not in self.listed:
            return self._stop("end of archive" if not self.listed or segno > max(self.listed)
                              else f"gap: the archive lacks {name}")
        tmp = os.path.join(self.dest, name + ".tmp")
        if not self.archive.fetch(name, tmp):
            return self._stop(f"the archive has no {name}" if self.report.segments
                              else f"the archive has no {name} (no segment to start from)")
        try:
            self._check(segno, tmp)
        except FormatError as exc:
            os.unlink(tmp)
            return self._stop(f"{name} fails its checks: {exc}")
        os.replace(tmp, os.path.join(self.dest, name))
        self.report.segments.append(segno)
        self.segno += 1
        return True

    def _stop(self, why: str) -> bool:
        self.report.stopped, self.done = why, True
        return False

    def _check(self, segno: int, path: str) -> None:
        """The header checks open makes: the name, the WAL, the size."""
        with open(path, "rb") as f:
            header = SegmentHeader.unpack(f.read(HEADER_SIZE), path)
            size = os.fstat(f.fileno()).st_size
        if header.segno != segno:
            raise FormatError(f"its header says segment {header.segno:016X}")
        if self.header and (header.wal_id, header.segment_size) != (self.header.wal_id,
                                                                   self.header.segment_size):
            raise FormatError("it belongs to another WAL than the segments before it")
        if size != header.segment_size:
            raise FormatError(f"it is {size} bytes, its header says {header.segment_size}")
        self.header = self.header or header


def _cut(dest: str, lsn: int, segment_size: int, report: RestoreReport) -> None:
    """Leave out every record from ``lsn`` on: zero the rest of its segment, drop later ones."""
    segno = lsn // segment_size
    with open(os.path.join(dest, segment_name(segno)), "r+b") as f:
        f.seek(lsn % segment_size)
        f.write(bytes(segment_size - lsn % segment_size))
    for later in [s for s in report.segments if s > segno]:
        os.unlink(os.path.join(dest, segment_name(later)))
        report.segments.remove(later)
    report.cut_lsn = lsn


def _finish(dest: str, report: RestoreReport, header: SegmentHeader, end_lsn: int | None,
            last_lsn: int | None) -> None:
    """Sync everything, give the segments restored whole ``.done`` status, write the
    checkpoint at the end the chain was followed to (``end_lsn``, where the record at
    ``last_lsn`` ends: the archived segments say the WAL kept one, and open refuses them
    without it, pmemwal/recovery.py), then verify and count the records."""
    segment_size = header.segment_size
    status = ArchiveStatus(dest)
    cut_segment = report.cut_lsn // segment_size if report.cut_lsn is not None else None
    for segno in report.segments:
        fsync_path(os.path.join(dest, segment_name(segno)))
        if segno != cut_segment:
            status.mark_done(segno)
    status.sync()
    fsync_path(dest)
    oldest = report.segments[0]
    CheckpointFile(dest, header.wal_id, segment_size).write(
        end_lsn if end_lsn is not None else first_lsn(oldest, segment_size), last_lsn or 0, oldest)
    check = verify(dest)
    check.problems = [p for p in check.problems if p.kind != "restore"]   # (this one's marker)
    if not check.ok:
        raise ArchiveError(errno.EIO, f"the restored WAL at {dest} does not verify: "
                           f"{check.summary_line()}")
    report.records, report.first_lsn, report.last_lsn, report.end_lsn = (
        check.records, check.first_lsn, check.last_lsn, check.end_lsn)
