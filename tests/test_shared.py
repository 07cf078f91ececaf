"""Several processes writing one WAL (pmemwal.open(shared=True)): real processes, real
SIGKILLs, the control file and its locks.

Two handles opened in one process are two writers as far as the WAL can tell (each its
own control-file descriptor, liveness lock and process entry), which makes the
deterministic tests simple; the death tests kill real child processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import pmemwal
from pmemwal.tools.recovery_warnings import recovery_warnings
from conftest import next_lsn
from pmemwal import ClosedError, ConfigError, FormatError, LockedError, StalledWriterError
from pmemwal.recovery import RecoveryWarning
from pmemwal.tools.torture import shared as shared_torture

from conftest import first_lsn_of_segment, rec_size, seg_usable, usable_of

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")

SEG = 1 << 20


@pytest.fixture(autouse=True)
def children_persist_as_we_do(monkeypatch, tmp_path):
    """Child processes persist as this one does (the processes of a shared WAL must): libpmem
    decided for this process at its first look at a mapping, with the environment of then;
    the children get PMEM_IS_PMEM_FORCE to match."""
    probe = f"/dev/shm/pmemwal-shared-probe-{os.getpid()}"
    with pmemwal.open(probe, mode="direct", segment_size=SEG) as wal:
        method = wal.persist_method
    shutil.rmtree(probe, ignore_errors=True)
    monkeypatch.setenv("PMEM_IS_PMEM_FORCE", "1" if method == "pmem" else "0")


@pytest.fixture
def wal_dir(tmp_path):
    path = "/dev/shm/" + f"pmemwal-shared-{os.getpid()}-{tmp_path.name}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def open_shared(path, **kw):
    kw.setdefault("segment_size", SEG)
    return pmemwal.open(path, shared=True, **kw)


def payloads(wal, start=None):
    return [bytes(r.payload) for r in wal.records(start)]


# ---- sharing ----------------------------------------------------------------------


def test_two_writers_share_position_and_counters(wal_dir):
    a = open_shared(wal_dir)
    b = open_shared(wal_dir)
    lsns = []
    for i in range(200):
        lsns.append((a if i % 2 else b).append(b"record %d" % i, flush=True))
    assert lsns == sorted(lsns)  # one insert position
    assert a.insert_lsn == b.insert_lsn and a.flushed_lsn == b.flushed_lsn
    stats = a.stats()
    assert stats["records"] == 200 and stats["processes"] == 2
    assert payloads(b) == [b"record %d" % i for i in range(200)]
    b.close()
    assert a.stats()["processes"] == 1
    a.close()
    with pmemwal.open(wal_dir) as alone:
        assert payloads(alone) == [b"record %d" % i for i in range(200)]


def _spawned_writer(path: str, k: int, n: int) -> int:
    with pmemwal.open(path, shared=True, segment_size=SEG) as wal:
        for i in range(n):
            wal.append(b"w%d-%06d" % (k, i), flush=i % 7 == 0)
        return wal.flush()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_writers(wal_dir, method):
    """The README's example: a pool of processes, each opening the WAL itself."""
    n = 3000
    with open_shared(wal_dir) as wal:
        with multiprocessing.get_context(method).Pool(3) as pool:
            pool.starmap(_spawned_writer, [(wal_dir, k, n) for k in range(3)])
        records = payloads(wal)
        assert wal.stats()["records"] == 3 * n
    assert len(records) == 3 * n
    for k in range(3):
        assert [r for r in records if r.startswith(b"w%d-" % k)] == [b"w%d-%06d" % (k, i) for i in range(n)]


def test_truncation_by_one_writer_under_another(wal_dir):
    a = open_shared(wal_dir, recycle_segments=1)
    b = open_shared(wal_dir)
    record = bytes(20000)
    stop = threading.Event()
    b_lsns = []

    def other():
        while not stop.is_set():
            b_lsns.append(b.append(b"b" + record, flush=True))

    t = threading.Thread(target=other)
    t.start()
    try:
        for i in range(600):
            lsn = a.append(b"a" + record, flush=True)
            if i % 50 == 49:
                a.truncate(lsn - 2 * SEG)
    finally:
        stop.set()
        t.join()
    assert a.stats()["segments_recycled"] + a.stats()["segments_removed"] > 0
    b._check_removed()  # the background round's check: drops what a truncated, stops nothing
    assert b._core.error == 0
    kept = [r.lsn for r in b.records()]
    assert kept and set(l for l in b_lsns if l >= b.first_lsn) <= set(kept)
    a.close()
    b.close()


