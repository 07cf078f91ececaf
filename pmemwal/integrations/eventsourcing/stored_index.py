"""The eventsourcing datastores' index, kept durable beside their log: an open maps it and
replays only the entries appended after it, as the Log does with its own
(pmemwal/log_index.py).

Concern: the storage of one datastore's index (index.py keeps
what the index means).  A *row* is a notification (in a DCB log, a position), numbered
densely from 1: the log entry that holds its event, the event's offset in that entry's
payload, and its *name* (the event's topic, or the DCB event's type: a number into the
names list).  A *key* is an originator (its versions, each with its notification ID) or a
DCB tag (its positions).  Rows and keys that the last index checkpoint stored are read from
mapped files; those added since are in the heap until the next one, so memory follows what
is read and what was added since, not what is kept.  Nothing here writes the log.

Files, in ``index/es/`` of the log's WAL directory (beside the Log's own index files):

    STATE              two slots written in turn (pmemwal/slots.py): the last checkpoint
    <seq>.manifest     16 hex digits: what checkpoint <seq> holds (JSON, below)
    <chunk>.rows       rows (pmemwal/chunked.py: 2^20 a file, sparse), 16 bytes each,
                       little-endian: i64 entry, u32 offset, i32 name; row n at item n - 1
    <id>.run           16 hex digits: a sorted run of key pairs (below)

STATE's slot body, little-endian:

     0  8s   magic          b"PWESIX1\\0"
     8  u32  version        1
    12  u32  flavor         1: originators (an events log), 2: tags (a DCB events log)
    16  u64  seq            one more than the slot it replaces; slot seq % 2 is written
    24  16s  wal_id         the log's WAL's
    40  u64  next_entry     the log entries below it are in the index; open replays from it
    48  u64  rows           rows 1..rows are in the chunk files
    56  u32  guard_crc      CRC-32C of entry next_entry - 1's payload: a log written anew
                            is found out, and the index is then rebuilt (0 when none)
    60  u32  manifest_crc   CRC-32C of <seq>.manifest, and ...
    64  u64  manifest_size  ... its size (0: no manifest, an index of nothing)
    72  u64  wal_cuts       the WAL's count of recoveries that cut durable records
                            (pmemwal/checkpoint.py): another means the index may name
                            entries that are gone

The manifest, JSON: ``{"names": [name, ...], "tracking": {application name: notification
ID}, "runs": [[id, count], ...], "next_run": id}``, runs oldest first.

A run holds key pairs sorted by (hash, a): a 32-byte header (8s magic b"PWESRUN1", u64
count, 16 zero bytes), then three little-endian columns of ``count`` items: u64 hash (of
the key: ``key_hash``), i64 a, i64 b.  For an originator ``a`` is a version and ``b`` its
notification ID; for a tag ``a`` and ``b`` are both a position.  Two keys may share a
hash, so what a run finds is checked against the event itself (the caller's ``verify``).

A checkpoint writes the rows added since the last one (synced), a run of the key pairs
added since (synced), merged runs (each a new file, synced), the directory, then the
manifest (synced, and the directory), then the next STATE slot: a slot never names rows or
a file that is not durable, and no file is written over once named.  The newest run is
merged into the one before while it is at least an eighth of its size, so a key takes a
few binary searches; a merge streams both runs into its file a chunk at a time, so its
memory does not follow their size.  Files that neither slot's
manifest names go after the slot is written.  An open that finds the stored index
unusable writes a slot that names nothing before it replays, so no older slot comes back.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import mmap
import os
import re
import struct
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from pmemwal import _core
from pmemwal.chunked import ChunkedColumn, close_map
from pmemwal.segments import make_directories, storage_errors, sync_directory
from pmemwal.slots import SlotPair

INDEX_DIR = os.path.join("index", "es")
STATE_NAME = "STATE"
MAGIC = b"PWESIX1\0"
RUN_MAGIC = b"PWESRUN1"
VERSION = 1
ORIGINATORS, TAGS = 1, 2                    # flavors
FANOUT = 8                                  # runs merge while the newer is >= 1/FANOUT of the older
MERGE_CHUNK = 1 << 14                       # pairs a merge takes from each run at a time
ROW = np.dtype([("entry", "<i8"), ("offset", "<u4"), ("name", "<i4")])
_BODY = struct.Struct("<8sIIQ16sQQIIQQ")
_RUN_HEADER = struct.Struct("<8sQ16x")
_FILE_NAME = re.compile(r"^([0-9A-F]{16})\.(run|manifest)$")
HASH_MASK = (1 << 64) - 1                   # tests narrow it to make keys share hashes


def key_hash(key: bytes) -> int:
    """A key's 64-bit hash: BLAKE2b of its bytes (the caller tags them by kind)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & HASH_MASK


