"""Concurrency: many appenders and flushers at once, SIGKILL under that load,
segment recycling under load, and the background writer.

Every payload is self-describing (tests/_concurrent_child.py: run, thread,
sequence number, length, then a pseudo-random slice fixed by those), so a
reader can say which record any payload is and check every byte of it.

- test_concurrent_stress: 6 appenders (append, append_many batches,
  append(flush=True); sizes 0..40 KB and a few 1.2 MB records spanning 1 MiB
  segments) and 2 flushers (flush() and flush(lsn) on appended LSNs, one of
  them also reading records() from a random record) for about half a second,
  in buffered and direct mode (msync here, libpmem in a child), with 1, 8 and
  256 insertion slots.  Afterwards: every record exactly once, at the LSN
  append returned, with its bytes; each thread's records in its order; the
  chain whole; every flush covered what it promised (the whole record at the
  LSN asked for, everything inserted before a flush()), returned a record
  boundary and never went backwards; the counters add up; a reopen finds the
  same end.
- test_sigkill_under_load: a child with 4 appenders and 2 flushers prints a
  line for each acknowledged record and each returned flush; it is killed
  with SIGKILL at a random moment; every acknowledged record and everything
  below every returned flushed LSN is there, intact; nothing in the WAL fails
  to verify; each thread's records are a gap-free prefix.  Two rounds (the
  second recovers the WAL and appends to it), in buffered mode, direct with
  libpmem (PMEM_IS_PMEM_FORCE=1) and direct with msync (libpmem hidden).
- test_recycling_under_load: 4 appenders with group flushes while a thread
  truncates to 2 MiB below the flushed LSN every few ms: segments are
  recycled, nothing fails, everything from the oldest segment kept on is
  intact, before and after a reopen.
- test_background_flushes_under_load: asynchronous appends from several
  threads become durable within the flush interval with the background
  writer, and stay unflushed without it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import pytest

import pmemwal
from pmemwal.growth import GrowthPace
from _concurrent_child import HDR, make_payload, parse_payload, stress
from conftest import (HIDDEN_LIBPMEM, PAGE, SEG, assert_chain, child_env, expected_end,
                      first_lsn_of_segment, read_all, rec_size, run_and_kill, seg_file, seg_usable,
                      usable_of)

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")

CONCURRENT_CHILD = str(Path(__file__).resolve().parent / "_concurrent_child.py")
STRESS_SECONDS = 0.4


# ---- checks shared by the in-process and the child runs ------------------------------

def _check_stress(recs, result: dict, run: int) -> None:
    """The WAL's records ``recs`` against what the stress workload says it did."""
    assert not result["errors"], "\n".join(result["errors"])
    appended = result["appended"]
    assert all(appended), "an appender appended nothing"
    expected = {}                                    # lsn -> (tid, seq, n)
    for tid, mine in enumerate(appended):
        lsns = [lsn for _, lsn, _ in mine]
        assert lsns == sorted(set(lsns)), f"thread {tid}: LSNs not increasing in its own order"
        assert [seq for seq, _, _ in mine] == list(range(len(mine)))
        for seq, lsn, n in mine:
            assert lsn not in expected, f"LSN {lsn} handed out twice"
            expected[lsn] = (tid, seq, n)
    assert any(n > SEG for mine in appended for _, _, n in mine), "no record spanned a segment"

    # every record exactly once, at its LSN, with its bytes; nothing else
    assert len(recs) == len(expected), f"{len(recs)} records read, {len(expected)} appended"
    last_seq = {}
    for lsn, data, _ in recs:
        assert lsn in expected, f"record at {lsn} was never appended"
        tid, seq, n = expected[lsn]
        assert data == make_payload(run, tid, seq, n), f"record at {lsn} (thread {tid}/{seq}) damaged"
        if n >= HDR:
            assert parse_payload(data) == (run, tid, seq)
        assert last_seq.get(tid, -1) < seq, f"thread {tid}: {seq} after {last_seq[tid]}"
        last_seq[tid] = seq
    assert recs[0][2] == 0
    assert_chain(recs)

    # every flush covered what it promised
    end = expected_end(recs)
    record_end = {lsn: nxt for (lsn, _, _), (nxt, _, _) in zip(recs, recs[1:] + [(end, 0, 0)])}
    boundaries = set(record_end) | {end}
    for lsn, flushed in result["own_flushes"]:
        assert flushed >= record_end[lsn], f"flush of {lsn} returned {flushed} < its end"
        assert flushed <= end
    calls = 0
    for mine in result["flushes"]:
        prev = 0
        for lsn, before, flushed in mine:
            if lsn == -1:
                assert flushed >= before, f"flush() returned {flushed} < insert_lsn {before} before"
            else:
                assert flushed >= record_end[lsn], f"flush({lsn}) returned {flushed} < its end"
            assert flushed in boundaries, f"flushed LSN {flushed} is not a record boundary"
            assert flushed >= prev, f"flushed LSN went back from {prev} to {flushed}"
            prev = flushed
            calls += 1
    assert calls >= 10, f"only {calls} flush calls"
    assert result["reads"] > 0, "no concurrent read ran"

    # the counters add up
    s = result["stats"]
    assert s["records"] == len(expected)
    assert s["bytes"] == sum(rec_size(n) for _, _, n in expected.values())
    assert s["flush_requests"] >= s["flushes"] >= 1
    assert 0 <= s["coalesced"] <= s["flush_requests"]
    # segments 1.. hold data up to the segment of the last byte (segment 0 came with the WAL);
    # a log ending exactly at a segment's end has `end` already in the next, maybe unmade, one
    last_byte_segment = (usable_of(end) - 1) // seg_usable()
    assert s["segments_created"] >= last_byte_segment
    assert s["slot_wait_ns"] >= 0 and s["insert_wait_ns"] >= 0


