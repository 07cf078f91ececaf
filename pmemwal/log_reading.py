"""The read half of a log: entries by index, ranges, batches and terms.

Concern: reading a log's entries through its index, shared by ``pmemwal.Log`` (log.py,
which also writes) and the read-only log (log_readonly.py).  Two hooks say how the
class's WAL is read: ``_in_place(lsn)`` (may entry ``lsn`` be read with one native call, no
flush or check first) and ``_horizon()`` (where an iteration that begins now ends: records
at or past it came after).
"""

from __future__ import annotations

import operator
from itertools import chain
from typing import Iterator, Sequence

import numpy as np

from pmemwal._core import Unchanged
from pmemwal.batch import EntryBatch, entries_of, integer_array
from pmemwal.errors import CorruptionError, LogIndexError, TruncatedError
from pmemwal.log_format import ENTRY_PREFIX, Entry, HardState, entry_of, new_entry
from pmemwal.log_replay import LogReplay, _span
from pmemwal.reading import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_RECORDS

_ENTRIES_AHEAD = 1024                   # entries() reads ahead this many entries, or
_ENTRY_BYTES_AHEAD = 1 << 18            # this many bytes of them, in one native call


class LogReading(LogReplay):
    """The read methods of a log (see the module docstring)."""

    def _in_place(self, lsn: int) -> bool:
        """May the record at ``lsn`` be read and checked in one native call as it stands?"""
        raise NotImplementedError

    def _horizon(self) -> int:
        """The WAL position an iteration that begins now stops before."""
        raise NotImplementedError

    def entry(self, index: int) -> Entry:
        """Entry ``index``; LogIndexError outside [first_index, last_index] (or for what is
        no integer)."""
        if type(index) is not int:
            index = _one_index(index)
        with self._lock:
            wal, ix = self.wal, self._index
            if wal._closed:
                self._check_open()
            h = ix.heap
            if not ix.first <= index < h.first + h.count:
                raise LogIndexError(f"no entry {index}: entries are {_span(ix)}")
            lsn = h.lsn.item(h.start + index - h.first) if index >= h.first \
                else ix.files.lsn_at(index)
            # A durable entry of a WAL of this process alone reads and is checked in one
            # native call; anything else (to flush first, a failed read, a record of another
            # entry, a shared WAL) as WAL.record reads it, and entry_of says what it is.
            if self._in_place(lsn):
                status, _, term, payload = wal._reader.entry(lsn, index, ENTRY_PREFIX)
                if not status:
                    return new_entry((index, term, payload))
            record = self._record(lsn)
        return entry_of(index, record, wal.segment_size)

    def entries_at(self, indices: Sequence[int] | np.ndarray) -> EntryBatch:
        """Entries ``indices`` (any order, repeats allowed), each read and checked as
        ``entry`` does, in one native call without the GIL: an EntryBatch (indices, terms
        and payloads as arrays and one buffer).  LogIndexError for one outside
        [first_index, last_index]."""
        want = _index_array(indices)
        with self._lock:
            self._check_open()
            ix = self._index
            outside = (want < ix.first) | (want >= ix.next)
            if outside.any():
                raise LogIndexError(f"no entry {int(want[outside][0])}: entries are {_span(ix)}")
            records = self._records(ix.lsns_at(want))
        return entries_of(want, records, self.wal.segment_size)

    def __getitem__(self, index: int) -> Entry:
        """``log[i]``: entry ``i``, as ``entry``; a slice is refused (``entries(start, stop)``
        iterates a range without holding it all)."""
        if isinstance(index, slice):
            raise LogIndexError(f"log[{index.start}:{index.stop}]: a Log takes one entry index; "
                                "log.entries(start, stop) iterates a range")
        return self.entry(index)

    def entries(self, start: int | None = None, stop: int | None = None) -> Iterator[Entry]:
        """The entries from ``start`` (None: the first) to before ``stop`` (None: the end)
        there when the iteration begins: entries appended meanwhile are not in it, and one
        it has yet to yield that a compaction, rewind or reset voids meanwhile raises
        LogIndexError (never a voided entry).  Read ahead 1,024 entries (256 KiB) at a time
        (``entry_batches``), so memory and the time the log's lock is held do not follow
        the range; each payload is bytes of its own."""
        return chain.from_iterable(self._entry_runs(start, stop))

    def _entry_runs(self, start: int | None, stop: int | None) -> Iterator[Unchanged[Entry]]:
        """entries()'s entries a run at a time, each a batch's entries handed out in C while
        the index's count of changes is what they were read at; after a run cut short, what
        of the rest the index still names (LogIndexError at the first it does not)."""
        counter = self._index.counter
        for batch, changes, stop in self._batches(start, stop, _ENTRIES_AHEAD,
                                                  _ENTRY_BYTES_AHEAD):
            entries, went = batch.entries(), None
            while entries:
                run = Unchanged(entries, counter, changes)
                yield run
                if run.given == len(entries):
                    break
                entries, batch = entries[run.given:], batch[run.given:]
                changes, named = self._named(int(batch.indices[0]), batch.lsns, stop)
                if named < len(entries):  # the index names others for those from here on
                    went, entries, batch = int(batch.indices[named]), entries[:named], batch[:named]
            if went is not None:
                raise self._went(went)

    def entry_batches(self, start: int | None = None, stop: int | None = None, *,
                      max_entries: int = DEFAULT_BATCH_RECORDS,
                      max_bytes: int = DEFAULT_BATCH_BYTES) -> Iterator[EntryBatch]:
        """The entries ``entries(start, stop)`` gives, as EntryBatches of up to
        ``max_entries`` entries or ``max_bytes`` payload bytes each (a larger entry comes
        alone), each read in one native call without the GIL.  A batch is the entries as
        they were when it was read."""
        for batch, _, _ in self._batches(start, stop, max_entries, max_bytes):
            yield batch

    def _batches(self, start: int | None, stop: int | None, max_entries: int,
                 max_bytes: int) -> Iterator[tuple[EntryBatch, int, int]]:
        """entry_batches's batches, each with the index's count of changes it was checked
        at and the entry the iteration stops before."""
        if max_entries < 1:
            raise ValueError(f"max_entries must be 1 or more, not {max_entries}")
        with self._lock:
            self._check_open()
            ix = self._index
            start = ix.first if start is None else max(start, ix.first)
            stop = ix.next if stop is None else min(stop, ix.next)
            horizon = self._horizon()  # an entry at or past it came after this call
        index = start
        while index < stop:
            lsns, changes = self._entry_lsns(index, min(stop, index + max_entries), horizon)
            batch = self._read_entries(index, lsns, max_bytes)
            with self._lock:  # a rewind, compaction or reset meanwhile: looked at after the
                now = self._index.changes  # read, so none comes between
            if now != changes:
                changes, named = self._named(index, batch.lsns, stop)
                if named == 0:
                    raise self._went(index)
                batch = batch[:named]
            yield batch, changes, stop
            index += len(batch)

    def _read_entries(self, index: int, lsns: np.ndarray, max_bytes: int) -> EntryBatch:
        """Entries ``index``.. at ``lsns``, as far as ``max_bytes`` of records take them (at
        least one); a compaction meanwhile is a LogIndexError, not damage."""
        try:
            records = self._records(lsns, max_bytes, whole=False)
        except (CorruptionError, TruncatedError):  # (a compaction meanwhile: TruncatedError)
            self._check_not_compacted(index)
            raise
        return entries_of(np.arange(index, index + len(records), dtype=np.int64), records,
                          self.wal.segment_size)

    def _named(self, index: int, read: np.ndarray, stop: int) -> tuple[int, int]:
        """The index's count of changes now, and how many of the entries from ``index`` it
        still names at the LSNs they were ``read`` at (0: entry ``index`` went)."""
        with self._lock:
            self._check_open()
            ix = self._index
            if not ix.first <= index < ix.next:
                return ix.changes, 0
            lsns = ix.lsns(index, min(stop, index + len(read), ix.next))  # (any appended since
            changes = ix.changes                       # the iteration began lie past horizon)
        same = lsns == read[:len(lsns)]
        return changes, len(same) if same.all() else int(np.argmin(same))

    def _entry_lsns(self, start: int, stop: int, horizon: int) -> tuple[np.ndarray, int]:
        """Under the lock, the LSNs of up to a chunk of entries from ``start`` to before
        ``stop`` (or the end) for an iteration that began at insert position ``horizon``,
        and the index's count of changes then; LogIndexError when entry ``start`` went."""
        with self._lock:
            self._check_open()
            ix = self._index
            if not ix.first <= start < ix.next:
                raise self._went(start)
            lsns = ix.lsns(start, min(stop, ix.next))
            changes = ix.changes
        later = lsns >= horizon  # voided, and the index appended again since
        if later.any():
            raise self._went(start + int(np.argmax(later)))
        return lsns, changes

    def _check_not_compacted(self, index: int) -> None:
        """LogIndexError if entry ``index``, which an iteration was reading, went in a
        compaction, rewind or reset made since it began: not damage, but no entry there."""
        with self._lock:
            gone = index < self._index.first or index >= self._index.next
        if gone:
            raise self._went(index)

    def _went(self, index: int) -> LogIndexError:
        return LogIndexError(f"entry {index} went while entries() was reading it (a "
                             f"compaction, rewind or reset meanwhile): entries are now "
                             f"{_span(self._index)}")

    def __iter__(self) -> Iterator[Entry]:
        return self.entries()

    def term_at(self, index: int) -> int:
        """The term of entry ``index``, from ``first_index - 1`` (the snapshot's) to the last."""
        with self._lock:
            return self._term_at(index)

    @property
    def first_index(self) -> int:
        """Index of the first entry kept (``last_index + 1`` when the log is empty)."""
        return self._index.first

    @property
    def last_index(self) -> int:
        """Index of the last entry (``first_index - 1`` when the log is empty)."""
        return self._index.next - 1

    @property
    def last_term(self) -> int:
        """Term of the last entry (or of the snapshot, when the log is empty)."""
        return self._last_term

    @property
    def snapshot(self) -> tuple[int, int]:
        """(index, term) of the last compacted entry; (0, 0) before any compaction."""
        return self._snapshot

    @property
    def state(self) -> HardState:
        """The hard state last stored with ``set_state`` (zeros and None before)."""
        return self._state

    def __len__(self) -> int:
        return self._index.count


def _index_array(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """``indices`` as a contiguous int64 array; LogIndexError for one that is no index."""
    try:
        want = integer_array(indices, np.int64)
    except (OverflowError, TypeError, ValueError):
        raise LogIndexError(f"entry indexes are integers: {indices!r}"[:200]) from None
    if want.ndim != 1:
        raise LogIndexError(f"entry indexes: a sequence of integers, not an array of shape "
                            f"{want.shape}")
    return want


def _one_index(index: object) -> int:
    """``index`` as an int (a numpy integer will do); LogIndexError for what is no integer."""
    try:
        return operator.index(index)  # type: ignore[arg-type]
    except TypeError:
        raise LogIndexError(f"an entry index is an integer, not {type(index).__name__} "
                            f"{index!r}") from None
