"""Opening a ``pmemwal.Log``: its index read and the log records after it replayed.

Open replays the log records (log_format.py) in LSN order, the WAL's own order:

- an entry with index ``next`` is appended; one with a lower index first voids
  every entry from its index on (etcd's WAL reads an overriding suffix so);
  the first entry read, or one past a gap, starts the numbering (the scan may
  begin amid entries that a later snapshot marker drops: at the end, entries
  missing below the first must be covered by the last snapshot, or the log is
  damaged: CorruptionError);
- a rewind ``k`` voids the entries above ``k`` (``truncate_after``);
- a snapshot ``(k, t)`` drops the entries up to ``k`` and remembers ``t`` as the
  term of ``k`` (``compact``); a resetting one drops every entry and the log goes
  on at ``k + 1`` (``reset``, a Raft follower installing a snapshot);
- a state record replaces the hard state (term, vote, commit): the latest wins.

Since the WAL returns after a crash exactly the records that were durable, the
log is then exactly the durable entries with every durable rewind, snapshot and
state applied.  The WAL stays append-only: nothing is ever overwritten in place.

The index (entry -> LSN, entry -> term) is kept durable beside the WAL
(pmemwal/log_index.py): at each of the WAL's background checkpoints, at
compaction and at close, the entries appended since go into mapped index files
and a slot names the WAL position the index reflects.  Open reads that slot and
replays only the log records after it, from their headers alone, in native
batches (``WAL.record_heads``); without a usable index (none yet, or a WAL cut
below it) it replays every record and writes the index at the next checkpoint.
``log[i]`` is O(1) and reads one record; memory follows the entries read.

Concern: the state open rebuilds (``_index``, ``_snapshot``, ``_state_lsn``, ``_known``) and
the index checkpoints that let the next open skip replaying; log.py's ``Log`` appends,
compacts and reads on top of it.  The record format is log_format.py's.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable

import numpy as np

from pmemwal.errors import (ClosedError, CorruptionError, FormatError, LogIndexError, WALError,
                            format_lsn)
from pmemwal.log_format import (ENTRY, HEADER_DTYPE, HEADER_SIZE, RESET, REWIND, SNAPSHOT, STATE,
                                HardState, check_headers, decode_state, dense_entries, encode_state,
                                entry_of)
from pmemwal.log_index import IndexFiles, IndexState, TieredIndex, payload_crc
from pmemwal.recovery import RecoveryWarning
from pmemwal.batch import RecordBatch
from pmemwal.wal import WAL, Record
from pmemwal.reading import DEFAULT_BATCH_BYTES
from pmemwal.warn import warn

_SCAN_BATCH = 1 << 16                       # records per native call on open
_WRITER_WAIT = 0.005    # seconds the WAL's writer waits for the log's lock in an index round
_POLL = 0.005           # seconds between looks at whether close has begun, waiting for it
# _capture's: the index's state, its entries not stored yet (start, LSNs, terms), and its
# count of changes then
_Captured = tuple[IndexState, int, np.ndarray, np.ndarray, int]


class LogReplay:
    """The open-time and index half of a Log (see the module docstring)."""

    wal: WAL
    _lock: threading.Lock
    _closing: bool
    _deferred_round: threading.Thread | None
    _snapshot: tuple[int, int]
    _state: HardState
    _state_record: bytes | None
    _state_lsn: int
    _last_term: int
    _known: bool
    _index_lock: threading.Lock
    _index_state: IndexState | None
    _files: IndexFiles
    _index: TieredIndex

    def _load_index(self) -> int | None:
        """Take the stored index when it fits this WAL; returns the LSN to replay from
        (None: every record, the index rebuilt)."""
        state = self._files.read_state()
        if state is None or not state.guard_lsn:
            return None  # none yet, or one of an empty log: replaying all is replaying little
        why = self._unusable(state)
        if why:
            self._set_aside(why)
            return None
        self._index = TieredIndex(self._files, state.first, state.next)
        self._snapshot, self._state_lsn, self._known = state.snapshot, state.state_lsn, state.known
        self._index_state = state
        return state.replay_lsn

    def _init_state(self) -> None:
        """The state of a log no record has been replayed into yet."""
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

    def _set_aside(self, why: str) -> None:
        """The stored index does not fit the WAL (``why``): say so, and store one that names
        nothing before anything is appended, so that no later open takes it up again."""
        warn(f"{self.wal.path}: the log index is not used ({why}); every log "
             "record is read instead", RecoveryWarning)
        self._files.write_state(IndexState(self._files.last_seq + 1, 0, 0, 0, 1, 1, False,
                                           (0, 0), 0, self.wal.cuts))

    def _wal_cuts(self) -> int:
        return self.wal.cuts

    def _wal_end(self) -> int:
        return self.wal.position()[0]

    def _record_before(self, state: IndexState, end: int) -> int:
        """The LSN of the record before ``state.replay_lsn`` (at most ``end``, the WAL's)."""
        return self.wal.position()[1] if state.replay_lsn == end else \
            self.wal.record(state.replay_lsn).prev_lsn

    def _unusable(self, state: IndexState) -> str | None:
        """Why the stored index does not describe this WAL's records below its replay_lsn,
        or None: the WAL must still hold them, ending there in the same record."""
        wal = self.wal
        insert = self._wal_end()
        if state.wal_cuts != self._wal_cuts():
            return "the WAL was cut below it since (on_corruption='truncate')"
        gone = self._files.missing_chunks(state.first, state.next)
        if gone:
            return f"its chunk file {gone[0]:016X}.lidx is missing or short"
        if not wal.first_lsn <= state.replay_lsn <= insert:
            return f"it reaches {format_lsn(state.replay_lsn)}, the WAL holds " \
                   f"{format_lsn(wal.first_lsn)}..{format_lsn(insert)}"
        try:
            guard = wal.record(state.guard_lsn)
            follows = self._record_before(state, insert)
        except (ValueError, WALError) as exc:
            return f"its last record does not read: {exc}"
        if follows != state.guard_lsn or payload_crc(guard.payload) != state.guard_crc:
            return f"the record at {format_lsn(state.guard_lsn)} is not the one it was made after"
        return None

    def _replay(self, start: int | None) -> None:
        self._replay_heads(self.wal.record_heads(HEADER_SIZE, start=start, batch=_SCAN_BATCH))

    def _replay_heads(self, batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]
                      ) -> None:
        """Apply the log records of ``batches`` (``WAL.record_heads``'s) to the state."""
        known = self._known
        for lsns, lengths, heads in batches:
            head = heads.view(HEADER_DTYPE)[:, 0]
            check_headers(lsns, lengths, head)
            if dense_entries(head, self._index.next if known else None):
                first = int(head["index"][0])
                if not known:
                    self._index.restart(first)
                self._index.keep_through(first - 1)
                self._index.extend(lsns, head["term"])
                known = True
                continue
            for lsn, h in zip(lsns.tolist(), head.tolist()):
                known = self._apply(lsn, h, known)
        ix = self._index  # (an index read from its files may name entries in a lost segment)
        if self._never_compacted() or (ix.count and ix.lsn_at(ix.first) < self.wal.first_lsn):
            raise CorruptionError(self.wal.first_lsn, self.wal.first_lsn // self.wal.segment_size,
                                  f"the log starts at entry {self._index.first}, but entries "
                                  f"after {self._snapshot[0]} were never compacted: a segment "
                                  "holding them is missing")
        if self._state_lsn:
            self._state = decode_state(self._record(self._state_lsn).payload)
            self._state_record = encode_state(self._state)
        self._last_term = self._term_at(self._index.next - 1)
        self._known = known

    def _apply(self, lsn: int, head: tuple[int, int, int, int, int, int], known: bool) -> bool:
        """Replay one log record; returns whether the numbering is known from here on.

        An entry past the next index restarts the numbering instead of failing: the scan
        may begin in a segment that compaction kept, where entries below the first kept
        one come before the marker that drops them (a later snapshot must then cover the
        gap; ``_replay`` checks that at the end)."""
        _, _, kind, aux, index, term = head
        ix = self._index
        if kind == ENTRY:
            if not known or index > ix.next:
                ix.restart(index)
            ix.keep_through(index - 1)
            ix.push(lsn, term)
        elif kind == REWIND:
            if not known:
                ix.restart(index + 1)
            ix.keep_through(index)
        elif kind == SNAPSHOT:
            if aux == RESET or not known:
                ix.restart(index + 1)
            else:
                ix.drop_through(index)
            self._snapshot = (index, term)
        elif kind == STATE:
            self._state_lsn = lsn
            return known
        else:
            raise FormatError(f"log record at LSN {format_lsn(lsn)} has unknown kind {kind}")
        return True

    def _never_compacted(self) -> tuple[int, int] | None:
        """The entries below the first that no snapshot covers (first, last), or None: with
        such a gap the log does not open."""
        first = self._snapshot[0] + 1
        return (first, self._index.first - 1) if first < self._index.first else None

    def _gap_after(self, heads: list[tuple[int, int, int, int, int, int]]) \
            -> tuple[int, int] | None:
        """The entries a replay would find neither there nor compacted (``_never_compacted``)
        with log records of these headers appended after the log's own, or None: replay's
        own rules on a copy of the numbering (no entry of it is read, none is changed)."""
        trial = LogReplay()
        trial.wal, trial._snapshot, trial._state_lsn = self.wal, self._snapshot, self._state_lsn
        trial._index = TieredIndex(self._files, self._index.first, self._index.next)
        known, lsn = self._known, self.wal.insert_lsn
        for head in heads:
            known = trial._apply(lsn, head, known)
        return trial._never_compacted()

    def checkpoint(self) -> int:
        """Make every entry durable, and write the index and the WAL's checkpoint: the next
        open reads the index and replays nothing.  Returns the WAL checkpoint's LSN."""
        with self._lock:
            self._check_open()
            self._store_index(self._capture())
            return self.wal.checkpoint()

    def _capture(self) -> _Captured:
        """Under the lock: the index as the WAL's records below the insert position leave it
        (every log record goes in under the lock), and the entries not stored yet."""
        insert, last = self.wal.position()
        start, lsns, terms = self._index.pending()
        ix = self._index
        state = IndexState(0, insert, last, 0, ix.first, ix.next, self._known, self._snapshot,
                           self._state_lsn)
        return state, start, lsns, terms, ix.changes

    def _store_index(self, captured: _Captured, locked: bool = True) -> None:
        """Write a captured index: its records made durable, its pending entries' slots
        written and synced, then its state; never one older than the last written."""
        state, start, lsns, terms, changes = captured
        with self._index_lock:
            if self._index_state is not None and state.replay_lsn <= self._index_state.replay_lsn:
                return  # that one or a later one is written (a compaction, by another thread)
            guard_crc = 0
            if state.guard_lsn:
                self.wal.flush(state.guard_lsn)
                guard_crc = payload_crc(self._record(state.guard_lsn).payload)  # (damage: typed)
            self._files.write(start, lsns, terms)
            state = IndexState(self._files.last_seq + 1, state.replay_lsn, state.guard_lsn,
                               guard_crc, state.first, state.next, state.known, state.snapshot,
                               state.state_lsn, self.wal.cuts)
            self._files.write_state(state)
            self._index_state = state
            self._files.remove_below(state.first)
        if locked or self._lock_for_writer():  # (skipped: the next checkpoint's trim covers it)
            try:
                if self._index.changes == changes:
                    self._index.stored(state.next)
            finally:
                if not locked:
                    self._lock.release()

    def _background_index_checkpoint(self, _end: int) -> None:
        """The WAL's background writer wrote a checkpoint: the index follows.  That thread
        also watches for deleted segments, makes segments ahead and flushes unsynced
        appends, so it waits for the log's lock no more than _WRITER_WAIT: when the lock
        stays taken (a compaction, a checkpoint, appends back to back), the round goes on in
        a thread of the log's own that waits as long as it takes (one at a time: the rounds
        meanwhile are that one, which stores the index as it then stands)."""
        if self._lock_for_writer(_WRITER_WAIT):
            self._index_round()
        elif not self._closing and (self._deferred_round is None or
                                    not self._deferred_round.is_alive()):
            self._deferred_round = threading.Thread(target=self._wait_for_index_round,
                                                    name="pmemwal-log-index", daemon=True)
            self._deferred_round.start()

    def _wait_for_index_round(self) -> None:
        if self._lock_for_writer(None):
            self._index_round()

    def _index_round(self) -> None:
        """A background index checkpoint, with the lock taken (and released here)."""
        try:
            if self.wal.closed:
                return
            captured = self._capture()
        finally:
            self._lock.release()
        try:
            self._store_index(captured, locked=False)
            self.index_error = None
        except (WALError, OSError) as exc:
            self.index_error = exc  # the next checkpoint tries again; the open replays more

    def _lock_for_writer(self, wait: float | None = _WRITER_WAIT) -> bool:
        """Take the lock outside a caller's operation, waiting up to ``wait`` seconds (None:
        as long as it takes), never once close has begun: close holds the lock while it
        stops the WAL's writer and the log's index thread.  Waited for, not only tried:
        appends hold it only briefly, but threads appending without a sync hold it nearly
        back to back, and a round that only tried skipped every checkpoint (the index fell
        behind, and memory grew with the entries not stored)."""
        deadline = None if wait is None else time.monotonic() + wait
        while not self._lock.acquire(timeout=_POLL):
            if self._closing or (deadline is not None and time.monotonic() >= deadline):
                return False
        return True

    def _end_index_rounds(self) -> None:
        """Close, once the WAL's writer stopped (it starts no other): the log's index thread
        has ended (waiting for the lock close holds, it gives up)."""
        if self._deferred_round is not None:
            self._deferred_round.join()

    def _term_at(self, index: int) -> int:
        ix = self._index
        if ix.durable_next > index >= ix.first:  # from its record: the files hold no checksum
            return entry_of(index, self._record(ix.lsn_at(index)), self.wal.segment_size).term
        if ix.first <= index < ix.next:
            return ix.term_at(index)
        if index == ix.first - 1:
            return self._snapshot[1] if self._snapshot[0] == index else 0
        raise LogIndexError(f"term_at({index}): entries are {_span(ix)}")

    def _record(self, lsn: int) -> Record:
        """The WAL record at ``lsn``, which the index names: one that does not read is
        damage (CorruptionError), not a caller's wrong LSN."""
        try:
            return self.wal.record(lsn)
        except ValueError as exc:
            raise CorruptionError(lsn, lsn // self.wal.segment_size, str(exc)) from None

    def _records(self, lsns: np.ndarray, max_bytes: int = DEFAULT_BATCH_BYTES,
                 whole: bool = True) -> RecordBatch:
        """The WAL records at ``lsns``, which the index names (all of them, or when not
        ``whole`` as many as one native call of ``max_bytes`` reads): one that does not
        read is damage (CorruptionError), not a caller's wrong LSN."""
        batch, failed = self.wal._fetch(lsns, max_bytes, whole)
        if failed is None:
            return batch
        lsn, status = failed
        error = self.wal._record_error(lsn, status)
        if isinstance(error, ValueError):
            raise CorruptionError(lsn, lsn // self.wal.segment_size, str(error))
        raise error

    def _check_open(self) -> None:
        if self.wal.closed:
            raise ClosedError("the log is closed")


def _span(ix: TieredIndex) -> str:
    return f"{ix.first}..{ix.next - 1}" if ix.count else f"none (the next is {ix.next})"

