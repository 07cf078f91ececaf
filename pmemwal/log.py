"""The log layer: numbered entries with terms over one WAL (``pmemwal.Log``).

A replicated state machine or an event store thinks in entries 1, 2, 3..., not
LSNs.  A Log writes four kinds of *log record* into an ordinary WAL (no second
file format): each is one WAL record whose payload starts with this 24-byte
header, little-endian (docs/FORMAT.md, "Log records", says the same):

    0  u16  magic    0x4C50 ("PL")
    2  u8   version  1
    3  u8   kind     1 entry, 2 rewind, 3 snapshot, 4 state
    4  u32  aux      snapshot: 1 when it resets the log; state: how the vote is encoded
    8  u64  index    entry, rewind, snapshot: an entry index; state: the commit index
   16  u64  term     entry, snapshot: that entry's term; state: the current term
   24  ...  body     entry: the payload; state: the vote; others: nothing

Open replays them in LSN order, the WAL's own order:

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

Compaction writes its snapshot marker (and, when the latest state record lies
in a segment about to go, that state again), flushes, then lets
``WAL.truncate`` drop the whole segments below the first kept entry; entries
left in the segment that holds it are skipped by the marker on replay.

The index (entry -> LSN, entry -> term) is kept durable beside the WAL
(pmemwal/log_index.py): at each of the WAL's background checkpoints, at
compaction and at close, the entries appended since go into mapped index files
and a slot names the WAL position the index reflects.  Open reads that slot and
replays only the log records after it, from their headers alone, in native
batches (``WAL.record_heads``); without a usable index (none yet, or a WAL cut
below it) it replays every record and writes the index at the next checkpoint.
``log[i]`` is O(1) and reads one record; memory follows the entries read.
"""

from __future__ import annotations

import os
import struct
import threading
import warnings
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, TypedDict, Unpack

import numpy as np

from pmemwal.errors import (ClosedError, ConfigError, CorruptionError, FormatError, LogIndexError,
                            TermError, WALError, format_lsn)
from pmemwal.log_index import IndexFiles, IndexState, TieredIndex, payload_crc
from pmemwal.recovery import RecoveryWarning
from pmemwal.wal import WAL, Record, _weak

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

MAGIC = 0x4C50
VERSION = 1
ENTRY, REWIND, SNAPSHOT, STATE = 1, 2, 3, 4
KIND_NAMES = {ENTRY: "entry", REWIND: "rewind", SNAPSHOT: "snapshot", STATE: "state"}
RESET = 1                                   # snapshot aux: the log was reset, not compacted
VOTE_NONE, VOTE_INT, VOTE_STR, VOTE_BYTES = 0, 1, 2, 3  # state aux: the vote's encoding
HEADER = struct.Struct("<HBBIQQ")
HEADER_SIZE = HEADER.size                   # 24
HEADER_DTYPE = np.dtype([("magic", "<u2"), ("version", "u1"), ("kind", "u1"), ("aux", "<u4"),
                         ("index", "<u8"), ("term", "<u8")])
_ENTRY_PREFIX = HEADER.pack(MAGIC, VERSION, ENTRY, 0, 0, 0)[:8]  # an entry's header: this, then
_INDEX_TERM = struct.Struct("<QQ")                              # its index and term


class _Keep(Enum):
    """set_state's default for a field: keep its value (a type of its own, for the checker)."""

    KEEP = 0


_KEEP = _Keep.KEEP                          # set_state: leave this field as it is
_SCAN_BATCH = 1 << 16                       # records per native call on open
# Log._capture's: the index's state, its entries not stored yet (start, LSNs, terms), and
# its count of changes then
_Captured = tuple[IndexState, int, np.ndarray, np.ndarray, int]


class Entry(NamedTuple):
    """A log entry: its index, its term, and its payload (a read-only memoryview)."""

    index: int  # type: ignore[assignment]  # the entry's number, in place of tuple.index
    term: int
    payload: memoryview


