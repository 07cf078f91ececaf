"""The Log's index, kept durable beside the WAL: open reads it, then replays only the tail.

Concern: entry -> (LSN, term) for pmemwal.Log, in memory and on disk.  Entries
below the last index checkpoint are read from mapped files (memory follows what
is read, not what is kept, as Kafka's offset indexes); entries appended since
are in numpy arrays until the next one.  Nothing here writes the WAL.

Files, in ``index/`` of the WAL directory:

    LOG              two slots written in turn (pmemwal/slots.py): where the index stands
    <chunk>.lidx     16 hex digits, entries [chunk * 2^20, (chunk + 1) * 2^20): 16 bytes
                     each, u64 LSN then u64 term (little-endian), at (index % 2^20) * 16;
                     sparse

LOG's slot body, little-endian:

     0  8s   magic           b"PWLIDX1\\0"
     8  u32  version         1
    12  u32  flags           bit 0 KNOWN: a record fixed the numbering (log.py, _apply)
    16  u64  seq             one more than the slot it replaces; slot seq % 2 is written
    24  16s  wal_id          the WAL's
    40  u64  replay_lsn      the WAL's records below it are in the index; open replays from it
    48  u64  guard_lsn       the record that ends at replay_lsn (0: none), and ...
    56  u32  guard_crc       ... the CRC-32C of its payload: a WAL cut and written anew below
                             replay_lsn is found out, and the index is then rebuilt
    60  u32  chunk_bits      20
    64  u64  first           the first entry kept
    72  u64  next            one past the last entry: [first, next) is in the chunk files
    80  u64  snapshot_index  the last compacted entry and its term
    88  u64  snapshot_term
    96  u64  state_lsn       the latest state record (0: none)
   104  u64  wal_cuts        the WAL's count of recoveries that cut durable records when
                             this was stored (pmemwal/checkpoint.py: cuts); another is a WAL
                             written anew below replay_lsn, which the guard alone may miss

An index checkpoint writes the chunk slots of the entries changed since the last one,
fdatasyncs those files (and ``index/``, the first time this process writes each one), then
writes the next LOG slot: a slot never names entries whose slots are not durable.  Slots
are numbered on from the highest valid one, and an open that finds the index unusable
first writes one that names nothing (replay_lsn 0), so that no older slot comes back.
Slots a rewind or a reset voids are written again later, while the slot before still
names them: an open from that slot replays the WAL from its replay_lsn, which holds the
rewind or reset (it came after), and so never reads them.
Chunk files wholly below ``first`` go once a slot naming that ``first`` is durable.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from pmemwal import _core
from pmemwal.chunked import CHUNK_BITS, ChunkedColumn
from pmemwal.slots import SlotPair

INDEX_DIR = "index"
META_NAME = "LOG"
MAGIC = b"PWLIDX1\0"
VERSION = 1
KNOWN = 1
_SLOT = np.dtype([("lsn", "<u8"), ("term", "<u8")])
_BODY = struct.Struct("<8sIIQ16sQQIIQQQQQQ")


@dataclass(frozen=True)
class IndexState:
    """What one LOG slot says."""

    seq: int
    replay_lsn: int
    guard_lsn: int
    guard_crc: int
    first: int
    next: int
    known: bool
    snapshot: tuple[int, int]
    state_lsn: int
    wal_cuts: int = 0

    def pack(self, wal_id: bytes) -> bytes:
        return _BODY.pack(MAGIC, VERSION, KNOWN if self.known else 0, self.seq, wal_id,
                          self.replay_lsn, self.guard_lsn, self.guard_crc, CHUNK_BITS,
                          self.first, self.next, self.snapshot[0], self.snapshot[1],
                          self.state_lsn, self.wal_cuts)


def _unpack(body: bytes | None, wal_id: bytes) -> IndexState | None:
    if body is None:
        return None
    (magic, version, flags, seq, wid, replay, guard, guard_crc, bits, first, nxt, snap_index,
     snap_term, state_lsn, cuts) = _BODY.unpack_from(body)
    if magic != MAGIC or version != VERSION or wid != wal_id or bits != CHUNK_BITS or \
            flags & ~KNOWN or first > nxt or guard >= max(replay, 1):
        return None
    return IndexState(seq, replay, guard, guard_crc, first, nxt, bool(flags & KNOWN),
                      (snap_index, snap_term), state_lsn, cuts)


def payload_crc(payload) -> int:
    return _core.crc32c(payload)


class IndexFiles:
    """``index/`` of one WAL directory: the LOG slots and the mapped chunk files."""

    def __init__(self, wal_dir: str, wal_id: bytes) -> None:
        self.path = os.path.join(wal_dir, INDEX_DIR)
        self._wal_id = wal_id
        self._slots = SlotPair(os.path.join(self.path, META_NAME))
        self._chunks = ChunkedColumn(self.path, "lidx", _SLOT)
        self.last_seq = 0                # the highest valid slot's seq: the next goes past it

    def read_state(self) -> IndexState | None:
        valid = [s for body in self._slots.read() if (s := _unpack(body, self._wal_id))]
        if not valid:
            return None
        newest = max(valid, key=lambda s: s.seq)
        self.last_seq = max(self.last_seq, newest.seq)
        return newest

    def missing_chunks(self, first: int, next_index: int) -> list[int]:
        """The chunks entries [first, next) lie in whose files are missing or short."""
        return self._chunks.missing(first, next_index)

    def write_state(self, state: IndexState) -> None:
        self._slots.write(state.seq % 2, state.pack(self._wal_id))
        self.last_seq = max(self.last_seq, state.seq)

    def lsns(self, start: int, stop: int) -> np.ndarray:
        """LSNs of entries [start, stop), from the mapped chunks."""
        return self._chunks.read(start, stop)["lsn"]

    def lsn_at(self, index: int) -> int:
        return self._chunks.word(index, 0)

    def lsns_at(self, indices: np.ndarray) -> np.ndarray:
        """LSNs of the entries ``indices`` (int64), from the mapped chunks."""
        return self._chunks.take(indices)["lsn"]

    def slot(self, index: int) -> tuple[int, int]:
        lsn, term = self._chunks.item(index).tolist()
        return lsn, term

    def write(self, start: int, lsns: np.ndarray, terms: np.ndarray) -> None:
        """The slots of entries [start, start + len(lsns)), written and synced."""
        slots = np.empty(len(lsns), _SLOT)
        slots["lsn"], slots["term"] = lsns, terms
        self._chunks.write(start, slots)

    def remove_below(self, first: int) -> None:
        """Delete the chunk files wholly below entry ``first`` (a durable state says so)."""
        self._chunks.remove_below(first)

    def close(self) -> None:
        self._chunks.close()


class HeapIndex:
    """Entry index -> (LSN, term), for the entries [first, next): numpy arrays with room
    at the end to grow into and a start offset that compaction moves forward."""

    def __init__(self, first: int = 1) -> None:
        self.lsn = np.zeros(1024, np.uint64)
        self.term = np.zeros(1024, np.uint64)
        self.start = self.count = 0
        self.first = first                      # index of entry 0 of the live range

    @property
    def next(self) -> int:
        return self.first + self.count

    def slot(self, index: int) -> int:
        return self.start + index - self.first

    def _room(self, n: int) -> int:
        """Make room for n more entries; returns where they go."""
        end = self.start + self.count
        if end + n > len(self.lsn):
            cap = max(2 * (self.count + n), 1024)
            for name in ("lsn", "term"):
                grown = np.zeros(cap, np.uint64)
                grown[:self.count] = getattr(self, name)[self.start:end]
                setattr(self, name, grown)
            self.start, end = 0, self.count
        return end

    def extend(self, lsns: np.ndarray, terms: np.ndarray) -> None:
        end = self._room(len(lsns))
        self.lsn[end:end + len(lsns)] = lsns
        self.term[end:end + len(lsns)] = terms
        self.count += len(lsns)

    def push(self, lsn: int, term: int) -> None:
        end = self.start + self.count
        if end == len(self.lsn):
            end = self._room(1)
        self.lsn[end] = lsn
        self.term[end] = term
        self.count += 1

    def restart(self, first: int) -> None:
        """No entries; the next one is ``first``."""
        self.start, self.count, self.first = 0, 0, first
        if len(self.lsn) > 1 << 16:  # what a burst grew it to goes back
            self.lsn, self.term = np.zeros(1024, np.uint64), np.zeros(1024, np.uint64)

    def keep_through(self, index: int) -> None:
        """Void the entries above ``index`` (which may lie below the live range)."""
        if index < self.first:
            self.restart(index + 1)
        elif index < self.next:
            self.count = index - self.first + 1

    def drop_through(self, index: int) -> None:
        """Drop the entries up to ``index``; past the end, the log goes on at ``index + 1``."""
        if index + 1 >= self.next:
            self.restart(index + 1)
        elif index >= self.first:
            gone = index + 1 - self.first
            self.start, self.count, self.first = self.start + gone, self.count - gone, index + 1


class TieredIndex:
    """The entries [first, next): those below ``durable_next`` read from the index files,
    the rest in a HeapIndex.  ``changes`` counts every rewind, reset and compaction: an
    index checkpoint that saw another count moves nothing into the files' tier."""

    def __init__(self, files: IndexFiles, first: int = 1, durable_next: int | None = None) -> None:
        self.files = files
        self.first = first
        self.heap = HeapIndex(first if durable_next is None else durable_next)
        self.counter = np.zeros(1, np.uint64)  # the count of changes, where C reads it too

    @property
    def changes(self) -> int:
        return self.counter.item(0)

    @property
    def durable_next(self) -> int:
        return self.heap.first

    @property
    def next(self) -> int:
        return self.heap.next

    @property
    def count(self) -> int:
        return self.next - self.first

    def restart(self, first: int) -> None:
        self.first = first
        self.heap.restart(first)
        self.counter[0] += 1

    def keep_through(self, index: int) -> None:
        self.counter[0] += 1
        if index < self.first:
            self.restart(index + 1)
        elif index + 1 < self.durable_next:
            self.heap.restart(index + 1)  # the files' tier ends there now
        else:
            self.heap.keep_through(index)

    def drop_through(self, index: int) -> None:
        self.counter[0] += 1
        if index + 1 >= self.next:
            self.restart(index + 1)
        elif index >= self.first:
            self.first = index + 1
            if self.first > self.durable_next:
                self.heap.drop_through(index)

    def extend(self, lsns: np.ndarray, terms: np.ndarray) -> None:
        self.heap.extend(lsns, terms)

    def push(self, lsn: int, term: int) -> None:
        self.heap.push(lsn, term)

    def lsn_at(self, index: int) -> int:
        h = self.heap
        if index < h.first:  # (h.first is durable_next)
            return self.files.lsn_at(index)
        return h.lsn.item(h.start + index - h.first)

    def term_at(self, index: int) -> int:
        if index < self.durable_next:
            return self.files.slot(index)[1]
        return int(self.heap.term[self.heap.slot(index)])

    def lsns_at(self, indices: np.ndarray) -> np.ndarray:
        """LSNs of the entries ``indices`` (int64, each within [first, next))."""
        h, out = self.heap, np.empty(len(indices), np.uint64)
        recent = indices >= h.first  # (h.first is durable_next)
        out[recent] = h.lsn[indices[recent] - h.first + h.start]
        stored = ~recent
        if stored.any():
            out[stored] = self.files.lsns_at(indices[stored])
        return out

    def lsns(self, start: int, stop: int) -> np.ndarray:
        """LSNs of the entries [start, stop), within [first, next) (their terms are read
        from the records: log.py's _entry)."""
        cut = min(max(start, self.durable_next), stop)
        stored, h = self.files.lsns(start, cut), self.heap
        recent = h.lsn[h.slot(cut):h.slot(stop)]
        return np.concatenate([stored, recent]) if len(stored) else recent

    def pending(self) -> tuple[int, np.ndarray, np.ndarray]:
        """The entries not in the files yet: (first index, LSNs, terms), copied."""
        h = self.heap
        start = max(h.first, self.first)
        return start, h.lsn[h.slot(start):h.slot(h.next)].copy(), \
            h.term[h.slot(start):h.slot(h.next)].copy()

    def stored(self, next_index: int) -> None:
        """The entries below ``next_index`` are in the files now (no change came between)."""
        if next_index > self.durable_next:
            self.heap.drop_through(next_index - 1)


