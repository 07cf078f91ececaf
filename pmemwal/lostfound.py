"""What a cut sets aside: valid records past the point where recovery ends the WAL.

Before recovery zeroes anything past the end it chose (a torn tail, or damage
cut with ``on_corruption="truncate"``), every page it is about to zero that is
not all zeros, and the pages the valid records past the end span, are copied
verbatim into ``lost+found/<cut LSN, 16 hex>-<time ns>/`` in the WAL directory,
and synced:

    CUTTING              present until the cut has zeroed and synced what it cut (finish)
    MANIFEST.json        cut_lsn, reason, wal_id (hex), segment_size, the pages copied, the
                         records found (lsn, next_lsn, length, crc), made_ns, cuts (the WAL's
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
entry pending; the next recovery, which finds the same cut (the same records,
by their CRCs, and no byte the entry lacks), finishes it instead of making a
second entry.  Every cut, once its zeroing is synced, resolves the pending
entries of cuts at or past its own (finish): none is left pending for a cut
that no open will make again, and no record is held by two entries.

``pmemwal lost-found WAL`` lists them; ``--dump``, ``--restore`` (append the
records again, in order, as new records of the WAL: putback.py) and ``--remove`` act on one.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from pmemwal import _core
from pmemwal.errors import FormatError, format_lsn
from pmemwal.format import PAGE_SIZE, segment_name
from pmemwal.segments import LOST_FOUND_NAME, storage_errors, sync_directory

MANIFEST = "MANIFEST.json"
CUTTING = "CUTTING"     # the cut that made the entry has not finished zeroing: see set_aside
_REMOVING = ".removing"  # an entry being removed, renamed away first: see remove
_REM_LEN = struct.Struct("<I")  # a page header's rem_len, at offset 4


@dataclass(frozen=True)
class Found:
    """A valid record past a cut: where it lies, and its CRC (what it holds, to tell one
    record from another written at the same LSN later)."""

    lsn: int
    next_lsn: int
    length: int
    crc: int


def records_past(x: int, pages: list[int], link: int, floor: int,
                 segment: Callable[[int], memoryview | mmap.mmap | bytearray | None],
                 segment_size: int, wal_id_lo: int) -> list[Found]:
    """The valid records (not void) of this cycle at or past ``x``, as far as their own bytes
    tell: tried at every aligned position from x to the end of x's page and in every page of
    ``pages``, each chain followed while it holds (natively: Reader.salvage, wal_salvage).
    Page headers are not checked (a salvage reader): a damaged page header alone must not
    lose the records in its page, and each record's CRC, which covers its prev-link, still has
    to match.  A chain's first record must link at or past ``link`` (the last valid record
    before x; 0: none) and ``floor`` (the first LSN of the oldest segment: an older cycle's
    record in a recycled segment links below it).  When the record at x is invalid but its
    header plausible, no position inside the extent it claims is tried: a record image that
    its payload carries is no record of the WAL.  ``segment``: a segment's mapping, or None."""
    reader = _core.Reader(segment_size, wal_id_lo, segment, salvage=True)
    later = sorted(p for p in pages if p > x)
    return [Found(*r) for r in reader.salvage(x, later, link or -1, floor)]


def set_aside(wal_dir: str, x: int, pages: list[int], link: int, floor: int,
              segment: Callable[[int], memoryview | mmap.mmap | None], segment_size: int, wal_id: bytes,
              reason: str, keep: bool = False,
              cuts: int | None = None) -> tuple[str, list[Found], int | None] | None:
    """Copy every page the cut at ``x`` is about to zero (x's page and ``pages``) that is not
    all zeros, and the pages the valid records past x span, into a new lost+found entry,
    synced; returns its path, the records and the count of cuts it records, or None when
    there is nothing to keep: no valid record past x, and not ``keep`` (a cut of records
    known durable keeps its pages even when no record in them validates any more).
    ``link`` and ``floor``: records_past.  ``cuts``: the WAL's count of cuts with this one
    (None: the cut is no cut of durable records), recorded so that a recovery rerun after a
    crash counts the cut once.

    The entry is made pending (``CUTTING``) until the caller has zeroed and synced what it
    cuts (``finish``): a recovery that a crash stopped in between finds the same cut, and
    this returns the pending entry instead of making a second one.  The same cut: a pending
    entry at x that holds every record found now (by its CRC) and every byte this cut would
    zero (``_same_cut``); a pending entry at x made before the WAL went on is not."""
    wal_id_lo = int.from_bytes(wal_id[:4], "little")
    found = records_past(x, pages, link, floor, segment, segment_size, wal_id_lo)
    copy = {x - x % PAGE_SIZE} | set(pages)
    for f in found:
        copy.update(range(f.lsn - f.lsn % PAGE_SIZE, f.next_lsn, PAGE_SIZE))
    for pending in reversed(_pending(wal_dir, wal_id, x, x)):   # (the newest first)
        if _same_cut(pending, found, x, copy, segment, segment_size):
            return pending.path, pending.found(), pending.manifest.get("cuts")
    if not found and not (keep and _holds_bytes(x, pages, segment, segment_size)):
        return None
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
                    "records": [[f.lsn, f.next_lsn, f.length, f.crc] for f in found],
                    "cuts": cuts}
        write_synced(os.path.join(target, MANIFEST), json.dumps(manifest, indent=1).encode())
        for directory in (target, os.path.dirname(target), wal_dir):
            sync_directory(directory)
    return target, found, cuts


