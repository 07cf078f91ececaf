"""Bad input: each case raises its typed error, and durable data stays readable.

Every test that refuses an existing WAL then opens it properly and reads back
exactly what had been flushed before.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pmemwal
from conftest import (CHILD, PAGE, REC_HDR, SEG, child_env, mounted_tmpfs, payload, read_all,
                      run_child, seg_file)
from pmemwal import lostfound
from pmemwal.recovery import RecoveryWarning
from pmemwal.segments import WalDirectory


def _make(wal_dir, mode="buffered", n=5, seed="data", **opts):
    # no background writer: only segment 0 exists afterwards
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False, **opts) as wal:
        recs = [(wal.append(payload(f"{seed}/{i}", 100 * i)), payload(f"{seed}/{i}", 100 * i))
                for i in range(n)]
        wal.flush()
    return recs


def _readable(wal_dir, recs, mode="buffered"):
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == recs


# ---- the directory ------------------------------------------------------------------

def test_path_is_a_file(shm_tmp):
    f = shm_tmp / "file"
    f.write_bytes(b"not a WAL")
    for create in (True, False):
        with pytest.raises(pmemwal.FormatError):
            pmemwal.open(f, create=create)
    assert f.read_bytes() == b"not a WAL"


def test_missing_directory_without_create(shm_tmp):
    with pytest.raises(pmemwal.NotFoundError) as info:
        pmemwal.open(shm_tmp / "nowhere", create=False)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, pmemwal.WALError)
    assert info.value.errno == errno.ENOENT
    assert not (shm_tmp / "nowhere").exists()


def test_empty_directory_without_create(shm_tmp):
    """An existing directory with no WAL in it is not a WAL: create=False must not make one."""
    d = shm_tmp / "empty"
    d.mkdir()
    with pytest.raises(pmemwal.NotFoundError):
        pmemwal.open(d, create=False)
    assert not list(d.glob("*.wal"))


def test_create_false_opens_existing(wal_dir, mode):
    recs = _make(wal_dir, mode)
    with pmemwal.open(wal_dir, mode=mode, create=False) as wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == recs


def test_a_file_not_the_wals_is_ignored_and_kept(wal_dir, mode):
    """As PostgreSQL ignores unknown files in pg_wal: a WAL opens beside them, and leaves
    them as they are."""
    recs = _make(wal_dir, mode)
    (wal_dir / "notes.txt").write_text("hello")
    (wal_dir / "0000000000000001.wal.bak").write_bytes(b"x" * 100)
    _readable(wal_dir, recs, mode)
    assert (wal_dir / "notes.txt").read_text() == "hello"
    assert (wal_dir / "0000000000000001.wal.bak").read_bytes() == b"x" * 100


def test_leftover_temp_segment_is_removed(wal_dir, mode):
    """A crash while a segment was being made leaves <name>.wal.tmp: open removes it."""
    recs = _make(wal_dir, mode)
    tmp = wal_dir / (seg_file(wal_dir, 1).name + ".tmp")
    tmp.write_bytes(b"\0" * 4096)
    _readable(wal_dir, recs, mode)
    assert not tmp.exists()
    (wal_dir / "notasegment.tmp").write_bytes(b"x")   # not ours: ignored, not deleted
    _readable(wal_dir, recs, mode)
    assert (wal_dir / "notasegment.tmp").exists()


def test_foreign_directory_without_segments(shm_tmp):
    d = shm_tmp / "other"
    d.mkdir()
    (d / "data.bin").write_bytes(b"\0" * 100)
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(d)
    assert sorted(p.name for p in d.iterdir()) in (["data.bin"], ["LOCK", "data.bin"])


def test_segment_of_another_wal(shm_tmp, mode):
    a, b = shm_tmp / "a", shm_tmp / "b"
    recs = _make(a, mode, seed="a")
    with pmemwal.open(b, mode=mode, segment_size=SEG) as wal:   # b runs into segment 1
        while wal.insert_lsn < SEG + 2 * 8192:
            wal.append(payload("b", 30000))
    shutil.copy(seg_file(b, 1), seg_file(a, 1))
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(a, mode=mode)
    seg_file(a, 1).unlink()
    _readable(a, recs, mode)
    # the same WAL id but a segment file renamed to another number
    shutil.copy(seg_file(a, 0), seg_file(a, 7))
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(a, mode=mode)
    seg_file(a, 7).unlink()
    _readable(a, recs, mode)


@pytest.mark.parametrize("damage", ["magic", "crc", "version", "short_file", "empty_file"])
def test_bad_segment_header(wal_dir, damage):
    recs = _make(wal_dir)
    path = seg_file(wal_dir, 0)
    original = path.read_bytes()
    raw = bytearray(original)
    if damage == "magic":
        raw[0] ^= 0xFF
    elif damage == "crc":
        raw[30] ^= 0x01                    # inside the WAL id: the header CRC fails
    elif damage == "version":
        raw[8] = 99                        # (CRC fails too, either way it is refused)
    elif damage == "short_file":
        raw = raw[:SEG // 2]
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(wal_dir)
    assert path.read_bytes() == bytes(raw)     # refused, not "repaired"
    path.write_bytes(original)
    _readable(wal_dir, recs)


def _as_version_1(wal_dir, flags: int, recycled: int = 0) -> None:
    """Rewrite every segment header as a version 1 header saying ``flags`` (and
    recycled_from ``recycled``), its CRC made good."""
    import struct
    from pmemwal import _core
    from pmemwal.format import HEADER_SIZE
    layout = struct.Struct("<8sIIQQ16sQI")
    for path in sorted(Path(wal_dir).glob("*.wal")):
        with open(path, "r+b") as f:
            magic, _, page, size, segno, wal_id, _, _ = layout.unpack(f.read(layout.size))
            body = layout.pack(magic, 1, page, size, segno, wal_id, recycled, flags)
            f.seek(0)
            f.write(body + struct.pack("<I", _core.crc32c(body)))
            assert f.tell() == HEADER_SIZE


def test_version_1_headers_with_checkpointed_are_read(wal_dir):
    """A pmemwal that wrote version 1 headers already set CHECKPOINTED in them (before
    spares were marked): such a WAL opens, goes on, and still counts as checkpointed (a
    deleted CHECKPOINT is refused, not taken for a WAL made before checkpoints)."""
    from pmemwal.format import CHECKPOINTED
    with pmemwal.open(wal_dir, segment_size=SEG, background=False) as wal:
        recs = [(wal.append(payload(f"a/{i}", 1000)), payload(f"a/{i}", 1000)) for i in range(1500)]
    _as_version_1(wal_dir, CHECKPOINTED)
    with pmemwal.open(wal_dir, background=False) as wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == recs
        recs += [(wal.append(payload(f"b/{i}", 1000)), payload(f"b/{i}", 1000)) for i in range(1500)]
    _readable(wal_dir, recs)
    _as_version_1(wal_dir, CHECKPOINTED)
    (wal_dir / "CHECKPOINT").unlink()
    with pytest.raises(pmemwal.CorruptionError, match="CHECKPOINT"):
        pmemwal.open(wal_dir)


@pytest.mark.parametrize("flags, recycled", [(2, 0), (3, 0), (1, 5), (4, 0)])
def test_version_1_headers_refuse_what_version_2_added(wal_dir, flags, recycled):
    """SPARE and recycled_from came with version 2: a version 1 header that says either
    (or an unknown flag) is refused, and changes nothing."""
    recs = _make(wal_dir)
    _as_version_1(wal_dir, flags, recycled)
    raw = seg_file(wal_dir, 0).read_bytes()
    with pytest.raises(pmemwal.FormatError, match="version 1|unknown header flags"):
        pmemwal.open(wal_dir)
    assert seg_file(wal_dir, 0).read_bytes() == raw
    _as_version_1(wal_dir, 0)
    _readable(wal_dir, recs)


def _wal_with_spares(wal_dir) -> list[int]:
    """A WAL of 1 MiB segments that ends in segment 3, with spares 4 (made ahead, never
    written), 5 (recycled from segment 0) and 6 (from 1); its records' LSNs."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, recycle_segments=3,
                      preallocate=4 * SEG) as wal:
        lsns = []
        while wal.insert_lsn < 3 * SEG + 3 * PAGE:
            lsns.append(wal.append(payload(f"r/{len(lsns)}", 20000), flush=True))
        assert wal.truncate(2 * SEG) == 2
        assert sorted(p.name for p in wal_dir.glob("*.wal")) == [
            seg_file(wal_dir, s).name for s in range(2, 7)]
    return [lsn for lsn in lsns if lsn >= 2 * SEG]