def test_a_process_with_a_stale_segment_list_never_makes_truncated_segments_again(wal_dir):
    """B opened when the WAL had segment 0 only; A then filled segments 0..4 to their last
    byte and truncated below 4.  B's next record starts segment 5, which nobody made: B
    makes it, and only it, never the truncated 1..3 its own list still led up to (a
    reopen would then find segments older than the checkpoint's oldest, and no records)."""
    opts = dict(background=False, recycle_segments=0)
    a, b = open_shared(wal_dir, **opts), open_shared(wal_dir, **opts)
    record = bytes(100_000)
    while a.insert_lsn + rec_size(len(record)) < 5 * SEG:
        a.append(record)
    left = seg_usable() * 5 - usable_of(a.insert_lsn)  # to segment 4's last byte, exactly
    a.append(bytes(left - rec_size(0)), flush=True)
    assert a.insert_lsn == first_lsn_of_segment(5)
    assert a.truncate(a.insert_lsn) == 4
    lsn = b.append(b"after", flush=True)
    assert lsn == first_lsn_of_segment(5)
    on_disk = sorted(n for n in os.listdir(wal_dir) if n.endswith(".wal"))
    assert on_disk == [f"{n:016X}.wal" for n in (4, 5)]
    a.close()
    b.close()
    with pmemwal.open(wal_dir, verify="all") as alone:
        assert [r.lsn for r in alone.records()][-1] == lsn
        assert bytes(alone.record(lsn).payload) == b"after"


# ---- a writer that dies mid-insert ---------------------------------------------------

_STALLING_CHILD = r"""
import json, sys, pmemwal
spec = json.loads(sys.argv[1])
wal = pmemwal.open(spec["path"], shared=True, segment_size=spec["seg"])
print(wal.append(b"before the death", flush=True), flush=True)
wal._core.inject_fault(spec["hook"], 0)
print("S", flush=True)
wal.append_many([b"never acknowledged %d" % i for i in range(spec["batch"])])
print("not reached", flush=True)
"""


def _stalled_child(path: str, hook: str, batch: int = 3) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen([sys.executable, "-c", _STALLING_CHILD,
                              json.dumps({"path": path, "seg": SEG, "hook": hook, "batch": batch})],
                             stdout=subprocess.PIPE, text=True)
    lsn = int(child.stdout.readline())
    assert child.stdout.readline().strip() == "S"
    return child, lsn


def test_a_flush_behind_another_process_truncation_keeps_its_writer(wal_dir):
    """Issue 27, item 3: B's flush starts from the flushed position it read; A moves it on
    and truncates the segment there (inside B's segment callback, to fix the order).  What
    a truncation removed was durable: B's msync skips it instead of stopping B's writer."""
    opts = dict(persist="msync", background=False)
    a, b = open_shared(wal_dir, **opts), open_shared(wal_dir, **opts)
    for _ in range(25):                     # about 2.5 segments, none flushed
        a.append(bytes(100_000))
    real, fired = b._ensure_segment, []

    def truncating_first(segno):
        if not fired:
            fired.append(segno)
            a.truncate(a.flush())
        return real(segno)

    b._ensure_segment = truncating_first
    b.flush()
    assert fired, "B never asked for the truncated segment: the test proved nothing"
    lsn = b.append(b"after", flush=True)
    assert bytes(a.record(lsn).payload) == b"after"
    a.close()
    b.close()


def test_a_segment_another_process_made_is_synced_in_the_directory_before_use(wal_dir):
    """Issue 27, item 5 (a suspect, found real by reading): a process attached a segment a
    peer made as soon as the file was there, without the files lock, so it could acknowledge
    records in it between the peer's rename and its directory fsync: a power cut then lost
    the entry, and those records.  It syncs the directory itself before attaching."""
    a, b = open_shared(wal_dir, background=False), open_shared(wal_dir, background=False)
    while a.insert_lsn < SEG + 8192:
        a.append(bytes(50_000), flush=True)     # A made segment 1
    events = []
    real_sync, real_arrived = b._dir.sync, b._arrived
    b._dir.sync = lambda: (events.append("dir synced"), real_sync())[1]
    b._arrived = lambda segno, *args, **kw: (events.append(f"attached {segno}"),
                                             real_arrived(segno, *args, **kw))[1]
    b.append(b"in segment 1", flush=True)
    assert "attached 1" in events, events
    assert "dir synced" in events[:events.index("attached 1")], events
    a.close()
    b.close()


