"""CRC-32C of the native core against an independent pure-Python reference.

The writer and the reader share one implementation, so a wrong CRC would
round-trip unnoticed: this checks it against the definition, across the
lengths where the implementation switches paths (bytes, 8-byte words, three
interleaved chains, 64-byte AVX-512 folding from 256 bytes), and through the
record path (a record's CRC field, recomputed here from its bytes).
"""

import json
import os
import random
import struct
import subprocess
import sys
from functools import lru_cache

import pytest

import pmemwal
from conftest import PERSIST_CASES, assert_chain, child_env, payload, prefixed, read_all, run_child
from pmemwal import _core, device
from pmemwal.errors import ConfigError
from pmemwal.tools.shadow import cpu_flags

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


# ---- the CPU paths (PMEMWAL_CPU) ---------------------------------------------------

CPU_PATHS = {"table": "table", "sse42": "sse4.2", "pclmul": "pclmul",
             "avx2": "avx2-vpclmulqdq", "avx512": "avx512-vpclmulqdq"}
CPU_NEEDS = {"table": set(), "sse42": {"sse4_2"}, "pclmul": {"sse4_2", "pclmulqdq"},
             "avx2": {"sse4_2", "pclmulqdq", "avx2", "vpclmulqdq"},
             "avx512": {"sse4_2", "pclmulqdq", "avx512f", "avx512bw", "vpclmulqdq"}}


def need_path(path: str) -> None:
    missing = CPU_NEEDS[path] - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(sorted(missing))} for the {path} path")


# The child: CRCs of seeded random slices (lengths 0..20000, more of them around FOLD_MIN
# = 256 and multiples of 64; source offsets 0..63; a random starting CRC), each checked
# against the fused copy and the streaming copy to every destination alignment.
CRC_CHILD = r"""
import json, random, sys
from pmemwal import _core
rng = random.Random(10)
data = rng.randbytes(90000)
dst = bytearray(90000)
out, cases = [], []
for i in range(3000):
    kind = i % 3
    if kind == 0:
        n = rng.randrange(0, 20001)
    elif kind == 1:
        n = rng.randrange(180, 700)
    else:
        n = 64 * rng.randrange(1, 300) + rng.randrange(-2, 3)
    n = max(n, 0)
    so, do, crc0 = rng.randrange(64), rng.randrange(64), rng.getrandbits(32)
    src = memoryview(data)[so:so + n]
    crc = _core.crc32c(src, crc0)
    for how in (1, 2):
        d = memoryview(dst)[do:do + n + 8]
        d[:] = bytes(len(d))
        assert _core._crc32c_copy(d, src, crc0, how) == crc, (i, n, so, do, how)
        assert d[:n] == src and d[n:] == bytes(8), (i, n, so, do, how)
    out.append(crc)
    if i < 30:
        cases.append((n, so, crc0))
print(json.dumps({"impl": _core.CRC32C_IMPL, "crcs": out, "cases": cases}))
"""


def crc_child(path: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CRC_CHILD], capture_output=True, text=True,
                          timeout=120, env=child_env(PMEMWAL_CPU=path, PMEMWAL_NO_CRC_HW=""))
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@lru_cache
def table_child() -> dict:
    return crc_child("table")


def test_table_path_matches_reference():
    data = random.Random(10).randbytes(90000)  # the child's data
    out = table_child()
    assert out["impl"] == "table"
    for crc, (n, so, crc0) in zip(out["crcs"], out["cases"]):
        assert crc == reference(data[so:so + n], crc0)


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
def test_cpu_path_crc_and_copies(path):
    need_path(path)
    out = crc_child(path)
    assert out["impl"] == CPU_PATHS[path]
    assert out["crcs"] == table_child()["crcs"]