def _same_cut(entry: SetAside, found: list[Found], x: int, copy: set[int],
              segment: Callable[[int], memoryview | mmap.mmap | None], segment_size: int) -> bool:
    """Whether pending ``entry`` (a cut at x) is the cut at x begun before and stopped: it
    holds each record found now (the same bytes: its CRC), and every byte the cut would zero
    now is zero (its zeroing got that far) or the same as in the entry's copy.  A WAL that
    went on past the stopped cut (another open passed over it) wrote bytes the entry lacks."""
    if not {_key(f) for f in found} <= {_key(f) for f in entry.found()}:
        return False
    for page_lsn in copy:
        seg = segment(page_lsn // segment_size)
        if seg is None:
            continue
        begin = max(page_lsn, x) - page_lsn      # (x's page before x is kept, not zeroed)
        offset = page_lsn % segment_size
        now = np.frombuffer(bytes(seg[offset + begin:offset + PAGE_SIZE]), np.uint8)
        copied = np.frombuffer(entry.page(page_lsn)[begin:], np.uint8)
        if not np.all((now == 0) | (now == copied)):
            return False
    return True


def _key(f: Found) -> tuple[int, int, int, int]:
    return (f.lsn, f.next_lsn, f.length, f.crc)


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


def finish(wal_dir: str, x: int, wal_id: bytes, path: str | None) -> None:
    """The cut at ``x`` has zeroed and synced what it cut (``path``: the entry it made or
    reused, None if none).  First every other pending entry of a cut at or past x is resolved:
    what it holds is now either in ``path``'s entry or gone from the WAL (``_resolve``), so none
    is left pending for a cut that no open will make again.  Then ``path``'s entry is no
    longer pending (after the others: a crash in between leaves it pending, and the next
    recovery, which finds this cut again, resolves them again)."""
    made = None if path is None else _entry_at(path)
    for entry in _pending(wal_dir, wal_id, x, None):
        if made is None or entry.path != made.path:
            _resolve(wal_dir, entry, made)
    if path is not None:
        _unpend(path)


def _resolve(wal_dir: str, entry: SetAside, made: SetAside | None) -> None:
    """A pending entry of a cut at or past one just made (``made``: its entry, if any): removed
    when ``made`` holds every record and every byte it holds (a cut lower, or the same cut,
    that copied the same pages); otherwise the records ``made`` holds are dropped from its
    manifest (a put-back of both would append them twice) and it is finished: the rest (pages
    a stopped cut had zeroed already) is in it alone, and can be put back."""
    theirs = set() if made is None else {_key(f) for f in made.found()}
    mine = entry.found()
    rest = [f for f in mine if _key(f) not in theirs]
    if made is not None and not rest and _bytes_held(entry, made):
        remove(wal_dir, entry.name)
        return
    if len(rest) < len(mine):
        manifest = dict(entry.manifest, records=[list(_key(f)) for f in rest])
        staged = os.path.join(entry.path, MANIFEST + ".new")
        with storage_errors(f"resolving {entry.path}"):
            write_synced(staged, json.dumps(manifest, indent=1).encode(), flags=os.O_TRUNC)
            os.rename(staged, os.path.join(entry.path, MANIFEST))
            sync_directory(entry.path)
    _unpend(entry.path)


def _bytes_held(entry: SetAside, other: SetAside) -> bool:
    """Whether every byte ``entry`` copied that is not zero is in ``other``'s copy too."""
    for page_lsn in entry.manifest["pages"]:
        mine = np.frombuffer(entry.page(page_lsn), np.uint8)
        if not np.all((mine == 0) | (mine == np.frombuffer(other.page(page_lsn), np.uint8))):
            return False
    return True


def _unpend(path: str) -> None:
    with storage_errors(f"finishing {path}"):
        try:
            os.unlink(os.path.join(path, CUTTING))
        except FileNotFoundError:
            pass    # (finished before a crash stopped the rest)
        sync_directory(path)


def _pending(wal_dir: str, wal_id: bytes, low: int, high: int | None) -> list[SetAside]:
    """This WAL's pending entries of cuts from ``low`` up to ``high`` (None: no bound)."""
    return [e for e in entries(wal_dir)
            if e.pending and e.manifest["wal_id"] == wal_id.hex() and e.cut_lsn >= low
            and (high is None or e.cut_lsn <= high)]


def _entry_at(path: str) -> SetAside:
    with open(os.path.join(path, MANIFEST), "rb") as f:
        return SetAside(os.path.basename(path), path, json.loads(f.read()))


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
    """Copy segment file ``segno``, a spare that holds no record (wal/opening.py), into an
    entry of its own, ``<its first LSN, 16 hex>-<time ns>/``, whose manifest lists no
    record, synced; returns the entry's path.  The file stays: the caller replaces it (a
    new file renamed over it), so that a crash at any point leaves a file at its number.
    The copy goes first, then the manifest: a crash between leaves an entry without one,
    which ``entries`` passes over."""
    name = segment_name(segno)
    target = os.path.join(wal_dir, LOST_FOUND_NAME, f"{segno * segment_size:016X}-{time.time_ns()}")
    with storage_errors(f"setting aside {os.path.join(wal_dir, name)} in {target}"):
        os.makedirs(target)
        copy = os.path.join(target, name)
        shutil.copyfile(os.path.join(wal_dir, name), copy)
        with open(copy, "rb") as f:
            os.fsync(f.fileno())
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
        with self._reader() as reader:
            for lsn, *_ in self.manifest["records"]:
                status = reader.read(lsn, -1)[0]
                if status:
                    raise FormatError(f"{self.path}: the record at {format_lsn(lsn)} no longer "
                                      f"reads: {_core.status_text(status)}")
                yield lsn, reader.payload(lsn)

    def found(self) -> list[Found]:
        """The records it holds, each with its CRC (read from the copy for an entry whose
        manifest lists [lsn, next_lsn, length] alone; -1 where it no longer reads)."""
        rows = self.manifest["records"]
        if all(len(r) == 4 for r in rows):
            return [Found(*r) for r in rows]
        with self._reader() as reader:
            return [Found(r[0], r[1], r[2], r[3] if len(r) == 4 else _crc_of(reader, r[0]))
                    for r in rows]

    def page(self, page_lsn: int) -> bytes:
        """Its copy of the page at ``page_lsn`` (zeros where it copied none)."""
        size = self.manifest["segment_size"]
        try:
            fd = os.open(os.path.join(self.path, segment_name(page_lsn // size)), os.O_RDONLY)
        except FileNotFoundError:
            return bytes(PAGE_SIZE)
        try:
            return os.pread(fd, PAGE_SIZE, page_lsn % size).ljust(PAGE_SIZE, b"\0")
        finally:
            os.close(fd)

    @contextmanager
    def _reader(self) -> Iterator[_core.Reader]:
        """A salvage reader over its copies (a record may lie in a page whose header was the
        damage; its CRC is checked)."""
        size = self.manifest["segment_size"]
        wal_id = bytes.fromhex(self.manifest["wal_id"])
        maps: dict[int, mmap.mmap | None] = {}

        def segment(segno: int) -> mmap.mmap | None:
            if segno not in maps:
                path = os.path.join(self.path, segment_name(segno))
                maps[segno] = _map_readonly(path, size) if os.path.exists(path) else None
            return maps[segno]

        reader = _core.Reader(size, int.from_bytes(wal_id[:4], "little"), segment, salvage=True)
        try:
            yield reader
        finally:
            reader.forget()  # (the buffers it keeps between reads: the maps close next)
            del reader
            for m in maps.values():
                if m is not None:
                    m.close()


def _crc_of(reader: _core.Reader, lsn: int) -> int:
    status, _, _, _, _, crc, *_ = reader.read(lsn, -1)
    return -1 if status else crc


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
