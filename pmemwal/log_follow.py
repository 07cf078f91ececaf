"""Following a live Log from another process: ``pmemwal.follow_log(path)``.

A log follower yields the Log's entries in index order as they become durable, and blocks
for the next, over the WAL follower (pmemwal/follow.py), whose batches of records it decodes
(the log records' headers in one native call per batch, the entries of a run made in
another, as ``Log.entry_batches`` makes them).  What changes entries already yielded comes
as an event of its own, in the place the writer made it: ``Rewound(index)`` (the entries
after ``index`` are void; the next entry is ``index + 1`` again), ``Compacted(before_index)``
(the entries below it are gone from the log) and ``Reset(index, term)`` (every entry is
gone; the log goes on at ``index + 1``).  State records (``Log.set_state``) are skipped.

Where it starts: from an entry index, it first gives the entries the log holds from there
(read through a read-only log: a rewound entry's new version, never the voided one, and no
event for what happened before), then what comes.  A named follower with a stored position
resumes after the last record it confirmed, and gives everything after it, events included.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Iterator, Union

import numpy as np

from pmemwal._core import Record, Unchanged
from pmemwal._core import entries as make_entries
from pmemwal._core import heads as payload_heads
from pmemwal.batch import RecordBatch
from pmemwal.errors import FormatError, LogIndexError, format_lsn
from pmemwal.follow import Follower, followers
from pmemwal.log_format import (ENTRY, ENTRY_PREFIX, HEADER, HEADER_DTYPE, HEADER_SIZE, MAGIC,
                                RESET, REWIND, SNAPSHOT, STATE, VERSION, Entry, check_headers,
                                new_entry)
from pmemwal.log_readonly import ReadOnlyLog
from pmemwal.log_replay import _span
from pmemwal.reading import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_RECORDS

_FEW = 32                           # at most this many records, within _FEW_BYTES of
_FEW_BYTES = 2048                   # the durable end, are read and decoded one at a time
_PEEK = 64                          # records looked at to tell a resumed follower's next entry
_INDEX_TERM = struct.Struct("<QQ")  # an entry's index and term, after ENTRY_PREFIX
_NEVER = np.zeros(1, np.uint64)     # a count of changes that never moves (Unchanged's)


@dataclass(frozen=True)
class Rewound:
    """The entries after ``index`` are void (``Log.truncate_after``): the next entry is
    ``index + 1`` again."""

    index: int


@dataclass(frozen=True)
class Compacted:
    """The entries below ``before_index`` left the log (``Log.compact``)."""

    before_index: int


@dataclass(frozen=True)
class Reset:
    """Every entry left the log, which goes on at ``index + 1`` with ``term_at(index) ==
    term`` (``Log.reset``)."""

    index: int
    term: int


LogEvent = Union[Entry, Rewound, Compacted, Reset]


class LogFollower:
    """The entries of a Log, and its rewinds, compactions and resets, as they become durable
    (see the module docstring).  An iterator: a loop left early goes on where it stopped.

    ``position``: the index of the next entry.  ``confirm()``: store a named follower's
    position (after the last item yielded).  A context manager.
    """

    def __init__(self, path: str | os.PathLike[str], start: int | None = None, *,
                 name: str | None = None, timeout: float | None = None) -> None:
        self._catch_up: tuple[ReadOnlyLog, int, int] | None = None  # (log, its end, last)
        self._batch: list[Record] | RecordBatch | None = None  # what is handed out, the
        self._after = 0                         # position after it
        self._cursor = 0                        # its records handed out (or skipped)
        self._run: tuple[Unchanged[Entry], int, int] | None = None  # (run, record, index)
        self._gen: Iterator[LogEvent] | None = None
        log = ReadOnlyLog(path)
        try:
            self._wal, self._next = self._open(log, path, start, name, timeout)
        except BaseException:
            log.close()
            raise
        if self._catch_up is None:
            log.close()

    def _open(self, log: ReadOnlyLog, path: str | os.PathLike[str], start: int | None,
              name: str | None, timeout: float | None) -> tuple[Follower, int]:
        """The WAL follower, and the index of the first entry it will give."""
        if start is None and name is not None and \
                any(f["name"] == name for f in followers(path)):
            wal = Follower(path, None, name=name, timeout=timeout)
            return wal, _next_index(log, wal.position)
        ix = log._index
        start = ix.first if start is None else start
        if not ix.first <= start <= ix.next:
            raise LogIndexError(f"follow_log(start={start}): entries are {_span(ix)}"
                                + (" (the rest were compacted)" if start < ix.first else ""))
        end = log._at[0]
        if start < ix.next:
            self._catch_up = (log, end, ix.next - 1)
            return Follower(path, ix.lsn_at(start), name=name, timeout=timeout), start
        return Follower(path, end, name=name, timeout=timeout), start

    # -- reading --

    def __iter__(self) -> Iterator[LogEvent]:
        if self._gen is None:
            self._gen = self._items()
        return self._gen

    def __next__(self) -> LogEvent:
        return next(iter(self))

    def _items(self) -> Iterator[LogEvent]:
        try:
            yield from self._follow()
        finally:  # (the timeout passed, or an error: a later iteration reads on, or again)
            self._gen = None

    def _follow(self) -> Iterator[LogEvent]:
        wal, entry_head, index_term = self._wal, ENTRY_PREFIX, _INDEX_TERM.unpack_from
        for read in wal._follow(self._read):
            self._batch, self._after, self._cursor = read, wal._lsn, 0
            if type(read) is not list:
                yield from self._decode_runs(read)  # type: ignore[arg-type]
            else:
                for record in read:  # (the entry that comes next, in a few lines)
                    payload = record.payload
                    if payload.startswith(entry_head) and len(payload) >= HEADER_SIZE:
                        index, term = index_term(payload, 8)
                        if index == self._next:
                            self._next, self._cursor = index + 1, self._cursor + 1
                            yield new_entry((index, term, payload[HEADER_SIZE:]))
                            continue
                    yield from self._decode_record(record)
            self._cursor = len(read)

    def _read(self, lsn: int, prev: int, end: int
              ) -> tuple[int, int, int, list[Record] | RecordBatch, int]:
        """The WAL follower's read: a few records as Records (what a follower that keeps up
        finds at each wake-up: one native call, no arrays to make), more as a RecordBatch
        (decoded a run of entries at a time)."""
        reader = self._wal._wal._reader
        if end - lsn <= _FEW_BYTES and self._catch_up is None:
            status, nxt, last, _, records = reader.records(lsn, prev, end, _FEW, _FEW_BYTES)
            return status, nxt, last, records, len(records)
        status, nxt, last, _, arrays = reader.fill(lsn, prev, end, DEFAULT_BATCH_RECORDS,
                                                   DEFAULT_BATCH_BYTES)
        batch = RecordBatch.from_native(arrays)
        return status, nxt, last, batch, len(batch)

    def _decode_record(self, record: Record) -> Iterator[LogEvent]:
        """One record's entry or event (one of a few, read as Records)."""
        payload = record.payload
        if len(payload) < HEADER_SIZE:
            raise _not_log_record(record.lsn)
        magic, version, kind, aux, index, term = HEADER.unpack_from(payload)
        if magic != MAGIC or version != VERSION:
            raise _not_log_record(record.lsn, version if magic == MAGIC else None)
        if kind == ENTRY:
            if index < self._next:  # (an entry written over without a rewind record)
                self._next = index
                yield Rewound(index - 1)
            self._next, self._cursor = index + 1, self._cursor + 1
            yield new_entry((index, term, payload[HEADER_SIZE:]))
        else:
            self._cursor += 1
            event = self._event(kind, aux, index, term, record.lsn)
            if event is not None:
                yield event

    def _decode_runs(self, batch: RecordBatch) -> Iterator[LogEvent]:
        """The batch's entries and events, a run of consecutive entries at a time."""
        lengths, offsets = batch.lengths, batch.offsets
        heads = np.frombuffer(payload_heads(batch.data, offsets, lengths, HEADER_SIZE),
                              np.uint8).reshape(-1, HEADER_SIZE)
        head = heads.view(HEADER_DTYPE).reshape(-1)
        check_headers(batch.lsns, lengths, head)
        kinds, indices = head["kind"], head["index"].astype(np.int64)
        keep = self._caught_up(batch, kinds, indices)
        terms = head["term"].copy()
        offsets, lengths = offsets + HEADER_SIZE, lengths - HEADER_SIZE
        for s, e in _runs(kinds, indices, keep):
            kind = int(kinds[s])
            if kind == ENTRY:
                first = int(indices[s])
                if first < self._next:  # (an entry written over without a rewind record)
                    self._cursor, self._next = s, first
                    yield Rewound(first - 1)
                run = Unchanged(make_entries(Entry, indices[s:e], terms[s:e], batch.data,
                                             offsets[s:e], lengths[s:e]), _NEVER, 0)
                self._run = (run, s, first)
                yield from run
                self._run, self._cursor, self._next = None, e, first + (e - s)
            else:
                self._cursor = e
                event = self._event(kind, int(head["aux"][s]), int(indices[s]),
                                    int(terms[s]), int(batch.lsns[s]))
                if event is not None:
                    yield event

    def _event(self, kind: int, aux: int, index: int, term: int, lsn: int) -> LogEvent | None:
        """The event of a log record that is no entry (None: a state record); the next
        entry's index moves as it says."""
        if kind == REWIND:
            self._next = index + 1
            return Rewound(index)
        if kind == SNAPSHOT and aux == RESET:
            self._next = index + 1
            return Reset(index, term)
        if kind == SNAPSHOT:
            self._next = max(self._next, index + 1)
            return Compacted(index + 1)
        if kind == STATE:
            return None
        raise FormatError(f"log record at LSN {format_lsn(lsn)} has unknown kind {kind}")

    def _caught_up(self, batch: RecordBatch, kinds: np.ndarray,
                   indices: np.ndarray) -> np.ndarray | None:
        """Starting from an index: of the records the read-only log had replayed when the
        follower began, which to give (the entries it holds: not the voided ones, nor any
        event before); None once past them."""
        if self._catch_up is None:
            return None
        log, end, last = self._catch_up
        before = batch.lsns < end
        keep = ~before
        held = before & (kinds == ENTRY) & (indices >= self._next) & (indices <= last)
        if held.any():
            keep[held] = log._index.lsns_at(indices[held]) == batch.lsns[held]
        if not before[-1]:
            self._catch_up = None
            log.close()
        return keep

    # -- position --

    @property
    def position(self) -> int:
        """The index of the next entry (after the last one yielded, when iterating)."""
        if self._run is not None:
            run, _, first = self._run
            if run.given:
                return first + run.given
        return self._next

    def confirm(self) -> int:
        """Store this named follower's position (the WAL position after the last item
        yielded) durably: a follower of that name resumes there.  Returns ``position``."""
        read = self._batch
        if read:
            done = self._cursor
            if self._run is not None:
                done = self._run[1] + self._run[0].given
            lsns, prev = ([r.lsn for r in read], read[0].prev_lsn) if type(read) is list \
                else (read.lsns, read.prev_lsns[0])  # type: ignore[union-attr]
            if done == 0:
                self._wal._consumed(int(lsns[0]), int(prev))
            elif done < len(read):
                self._wal._consumed(int(lsns[done]), int(lsns[done - 1]))
            else:
                self._wal._consumed(self._after, int(lsns[-1]))
        self._wal.confirm()
        return self.position

    @property
    def name(self) -> str | None:
        return self._wal.name

    # -- life --

    def close(self) -> None:
        """Let go of the name (not of its stored position) and the WAL."""
        if self._catch_up is not None:
            self._catch_up[0].close()
            self._catch_up = None
        self._wal.close()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _not_log_record(lsn: int, version: int | None = None) -> FormatError:
    what = (f"log format version {version} (this pmemwal reads {VERSION})" if version is not None
            else "not a log record")
    return FormatError(f"the record at LSN {format_lsn(lsn)} is {what}: this WAL was not "
                       "written by pmemwal.Log")


