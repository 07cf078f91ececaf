"""The log layer: numbered entries with terms over one WAL (``pmemwal.Log``).

A replicated state machine or an event store thinks in entries 1, 2, 3..., not
LSNs.  A Log writes four kinds of *log record* into an ordinary WAL, no second file
format (log_format.py: entries, rewinds, snapshots and states).  Open reads the log's durable
index and replays the records after it (log_replay.py).  The WAL stays append-only:
nothing is ever overwritten in place.

Compaction writes its snapshot marker (and, when the latest state record lies
in a segment about to go, that state again), flushes, then lets
``WAL.truncate`` drop the whole segments below the first kept entry; entries
left in the segment that holds it are skipped by the marker on replay.
"""

from __future__ import annotations

import operator
import os
import struct
import threading
from enum import Enum
from itertools import chain
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence, Unpack

import numpy as np

from pmemwal._core import Unchanged
from pmemwal.batch import EntryBatch, entries_of, integer_array
from pmemwal.errors import (ConfigError, CorruptionError, LogIndexError, TermError,
                            TruncatedError, WALError, format_lsn)
from pmemwal.log_format import (ENTRY, ENTRY_PREFIX, HEADER, HEADER_SIZE, KIND_NAMES, MAGIC, MAX_INDEX,
                                MAX_TERM, RESET, REWIND, SNAPSHOT, STATE, VERSION, Entry,
                                HardState, describe, encode_state, entry_of, new_entry,
                                out_of_range)
from pmemwal.log_index import IndexFiles, TieredIndex
from pmemwal.log_replay import LogReplay, _span
from pmemwal.wal import WAL, WALOptions, _weak
from pmemwal.wal.reading import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_RECORDS

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_ENTRIES_AHEAD = 1024                   # entries() reads ahead this many entries, or
_ENTRY_BYTES_AHEAD = 1 << 18            # this many bytes of them, in one native call
_INDEX_TERM = struct.Struct("<qQ")  # an entry's index and term after ENTRY_PREFIX (q: an
                                    # index past MAX_INDEX fails to pack)


class _Keep(Enum):
    """set_state's default for a field: keep its value (a type of its own, for the checker)."""

    KEEP = 0


_KEEP = _Keep.KEEP                          # set_state: leave this field as it is


def open_log(path: str | os.PathLike[str], **wal_options: Unpack[WALOptions]) -> Log:
    """Open (or create) the log in WAL directory ``path``; ``wal_options`` go to pmemwal.open."""
    return Log(path, **wal_options)


