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
    56  u32  flags          bit 0 CHECKPOINTED: the WAL had a CHECKPOINT file when this
                            segment was made (or this is the first segment of a WAL
                            made with one);
                            bit 1 SPARE: made ahead or recycled, and not written since (the
                            writer rewrites the header without it, synced, before it
                            appends to the segment: recovery need not read its pages);
                            bits 16..31 CUTS: the WAL's count of cuts (the checkpoint's)
                            when it was made, recycled or taken into use, at most 65535;
                            other bits zero
    60  u32  crc            CRC-32C of bytes 0..59

CHECKPOINTED is how recovery tells a deleted CHECKPOINT from a WAL made before
checkpoints (pmemwal/recovery.py): a WAL whose segments lack it is one made before
checkpoints.  CUTS is the count recovery goes on from when no checkpoint slot is left: the
newest segment always holds the count (an open that raised it makes a segment past its end,
wal/opening.py), so a count an index was stored with never comes back.  Version 1 headers
were written before spares were marked: their recycled_from is zero and their flags say
CHECKPOINTED (and CUTS) at most (a pmemwal that kept checkpoints set it; an older one left
bytes 48..59 zero).  They are read as segments in use; SPARE or a recycled_from in one is
refused.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from pmemwal import _core
from pmemwal.errors import FormatError

FORMAT_VERSION = _core.FORMAT_VERSION  # what new headers say
READ_VERSIONS = (1, FORMAT_VERSION)     # 1: no SPARE, no recycled_from
CHECKPOINTED = 1  # header flag: the WAL kept a CHECKPOINT when the segment was made
SPARE = 2         # header flag: a spare, not written since it was made or recycled
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

_CUTS_SHIFT = 16      # the flags' high half: the count of cuts (CUTS)
MAX_HEADER_CUTS = 0xFFFF  # what CUTS holds at most
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
    flags: int = 0                    # CHECKPOINTED, SPARE
    recycled_from: int | None = None  # a spare's number before it was recycled
    cuts: int = 0                     # CUTS (the flags' high half)

    @property
    def spare(self) -> bool:
        return bool(self.flags & SPARE)

    def pack(self) -> bytes:
        """The header page: the 64-byte header, then zeros."""
        recycled = 0 if self.recycled_from is None else self.recycled_from + 1
        body = _HEADER.pack(MAGIC, FORMAT_VERSION, PAGE_SIZE, self.segment_size, self.segno,
                            self.wal_id, recycled,
                            self.flags | min(self.cuts, MAX_HEADER_CUTS) << _CUTS_SHIFT)
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
        flags, cuts = flags & ~(MAX_HEADER_CUTS << _CUTS_SHIFT), flags >> _CUTS_SHIFT
        if flags & ~(CHECKPOINTED | SPARE):
            raise FormatError(f"{where}: unknown header flags {flags:#x}")
        if version == 1 and (flags & SPARE or recycled):  # (CHECKPOINTED came before 2)
            raise FormatError(f"{where}: a version 1 header that says spare or recycled_from, "
                              "which came with version 2")
        if page_size != PAGE_SIZE or not is_valid_segment_size(seg_size):
            raise FormatError(f"{where}: page size {page_size} / segment size {seg_size} not supported")
        if (segno + 1) * seg_size > MAX_LSN:
            raise FormatError(f"{where}: segment number {segno:X} is out of range (LSNs are 63-bit)")
        return cls(segno, seg_size, wal_id, flags, recycled - 1 if recycled else None, cuts)


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


_PAGE_HEADER = struct.Struct("<IIQI")  # magic, rem_len, page_lsn, wal_id_lo; then u32 crc


def page_names_its_place(page: bytes, page_lsn: int, wal_id_lo: int) -> bool:
    """Whether ``page`` (a data page's first 24 bytes or more) has a header naming the page at
    ``page_lsn`` of this WAL, its CRC not asked (a torn header counts too): the page was
    written since its file became that segment."""
    if len(page) < _PAGE_HEADER.size:
        return False
    magic, _, lsn, wal_id = _PAGE_HEADER.unpack_from(page)
    return (magic, lsn, wal_id) == (PAGE_MAGIC, page_lsn, wal_id_lo)


def page_header_valid(page: bytes, page_lsn: int, wal_id_lo: int) -> bool:
    """Whether ``page`` (a data page's first 24 bytes or more) has a valid header for the
    page at ``page_lsn`` of this WAL (validity rule 2, as native/wal_reader.c checks it)."""
    magic, _, lsn, wal_id = _PAGE_HEADER.unpack_from(page)
    return (magic == PAGE_MAGIC and lsn == page_lsn and wal_id == wal_id_lo and
            _CRC.unpack_from(page, _PAGE_HEADER.size)[0] == _core.crc32c(page[:_PAGE_HEADER.size]))


def record_size(length: int) -> int:
    """Stream bytes a record of ``length`` payload bytes takes (8-aligned)."""
    return (RECORD_HEADER_SIZE + length + 7) & ~7
