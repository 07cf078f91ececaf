"""Faults under a running writer: failed writes, syncs and msyncs, deleted and
read-only segments, a read-only file system, a clock that jumps.

Each fault gives the caller a typed error: a WriterStoppedError (a
StorageError with the original errno) once the writer cannot go on without
leaving a hole, after which every append and flush is refused the same way
and close() is quiet.  Reopening returns every acknowledged record (flush
returned), then at most more of what was written, intact and in order, never
anything past a hole.

pwrite/fdatasync/msync failures come from the core's test hook
(Core.inject_fault); the rest is real: files deleted, a directory made
read-only for an unprivileged process, a small tmpfs remounted read-only.
Direct mode with libpmem needs PMEM_IS_PMEM_FORCE=1 from the start, so those
cases run in a child (this file is its script).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import traceback

import pytest

import pmemwal
from conftest import (HIDDEN_LIBPMEM, SEG, child_env, lsn_of, mounted_tmpfs, payload, read_all,
                      rec_size, seg_file, usable_of)
from pmemwal.errors import WriterStoppedError
from pmemwal.recovery import RecoveryWarning

CASES = {  # name: (mode, environment for a child, persist_method)
    "buffered": ("buffered", {}, "fdatasync"),
    "buffered-dsync": ("buffered", {}, "open_datasync"),
    "direct-msync": ("direct", {"PMEMWAL_LIBPMEM": HIDDEN_LIBPMEM}, "msync"),
    "direct-pmem": ("direct", {"PMEM_IS_PMEM_FORCE": "1"}, "pmem"),
}
FAILED = {"write": "pwrite failed", "sync": "fdatasync failed", "msync": "msync failed"}
NOBODY = 65534


# ---- helpers ---------------------------------------------------------------------------------

def _open(path, case, **opts):
    mode, _, method = CASES[case]
    if mode == "buffered":
        opts["sync_method"] = method
    wal = pmemwal.open(path, mode=mode, segment_size=SEG, **opts)
    assert wal.persist_method == method
    return wal


def _run(case, scenario, path, **kw):
    """Run a scenario here, or in a child where this process can't get the case's persist method."""
    if case != "direct-pmem" and not os.environ.get("PMEM_IS_PMEM_FORCE"):
        return scenario(str(path), case, **kw)
    argv = [sys.executable, __file__, scenario.__name__, str(path), case, json.dumps(kw)]
    proc = subprocess.run(argv, env=child_env(**CASES[case][1]), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"


def _assert_stopped(wal, err):
    """Every append and flush is refused with the stopped error; nothing is reserved."""
    end = wal.insert_lsn
    for call in (lambda: wal.append(b"no"), lambda: wal.append(b"no", flush=True),
                 lambda: wal.append_many([b"no", b"no"]), wal.flush, lambda: wal.flush(end)):
        with pytest.raises(WriterStoppedError, match="stopped after an earlier error") as info:
            call()
        assert info.value.errno == err
    assert wal.insert_lsn == end


def _assert_reopened(path, case, acked, written, **opts):
    """Every acknowledged record, then only the next ones written, in order; appending goes on."""
    mode = CASES[case][0]
    with pmemwal.open(path, mode=mode, **opts) as wal:
        got = [(lsn, d) for lsn, d, _ in read_all(wal)]
        assert got[:len(acked)] == acked
        assert got == written[:len(got)]
        more = (wal.append(b"after reopen", flush=True), b"after reopen")
    with pmemwal.open(path, mode=mode) as wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == got + [more]


def _append_until_stopped(wal, name, size=3000):
    """Append and flush records one by one until the writer stops: (acked, written, error)."""
    acked, written = [], []
    with pytest.raises(WriterStoppedError) as info:
        for i in range(2000):
            data = payload(f"{name}/{i}", size + 37 * (i % 50))
            lsn = wal.append(data)
            written.append((lsn, data))
            wal.flush(lsn)
            acked.append((lsn, data))
    return acked, written, info.value


def _first_in(recs, segno):
    """Index of the first record with a byte in segment ``segno`` or later."""
    return next(i for i, (lsn, d) in enumerate(recs)
                if lsn_of(usable_of(lsn) + rec_size(len(d)) - 1) >= segno * SEG)


# ---- the test hook ---------------------------------------------------------------------------

def test_inject_fault_arguments(wal_dir):
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        with pytest.raises(ValueError, match="op must be"):
            wal._core.inject_fault("fsync", errno.EIO)
        with pytest.raises(ValueError, match="errno"):
            wal._core.inject_fault("sync", 0)
        wal._core.inject_fault("sync", errno.EIO, count=0)        # cleared: nothing fails
        wal._core.inject_fault(op="write", errno=errno.EIO, after=1, count=0)
        assert wal.append(b"fine", flush=True) and not wal._core.error


# ---- failed pwrite, fdatasync, msync ------------------------------------------------------------

def _io_fault(path, case, op, err, after):
    wal = _open(path, case, background=False)
    wal._core.inject_fault(op, err, after=after)
    acked, written, first = _append_until_stopped(wal, op)
    assert first.errno == err and isinstance(first, pmemwal.StorageError)
    assert str(first).startswith(f"[Errno {err}] {FAILED[op]} ({os.strerror(err)}); "
                                 "the writer stopped")
    assert (wal.insert_lsn >= SEG) == (after > 100)     # the late fault lands in segment 1
    _assert_stopped(wal, err)
    assert [(lsn, d) for lsn, d, _ in read_all(wal)] == acked   # readable here, up to the last ack
    wal.close()
    _assert_reopened(path, case, acked, written)


@pytest.mark.parametrize("after", [0, 400])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("case,op", [("buffered", "write"), ("buffered", "sync"),
                                     ("buffered-dsync", "write"), ("direct-msync", "msync")])
def test_io_fault(wal_dir, case, op, err, after):
    _run(case, _io_fault, wal_dir, op=op, err=err, after=after)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_write_fault_inside_append(wal_dir, err):
    """A small ring: an append must write pages out to reuse them, and that write fails.
    The append has reserved its space, so the writer stops rather than leave a hole."""
    wal = pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, buffer_size=16 * 8192,
                       background=False)
    acked = [(wal.append(b"acked", flush=True), b"acked")]
    written = list(acked)
    wal._core.inject_fault("write", err)
    with pytest.raises(WriterStoppedError, match="pwrite failed") as info:
        for i in range(100):
            data = payload(f"ring/{i}", 20000)
            written.append((wal.append(data), data))
    assert info.value.errno == err
    _assert_stopped(wal, err)
    wal.close()
    _assert_reopened(wal_dir, "buffered", acked, written)


def _background_fault(path, case, op):
    """The background writer's flush meets the fault: the appender hears of it next."""
    wal = _open(path, case, flush_interval=0.01)
    acked = [(wal.append(b"acked", flush=True), b"acked")]
    written = list(acked)
    wal._core.inject_fault(op, errno.EIO)
    written.append((wal.append(b"async"), b"async"))
    deadline = time.monotonic() + 10
    while not wal._core.error and time.monotonic() < deadline:
        time.sleep(0.005)
    _assert_stopped(wal, errno.EIO)
    wal.close()
    _assert_reopened(path, case, acked, written)


