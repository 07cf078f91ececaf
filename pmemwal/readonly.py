"""A WAL opened for reading only: ``pmemwal.open(path, readonly=True)``.

It takes no lock, writes nothing and recovers nothing, so it opens beside a live writer (in
either mode, shared or not) or on a WAL nobody has open, and never holds a writer up.  It
reads what is durable, and no further:

- up to the durable LSN the writers publish in the FOLLOW file after every flush
  (pmemwal/follow_file.py), while a writer has the WAL open (its lock on ``LOCK`` is held),
  or when the last one opened it in this boot of the machine: after a SIGKILL the value it
  left is exact, and a direct-mode writer's unflushed records, readable in the page cache,
  are not durable (a power loss would take them);
- otherwise (a reboot since, or no FOLLOW file: a WAL written by an older version) up to
  where the chain of records ends, followed from the last checkpoint: everything on the
  device survived, and it is what the next writer's recovery keeps.  A writer that comes in
  while the chain is followed bounds it by what it publishes.

Segments are mapped read-only as the reader needs them.  A truncation by the writer raises
the oldest segment in the FOLLOW file before it removes or recycles a file; every copy a read
makes is checked against it afterwards (``_check_copied``), so a read that raced a
truncation raises TruncatedError rather than hand back another segment's bytes.
"""

from __future__ import annotations

import errno
import mmap
import operator
import os
from collections import OrderedDict

from pmemwal import _core
from pmemwal._core import Record
from pmemwal.checkpoint import read_any
from pmemwal.errors import (ClosedError, FormatError, NotFoundError, ReadOnlyError, TruncatedError,
                            format_lsn)
from pmemwal.follow_file import FollowFile
from pmemwal.format import HEADER_SIZE, SegmentHeader, first_lsn, parse_segment_name, segment_name
from pmemwal.segments import RESTORING_NAME, storage_errors, writer_open
from pmemwal.reading import Reading

_MAPPED = 16  # segments kept mapped at once (the reader keeps 8 of them between calls)