@dataclass(frozen=True)
class IndexState:
    """What one STATE slot says."""

    seq: int
    flavor: int
    next_entry: int = 1
    rows: int = 0
    guard_crc: int = 0
    manifest_crc: int = 0
    manifest_size: int = 0
    wal_cuts: int = 0

    def pack(self, wal_id: bytes) -> bytes:
        return _BODY.pack(MAGIC, VERSION, self.flavor, self.seq, wal_id, self.next_entry,
                          self.rows, self.guard_crc, self.manifest_crc, self.manifest_size,
                          self.wal_cuts)


def _unpack(body: bytes | None, wal_id: bytes, flavor: int) -> IndexState | None:
    if body is None:
        return None
    (magic, version, kind, seq, wid, next_entry, rows, guard, mcrc, msize,
     cuts) = _BODY.unpack_from(body)
    if magic != MAGIC or version != VERSION or kind != flavor or wid != wal_id or \
            next_entry < 1:
        return None
    return IndexState(seq, kind, next_entry, rows, guard, mcrc, msize, cuts)


# ---- runs: sorted key pairs in a mapped file ---------------------------------------------

class Run:
    """One run file, mapped read-only."""

    def __init__(self, ident: int, path: str, count: int) -> None:
        """Map the run at ``path``; ValueError unless it holds ``count`` pairs."""
        self.ident, self.count = ident, count
        size = _RUN_HEADER.size + 24 * count
        with storage_errors(f"mapping {path}"), open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise ValueError(f"run {os.path.basename(path)} is not {size} bytes")
            self._map = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        magic, stored = _RUN_HEADER.unpack_from(self._map)
        if magic != RUN_MAGIC or stored != count:
            self.close()
            raise ValueError(f"run {os.path.basename(path)} has another header")
        at = _RUN_HEADER.size
        self.hash = np.frombuffer(self._map, "<u8", count, at)
        self.a = np.frombuffer(self._map, "<i8", count, at + 8 * count)
        self.b = np.frombuffer(self._map, "<i8", count, at + 16 * count)

    def span(self, h: int) -> tuple[int, int]:
        """The positions [lo, hi) of hash ``h``'s pairs: two binary searches."""
        key = np.uint64(h)
        lo = int(np.searchsorted(self.hash, key, "left"))
        if lo == self.count or self.hash[lo] != key:
            return lo, lo
        return lo, int(np.searchsorted(self.hash, key, "right"))

    def between(self, h: int, gt: int | None, lte: int | None
                ) -> tuple[np.ndarray, np.ndarray]:
        """The (a, b) pairs of hash ``h`` with gt < a <= lte, sorted by a: views of the
        map (the caller copies what it keeps before the run may close), found by binary
        search, so a key's lookup does not follow its number of pairs."""
        lo, hi = self.span(h)
        if lo == hi:
            return _NONE, _NONE
        a = self.a[lo:hi]
        i = 0 if gt is None else int(np.searchsorted(a, gt, "right"))
        j = hi - lo if lte is None else int(np.searchsorted(a, lte, "right"))
        return a[i:j], self.b[lo + i:lo + j]

    def close(self) -> None:
        self.hash = self.a = self.b = _NONE     # (lookups copy what they keep)
        close_map(self._map)


_NONE = np.empty(0, np.int64)