STRESS_CASES = [("buffered", 1), ("buffered", 8), ("buffered", 256),
                ("direct", 1), ("direct", 8), ("direct", 256),
                ("direct-pmem", 256)]


@pytest.mark.parametrize("case,insert_slots", STRESS_CASES,
                         ids=[f"{c}-slots{n}" for c, n in STRESS_CASES])
def test_concurrent_stress(shm_tmp, case, insert_slots):
    wal_dir = shm_tmp / "wal"
    run = insert_slots
    seed = f"{case}/{insert_slots}/{random.getrandbits(32)}"
    mode = case.split("-")[0]
    # (records of 8 KiB and more copy with the GIL given up, in parallel, as before 32 KiB
    # became the default: the races this test is for)
    opts = dict(mode=mode, segment_size=SEG, insert_slots=insert_slots, gil_release_size=8192)
    if case == "direct-pmem":
        # libpmem persistence needs PMEM_IS_PMEM_FORCE=1 from the start: run it in a child
        out = shm_tmp / "result.json"
        spec = {"op": "stress", "dir": str(wal_dir), "opts": opts, "seconds": STRESS_SECONDS,
                "run": run, "seed": seed, "out": str(out)}
        proc = subprocess.run([sys.executable, CONCURRENT_CHILD, json.dumps(spec)],
                              env=child_env(PMEM_IS_PMEM_FORCE="1"), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"persist_method": "pmem",
                                                                    "stuck": 0}
        result = json.loads(out.read_text())
        with pmemwal.open(wal_dir, mode=mode) as wal:
            recs = read_all(wal)
            _check_stress(recs, result, run)
            assert wal.insert_lsn == wal.flushed_lsn == expected_end(recs)
        return

    wal = pmemwal.open(wal_dir, **opts)
    result = stress(wal, STRESS_SECONDS, run, seed)
    if result["stuck"]:
        pytest.fail(f"{result['stuck']} threads stuck; errors: {result['errors']}")  # WAL leaked
    try:
        assert wal.persist_method in (("msync", "pmem") if mode == "direct" else ("fdatasync",))
        recs = read_all(wal)
        _check_stress(recs, result, run)
        assert wal.insert_lsn == wal.flushed_lsn == expected_end(recs)
    finally:
        wal.close()
    with pmemwal.open(wal_dir, mode=mode) as wal:   # recovery's own scan finds the same end
        assert wal.insert_lsn == expected_end(recs)
        assert read_all(wal, recs[-1][0]) == recs[-1:]


# ---- SIGKILL under load ---------------------------------------------------------------

CRASH_CASES = {  # (mode, environment, persist_method, insert_slots of the two rounds)
    "buffered": ("buffered", {}, "fdatasync", (1, 256)),
    "direct-pmem": ("direct", {"PMEM_IS_PMEM_FORCE": "1"}, "pmem", (256, 8)),
    "direct-nolibpmem": ("direct", {"PMEMWAL_LIBPMEM": HIDDEN_LIBPMEM}, "msync", (8, 1)),
}