class Log(LogReplay):
    """A log of numbered entries, each with a term, over one WAL directory.

    Entries are numbered from 1 (or from where a ``reset`` put the log).  The
    options are ``pmemwal.open``'s; the Log owns its WAL (``log.wal``) and
    closes it.  One writer process; threads may share a Log (its operations
    are serialized by a lock, as the order of indexes must be the order of
    LSNs; an append's sync waits outside it, so threads that append with
    ``sync=True`` at once share flushes).  Nothing is durable until ``sync``
    (or an append with ``sync=True``, or the background writer's periodic
    flush); ``truncate_after``, ``compact``, ``reset`` and ``set_state`` are
    durable when they return.
    """

    def __init__(self, path: str | os.PathLike[str], **wal_options: Unpack[WALOptions]) -> None:
        self._lock = threading.Lock()
        self._closing = False                   # close has begun: the writer waits no more
        self._deferred_round = None             # an index round waiting its turn (a thread)
        self._snapshot = (0, 0)                 # (index, term) of the last compacted entry
        self._state = HardState()
        self._state_record = None
        self._state_lsn = 0
        self._last_term = 0                     # the last entry's (or snapshot's) term
        self._known = False                     # has any record fixed the numbering yet?
        self._index_lock = threading.Lock()     # one index checkpoint written at a time
        self._index_state = None                # the last one written or read
        self.replayed_from: int | None = None   # where open replayed from (None: everything)
        self.index_error: WALError | OSError | None = None  # the last background one failed so
        if wal_options.get("shared"):
            raise ConfigError("a Log has one writer process (its index numbers the entries "
                              "as this process appends them): shared=True is the WAL's")
        self.wal = WAL(path, **wal_options)
        self._files = IndexFiles(self.wal.path, self.wal.wal_id)
        self._index = TieredIndex(self._files)
        try:
            self.replayed_from = self._load_index()
            self._replay(self.replayed_from)
        except BaseException:
            self._files.close()
            self.wal.close()
            raise
        self.wal.add_checkpoint_listener(_weak(self, "_background_index_checkpoint"))


    def append(self, payload: ReadableBuffer, term: int = 0, *, sync: bool = False) -> int:
        """Append one entry (any bytes-like payload) with ``term``; returns its index.

        ``sync=True`` makes it durable before returning.  A term below the last
        entry's raises TermError.
        """
        with self._lock:  # the WAL raises ClosedError once closed
            ix = self._index
            index = ix.next
            try:  # (free on the hot path: a term or an index beyond the format fails to pack)
                if term < self._last_term:
                    raise TermError(f"term {term} is below the last entry's term "
                                    f"{self._last_term}")
                head = ENTRY_PREFIX + _INDEX_TERM.pack(index, term)
            except (struct.error, TypeError):  # (TypeError: a term "2" met the comparison)
                raise out_of_range(index, term) from None
            lsn = self.wal.append_prefixed(head, payload)
            ix.push(lsn, term)
            self._last_term, self._known = term, True
        if sync:  # outside the lock: threads appending at once share flushes (group commit)
            self.wal.flush(lsn)
        return index

    def append_many(self, payloads: Iterable[ReadableBuffer], term: int = 0, *,
                    sync: bool = False) -> np.ndarray:
        """Append entries in one native call; returns their indexes (int64)."""
        with self._lock:
            self._check_open()
            first = self._index.next
            try:
                if term < self._last_term:
                    raise TermError(f"term {term} is below the last entry's term "
                                    f"{self._last_term}")
            except TypeError:  # (a term "2")
                raise out_of_range(first, term) from None
            try:
                records = [b"".join((ENTRY_PREFIX, _INDEX_TERM.pack(first + i, term), p))
                           for i, p in enumerate(payloads)]
            except struct.error:
                raise out_of_range(MAX_INDEX + 1, term) from None  # (the first that fails)
            if not records:
                return np.empty(0, np.int64)
            lsns = self.wal.append_many(records)
            self._index.extend(lsns, np.full(len(lsns), term, np.uint64))
            self._last_term, self._known = term, True
        if sync:
            self.wal.flush(int(lsns[-1]))
        return np.arange(first, first + len(records), dtype=np.int64)

    def sync(self, index: int | None = None) -> None:
        """Make every entry up to ``index`` (None: everything appended) durable."""
        with self._lock:
            self._check_open()
            ix = self._index
            if index is not None and index >= ix.next:
                raise LogIndexError(f"sync({index}): the last entry is {ix.next - 1}")
            if index is None:
                index = ix.next - 1
            if index < ix.first:
                return  # compacted (made durable by compact()), or nothing appended
            lsn = ix.lsn_at(index)
        self.wal.flush(lsn)  # outside the lock, as append's: threads syncing at once share it

    def truncate_after(self, index: int) -> None:
        """Void every entry above ``index``; the next append gets ``index + 1``.  Durable on return.

        ``index`` may be ``first_index - 1`` (void them all), not lower, nor above the end.
        """
        with self._lock:
            self._check_open()
            ix = self._index
            if not ix.first - 1 <= index <= ix.next - 1:
                raise LogIndexError(f"truncate_after({index}): entries are {_span(ix)}, and "
                                    f"{ix.first - 1} is the lowest index the log can keep to")
            if index == ix.next - 1:
                return
            self.wal.append(HEADER.pack(MAGIC, VERSION, REWIND, 0, index, 0), True)
            ix.keep_through(index)
            self._last_term, self._known = self._term_at(index), True

    def compact(self, before_index: int) -> int:
        """Drop the entries below ``before_index``: ``first_index`` becomes ``before_index``,
        and whole WAL segments holding only dropped entries go (``WAL.truncate``).

        ``term_at(before_index - 1)`` still answers (a snapshot marker keeps it).  May be
        ``last_index + 1`` (drop everything), not more.  Durable on return; returns how many
        segments went.
        """
        with self._lock:
            self._check_open()
            ix = self._index
            if before_index > ix.next:
                raise LogIndexError(f"compact({before_index}): beyond the end, entries are "
                                    f"{_span(ix)}")
            if before_index <= ix.first:
                return 0
            keep_lsn = ix.lsn_at(before_index) if before_index < ix.next else None
            return self._write_snapshot(before_index - 1, self._term_at(before_index - 1),
                                        False, keep_lsn)

    def reset(self, index: int, term: int) -> int:
        """Drop every entry: the log goes on at ``index + 1``, and ``term_at(index)`` is
        ``term``, as when a Raft follower installs a leader's snapshot.  Durable on return;
        returns how many segments went."""
        with self._lock:
            self._check_open()
            try:
                term, index = operator.index(term), operator.index(index)
            except TypeError:  # (2.0 compared fine, then failed to pack: struct.error)
                raise out_of_range(index, term) from None
            if not 0 <= term <= MAX_TERM:
                raise out_of_range(index, term)
            if not 0 <= index < MAX_INDEX:  # (the next entry's index must fit too)
                raise LogIndexError(f"reset({index}, {term}): the index is 0..2**63-2, so "
                                    "that the next entry's fits")
            return self._write_snapshot(index, term, True, None)

    def _write_snapshot(self, index: int, term: int, reset: bool, keep_lsn: int | None) -> int:
        """Append a snapshot marker (and the state again when its record would go), flush,
        then drop the segments below ``keep_lsn`` (None: below the marker)."""
        records = [HEADER.pack(MAGIC, VERSION, SNAPSHOT, RESET if reset else 0, index, term)]
        cut = keep_lsn if keep_lsn is not None else self.wal.insert_lsn
        restate = self._state_record if self._state_lsn < cut else None  # None: it stays
        if restate is not None:
            records.append(restate)
        lsns = self.wal.append_many(records)
        self.wal.flush()
        if reset:
            self._index.restart(index + 1)
        else:
            self._index.drop_through(index)
        self._snapshot = (index, term)
        self._last_term = self._term_at(self._index.next - 1)
        if restate is not None:
            self._state_lsn = int(lsns[1])
        self._known = True
        # the index first: one naming an older replay point would need the segments that go
        self._store_index(self._capture())
        return self.wal.truncate(keep_lsn if keep_lsn is not None else int(lsns[0]))

    def set_state(self, *, term: int | _Keep = _KEEP,
                  vote: int | str | bytes | None | _Keep = _KEEP,
                  commit: int | _Keep = _KEEP) -> HardState:
        """Store the hard state durably (the fields not given keep their values); returns it.

        ``vote`` may be None, an int, a str or bytes.  A term lower than the stored one
        raises TermError.
        """
        with self._lock:
            self._check_open()
            old = self._state
            new = HardState(old.term if term is _KEEP else int(term),
                            old.vote if vote is _KEEP else vote,
                            old.commit if commit is _KEEP else int(commit))
            if new.term < old.term:
                raise TermError(f"set_state(term={new.term}): the current term is {old.term}")
            if new.term > MAX_TERM:
                raise out_of_range(0, new.term)
            if not 0 <= new.commit <= MAX_INDEX:
                raise LogIndexError(f"set_state(commit={new.commit}): an entry index, "
                                    "0..2**63-1")
            record = encode_state(new)
            self._state_lsn = self.wal.append(record, True)
            self._state, self._state_record = new, record
            return new

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
            if lsn < wal._core.flushed_lsn and wal._control is None:
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
            horizon = self.wal.insert_lsn  # an entry at or past it came after this call
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

    def close(self) -> None:
        """Flush what was appended, store the index and close the WAL; closing twice is fine."""
        self._closing = True  # (before the lock: a background index checkpoint waiting gives up)
        with self._lock:
            try:
                if not self.wal.closed:
                    self._store_index(self._capture())
            except (WALError, OSError):
                pass  # a stopped writer, a full disk: the next open replays more
            finally:
                self.wal.close()
                self._end_index_rounds()
                self._files.close()

    @property
    def closed(self) -> bool:
        return self.wal.closed

    def stats(self) -> dict[str, int]:
        """The WAL's counters (``WAL.stats``) with ``entries``, ``first_index``, ``last_index``."""
        return {**self.wal.stats(), "entries": len(self), "first_index": self.first_index,
                "last_index": self.last_index}

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"entries {_span(self._index)}"
        return f"<pmemwal.Log {self.wal.path} {state}>"


__all__ = ["Log", "open_log", "Entry", "HardState", "describe", "KIND_NAMES", "HEADER",
           "HEADER_SIZE", "MAGIC", "VERSION", "ENTRY", "REWIND", "SNAPSHOT", "STATE", "RESET"]


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
