"""What a cut sets aside: valid records past the point where recovery ends the WAL.

Before recovery zeroes anything past the end it chose (a torn tail, or damage
cut with ``on_corruption="truncate"``), every page it is about to zero that is
not all zeros, and the pages the valid records past the end span, are copied
verbatim into ``lost+found/<cut LSN, 16 hex>-<time ns>/`` in the WAL directory,
and synced:

    CUTTING              present until the cut has zeroed and synced what it cut (finish)
    MANIFEST.json        cut_lsn, reason, wal_id (hex), segment_size, the pages copied, the
                         records found (lsn, next_lsn, length), made_ns, cuts (the WAL's
                         count of cuts with this one; null: no cut of durable records)
    <segment>.wal        a sparse copy of each segment involved: its header page and the
                         copied pages at their own offsets, holes elsewhere

A record counts as valid by its own bytes (its CRC, which covers its prev-link):
the page headers are not checked, so a damaged page header loses no record.  The
copies keep the on-disk format (docs/FORMAT.md), so the native reader reads them
as it reads a WAL; nothing else is copied, so a set-aside after a crash costs a
few pages, not segments.  Nothing is set aside when no valid record lies past
the cut and the cut is not of records known durable (a torn record alone is no
loss).  A crash between the set-aside and the end of the zeroing leaves the
entry pending; the next recovery, which finds the same cut, finishes it instead
of making a second entry.

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
CUTTING = "CUTTING"     # the cut that made the entry has not finished zeroing: see set_aside
_REMOVING = ".removing"  # an entry being removed, renamed away first: see remove
_REM_LEN = struct.Struct("<I")  # a page header's rem_len, at offset 4


@dataclass(frozen=True)
class Found:
    """A valid record past a cut."""

    lsn: int
    next_lsn: int
    length: int


def records_past(x: int, pages: list[int], min_prev: int,
                 segment: Callable[[int], memoryview | mmap.mmap | None], segment_size: int,
                 wal_id_lo: int) -> list[Found]:
    """The valid records (not void) of this cycle at or past ``x``, as far as their own bytes
    tell: tried at every aligned position from x to the end of x's page and in every page of
    ``pages``, each chain followed while it holds.  Page headers are not checked (a salvage
    reader): a damaged page header alone must not lose the records in its page, and each
    record's CRC, which covers its prev-link, still has to match.  A chain's first record must
    link at or past ``min_prev`` (the first LSN of the oldest segment): an older cycle's record
    in a recycled segment links below it, and is no record of this WAL.  ``segment``: a
    segment's mapping, or None."""
    reader = _core.Reader(segment_size, wal_id_lo, segment, salvage=True)
    found: dict[int, Found] = {}
    reach = x                       # positions below it lie inside a record found
    for start in _positions(x, pages):
        if start < reach:
            continue
        lsn, prev = start, -1
        while lsn not in found:
            status, _, next_lsn, prev_lsn, length, _, _, _, _, void = reader.read(lsn, prev)
            if status or (prev == -1 and prev_lsn < min_prev):
                break
            if not void:
                found[lsn] = Found(lsn, next_lsn, length)
            prev, lsn = lsn, next_lsn
        reach = max(reach, lsn)
    return sorted(found.values(), key=lambda f: f.lsn)


def _positions(x: int, pages: list[int]) -> Iterator[int]:
    """Every aligned position of the usable areas from x on, in x's page and in ``pages``."""
    yield from range(x, x - x % PAGE_SIZE + PAGE_SIZE, 8)
    for page_lsn in sorted(p for p in pages if p > x):
        yield from range(page_lsn + PAGE_HEADER_SIZE, page_lsn + PAGE_SIZE, 8)