def _crash_round(wal_dir, mode, env, spec, delay):
    """Run the crash writer, SIGKILL it ``delay`` s after READY; its complete lines."""
    lines, stderr = run_and_kill(CONCURRENT_CHILD, spec, env, delay)
    assert "Traceback" not in stderr and "Exception" not in stderr, stderr
    return [line for line in lines if line.endswith(b"\n")]   # a cut-off line says nothing


def _parse_crash_lines(lines):
    head = lines[0].split()
    assert head[0] == b"READY", lines[0]
    known, acked, flushed_max, flushes = {}, set(), 0, 0
    for line in lines[1:]:
        tag, *fields = line.split()
        if tag == b"F":
            lsn, flushed = map(int, fields)
            assert flushed > lsn
            flushed_max = max(flushed_max, flushed)
            flushes += 1
            continue
        run, tid, seq, lsn, n = map(int, fields)
        assert tag in (b"A", b"U"), line
        assert (run, tid, seq) not in known, f"{line!r} twice"
        known[(run, tid, seq)] = (lsn, n)
        if tag == b"A":
            acked.add((run, tid, seq))
    return head[1].decode(), int(head[2]), known, acked, flushed_max, flushes


def _verify_crash(wal_dir, mode, rounds, known, acked, flushed_max):
    """The recovered WAL against everything the children said (all rounds so far).

    ``flushed_max[run]``: the highest flushed LSN a flush returned in that run.  It
    promises the records of that run below it: a later run reuses the LSNs past the
    end recovered after a crash.
    """
    with pmemwal.open(wal_dir, mode=mode) as wal:
        recs = read_all(wal)
        end = expected_end(recs) if recs else wal.first_lsn
        assert wal.insert_lsn == wal.flushed_lsn == end
    assert_chain(recs)
    found = {}
    for lsn, data, _ in recs:
        key = parse_payload(data)
        assert key is not None, f"record at {lsn} ({len(data)} bytes) does not verify: garbage"
        assert key[0] in rounds, f"record at {lsn} from unknown run {key[0]}"
        assert key not in found, f"record {key} twice, at {found[key]} and {lsn}"
        found[key] = lsn
        if key in known:
            assert known[key] == (lsn, len(data)), f"record {key} at {lsn}, appended at {known[key]}"
    # each thread's records: a gap-free prefix, in LSN order
    per_thread = {}
    for key, lsn in found.items():
        per_thread.setdefault(key[:2], []).append((lsn, key[2]))
    for thread, got in per_thread.items():
        got.sort()
        assert [seq for _, seq in got] == list(range(len(got))), f"thread {thread}: gap or reorder"
    # every promise kept
    lost = sorted(k for k in acked if k not in found)
    assert not lost, f"{len(lost)} acknowledged records lost, first {lost[0]} at {known[lost[0]]}"
    assert end >= max(flushed_max.values()), \
        f"recovered end {end} < a returned flushed LSN {max(flushed_max.values())}"
    below = sorted(k for k, (lsn, _) in known.items() if lsn < flushed_max[k[0]] and k not in found)
    assert not below, (f"{len(below)} records below a returned flushed LSN lost (recovered end "
                       f"{end}): " + "; ".join(_around(recs, k, known[k]) for k in below[:3]))
    return recs, end


def _around(recs, key, where) -> str:
    """A lost record and the recovered records next to its LSN, for the failure message."""
    lsn, n = where
    near = [(r_lsn, len(data), parse_payload(data)) for r_lsn, data, _ in recs
            if abs(r_lsn - lsn) < 3 * 8192]
    return f"{key} at {lsn} ({n} bytes), recovered nearby: {near}"


@pytest.mark.parametrize("case", sorted(CRASH_CASES))
def test_sigkill_under_load(wal_dir, case):
    mode, env, method, slots = CRASH_CASES[case]
    rng = random.Random()
    known, acked, flushed_max, rounds = {}, set(), {}, []
    prev_recs, end = [], None
    for rnd, insert_slots in enumerate(slots, start=1):
        rounds.append(rnd)
        spec = {"op": "crash_writer", "dir": str(wal_dir), "mode": mode, "run": rnd,
                "seed": f"{case}/{rng.getrandbits(32)}", "insert_slots": insert_slots}
        delay = rng.uniform(0.3, 1.2)
        lines = _crash_round(wal_dir, mode, env, spec, delay)
        persist, start, k, a, fmax, nflush = _parse_crash_lines(lines)
        assert persist == method
        if end is not None:
            assert start == end, "the writer did not go on from the recovered end"
        assert len(a) >= 10 and nflush >= 5, \
            f"only {len(a)} acknowledged records, {nflush} flushes in {delay:.2f} s"
        assert min(lsn for lsn, _ in k.values()) == start
        known.update(k)
        acked |= a
        flushed_max[rnd] = fmax
        recs, end = _verify_crash(wal_dir, mode, rounds, known, acked, flushed_max)
        assert recs[:len(prev_recs)] == prev_recs, "recovery changed earlier records"
        prev_recs = recs