def _runs(kinds: np.ndarray, indices: np.ndarray, keep: np.ndarray | None
          ) -> Iterator[tuple[int, int]]:
    """The batch's records as runs [s, e): consecutive entries numbered one after another,
    or one record that is no entry; records not kept are left out."""
    entry = kinds == ENTRY
    n = len(kinds)
    if keep is None and entry.all() and \
            (n == 1 or bool((np.diff(indices) == 1).all())):
        yield 0, n  # (the common batch: entries alone, in order)
        return
    joined = np.zeros(n, bool)
    joined[1:] = entry[1:] & entry[:-1] & (indices[1:] == indices[:-1] + 1)
    if keep is not None:  # (a record left out is a run of its own, and so not given)
        joined[1:] &= keep[1:] & keep[:-1]
    starts = np.flatnonzero(~joined).tolist() + [n]
    for s, e in zip(starts, starts[1:]):
        if keep is None or keep[s]:
            yield s, e


def _next_index(log: ReadOnlyLog, position: int) -> int:
    """The index of the next entry after WAL position ``position``: what the first log
    record there that names one says (an entry, a rewind, a reset), else the log's next."""
    wal = log.wal
    end = wal.refresh()
    if position < end:
        _, _, _, _, _, heads = wal._reader.heads(position, -1, end, HEADER_SIZE, _PEEK)
        head = np.frombuffer(heads, np.uint8).reshape(-1, HEADER_SIZE).view(HEADER_DTYPE)
        for kind, aux, index in zip(*(head[f].reshape(-1).tolist()
                                      for f in ("kind", "aux", "index"))):
            if kind == ENTRY:
                return int(index)
            if kind == REWIND or (kind == SNAPSHOT and aux == RESET):
                return int(index) + 1
    return log.last_index + 1


def follow_log(path: str | os.PathLike[str], start: int | None = None, *,
               name: str | None = None, timeout: float | None = None) -> LogFollower:
    """Follow the Log in directory ``path`` from another process (or this one): a
    LogFollower, an iterator of its entries as they become durable, with ``Rewound``,
    ``Compacted`` and ``Reset`` events where the writer rewound, compacted or reset it.

    ``start``: the index of the first entry to give (None: a named follower's stored
    position, else the log's first entry); LogIndexError for one compacted away or past the
    next entry.  ``name`` and ``timeout``: as ``pmemwal.follow``'s.
    """
    return LogFollower(path, start, name=name, timeout=timeout)


__all__ = ["LogFollower", "follow_log", "Rewound", "Compacted", "Reset", "LogEvent"]