_CLOSE_UNDER_A_WAITER = r"""
import json, sys, threading, time, pmemwal
from pmemwal.errors import WALError
spec = json.loads(sys.argv[1])
wal = pmemwal.open(spec["path"], shared=True, segment_size=spec["seg"])
got = []
def flush():
    try:
        got.append(wal.flush())     # waits for the stalled child's insertion
    except WALError as exc:
        got.append(type(exc).__name__)
t = threading.Thread(target=flush)
t.start()
time.sleep(0.3)
print("closing", flush=True)        # the parent kills the stalled child meanwhile
wal.close()                         # waits with t in wait_insertions; one of them reaps
t.join(30)
print(json.dumps({"alive": t.is_alive(), "got": got}), flush=True)
"""


@pytest.mark.parametrize("hook", ["stall", "stall_locked"])
def test_close_while_another_thread_waits_in_the_core(wal_dir, hook):
    """Issue 27, item 4 (a suspect): close() while another thread of the process waits in
    wait_insertions, and then reaps the dead process it waited for.  close unmapped CONTROL
    before the background writer stopped and waited only for its own slots: a SIGSEGV, or
    a liveness lock released mid-reap.  The thread must end with an answer, the process
    alive, and the WAL whole."""
    child, child_lsn = _stalled_child(wal_dir, hook)
    waiter = subprocess.Popen([sys.executable, "-c", _CLOSE_UNDER_A_WAITER,
                               json.dumps({"path": wal_dir, "seg": SEG})],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "closing"
        time.sleep(0.3)                 # close and the flush both wait for the child
        child.kill()
        child.wait()
        line = waiter.stdout.readline()
        assert waiter.wait(60) == 0, f"the waiting process died: {waiter.returncode}"
        result = json.loads(line)
        assert not result["alive"] and len(result["got"]) == 1, result
    finally:
        for proc in (child, waiter):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG) as wal:
        assert b"before the death" in [bytes(r.payload) for r in wal.records()]


@pytest.mark.parametrize("hook", ["stall", "stall_locked"])
def test_dead_writer_never_blocks_the_others(wal_dir, hook):
    """A process SIGKILLed holding an insertion (its space reserved, nothing copied), or
    inside the reservation lock: the survivor's flush waits while it lives, and goes on
    once it is dead; its range reads as nothing."""
    wal = open_shared(wal_dir)
    first = wal.append(b"first", flush=True)
    child, child_lsn = _stalled_child(wal_dir, hook)
    time.sleep(0.2)  # the child has reserved and stopped
    done = []
    survivor = threading.Thread(target=lambda: done.append(wal.append(b"after", flush=True)))
    survivor.start()
    survivor.join(0.5)
    assert not done, "a flush passed an insertion still in progress in a live process"
    child.send_signal(signal.SIGKILL)
    child.wait()
    survivor.join(10)
    assert done, "the survivor's flush stayed blocked by a dead writer"
    assert wal.flushed_lsn > done[0]
    assert payloads(wal) == [b"first", b"before the death", b"after"]
    assert [r.lsn for r in wal.records()] == [first, child_lsn, done[0]]
    assert wal.stats()["processes_reaped"] == 1
    with pytest.raises(ValueError, match="no"):
        wal.record(child_lsn + 32 if hook == "stall" else done[0] + 8)
    wal.append(b"more", flush=True)
    wal.close()
    with pmemwal.open(wal_dir) as alone:  # recovery steps over the closed range
        assert payloads(alone) == [b"first", b"before the death", b"after", b"more"]
        assert alone.append(b"appending resumes", flush=True) > done[0]


def test_dead_writer_found_by_background_writer(wal_dir):
    """Nobody flushes past the dead one's range: the background round closes it anyway."""
    wal = open_shared(wal_dir, flush_interval=0.01)
    child, _ = _stalled_child(wal_dir, "stall", batch=40)
    time.sleep(0.2)
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    # A round reaps the dead writer, then flushes; the reaping may come just after one
    # round's flush, so the flush past its range can be the next round's.
    while (wal.stats()["processes_reaped"] == 0 or wal.flushed_lsn != wal.insert_lsn) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wal.stats()["processes_reaped"] == 1
    assert wal.flushed_lsn == wal.insert_lsn  # nothing in progress any more
    assert payloads(wal) == [b"before the death"]
    wal.close()


def test_sigkill_torture_short():
    """The long torture (pmemwal torture --processes) in miniature: writers SIGKILLed at
    random, two kills in three mid-insert; survivors go on, nothing acknowledged is lost."""
    config = shared_torture.SharedTortureConfig(processes=3, threads=2, seconds=3,
                                                kill_interval=0.4, seed=7, stall_bound=10,
                                                min_kills=3)
    report = shared_torture.run(config)
    assert report.ok, report.to_dict()
    assert report.kills >= 3 and report.acknowledged > 100
    assert report.found >= report.acknowledged