# ---- segment recycling under load -------------------------------------------------------

@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_recycling_under_load(wal_dir, mode):
    nthreads, run = 4, 7
    stop = threading.Event()
    errors: list[str] = []
    appended: list[list[tuple[int, int, int]]] = [[] for _ in range(nthreads)]
    cuts: list[int] = []

    def appender(wal, tid):
        rng = random.Random(tid)
        seq = 0
        try:
            while not stop.is_set():
                group = rng.randint(1, 8)
                sizes = [rng.choice((8000, 8168, 8192, 8300)) for _ in range(group)]
                if tid % 2:
                    lsns = [int(x) for x in wal.append_many(
                        [make_payload(run, tid, seq + j, n) for j, n in enumerate(sizes)])]
                else:
                    lsns = [wal.append(make_payload(run, tid, seq + j, n)) for j, n in enumerate(sizes)]
                appended[tid] += [(seq + j, lsn, n) for j, (lsn, n) in enumerate(zip(lsns, sizes))]
                seq += group
                assert wal.flush(lsns[-1]) > lsns[-1]
        except BaseException:  # reported below
            errors.append(f"appender {tid}: {traceback.format_exc()}")
            stop.set()

    def truncator(wal):
        try:
            while not stop.is_set():
                time.sleep(0.003)
                cut = wal.flushed_lsn - 2 * SEG
                if cut > 0:
                    cuts.append(cut)
                    wal.truncate(cut)
        except BaseException:  # reported below
            errors.append(f"truncator: {traceback.format_exc()}")
            stop.set()

    wal = pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=2, insert_slots=8)
    threads = [threading.Thread(target=appender, args=(wal, t), daemon=True) for t in range(nthreads)]
    threads.append(threading.Thread(target=truncator, args=(wal,), daemon=True))
    for t in threads:
        t.start()
    stop.wait(1.0)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    if any(t.is_alive() for t in threads):
        pytest.fail("threads stuck")  # the WAL is leaked
    try:
        assert not errors, "\n".join(errors)
        stats = wal.stats()
        assert cuts, "the truncator never ran"
        assert stats["segments_recycled"] > 0, stats
        oldest = max(cuts) // SEG            # truncate removes the segments wholly below a cut
        files = sorted(int(name[:-4], 16) for name in os.listdir(wal_dir) if name.endswith(".wal"))
        assert files[0] == oldest, \
            f"segment file {files[0]:X} below the oldest kept, {oldest:X}: made again after truncation"
        assert wal.first_lsn == first_lsn_of_segment(oldest)
        recs = read_all(wal)
        first = recs[0][0]
        assert oldest * SEG < first < (oldest + 1) * SEG
        expected = sorted((lsn, make_payload(run, tid, seq, n))
                          for tid, mine in enumerate(appended) for seq, lsn, n in mine
                          if lsn >= first)
        assert [(lsn, data) for lsn, data, _ in recs] == expected
        assert_chain(recs)
        assert stats["records"] == sum(len(m) for m in appended)
        assert wal.insert_lsn == wal.flushed_lsn == expected_end(recs)
    finally:
        wal.close()
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert read_all(wal) == recs


# ---- the background writer under load ---------------------------------------------------