def write_run(path: str, hashes: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """A run file of these pairs (sorted by the caller), synced."""
    with _new_run(path) as fd:
        _write_at(fd, _RUN_HEADER.pack(RUN_MAGIC, len(hashes)), 0)
        at = _RUN_HEADER.size
        for column, dtype in ((hashes, "<u8"), (a, "<i8"), (b, "<i8")):
            _write_at(fd, np.ascontiguousarray(column, dtype), at)
            at += 8 * len(hashes)


@contextmanager
def _new_run(path: str) -> Iterator[int]:
    """A new run file's descriptor, to write whole; synced (``sync_run``) and closed after."""
    with storage_errors(f"writing {path}"):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            yield fd
            sync_run(fd)
        finally:
            os.close(fd)


def sync_run(fd: int) -> None:
    """A run file's data durable before anything names it."""
    os.fdatasync(fd)


def _write_file(path: str, parts: list) -> None:
    """A new file of these parts, written whole and synced (its directory is not)."""
    with storage_errors(f"writing {path}"):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for part in parts:
                data = memoryview(part).cast("B")
                while data:
                    data = data[os.write(fd, data):]
            os.fdatasync(fd)
        finally:
            os.close(fd)


def merge_runs(path: str, older: Run, newer: Run, chunk: int | None = None) -> None:
    """A run file of both runs' pairs, synced: sorted by (hash, a), and among equal pairs
    ``older``'s first (a stable sort of older's then newer's pairs).  Written chunk by chunk
    (each column's part at its place), so memory follows ``chunk``, not the runs."""
    count, base = older.count + newer.count, _RUN_HEADER.size
    with _new_run(path) as fd:
        _write_at(fd, _RUN_HEADER.pack(RUN_MAGIC, count), 0)
        done = 0
        for columns in _merged(older, newer, chunk or MERGE_CHUNK):
            for k, column in enumerate(columns):
                _write_at(fd, column, base + 8 * (k * count + done))
            done += len(columns[0])


def _merged(older: Run, newer: Run, chunk: int
            ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The (hash, a, b) columns of both runs' pairs in order, a part at a time: each part
    is every pair up to the smaller of the two next chunks' last pairs (ties included), so
    what follows sorts after it."""
    i = j = 0
    while i < older.count or j < newer.count:
        ends = [(int(run.hash[at + chunk - 1]), int(run.a[at + chunk - 1]))
                for run, at in ((older, i), (newer, j)) if at + chunk < run.count]
        if ends:
            h, a = min(ends)
            stop_i, stop_j = _upper(older, h, a), _upper(newer, h, a)
        else:
            stop_i, stop_j = older.count, newer.count
        hashes = np.concatenate([older.hash[i:stop_i], newer.hash[j:stop_j]])
        values = np.concatenate([older.a[i:stop_i], newer.a[j:stop_j]])
        order = np.lexsort((values, hashes))    # (stable: older's first among equal pairs)
        yield (hashes[order], values[order],
               np.concatenate([older.b[i:stop_i], newer.b[j:stop_j]])[order])
        i, j = stop_i, stop_j


def _upper(run: Run, h: int, a: int) -> int:
    """How many of ``run``'s pairs sort at or before (h, a)."""
    lo, hi = run.span(h)
    return lo + int(np.searchsorted(run.a[lo:hi], a, "right"))


def _write_at(fd: int, part: bytes | np.ndarray, offset: int) -> None:
    data = memoryview(part if isinstance(part, bytes) else part.data).cast("B")
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def sorted_pairs(hashes: np.ndarray, a: np.ndarray, b: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.lexsort((a, hashes))
    return hashes[order], a[order], b[order]


class _ListSpan:
    """values[i:j] of a tail's list, sliced further without copying the rest."""

    __slots__ = ("values", "i", "j")

    def __init__(self, values: list[int], i: int, j: int) -> None:
        self.values, self.i, self.j = values, i, j

    def __len__(self) -> int:
        return self.j - self.i

    def __getitem__(self, span: slice) -> list[int]:
        lo, hi, _ = span.indices(self.j - self.i)
        return self.values[self.i + lo:self.i + hi]


def _take(a: np.ndarray | _ListSpan, b: np.ndarray | _ListSpan, desc: bool, limit: int | None,
          upto: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``limit`` pairs with b <= upto of sorted pairs (a run's views or a tail's
    span), from the end when ``desc``, copied.  Pairs over ``upto`` (not durable yet) are
    few and recent: the window read doubles past them."""
    size = len(a)
    window = size if limit is None else min(limit, size)
    while True:
        lo, hi = (size - window, size) if desc else (0, window)
        wa, wb = np.array(a[lo:hi], np.int64), np.array(b[lo:hi], np.int64)
        if desc:
            wa, wb = wa[::-1], wb[::-1]
        if upto is not None:
            keep = wb <= upto
            if not keep.all():
                wa, wb = wa[keep], wb[keep]
        if limit is None or len(wa) >= limit or window == size:
            return wa[:limit], wb[:limit]
        window = min(size, 2 * window)


# ---- the index in memory: rows, names, keys, tracking ----------------------------------

Pairs = tuple[list[int], list[int]]          # a tail's (a values ascending, their b values)
K = TypeVar("K", bound=Hashable)             # a flavor's key: an originator, or a tag


@dataclass
class Captured(Generic[K]):
    """What one checkpoint writes, taken under the datastore's lock."""

    next_entry: int
    guard_crc: int
    rows_start: int                          # the first row not in the files (1-based)
    rows: np.ndarray
    pairs: dict[K, Pairs]                    # the key pairs not in a run yet (frozen)
    runs: list[Run]
    names: list[str]
    tracking: dict[str, int]
    next_run: int


@dataclass
class Written:
    """A checkpoint written, to install in the index."""

    captured: Captured[Any]
    runs: list[Run]
    next_run: int


class StoredIndex(Generic[K]):
    """The part of an index every flavor has: rows, names, keys and tracking positions,
    stored ones mapped from an IndexStore's files, new ones in the heap.  The caller holds
    the datastore's lock; ``tagged`` gives a key's bytes for its hash."""

    flavor = ORIGINATORS

    def __init__(self, tagged: Callable[[K], bytes]) -> None:
        self._tagged = tagged
        self._column: ChunkedColumn | None = None
        self.durable_rows = 0                       # rows 1..durable_rows are in the files
        self._heap = np.empty(1024, ROW)            # rows durable_rows + 1 ...
        self._heap_count = 0
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.tracking: dict[str, int] = {}          # application name -> last ID tracked
        self.runs: list[Run] = []
        self.frozen: dict[K, Pairs] = {}            # key pairs a checkpoint is writing
        self.tail: dict[K, Pairs] = {}              # key pairs since
        self.next_entry = 1                         # the log entry after the last added
        self.next_run = 1
        self._guard: tuple[int, bytes | memoryview | int] | None = None
        self._stored_next = 1                       # next_entry of the last checkpoint

    @property
    def tagged(self) -> Callable[[K], bytes]:
        return self._tagged

    def attach(self, column: ChunkedColumn) -> None:
        """Read stored rows from ``column``."""
        self._column = column

    def load(self, state: IndexState, manifest: dict, runs: Iterable[Run]) -> None:
        """Take what a stored state names (IndexStore.load read it)."""
        names = [str(name) for name in manifest["names"]]
        tracking = {str(k): int(v) for k, v in manifest["tracking"].items()}
        self.durable_rows, self.next_entry = state.rows, state.next_entry
        self.names, self.name_ids = names, {name: i for i, name in enumerate(names)}
        self.tracking = tracking
        self.runs, self.next_run = list(runs), int(manifest["next_run"])
        self._guard = (state.next_entry - 1, state.guard_crc)
        self._stored_next = state.next_entry

    @property
    def _stored(self) -> ChunkedColumn:
        """The column of the stored rows (there are some only once one is attached)."""
        assert self._column is not None, "stored rows, but no column attached"
        return self._column

    @property
    def count(self) -> int:
        return self.durable_rows + self._heap_count

    # ---- adding ----

    def name_id(self, name: str) -> int:
        got = self.name_ids.get(name)
        if got is None:
            got = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return got

    def add_rows(self, entry: int, payload: bytes | memoryview, offsets: list[int],
                 names: list[int]) -> None:
        """Rows of log entry ``entry`` (whose payload the guard takes, should it be the
        last when a checkpoint is written)."""
        n, end = len(offsets), self._heap_count + len(offsets)
        if end > len(self._heap):
            grown = np.empty(max(2 * len(self._heap), end), ROW)
            grown[:self._heap_count] = self._heap[:self._heap_count]
            self._heap = grown
        rows = self._heap[self._heap_count:end]
        rows["entry"], rows["offset"], rows["name"] = entry, offsets, names
        self._heap_count += n
        self.next_entry, self._guard = entry + 1, (entry, payload)

    def add_pair(self, key: K, a: int, b: int) -> None:
        values, bs = self.tail.setdefault(key, ([], []))
        if not values or a > values[-1]:
            values.append(a)
            bs.append(b)
        else:                       # versions may come out of order
            at = bisect.bisect_left(values, a)
            values.insert(at, a)
            bs.insert(at, b)

    def seal_guard(self) -> int:
        """The last entry's payload as its CRC (a view of the log must not be held); returns
        that CRC (0: no entry)."""
        if self._guard is None:
            return 0
        entry, guard = self._guard
        if not isinstance(guard, int):
            guard = _core.crc32c(guard)
            self._guard = (entry, guard)
        return guard

    # ---- reading ----

    def rows(self, numbers: list[int] | np.ndarray) -> np.ndarray:
        """The rows of these row numbers (1-based), copied."""
        at = np.asarray(numbers, np.int64) - 1
        out = np.empty(len(at), ROW)
        stored = at < self.durable_rows
        if stored.any():
            out[stored] = self._stored.take(at[stored])
        if not stored.all():
            out[~stored] = self._heap[at[~stored] - self.durable_rows]
        return out

    def row_names(self, first: int, last: int) -> np.ndarray:
        """The name column of rows first..last (1-based, within the count)."""
        cut = min(max(first - 1, self.durable_rows), last)
        stored = self._stored.read(first - 1, cut)["name"] if cut > first - 1 else None
        recent = self._heap["name"][max(first - 1, cut) - self.durable_rows:
                                    last - self.durable_rows]
        return recent if stored is None else np.concatenate([stored, recent])

    def key_pairs(self, key: K, gt: int | None = None, lte: int | None = None,
                  desc: bool = False, limit: int | None = None, upto: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(a, b) of ``key``'s pairs with gt < a <= lte and b <= upto, sorted by a (descending
        when ``desc``), the first ``limit`` of them, and whether a run gave some (which a
        caller checks against the events: another key may share the hash).  Each run, and
        the tails, are searched (bisect): what is copied is what is given, not the key's
        every pair."""
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        from_runs = False
        if self.runs:
            h = key_hash(self._tagged(key))
            for run in self.runs:
                a, b = run.between(h, gt, lte)
                if len(a):
                    parts.append(_take(a, b, desc, limit, upto))
                    from_runs = True
        for held in (self.frozen.get(key), self.tail.get(key)):
            if held is not None:
                values, bs = held
                i = 0 if gt is None else bisect.bisect_right(values, gt)
                j = len(values) if lte is None else bisect.bisect_right(values, lte)
                if i < j:
                    parts.append(_take(_ListSpan(values, i, j), _ListSpan(bs, i, j), desc,
                                       limit, upto))
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return _NONE, _NONE, from_runs
        if len(parts) == 1:
            return parts[0][0], parts[0][1], from_runs
        a, b = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        order = np.argsort(-a if desc else a, kind="stable")[:limit]
        return a[order], b[order], from_runs

    def has_pair(self, key: K, a: int, verify: Callable[[int], bool]) -> bool:
        """Whether ``key`` has a pair of value ``a``; ``verify(b)`` checks a run's."""
        for held in (self.tail.get(key), self.frozen.get(key)):
            if held is not None:
                i = bisect.bisect_left(held[0], a)
                if i < len(held[0]) and held[0][i] == a:
                    return True
        if self.runs:
            h = key_hash(self._tagged(key))
            for run in self.runs:
                _, bs = run.between(h, a - 1, a)
                if any(verify(b) for b in bs.tolist()):
                    return True
        return False

    # ---- checkpoints ----

    def capture(self) -> Captured[K] | None:
        """What the next checkpoint writes (None: nothing since the last): the tail is
        frozen, and new pairs go to a new tail."""
        if self.next_entry == self._stored_next:
            return None
        for key, (values, bs) in self.tail.items():
            into = self.frozen.get(key)
            if into is None:
                self.frozen[key] = (values, bs)
            else:                   # (a failed checkpoint left its frozen tail)
                for a, b in zip(values, bs):
                    at = bisect.bisect_left(into[0], a)
                    into[0].insert(at, a)
                    into[1].insert(at, b)
        self.tail = {}
        guard = self.seal_guard()
        return Captured(self.next_entry, guard, self.durable_rows + 1,
                        self._heap[:self._heap_count].copy(), self.frozen, list(self.runs),
                        list(self.names), dict(self.tracking), self.next_run)

    def install(self, written: Written) -> list[Run]:
        """A checkpoint is durable: its rows leave the heap, its runs replace the ones it
        merged, its frozen tail goes.  Returns the runs no longer used (to close)."""
        captured = written.captured
        assert captured.rows_start == self.durable_rows + 1, "checkpoints install in order"
        gone = len(captured.rows)
        kept = self._heap[gone:self._heap_count]
        if len(self._heap) > max(4 * len(kept), 1 << 16):    # what a replay grew it to goes
            self._heap = np.empty(max(2 * len(kept), 1024), ROW)
        self._heap[:len(kept)] = kept
        self._heap_count = len(kept)
        self.durable_rows += gone
        if self.frozen is captured.pairs:
            self.frozen = {}
        using = {id(run) for run in written.runs}
        retired = [run for run in self.runs if id(run) not in using]
        self.runs, self.next_run = list(written.runs), written.next_run
        self._stored_next = captured.next_entry
        return retired

    def close(self) -> None:
        runs, self.runs = self.runs, []
        for run in runs:
            run.close()


# ---- the files --------------------------------------------------------------------------

class IndexStore(Generic[K]):
    """``index/es/`` of one log's WAL directory: STATE, manifests, rows and runs."""

    def __init__(self, wal_dir: str, wal_id: bytes, flavor: int,
                 tagged: Callable[[K], bytes]) -> None:
        self.path = os.path.join(wal_dir, INDEX_DIR)
        self.flavor = flavor
        self.tagged = tagged                 # a key's bytes, for its hash
        self.rows = ChunkedColumn(self.path, "rows", ROW)
        self._wal_id = wal_id
        self._slots = SlotPair(os.path.join(self.path, STATE_NAME))
        self.last_seq = 0                    # the highest valid slot's seq: the next goes past
        self._kept: tuple[int, ...] = ()     # the seqs whose files must stay: both slots'

    def _file(self, ident: int, kind: str) -> str:
        return os.path.join(self.path, f"{ident:016X}.{kind}")

    # ---- reading ----

    def read_state(self) -> IndexState | None:
        """The newest valid slot's state."""
        valid = [s for body in self._slots.read()
                 if (s := _unpack(body, self._wal_id, self.flavor))]
        if not valid:
            return None
        valid.sort(key=lambda s: s.seq)
        self.last_seq = max(self.last_seq, valid[-1].seq)
        self._kept = tuple(s.seq for s in valid)
        return valid[-1]

    def load(self, state: IndexState) -> tuple[dict, list[Run]]:
        """The manifest and the mapped runs ``state`` names; ValueError (or OSError) why
        they are unusable."""
        if not state.manifest_size:
            raise ValueError("it names no manifest")
        with open(self._file(state.seq, "manifest"), "rb") as f:
            data = f.read(state.manifest_size + 1)
        if len(data) != state.manifest_size or _core.crc32c(data) != state.manifest_crc:
            raise ValueError(f"its manifest {state.seq:016X}.manifest is damaged")
        manifest = json.loads(data)
        gone = self.rows.missing(0, state.rows)
        if gone:
            raise ValueError(f"its rows file {gone[0]:016X}.rows is missing or short")
        runs: list[Run] = []
        try:
            for ident, count in manifest["runs"]:
                runs.append(Run(ident, self._file(ident, "run"), count))
        except BaseException:
            for run in runs:
                run.close()
            raise
        return manifest, runs

    # ---- writing ----

    def void(self, wal_cuts: int) -> None:
        """A state that names nothing, above every one there is (before a rebuild)."""
        self._write_state(IndexState(self.last_seq + 1, self.flavor, wal_cuts=wal_cuts))

    def next_free_run(self) -> int:
        """A run number above every run file there is: a rebuilt index's runs leave the
        files an older state names as they are."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return 1
        idents = [int(m.group(1), 16) for name in names
                  if (m := _FILE_NAME.match(name)) and m.group(2) == "run"]
        return max(idents, default=0) + 1

    def write(self, captured: Captured[K], wal_cuts: int) -> Written:
        """Write a checkpoint: rows, a run of the frozen pairs, merges, the manifest, the
        state, in that order, each synced before the next names it."""
        self.rows.write(captured.rows_start - 1, captured.rows)
        runs, next_run = list(captured.runs), captured.next_run
        new = self._frozen_run(captured.pairs, next_run)
        try:
            if new is not None:
                runs.append(new)
                next_run += 1
                while len(runs) >= 2 and runs[-1].count * FANOUT >= runs[-2].count:
                    merged = self._merge(runs[-2], new, next_run)
                    new.close()         # (made by this checkpoint: nobody maps it)
                    runs[-2:] = [merged]
                    new, next_run = merged, next_run + 1
                with storage_errors(f"syncing {self.path}"):
                    sync_directory(self.path)
            seq = self.last_seq + 1
            manifest = json.dumps({"names": captured.names, "tracking": captured.tracking,
                                   "runs": [[r.ident, r.count] for r in runs],
                                   "next_run": next_run}).encode()
            _write_file(self._file(seq, "manifest"), [manifest])
            with storage_errors(f"syncing {self.path}"):
                sync_directory(self.path)
        except BaseException:
            if new is not None:
                new.close()             # (the frozen pairs stay: the next one writes them)
            raise
        state = IndexState(seq, self.flavor, captured.next_entry,
                           captured.rows_start - 1 + len(captured.rows), captured.guard_crc,
                           _core.crc32c(manifest), len(manifest), wal_cuts)
        self._write_state(state)
        return Written(captured, runs, next_run)

    def _frozen_run(self, pairs: dict[K, Pairs], ident: int) -> Run | None:
        if not pairs:
            return None
        tagged = self.tagged
        counts = [len(values) for values, _ in pairs.values()]
        hashes = np.repeat(np.fromiter((key_hash(tagged(k)) for k in pairs), np.uint64,
                                       len(pairs)), counts)
        a = np.fromiter((v for values, _ in pairs.values() for v in values), np.int64,
                        sum(counts))
        b = np.fromiter((v for _, bs in pairs.values() for v in bs), np.int64, sum(counts))
        return self._run(ident, *sorted_pairs(hashes, a, b))

    def _merge(self, older: Run, newer: Run, ident: int) -> Run:
        path = self._file(ident, "run")
        merge_runs(path, older, newer)
        return Run(ident, path, older.count + newer.count)

    def _run(self, ident: int, hashes: np.ndarray, a: np.ndarray, b: np.ndarray) -> Run:
        path = self._file(ident, "run")
        write_run(path, hashes, a, b)
        return Run(ident, path, len(hashes))

    def _write_state(self, state: IndexState) -> None:
        with storage_errors(f"writing {self.path}"):
            make_directories(self.path)
        self._slots.write(state.seq % 2, state.pack(self._wal_id))
        self.last_seq = max(self.last_seq, state.seq)
        self._kept = (self._kept[-1], state.seq) if self._kept else (state.seq,)

    def collect(self, runs_in_use: Iterable[Run]) -> None:
        """Remove the manifests and runs that neither slot names (nor the index uses)."""
        keep_runs = {run.ident for run in runs_in_use}
        keep_seqs = set(self._kept)
        for seq in self._kept:
            try:
                with open(self._file(seq, "manifest"), "rb") as f:
                    keep_runs.update(ident for ident, _ in json.load(f)["runs"])
            except (OSError, ValueError, KeyError, TypeError):
                continue    # (a void state's: it has none)
        gone = False
        for name in os.listdir(self.path):
            match = _FILE_NAME.match(name)
            if match:
                ident, kind = int(match.group(1), 16), match.group(2)
                if (kind == "run" and ident not in keep_runs) or \
                        (kind == "manifest" and ident not in keep_seqs):
                    os.unlink(os.path.join(self.path, name))
                    gone = True
        if gone:
            sync_directory(self.path)

    def close(self) -> None:
        self.rows.close()
