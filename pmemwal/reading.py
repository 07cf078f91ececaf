"""Reading: the records of a WAL, one at a time or in batches, by the native reader.

Concern: the read methods a writing WAL (api.py) and a read-only one (pmemwal/readonly.py)
share.  Each class says where its reads end and how a record becomes readable through three
hooks: ``_read_end`` (a writer flushes what was appended; a reader takes what the writers
published as durable), ``_readable_end`` and ``_reach``; and which segments a truncation
took (``_oldest_segment``, ``_drop_truncated``, ``_check_copied``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from pmemwal import _core
from pmemwal._core import Record
from pmemwal.batch import RecordBatch, concat, integer_array
from pmemwal.errors import CorruptionError, TruncatedError, format_lsn, repair_hint
from pmemwal.format import first_lsn

if TYPE_CHECKING:
    from pmemwal import _core as native

_BAD_POSITION = 2  # wal_status: WAL_BAD_POSITION, not a record's position (native/wal_reader.h)
_VOID_RECORD = 9   # wal_status: WAL_VOID_RECORD, a void range where a record was asked for
_RECORDS_PER_CALL = 1024        # records() reads ahead this many records, or
_RECORD_BYTES_PER_CALL = 1 << 18  # this many payload bytes, in one native call
DEFAULT_BATCH_RECORDS = 1 << 16
DEFAULT_BATCH_BYTES = 1 << 20


class Reading:
    """The read methods (see the module docstring); the class that takes them on has a
    ``_reader`` and the hooks."""

    _reader: native.Reader
    segment_size: int
    _damage_read: bool

    if TYPE_CHECKING:  # the hooks, which the class that takes these methods on defines
        @property
        def path(self) -> str: ...
        def _check_open(self) -> None: ...
        def _read_end(self) -> int: ...
        def _readable_end(self) -> int: ...
        def _reach(self, lsn: int) -> None: ...
        def _oldest_segment(self) -> int: ...
        def _drop_truncated(self) -> None: ...
        def _check_copied(self, lsn: int) -> None: ...

    def records(self, start: int | None = None) -> Iterator[Record]:
        """The records from ``start`` (a record's LSN; None: the oldest) to the end.

        What was appended before the call is flushed first, then read back
        (once an error stopped the writer: what had been flushed), a batch of
        records at a time in native code.  Each payload is a read-only memoryview
        of the record's own copy, validated as it was copied.  CorruptionError
        where a record is damaged; TruncatedError where a truncation took the
        records asked for, before or while they are read; ValueError when
        ``start`` is not a record's LSN.  ``scan`` reads the same records as arrays.
        """
        bounds = self._read_bounds(start)
        if bounds is None:
            return
        lsn, end = bounds
        prev = -1
        while lsn < end:
            status, lsn, last, _, records = self._reader.records(
                lsn, prev, end, _RECORDS_PER_CALL, _RECORD_BYTES_PER_CALL)
            if records:
                self._check_copied(records[0].lsn)
            yield from records
            if status:
                raise self._read_error(lsn, status, start is not None and prev == -1 and not last)
            prev = last or prev

    def scan(self, start: int | None = None, *, max_records: int = DEFAULT_BATCH_RECORDS,
             max_bytes: int = DEFAULT_BATCH_BYTES) -> Iterator[RecordBatch]:
        """The records ``records(start)`` gives, as RecordBatches (arrays of LSNs, prev-links,
        lengths and offsets, and the payloads in one buffer) of up to ``max_records``
        records or ``max_bytes`` payload bytes each (a larger record comes alone), each
        read in one native call without the GIL.  Errors as ``records``: the records
        before a failing one come in a batch first."""
        bounds = self._read_bounds(start)
        if bounds is None:
            return
        lsn, end = bounds
        prev = -1
        while lsn < end:
            status, lsn, last, _, arrays = self._reader.fill(lsn, prev, end, max_records,
                                                             max_bytes)
            batch = RecordBatch.from_native(arrays)
            if len(batch):
                self._check_copied(int(batch.lsns[0]))
                yield batch
            if status:
                raise self._read_error(lsn, status, start is not None and prev == -1 and not last)
            prev = last or prev

    def read_many(self, lsns: Sequence[int] | np.ndarray, *,
                  max_bytes: int = DEFAULT_BATCH_BYTES) -> RecordBatch:
        """The records at ``lsns`` (records whose appends have returned), in that order, as
        one RecordBatch, read in native calls of up to ``max_bytes`` payload bytes each
        without the GIL.  Errors as ``record`` gives them, for the first LSN that fails."""
        self._check_open()
        batch, failed = self._fetch(_lsn_array(lsns), max_bytes)
        if failed is not None:
            raise self._record_error(*failed)
        return batch

    def _fetch(self, want: np.ndarray, max_bytes: int = DEFAULT_BATCH_BYTES, whole: bool = True
               ) -> tuple[RecordBatch, tuple[int, int] | None]:
        """The records at ``want`` (uint64), flushed first where they are not yet (all of
        them, or when not ``whole`` as many as one native call of ``max_bytes`` reads), and
        (LSN, status) of the first one that did not read (None: all did)."""
        if len(want):
            self._reach(int(want.max()))
        parts, done = [], 0
        while done < len(want):
            status, n, _, arrays = self._reader.fetch(want[done:], max_bytes)
            if n:
                parts.append(RecordBatch.from_native(arrays))
            done += n
            if status:
                return concat(parts), (int(want[done]), status)
            if not whole:
                want = want[:done]
                break
            max_bytes = min(2 * max(max_bytes, 1 << 16), 1 << 30)  # (few parts to join)
        if len(want):
            self._check_copied(int(want.min()))
        return concat(parts), None

    def _read_bounds(self, start: int | None) -> tuple[int, int] | None:
        """(first LSN, end) of a read from ``start`` (None: the oldest record), after
        flushing what was appended (once the writer stopped: up to what had been flushed);
        None when there is no record to start from.  CorruptionError when the oldest
        segment has records up to the end but its first record cannot be found."""
        self._check_open()
        end = self._read_end()
        while start is None:
            self._drop_truncated()
            segno = self._oldest_segment()
            if first_lsn(segno, self.segment_size) >= end:
                return None  # nothing written in it yet: an empty WAL
            status, found = self._reader.first_record(segno)
            if not status:
                return found, end
            if found >= end:  # a record from a truncated segment ends where the WAL ends
                return None
            if segno == self._oldest_segment():  # (else a truncation took it meanwhile)
                raise self._damaged(found, f"the oldest segment's first record: "
                                           f"{_core.status_text(status)}")
        return start, end

    def _read_error(self, lsn: int, status: int, asked: bool) -> Exception:
        """The error for a read at ``lsn`` that failed with ``status``: TruncatedError when a
        truncation took its segment; ValueError when ``asked`` (the caller named ``lsn``)
        and no record starts there; CorruptionError otherwise (a record starts there, or
        damage before it hides whether one does)."""
        truncated = self._truncated(lsn)
        if truncated is not None:
            return truncated
        reason = _core.status_text(status)
        no_record = asked and not self._may_start_record(lsn, status)
        # A truncation that lands after the check above makes the lookups fail too: what
        # looks like damage (or no record) may be the segment gone meanwhile.
        truncated = self._truncated(lsn)
        if truncated is not None:
            return truncated
        if no_record:
            return ValueError(f"no record at LSN {format_lsn(lsn)}: {reason}")
        return self._damaged(lsn, reason)

    def _truncated(self, lsn: int) -> TruncatedError | None:
        """TruncatedError when a truncation took ``lsn``'s segment, else None."""
        self._drop_truncated()
        oldest = self._oldest_segment()
        if lsn // self.segment_size < oldest:
            return TruncatedError(lsn, first_lsn(oldest, self.segment_size))
        return None

    def _may_start_record(self, lsn: int, status: int) -> bool:
        """Whether a record the reader could not read may start at ``lsn``: it is a valid
        position below the flushed LSN, and following the record headers from the first
        record of its segment either reaches it or stops at damage first."""
        if status == _BAD_POSITION or lsn >= self._readable_end():
            return False
        failed, first = self._reader.first_record(lsn // self.segment_size)
        if failed:  # (first: where the lookup failed)
            # At or past the flushed end: the segment is all one record's continuation up
            # to where the WAL ends (the page after it is not written yet); else damage
            # before lsn hides whether a record starts there.
            return first < self._readable_end()
        if first > lsn:
            return False  # lsn lies in a record that began in an earlier segment
        failed, end, *_ = self._reader.scan(first, -1, lsn, False)
        return failed != 0 or end == lsn

    def _record_error(self, lsn: int, status: int) -> Exception:
        """The error of a read of the record at ``lsn``, which the caller named."""
        if status == _VOID_RECORD:
            return ValueError(f"no record at LSN {format_lsn(lsn)}: a void range (its writer "
                              "died before finishing it)")
        return self._read_error(lsn, status, True)

    def record_heads(self, head_bytes: int, start: int | None = None,
                     batch: int = 1 << 16) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The records from ``start`` (None: the oldest) to the end, in batches, as arrays:
        LSNs (uint64), payload lengths (uint32) and each payload's first ``head_bytes`` bytes
        (a uint8 array of shape (n, head_bytes), zero-filled past a shorter payload).

        Each record is validated as ``records()`` does, in one native call per batch: what
        an index over the records' own headers is built from (pmemwal.log), and a
        failed read raises as ``records()`` does.
        """
        prev = -1
        bounds = self._read_bounds(start)
        if bounds is None:
            return
        lsn, end = bounds
        while lsn < end:
            status, lsn, last, lsns, lengths, heads = self._reader.heads(lsn, prev, end, head_bytes,
                                                                         batch)
            if lsns:
                yield (np.frombuffer(lsns, np.uint64), np.frombuffer(lengths, np.uint32),
                       np.frombuffer(heads, np.uint8).reshape(-1, head_bytes))
            if last:  # where the chain stands, void records included
                prev = last
            if status:
                raise self._read_error(lsn, status, False)

    def _damaged(self, lsn: int, reason: str) -> CorruptionError:
        """The error of a read that found damage at ``lsn``, noted for close."""
        self._damage_read = True
        return CorruptionError(lsn, lsn // self.segment_size,
                               f"{reason}; {repair_hint(self.path)}")


def _lsn_array(lsns: Sequence[int] | np.ndarray) -> np.ndarray:
    """``lsns`` as a contiguous uint64 array; ValueError for one that is no LSN."""
    try:
        want = integer_array(lsns, np.uint64)
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"LSNs are integers from 0 to 2**64 - 1: {lsns!r}"[:200]) from None
    if want.ndim != 1:
        raise ValueError(f"LSNs: a sequence of integers, not an array of shape {want.shape}")
    return want
