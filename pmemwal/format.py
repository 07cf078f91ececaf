"""The on-disk format's Python half: segment headers, names and geometry.

docs/FORMAT.md is the specification; native/wal_format.h holds the page and
record layouts, which only the native core writes.  The segment header is
written here, when a segment is created or recycled.

Segment header, at offset 0 of page 0 of every segment (little-endian):

     0  8s   magic          b"PMEMWAL\\0"
     8  u32  version        FORMAT_VERSION
    12  u32  page_size      8192
    16  u64  segment_size   bytes per segment file, a power of two
    24  u64  segno          this file's segment number (its name, in hex)
    32  16s  wal_id         random, made when the WAL was created
    48  u64  recycled_from  a spare's: the segment number the file had before it was
                            recycled, plus 1 (0: made new); zero once it is in use
    56  u32  flags          bit 0 SPARE: made ahead or recycled, and not written since (the
                            writer rewrites the header without it, synced, before it
                            appends to the segment: recovery need not read its pages)
    60  u32  crc            CRC-32C of bytes 0..59

Version 1 headers (bytes 48..59 zero) are read as segments in use.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from pmemwal import _core
from pmemwal.errors import FormatError

FORMAT_VERSION = _core.FORMAT_VERSION  # what new headers say
READ_VERSIONS = (1, FORMAT_VERSION)     # 1: no spare flag
SPARE = 1  # flags bit 0
PAGE_SIZE = _core.PAGE_SIZE
PAGE_HEADER_SIZE = _core.PAGE_HEADER_SIZE
RECORD_HEADER_SIZE = _core.RECORD_HEADER_SIZE
PAGE_USABLE = PAGE_SIZE - PAGE_HEADER_SIZE
MAGIC = b"PMEMWAL\0"
PAGE_MAGIC = 0x31505750  # a data page header's magic, "PWP1" (native/wal_format.h)
MIN_SEGMENT_SIZE = 1 << 20
MAX_SEGMENT_SIZE = 1 << 30
DEFAULT_SEGMENT_SIZE = 16 << 20
MAX_RECORD_LIMIT = 1 << 30  # a record's length field is u32; keep well inside it
MAX_LSN = 1 << 63  # positions stay well inside the 64-bit LSN

_HEADER = struct.Struct("<8sIIQQ16sQI")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size  # 64
_NAME = re.compile(r"^([0-9A-F]{16})\.wal$")


class DamagedHeaderError(FormatError):
    """A segment header that does not read at all: cut short, bad magic, or its CRC fails
    (one that reads but says something this WAL refuses is a plain FormatError)."""


@dataclass(frozen=True)
class SegmentHeader:
    """What page 0 of a segment says about it."""

    segno: int
    segment_size: int
    wal_id: bytes
    spare: bool = False
    recycled_from: int | None = None  # a spare's number before it was recycled

    def pack(self) -> bytes:
        """The header page: the 64-byte header, then zeros."""
        recycled = 0 if self.recycled_from is None else self.recycled_from + 1
        body = _HEADER.pack(MAGIC, FORMAT_VERSION, PAGE_SIZE, self.segment_size, self.segno,
                            self.wal_id, recycled, SPARE if self.spare else 0)
        header = body + _CRC.pack(_core.crc32c(body))
        return header + bytes(PAGE_SIZE - len(header))

    @classmethod
    def unpack(cls, data: bytes, where: str) -> SegmentHeader:
        """Parse and check a header; FormatError says what is wrong and where."""
        if len(data) < HEADER_SIZE:
            raise DamagedHeaderError(f"{where}: too short for a segment header")
        magic, version, page_size, seg_size, segno, wal_id, recycled, flags = \
            _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise DamagedHeaderError(f"{where}: not a pmemwal segment (bad magic)")
        (crc,) = _CRC.unpack_from(data, _HEADER.size)
        if crc != _core.crc32c(data[: _HEADER.size]):
            raise DamagedHeaderError(f"{where}: segment header checksum mismatch")
        if version not in READ_VERSIONS:
            raise FormatError(f"{where}: format version {version}, this pmemwal reads "
                              f"{' and '.join(map(str, READ_VERSIONS))}")
        if flags & ~SPARE or (version == 1 and (flags or recycled)):
            raise FormatError(f"{where}: unknown header flags {flags:#x}")
        if page_size != PAGE_SIZE or not is_valid_segment_size(seg_size):
            raise FormatError(f"{where}: page size {page_size} / segment size {seg_size} not supported")
        if (segno + 1) * seg_size > MAX_LSN:
            raise FormatError(f"{where}: segment number {segno:X} is out of range (LSNs are 63-bit)")
        return cls(segno, seg_size, wal_id, bool(flags & SPARE),
                   recycled - 1 if recycled else None)


def is_valid_segment_size(size: int) -> bool:
    """A power of two from 1 MiB to 1 GiB."""
    return MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE and size & (size - 1) == 0


def segment_name(segno: int) -> str:
    """The file name of a segment: 16 hex digits, e.g. 000000000000002A.wal."""
    return f"{segno:016X}.wal"


def parse_segment_name(name: str) -> int | None:
    """The segment number a file name stands for, or None."""
    match = _NAME.match(name)
    return int(match.group(1), 16) if match else None


def first_lsn(segno: int, segment_size: int) -> int:
    """LSN of the first usable byte of a segment (page 1, after its header)."""
    return segno * segment_size + PAGE_SIZE + PAGE_HEADER_SIZE


def record_size(length: int) -> int:
    """Stream bytes a record of ``length`` payload bytes takes (8-aligned)."""
    return (RECORD_HEADER_SIZE + length + 7) & ~7
