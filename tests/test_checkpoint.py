"""Checkpoints: where recovery starts, and no acknowledged record cut or destroyed.

The issue's scenario, in every flush pattern: records of 100-3,000 B, acknowledged
(flushed) and the WAL closed, then 32 bytes of record 100's payload garbled as a media
error would.  Reopening must never return fewer records silently: the damaged record
raises CorruptionError when read (or on open with verify="all"), no segment file
changes, and a cut (on_corruption="truncate") sets the records past it aside first.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest
from click.testing import CliRunner

import pmemwal
import pmemwal.slots
from pmemwal import lostfound, putback
from pmemwal.checkpoint import CheckpointFile
from pmemwal.format import CHECKPOINTED, SPARE, SegmentHeader
from pmemwal.slots import SLOT_STRIDE
from pmemwal.recovery import RecoveryWarning
from pmemwal.tools.cli import main as cli

from conftest import (PAGE, PAGE_HDR, REC_HDR, as_made_before_checkpoints, child_env,
                      first_lsn_of_segment, seg_file, stream_write)

N, DAMAGED = 1500, 100
PATTERNS = ("each", "end", "background", "every500")


def _payloads(seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(100, 3000)) for _ in range(N)]


def _write(path, mode: str, seg: int, pattern: str, payloads: list[bytes]) -> list[int]:
    """Append ``payloads`` flushing as ``pattern`` says; every record is acknowledged
    (flushed) before the WAL is closed."""
    lsns = []
    with pmemwal.open(path, mode=mode, segment_size=seg, background=pattern == "background",
                      flush_interval=0.005) as wal:
        for i, data in enumerate(payloads):
            lsns.append(wal.append(data, flush=pattern == "each"))
            if pattern == "every500" and i % 500 == 499:
                wal.flush()
        if pattern == "background":
            deadline = time.monotonic() + 10
            while wal.flushed_lsn < wal.insert_lsn and time.monotonic() < deadline:
                time.sleep(0.005)  # acknowledged by the background writer alone
        assert wal.flush() == wal.insert_lsn
    return lsns


def _garble(path, lsn: int, seg: int) -> None:
    """32 bytes inside the payload of the record at ``lsn`` inverted, as a media error."""
    payload_lsn = lsn + 24 + 40
    data = bytes(b ^ 0xA5 for b in range(32))
    stream_write(path, payload_lsn, data, seg)


def _digest(path) -> dict[str, str]:
    """The segment files' contents (lost+found and the checkpoint aside)."""
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".wal"):
            with open(os.path.join(path, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.mark.parametrize("seg", [1 << 20, 16 << 20], ids=["1MiB", "16MiB"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_damage_to_an_acknowledged_record_is_never_cut(wal_dir, mode, seg, pattern):
    payloads = _payloads()
    lsns = _write(wal_dir, mode, seg, pattern, payloads)
    _garble(wal_dir, lsns[DAMAGED], seg)
    before = _digest(wal_dir)

    with pytest.raises(pmemwal.CorruptionError) as err:
        pmemwal.open(wal_dir, mode=mode, verify="all")
    assert err.value.lsn == lsns[DAMAGED]
    assert _digest(wal_dir) == before, "a refused open changed a segment file"

    with pmemwal.open(wal_dir, mode=mode) as wal:  # from the checkpoint: the end is the end
        assert wal.insert_lsn > lsns[-1]
        read = []
        with pytest.raises(pmemwal.CorruptionError) as err:
            for rec in wal.records():
                read.append(bytes(rec.payload))
        assert err.value.lsn == lsns[DAMAGED] and read == payloads[:DAMAGED]
        assert bytes(wal.record(lsns[-1]).payload) == payloads[-1]  # the rest is all there
        with pytest.raises(pmemwal.CorruptionError):  # damage, not a bad LSN
            wal.record(lsns[DAMAGED])
    after = _digest(wal_dir)  # (the background writer may have made segments ahead)
    assert {name: after.get(name) for name in before} == before, \
        "an open that read damage changed a segment file"


def test_truncate_sets_aside_what_it_cuts_and_it_can_be_put_back(wal_dir, mode):
    seg = 1 << 20
    payloads = _payloads(2)
    lsns = _write(wal_dir, mode, seg, "end", payloads)
    _garble(wal_dir, lsns[DAMAGED], seg)
    with pytest.warns(RecoveryWarning, match="set aside"):
        wal = pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate")
    with wal:
        assert [bytes(r.payload) for r in wal.records()] == payloads[:DAMAGED]
        assert wal.recovery["set_aside"]
    (entry,) = lostfound.entries(wal_dir)
    kept = [payload for _, payload in entry.records()]
    assert kept == payloads[DAMAGED + 1:], "not every valid record past the cut was kept"

    runner = CliRunner()
    listed = runner.invoke(cli, ["lost-found", str(wal_dir)])
    assert listed.exit_code == 0, listed.output
    assert entry.name in listed.output and f"{N - DAMAGED - 1} record" in listed.output
    dumped = runner.invoke(cli, ["lost-found", str(wal_dir), "--dump", entry.name])
    assert dumped.exit_code == 0 and dumped.output.count("\n") >= N - DAMAGED - 1
    put_back = runner.invoke(cli, ["lost-found", str(wal_dir), "--restore", entry.name])
    assert put_back.exit_code == 0, put_back.output
    assert lostfound.entries(wal_dir) == []
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [bytes(r.payload) for r in wal.records()] == payloads[:DAMAGED] + payloads[DAMAGED + 1:]


def test_lost_found_remove(wal_dir, mode):
    seg = 1 << 20
    payloads = _payloads(3)[:300]
    lsns = []
    with pmemwal.open(wal_dir, mode=mode, segment_size=seg, background=False) as wal:
        lsns = [wal.append(p) for p in payloads]
        wal.flush()
    _garble(wal_dir, lsns[10], seg)
    with pytest.warns(RecoveryWarning):
        pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate").close()
    (entry,) = lostfound.entries(wal_dir)
    result = CliRunner().invoke(cli, ["lost-found", str(wal_dir), "--remove", entry.name])
    assert result.exit_code == 0, result.output
    assert lostfound.entries(wal_dir) == [] and not os.path.exists(entry.path)


def test_open_after_clean_close_reads_nothing(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=1 << 20) as wal:
        for i in range(2000):
            wal.append(b"x" * 500)
        end = wal.insert_lsn
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.recovery["checkpoint_lsn"] == end and wal.recovery["scanned_bytes"] == 0
        assert wal.recovery["full_scan"] is None
        assert sum(1 for _ in wal.records()) == 2000


def test_checkpoint_bounds_the_scan_after_a_kill(wal_dir, mode):
    """A writer killed with SIGKILL: the next open reads from the last checkpoint, not
    from the oldest record, and every record flushed before the kill is there."""
    code = f"""
import sys, pmemwal
wal = pmemwal.open({str(wal_dir)!r}, mode={mode!r}, segment_size=1 << 20, background=False)
for i in range(3000):
    wal.append(i.to_bytes(8, "little") * 64)
cp = wal.checkpoint()
for i in range(3000, 3100):
    wal.append(i.to_bytes(8, "little") * 64, flush=True)
print(cp, wal.flushed_lsn, flush=True)
sys.stdin.read()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=child_env(), text=True)
    cp, flushed = map(int, proc.stdout.readline().split())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.recovery["scanned_from"] == cp and wal.recovery["checkpoint_lsn"] == cp
        assert wal.insert_lsn >= flushed
        got = [int.from_bytes(bytes(r.payload)[:8], "little") for r in wal.records()]
        assert got == list(range(3100))


def test_a_torn_checkpoint_slot_falls_back_to_the_other(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=1 << 20, background=False) as wal:
        wal.append(b"a" * 100)
        first = wal.checkpoint()
        wal.append(b"b" * 100)
        second = wal.checkpoint()
    cpf = CheckpointFile(str(wal_dir), wal.wal_id, 1 << 20)
    newest = cpf.read()
    assert newest.end_lsn == second and newest.clean
    with open(cpf.path, "r+b") as f:  # tear the newest slot
        f.seek((newest.seq % 2) * SLOT_STRIDE + 100)
        f.write(b"\xff" * 8)
    older = cpf.read()
    assert older.seq == newest.seq - 1 and older.end_lsn >= first
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [bytes(r.payload) for r in wal.records()] == [b"a" * 100, b"b" * 100]
    with open(cpf.path, "r+b") as f:  # both torn: a full scan, said by a warning
        f.write(b"\xff" * (2 * SLOT_STRIDE))
    with pytest.warns(RecoveryWarning, match="no valid checkpoint"):
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert wal.recovery["full_scan"].startswith("no valid checkpoint")
        assert [bytes(r.payload) for r in wal.records()] == [b"a" * 100, b"b" * 100]


def test_deleted_segment_below_the_checkpoint_is_corruption(wal_dir, mode):
    seg = 1 << 20
    with pmemwal.open(wal_dir, mode=mode, segment_size=seg) as wal:
        for _ in range(600):
            wal.append(b"z" * 4000)
        assert wal.insert_lsn // seg >= 2
    os.unlink(seg_file(wal_dir, 0))
    with pytest.raises(pmemwal.CorruptionError, match="missing"):
        pmemwal.open(wal_dir, mode=mode)


def test_truncation_moves_the_checkpoint_first(wal_dir, mode):
    seg = 1 << 20
    with pmemwal.open(wal_dir, mode=mode, segment_size=seg, background=False) as wal:
        for _ in range(700):
            wal.append(b"t" * 4000)
        wal.flush()
        cut_lsn = wal.insert_lsn
        assert wal.truncate(cut_lsn) >= 2
        cp = CheckpointFile(str(wal_dir), wal.wal_id, seg).read()
        assert cp.oldest_segno == cut_lsn // seg and cp.end_lsn >= cut_lsn
        wal.append(b"after")
    with pmemwal.open(wal_dir, mode=mode) as wal:  # the removed segments are no loss
        assert [bytes(r.payload) for r in wal.records()][-1] == b"after"


def test_background_writer_checkpoints(wal_dir):
    with pmemwal.open(wal_dir, segment_size=1 << 20, flush_interval=0.01,
                      checkpoint_interval=0.02) as wal:
        start = wal.stats()["checkpoints"]
        for _ in range(20):
            wal.append(b"c" * 1000)
            time.sleep(0.01)
        deadline = time.monotonic() + 5
        while wal.stats()["checkpoints"] < start + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wal.stats()["checkpoints"] >= start + 3


def test_checkpoint_options_are_checked(wal_dir):
    for bad in ({"checkpoint_interval": 0}, {"checkpoint_bytes": 0}, {"verify": "some"}):
        with pytest.raises(pmemwal.ConfigError):
            pmemwal.open(wal_dir, **bad)


# ---- found by review: each failed before its fix ------------------------------------

def test_stale_records_of_a_recycled_segment_are_not_set_aside(wal_dir, mode):
    """A WAL ending in a recycled segment, amid the records of its older cycle: those are no
    records of this WAL, so a reopen sets nothing aside (and restore could not append them)."""
    import warnings

    from test_recovery import _append, _fill_and_recycle, _pad_to
    from conftest import PAGE, PAGE_HDR, SEG as S

    wal, old, _, recycled = _fill_and_recycle(wal_dir, mode, background=False)
    with wal:
        _append(wal, [1000] * 3, "new", flush_each=True)
        while wal.insert_lsn < recycled[0] * S + 2 * PAGE:
            _append(wal, [777], "more", flush_each=True)
        cur = wal.insert_lsn % S
        idx = next(k for k, (lsn, _) in enumerate(old[:-1])
                   if lsn < S and lsn - cur >= 3 * PAGE and lsn % PAGE >= PAGE_HDR + 64
                   and old[k + 1][0] // PAGE == lsn // PAGE)
        _pad_to(wal, recycled[0] * S + old[idx][0], "pad")  # the end lands on an old record
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        pmemwal.open(wal_dir, mode=mode).close()
    assert lostfound.entries(wal_dir) == []


def test_close_names_no_end_it_did_not_flush(wal_dir, mode):
    """A thread appending while another closes: the checkpoint close writes is durable, and
    clean only when nothing came after it."""
    import threading

    wal = pmemwal.open(wal_dir, mode=mode, segment_size=1 << 20, background=False)

    def appender():
        try:
            while True:
                wal.append(b"x" * 200)
        except pmemwal.ClosedError:
            pass

    thread = threading.Thread(target=appender)
    thread.start()
    time.sleep(0.05)
    wal.close()
    thread.join()
    with pmemwal.open(wal_dir, mode=mode, verify="all") as again:
        assert sum(1 for _ in again.records()) > 0


def test_truncate_racing_close_never_removes_what_the_checkpoint_vouches_for(wal_dir, mode):
    import threading

    seg = 1 << 20
    wal = pmemwal.open(wal_dir, mode=mode, segment_size=seg, background=False)
    for _ in range(800):
        wal.append(b"r" * 4000)
    wal.flush()
    closing = threading.Event()
    durable_point = wal._durable_point

    def late_durable_point():  # the truncation finds its point as close is under way
        closing.wait(5)
        time.sleep(0.05)
        return durable_point()

    wal._durable_point = late_durable_point
    truncation = threading.Thread(target=lambda: wal.truncate(wal.flushed_lsn))
    truncation.start()
    time.sleep(0.02)
    closing.set()
    wal.close()
    truncation.join()
    with pmemwal.open(wal_dir, mode=mode) as again:  # no "segments ... are missing"
        assert again.insert_lsn > 2 * seg


def test_truncate_with_a_missing_vouched_segment_cuts_there(wal_dir, mode):
    seg = 1 << 20
    with pmemwal.open(wal_dir, mode=mode, segment_size=seg) as wal:
        lsns = [wal.append(b"m" * 10_000) for _ in range(300)]
    os.unlink(seg_file(wal_dir, 1))
    with pytest.warns(RecoveryWarning):
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    with wal:
        kept = [r.lsn for r in wal.records()]
        assert kept == [lsn for lsn in lsns if lsn < kept[-1] + 1] and kept[-1] < seg
        wal.append(b"after", flush=True)
    with pmemwal.open(wal_dir, mode=mode) as wal:  # the cut holds: no error on later opens
        assert bytes(list(wal.records())[-1].payload) == b"after"


@pytest.mark.parametrize("recycle", [0, 2])
def test_truncate_to_a_segment_boundary_keeps_the_newest_segment(wal_dir, mode, recycle):
    """The WAL ends exactly where segment 1 begins, which is not made yet: truncating up to
    the flushed LSN keeps segment 0 (the newest), and appending goes on, in the same WAL
    and at LSNs past every one handed out (issue 27, item 7: with no segment recycled the
    files all went, and a reopen made a new WAL whose LSNs started again)."""
    seg = 1 << 20
    usable = (seg // 8192 - 1) * 8168
    with pmemwal.open(wal_dir, mode=mode, segment_size=seg, background=False, prefault=False,
                      prepare_segments=0, recycle_segments=recycle,
                      max_record_size=2 * seg) as wal:
        wal.append(b"z" * (usable - 24), flush=True)
        boundary, wal_id = wal.flushed_lsn, wal.wal_id
        assert boundary == seg + 8216 and not seg_file(wal_dir, 1).exists()
        wal.truncate(boundary)
        after = wal.append(b"after", flush=True)
        assert after >= boundary
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.wal_id == wal_id
        assert [(r.lsn, bytes(r.payload)) for r in wal.records()][-1] == (after, b"after")


def test_open_syncs_what_it_read_before_a_checkpoint_names_it(wal_dir, mode, monkeypatch):
    """After a SIGKILL, records that were never flushed lie in the page cache: recovery reads
    them, and before the open's checkpoint names them durable they are synced."""
    code = f"""
import sys, pmemwal
wal = pmemwal.open({str(wal_dir)!r}, mode={mode!r}, segment_size=1 << 20, background=False,
                   buffer_size=128 << 10)  # buffered: the ring wraps, so its pages are written
wal.append(b"first", flush=True)
for i in range(600):
    wal.append(b"u" * 4000)  # never flushed
print(wal.insert_lsn, flush=True)
sys.stdin.read()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=child_env(), text=True)
    end = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    events = []
    real_fdatasync, real_write = os.fdatasync, pmemwal.slots.SlotPair.write

    def fdatasync(fd):
        events.append(("sync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fdatasync(fd)

    def write(self, which, body):
        events.append(("checkpoint", os.path.basename(self.path)))
        return real_write(self, which, body)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(pmemwal.slots.SlotPair, "write", write)
    with pmemwal.open(wal_dir, mode=mode, background=False) as wal:
        # the killed writer's records were in the page cache (but the ring's last pages)
        assert wal.insert_lsn > end - (128 << 10) > 2 << 20
        first_checkpoint = events.index(("checkpoint", "CHECKPOINT"))
        synced = {name for kind, name in events[:first_checkpoint] if kind == "sync"}
        assert {"0000000000000000.wal", "0000000000000001.wal", "0000000000000002.wal"} <= synced


def test_a_restore_cut_short_appends_only_what_is_missing(wal_dir):
    seg = 1 << 20
    payloads = _payloads(4)[:200]
    with pmemwal.open(wal_dir, segment_size=seg, background=False) as wal:
        lsns = [wal.append(p) for p in payloads]
        wal.flush()
    _garble(wal_dir, lsns[20], seg)
    with pytest.warns(RecoveryWarning):
        pmemwal.open(wal_dir, verify="all", on_corruption="truncate").close()
    (entry,) = lostfound.entries(wal_dir)
    kept = [p for _, p in entry.records()]
    with pmemwal.open(wal_dir) as wal:  # a put-back that got 50 records in, then died
        with open(os.path.join(entry.path, "RESTORING"), "w") as f:
            f.write(str(wal.insert_lsn))
        wal.append_many(kept[:50])
    assert putback.restore(str(wal_dir), entry.name) == len(kept)
    with pmemwal.open(wal_dir) as wal:
        assert [bytes(r.payload) for r in wal.records()] == payloads[:20] + kept


@pytest.mark.parametrize("case", ["direct-pmem", "direct-msync", "buffered"])
def test_reopen_after_a_kill_in_each_persist_method(wal_dir, case):
    """Each way of persisting recovers what a killed writer left, and makes it durable before
    naming it (on pmem by a cache flush over the reader's read-only mapping)."""
    from conftest import PERSIST_CASES

    mode, env, method = PERSIST_CASES[case]
    writer = f"""
import sys, pmemwal
wal = pmemwal.open({str(wal_dir)!r}, mode={mode!r}, segment_size=1 << 20, background=False,
                   buffer_size=128 << 10)
for i in range(400):
    wal.append(i.to_bytes(4, "little") * 1000, flush=i < 100)
print(wal.persist_method, flush=True)
sys.stdin.read()
"""
    proc = subprocess.Popen([sys.executable, "-c", writer], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=child_env(**env), text=True)
    assert proc.stdout.readline().strip() == method
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader = f"""
import pmemwal
with pmemwal.open({str(wal_dir)!r}, mode={mode!r}) as wal:
    got = [int.from_bytes(bytes(r.payload)[:4], "little") for r in wal.records()]
    assert got == list(range(len(got))) and len(got) >= 100, got[:3]
    print(wal.persist_method, wal.recovery["scanned_bytes"] > 0)
"""
    out = subprocess.run([sys.executable, "-c", reader], env=child_env(**env), check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [method, "True"]


def test_a_shared_wal_recovers_a_record_running_into_a_missing_segment(wal_dir):
    """The first opener of a shared WAL recovers before its core exists: looking past a torn
    end at a record that runs into a segment not there asks for it, and must get "none"."""
    from conftest import rewind_checkpoint

    seg = 1 << 20
    usable = (seg // 8192 - 1) * 8168
    with pmemwal.open(wal_dir, segment_size=seg, shared=True, background=False) as wal:
        wal.append(b"a" * (usable - 24 - 4000 - 24), flush=True)
        wal.append(b"b" * 8000, flush=True)  # runs into segment 1
    os.unlink(seg_file(wal_dir, 1))
    rewind_checkpoint(wal_dir)
    with pmemwal.open(wal_dir, shared=True) as wal:
        assert [len(r.payload) for r in wal.records()] == [usable - 24 - 4000 - 24]


def test_a_truncation_that_close_overtakes_touches_nothing(wal_dir):
    """A truncation past its open check when close runs: once it gets the truncation lock
    the WAL is closed (its directory lock may be another writer's by now), so it removes no
    segment and leaves the clean checkpoint as it is."""
    import threading

    seg = 1 << 20
    wal = pmemwal.open(wal_dir, segment_size=seg, background=False, recycle_segments=0)
    for _ in range(20):
        wal.append(b"x" * 200_000, flush=True)
    before = sorted(os.listdir(wal_dir))
    closed = threading.Event()
    check_open = wal._check_open

    def late_check_open():  # the truncation has passed its check; close runs meanwhile
        check_open()
        if threading.current_thread().name == "truncation":
            closed.wait(5)

    wal._check_open = late_check_open
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(
        pytest.raises(pmemwal.ClosedError, wal.truncate, wal.flushed_lsn)), name="truncation")
    thread.start()
    time.sleep(0.05)
    wal.close()
    closed.set()
    thread.join()
    assert sorted(os.listdir(wal_dir)) == before
    assert CheckpointFile(str(wal_dir), wal.wal_id, seg).read().clean


def test_closing_a_shared_wal_keeps_the_files_lock_of_a_segment_being_made(wal_dir):
    """An appender that claimed a segment of a shared WAL before close reaches the files
    lock (flock on CONTROL) as close closes that file: it holds the lock through the create,
    or gets ClosedError, never a bad descriptor or a lock dropped under it."""
    import fcntl
    import threading

    wal = pmemwal.open(wal_dir, segment_size=1 << 20, shared=True, background=False)
    closing, creating, seen = threading.Event(), threading.Event(), []
    await_lower, create, control = wal._await_lower, wal._dir.create, wal._control
    close_control = control.close

    def late_await_lower(segno):  # the appender goes on only once close is closing CONTROL
        closing.wait(5)
        await_lower(segno)

    def slow_create(*args, **kwargs):
        creating.set()
        time.sleep(0.3)
        fd = os.open(wal_dir / "CONTROL", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("the files lock was free while a segment was made")
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        create(*args, **kwargs)

    def watched_close():
        closing.set()
        creating.wait(1)
        close_control()

    wal._await_lower, wal._dir.create, control.close = late_await_lower, slow_create, watched_close

    def appender():
        try:
            for _ in range(400):
                wal.append(b"x" * 8000)
        except pmemwal.ClosedError:
            pass
        except BaseException as exc:
            seen.append(repr(exc))

    thread = threading.Thread(target=appender)
    thread.start()
    time.sleep(0.2)
    wal.close()
    thread.join()
    assert not seen, seen


def test_an_unclean_open_reads_past_the_checkpoint_from_the_disk(wal_dir, mode, monkeypatch):
    """Issue 27, item 19 (fsyncgate's second half): after a failed writeback Linux marks the
    pages clean though the disk never got them; an open in the same boot read the records
    from those pages, took them for durable, and appended after a hole on the disk.  An
    open after an unclean end drops the clean cached pages past the checkpoint first (dirty
    ones, a killed writer's, stay and are synced); after a clean close it reads nothing."""
    code = f"""
import sys, pmemwal
wal = pmemwal.open({str(wal_dir)!r}, mode={mode!r}, segment_size=1 << 20, background=False)
wal.append(b"x" * 4000, flush=True)
wal.checkpoint()
for i in range(600):
    wal.append(b"y" * 4000, flush=True)     # past the checkpoint: segments 0..2
print("ready", flush=True)
sys.stdin.read()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=child_env(), text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)                # an unclean end
    proc.wait()
    dropped = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: (
        dropped.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), off, advice)),
        real(fd, off, n, advice))[1])
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert len(list(wal.records())) >= 601
    names = {name for name, _, advice in dropped if advice == os.POSIX_FADV_DONTNEED}
    assert {"0000000000000000.wal", "0000000000000001.wal", "0000000000000002.wal"} <= names
    # whole segments: a large folio holding the checkpoint's end would stay otherwise
    assert {offset for _, offset, _ in dropped} == {0}
    dropped.clear()
    with pmemwal.open(wal_dir, mode=mode):                  # closed cleanly just now
        pass
    assert not dropped


# ---- what the checkpoint vouches for, and what an open may change -------------------------

SEG = 1 << 20


def _tree(path) -> dict[str, str]:
    """Every file and directory under ``path``, a file with its contents' digest."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), path) + "/"] = ""
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _fill(wal_dir, mode: str, segments: int, **opts) -> list[int]:
    """A closed WAL of 10,000-byte records reaching into segment ``segments``; their LSNs."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False, **opts) as wal:
        lsns = []
        while wal.insert_lsn < segments * SEG + 5 * 8192:
            lsns.append(wal.append(b"%d/" % len(lsns) + bytes(10_000)))
    return lsns


@pytest.mark.parametrize("left", ["CHECKPOINT", "lost+found", "index", "archive_status"])
def test_a_wal_whose_segments_were_all_deleted_is_not_made_anew(wal_dir, left):
    """Every segment file deleted, what else the WAL kept still there: open refuses, naming
    what it found, instead of making a new, empty WAL (another id) over it."""
    _fill(wal_dir, "direct", 1)
    for name in os.listdir(wal_dir):
        if name.endswith(".wal"):
            os.unlink(wal_dir / name)
    if left != "CHECKPOINT":
        os.unlink(wal_dir / "CHECKPOINT")
        os.mkdir(wal_dir / left)
    before = _tree(wal_dir)
    for create in (True, False):
        with pytest.raises(pmemwal.CorruptionError, match=f"{re.escape(left)}.* no segment file") as info:
            pmemwal.open(wal_dir, create=create)
        assert "deleted" in str(info.value)
        assert _tree(wal_dir) == before, "a refused open changed the directory"


def test_a_read_that_found_damage_leaves_the_checkpoint_as_the_open_wrote_it(wal_dir, mode):
    """Damage before the checkpoint is found by the read: with nothing appended, close
    rewrites nothing (a refused open changes no file; neither does a read that refused)."""
    payloads = _payloads(5)[:300]
    lsns = _write(wal_dir, mode, SEG, "end", payloads)
    _garble(wal_dir, lsns[DAMAGED], SEG)
    wal = pmemwal.open(wal_dir, mode=mode, background=False)
    opened = (wal_dir / "CHECKPOINT").read_bytes()
    with pytest.raises(pmemwal.CorruptionError):
        for _ in wal.records():
            pass
    wal.close()
    assert (wal_dir / "CHECKPOINT").read_bytes() == opened
    with pmemwal.open(wal_dir, mode=mode, background=False):  # no damage read: a clean close
        pass
    assert CheckpointFile(str(wal_dir), wal.wal_id, SEG).read().clean


def test_a_slot_older_than_a_truncation_does_not_vouch_for_what_it_removed(wal_dir, mode):
    """The newest slot damaged after a truncation: the other must not name the removed
    segments (a false "segments deleted" error)."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=0) as wal:
        lsns = []
        while wal.insert_lsn < 3 * SEG + 5 * 8192:
            lsns.append(wal.append(b"%d/" % len(lsns) + bytes(10_000)))
        wal.checkpoint()
        assert wal.truncate(2 * SEG) == 2
        after_truncation = (wal_dir / "CHECKPOINT").read_bytes()
    (wal_dir / "CHECKPOINT").write_bytes(after_truncation)  # as a crash right after it left it
    cpf = CheckpointFile(str(wal_dir), wal.wal_id, SEG)
    newest = cpf.read()
    assert newest.oldest_segno == 2
    with open(cpf.path, "r+b") as f:  # damage the newest slot
        f.seek((newest.seq % 2) * SLOT_STRIDE + 100)
        f.write(b"\xff" * 8)
    assert cpf.read().oldest_segno == 2, "a slot from before the truncation vouches"
    with pmemwal.open(wal_dir, mode=mode) as wal:
        kept = [r.lsn for r in wal.records()]
    assert kept == [lsn for lsn in lsns if lsn >= kept[0]] and kept[0] < 2 * SEG + 3 * 8192


def test_a_deleted_oldest_segment_cut_with_truncate_counts_as_a_cut(wal_dir, mode):
    """The oldest segment the checkpoint vouches for deleted, the open told to truncate: the
    records in it are gone, so the cut is counted (a layer's index from before is not
    used), and the warning says what became of the WAL."""
    lsns = _fill(wal_dir, mode, 2)
    os.unlink(seg_file(wal_dir, 0))
    with pytest.warns(RecoveryWarning, match="segment 0000000000000000 is missing") as caught:
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    text = " ".join(str(w.message) for w in caught)
    assert "lost" in text and "now begin in segment 0000000000000001" in text
    with wal:
        assert wal.cuts == 1
        kept = [r.lsn for r in wal.records()]   # segment 1's records on, every one
        assert kept == [lsn for lsn in lsns if lsn >= kept[0]] and SEG < kept[0] < SEG + 2 * 8192
    with pmemwal.open(wal_dir, mode=mode) as wal:  # the cut holds, and is not counted again
        assert wal.cuts == 1


@pytest.mark.parametrize("damage", ["cuts field kept", "both slots overwritten"])
def test_cuts_never_goes_down_when_both_slots_are_invalid(wal_dir, mode, damage):
    """Both slots invalid: recovery goes on from one more than the count a damaged slot
    still shows (the scan without a checkpoint may cut damaged acknowledged records as a
    torn tail, so it counts as a cut), never from 0.  With both slots overwritten whole the
    count is the newest segment header's, as the open that raised it left it."""
    lsns = _fill(wal_dir, mode, 1)
    for round in (1, 2):  # two cuts of durable records
        _garble(wal_dir, lsns[-10 * round], SEG)
        with pytest.warns(RecoveryWarning):
            pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate").close()
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.cuts == 2
    with open(wal_dir / "CHECKPOINT", "r+b") as f:
        for slot in (0, SLOT_STRIDE):
            if damage == "cuts field kept":   # a CRC that fails, the rest as written
                f.seek(slot + 508)
                f.write(b"\0\0\0\0")
            else:
                f.seek(slot)
                f.write(b"\xff" * 512)
    with pytest.warns(RecoveryWarning, match="no valid checkpoint"):
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert wal.cuts == 3
    with pmemwal.open(wal_dir, mode=mode) as wal:   # the open wrote it: valid again
        assert wal.recovery["full_scan"] is None
        assert wal.cuts == 3


def test_a_deleted_checkpoint_is_not_taken_for_a_wal_made_before_checkpoints(wal_dir, mode):
    """The segments say the WAL kept a CHECKPOINT: without it, damage to the last
    acknowledged record would be cut as a torn tail, silently.  Open refuses, changing
    nothing; told to truncate, it reads every record, says so, and counts a cut."""
    payloads = _payloads(6)[:300]
    lsns = _write(wal_dir, mode, SEG, "end", payloads)
    _garble(wal_dir, lsns[-1], SEG)     # the last acknowledged record
    os.unlink(wal_dir / "CHECKPOINT")
    before = _tree(wal_dir)
    for verify in ("checkpoint", "all"):
        with pytest.raises(pmemwal.CorruptionError, match="CHECKPOINT is missing"):
            pmemwal.open(wal_dir, mode=mode, verify=verify)
        assert _tree(wal_dir) == before, "a refused open changed the directory"
    with pytest.warns(RecoveryWarning, match="CHECKPOINT is missing"):
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    with wal:
        assert wal.recovery["full_scan"].startswith("CHECKPOINT is missing")
        assert [bytes(r.payload) for r in wal.records()] == payloads[:-1]
        assert wal.cuts == 1
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.recovery["full_scan"] is None and wal.cuts == 1


def test_a_wal_made_before_checkpoints_opens_as_before(wal_dir, mode):
    payloads = _payloads(7)[:300]
    _write(wal_dir, mode, SEG, "end", payloads)
    as_made_before_checkpoints(wal_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert wal.recovery["full_scan"].startswith("no checkpoint")
        assert [bytes(r.payload) for r in wal.records()] == payloads and wal.cuts == 0
        wal.append(b"after")
    with pmemwal.open(wal_dir, mode=mode) as wal:  # it has a checkpoint now
        assert wal.recovery["full_scan"] is None
        assert [bytes(r.payload) for r in wal.records()] == payloads + [b"after"]


def test_a_new_wal_cut_short_before_its_first_checkpoint_opens(wal_dir, mode):
    """A crash between making a new WAL's first segment and writing its first checkpoint:
    the segment says CHECKPOINTED, no record was ever written, nothing is lost."""
    pmemwal.open(wal_dir, mode=mode, segment_size=SEG).close()
    os.unlink(wal_dir / "CHECKPOINT")
    with pmemwal.open(wal_dir, mode=mode) as wal:
        wal.append(b"first")
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [bytes(r.payload) for r in wal.records()] == [b"first"]


def _ending_at_a_segment_boundary(wal_dir, mode: str) -> tuple[bytes, int, int]:
    """A closed WAL whose last record ends at the first byte of segment 1, not in place yet:
    (its id, that end, the last record's LSN)."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=0) as wal:
        target = first_lsn_of_segment(1, SEG)
        while True:  # the bytes of the record stream left in segment 0
            insert = wal.insert_lsn
            page_off = insert % PAGE
            pages_after = (SEG - (insert - page_off) - PAGE) // PAGE
            left = (PAGE - page_off) + pages_after * (PAGE - PAGE_HDR)
            if left < 60_000:
                break
            wal.append(bytes(20_000))
        last = wal.append(bytes(left - REC_HDR), flush=True)
        assert wal.position() == (target, last)
    for name in os.listdir(wal_dir):    # (any made ahead: segment 1 is not in place yet)
        if name.endswith(".wal") and name != seg_file(wal_dir, 0).name:
            os.unlink(wal_dir / name)
    return wal.wal_id, target, last


@pytest.mark.parametrize("left", ["segment 0 left", "every segment removed"])
def test_a_truncation_cut_short_at_a_segment_boundary_keeps_its_cut(wal_dir, mode, left):
    """The flushed LSN at the first byte of segment 1, not made yet: a truncation there writes
    the checkpoint naming segment 1 oldest, and a crash comes before segment 1 exists (after
    segment 0's removal or before it).  Nothing was lost: the open makes segment 1, the WAL
    goes on at the same LSN with no record, and the oldest segment never goes back down (the
    truncated records would rejoin the WAL)."""
    wal_id, end, last = _ending_at_a_segment_boundary(wal_dir, mode)
    cpf = CheckpointFile(str(wal_dir), wal_id, SEG)
    cpf.write(end, last, 1)     # the truncation's checkpoint, then the crash
    if left == "every segment removed":
        os.unlink(seg_file(wal_dir, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert wal.position() == (end, last), "the LSNs go on where they were"
        assert [r.lsn for r in wal.records()] == []
        assert cpf.read().oldest_segno == 1
        assert not seg_file(wal_dir, 0).exists() and seg_file(wal_dir, 1).exists()
        after = wal.append(b"after")
    assert after == end
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(r.lsn, bytes(r.payload)) for r in wal.records()] == [(end, b"after")]
        assert wal.recovery["full_scan"] is None and cpf.read().oldest_segno == 1


def test_one_recovery_counts_one_cut(wal_dir, mode):
    """Both slots invalid (a scan without a checkpoint may cut) and a middle segment deleted
    (a cut of durable records) in one open told to truncate: cuts counts recoveries that cut,
    one more, not two."""
    _fill(wal_dir, mode, 3, recycle_segments=0)
    with open(wal_dir / "CHECKPOINT", "r+b") as f:
        for slot in (0, SLOT_STRIDE):   # a CRC that fails, the fields as written
            f.seek(slot + 508)
            f.write(b"\0\0\0\0")
    os.unlink(seg_file(wal_dir, 1))
    with (pytest.warns(RecoveryWarning, match="no valid checkpoint"),
          pytest.warns(RecoveryWarning, match=r"\(segment missing\).*set aside")):
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    with wal:
        assert wal.cuts == 1
        assert wal.insert_lsn < SEG


_KILLED_AT = {  # where an open that cuts durable records past the checkpoint is killed
    "before its checkpoint": ("pmemwal.checkpoint", "CheckpointFile", "write"),
    "before the zeroing": ("pmemwal.recovery", "Recovery", "_wipe_beyond"),
    "before the entry is finished": ("pmemwal.lostfound", None, "finish"),
    "before the open's checkpoint": ("pmemwal.wal.opening", "Opening", "_start_core"),
}


@pytest.mark.parametrize("step", list(_KILLED_AT))
def test_a_cut_past_the_checkpoint_is_counted_once_whatever_step_a_kill_stops(wal_dir, mode,
                                                                              step):
    """Damage to flushed records past the checkpoint, cut with truncate by an open killed
    (SIGKILL) at each step of the cut: the next open told to truncate ends the WAL where the
    whole open does, with the cut counted once (a cut forgotten would let a layer's index
    from before it be used) and one finished lost+found entry."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        lsns = [wal.append(bytes([i]) * 3000, flush=True) for i in range(40)]
        copies = [wal_dir.parent / name for name in ("whole", "killed")]
        for copy in copies:   # (the checkpoint the open wrote, with nothing in it)
            shutil.copytree(wal_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
    for copy in copies:
        _garble(copy, lsns[10], SEG)
    with pytest.warns(RecoveryWarning):
        wal = pmemwal.open(copies[0], mode=mode, on_corruption="truncate")
    with wal:
        assert wal.cuts == 1
        whole = [(r.lsn, bytes(r.payload)) for r in wal.records()]
    module, owner, name = _KILLED_AT[step]
    code = f"""
import importlib, os, signal, warnings
import pmemwal
warnings.simplefilter("ignore")
module = importlib.import_module({module!r})
owner = getattr(module, {owner!r}) if {owner!r} else module
setattr(owner, {name!r}, lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL))
pmemwal.open({str(copies[1])!r}, mode={mode!r}, on_corruption="truncate", background=False)
"""
    assert subprocess.run([sys.executable, "-c", code], env=child_env()).returncode == -9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        wal = pmemwal.open(copies[1], mode=mode, on_corruption="truncate")
    with wal:
        assert [(r.lsn, bytes(r.payload)) for r in wal.records()] == whole
        assert wal.cuts == 1
    entries = lostfound.entries(str(copies[1]))
    assert len(entries) == 1 and not entries[0].pending
    with pmemwal.open(copies[1], mode=mode) as wal:
        assert wal.cuts == 1


def test_missing_segments_with_a_gap_are_named_each(wal_dir, mode):
    """Segments 1 and 3 deleted, 2 still there: the error names each, not a range that
    reads as if 2 were missing too."""
    _fill(wal_dir, mode, 4, recycle_segments=0)
    for segno in (1, 3):
        os.unlink(seg_file(wal_dir, segno))
    with pytest.raises(pmemwal.CorruptionError,
                       match="segments 0000000000000001, 0000000000000003 are missing"):
        pmemwal.open(wal_dir, mode=mode)


@pytest.mark.parametrize("since", ["nothing since", "segments made and truncated since"])
def test_a_deleted_checkpoint_never_brings_cuts_back_to_a_count_seen_before(wal_dir, mode,
                                                                           since):
    """A WAL whose count of cuts is 1 (a layer's index stored then says 1) loses its
    CHECKPOINT: the open told to truncate reads every record and counts a cut, to 2.  Back at
    1, the index made before would be used though this scan may have cut what it describes
    (the segment headers keep the count: it survives the checkpoint file)."""
    lsns = _fill(wal_dir, mode, 1)
    _garble(wal_dir, lsns[-10], SEG)
    with pytest.warns(RecoveryWarning):
        pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate").close()
    with pmemwal.open(wal_dir, mode=mode, recycle_segments=1) as wal:
        assert wal.cuts == 1
        if since != "nothing since":
            while wal.insert_lsn < 4 * SEG:
                wal.append(bytes(10_000))
            wal.checkpoint()
            assert wal.truncate(wal.insert_lsn) >= 3
    os.unlink(wal_dir / "CHECKPOINT")
    with pytest.warns(RecoveryWarning, match="CHECKPOINT is missing"):
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    with wal:
        assert wal.cuts == 2
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.cuts == 2


def test_a_segment_header_keeps_the_count_of_cuts_beside_its_flags():
    header = SegmentHeader(3, SEG, bytes(range(16)), CHECKPOINTED | SPARE, 2, cuts=7)
    assert SegmentHeader.unpack(header.pack(), "header") == header
    big = SegmentHeader(3, SEG, bytes(range(16)), cuts=1 << 20)  # more than the field holds
    assert SegmentHeader.unpack(big.pack(), "header") == SegmentHeader(3, SEG, bytes(range(16)),
                                                                       cuts=0xFFFF)


def test_a_crash_while_an_open_keeps_its_count_of_cuts_never_brings_it_back(wal_dir, mode):
    """CHECKPOINT deleted, so the count of cuts lives in the segment headers alone: the open
    that counts a cut gives a header the new count before its checkpoint names it.  Killed
    right after its first rename there, the next open must still count past the count an
    index may have been stored with (no header it needed renamed away and tidied)."""
    lsns = _fill(wal_dir, mode, 1)
    _garble(wal_dir, lsns[-10], SEG)
    with pytest.warns(RecoveryWarning):
        pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate").close()
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.cuts == 1
    os.unlink(wal_dir / "CHECKPOINT")
    code = f"""
import os, signal, warnings
import pmemwal
from pmemwal.wal.opening import Opening
warnings.simplefilter("ignore")
keep = Opening._keep_cuts
def killed_at_the_first_rename(self, *args, **kwargs):
    rename = os.rename
    def rename_then_die(*a, **k):
        rename(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    os.rename = rename_then_die
    keep(self, *args, **kwargs)
Opening._keep_cuts = killed_at_the_first_rename
pmemwal.open({str(wal_dir)!r}, mode={mode!r}, on_corruption="truncate", background=False)
"""
    assert subprocess.run([sys.executable, "-c", code], env=child_env()).returncode == -9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    with wal:
        assert wal.cuts >= 2, "a count of cuts seen before came back"
