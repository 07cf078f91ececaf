"""Reads held to what was written while the bytes under them change (a segment recycled and
rewritten under a read that pins nothing), and against bad batch sizes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import pmemwal
from conftest import REC_HDR, SEG, _stream_pieces, file_bytes, seg_file
from pmemwal.errors import CorruptionError

# A process that flips one byte of a segment file back and forth through its own mapping, as
# a writer rewriting a recycled segment would, as fast as it can, until it is killed.
_FLIPPER = textwrap.dedent("""
    import mmap, os, sys
    path, off = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, 0)
    good = m[off]
    bad = good ^ 0xFF
    print("ready", flush=True)
    while True:
        m[off] = bad
        m[off] = good
""")


def _flipping(path: str, off: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _FLIPPER, path, str(off)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def _last_byte(lsn: int, size: int) -> tuple[int, int]:
    """(segment, file offset) of the last payload byte of the record of ``size`` at ``lsn``."""
    *_, (segno, off, k, _) = _stream_pieces(lsn + REC_HDR, size, SEG)  # (the header in one page)
    return segno, off + k - 1


def _reads(wal: pmemwal.WAL, lsn: int, how: str) -> bytes:
    if how == "read_many":
        return bytes(wal.read_many([lsn]).payload(0))
    if how == "scan":
        return bytes(next(wal.scan(lsn)).payload(0))
    if how == "records":
        return bytes(next(wal.records(lsn)).payload)
    return bytes(wal.record(lsn).payload)


@pytest.mark.parametrize("how", ["read_many", "scan", "records", "record"])
@pytest.mark.parametrize("size", [300, 20000])  # a tail after the folded body; across pages
def test_a_read_never_returns_bytes_its_crc_did_not_cover(wal_dir, size, how):
    """A payload byte changing while it is read (a recycled segment rewritten under a read,
    which pins nothing now): each read either fails (CorruptionError) or returns the
    record's own bytes; never a copy of bytes other than those whose CRC matched."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    with pmemwal.open(wal_dir, mode="direct", segment_size=SEG, background=False) as wal:
        lsn = wal.append(data)
        wal.flush()
        segno, off = _last_byte(lsn, size)
        assert file_bytes(wal_dir, segno * SEG + off, 1) == data[-1:]
        proc = _flipping(str(seg_file(wal_dir, segno)), off)
        try:
            wrong = ok = 0
            for _ in range(50_000):  # (on a machine of two CPUs the first comes in 3k-20k)
                try:
                    got = _reads(wal, lsn, how)
                except CorruptionError:
                    continue
                ok += 1
                if got != data:
                    wrong += 1
                    break
            assert wrong == 0, f"a read returned bytes that are not the record's ({ok} read)"
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("max_records", [2**62, 2**63 - 1, 2**61 + 2**59])
def test_a_huge_max_records_is_refused_or_read_right(wal_dir, max_records):
    """max_records so large that the batch's arrays cannot be sized: MemoryError, never
    arrays laid over one another (the block's size wrapped around)."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False) as wal:
        lsns = [wal.append(bytes([i]) * 100) for i in range(3)]
        try:
            batches = list(wal.scan(max_records=max_records))
        except MemoryError:
            return
        assert [lsn for b in batches for lsn in b.lsns.tolist()] == lsns
        assert [bytes(p) for b in batches for p in b.payloads()] == \
            [bytes([i]) * 100 for i in range(3)]


@pytest.mark.parametrize("bad", [lambda lsn: [lsn + 0.5], lambda lsn: [str(lsn)],
                                 lambda lsn: [float(lsn)]])
def test_read_many_takes_integers_only(wal_dir, bad):
    """An LSN that is not an integer is refused, as record() refuses it: never rounded, or
    parsed from a string, to some record's LSN."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False) as wal:
        lsn = wal.append(b"x" * 10)
        with pytest.raises((TypeError, ValueError)):
            wal.record(bad(lsn)[0])
        with pytest.raises((TypeError, ValueError)):
            wal.read_many(bad(lsn))


def test_entries_at_takes_integers_only(wal_dir):
    """Log.entries_at([1.5]) is refused: not entry 1."""
    from pmemwal.errors import LogIndexError
    with pmemwal.open_log(wal_dir, segment_size=SEG, background=False) as log:
        log.append(b"a", term=1)
        log.append(b"b", term=1)
        with pytest.raises((TypeError, LogIndexError)):
            log.entries_at([1.5])


def test_close_during_scans_in_other_threads_unmaps_nothing_under_them_and_leaks_nothing(
        wal_dir, mode):
    """close() while other threads scan without the GIL: each scan ends (ClosedError, or it
    finished), none reads through an unmapped segment, and once they are done no mapping of
    the WAL's files is left in the process."""
    import gc
    import threading

    from pmemwal.errors import ClosedError
    for round_ in range(8):
        path = wal_dir.parent / f"w{round_}"
        wal = pmemwal.open(path, mode=mode, segment_size=SEG, background=False)
        written = [bytes([i % 251]) * 8000 for i in range(300)]  # (three segments)
        wal.append_many(written)
        wal.flush()
        started, failures = threading.Barrier(3), []

        def scan() -> None:
            started.wait()
            try:
                while True:
                    got = [bytes(p) for b in wal.scan(max_bytes=1 << 24) for p in b.payloads()]
                    if got != written:
                        failures.append("a scan read other bytes")
            except ClosedError:
                pass
            except Exception as exc:  # noqa: BLE001  (anything else is the failure)
                failures.append(repr(exc))

        threads = [threading.Thread(target=scan) for _ in range(2)]
        for t in threads:
            t.start()
        started.wait()
        wal.close()
        for t in threads:
            t.join()
        assert failures == []
        gc.collect()
        with open("/proc/self/maps") as maps:
            assert str(path) not in maps.read()
