"""A log opened for reading only: ``pmemwal.open_log(path, readonly=True)``.

It reads a Log's entries from another process while the writer goes on (or when nobody has
the log open), over a read-only WAL (pmemwal/readonly.py): no lock, nothing written, not
even the index.  Open reads the index the writer stored and replays the log records after
it up to what is durable, as a writer's open does (log_replay.py); ``refresh()`` replays
what became durable since, from where the last replay stopped.  Between refreshes it is the
log as it stood then; an entry the writer has since voided or compacted away reads as the
record now there says (never another entry's bytes: each record names its entry) or raises.

Concern: the read-only open and refresh; the read methods are log_reading.py's, shared with
``pmemwal.Log``.
"""

from __future__ import annotations

import os
from typing import Iterator, NoReturn

import numpy as np

from pmemwal.checkpoint import read_any
from pmemwal.errors import CorruptionError, ReadOnlyError, StorageError, TruncatedError
from pmemwal.log_format import HEADER_SIZE
from pmemwal.log_index import IndexFiles, IndexState, TieredIndex
from pmemwal.log_reading import LogReading
from pmemwal.log_replay import _span
from pmemwal.readonly import ReadOnlyWAL

_HEADS_BATCH = 1 << 16          # records per native call when replaying
_OPEN_TRIES = 3                 # a writer's truncation may race an open: it starts over


class ReadOnlyLog(LogReading):
    """A Log's entries, read from what is durable (see the module docstring).

    The read methods and properties are ``pmemwal.Log``'s; every write raises ReadOnlyError.
    ``refresh()`` takes in what became durable since the open or the last refresh.
    """

    wal: ReadOnlyWAL  # type: ignore[assignment]  # (a Log's is a WAL: the reads are shared)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.wal = ReadOnlyWAL(path)
        try:
            self._files = IndexFiles(self.wal.path, self.wal.wal_id)
            self._open()
        except BaseException:
            self.wal.close()
            raise

    def _open(self) -> None:
        """Read the stored index and replay what follows it; once more from the start when a
        truncation by the writer took records from under the replay."""
        lock = getattr(self, "_lock", None)  # (a refresh that starts over holds it)
        for tries_left in reversed(range(_OPEN_TRIES)):
            self._init_state()
            if lock is not None:
                self._lock = lock
                self._files.close()  # (a chunk file removed since may be made anew)
                self._files = IndexFiles(self.wal.path, self.wal.wal_id)
            self._index = TieredIndex(self._files)
            try:
                self.replayed_from = self._load_index()
                self._at = self._replay_start(self.replayed_from)
                self._replay_heads(self._heads())
                return
            except (TruncatedError, CorruptionError, StorageError):
                if not tries_left or not self.wal.writer_alive:
                    raise

    # -- LogReplay's hooks: what a writer's open writes or asks its WAL, read instead --

    def _set_aside(self, why: str) -> None:
        """An index that does not fit is the writer's to store again: every record is
        replayed instead, and nothing is written."""

    def _wal_cuts(self) -> int:
        found = read_any(self.wal.path)
        return found[2].cuts if found is not None and found[0] == self.wal.wal_id else 0

    def _wal_end(self) -> int:
        return self.wal.refresh()

    def _record_before(self, state: IndexState, end: int) -> int:
        if state.replay_lsn < end:
            return self.wal.record(state.replay_lsn).prev_lsn
        # the index stands at the durable end: its guard record must end there
        status, stop, last, *_ = self.wal._reader.scan(state.guard_lsn, -1, end, False)
        return last if not status and stop == end else -1

    def _in_place(self, lsn: int) -> bool:
        return False  # (read as ReadOnlyWAL.record reads: up to the durable end, checked)

    def _horizon(self) -> int:
        return self._at[0]

    # -- replaying what became durable --

    def _replay_start(self, lsn: int | None) -> tuple[int, int]:
        """(LSN, expected prev-link or -1) of the first record to replay: ``lsn``, else the
        oldest record (or where the first will be)."""
        if lsn is not None:
            return lsn, -1
        bounds = self.wal._read_bounds(None)
        return (bounds[0] if bounds is not None else self.wal.first_lsn), -1

    def _heads(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The records' heads from where the last replay stopped to the durable end, as
        WAL.record_heads gives them; the position moves past each batch once applied."""
        wal = self.wal
        end = wal.refresh()
        lsn, prev = self._at
        while lsn < end:
            status, nxt, last, lsns, lengths, heads = wal._reader.heads(
                lsn, prev, end, HEADER_SIZE, _HEADS_BATCH)
            if lsns:
                wal._check_copied(lsn)
                yield (np.frombuffer(lsns, np.uint64), np.frombuffer(lengths, np.uint32),
                       np.frombuffer(heads, np.uint8).reshape(-1, HEADER_SIZE))
            self._at = lsn, prev = nxt, last or prev
            if status:
                raise wal._read_error(lsn, status, False)
            if not lsns and nxt == lsn:
                return  # (the end lies in the page header after the position)

    def refresh(self) -> int:
        """Take in the log records made durable since the open or the last refresh (entries,
        rewinds, compactions, resets, the hard state); returns ``last_index``."""
        with self._lock:
            self._check_open()
            try:
                self._replay_heads(self._heads())
            except (TruncatedError, CorruptionError):
                if not self.wal.writer_alive:
                    raise
                # the writer compacted past where the last replay stopped (or past the
                # first entry, its marker not durable when the replay looked): start over
                self._open()
            return self._index.next - 1

    def _check_not_compacted(self, index: int) -> None:
        """A read of entry ``index`` failed: LogIndexError if the writer has voided or
        compacted it since (a refresh says), else the read's own error stands."""
        self.refresh()
        super()._check_not_compacted(index)

    # -- what a reader may not do --

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise ReadOnlyError(f"the log in {self.wal.path} was opened with readonly=True: it "
                            "reads what the writer made durable, and writes nothing")

    append = append_many = sync = truncate_after = compact = reset = set_state = \
        checkpoint = _refuse

    # -- life --

    def close(self) -> None:
        """Let go of the WAL and the index files; closing twice is fine."""
        with self._lock:
            self.wal.close()
            self._files.close()

    @property
    def closed(self) -> bool:
        return self.wal.closed

    def __enter__(self) -> ReadOnlyLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"entries {_span(self._index)}"
        return f"<pmemwal.ReadOnlyLog {self.wal.path} {state}>"


__all__ = ["ReadOnlyLog"]