@pytest.mark.parametrize("mode", ["buffered", "direct"])
@pytest.mark.parametrize("background", [True, False])
def test_background_flushes_under_load(wal_dir, mode, background):
    nthreads, run = 3, 9
    appended: list[list[tuple[int, int, int]]] = [[] for _ in range(nthreads)]
    errors: list[BaseException] = []

    def appender(wal, tid):
        rng = random.Random(tid)
        try:
            for seq in range(300):
                n = rng.choice((0, 10, 100, 5000, 9000, 20000))
                appended[tid].append((seq, wal.append(make_payload(run, tid, seq, n)), n))
                if seq % 50 == 0:
                    time.sleep(0.005)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=background,
                      flush_interval=0.02) as wal:
        start = wal.flushed_lsn
        threads = [threading.Thread(target=appender, args=(wal, t)) for t in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        time.sleep(0.2)
        stats = wal.stats()
        if background:
            assert wal.flushed_lsn == wal.insert_lsn > start
            assert stats["flushes"] >= 1
        else:
            assert wal.flushed_lsn == start < wal.insert_lsn
            assert stats["flushes"] == 0
        assert wal.flush() == wal.insert_lsn
        expected = sorted((lsn, make_payload(run, tid, seq, n))
                          for tid, mine in enumerate(appended) for seq, lsn, n in mine)
        assert [(lsn, data) for lsn, data, _ in read_all(wal)] == expected


def test_stale_segment_request_after_truncate_is_ignored(wal_dir):
    """Regression: an appender delayed before reserving asked for a segment that a
    truncation had removed meanwhile; it got ENOENT, or the segment was created
    again below the oldest one (then a reopen saw damage at the WAL's start)."""
    seg = 1 << 20
    wal = pmemwal.open(wal_dir, mode="buffered", segment_size=seg, background=False)
    entered, gate = threading.Event(), threading.Event()
    original = wal._ensure_segment

    def delayed(segno):
        if threading.current_thread().name == "late":
            entered.set()
            gate.wait()
        return original(segno)

    wal._ensure_segment = delayed  # the native core calls back through this name
    result = {}
    late = threading.Thread(target=lambda: result.update(lsn=wal.append(b"late", True)), name="late")
    late.start()
    entered.wait()
    for _ in range(600):
        wal.append(bytes(8000))
    wal.flush()
    wal.truncate(wal.flushed_lsn - 2 * seg)
    gate.set()
    late.join()
    oldest = min(int(p.name[:16], 16) for p in wal_dir.glob("*.wal"))
    assert oldest >= 2 and result["lsn"] // seg >= oldest
    wal.close()
    with pmemwal.open(wal_dir, mode="buffered") as wal:
        assert any(bytes(r.payload) == b"late" for r in wal.records())


# ---- small appends keep the GIL, and give it up to wait ---------------------------------

GIL_WAITS_CHILD = r"""
import json, sys, threading, time
import pmemwal

# One insertion slot, a ring smaller than the large records, segments made on demand: a
# large append (GIL given up) holds the slot while it writes out ring pages and asks
# Python (the GIL) for segments its reservation reached; small appends (GIL kept) wait
# for that slot and for its insertion.  A small append that waited holding the GIL
# would never get either.
wal = pmemwal.open(sys.argv[1], mode=sys.argv[2], segment_size=1 << 20, insert_slots=1,
                   buffer_size=16 * 8192, background=False, prepare_segments=0,
                   gil_release_size=4096)
done = {"small": 0, "large": 0}
stop = threading.Event()

def appender(kind, data):
    while not stop.is_set():
        wal.append(data, flush=kind == "small")
        done[kind] += 1

threads = [threading.Thread(target=appender, args=("large", bytes(600 << 10))) for _ in range(2)]
threads += [threading.Thread(target=appender, args=("small", b"s" * 64)) for _ in range(2)]
for t in threads:
    t.start()
time.sleep(1.0)
stop.set()
for t in threads:
    t.join()
n = sum(1 for _ in wal.records())
wal.close()
print(json.dumps({**done, "read": n}))
"""


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_gil_kept_by_small_appends_is_given_up_to_wait(wal_dir, mode):
    """No deadlock between small appends that keep the GIL and a large one that needs it."""
    try:
        proc = subprocess.run([sys.executable, "-c", GIL_WAITS_CHILD, str(wal_dir), mode],
                              env=child_env(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("appenders deadlocked: a small append waited while holding the GIL")
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["small"] > 0 and done["large"] > 0, done
    assert done["read"] == done["small"] + done["large"], done


# ---- the background writer is woken only for work --------------------------------------

def test_segment_switch_wakes_the_background_writer_only_for_work(wal_dir, mode):
    """A switch into a segment with the next ``ahead`` attached writes no eventfd; one whose
    look-ahead reaches a segment not attached does (then the writer has one to prepare).
    (prepare_segments=3: segments made that far ahead are attached, not left spares.)"""
    wal = pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                       prepare_segments=3)
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        for segno in (1, 2, 3):
            wal._ensure_segment(segno)
        wal._core.set_notify(fd, 2)
        record = bytes(seg_usable() // 4)
        while wal.insert_lsn // SEG < 1:                 # into segment 1: 1, 2 and 3 ready
            wal.append(record)
        with pytest.raises(BlockingIOError):
            os.eventfd_read(fd)
        while wal.insert_lsn // SEG < 2:                 # into segment 2: 4 is not there
            wal.append(record)
        assert os.eventfd_read(fd) == 1
        wal._core.set_notify(-1)
    finally:
        os.close(fd)
        wal.close()


def test_flush_ready_makes_complete_insertions_durable(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, background=False) as wal:
        for i in range(100):
            wal.append(b"x" * i)
        assert wal.flushed_lsn < wal.insert_lsn
        assert wal._core.flush_ready() == wal.insert_lsn == wal.flushed_lsn
        with pytest.raises(ValueError, match="not a record"):
            wal.flush(2**64 - 2)     # the core's "what is ready" sentinel is no LSN


# ---- serial insertion (seed 004's "before") -------------------------------------------

def test_serial_insertion_keeps_every_record_of_concurrent_appenders(wal_dir, mode):
    """insertion="serial": four threads append and flush records of mixed sizes (some
    giving the GIL up, some spanning pages) one insertion at a time; every record comes
    back whole, once, in a valid chain, none ever waited for a slot (one holds a slot at a
    time), and the option is refused with a typed error when misspelt."""
    written, errors = {}, []

    def appender(wal, t):
        try:
            for i in range(300):
                data = bytes([t]) * (64 + (i * 977) % 20000)
                written[wal.append(data, flush=i % 7 == 0)] = data
        except BaseException as exc:
            errors.append(exc)

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, insertion="serial",
                      insert_slots=4) as wal:
        threads = [threading.Thread(target=appender, args=(wal, t)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wal.flush()
        assert not errors and wal.stats()["slot_wait_ns"] == 0   # a slot is taken under the lock
    with pmemwal.open(wal_dir) as wal:
        got = read_all(wal)
    assert {lsn: data for lsn, data, _ in got} == written
    assert_chain(got)
    with pytest.raises(pmemwal.ConfigError, match="insertion='batched': valid values are "
                                                  "parallel, serial"):
        pmemwal.open(wal_dir, insertion="batched")


# ---- recycling sized by the distance between truncations -------------------------------

def test_recycling_follows_the_distance_between_truncations(wal_dir, mode):
    """A checkpointer truncating to its previous point every ~6 segments: after the first
    truncations the spare pool covers the distance and no segment is created or removed,
    though recycle_segments is 0; max_wal_size caps the pool, and then segments go."""
    record = bytes(seg_usable() // 4)

    def checkpoints(wal, count):
        redo = wal.flushed_lsn
        for _ in range(count):
            for _ in range(24):                           # six segments' worth
                wal.append(record)
            wal.truncate(redo)
            redo = wal.flush()
        return wal.stats()

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=0,
                      background=False) as wal:
        before = checkpoints(wal, 3)                      # the estimate and the pool grow
        after = checkpoints(wal, 10)
        assert after["segments_created"] == before["segments_created"]
        assert after["segments_removed"] == before["segments_removed"] == 0
        assert after["segments_recycled"] - before["segments_recycled"] >= 50

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=0,
                      background=False, max_wal_size=8 * SEG) as wal:
        before = checkpoints(wal, 3)
        after = checkpoints(wal, 5)
        assert after["segments_removed"] > before["segments_removed"]   # capped: some go
        assert len(wal._segnos) <= 8 + 7                  # the bound, plus the retained window


class _Clock:
    """A clock that moves only when the test moves it (GrowthPace's, which times the WAL's
    growth and its segment makes)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_background_pool_and_truncation_agree_on_jittery_and_late_truncations(wal_dir, mode):
    """The background writer (run here by hand after each record, as it is woken at each
    segment entered) and truncation size the spare pool alike: truncations 5-7 segments
    apart make and remove nothing once the pool is built, and a late one (20 segments)
    has segments made for it that the next truncations keep rather than remove.

    Until the first truncation the background writer makes segments ahead for the growth
    it measures (growth.py): timed by a clock of the test's, at 2 ms a record (125 MiB/s,
    14 segments ahead), so that the pool the truncations start from is the same in every
    run (by the real clock it followed the machine's pace and load)."""
    record = bytes(seg_usable() // 4)
    clock = _Clock()

    def checkpoints(wal, distances):
        redo = wal.flushed_lsn
        for segments in distances:
            for _ in range(4 * segments):
                wal.append(record)
                clock.now += 0.002
                wal._prepare_ahead()
            wal.truncate(redo)
            redo = wal.flush()
        return wal.stats()

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=0,
                      background=False) as wal:
        wal._growth = GrowthPace(clock)
        first = checkpoints(wal, [5])
        assert first["segments_created"] >= 5 + 14         # the growth's depth, made ahead
        built = checkpoints(wal, [7, 6, 5, 7, 6])
        steady = checkpoints(wal, [5, 7, 6, 5, 6, 7] * 3)
        assert steady["segments_created"] == built["segments_created"]
        assert steady["segments_removed"] == 0
        late = checkpoints(wal, [20, 6])          # the late one, and the next: its victims
        assert late["segments_created"] > steady["segments_created"]    # made for the late one
        after = checkpoints(wal, [5, 7, 6, 5, 6, 7] * 3)
        assert after["segments_created"] == late["segments_created"]
        assert after["segments_removed"] == 0                            # and kept


# ---- truncation off the appenders' path ---------------------------------------------------

def _quiet_wal(wal_dir, mode, recycle: int) -> pmemwal.WAL:
    """A WAL of 1 MiB segments with no background writer: segments move only when asked."""
    return pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=recycle,
                        background=False, prepare_segments=0)


@contextmanager
def _truncation_stuck_in(wal: pmemwal.WAL, step: str, fill: int):
    """``wal`` appended to LSN ``fill`` and a truncation to its flushed LSN running in another
    thread, stuck in its first ``wal._dir.<step>`` call (``remove`` or ``recycle``) until the
    yielded event is set; the truncation is joined afterwards."""
    while wal.insert_lsn < fill:
        wal.append(bytes(PAGE))
    entered, release, real = threading.Event(), threading.Event(), getattr(wal._dir, step)

    def stuck(*args, **kwargs):
        if not entered.is_set():
            entered.set()
            assert release.wait(30)
        return real(*args, **kwargs)

    setattr(wal._dir, step, stuck)
    truncation = threading.Thread(target=wal.truncate, args=(wal.flush(),))
    truncation.start()
    assert entered.wait(10)
    try:
        yield release
    finally:
        release.set()
        truncation.join()


def test_a_segment_deleted_amid_a_truncation_stops_the_writer_once_it_is_done(wal_dir, mode):
    """The background writer sits out the rounds a truncation's own renames and removals
    wake it for; the truncation wakes it once done, so a deletion by someone else in the
    meantime is still noticed at once (the flush interval is far too long to do it).
    The truncation is held after its last removal, so that no file event of its own
    comes after the deletion's."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=0,
                      prepare_segments=0, flush_interval=30) as wal:   # nothing else wakes it
        while wal.insert_lsn < 4 * SEG:
            wal.append(bytes(PAGE))
        removed, release, real = threading.Event(), threading.Event(), wal._dir.remove

        def remove(segno):
            real(segno)
            if segno == 3:                       # the last of 0-3
                removed.set()
                assert release.wait(30)

        wal._dir.remove = remove
        truncation = threading.Thread(target=wal.truncate, args=(wal.flush(),))
        truncation.start()
        assert removed.wait(10)
        seg_file(wal_dir, wal.insert_lsn // SEG).unlink()
        time.sleep(0.2)                          # inotify has woken the writer: a round sat out
        release.set()
        truncation.join()
        time.sleep(1)                            # no file event since: only the wake-up
        with pytest.raises(pmemwal.WriterStoppedError, match="deleted"):
            wal.append(b"after it", flush=True)


def test_waking_a_stopped_background_writer_does_nothing(wal_dir):
    """A truncation wakes the writer after releasing its lock, so close() may have
    stopped it and closed its eventfd by then: the wake must not write to that number,
    which a new descriptor may already hold."""
    wal = pmemwal.open(wal_dir, segment_size=SEG)
    background = wal._background
    wal.close()
    background.wake()
    assert background.notify_fd == -1


def test_a_reader_waits_for_a_segment_the_background_writer_is_opening(wal_dir):
    """After a reopen, buffered mode's last segment is opened and attached by the background
    writer, not by open(): a reader reaching it meanwhile (a log replaying itself) must wait
    for it, not report it missing (seen as CorruptionError "segment missing" in CI)."""
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG) as wal:
        written = [wal.append(bytes([i % 251]) * PAGE) for i in range(200)]   # into segment 1
    assert written[-1] // SEG == 1
    with pmemwal.open(wal_dir, mode="buffered", background=False) as wal:
        assert 1 not in wal._segments
        for cached in wal._read_cache.values():            # recovery's reads, long evicted
            cached.close()                                  # in a WAL of many segments
        wal._read_cache.clear()
        opening = wal._arriving[1] = threading.Event()       # as _ensure_segment marks it

        def opened():
            time.sleep(0.3)
            del wal._arriving[1]
            opening.set()

        threading.Thread(target=opened).start()
        assert [r.lsn for r in wal.records()] == written


def test_appenders_make_segments_while_a_truncation_removes_files(wal_dir, mode):
    """A truncation stuck in its file work (here: a removal that does not return) holds no
    lock an appender needs: appending on into segments that must be made goes on."""
    with _quiet_wal(wal_dir, mode, 0) as wal:
        with _truncation_stuck_in(wal, "remove", 4 * SEG):
            while wal.insert_lsn < 6 * SEG:              # into segments 4 and 5, made now
                wal.append(bytes(PAGE), flush=True)
            assert wal.stats()["segments_created"] >= 2 and wal.stats()["segments_removed"] == 0
        assert wal.stats()["segments_removed"] == 4 and wal.first_lsn // SEG == 4


def test_an_appender_reaching_a_segment_still_being_recycled_waits_for_it(wal_dir, mode):
    """The future number a truncation recycles a file into is reserved at once: an appender
    that gets there before the file is in place waits for it, and makes no file of its own."""
    with _quiet_wal(wal_dir, mode, 2) as wal:
        with _truncation_stuck_in(wal, "recycle", 3 * SEG - 2 * PAGE) as release:
            created = wal.stats()["segments_created"]
            appender = threading.Thread(target=lambda: [wal.append(bytes(PAGE)) for _ in range(8)])
            appender.start()                             # on into segment 3: being recycled
            appender.join(0.5)
            assert appender.is_alive()
            release.set()
            appender.join(10)
            assert not appender.is_alive()
        assert wal.stats()["segments_created"] == created
        assert wal.stats()["segments_recycled"] == 2 and wal.insert_lsn // SEG == 3


def test_no_segment_file_appears_before_the_one_below_it_is_in_place(wal_dir, mode):
    """While a truncation recycles a file into future number n, a request for n + 1 makes
    that file only after n is in place: a crash in between must not leave n + 1 without n,
    which reopening takes for a deleted segment."""
    with _quiet_wal(wal_dir, mode, 1) as wal:
        with _truncation_stuck_in(wal, "recycle", 3 * SEG - 2 * PAGE) as release:
            recycled_to = max(wal._arriving)
            maker = threading.Thread(target=wal._ensure_segment, args=(recycled_to + 1,))
            maker.start()
            maker.join(0.5)
            assert maker.is_alive() and not seg_file(wal_dir, recycled_to + 1).exists()
            release.set()
            maker.join(10)
        assert seg_file(wal_dir, recycled_to).exists()
        assert seg_file(wal_dir, recycled_to + 1).exists()


@pytest.mark.parametrize("persist", ["msync", "auto"])
def test_closing_a_wal_under_flushing_threads_ends_them_closed(wal_dir, persist):
    """One process's close counts no calls in flight (a shared WAL's does, to switch its state
    under none): it holds every slot and the write lock instead, and a flush that passed
    them finds the core closed under the lock.  Threads appending and flushing while the WAL
    closes and unmaps its segments end with ClosedError, never a failed msync or a crash."""
    for _ in range(3):
        wal = pmemwal.open(wal_dir, mode="direct", persist=persist, segment_size=1 << 20,
                           background=False)
        started, ended = threading.Barrier(5), []

        def loop(flushing):
            started.wait()
            try:
                while True:
                    lsn = wal.append(b"x" * 200)
                    if flushing:
                        wal.flush(lsn)
            except BaseException as exc:  # reported to the test
                ended.append(exc)

        threads = [threading.Thread(target=loop, args=(i % 2 == 0,)) for i in range(4)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.05)
        wal.close()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert len(ended) == 4 and all(isinstance(e, pmemwal.ClosedError) for e in ended), ended
        with pmemwal.open(wal_dir, mode="direct", segment_size=1 << 20) as again:
            assert all(bytes(r.payload) == b"x" * 200 for r in again.records())
