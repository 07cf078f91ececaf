"""What a cut sets aside: valid records past the point where recovery ends the WAL.

Before recovery zeroes anything past the end it chose (a torn tail, or damage
cut with ``on_corruption="truncate"``), the pages it is about to zero that hold
valid records, and the pages those records span, are copied verbatim into
``lost+found/<cut LSN, 16 hex>-<time ns>/`` in the WAL directory, and synced:

    MANIFEST.json        cut_lsn, reason, wal_id (hex), segment_size, the records found
                         (lsn, next_lsn, length), made_ns
    <segment>.wal        a sparse copy of each segment involved: its header page and the
                         copied pages at their own offsets, holes elsewhere

The copies keep the on-disk format (docs/FORMAT.md), so the native reader reads
them as it reads a WAL; nothing else is copied, so a set-aside after a crash
costs a few pages, not segments.  Nothing is set aside when no valid record lies
past the cut (a torn record alone is no loss).

``pmemwal lost-found WAL`` lists them; ``--dump``, ``--restore`` (append the
records again, in order, as new records of the WAL: putback.py) and ``--remove`` act on one.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from pmemwal import _core
from pmemwal.errors import FormatError, format_lsn
from pmemwal.format import PAGE_HEADER_SIZE, PAGE_SIZE, PAGE_USABLE, segment_name
from pmemwal.segments import LOST_FOUND_NAME, storage_errors, sync_directory

MANIFEST = "MANIFEST.json"
_REM_LEN = struct.Struct("<I")  # a page header's rem_len, at offset 4


@dataclass(frozen=True)
class Found:
    """A valid record past a cut."""

    lsn: int
    next_lsn: int
    length: int


def records_past(reader: _core.Reader, x: int, pages: list[int], min_prev: int,
                 segment: Callable[[int], mmap.mmap | None], segment_size: int) -> list[Found]:
    """The valid records (not void) of this cycle at or past ``x``: tried at every aligned
    position of x's page and at the first record of each page in ``pages``, each chain
    followed while it holds.  A chain's first record must link at or past ``min_prev`` (the
    first LSN of the oldest segment): an older cycle's record in a recycled segment links
    below it, and is no record of this WAL.  ``segment``: a segment's mapping, or None."""
    found: dict[int, Found] = {}
    page_end = x - x % PAGE_SIZE + PAGE_SIZE
    starts = list(range(x, page_end, 8))
    for page_lsn in pages:
        seg = segment(page_lsn // segment_size)
        if seg is None:
            continue
        rem = _REM_LEN.unpack_from(seg, page_lsn % segment_size + 4)[0]
        if rem < PAGE_USABLE and rem % 8 == 0:
            starts.append(page_lsn + PAGE_HEADER_SIZE + rem)
    for start in starts:
        lsn, prev = start, -1
        while lsn not in found:
            status, _, next_lsn, prev_lsn, length, _, _, _, _, void = reader.read(lsn, prev)
            if status or (prev == -1 and prev_lsn < min_prev):
                break
            if not void:
                found[lsn] = Found(lsn, next_lsn, length)
            prev, lsn = lsn, next_lsn
    return sorted(found.values(), key=lambda f: f.lsn)


def set_aside(wal_dir: str, reader: _core.Reader, x: int, pages: list[int], min_prev: int,
              segment: Callable[[int], mmap.mmap | None], segment_size: int, wal_id: bytes,
              reason: str) -> tuple[str, list[Found]] | None:
    """Copy the pages past ``x`` that hold valid records into lost+found, synced; returns its
    path and the records, or None when there is no valid record to keep."""
    found = records_past(reader, x, pages, min_prev, segment, segment_size)
    if not found:
        return None
    copy = {x - x % PAGE_SIZE} | set(pages)
    for f in found:
        copy.update(range(f.lsn - f.lsn % PAGE_SIZE, f.next_lsn, PAGE_SIZE))
    target = os.path.join(wal_dir, LOST_FOUND_NAME, f"{x:016X}-{time.time_ns()}")
    with storage_errors(f"setting aside records past {format_lsn(x)} in {target}"):
        os.makedirs(target)
        by_segment: dict[int, list[int]] = {}
        for page_lsn in sorted(copy):
            by_segment.setdefault(page_lsn // segment_size, []).append(page_lsn)
        for segno, page_lsns in by_segment.items():
            _copy_pages(os.path.join(target, segment_name(segno)), segment(segno),
                        [0] + [p % segment_size for p in page_lsns], segment_size)
        manifest = {"cut_lsn": x, "cut": format_lsn(x), "reason": reason, "wal_id": wal_id.hex(),
                    "segment_size": segment_size, "made_ns": time.time_ns(),
                    "records": [[f.lsn, f.next_lsn, f.length] for f in found]}
        write_synced(os.path.join(target, MANIFEST), json.dumps(manifest, indent=1).encode())
        for directory in (target, os.path.dirname(target), wal_dir):
            sync_directory(directory)
    return target, found


def _copy_pages(path: str, source: mmap.mmap | None, offsets: list[int], size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        if source is not None:
            for off in offsets:
                os.pwrite(fd, source[off:off + PAGE_SIZE], off)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str, data: bytes, flags: int = os.O_EXCL) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside_segment(wal_dir: str, segno: int, segment_size: int, wal_id: bytes,
                      reason: str) -> str:
    """Move segment file ``segno``, a spare that holds no record (wal/opening.py), out of
    the WAL into an entry of its own, ``<its first LSN, 16 hex>-<time ns>/``, whose manifest
    lists no record; returns the entry's path.  The file goes first, then the manifest: a
    crash between leaves an entry without one, which ``entries`` passes over, and the WAL
    without the file."""
    name = segment_name(segno)
    target = os.path.join(wal_dir, LOST_FOUND_NAME, f"{segno * segment_size:016X}-{time.time_ns()}")
    with storage_errors(f"setting aside {os.path.join(wal_dir, name)} in {target}"):
        os.makedirs(target)
        os.rename(os.path.join(wal_dir, name), os.path.join(target, name))
        manifest = {"cut_lsn": segno * segment_size, "cut": format_lsn(segno * segment_size),
                    "reason": reason, "wal_id": wal_id.hex(), "segment_size": segment_size,
                    "made_ns": time.time_ns(), "records": []}
        write_synced(os.path.join(target, MANIFEST), json.dumps(manifest, indent=1).encode())
        for directory in (target, os.path.dirname(target), wal_dir):
            sync_directory(directory)
    return target


# ---- reading what was set aside ------------------------------------------------

@dataclass(frozen=True)
class SetAside:
    """One entry of lost+found: its name, its manifest, and its path."""

    name: str
    path: str
    manifest: dict

    @property
    def cut_lsn(self) -> int:
        return self.manifest["cut_lsn"]

    def records(self) -> Iterator[tuple[int, bytes]]:
        """(LSN, payload) of each record it holds, validated again by the native reader."""
        size = self.manifest["segment_size"]
        wal_id = bytes.fromhex(self.manifest["wal_id"])
        maps: dict[int, mmap.mmap | None] = {}

        def segment(segno: int) -> mmap.mmap | None:
            if segno not in maps:
                path = os.path.join(self.path, segment_name(segno))
                maps[segno] = _map_readonly(path, size) if os.path.exists(path) else None
            return maps[segno]

        reader = _core.Reader(size, int.from_bytes(wal_id[:4], "little"), segment)
        try:
            for lsn, _, _ in self.manifest["records"]:
                status = reader.read(lsn, -1)[0]
                if status:
                    raise FormatError(f"{self.path}: the record at {format_lsn(lsn)} no longer "
                                      f"reads: {_core.status_text(status)}")
                yield lsn, reader.payload(lsn)
        finally:
            for m in maps.values():
                if m is not None:
                    m.close()


def _map_readonly(path: str, size: int) -> mmap.mmap:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != size:
            raise FormatError(f"{path} is not {size} bytes")
        return mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)


def entries(wal_dir: str) -> list[SetAside]:
    """What lost+found in ``wal_dir`` holds, oldest cut first."""
    root = os.path.join(wal_dir, LOST_FOUND_NAME)
    if not os.path.isdir(root):
        return []
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, MANIFEST), "rb") as f:
                manifest = json.loads(f.read())
        except (OSError, ValueError):
            continue  # not ours, or made by a crash before its manifest: nothing to read
        found.append(SetAside(name, path, manifest))
    return found


def remove(wal_dir: str, name: str) -> None:
    """Delete lost+found entry ``name`` and what it holds."""
    entry = find(wal_dir, name)
    with storage_errors(f"removing {entry.path}"):
        for file in os.listdir(entry.path):
            os.unlink(os.path.join(entry.path, file))
        os.rmdir(entry.path)
        sync_directory(os.path.dirname(entry.path))


def find(wal_dir: str, name: str) -> SetAside:
    """Entry ``name`` of lost+found in ``wal_dir``; FileNotFoundError when there is none."""
    for entry in entries(wal_dir):
        if entry.name == name:
            return entry
    raise FileNotFoundError(f"no entry {name!r} in {os.path.join(wal_dir, LOST_FOUND_NAME)}")