class HardState(NamedTuple):
    """What a Raft node must not forget: its current term, its vote in it, its commit index."""

    term: int = 0
    vote: int | str | bytes | None = None
    commit: int = 0


class WALOptions(TypedDict, total=False):
    """The options of ``pmemwal.open`` (see ``WAL``), which ``open_log`` takes too."""

    mode: str
    create: bool
    segment_size: int | None
    insert_slots: int
    buffer_size: int
    max_record_size: int
    sync_method: str
    on_corruption: str
    recycle_segments: int
    background: bool
    flush_interval: float
    prepare_segments: int
    prefault: bool
    gil_release_size: int
    max_wal_size: int
    preallocate: int
    persist: str
    insertion: str
    shared: bool
    archive: str | None
    archive_command: str | None
    restore_command: str | None
    archive_options: dict[str, Any] | None
    archive_timeout: float
    archive_max_pending: int
    archive_backoff: float
    checkpoint_interval: float
    checkpoint_bytes: int
    verify: str


def open_log(path: str | os.PathLike[str], **wal_options: Unpack[WALOptions]) -> Log:
    """Open (or create) the log in WAL directory ``path``; ``wal_options`` go to pmemwal.open."""
    return Log(path, **wal_options)


class Log:
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
        self._snapshot = (0, 0)                 # (index, term) of the last compacted entry
        self._state = HardState()
        self._state_record: bytes | None = None
        self._state_lsn = 0
        self._last_term = 0                     # the last entry's (or snapshot's) term
        self._known = False                     # has any record fixed the numbering yet?
        self._index_lock = threading.Lock()     # one index checkpoint written at a time
        self._index_state: IndexState | None = None  # the last one written or read
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

    # ---- open: read the index, replay what follows it ------------------------------

    def _load_index(self) -> int | None:
        """Take the stored index when it fits this WAL; returns the LSN to replay from
        (None: every record, the index rebuilt)."""
        state = self._files.read_state()
        if state is None or not state.guard_lsn:
            return None  # none yet, or one of an empty log: replaying all is replaying little
        why = self._unusable(state)
        if why:
            warnings.warn(f"{self.wal.path}: the log index is not used ({why}); every log "
                          "record is read instead", RecoveryWarning, stacklevel=3)
            # before anything is appended: no later open may take it up again
            self._files.write_state(IndexState(self._files.last_seq + 1, 0, 0, 0, 1, 1, False,
                                               (0, 0), 0, self.wal.cuts))
            return None
        self._index = TieredIndex(self._files, state.first, state.next)
        self._snapshot, self._state_lsn, self._known = state.snapshot, state.state_lsn, state.known
        self._index_state = state
        return state.replay_lsn

    def _unusable(self, state: IndexState) -> str | None:
        """Why the stored index does not describe this WAL's records below its replay_lsn,
        or None: the WAL must still hold them, ending there in the same record."""
        wal = self.wal
        insert, last = wal.position()
        if state.wal_cuts != wal.cuts:
            return "the WAL was cut below it since (on_corruption='truncate')"
        gone = self._files.missing_chunks(state.first, state.next)
        if gone:
            return f"its chunk file {gone[0]:016X}.lidx is missing or short"
        if not wal.first_lsn <= state.replay_lsn <= insert:
            return f"it reaches {format_lsn(state.replay_lsn)}, the WAL holds " \
                   f"{format_lsn(wal.first_lsn)}..{format_lsn(insert)}"
        try:
            guard = wal.record(state.guard_lsn)
            follows = last if state.replay_lsn == insert else wal.record(state.replay_lsn).prev_lsn
        except (ValueError, WALError) as exc:
            return f"its last record does not read: {exc}"
        if follows != state.guard_lsn or payload_crc(guard.payload) != state.guard_crc:
            return f"the record at {format_lsn(state.guard_lsn)} is not the one it was made after"
        return None

    def _replay(self, start: int | None) -> None:
        known = self._known
        for lsns, lengths, heads in self.wal.record_heads(HEADER_SIZE, start=start,
                                                          batch=_SCAN_BATCH):
            head = heads.view(HEADER_DTYPE)[:, 0]
            _check_headers(lsns, lengths, head)
            if _dense_entries(head, self._index.next if known else None):
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
        if self._snapshot[0] < ix.first - 1 or \
                (ix.count and ix.lsn_at(ix.first) < self.wal.first_lsn):
            raise CorruptionError(self.wal.first_lsn, self.wal.first_lsn // self.wal.segment_size,
                                  f"the log starts at entry {self._index.first}, but entries "
                                  f"after {self._snapshot[0]} were never compacted: a segment "
                                  "holding them is missing")
        if self._state_lsn:
            self._state = _decode_state(self._record(self._state_lsn).payload)
            self._state_record = _encode_state(self._state)
        self._last_term = self._term_at(self._index.next - 1)
        self._known = known

    # ---- index checkpoints (pmemwal/log_index.py) ------------------------------------

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
                guard_crc = payload_crc(self.wal.record(state.guard_lsn).payload)
            self._files.write(start, lsns, terms)
            state = IndexState(self._files.last_seq + 1, state.replay_lsn, state.guard_lsn,
                               guard_crc, state.first, state.next, state.known, state.snapshot,
                               state.state_lsn, self.wal.cuts)
            self._files.write_state(state)
            self._index_state = state
            self._files.remove_below(state.first)
        if locked or self._lock.acquire(blocking=False):  # (never waits: close may hold it)
            try:
                if self._index.changes == changes:
                    self._index.stored(state.next)
            finally:
                if not locked:
                    self._lock.release()

    def _background_index_checkpoint(self, _end: int) -> None:
        """The WAL's background writer wrote a checkpoint: the index follows, unless the
        log is busy (the lock is taken, never waited for: close holds it while it stops
        that writer)."""
        if not self._lock.acquire(blocking=False):
            return
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

    # ---- writing ---------------------------------------------------------------

    def append(self, payload: ReadableBuffer, term: int = 0, *, sync: bool = False) -> int:
        """Append one entry (any bytes-like payload) with ``term``; returns its index.

        ``sync=True`` makes it durable before returning.  A term below the last
        entry's raises TermError.
        """
        with self._lock:  # the WAL raises ClosedError once closed
            if term < self._last_term:
                raise TermError(f"term {term} is below the last entry's term {self._last_term}")
            ix = self._index
            index = ix.next
            lsn = self.wal.append_prefixed(_ENTRY_PREFIX + _INDEX_TERM.pack(index, term), payload)
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
            if term < self._last_term:
                raise TermError(f"term {term} is below the last entry's term {self._last_term}")
            first = self._index.next
            records = [b"".join((_ENTRY_PREFIX, _INDEX_TERM.pack(first + i, term), p))
                       for i, p in enumerate(payloads)]
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
            if index < 0 or term < 0:
                raise LogIndexError(f"reset({index}, {term}): index and term are 0 or more")
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
            if new.commit < 0:
                raise LogIndexError(f"set_state(commit={new.commit}): 0 or more")
            record = _encode_state(new)
            self._state_lsn = self.wal.append(record, True)
            self._state, self._state_record = new, record
            return new

    # ---- reading ---------------------------------------------------------------

    def entry(self, index: int) -> Entry:
        """Entry ``index``; LogIndexError outside [first_index, last_index]."""
        with self._lock:
            self._check_open()
            ix = self._index
            if not ix.first <= index < ix.next:
                raise LogIndexError(f"no entry {index}: entries are {_span(ix)}")
            record = self._record(ix.lsn_at(index))
            return _entry(index, record, self.wal.segment_size)

    __getitem__ = entry

    def entries(self, start: int | None = None, stop: int | None = None) -> Iterator[Entry]:
        """The entries from ``start`` (None: the first) to before ``stop`` (None: the end),
        as they are when the call is made."""
        with self._lock:
            self._check_open()
            ix = self._index
            start = ix.first if start is None else max(start, ix.first)
            stop = ix.next if stop is None else min(stop, ix.next)
            if start >= stop:
                return
            lsns = ix.lsns(start, stop).tolist()
        # One pass over the WAL from the first entry, stepping over the records in between
        # that are not these entries (voided ones, rewinds, markers, states).
        want = 0
        try:
            self._record(lsns[0])  # the first must read: a start that does not is damage
            for record in self.wal.records(lsns[0]):
                if record.lsn > lsns[want]:
                    break  # the chain passed the LSN the index names: no record starts there
                if record.lsn == lsns[want]:
                    yield _entry(start + want, record, self.wal.segment_size)
                    want += 1
                    if want == len(lsns):
                        return
        except CorruptionError:
            self._check_not_compacted(start + want)
            raise
        self._check_not_compacted(start + want)
        lsn = lsns[want]
        raise CorruptionError(lsn, lsn // self.wal.segment_size, f"the log's index names "
                              f"{format_lsn(lsn)} for entry {start + want}, and no record of "
                              "the WAL's chain starts there")

    def _check_not_compacted(self, index: int) -> None:
        """LogIndexError if entry ``index``, which an iteration was reading, went in a
        compaction, rewind or reset made since it began: not damage, but no entry there."""
        with self._lock:
            gone = index < self._index.first or index >= self._index.next
        if gone:
            raise LogIndexError(f"entry {index} went while entries() was reading it (a "
                                f"compaction, rewind or reset meanwhile): entries are now "
                                f"{_span(self._index)}")

    def __iter__(self) -> Iterator[Entry]:
        return self.entries()

    def term_at(self, index: int) -> int:
        """The term of entry ``index``, from ``first_index - 1`` (the snapshot's) to the last."""
        with self._lock:
            return self._term_at(index)

    def _term_at(self, index: int) -> int:
        ix = self._index
        if ix.durable_next > index >= ix.first:  # from its record: the files hold no checksum
            return _entry(index, self._record(ix.lsn_at(index)), self.wal.segment_size).term
        if ix.first <= index < ix.next:
            return ix.term_at(index)
        if index == ix.first - 1:
            return self._snapshot[1] if self._snapshot[0] == index else 0
        raise LogIndexError(f"term_at({index}): entries are {_span(ix)}")

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

    def _record(self, lsn: int) -> Record:
        """The WAL record at ``lsn``, which the index names: one that does not read is
        damage (CorruptionError), not a caller's wrong LSN."""
        try:
            return self.wal.record(lsn)
        except ValueError as exc:
            raise CorruptionError(lsn, lsn // self.wal.segment_size, str(exc)) from None

    # ---- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Flush what was appended, store the index and close the WAL; closing twice is fine."""
        with self._lock:
            try:
                if not self.wal.closed:
                    self._store_index(self._capture())
            except (WALError, OSError):
                pass  # a stopped writer, a full disk: the next open replays more
            finally:
                self.wal.close()
                self._files.close()

    @property
    def closed(self) -> bool:
        return self.wal.closed

    def stats(self) -> dict[str, int]:
        """The WAL's counters (``WAL.stats``) with ``entries``, ``first_index``, ``last_index``."""
        return {**self.wal.stats(), "entries": len(self), "first_index": self.first_index,
                "last_index": self.last_index}

    def _check_open(self) -> None:
        if self.wal.closed:
            raise ClosedError("the log is closed")

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"entries {_span(self._index)}"
        return f"<pmemwal.Log {self.wal.path} {state}>"


# ---- helpers ---------------------------------------------------------------------


def _span(ix: TieredIndex) -> str:
    return f"{ix.first}..{ix.next - 1}" if ix.count else f"none (the next is {ix.next})"


def _entry(index: int, record: Record, segment_size: int) -> Entry:
    """Entry ``index`` from the record the index names for it, which must say so itself (the
    index files hold no checksum: a record of another entry is damage, never an answer)."""
    payload = record.payload
    head = HEADER.unpack_from(payload) if len(payload) >= HEADER_SIZE else None
    if head is None or head[:3] != (MAGIC, VERSION, ENTRY) or head[4] != index:
        raise CorruptionError(record.lsn, record.lsn // segment_size,
                              f"the log's index names the record at {format_lsn(record.lsn)} "
                              f"for entry {index}, but it is "
                              f"{describe(bytes(payload[:HEADER_SIZE])) or 'no log record'}")
    return Entry(index, head[5], payload[HEADER_SIZE:])


def _check_headers(lsns: np.ndarray, lengths: np.ndarray, head: np.ndarray) -> None:
    """FormatError at the first record that is not a log record of a version we read."""
    bad = (lengths < HEADER_SIZE) | (head["magic"] != MAGIC) | (head["version"] != VERSION)
    if bad.any():
        i = int(np.argmax(bad))
        what = (f"log format version {head['version'][i]} (this pmemwal reads {VERSION})"
                if lengths[i] >= HEADER_SIZE and head["magic"][i] == MAGIC else "not a log record")
        raise FormatError(f"the record at LSN {format_lsn(int(lsns[i]))} is {what}: "
                          "this WAL was not written by pmemwal.Log")


def _dense_entries(head: np.ndarray, next_index: int | None) -> bool:
    """Is this batch only entries numbered consecutively, starting at or below ``next_index``
    (None: anywhere)?  Then it is applied in one step."""
    if not (head["kind"] == ENTRY).all():
        return False
    index = head["index"]
    start = int(index[0])
    if next_index is not None and start > next_index:
        return False
    return bool((index == np.arange(start, start + len(index), dtype=np.uint64)).all())


def describe(payload: bytes) -> dict[str, object] | None:
    """What a WAL record's payload says as a log record (kind and fields), or None when it is
    not one of a version this module reads; for inspection tools (``pmemwal dump``)."""
    if len(payload) < HEADER_SIZE:
        return None
    magic, version, kind, aux, index, term = HEADER.unpack_from(payload)
    if magic != MAGIC or version != VERSION or kind not in KIND_NAMES:
        return None
    if kind == STATE:
        try:
            vote = _decode_state(memoryview(payload)).vote
        except (FormatError, ValueError):
            vote = "?"
        return {"kind": "state", "term": term, "vote": vote if not isinstance(vote, bytes)
                else vote.hex(), "commit": index}
    fields: dict[str, object] = {"kind": KIND_NAMES[kind], "index": index}
    if kind in (ENTRY, SNAPSHOT):
        fields["term"] = term
    if kind == SNAPSHOT and aux == RESET:
        fields["reset"] = True
    return fields


def _encode_state(state: HardState) -> bytes:
    vote = state.vote
    if vote is None:
        aux, body = VOTE_NONE, b""
    elif isinstance(vote, bool) or not isinstance(vote, (int, str, bytes)):
        raise TypeError(f"vote must be None, an int, a str or bytes, not {type(vote).__name__}")
    elif isinstance(vote, int):
        aux, body = VOTE_INT, str(vote).encode()
    elif isinstance(vote, str):
        aux, body = VOTE_STR, vote.encode()
    else:
        aux, body = VOTE_BYTES, bytes(vote)
    return HEADER.pack(MAGIC, VERSION, STATE, aux, state.commit, state.term) + body


def _decode_state(payload: memoryview) -> HardState:
    _, _, _, aux, commit, term = HEADER.unpack_from(payload)
    body = bytes(payload[HEADER_SIZE:])
    decoders: dict[int, Callable[[bytes], int | str | bytes | None]] = {
        VOTE_NONE: lambda b: None, VOTE_INT: lambda b: int(b), VOTE_STR: lambda b: b.decode(),
        VOTE_BYTES: lambda b: b}
    vote = decoders.get(aux)
    if vote is None:
        raise FormatError(f"log state record with unknown vote encoding {aux}")
    return HardState(term, vote(body), commit)
