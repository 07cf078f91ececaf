"""Self-describing torture records: content whose every byte can be checked, and their sizes.

A record says which round, thread and sequence number it is, and its length; the rest
regenerates from that header (``digested``), so a recovery's every byte can be held
against what was written without keeping the data.  The log workload's entries
(``log_entries.make_entry``) are built the same way.
"""

from __future__ import annotations

import hashlib
import random
import struct

from pmemwal.format import PAGE_SIZE, PAGE_USABLE

MAGIC = b"PWTR"
HEADER = struct.Struct("<4sIIII")  # magic, round, thread, seq, length (of the whole record)
HDR = HEADER.size


def digested(head: bytes, length: int) -> bytes:
    """``head``, then bytes it regenerates, ``length`` (>= len(head)) in all: self-describing
    content whose every byte can be checked."""
    return head + hashlib.shake_128(head).digest(length - len(head))


def make_record(rnd: int, thread: int, seq: int, length: int) -> bytes:
    """Record ``seq`` of ``thread`` in round ``rnd``: ``length`` (>= HDR) bytes, header first."""
    return digested(HEADER.pack(MAGIC, rnd, thread, seq, length), length)


def parse_record(data: bytes) -> tuple[int, int, int] | None:
    """(round, thread, seq) of a record whose every byte regenerates; None otherwise."""
    if len(data) < HDR:
        return None
    magic, rnd, thread, seq, length = HEADER.unpack_from(data)
    if magic != MAGIC or length != len(data) or data != digested(data[:HDR], length):
        return None
    return rnd, thread, seq


def segment_usable(segment_size: int) -> int:
    """Record-stream bytes one segment holds (page 0 and page headers excluded)."""
    return (segment_size // PAGE_SIZE - 1) * PAGE_USABLE


def record_size(rng: random.Random, segment_size: int) -> int:
    """Mostly small, some of 1-20 KiB, a few over a page, rarely about a (small) segment."""
    x = rng.random()
    if x < 0.80:
        return rng.randint(HDR, 300)
    if x < 0.97:
        return rng.randint(1 << 10, 20 << 10)
    if x < 0.998:
        return rng.randint(PAGE_SIZE + 1, 64 << 10)
    usable = segment_usable(min(segment_size, 2 << 20))
    return rng.randint(usable - (16 << 10), usable + (64 << 10))
