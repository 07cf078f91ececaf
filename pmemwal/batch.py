"""Records read many at a time: ``WAL.scan`` and ``WAL.read_many`` hand back RecordBatches,
``Log.entry_batches`` and ``Log.entries_at`` EntryBatches.

A batch is what one native call read, without the GIL: the records' LSNs, prev-links and
payload lengths as numpy arrays, and their payloads copied, each validated as it was copied
(the CRC computed in the same pass), into one read-only buffer.  Payload ``i`` is
``data[offsets[i]:offsets[i] + lengths[i]]``; the payloads lie one after another.

Why copies and not views of the segments: a record of 8 KiB or more never lies in one page,
so its bytes have to be gathered anyway; below that, copying a payload costs less than
checking its CRC, which is read from the same cache lines; and a copy pins nothing (a view
of a segment would keep it from being recycled, and from being unmapped at close).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from pmemwal._core import Record, split
from pmemwal._core import entries as make_entries
from pmemwal._core import heads as payload_heads
from pmemwal.log_format import Entry


@dataclass(frozen=True)
class RecordBatch:
    """Records read in one call, as arrays (all of length ``len(batch)``) and one buffer.

    ``lsns`` (uint64): each record's LSN.  ``prev_lsns`` (uint64): the LSN of the record
    before each.  ``lengths`` (uint32): each payload's length.  ``offsets`` (uint64): where
    each payload starts in ``data`` (a read-only uint8 array of the payloads, one after
    another).
    """

    lsns: np.ndarray
    prev_lsns: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    data: np.ndarray

    @classmethod
    def from_native(cls, arrays: tuple[memoryview, ...]) -> RecordBatch:
        """The batch of what the native reader handed back (Reader.fill and Reader.fetch:
        lsns, prev_lsns, lengths, offsets, data, then fields a batch leaves out)."""
        lsns, prev_lsns, lengths, offsets, data = arrays[:5]
        return cls(np.frombuffer(lsns, np.uint64), np.frombuffer(prev_lsns, np.uint64),
                   np.frombuffer(lengths, np.uint32), np.frombuffer(offsets, np.uint64),
                   np.frombuffer(data, np.uint8))

    def __len__(self) -> int:
        return len(self.lsns)

    def payload(self, i: int) -> memoryview:
        """Record ``i``'s payload: a read-only view of ``data``."""
        start = int(self.offsets[i])
        return self.data.data[start:start + int(self.lengths[i])]

    def payloads(self) -> list[memoryview]:
        """Every record's payload, as ``payload`` gives it."""
        return list(_views(self.data, self.offsets, self.lengths))

    def __iter__(self) -> Iterator[Record]:
        """The records, as ``WAL.records`` gives them (each payload bytes of its own)."""
        return map(Record, self.lsns.tolist(), split(self.data, self.offsets, self.lengths),
                   self.prev_lsns.tolist())


def _views(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> Iterator[memoryview]:
    """Views of ``data``'s payloads, made one at a time as they are asked for (held ones
    keep ``data`` alive, no more)."""
    return map(data.data.__getitem__, map(slice, offsets.tolist(), (offsets + lengths).tolist()))


def concat(batches: list[RecordBatch]) -> RecordBatch:
    """One batch of several, in order (the offsets moved to the joined data)."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        empty = np.zeros(0, np.uint64)
        return RecordBatch(empty, empty, np.zeros(0, np.uint32), empty, np.zeros(0, np.uint8))
    starts = np.cumsum([0] + [len(b.data) for b in batches[:-1]], dtype=np.uint64)
    data = np.concatenate([b.data for b in batches])
    data.flags.writeable = False
    return RecordBatch(np.concatenate([b.lsns for b in batches]),
                       np.concatenate([b.prev_lsns for b in batches]),
                       np.concatenate([b.lengths for b in batches]),
                       np.concatenate([b.offsets + s for b, s in zip(batches, starts)]), data)


def integer_array(values: object, dtype: type[np.integer]) -> np.ndarray:
    """``values`` (a sequence of ints, or an integer array) as a contiguous array of
    ``dtype``; ValueError for anything else: a float, a string or a bool is never rounded
    or parsed, nor a value out of the dtype's range wrapped, to some other number."""
    given = np.asarray(values)
    if given.size and given.dtype.kind not in "iu":
        if not isinstance(values, np.ndarray):  # (ints of both signs past 2**63 make floats)
            given = np.asarray(values, dtype=object)
        if given.dtype.kind != "O" or not all(isinstance(v, (int, np.integer)) and
                                              not isinstance(v, bool) for v in given.flat):
            raise ValueError(f"not integers: {values!r}"[:200])
    limits = np.iinfo(dtype)
    if given.size and (given.min() < limits.min or given.max() > limits.max):
        raise ValueError(f"out of {limits.min}..{limits.max}: {values!r}"[:200])
    return np.ascontiguousarray(given, dtype)


@dataclass(frozen=True)
class EntryBatch:
    """Log entries read in one call: ``indices`` (int64), ``terms`` (uint64), and each
    payload (its log header left out) at ``data[offsets[i]:offsets[i] + lengths[i]]``.
    ``lsns``: the WAL records they are."""

    indices: np.ndarray
    terms: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    data: np.ndarray
    lsns: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def payload(self, i: int) -> memoryview:
        """Entry ``i``'s payload (of the batch's): a read-only view of ``data``."""
        start = int(self.offsets[i])
        return self.data.data[start:start + int(self.lengths[i])]

    def payloads(self) -> list[memoryview]:
        """Every entry's payload, as ``payload`` gives it."""
        return list(_views(self.data, self.offsets, self.lengths))

    def __iter__(self) -> Iterator[Entry]:
        """The entries, as ``Log.entries`` gives them (each payload bytes of its own)."""
        return iter(self.entries())

    def entries(self) -> list[Entry]:
        """The entries, as ``Log.entries`` gives them (each payload bytes of its own)."""
        return make_entries(Entry, self.indices, self.terms, self.data, self.offsets,
                            self.lengths)

    def __getitem__(self, where: slice) -> EntryBatch:
        """The entries of a slice of the batch (the same data)."""
        return EntryBatch(self.indices[where], self.terms[where], self.lengths[where],
                          self.offsets[where], self.data, self.lsns[where])


def entries_of(indices: np.ndarray, records: RecordBatch, segment_size: int) -> EntryBatch:
    """Entries ``indices`` from the records the log's index names for them, each of which
    must say so itself (the index files hold no checksum: a record of another entry is
    damage, never an answer): CorruptionError at the first that does not."""
    from pmemwal.log_format import HEADER_DTYPE, HEADER_SIZE, check_entry_record
    lengths, offsets, data = records.lengths, records.offsets, records.data
    heads = np.frombuffer(payload_heads(data, offsets, lengths, HEADER_SIZE),
                          np.uint8).reshape(-1, HEADER_SIZE)
    head = heads.view(HEADER_DTYPE).reshape(-1)
    check_entry_record(indices, records.lsns, lengths, head, heads, segment_size)
    return EntryBatch(indices, head["term"].copy(), lengths - HEADER_SIZE,
                      offsets + HEADER_SIZE, data, records.lsns)