@pytest.mark.parametrize("case,op", [("buffered", "sync"), ("direct-msync", "msync")])
def test_fault_in_background_flush(wal_dir, case, op):
    _run(case, _background_fault, wal_dir, op=op)


@pytest.mark.parametrize("case,op", [("buffered", "sync"), ("buffered", "write"),
                                     ("direct-msync", "msync")])
def test_fault_under_concurrent_appenders(wal_dir, case, op):
    """Four threads append and flush; one flush fails; all stop, close does not hang."""
    wal = _open(wal_dir, case, insert_slots=2, buffer_size=32 * 8192)
    wal._core.inject_fault(op, errno.EIO, after=60)
    acked, written, errors = [], {}, []

    def appender(t):
        try:
            for i in range(100_000):
                data = payload(f"t{t}/{i}", 100 + 997 * (i % 23))
                lsn = wal.append(data)
                written[lsn] = data
                wal.flush(lsn)
                acked.append((lsn, data))
        except WriterStoppedError as exc:
            errors.append(exc.errno)

    threads = [threading.Thread(target=appender, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads) and errors == [errno.EIO] * 4
    _assert_stopped(wal, errno.EIO)
    wal.close()
    with pmemwal.open(wal_dir, mode=CASES[case][0]) as again:
        got = read_all(again)
    assert {lsn: d for lsn, d, _ in got}.items() >= dict(acked).items()
    assert all(written[lsn] == d for lsn, d, _ in got)


# ---- a segment file deleted under the writer ---------------------------------------------------

def _deleted_segment(path, case):
    """The background writer notices (inotify wakes it) and stops the writer; flushes
    that race it are acknowledged and lost with the file, so the test allows them.
    The interval is long: a prompt stop must come from the inotify wake-up."""
    wal = _open(path, case, flush_interval=30)
    acked = []
    while wal.insert_lsn < SEG + 5 * 8192:
        data = payload(f"del/{len(acked)}", 5000 + 11 * len(acked))
        acked.append((wal.append(data, flush=True), data))
    seg_file(path, 1).unlink()
    deadline = time.monotonic() + 5  # far below the 30 s interval: only inotify can stop it in time
    with pytest.raises(WriterStoppedError, match="deleted") as info:
        while time.monotonic() < deadline:   # acknowledged until noticed, lost with the file
            wal.append(b"after the deletion", flush=True)
    assert info.value.errno == errno.ENOENT
    _assert_stopped(wal, errno.ENOENT)
    wal.close()
    # records in segment 1 went with it; segment 2 (made ahead) shows it had been made
    with pytest.raises(pmemwal.CorruptionError, match="0000000000000001 is missing"):
        pmemwal.open(path, mode=CASES[case][0])
    k = _first_in(acked, 1)
    with pytest.warns(RecoveryWarning, match=r"\(segment missing\)"):   # the cut, said
        _assert_reopened(path, case, acked[:k], acked[:k], on_corruption="truncate")


@pytest.mark.parametrize("case", ["buffered", "buffered-dsync", "direct-msync", "direct-pmem"])
def test_segment_deleted_under_writer(wal_dir, case):
    _run(case, _deleted_segment, wal_dir)


def test_deleted_future_segment_loses_nothing(wal_dir, mode):
    """A segment made ahead that the writer has not reached: deleted, nothing is lost,
    no flush touches it, and the gap it leaves is no damage on reopen."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        acked = [(wal.append(b"x" * 100, flush=True), b"x" * 100)]
        wal._ensure_segment(1)
        wal._ensure_segment(2)
        seg_file(wal_dir, 1).unlink()
        acked.append((wal.append(b"y" * 100, flush=True), b"y" * 100))
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == acked


# ---- read-only directory, read-only file system -------------------------------------------------

def _as_nobody(fn) -> None:
    """Run fn in a forked child as an unprivileged user: for root, chmod does not bite."""
    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn()
        except BaseException:
            os.write(w, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report


def test_read_only_directory_when_a_segment_is_needed(shm_tmp, mode):
    """No new segment can be made: a plain StorageError (EACCES), nothing reserved, the
    writer does not stop, and it goes on once the directory is writable again."""
    os.chown(shm_tmp, NOBODY, NOBODY)
    wal_dir = shm_tmp / "wal"

    def scenario():
        with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
            acked = []
            os.chmod(wal_dir, 0o500)
            with pytest.raises(pmemwal.StorageError) as info:
                for i in range(1000):
                    data = payload(f"ro/{i}", 30000)
                    acked.append((wal.append(data, flush=True), data))
            assert info.value.errno == errno.EACCES and "creating" in str(info.value)
            assert not isinstance(info.value, WriterStoppedError) and not wal._core.error
            assert wal.insert_lsn == wal.flushed_lsn < SEG + 8192
            os.chmod(wal_dir, 0o700)
            acked.append((wal.append(b"goes on", flush=True), b"goes on"))
        with pmemwal.open(wal_dir, mode=mode) as wal:
            assert [(lsn, d) for lsn, d, _ in read_all(wal)] == acked

    _as_nobody(scenario)


@pytest.fixture
def small_fs(shm_tmp):
    with mounted_tmpfs(shm_tmp / "fs", "4m") as mnt:
        yield mnt


def _remount(mnt, how):
    return subprocess.run(["mount", "-o", f"remount,{how}", str(mnt)], capture_output=True,
                          text=True)


def test_read_only_file_system(small_fs, mode):
    """The kernel refuses to remount read-only under a writer (its files are open for
    writing); a WAL on a read-only file system is refused at open with EROFS."""
    wal_dir = small_fs / "wal"
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        acked = [(wal.append(b"kept", flush=True), b"kept")]
        assert _remount(small_fs, "ro").returncode != 0
        acked.append((wal.append(b"still writable", flush=True), b"still writable"))
    assert _remount(small_fs, "ro").returncode == 0
    try:
        with pytest.raises(pmemwal.StorageError) as info:
            pmemwal.open(wal_dir, mode=mode)
        assert info.value.errno == errno.EROFS
    finally:
        _remount(small_fs, "rw")
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == acked


# ---- the clock ---------------------------------------------------------------------------------

def test_clock_jumps_do_not_stall_background_flushes(wal_dir, mode, monkeypatch):
    """Nothing in the writer reads the wall clock: the background writer waits in poll()
    (a relative, monotonic timeout) and the core only times its statistics with
    CLOCK_MONOTONIC.  Python-level clocks that jump by hours, both ways, change nothing."""
    real = time.monotonic
    jumps = itertools.cycle([3600.0, -3600.0, 86400.0 * 365, -86400.0 * 365, 0.0])
    monkeypatch.setattr(time, "time", lambda: real() + next(jumps))
    monkeypatch.setattr(time, "monotonic", lambda: real() + next(jumps))
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, flush_interval=0.02) as wal:
        for i in range(10):
            lsn = wal.append(payload(f"clock/{i}", 1000))
            t0 = real()
            while wal.flushed_lsn <= lsn:
                assert real() - t0 < 2, "the background writer did not flush"
                time.sleep(0.002)
        assert wal._background.error is None and not wal._core.error


if __name__ == "__main__":  # a child: run one scenario (see _run)
    name, path, case, kw = sys.argv[1:]
    globals()[name](path, case, **json.loads(kw))


def test_a_failed_create_leaves_no_gap_for_a_higher_one(shm_dir):
    """Issue 27, item 6: an appender's create(1) fails (no space) while the background
    writer has claimed segment 2 behind it.  Segment 2 must not be made without 1: a crash
    would leave 0 and 2, which an open takes for a deleted segment."""
    path = str(shm_dir / "wal")
    wal = pmemwal.open(path, mode="buffered", segment_size=SEG, background=False)
    acked = [wal.append(b"before", flush=True)]
    real, failed = wal._dir.create, threading.Event()

    def no_space_for_one(segno, *args, **kwargs):
        if segno == 1 and not failed.is_set():
            deadline = time.monotonic() + 5
            while 2 not in wal._arriving and time.monotonic() < deadline:
                time.sleep(0.001)               # the claim of 2 waits behind this one
            failed.set()
            raise pmemwal.StorageError(errno.ENOSPC, "No space left on device")
        return real(segno, *args, **kwargs)

    wal._dir.create = no_space_for_one
    errors = []

    def claim(segno):
        try:
            wal._ensure_segment(segno)
        except pmemwal.StorageError as exc:
            errors.append((segno, exc.errno))

    first = threading.Thread(target=claim, args=(1,))
    first.start()
    while 1 not in wal._arriving and first.is_alive():
        time.sleep(0.001)
    second = threading.Thread(target=claim, args=(2,))
    second.start()
    first.join()
    second.join()
    assert failed.is_set() and sorted(errors) == [(1, errno.ENOSPC), (2, errno.ENOENT)]
    files = sorted(n for n in os.listdir(path) if n.endswith(".wal"))
    assert files == ["0000000000000000.wal"], files
    wal._ensure_segment(2)                      # space again: made in order this time
    assert sorted(n for n in os.listdir(path) if n.endswith(".wal"))[:3] == \
        [f"{n:016X}.wal" for n in range(3)]
    acked.append(wal.append(bytes(SEG), flush=True))   # into segment 1 and on
    wal.close()
    with pmemwal.open(path) as wal:
        assert [r.lsn for r in wal.records()] == acked


def test_new_directories_are_durable_in_their_parents(shm_dir, monkeypatch):
    """Issue 27, item 8: a WAL directory (and its parents), archive_status/ and a local
    archive root made by pmemwal each have their entry synced in their parent: a lost
    entry would let open(create=True) build a new WAL over nothing."""
    from pmemwal import _core, archive, segments
    synced = []
    real = segments.sync_directory
    monkeypatch.setattr(segments, "sync_directory",
                        lambda path: (synced.append(os.path.realpath(path)), real(path))[1])
    wal_dir = shm_dir / "a" / "b" / "wal"
    with pmemwal.open(str(wal_dir), segment_size=SEG) as wal:
        wal.append(b"x", flush=True)
    plain = shm_dir / "plain"
    plain.mkdir()
    archive.ArchiveStatus(str(plain))           # the archiver's, in the WAL's process
    root = shm_dir / "archive" / "x"            # the archiver process's, done here
    data = (wal_dir / "0000000000000000.wal").read_bytes()
    archive.FsspecArchive(f"file://{root}").store(str(wal_dir / "0000000000000000.wal"),
                                                  "0000000000000000.wal",
                                                  _core.crc32c(data), len(data))
    assert (root / "0000000000000000.wal").read_bytes() == data
    for made in (wal_dir, wal_dir.parent, wal_dir.parent.parent, plain / "archive_status",
                 root, root.parent):
        assert os.path.realpath(made.parent) in synced, f"{made}'s entry was not synced"


def test_a_recovering_open_syncs_the_directory_first(shm_dir, monkeypatch):
    """From a read of item 5's fix: a one-process WAL never synced the directory for a
    segment a killed writer had renamed into place without its directory fsync, and used
    it.  The open that recovers syncs the directory before anything else."""
    from pmemwal.segments import WalDirectory
    path = str(shm_dir / "wal")
    with pmemwal.open(path, segment_size=SEG):
        pass
    events = []
    real_sync = WalDirectory.sync
    monkeypatch.setattr(WalDirectory, "sync", lambda self: (events.append("sync"),
                                                            real_sync(self))[1])
    from pmemwal import recovery
    real_run = recovery.Recovery.run
    monkeypatch.setattr(recovery.Recovery, "run",
                        lambda self, *a, **k: (events.append("recovery"),
                                               real_run(self, *a, **k))[1])
    with pmemwal.open(path):
        pass
    assert events[:2] == ["sync", "recovery"], events


def test_unlinked_names_the_first_deleted_descriptor(shm_tmp):
    """The background writer's check: every descriptor looked at with one call, the first
    whose file has no name left named; a bad descriptor is an error, not a pass."""
    from pmemwal import _core
    paths = [os.path.join(shm_tmp, f"f{i}") for i in range(3)]
    fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o600) for p in paths]
    try:
        assert _core.unlinked(fds) == -1
        assert _core.unlinked([]) == -1
        os.unlink(paths[2])
        os.unlink(paths[1])
        assert _core.unlinked(fds) == fds[1]
        closed = os.open(paths[0], os.O_RDONLY)
        os.close(closed)
        with pytest.raises(OSError) as err:
            _core.unlinked([fds[0], closed])
        assert err.value.errno == errno.EBADF
        with pytest.raises(ValueError):
            _core.unlinked([-1])
    finally:
        for fd in fds:
            os.close(fd)


def test_stats_report_the_background_writers_cpu_time(shm_tmp):
    """background_cpu_ns: what the writer's thread used, growing as it works and kept after
    it stops; 0 without one."""
    data = bytes(8192)
    with pmemwal.open(os.path.join(shm_tmp, "a"), flush_interval=0.001) as wal:
        for _ in range(2000):
            wal.append(data)
        deadline = time.monotonic() + 10
        while wal.stats()["background_cpu_ns"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        used = wal.stats()["background_cpu_ns"]
        assert used > 0
        background = wal._background
    assert background is not None and background.cpu_ns() >= used  # the total, once stopped
    with pmemwal.open(os.path.join(shm_tmp, "b"), background=False) as wal:
        wal.append(data, flush=True)
        assert wal.stats()["background_cpu_ns"] == 0