def identity(path: str) -> tuple[int, bytes, int]:
    """(oldest segment number, WAL id, segment size) of the WAL in directory ``path``, from its
    oldest segment's header; NotFoundError without a segment, FormatError for a bad one."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        raise NotFoundError(errno.ENOENT, "no WAL directory", path) from None
    if RESTORING_NAME in names:
        raise FormatError(f"{path} is a restore cut short ({RESTORING_NAME} is there): run the "
                          "restore again, which starts over")
    segnos = sorted(n for n in map(parse_segment_name, names) if n is not None)
    for segno in segnos:
        name = os.path.join(path, segment_name(segno))
        try:
            with open(name, "rb") as f:
                data = f.read(HEADER_SIZE)
        except FileNotFoundError:
            continue  # truncated since the listing
        header = SegmentHeader.unpack(data, name)
        return segno, header.wal_id, header.segment_size
    raise NotFoundError(errno.ENOENT, "no WAL here (no segment file)", path)


class ReadOnlyWAL(Reading):
    """The WAL in directory ``path``, for reading (see the module docstring).

    The read methods are the writer's: ``records``, ``scan``, ``record``, ``read_many``,
    ``record_heads``.  ``flushed_lsn`` is the durable end, looked up again by each read
    (and by ``refresh``).  Appending, flushing and truncating raise ReadOnlyError.
    """

    mode = "readonly"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.path.abspath(os.fspath(path))
        self._closed = True
        self._maps: OrderedDict[int, mmap.mmap] = OrderedDict()
        oldest, self.wal_id, self.segment_size = identity(self._path)
        self._listed_oldest = oldest
        self._damage_read = False
        self._reader = _core.Reader(self.segment_size, int.from_bytes(self.wal_id[:4], "little"),
                                    self._segment_buffer)
        self._follow: FollowFile | None = None
        self._scanned: tuple[int, int, int] | None = None  # the chain followed: (end, last
        # LSN, the writers' generation then)
        self._closed = False
        try:
            self._end = self._find_end()
        except BaseException:
            self.close()
            raise

    # -- where reads end --

    def _find_end(self) -> int:
        """The durable end now (see the module docstring)."""
        follow = self._follow_file()
        if follow is not None and (follow.this_boot or writer_open(self._path)):
            return follow.durable_lsn
        generation = follow.generation if follow is not None else 0
        end = self._chain_end()
        follow = self._follow_file()
        if follow is not None and (writer_open(self._path) or follow.generation != generation):
            end = min(end, follow.durable_lsn)  # a writer came in: its recovery decides
        return end

    def _follow_file(self) -> FollowFile | None:
        """The FOLLOW file, looked for again until there is one (a writer or a follower
        makes it)."""
        if self._follow is None:
            self._follow = FollowFile.open(self._path, self.wal_id, self.segment_size)
        return self._follow

    def _chain_end(self) -> int:
        """Where the chain of records ends, followed from the last checkpoint (or from where
        the previous call stopped, if no writer opened the WAL since: its recovery may have
        cut the chain)."""
        generation = self._follow.generation if self._follow is not None else 0
        if self._scanned is None or self._scanned[2] != generation or \
                self._scanned[0] // self.segment_size < self._oldest_segment():
            self._scanned = (*self._chain_start(), generation)
        start, prev, _ = self._scanned
        status, end, last, *_ = self._reader.scan(start, prev, 2**63, True)
        self._drop_truncated()
        self._scanned = (end, last or prev, generation)
        return end

    def _chain_start(self) -> tuple[int, int]:
        oldest = self._oldest_segment()
        found = read_any(self._path)
        if found is not None and found[0] == self.wal_id:
            cp = found[2]
            if cp.end_lsn // self.segment_size >= oldest and cp.last_lsn:
                return cp.end_lsn, cp.last_lsn
        status, lsn = self._reader.first_record(oldest)
        return (lsn, -1) if not status else (first_lsn(oldest, self.segment_size), -1)

    def refresh(self) -> int:
        """Look up the durable end again; returns it."""
        self._check_open()
        self._end = self._find_end()
        return self._end

    @property
    def flushed_lsn(self) -> int:
        """Every record below this LSN is durable and may be read."""
        return self.refresh()

    # -- the reading hooks (pmemwal/reading.py) --

    def _read_end(self) -> int:
        return self.refresh()

    def _readable_end(self) -> int:
        return self._end

    def _reach(self, lsn: int) -> None:
        if lsn >= self._end and self.refresh() <= lsn:
            raise ValueError(f"no durable record at LSN {format_lsn(lsn)}: the WAL is "
                             f"durable up to {format_lsn(self._end)}")

    def _oldest_segment(self) -> int:
        published = self._follow.oldest_segno if self._follow is not None else 0
        return max(self._listed_oldest, published)

    def _drop_truncated(self) -> None:
        """Let go of the mappings of segments a truncation took."""
        oldest = self._oldest_segment()
        if self._maps and next(iter(self._maps)) < oldest:
            self._reader.forget()
            for segno in [n for n in self._maps if n < oldest]:
                _close(self._maps.pop(segno))

    def _check_copied(self, lsn: int) -> None:
        """TruncatedError when a truncation took ``lsn``'s segment before what was read from
        it was copied (the writer raises the oldest segment before touching the file)."""
        if lsn // self.segment_size < self._oldest_segment():
            raise TruncatedError(lsn, first_lsn(self._oldest_segment(), self.segment_size))

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the WAL is closed")

    def _segment_buffer(self, segno: int) -> mmap.mmap | None:
        """The native reader's getter: segment ``segno`` mapped read-only, or None."""
        seg_map = self._maps.get(segno)
        if seg_map is not None:
            self._maps.move_to_end(segno)
            return seg_map
        if self._closed:
            return None
        name = os.path.join(self._path, segment_name(segno))
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size < self.segment_size:
                return None  # (being made: not part of what is durable)
            with storage_errors(f"mapping {name}"):
                seg_map = mmap.mmap(fd, self.segment_size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self._maps[segno] = seg_map
        if len(self._maps) > _MAPPED:  # (one the reader keeps stays mapped until it lets go)
            _close(self._maps.popitem(last=False)[1])
        return seg_map

    # -- reads --

    def record(self, lsn: int) -> Record:
        """The durable record at ``lsn``: ValueError if none starts there (or it is not
        durable yet), CorruptionError if it is damaged, TruncatedError if a truncation took
        it."""
        self._check_open()
        try:
            lsn = operator.index(lsn)
            self._reach(lsn)
            status, _, record = self._reader.record(lsn)
        except OverflowError:
            raise ValueError(f"no record at LSN {lsn}: LSNs are 0..2**64-1") from None
        if status:
            raise self._record_error(lsn, status)
        self._check_copied(lsn)
        return record  # type: ignore[return-value]  # (a record when status is 0)

    @property
    def first_lsn(self) -> int:
        """LSN of the first usable byte of the oldest segment."""
        return first_lsn(self._oldest_segment(), self.segment_size)

    @property
    def path(self) -> str:
        return self._path

    @property
    def writer_alive(self) -> bool:
        """Whether a writer has the WAL open now."""
        return writer_open(self._path)

    # -- what a reader may not do --

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise ReadOnlyError(f"{self._path} was opened with readonly=True: it reads what writers "
                            "made durable, and writes nothing")

    append = append_prefixed = append_many = flush = truncate = checkpoint = _refuse

    # -- life --

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader.forget()
        for seg_map in self._maps.values():
            _close(seg_map)
        self._maps.clear()
        if self._follow is not None:
            self._follow.close()

    def __enter__(self) -> ReadOnlyWAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"durable to {format_lsn(self._end)}"
        return f"<pmemwal.ReadOnlyWAL {self._path} {state}>"


def _close(seg_map: mmap.mmap) -> None:
    try:
        seg_map.close()
    except BufferError:
        pass  # a read's buffer still holds it: unmapped when that goes