def test_the_shared_torture_catches_a_truncation_nobody_announced(monkeypatch, shm_tmp):
    """Issue 28, item 4: the shared torture skipped every acknowledged record below the
    recovered first LSN, so over-truncation or a lost first segment passed; the truncation
    points the writers announce were collected and never used.  Now only what an announced
    truncation may remove may be gone; and the report carries its seed."""
    real = shared_torture._check

    def over_truncated(wal_path, writers, report):
        with recovery_warnings(), \
                pmemwal.open(wal_path, shared=True) as wal:   # (the kills' torn tails)
            wal.truncate(wal.flushed_lsn)                   # what no writer announced
        real(wal_path, writers, report)

    monkeypatch.setattr(shared_torture, "_check", over_truncated)
    config = shared_torture.SharedTortureConfig(processes=2, threads=2, seconds=1,
                                                kill_interval=0.3, stall_bound=10, min_kills=1,
                                                segment_size=SEG, path=str(shm_tmp))
    # (a run that finds something keeps its WAL: in shm_tmp, which goes with the test)
    report = shared_torture.run(config)
    assert not report.ok and report.lost, report.to_dict()
    assert report.seed and f"seed {report.seed}" in report.summary()


_FAILING_CHILD = """
import sys, time
from pmemwal.tools.torture import child, shared
real = shared.make_record
def make_record(incarnation, thread, seq, size):
    if thread == 1 and seq == 20:
        if {how!r} == "fail":
            raise RuntimeError("thread 1 fails")
        time.sleep(3600)   # stops, while thread 0 goes on acknowledging
    return real(incarnation, thread, seq, size)
shared.make_record = make_record
child.main(sys.argv)
"""


@pytest.mark.parametrize("how", ["fail", "stop"])
def test_the_shared_torture_watches_every_writer_thread(monkeypatch, tmp_path, shm_tmp, how):
    """Issue 28, item 4: a writer thread that died or stopped while its sibling kept
    acknowledging went unnoticed; now one that fails ends its process, and each survivor
    must acknowledge from every thread after each kill and at the end."""
    (tmp_path / "failing_child.py").write_text(_FAILING_CHILD.format(how=how))
    monkeypatch.setattr(shared_torture, "_CHILD", "failing_child")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    config = shared_torture.SharedTortureConfig(processes=2, threads=2, seconds=1,
                                                kill_interval=0.4, stall_bound=1, min_kills=1,
                                                segment_size=SEG, max_size=2000,
                                                env={"PYTHONPATH": path}, path=str(shm_tmp))
    report = shared_torture.run(config)
    assert not report.ok and report.blocked, report.to_dict()
    words = "exited (70)" if how == "fail" else "thread(s) 1 acknowledged nothing"
    assert any(words in line for line in report.blocked), report.blocked
    assert not report.lost and not report.garbage


# ---- bad input, locks, fork ----------------------------------------------------------


def test_processes_persist_alike(wal_dir):
    """A process that would flush caches follows the first one's msync; one asking for cache
    flushes beside it is refused (it would count as durable what msync has not synced)."""
    with open_shared(wal_dir, persist="msync") as first:
        with open_shared(wal_dir) as second:
            assert second.persist_method == "msync"
        with pytest.raises(ConfigError, match="pmem"):
            open_shared(wal_dir, persist="pmem")
        assert first.append(b"fine", flush=True)