def pmem_roundtrip(wal_dir, seed: str, env: dict[str, str]) -> dict:
    """Records of 0..70000 bytes through a direct-mode WAL on forced pmem, in a child with
    ``env``, then read back and checked by this process's CRC; the child's report."""
    mode, pmem_env, method = PERSIST_CASES["direct-pmem"]
    sizes = [0, 1, 7, 8, 63, 64, 65, 200, 255, 256, 257, 319, 320, 321, 383, 448, 1000, 4096,
             8168, 8191, 8200, 12345, 16387, 30001, 65536, 70000, 3]
    out = run_child({"op": "roundtrip", "dir": str(wal_dir), "mode": mode,
                     "sizes": sizes, "seed": seed}, env={**pmem_env, **env})
    assert out["persist_method"] == method
    expected = [payload(f"{seed}/one/{i}", n) for i, n in enumerate(sizes)]
    expected += [payload(f"{seed}/many/{i}", n) for i, n in enumerate(sizes)]
    expected += [prefix + data for prefix, data in prefixed(seed, sizes)]
    with pmemwal.open(wal_dir, mode="buffered") as wal:
        recs = read_all(wal)
        assert [lsn for lsn, _, _ in recs] == out["lsns"]
        assert [data for _, data, _ in recs] == expected
        assert_chain(recs)
    return out


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
def test_cpu_path_wal_roundtrip(shm_tmp, path):
    """Every CPU path through the WAL (streamed copies from 256 B)."""
    need_path(path)
    pmem_roundtrip(shm_tmp / "w", f"cpu-{path}", {"PMEMWAL_CPU": path, "PMEMWAL_NO_CRC_HW": ""})


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
@pytest.mark.parametrize("stream_min", ["0", "64", str(2**64 - 1)])
def test_stream_threshold_wal_roundtrip(shm_tmp, path, stream_min):
    """Small records streamed (headers too: the no-CLWB choice), or nothing streamed."""
    need_path(path)
    out = pmem_roundtrip(shm_tmp / "w", f"stream-{path}-{stream_min}",
                         {"PMEMWAL_CPU": path, "PMEMWAL_NO_CRC_HW": "",
                          "PMEMWAL_STREAM_MIN": stream_min})
    assert out["stream_min"] == int(stream_min)


def test_stream_threshold_follows_clwb(monkeypatch):
    """256 B with CLWB (libpmem's threshold), every record where write-back evicts; overrides
    win."""
    for var in ("PMEMWAL_STREAM_MIN", "PMEM_MOVNT_THRESHOLD", "PMEM_NO_CLWB"):
        monkeypatch.delenv(var, raising=False)
    expected = device.STREAM_MIN_CLWB if "clwb" in cpu_flags() else device.STREAM_MIN_NO_CLWB
    assert device.stream_min() == expected
    monkeypatch.setenv("PMEM_NO_CLWB", "1")
    assert device.stream_min() == device.STREAM_MIN_NO_CLWB
    monkeypatch.setenv("PMEM_MOVNT_THRESHOLD", "1024")
    assert device.stream_min() == 1024
    monkeypatch.setenv("PMEMWAL_STREAM_MIN", "0x80")
    assert device.stream_min() == 128
    monkeypatch.setenv("PMEMWAL_STREAM_MIN", "lots")
    with pytest.raises(ConfigError, match="PMEMWAL_STREAM_MIN"):
        device.stream_min()


def test_cpu_path_fallback():
    """A path the CPU lacks falls back below it; PMEMWAL_NO_CRC_HW=1 means table."""
    def impl(**env):
        proc = subprocess.run([sys.executable, "-c", "from pmemwal import _core; "
                               "print(_core.CRC32C_IMPL)"], capture_output=True, text=True,
                              check=True, env=child_env(**env))
        return proc.stdout.strip()

    assert impl(PMEMWAL_CPU="avx512", PMEMWAL_NO_CRC_HW="1") == "table"
    best = next(p for p in ("avx512", "avx2", "sse42", "table")
                if not CPU_NEEDS[p] - cpu_flags())
    assert impl(PMEMWAL_CPU="", PMEMWAL_NO_CRC_HW="") == CPU_PATHS[best]  # pclmul only by name
