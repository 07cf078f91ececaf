"""CRC-32C of the native core against an independent pure-Python reference.

The writer and the reader share one implementation, so a wrong CRC would
round-trip unnoticed: this checks it against the definition, across the
lengths where the implementation switches paths (bytes, 8-byte words, three
interleaved chains, 64-byte AVX-512 folding from 256 bytes), and through the
record path (a record's CRC field, recomputed here from its bytes).
"""

import os
import random
import struct

import pytest

import pmemwal
from pmemwal import _core

POLY = 0x82F63B78
TABLE = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)


def reference(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_known_vector():
    assert _core.crc32c(b"123456789") == 0xE3069283 == reference(b"123456789")


LENGTHS = sorted({*range(0, 80), *range(248, 270), 511, 512, 513, 767, 768, 769, 1023, 1024,
                  1025, 4095, 8168, 8191, 8192, 8193, 24591, 65536, 65537})


@pytest.mark.parametrize("length", LENGTHS)
def test_lengths_and_offsets(length):
    rng = random.Random(length)
    data = bytes(rng.getrandbits(8) for _ in range(length + 7))
    for off in (0, 3):  # unaligned sources too
        chunk = data[off:off + length]
        assert _core.crc32c(chunk) == reference(chunk)
        assert _core.crc32c(chunk, 0x1234ABCD) == reference(chunk, 0x1234ABCD)


def test_record_crc_field_matches_definition(tmp_path_factory):
    path = tmp_path_factory.mktemp("crc", numbered=True)
    payload = os.urandom(3000)  # one page piece: header and payload contiguous
    with pmemwal.open(path, mode="buffered", background=False) as wal:
        lsn = wal.append(payload, flush=True)
        seg = wal.segment_size
    with open(os.path.join(path, f"{lsn // seg:016X}.wal"), "rb") as f:
        f.seek(lsn % seg)
        header = f.read(24)
        body = f.read(len(payload))
    crc, length = struct.unpack_from("<II", header)
    assert length == len(payload) and body == payload
    assert crc == reference(header[4:] + payload)
