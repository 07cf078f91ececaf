"""The checkpoint: where recovery starts, and what is certainly durable.

A WAL without one must read every record it keeps on each open, and can only
guess from flush hints whether damage lies in acknowledged records.  The file
``CHECKPOINT`` in the WAL directory names a durable point instead, as
PostgreSQL's pg_control names the last checkpoint: recovery reads from there
on, and an invalid record before it is damage, never a torn tail.

It is a pair of slots written in turn (pmemwal/slots.py: 512 bytes each, the last 4 a
CRC), so that a crash while writing one leaves the other whole; the valid slot of this
WAL with the higher ``seq`` is the checkpoint.  A slot's body, little-endian:

     0  8s   magic          b"PWCKPT1\\0"
     8  u32  version        1
    12  u32  flags          bit 0 CLEAN: written by a clean close of a one-process WAL;
                            nothing was appended after end_lsn since
    16  u64  seq            one more than the slot it replaces; slot seq % 2 is written
    24  16s  wal_id         the WAL's (its segment headers')
    40  u64  segment_size
    48  u64  end_lsn        every byte below it is durable; a record boundary
    56  u64  last_lsn       the record that ends at end_lsn (0: none)
    64  u64  oldest_segno   segments below it were truncated
    72  u64  time_ns        wall clock when written, for people
    80  u64  cuts           how many recoveries cut records that had been durable
                            (on_corruption="truncate"): a layer's index made before a
                            cut is not used after it (pmemwal/log_index.py)
    88  ...  zeros to 508, then the CRC

A slot is written with pwrite and fdatasync once everything below end_lsn is
durable.  A truncation writes one naming the segment it keeps first *before*
it removes anything, so a segment below oldest_segno may still exist (a crash
cut the truncation short) but one at or above it, up to end_lsn's, never
legitimately goes missing.  One that raises oldest_segno goes to both slots, so
that no valid slot names what the truncation removes.  With no valid slot,
recovery takes cuts from a damaged slot whose other fields still name this WAL
(``damaged_cuts``).  Validity rules are in docs/FORMAT.md, "Checkpoint".
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from pmemwal.format import is_valid_segment_size
from pmemwal.segments import CHECKPOINT_NAME
from pmemwal.slots import SlotPair

MAGIC = b"PWCKPT1\0"
VERSION = 1
CLEAN = 1
_BODY = struct.Struct("<8sIIQ16sQQQQQQ")


@dataclass(frozen=True)
class Checkpoint:
    """One slot's contents."""

    seq: int
    end_lsn: int
    last_lsn: int
    oldest_segno: int
    clean: bool = False
    time_ns: int = 0
    cuts: int = 0

    def pack(self, wal_id: bytes, segment_size: int) -> bytes:
        return _BODY.pack(MAGIC, VERSION, CLEAN if self.clean else 0, self.seq, wal_id,
                          segment_size, self.end_lsn, self.last_lsn, self.oldest_segno,
                          self.time_ns or time.time_ns(), self.cuts)


def unpack(body: bytes | None, wal_id: bytes, segment_size: int) -> Checkpoint | None:
    """The checkpoint in a slot's body (None: torn or damaged), or None when it is another
    WAL's or breaks a rule."""
    if body is None:
        return None
    magic, version, flags, seq, wid, size, end, last, oldest, when, cuts = _BODY.unpack_from(body)
    if magic != MAGIC or version != VERSION or wid != wal_id or size != segment_size:
        return None
    if end % 8 or last >= end or (flags & ~CLEAN):
        return None
    return Checkpoint(seq, end, last, oldest, bool(flags & CLEAN), when, cuts)


def read_any(directory: str) -> tuple[bytes, int, Checkpoint] | None:
    """The checkpoint in ``directory``, with the WAL id and segment size its slot names
    (None: no file, or no valid slot): what a WAL whose segment files are all gone still
    says of itself (wal/opening.py)."""
    found = []
    for body in SlotPair(os.path.join(directory, CHECKPOINT_NAME)).read():
        if body is not None:
            wal_id, segment_size = _BODY.unpack_from(body)[4:6]
            cp = unpack(body, wal_id, segment_size)
            if cp is not None and is_valid_segment_size(segment_size):
                found.append((cp.seq, wal_id, segment_size, cp))
    if not found:
        return None
    _, wal_id, segment_size, cp = max(found, key=lambda f: f[0])
    return wal_id, segment_size, cp


class CheckpointFile:
    """``CHECKPOINT`` in one WAL directory: read the current slot, write the next."""

    def __init__(self, directory: str, wal_id: bytes, segment_size: int) -> None:
        self.path = os.path.join(directory, CHECKPOINT_NAME)
        self._slots = SlotPair(self.path)
        self._wal_id = wal_id
        self._segment_size = segment_size

    def read(self) -> Checkpoint | None:
        """The valid slot with the highest seq, or None (no file, or no slot valid)."""
        valid = [cp for body in self._slots.read()
                 if (cp := unpack(body, self._wal_id, self._segment_size)) is not None]
        return max(valid, key=lambda cp: cp.seq) if valid else None

    def damaged_cuts(self) -> int:
        """The highest ``cuts`` of the slots whose CRC fails but that still name this WAL
        and keep the rules (what damaged them spared the fields around cuts); 0 if none."""
        found = [cp.cuts for body in self._slots.read(checked=False)
                 if (cp := unpack(body, self._wal_id, self._segment_size)) is not None]
        return max(found, default=0)

    def write(self, end_lsn: int, last_lsn: int, oldest_segno: int, clean: bool = False,
              current: Checkpoint | None = None, cuts: int = 0) -> Checkpoint:
        """Write the next slot (after ``current``, the valid one; read when None) and sync it.
        The caller has made everything below ``end_lsn`` durable.  ``cuts`` and
        ``oldest_segno`` never go down (the segments below a truncation's oldest hold
        records the WAL no longer has: a crash may leave them, never let them rejoin it).

        One that raises oldest_segno (a truncation's, before it removes the segments below)
        is written to both slots in turn: ``current``, left in the other slot, vouches for
        those segments, and were the new slot damaged later, recovery would fall back to
        it and take the segments truncated for deleted."""
        current = current if current is not None else self.read()
        seq = current.seq + 1 if current is not None else 1
        cuts = max(cuts, current.cuts if current is not None else 0)
        oldest_segno = max(oldest_segno, current.oldest_segno if current is not None else 0)
        raises = current is not None and current.oldest_segno < oldest_segno
        for seq in (seq, seq + 1) if raises else (seq,):
            cp = Checkpoint(seq, end_lsn, last_lsn, oldest_segno, clean, time.time_ns(), cuts)
            self._slots.write(seq % 2, cp.pack(self._wal_id, self._segment_size))
        return cp