def set_aside(wal_dir: str, x: int, pages: list[int], min_prev: int,
              segment: Callable[[int], memoryview | mmap.mmap | None], segment_size: int, wal_id: bytes,
              reason: str, keep: bool = False,
              cuts: int | None = None) -> tuple[str, list[Found], int | None] | None:
    """Copy every page the cut at ``x`` is about to zero (x's page and ``pages``) that is not
    all zeros, and the pages the valid records past x span, into a new lost+found entry,
    synced; returns its path, the records and the count of cuts it records, or None when
    there is nothing to keep: no valid record past x, and not ``keep`` (a cut of records
    known durable keeps its pages even when no record in them validates any more).
    ``cuts``: the WAL's count of cuts with this one (None: the cut is no cut of durable
    records), recorded so that a recovery rerun after a crash counts the cut once.

    The entry is made pending (``CUTTING``) until the caller has zeroed and synced what it
    cuts (``finish``): a recovery that a crash stopped in between finds the same cut, and
    this returns the pending entry instead of making a second one."""
    wal_id_lo = int.from_bytes(wal_id[:4], "little")
    found = records_past(x, pages, min_prev, segment, segment_size, wal_id_lo)
    pending = _pending(wal_dir, x, wal_id)
    held = set() if pending is None else {tuple(r) for r in pending.manifest["records"]}
    if pending is not None and {(f.lsn, f.next_lsn, f.length) for f in found} <= held:
        # the same cut, begun before: since then only its zeroing wrote, which removes
        return (pending.path, [Found(*r) for r in pending.manifest["records"]],
                pending.manifest.get("cuts"))
    if not found and not (keep and _holds_bytes(x, pages, segment, segment_size)):
        return None
    copy = {x - x % PAGE_SIZE} | set(pages)
    for f in found:
        copy.update(range(f.lsn - f.lsn % PAGE_SIZE, f.next_lsn, PAGE_SIZE))
    target = os.path.join(wal_dir, LOST_FOUND_NAME, f"{x:016X}-{time.time_ns()}")
    with storage_errors(f"setting aside records past {format_lsn(x)} in {target}"):
        os.makedirs(target)
        write_synced(os.path.join(target, CUTTING), b"")
        by_segment: dict[int, list[int]] = {}
        for page_lsn in sorted(copy):
            by_segment.setdefault(page_lsn // segment_size, []).append(page_lsn)
        for segno, page_lsns in by_segment.items():
            _copy_pages(os.path.join(target, segment_name(segno)), segment(segno),
                        [0] + [p % segment_size for p in page_lsns], segment_size)
        manifest = {"cut_lsn": x, "cut": format_lsn(x), "reason": reason, "wal_id": wal_id.hex(),
                    "segment_size": segment_size, "made_ns": time.time_ns(),
                    "pages": sorted(copy),
                    "records": [[f.lsn, f.next_lsn, f.length] for f in found], "cuts": cuts}
        write_synced(os.path.join(target, MANIFEST), json.dumps(manifest, indent=1).encode())
        for directory in (target, os.path.dirname(target), wal_dir):
            sync_directory(directory)
    if pending is not None and held <= {(f.lsn, f.next_lsn, f.length) for f in found}:
        # a cut at x stopped before it zeroed anything, whose open then went on without
        # cutting there (other options), and appended more: this entry holds all it held
        remove(wal_dir, pending.name)
    return target, found, cuts


def _holds_bytes(x: int, pages: list[int], segment: Callable[[int], memoryview | mmap.mmap | None],
                 segment_size: int) -> bool:
    """Whether anything the cut at x zeroes is not zeros already: x's page from x on, and
    ``pages``."""
    for lsn in [x] + pages:
        seg = segment(lsn // segment_size)
        offset = lsn % segment_size
        if seg is not None and bytes(seg[offset:offset + PAGE_SIZE - lsn % PAGE_SIZE]).strip(b"\0"):
            return True
    return False


def finish(path: str) -> None:
    """The cut that made the entry at ``path`` has zeroed and synced what it cut: the entry is
    no longer pending."""
    with storage_errors(f"finishing {path}"):
        os.unlink(os.path.join(path, CUTTING))
        sync_directory(path)


def _pending(wal_dir: str, x: int, wal_id: bytes) -> SetAside | None:
    for entry in entries(wal_dir):
        if entry.pending and entry.cut_lsn == x and entry.manifest["wal_id"] == wal_id.hex():
            return entry
    return None


def _copy_pages(path: str, source: memoryview | mmap.mmap | None, offsets: list[int], size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        if source is not None:
            for off in offsets:
                page = bytes(source[off:off + PAGE_SIZE])
                if page.strip(b"\0"):   # (a hole reads as zeros)
                    os.pwrite(fd, page, off)
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

    @property
    def pending(self) -> bool:
        """Whether the cut that made it was stopped before it had zeroed what it cut."""
        return os.path.exists(os.path.join(self.path, CUTTING))

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

        # (salvage: a record may lie in a page whose header was the damage; its CRC is checked)
        reader = _core.Reader(size, int.from_bytes(wal_id[:4], "little"), segment, salvage=True)
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
        if name.startswith("."):
            continue  # one being removed (remove)
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, MANIFEST), "rb") as f:
                manifest = json.loads(f.read())
        except (OSError, ValueError):
            continue  # not ours, or made by a crash before its manifest: nothing to read
        found.append(SetAside(name, path, manifest))
    return found


def remove(wal_dir: str, name: str) -> None:
    """Delete lost+found entry ``name`` and what it holds.  It is renamed away first (and the
    directory synced), so that a crash never leaves it listed with part of its files: a
    put-back whose removal a crash cut short would append its records again if the entry
    lost its ``RESTORING`` note and kept its manifest."""
    entry = find(wal_dir, name)
    root = os.path.dirname(entry.path)
    gone = os.path.join(root, f".{entry.name}{_REMOVING}")
    with storage_errors(f"removing {entry.path}"):
        os.rename(entry.path, gone)
        sync_directory(root)
        for leftover in os.listdir(root):   # this one, and any a crash left
            if leftover.startswith(".") and leftover.endswith(_REMOVING):
                _delete(os.path.join(root, leftover))
        sync_directory(root)


def _delete(path: str) -> None:
    for file in os.listdir(path):
        os.unlink(os.path.join(path, file))
    os.rmdir(path)


def find(wal_dir: str, name: str) -> SetAside:
    """Entry ``name`` of lost+found in ``wal_dir``; FileNotFoundError when there is none."""
    for entry in entries(wal_dir):
        if entry.name == name:
            return entry
    raise FileNotFoundError(f"no entry {name!r} in {os.path.join(wal_dir, LOST_FOUND_NAME)}")