def test_spares_an_unshared_writer_left_are_taken_into_use_at_a_shared_open(wal_dir):
    """A WAL written without sharing leaves spares, whose header says so until the writer
    takes them into use (its rewrite synced first).  Shared, a process could read another's
    rewrite from the page cache before that sync and write records into the segment while
    SPARE may still be on disk (recovery then passes them by): the first process to open
    the WAL shared takes every spare into use, under the files lock, before another can
    join.  Records written by two processes through those segments are all there."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, prepare_segments=1,
                      preallocate=6 * SEG) as wal:
        assert [n for n in range(6) if wal._dir.is_spare(n)] == [2, 3, 4, 5]
    with open_shared(wal_dir, background=False) as a:
        assert not [n for n in range(6) if a._dir.is_spare(n)]
        with open_shared(wal_dir, background=False) as b:
            lsns = []
            while a.insert_lsn < 5 * SEG + SEG // 2:
                for w in (a, b):
                    lsns.append(w.append(b"%d" % len(lsns) + bytes(3000), flush=True))
    with pmemwal.open(wal_dir) as wal:
        assert [r.lsn for r in wal.records()] == lsns


def test_buffered_mode_is_refused(wal_dir):
    with pytest.raises(ConfigError, match="direct mode"):
        pmemwal.open(wal_dir, shared=True, mode="buffered")
    assert not os.path.exists(wal_dir)


def test_other_segment_size_is_refused(wal_dir):
    with open_shared(wal_dir) as wal:
        wal.append(b"kept", flush=True)
        with pytest.raises(ConfigError, match="segment_size"):
            pmemwal.open(wal_dir, shared=True, segment_size=2 * SEG)
        assert payloads(wal) == [b"kept"]


def test_shared_and_unshared_writers_exclude_each_other(wal_dir):
    with open_shared(wal_dir):
        with pytest.raises(LockedError, match="shared=True"):
            pmemwal.open(wal_dir)
    with pmemwal.open(wal_dir):
        with pytest.raises(LockedError, match="does not share"):
            pmemwal.open(wal_dir, shared=True)
    with open_shared(wal_dir):  # both gone: either kind opens
        pass


def _replace_control(wal_dir: str, data: bytes) -> None:
    """A new CONTROL file renamed over the live one (the open handle keeps its own)."""
    tmp = os.path.join(wal_dir, "CONTROL.new")
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, os.path.join(wal_dir, "CONTROL"))


def test_control_file_of_another_wal_or_version(wal_dir, tmp_path):
    other = str(tmp_path / "other")
    with open_shared(other):
        pass
    with open(os.path.join(other, "CONTROL"), "rb") as f:
        foreign = f.read()
    with open_shared(wal_dir) as wal:
        wal.append(b"kept", flush=True)
        with open(os.path.join(wal_dir, "CONTROL"), "rb") as f:
            own = bytearray(f.read())
        _replace_control(wal_dir, foreign)
        with pytest.raises(FormatError, match="another WAL"):
            open_shared(wal_dir)
        own[8] += 1  # another layout version, CRC made to match
        own[44:48] = pmemwal._core.crc32c(bytes(own[:44])).to_bytes(4, "little")
        _replace_control(wal_dir, bytes(own))
        with pytest.raises(FormatError, match="another pmemwal version"):
            open_shared(wal_dir)
        _replace_control(wal_dir, b"\0" * 100)
        with pytest.raises(FormatError, match="not a pmemwal control file"):
            open_shared(wal_dir)
        assert wal.append(b"still writing", flush=True)
        assert payloads(wal) == [b"kept", b"still writing"]


@pytest.mark.parametrize("damage", ["missing", "garbage", "stale"])
def test_control_file_is_rebuilt_when_nobody_has_the_wal_open(wal_dir, damage):
    with open_shared(wal_dir) as wal:
        for i in range(50):
            wal.append(b"r%d" % i, flush=True)
    control = os.path.join(wal_dir, "CONTROL")
    if damage == "missing":
        os.unlink(control)
    elif damage == "garbage":
        with open(control, "r+b") as f:
            f.write(os.urandom(4096))
    else:  # left by a group that died: the insert position says 0
        with open(control, "r+b") as f:
            f.seek(pmemwal._core.CONTROL_HEADER + 64)
            f.write(bytes(64))
    with open_shared(wal_dir) as wal:
        lsn = wal.append(b"after", flush=True)
        assert payloads(wal) == [b"r%d" % i for i in range(50)] + [b"after"]
        assert lsn == wal.record(lsn).lsn


def test_fork_child_refuses_the_parents_wal(wal_dir):
    wal = open_shared(wal_dir)
    wal.append(b"parent", flush=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read_end)
            try:
                wal.append(b"child")
            except ClosedError as exc:
                if "fork" in str(exc):
                    with pmemwal.open(wal_dir, shared=True) as own:  # its own handle works
                        own.append(b"child, own handle", flush=True)
                        code = 0
        finally:
            os.write(write_end, bytes([code]))
            os._exit(code)
    os.close(write_end)
    assert os.read(read_end, 1) == b"\0"
    os.waitpid(pid, 0)
    os.close(read_end)
    # the child's exit dropped nothing of the parent's: still alive to the others
    peer = open_shared(wal_dir)
    assert peer._core.reap_dead() == 0 and peer.stats()["processes"] == 2
    wal.append(b"parent again", flush=True)
    assert payloads(peer) == [b"parent", b"child, own handle", b"parent again"]
    peer.close()
    wal.close()


# ---- close while a thread of the same process waits in a flush -----------------------

def _sleeping_in_the_core(tid: int) -> bool:
    """Whether thread ``tid`` of this process sleeps in a system call other than a futex
    wait (the GIL's): inside the core's back-off, waiting for another process."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except FileNotFoundError:
        return False
    return bool(fields) and fields[0] not in ("running", "202")


def _thread_waiting_in_the_core(target) -> tuple[threading.Thread, list]:
    """A thread running ``target`` (a call that waits in the core), started and seen
    waiting there; its result or exception lands in the returned list."""
    got: list = []

    def run():
        try:
            got.append(target())
        except BaseException as exc:  # reported to the test
            got.append(exc)

    t = threading.Thread(target=run)
    t.start()
    while not (t.native_id and _sleeping_in_the_core(t.native_id)) and t.is_alive():
        time.sleep(0.001)
    return t, got


def _wait_reserved(wal, child_lsn: int) -> None:
    """Until the stalled child (_stalled_child, hook "stall") has reserved its batch: the
    insert position has moved past the record it acknowledged at ``child_lsn``."""
    while wal.insert_lsn <= next_lsn(child_lsn, len(b"before the death")):
        time.sleep(0.001)


def test_the_core_closing_under_a_waiting_flush_acknowledges_nothing_past_a_peer(wal_dir):
    """A flush of one thread waits for a live peer's unfinished insertion while another
    thread closes the core.  Close switched the core to its private copy of the state
    under the flush: it went on waiting on the peer's slot, with reaping off (forever, once
    the peer died), and read the later slots from the copy, all free (past a second peer's
    insertion).  It must end with ClosedError, and close must not wait for the peer."""
    wal = open_shared(wal_dir, background=False)
    mine = wal.append(b"mine")
    child, child_lsn = _stalled_child(wal_dir, "stall")
    try:
        _wait_reserved(wal, child_lsn)
        after = wal.append(b"after the peer's reservation")
        t, got = _thread_waiting_in_the_core(lambda: wal.flush(after))
        assert t.is_alive() and not got, got
        wal._core.close()               # what close() does once its own flush is done
        t.join(10)
        assert not t.is_alive(), "the flush went on waiting after close"
        assert len(got) == 1 and isinstance(got[0], ClosedError), got
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ClosedError):    # its core is closed already
        wal.close()
    # nobody closed the dead child's range: recovery ends the WAL there and sets aside
    # the record after it, which no flush acknowledged
    with pytest.warns(RecoveryWarning, match="set aside"), \
            pmemwal.open(wal_dir, shared=True, segment_size=SEG) as again:
        assert payloads(again) == [b"mine", b"before the death"]
    assert mine < child_lsn < after