@pytest.mark.parametrize("damage", ["crc", "short_file", "empty_file"])
@pytest.mark.parametrize("spare", [4, 6])
def test_a_damaged_spare_past_the_end_is_set_aside(wal_dir, damage, spare):
    """A spare segment holds nothing of the WAL yet (a recycled file's pages are an older
    cycle's): a damaged header, or a file cut short, is no reason to refuse the WAL.  It
    is set aside in lost+found, with a warning, and the WAL opens with every record."""
    kept = _wal_with_spares(wal_dir)
    path = seg_file(wal_dir, spare)
    raw = bytearray(path.read_bytes())
    if damage == "crc":
        raw[30] ^= 0x01
    elif damage == "short_file":
        raw = raw[:SEG // 2]
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    with pytest.warns(RecoveryWarning, match=f"{path.name}.*set aside"):
        with pmemwal.open(wal_dir) as wal:
            assert [lsn for lsn, _, _ in read_all(wal)] == kept
            while wal.insert_lsn < 7 * SEG:                 # on through where it was
                kept.append(wal.append(payload(f"r/{len(kept)}", 20000), flush=True))
    assert not path.with_suffix(".wal.tmp").exists()
    entry, = lostfound.entries(str(wal_dir))
    assert entry.manifest["records"] == [] and path.name in entry.manifest["reason"]
    assert (Path(entry.path) / path.name).read_bytes() == bytes(raw)   # kept as it was
    with pmemwal.open(wal_dir, verify="all") as wal:
        assert [lsn for lsn, _, _ in read_all(wal)] == kept


def _damage_header_crc(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[60] ^= 0xFF                     # the header's CRC
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("where", ["mid-segment", "in the last page"])
def test_a_spare_whose_header_tore_is_set_aside_wherever_the_writer_stood(wal_dir, where):
    """A spare's header torn (its arm cut short when the writer reached it) while the
    writer stood anywhere in the segment below, its last page included: the spare's file is
    whole and holds no page of its own, so it held nothing of the WAL; set aside, not
    refused."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, preallocate=3 * SEG) as wal:
        target = SEG - PAGE + 100 if where == "in the last page" else SEG // 2
        kept = []
        while wal.insert_lsn < target:
            kept.append(wal.append(b"x" * 900, flush=True))
    _damage_header_crc(seg_file(wal_dir, 1))
    with pytest.warns(RecoveryWarning, match="set aside"):
        with pmemwal.open(wal_dir) as wal:
            assert [lsn for lsn, _, _ in read_all(wal)] == kept


def test_a_spare_set_aside_below_another_leaves_no_gap(wal_dir):
    """Segment 1 of three, a spare, damaged: set aside, a fresh spare takes its number, so
    that the WAL, once it ends at segment 0's last byte, does not read as one whose
    segment 1 was deleted."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, preallocate=3 * SEG) as wal:
        for _ in range(100):
            wal.append(b"x" * 900, flush=True)
    _damage_header_crc(seg_file(wal_dir, 1))
    with pytest.warns(RecoveryWarning, match="set aside"):
        wal = pmemwal.open(wal_dir, background=False)
    with wal:
        assert seg_file(wal_dir, 1).exists()
        while SEG - wal.insert_lsn > PAGE:
            wal.append(b"y" * 900, flush=True)
        wal.append(b"z" * (SEG - wal.insert_lsn - REC_HDR), flush=True)   # to its last byte
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        with pmemwal.open(wal_dir) as wal:
            assert wal.cuts == 0


def test_a_shared_open_sets_aside_a_damaged_spare_it_recovers_past(wal_dir):
    """A writer killed (no clean close) with spares made ahead, one of them then damaged,
    reopened shared: recovery reads past the end into the spares, and the damaged one must
    still be set aside, not taken in (records acknowledged into a segment whose header does
    not read would leave a WAL that no open reads)."""
    code = f"""import os, pmemwal
w = pmemwal.open({str(wal_dir)!r}, segment_size={SEG}, background=False, preallocate=2 * {SEG})
for i in range(100):
    w.append(b"x" * 900, flush=True)
os._exit(0)"""
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True)
    _damage_header_crc(seg_file(wal_dir, 1))
    with pytest.warns(RecoveryWarning, match="set aside"):
        wal = pmemwal.open(wal_dir, background=False, shared=True)
    with wal:
        while wal.insert_lsn < SEG + SEG // 2:
            wal.append(b"y" * 900, flush=True)
    with pmemwal.open(wal_dir) as wal:
        assert wal.insert_lsn >= SEG + SEG // 2


def test_an_open_refused_after_recovery_moves_no_damaged_spare(wal_dir):
    """An open that recovery lets through but a later step refuses (here the persist
    option, checked once the core starts) leaves a damaged spare where it was; the next
    open sets it aside."""
    kept = _wal_with_spares(wal_dir)
    path = seg_file(wal_dir, 4)
    raw = path.read_bytes()[:PAGE]
    path.write_bytes(raw)
    with pytest.raises(pmemwal.ConfigError, match="persist"):
        pmemwal.open(wal_dir, mode="buffered", persist="msync")
    assert path.read_bytes() == raw and not (wal_dir / "lost+found").exists()
    with pytest.warns(RecoveryWarning, match=f"{path.name}.*set aside"):
        with pmemwal.open(wal_dir) as wal:
            assert [lsn for lsn, _, _ in read_all(wal)] == kept
    assert path.stat().st_size == SEG   # a whole spare in its place


def test_a_damaged_segment_that_held_records_is_still_refused(wal_dir):
    """Segment 3 holds the WAL's last records: a damaged header there is refused as before,
    on_corruption="truncate" included, and nothing is moved."""
    _wal_with_spares(wal_dir)
    path = seg_file(wal_dir, 3)
    raw = bytearray(path.read_bytes())
    raw[30] ^= 0x01
    path.write_bytes(bytes(raw))
    for on_corruption in ("raise", "truncate"):
        with pytest.raises(pmemwal.FormatError, match="checksum"):
            pmemwal.open(wal_dir, on_corruption=on_corruption)
    assert path.read_bytes() == bytes(raw) and not (wal_dir / "lost+found").exists()


def _acknowledged_into_segment_3(wal_dir, until: int) -> int:
    """A child process appends records of 1000 bytes to a new WAL of 1 MiB segments until
    its insert position passes ``until`` (in segment 3), flushes them all and dies without
    closing; the LSN of its last record."""
    code = ("import os, sys, pmemwal\n"
            f"w = pmemwal.open({str(wal_dir)!r}, segment_size={SEG}, background=False, "
            "prepare_segments=1)\n"
            "lsns = []\n"
            f"while w.insert_lsn < {until}:\n"
            "    lsns.append(w.append(b'r%06d' % len(lsns) + bytes(993)))\n"
            "w.flush()\n"
            "print(lsns[-1], flush=True)\n"
            "os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                          text=True, timeout=120, check=True)
    return int(proc.stdout)


@pytest.mark.parametrize("cut", [0, PAGE])
@pytest.mark.parametrize("until", [3 * SEG, 3 * SEG + SEG // 2], ids=["across", "inside"])
def test_a_damaged_last_segment_the_stream_reached_is_refused(wal_dir, cut, until):
    """The last segment holds acknowledged records (or the end of one that began in the
    segment below), and its file was cut short before any of its data pages: it holds no
    page, but the WAL's records went into it, so it is no spare.  Refused, on_corruption
    "truncate" included, with nothing moved; once the file is back, every record is there."""
    last = _acknowledged_into_segment_3(wal_dir, until)
    assert last // SEG == (2 if until == 3 * SEG else 3)
    path = seg_file(wal_dir, 3)
    original = path.read_bytes()
    path.write_bytes(original[:cut])
    for on_corruption in ("raise", "truncate"):
        with pytest.raises(pmemwal.FormatError, match=path.name):
            pmemwal.open(wal_dir, on_corruption=on_corruption)
    assert path.read_bytes() == original[:cut] and not (wal_dir / "lost+found").exists()
    path.write_bytes(original)
    with pmemwal.open(wal_dir) as wal:
        assert read_all(wal)[-1][0] == last


# ---- options ------------------------------------------------------------------------

def test_segment_size_mismatch(wal_dir, mode):
    recs = _make(wal_dir, mode)
    with pytest.raises(pmemwal.ConfigError) as info:
        pmemwal.open(wal_dir, mode=mode, segment_size=2 * SEG)
    assert isinstance(info.value, ValueError)
    assert str(SEG) in str(info.value)
    _readable(wal_dir, recs, mode)
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:   # the same size is fine
        assert wal.segment_size == SEG


@pytest.mark.parametrize("size", [0, 4096, SEG // 2, 3 * SEG, SEG + 8192, 2 << 30, -SEG])
def test_bad_segment_size(wal_dir, size):
    with pytest.raises(pmemwal.ConfigError):
        pmemwal.open(wal_dir, segment_size=size)
    assert not wal_dir.exists()          # refused before anything was made


@pytest.mark.parametrize("option,value,valid", [
    ("mode", "fast", ["auto", "buffered", "direct"]),
    ("mode", "Direct", ["auto", "buffered", "direct"]),
    ("sync_method", "sync", ["fdatasync", "fsync", "open_datasync"]),
    ("on_corruption", "ignore", ["raise", "truncate"]),
])
def test_unknown_choice(wal_dir, option, value, valid):
    with pytest.raises(pmemwal.ConfigError) as info:
        pmemwal.open(wal_dir, **{option: value})
    message = str(info.value)
    assert option in message and repr(value) in message
    for v in valid:
        assert v in message
    assert not wal_dir.exists()


@pytest.mark.parametrize("option,value", [
    ("insert_slots", 0), ("insert_slots", 257), ("buffer_size", 8192 * 16 + 1),
    ("buffer_size", 8192), ("max_record_size", -1), ("max_record_size", (1 << 30) + 1),
    ("recycle_segments", -1), ("gil_release_size", -1), ("gil_release_size", 1 << 64),
    ("max_wal_size", -1), ("preallocate", -1),
])
def test_bad_numeric_option(wal_dir, option, value):
    with pytest.raises(pmemwal.ConfigError):
        pmemwal.open(wal_dir, **{option: value})


def test_bad_options_on_existing_wal_lose_nothing(wal_dir, mode):
    recs = _make(wal_dir, mode)
    for opts in ({"mode": "nope"}, {"segment_size": 12345}, {"insert_slots": 0}):
        with pytest.raises(pmemwal.ConfigError):
            pmemwal.open(wal_dir, **opts)
    _readable(wal_dir, recs, mode)


# ---- a second writer --------------------------------------------------------------------

def test_second_writer_same_process(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        lsn = wal.append(b"first")
        for other in ("buffered", "direct"):
            with pytest.raises(pmemwal.LockedError):
                pmemwal.open(wal_dir, mode=other)
        lsn2 = wal.append(b"still mine")       # the holder is not disturbed
        wal.flush()
    with pmemwal.open(wal_dir, mode=mode) as wal:  # released by close
        assert [(l, d) for l, d, _ in read_all(wal)] == [(lsn, b"first"), (lsn2, b"still mine")]


def test_a_forked_child_does_not_keep_the_lock(wal_dir):
    """A child forked while the WAL is open (pysyncobj forks to write snapshots) and still
    alive after the parent closed it must not keep the directory locked."""
    wal = pmemwal.open(wal_dir, segment_size=SEG)
    wal.append(b"before the fork", flush=True)
    read_end, write_end = os.pipe()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its after-fork hooks have run): say so, wait until told to go
        os.close(write_end)
        os.write(ready_write, b"r")
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    os.close(ready_write)
    assert os.read(ready_read, 1) == b"r"
    os.close(ready_read)
    try:
        with pytest.raises(pmemwal.LockedError):  # the parent still holds it
            pmemwal.open(wal_dir)
        wal.close()
        with pmemwal.open(wal_dir) as again:  # the child is alive, the lock is free
            assert [bytes(r.payload) for r in again.records()] == [b"before the fork"]
    finally:
        os.close(write_end)
        os.waitpid(pid, 0)


def test_second_writer_other_process(wal_dir, mode):
    recs = _make(wal_dir, mode)
    holder = subprocess.Popen([sys.executable, CHILD, json.dumps({"op": "hold", "dir": str(wal_dir),
                                                                   "mode": mode})],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=child_env())
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        with pytest.raises(pmemwal.LockedError):
            pmemwal.open(wal_dir, mode=mode)
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    _readable(wal_dir, recs, mode)
    # and the other way round: this process holds it, a child is refused
    with pmemwal.open(wal_dir, mode=mode):
        out = run_child({"op": "try_open", "dir": str(wal_dir), "mode": mode})
        assert out["error"] == "LockedError"
    assert run_child({"op": "try_open", "dir": str(wal_dir), "mode": mode})["error"] is None


# ---- records ----------------------------------------------------------------------------

def test_record_too_large(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, max_record_size=1000) as wal:
        a = wal.append(payload("ok", 1000))
        before = wal.insert_lsn
        with pytest.raises(pmemwal.RecordTooLargeError) as info:
            wal.append(payload("big", 1001))
        assert isinstance(info.value, ValueError)
        assert wal.insert_lsn == before
        with pytest.raises(pmemwal.RecordTooLargeError):
            wal.append_many([b"small", payload("big", 5000), b"small"])
        assert wal.insert_lsn == before
        b = wal.append(b"after")
        assert b == before
        assert [(l, d) for l, d, _ in read_all(wal)] == [(a, payload("ok", 1000)), (b, b"after")]
        assert wal.stats()["records"] == 2
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [l for l, _, _ in read_all(wal)] == [a, b]


@pytest.mark.parametrize("bad", ["text", 42, [1, 2, 3], None, 3.5, {"a": 1}])
def test_non_bytes_data(wal_dir, mode, bad):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        a = wal.append(b"before")
        before = wal.insert_lsn
        with pytest.raises(TypeError):
            wal.append(bad)
        with pytest.raises(TypeError):
            wal.append_many([b"ok", bad])
        assert wal.insert_lsn == before
        b = wal.append(b"after")
        assert [(l, d) for l, d, _ in read_all(wal)] == [(a, b"before"), (b, b"after")]


def test_append_many_of_non_sequence(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        before = wal.insert_lsn
        for bad in (42, None, "abc"):
            with pytest.raises(TypeError):
                wal.append_many(bad)
        assert wal.insert_lsn == before


def test_flush_past_the_end(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        a = wal.append(b"x" * 100)
        end = wal.insert_lsn
        for bad in (end + 8, end + SEG, 1 << 62, 8192):   # beyond, far beyond, a header
            with pytest.raises(ValueError):
                wal.flush(bad)
        assert wal.flush(a) >= end                          # the record itself is fine
        assert wal.flush(end) == end                        # "everything so far"
        assert [(l, d) for l, d, _ in read_all(wal)] == [(a, b"x" * 100)]


def test_flush_negative_lsn(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        wal.append(b"x")
        with pytest.raises(ValueError):
            wal.flush(-1)


# ---- a closed WAL --------------------------------------------------------------------------

def test_closed_wal(wal_dir, mode):
    wal = pmemwal.open(wal_dir, mode=mode, segment_size=SEG)
    a = wal.append(b"kept")
    wal.close()
    wal.close()                                   # twice is fine
    assert wal.closed
    calls = [
        lambda: wal.append(b"x"),
        lambda: wal.append_many([b"x"]),
        lambda: wal.flush(),
        lambda: wal.flush(a),
        lambda: list(wal.records()),
        lambda: wal.truncate(a),
        lambda: wal.stats(),
    ]
    for call in calls:
        with pytest.raises(pmemwal.ClosedError):
            call()
    with pmemwal.open(wal_dir, mode=mode) as again:
        assert [(l, d) for l, d, _ in read_all(again)] == [(a, b"kept")]


def test_context_manager_closes_on_error(wal_dir, mode):
    with pytest.raises(RuntimeError):
        with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
            a = wal.append(b"in flight")
            raise RuntimeError("boom")
    assert wal.closed
    with pmemwal.open(wal_dir, mode=mode) as wal:       # the lock was released, data flushed
        assert [(l, d) for l, d, _ in read_all(wal)] == [(a, b"in flight")]


# ---- a full disk ---------------------------------------------------------------------------

@pytest.fixture
def tiny_fs(shm_tmp):
    """A 3 MiB tmpfs: room for about three 1 MiB segments."""
    with mounted_tmpfs(shm_tmp / "tiny", "3m") as mnt:
        yield mnt


@pytest.mark.parametrize("background", [False, True])
def test_full_disk(tiny_fs, mode, background):
    """With the background writer on, it may meet ENOSPC first; the appender still gets it."""
    wal_dir = tiny_fs / "wal"
    acked = []
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=background) as wal:
        with pytest.raises(pmemwal.StorageError) as info:
            for i in range(1000):
                data = payload(f"full/{i}", 50_000)
                lsn = wal.append(data)
                wal.flush(lsn)
                acked.append((lsn, data))
        assert info.value.errno == errno.ENOSPC
        assert isinstance(info.value, OSError)
        assert acked and acked[-1][0] >= SEG      # it got at least into segment 1
        # the failed append reserved nothing: what was acknowledged reads back
        assert wal.insert_lsn == wal.flushed_lsn
        assert [(l, d) for l, d, _ in read_all(wal)] == acked
    assert not list(wal_dir.glob("*.tmp"))       # no half-made segment left behind
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(l, d) for l, d, _ in read_all(wal)] == acked
        # small records still fit in the current segment
        end = wal.insert_lsn
        assert wal.append(b"fits") == end
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(l, d) for l, d, _ in read_all(wal)] == acked + [(end, b"fits")]


def test_segment_number_out_of_range_is_refused(wal_dir):
    """Regression: a valid header on segment FFFF...FF was accepted; the next
    truncate then tried to recycle into segment 2^64 and left the WAL broken."""
    from pmemwal.format import SegmentHeader
    with pmemwal.open(wal_dir, segment_size=1 << 20, background=False) as wal:
        wal.append(b"x" * 100, flush=True)
        wal_id = wal.wal_id
    huge = (1 << 64) - 1
    with open(wal_dir / f"{huge:016X}.wal", "wb") as f:
        f.write(SegmentHeader(huge, 1 << 20, wal_id).pack())
        f.truncate(1 << 20)
    with pytest.raises(pmemwal.FormatError, match="out of range"):
        pmemwal.open(wal_dir)


def test_a_bad_pmemwal_mode_is_refused_before_anything_is_made(shm_tmp, monkeypatch):
    """PMEMWAL_MODE naming no mode: a ConfigError (a WALError, still a ValueError), and
    neither a new directory nor a file in an empty one is left behind."""
    monkeypatch.setenv("PMEMWAL_MODE", "bogus")
    new = shm_tmp / "new"
    with pytest.raises(pmemwal.ConfigError, match="PMEMWAL_MODE"):
        pmemwal.open(new)
    assert not new.exists()
    empty = shm_tmp / "empty"
    empty.mkdir()
    with pytest.raises(ValueError):
        pmemwal.open(empty)
    assert list(empty.iterdir()) == []


def test_an_open_failing_after_another_writer_made_the_wal_leaves_that_wal(shm_tmp,
                                                                           monkeypatch):
    """(From a review.) Another writer makes the WAL and commits to it between this open's
    look at the directory and its lock; this open then fails: the other's WAL stays whole."""
    path = shm_tmp / "wal"
    path.mkdir()
    real = WalDirectory.list_segments
    done = []

    def other_writer_in_the_window(self, tidy=True):
        if not done and self.path == str(path):
            done.append(1)
            with pmemwal.open(path, mode="buffered") as other:
                other.append(b"the other's committed record", flush=True)
            monkeypatch.setenv("PMEMWAL_MODE", "bogus")  # this open fails later on
        return real(self, tidy)

    monkeypatch.setattr(WalDirectory, "list_segments", other_writer_in_the_window)
    with pytest.raises(pmemwal.ConfigError):
        pmemwal.open(path)
    monkeypatch.undo()
    assert done
    with pmemwal.open(path, mode="buffered", create=False) as wal:
        assert [bytes(r.payload) for r in wal.records()] == [b"the other's committed record"]


def test_a_failed_create_leaves_no_segment_behind(shm_tmp, monkeypatch):
    """persist='pmem' where the mapping is no pmem: the ConfigError comes once the first
    segment is made and mapped; the open takes back what it made (LOCK stays, for another
    open that may be waiting on it, and FOLLOW, for a follower that may be), and the next
    open makes the WAL there."""
    monkeypatch.delenv("PMEM_IS_PMEM_FORCE", raising=False)
    for path in (shm_tmp / "new", shm_tmp / "empty"):
        if path.name == "empty":
            path.mkdir()
        with pytest.raises(pmemwal.ConfigError, match="persist='pmem'"):
            pmemwal.open(path, mode="direct", persist="pmem")
        assert sorted(p.name for p in path.iterdir()) == ["FOLLOW", "LOCK"]
        with pmemwal.open(path, mode="direct") as wal:
            wal.append(b"made after all", flush=True)
        with pmemwal.open(path, create=False) as wal:
            assert [bytes(r.payload) for r in wal.records()] == [b"made after all"]


def test_a_failed_open_of_an_existing_wal_removes_nothing(wal_dir, monkeypatch):
    monkeypatch.delenv("PMEM_IS_PMEM_FORCE", raising=False)
    recs = _make(wal_dir, "direct")
    before = sorted(p.name for p in wal_dir.iterdir())
    with pytest.raises(pmemwal.ConfigError):
        pmemwal.open(wal_dir, mode="direct", persist="pmem")
    assert sorted(p.name for p in wal_dir.iterdir()) == before
    _readable(wal_dir, recs, "direct")


def test_a_shared_open_refused_by_an_unshared_writer_leaves_no_control_file(wal_dir):
    with pmemwal.open(wal_dir, mode="direct") as wal:
        with pytest.raises(pmemwal.LockedError, match="does not share it"):
            pmemwal.open(wal_dir, shared=True)
        assert not (wal_dir / "CONTROL").exists()
        wal.append(b"still the only writer", flush=True)
