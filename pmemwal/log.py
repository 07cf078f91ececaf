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
from enum import Enum
from typing import TYPE_CHECKING, Iterable, Literal, Unpack, overload

import numpy as np

from pmemwal.errors import ConfigError, LogIndexError, TermError, WALError
from pmemwal.log_format import (ENTRY, ENTRY_PREFIX, HEADER, HEADER_SIZE, KIND_NAMES, MAGIC, MAX_INDEX,
                                MAX_TERM, RESET, REWIND, SNAPSHOT, STATE, VERSION, Entry,
                                HardState, describe, encode_state, out_of_range)
from pmemwal.log_index import IndexFiles, TieredIndex
from pmemwal.log_reading import LogReading
from pmemwal.log_replay import _span
from pmemwal.wal import WAL, WALOptions, _weak

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from pmemwal.log_readonly import ReadOnlyLog

_INDEX_TERM = struct.Struct("<qQ")  # an entry's index and term after ENTRY_PREFIX (q: an
                                    # index past MAX_INDEX fails to pack)


class _Keep(Enum):
    """set_state's default for a field: keep its value (a type of its own, for the checker)."""

    KEEP = 0


_KEEP = _Keep.KEEP                          # set_state: leave this field as it is


@overload
def open_log(path: str | os.PathLike[str], *, readonly: Literal[True]) -> ReadOnlyLog: ...


@overload
def open_log(path: str | os.PathLike[str], *, readonly: Literal[False] = False,
             **wal_options: Unpack[WALOptions]) -> Log: ...


def open_log(path: str | os.PathLike[str], *, readonly: bool = False,
             **wal_options: Unpack[WALOptions]) -> Log | ReadOnlyLog:
    """Open (or create) the log in WAL directory ``path``; ``wal_options`` go to pmemwal.open.

    ``readonly=True`` opens it for reading only, with no other option: no lock, nothing
    written, beside a live writer or none (``pmemwal.log_readonly.ReadOnlyLog``)."""
    if readonly:
        if wal_options:
            raise ConfigError(f"open_log(readonly=True) takes no other option: "
                              f"{', '.join(wal_options)}")
        from pmemwal.log_readonly import ReadOnlyLog
        return ReadOnlyLog(path)
    return Log(path, **wal_options)


class Log(LogReading):
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
        self._init_state()
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

    def _in_place(self, lsn: int) -> bool:
        # durable, and a WAL of this process alone: nothing to flush, nobody else's writes
        return lsn < self.wal._core.flushed_lsn and self.wal._control is None

    def _horizon(self) -> int:
        return self.wal.insert_lsn

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