# ---- a writer that stalls alive ----------------------------------------------------

def _stopped_child(wal, path: str, hook: str) -> tuple[subprocess.Popen, int]:
    """A child stalled in an insertion (hook "stall": its space reserved; "stall_locked":
    inside the reservation lock), then stopped with SIGSTOP: alive, and never running."""
    child, child_lsn = _stalled_child(path, hook)
    if hook == "stall":
        _wait_reserved(wal, child_lsn)
    else:
        _wait_holding_the_lock(child.pid)
    child.send_signal(signal.SIGSTOP)
    return child, child_lsn


def _wait_holding_the_lock(pid: int) -> None:
    """Until the child (hook "stall_locked") sleeps in pause(), the reservation lock held."""
    while True:
        with open(f"/proc/{pid}/syscall") as f:
            if f.read().split()[0] == "34":     # pause
                return
        time.sleep(0.001)


def _kill(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()


def test_a_stopped_writer_holds_a_flush_up_to_the_timeout_naming_it(wal_dir):
    """A peer stopped mid-insert held every flush above it up for good, and so close().
    Each gives up after wait_timeout with StalledWriterError naming the peer's pid; an
    append(flush=True) says which LSN it appended; close still releases the WAL."""
    wal = open_shared(wal_dir, background=False, wait_timeout=0.3)
    first = wal.append(b"first", flush=True)
    child, _ = _stopped_child(wal, wal_dir, "stall")
    try:
        after = wal.append(b"after the stopped one")
        with pytest.raises(StalledWriterError) as flushed:
            wal.flush(after)
        assert flushed.value.pid == child.pid and flushed.value.lsn is None
        assert isinstance(flushed.value, TimeoutError) and f"pid {child.pid}" in str(flushed.value)
        with pytest.raises(StalledWriterError) as committed:
            wal.append(b"committed", flush=True)
        assert committed.value.pid == child.pid and committed.value.lsn > after
        assert wal.flushed_lsn <= after     # nothing passed the stopped insertion
        with pytest.raises(StalledWriterError):
            wal.close()
        assert wal.closed
        with pytest.raises(ClosedError):
            wal.append(b"closed")
    finally:
        _kill(child)
    # the records after the dead child's range were never flushed: set aside at the hole
    with pytest.warns(RecoveryWarning, match="set aside"), \
            pmemwal.open(wal_dir, shared=True, segment_size=SEG) as again:
        assert payloads(again) == [b"first", b"before the death"]
        assert again.append(b"again", flush=True) > first


@pytest.mark.parametrize("hook", ["stall", "stall_locked"])
def test_a_wait_for_a_stopped_writer_sleeps(wal_dir, hook):
    """Waiters on the reservation lock spun on sched_yield while its stopped holder kept it
    (half a core each).  A wait for a stopped writer -- for its insertion, or for the lock
    -- sleeps: a loose bound on the CPU it takes, not a measure of speed."""
    wal = open_shared(wal_dir, background=False, wait_timeout=1.0)
    child, _ = _stopped_child(wal, wal_dir, hook)
    try:
        cpu, wall = time.thread_time(), time.monotonic()
        with pytest.raises(StalledWriterError) as waited:
            wal.append(b"waits", flush=True)
        cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
        assert waited.value.pid == child.pid
        assert cpu < 0.2 * wall, f"{cpu:.3f} s of CPU in {wall:.3f} s of waiting"
    finally:
        _kill(child)
    wal.close()


_INTERRUPTED = r"""
import json, os, signal, sys, pmemwal
# SIGINT as an interactive program has it, whatever state the test runner passed down
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
signal.signal(signal.SIGINT, signal.default_int_handler)
spec = json.loads(sys.argv[1])
wal = pmemwal.open(spec["path"], shared=True, segment_size=spec["seg"], background=False,
                   wait_timeout=None)
print(json.dumps([wal.append(b"acknowledged %d" % i, flush=True) for i in range(20)]), flush=True)
sys.stdin.readline()                            # the other writer is stopped now
try:
    wal.append(b"interrupted", flush=True)     # waits for the stopped writer: no limit
    print(json.dumps("returned"), flush=True)
except KeyboardInterrupt as exc:
    print(json.dumps(getattr(exc, "lsn", None)), flush=True)
os._exit(0)                                     # (close would wait again)
"""


@pytest.mark.parametrize("hook", ["stall", "stall_locked"])
def test_sigint_reaches_a_process_waiting_for_a_stopped_writer(wal_dir, hook):
    """SIGINT landed only once the stopped peer died, after the append had succeeded, and
    its LSN was lost.  The wait runs the signal handlers: KeyboardInterrupt comes at once,
    carrying the LSN of the record appended (appended only past the reservation lock), and
    every acknowledged record is there after."""
    wal = open_shared(wal_dir, background=False)
    waiter = subprocess.Popen([sys.executable, "-c", _INTERRUPTED,
                               json.dumps({"path": wal_dir, "seg": SEG})],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        acknowledged = json.loads(waiter.stdout.readline())
        child, _ = _stopped_child(wal, wal_dir, hook)
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        for _ in range(20_000):     # (a bound: a waiter that spins never sleeps there)
            if _waiting_in_the_core(waiter.pid, hook):
                break
            time.sleep(0.001)
        else:
            pytest.fail("the waiter never slept in the core's wait")
        waiter.send_signal(signal.SIGINT)
        try:
            status = waiter.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGINT did not end the wait: {_where(waiter.pid)}")
        assert status == 0, "SIGINT did not end the wait"
        lsn = json.loads(waiter.stdout.readline())
    finally:
        for proc in (waiter, child):
            if proc is not None and proc.poll() is None:
                _kill(proc)
    if hook == "stall":
        assert isinstance(lsn, int) and lsn > max(acknowledged)
    else:
        assert lsn is None                      # interrupted before it reserved anything
    wal.close()
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG) as again:
        kept = {r.lsn: bytes(r.payload) for r in again.records()}
    assert [kept.get(l) for l in acknowledged] == [b"acknowledged %d" % i for i in range(20)]


def _where(pid: int) -> str:
    """What process ``pid``'s threads are doing, and its signal state (for a failure)."""
    told = []
    with open(f"/proc/{pid}/status") as f:
        told += [line.strip() for line in f if line.startswith(("Sig", "Shd", "Threads"))]
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            told.append(f"thread {tid}: syscall {f.read().split()[0]}")
    return "; ".join(told)


def _waiting_in_the_core(pid: int, hook: str) -> bool:
    """Whether process ``pid``'s main thread sleeps in the core's wait: a futex on the
    reservation lock ("stall_locked"), else its back-off's nanosleep."""
    with open(f"/proc/{pid}/syscall") as f:
        call = f.read().split()[0]
    return call == "202" if hook == "stall_locked" else call in ("35", "230")


_CLOSING_HANDLER = r"""
import json, os, signal, sys, pmemwal
spec = json.loads(sys.argv[1])
wal = pmemwal.open(spec["path"], shared=True, segment_size=spec["seg"], background=False,
                   wait_timeout=2.0)
got = []

def close_on_signal(signum, frame):             # the common SIGTERM pattern
    try:
        wal.close()
        got.append("closed")
    except BaseException as exc:
        got.append(type(exc).__name__)

signal.signal(signal.SIGUSR1, close_on_signal)
print("ready", flush=True)
sys.stdin.readline()                            # the other writer is stopped now
try:
    if spec["hook"] == "stall":
        wal.flush(wal.append(b"after the stopped one"))
    else:
        wal.append(b"waits for the lock")
    got.append("returned")
except BaseException as exc:
    got.append(type(exc).__name__)
print(json.dumps(got), flush=True)
os._exit(0)                                     # (the stopped writer is killed, not waited for)
"""


@pytest.mark.parametrize("hook", ["stall", "stall_locked"])
def test_a_signal_handler_that_closes_the_wal_ends_a_wait_for_a_stopped_writer(wal_dir, hook):
    """The wait ran the signal handlers while its call held what close waits for (the flush's
    call in flight, the append's slot): a handler calling close() (SIGTERM's usual one) hung
    the process for good.  The wait gives up, the call lets go, the handler runs outside the
    core: close works (or says why it gave up), and the interrupted call ends closed."""
    wal = open_shared(wal_dir, background=False)
    waiter = subprocess.Popen([sys.executable, "-c", _CLOSING_HANDLER,
                               json.dumps({"path": wal_dir, "seg": SEG, "hook": hook})],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert waiter.stdout.readline().strip() == "ready"
        child, _ = _stopped_child(wal, wal_dir, hook)
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        for _ in range(20_000):     # (a bound: a waiter that spins never sleeps there)
            if _waiting_in_the_core(waiter.pid, hook):
                break
            time.sleep(0.001)
        else:
            pytest.fail("the waiter never slept in the core's wait")
        waiter.send_signal(signal.SIGUSR1)
        try:
            waiter.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("the process hung once its handler closed the WAL")
        got = json.loads(waiter.stdout.readline())
    finally:
        for proc in (waiter, child):
            if proc is not None and proc.poll() is None:
                _kill(proc)
    # close from the handler: done, or given up on the stopped writer's insertion (which its
    # flush waits for); either way the interrupted call then finds the WAL closed
    assert got in (["closed", "ClosedError"], ["StalledWriterError", "ClosedError"]), got
    wal.close()


_OWN_THREAD_STALLED = r"""
import json, os, sys, threading, pmemwal
spec = json.loads(sys.argv[1])
wal = pmemwal.open(spec["path"], background=False, insert_slots=1, wait_timeout=0.3,
                   shared=spec["shared"])
before = wal.insert_lsn
wal._core.inject_fault("stall", 0)
threading.Thread(target=wal.append, args=(b"stalls in its slot",), daemon=True).start()
while wal.insert_lsn == before:                 # until it reserved, holding the one slot
    pass
try:
    wal.append(b"waits for the slot")
    print(json.dumps(None), flush=True)
except pmemwal.StalledWriterError as exc:
    print(json.dumps([exc.pid, str(exc)]), flush=True)
os._exit(0)                                     # (the stalled thread keeps its slot)
"""


@pytest.mark.parametrize("shared", [False, True])
def test_a_wait_for_a_thread_of_this_process_does_not_blame_a_stopped_process(wal_dir, shared):
    """A wait that timed out on this process's own insertion (another thread's) said the
    writer was "alive but not running (stopped, paused, or in a debugger)": it names this
    process, and says that another thread of it made no progress."""
    out = subprocess.run([sys.executable, "-c", _OWN_THREAD_STALLED,
                          json.dumps({"path": wal_dir, "shared": shared})],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid, message = json.loads(out.stdout)
    assert "another thread of this process" in message and f"pid {pid}" in message, message
    assert "not running" not in message and "stopped" not in message, message
