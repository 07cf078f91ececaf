"""The Log's durable index (pmemwal/log_index.py): open reads it and replays only the tail,
and every sequence of appends, rewinds, compactions and resets reads back the same after a
clean close, after a SIGKILL, and with the index ignored (a full replay)."""

from __future__ import annotations

import os
import random
import warnings
import shutil
import signal
import subprocess
import sys
import threading

import pytest

import pmemwal
from pmemwal import log_replay
from pmemwal.log_index import INDEX_DIR
from pmemwal.recovery import RecoveryWarning

from conftest import child_env


def _entries(log) -> list[tuple[int, int, bytes]]:
    return [(e.index, e.term, bytes(e.payload)) for e in log.entries()]


def test_a_clean_reopen_replays_nothing(wal_dir, mode):
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=1 << 20) as log:
        log.append_many([b"e%d" % i for i in range(5000)], term=2)
        before = _entries(log)
        end = log.wal.insert_lsn
    with pmemwal.open_log(wal_dir, mode=mode) as log:
        assert log.replayed_from == end
        assert _entries(log) == before and log.term_at(5000) == 2 and log.last_index == 5000
        assert bytes(log[1].payload) == b"e0" and bytes(log[5000].payload) == b"e4999"


def _model_apply(model: dict, op: tuple) -> None:
    kind = op[0]
    entries = model["entries"]
    if kind == "append":
        _, term, payloads = op
        start = model["first"] + len(entries)
        entries.extend((start + i, term, p) for i, p in enumerate(payloads))
    elif kind == "truncate_after":
        keep = op[1] - model["first"] + 1
        del entries[keep:]
    elif kind == "compact":
        drop = op[1] - model["first"]
        del entries[:drop]
        model["first"] = op[1]
    elif kind == "reset":
        entries.clear()
        model["first"] = op[1] + 1


def _random_ops(rng: random.Random, model: dict, n: int) -> list[tuple]:
    """Operations valid on the model as it evolves (applied to it as they are made)."""
    ops, term = [], model.get("term", 1)
    for _ in range(n):
        roll = rng.random()
        last = model["first"] + len(model["entries"]) - 1
        if roll < 0.55 or not model["entries"]:
            term += rng.random() < 0.1
            op = ("append", term, [rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 40))])
        elif roll < 0.7:
            op = ("truncate_after", rng.randint(model["first"] - 1, last))
        elif roll < 0.85:
            op = ("compact", rng.randint(model["first"], last + 1))
        elif roll < 0.9:
            op = ("reset", rng.randint(max(0, model["first"] - 50), last + 50))
            term = max(term, 1)
        else:
            op = ("checkpoint",)
        if op[0] != "checkpoint":
            _model_apply(model, op)
        ops.append(op)
    model["term"] = term
    return ops


def _run(log, ops) -> None:
    for op in ops:
        if op[0] == "append":
            log.append_many(op[2], term=op[1])
        elif op[0] == "truncate_after":
            log.truncate_after(op[1])
        elif op[0] == "compact":
            log.compact(op[1])
        elif op[0] == "reset":
            log.reset(op[1], log.last_term)
        else:
            log.checkpoint()


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_read_back_the_same_through_the_index(wal_dir, mode, seed):
    rng = random.Random(seed)
    model = {"first": 1, "entries": []}
    for round_ in range(6):
        ops = _random_ops(rng, model, 40)
        with pmemwal.open_log(wal_dir, mode=mode, segment_size=1 << 20,
                              checkpoint_interval=0.01) as log:
            _run(log, ops)
            log.sync()
            expected = [(i, t, p) for i, t, p in model["entries"]]
            assert _entries(log) == expected
        with pmemwal.open_log(wal_dir, mode=mode) as log:  # through the index
            assert log.first_index == model["first"] and _entries(log) == expected
        copy = wal_dir.parent / f"noindex{round_}"
        shutil.copytree(wal_dir, copy)
        shutil.rmtree(copy / INDEX_DIR)
        with pmemwal.open_log(copy, mode=mode) as log:  # a full replay agrees
            assert log.replayed_from is None
            assert log.first_index == model["first"] and _entries(log) == expected


_CHILD = """
import json, random, sys
sys.path.insert(0, {tests!r})
import pmemwal
from test_log_index import _random_ops, _run
rng = random.Random({seed})
with open(sys.argv[1]) as f:   # (a file: the model outgrows one argument's 128 KiB limit)
    model = json.load(f)
model["entries"] = [tuple(e[:2]) + (bytes.fromhex(e[2]),) for e in model["entries"]]
log = pmemwal.open_log({path!r}, mode={mode!r}, segment_size=1 << 20, checkpoint_interval=0.005,
                       flush_interval=0.005)
while True:
    ops = _random_ops(rng, model, 20)
    _run(log, ops)
    log.sync()
    print(json.dumps({{"first": model["first"], "term": model["term"],
                      "entries": [[i, t, p.hex()] for i, t, p in model["entries"]]}}), flush=True)
"""


@pytest.mark.parametrize("seed", range(3))
def test_sigkill_at_any_point_of_index_checkpoints(wal_dir, mode, seed):
    """A writer killed with SIGKILL mid-run, while the background writer stores the index
    every few ms: opening through the index reads exactly what a full replay of the same WAL
    reads (that a replay keeps every synced entry is test_log.py's and the log torture's)."""
    import json
    import time

    tests = os.path.dirname(os.path.abspath(__file__))
    model = {"first": 1, "entries": [], "term": 1}
    for kill in range(4):
        code = _CHILD.format(tests=tests, seed=seed * 10 + kill, path=str(wal_dir), mode=mode)
        model_file = wal_dir.parent / "model.json"
        model_file.write_text(json.dumps(
            {**model, "entries": [[i, t, p.hex()] for i, t, p in model["entries"]]}))
        proc = subprocess.Popen([sys.executable, "-c", code, str(model_file)],
                                stdout=subprocess.PIPE, env=child_env(), text=True)
        deadline = time.monotonic() + random.Random(seed * 10 + kill).uniform(0.3, 0.8)
        synced = None
        while time.monotonic() < deadline and (line := proc.stdout.readline()):
            synced = line
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        assert synced is not None, "the child never synced"
        copy = wal_dir.parent / f"full{kill}"
        shutil.copytree(wal_dir, copy)
        shutil.rmtree(copy / INDEX_DIR, ignore_errors=True)
        with pmemwal.open_log(wal_dir, mode=mode) as log, \
                pmemwal.open_log(copy, mode=mode) as full:
            got = _entries(log)
            assert got == _entries(full) and log.first_index == full.first_index
            assert log.last_term == full.last_term and log.snapshot == full.snapshot
            state = json.loads(synced)
            model = {"first": log.first_index, "term": max(state["term"], log.last_term),
                     "entries": got}
        shutil.rmtree(copy)


def test_an_index_the_wal_was_cut_below_is_not_used(wal_dir, mode):
    from test_checkpoint import _garble

    seg = 1 << 20
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=seg) as log:
        log.append_many([os.urandom(500) for _ in range(500)], term=1)
        lsn_100 = log.wal.position()[0]
        lsns = [log.wal.position()[0]]
        log.append_many([os.urandom(500) for _ in range(500)], term=1)
        lsns.append(log.wal.position()[0])
    _garble(wal_dir, lsn_100, seg)  # entry 501, before the checkpoint: cut with verify="all"
    with pytest.warns(RecoveryWarning):
        log = pmemwal.open_log(wal_dir, mode=mode, verify="all", on_corruption="truncate")
    with log:
        assert log.replayed_from is None and log.last_index == 500
        log.append(b"new", term=1)
    with pmemwal.open_log(wal_dir, mode=mode) as log:
        assert log.last_index == 501 and bytes(log[501].payload) == b"new"
        assert log.replayed_from is not None


def test_open_memory_does_not_follow_the_entries_kept(wal_dir):
    """The index of a closed log is mapped, not loaded: opening one of 400 k entries adds
    what reading its tail needs, not 16 bytes an entry and every page of the WAL (as a full
    replay does: the same open with index/ removed is the control)."""
    with pmemwal.open_log(wal_dir, segment_size=16 << 20) as log:
        for _ in range(40):
            log.append_many([b"x" * 8] * 10_000, term=1)
    code = f"""
import pmemwal
def rss_kib():  # this process's own (ru_maxrss would start at the parent's peak)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
before = rss_kib()
log = pmemwal.open_log({str(wal_dir)!r}, prefault=False, background=False)
assert len(log) == 400_000 and bytes(log[123_456].payload) == b"x" * 8
print(rss_kib() - before, log.replayed_from is not None)
"""

    def grown() -> tuple[int, bool]:
        out = subprocess.run([sys.executable, "-c", code], env=child_env(), check=True,
                             capture_output=True, text=True).stdout.split()
        return int(out[0]), out[1] == "True"

    indexed, used = grown()
    shutil.rmtree(wal_dir / INDEX_DIR)
    replayed, used_after = grown()
    assert used and not used_after
    assert indexed < 4 * 1024 < replayed, f"opening grew RSS by {indexed} KiB ({replayed} " \
        "KiB replaying every record)"


@pytest.mark.parametrize("writer", ["log", "wal"])
def test_an_index_over_records_written_anew_is_not_used(wal_dir, mode, writer):
    """The WAL cut below the index's replay point (on_corruption="truncate") and written again
    past it, records of the same sizes, the last one byte for byte the same (a state record),
    and the writer killed before it stored an index: the old index describes other records.
    Through a Log, its open set the index aside before appending; through the plain WAL, the
    checkpoint's count of cuts gives it away (the guard record alone would pass)."""
    from test_checkpoint import _garble

    seg = 1 << 20
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=seg, background=False) as log:
        log.append_many([b"a" * 500] * 5, term=1)
        cut = log.wal.position()[0]
        log.append_many([b"a" * 500] * 4, term=1)
        log.set_state(term=3, vote=1, commit=0)
        end = log.wal.position()
    _garble(wal_dir, cut, seg)  # entry 6, before the checkpoint
    rewrite = {
        "log": """
log = pmemwal.open_log(path, mode=mode, verify="all", on_corruption="truncate", background=False)
log.append_many([b"b" * 500] * 4, term=2, sync=True)
log.set_state(term=3, vote=1, commit=0)
position = log.wal.position()
""",
        "wal": """
from pmemwal.log_format import ENTRY, HEADER, MAGIC, VERSION, HardState, encode_state
wal = pmemwal.open(path, mode=mode, verify="all", on_corruption="truncate", background=False)
for index in range(6, 10):
    wal.append(HEADER.pack(MAGIC, VERSION, ENTRY, 0, index, 2) + b"b" * 500)
wal.append(encode_state(HardState(3, 1, 0)), flush=True)
position = wal.position()
"""}[writer]
    code = f"""
import os, warnings, pmemwal
warnings.simplefilter("ignore")
path, mode = {str(wal_dir)!r}, {mode!r}
{rewrite}
print(*position, flush=True)
os._exit(0)  # no index stored after the rewrite
"""
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), check=True,
                         capture_output=True, text=True).stdout.split()
    assert tuple(map(int, out)) == end, "the rewrite should lay the records where they were"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        log = pmemwal.open_log(wal_dir, mode=mode)
    with log:
        assert log.replayed_from is None
        assert log.term_at(6) == log[6].term == 2 and log.last_term == 2
        with pytest.raises(pmemwal.TermError):
            log.append(b"x", term=1)


def test_a_damaged_index_file_never_answers_with_another_entry(wal_dir, mode):
    """The chunk files hold no checksum: each entry read is checked against its record's own
    header, so an LSN damaged in them gives CorruptionError, never another entry's payload."""
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=1 << 20) as log:
        log.append_many([b"%d" % i for i in range(1, 101)], term=1)
    chunk = wal_dir / INDEX_DIR / "0000000000000000.lidx"
    with open(chunk, "r+b") as f:  # entry 50's LSN := entry 7's
        f.seek(7 * 16)
        lsn_of_7 = f.read(8)
        f.seek(50 * 16)
        f.write(lsn_of_7)
    with pmemwal.open_log(wal_dir, mode=mode) as log:
        assert bytes(log[49].payload) == b"49" and bytes(log[7].payload) == b"7"
        with pytest.raises(pmemwal.CorruptionError, match="for entry 50"):
            log[50]
        with pytest.raises(pmemwal.CorruptionError, match="for entry 50"):
            list(log.entries(45, 55))


def test_an_unusable_index_is_replaced_for_good(wal_dir, mode):
    """An index set aside stays aside, and the next one stored wins on every later open,
    whatever slot the old one was in."""
    from test_checkpoint import _garble

    seg = 1 << 20
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=seg, background=False) as log:
        for _ in range(3):  # slots stored: the last has an even seq or odd, either way
            log.append_many([b"c" * 300] * 50, term=1)
            log.checkpoint()
        cut = log.wal.position()[0]
        log.append_many([b"c" * 300] * 50, term=1)
    _garble(wal_dir, cut, seg)
    with pytest.warns(RecoveryWarning):
        log = pmemwal.open_log(wal_dir, mode=mode, verify="all", on_corruption="truncate")
    with log:
        assert log.replayed_from is None and log.last_index == 150
        log.append(b"after", term=1)
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RecoveryWarning)
            with pmemwal.open_log(wal_dir, mode=mode) as log:
                assert log.replayed_from is not None and log.last_index == 151


def test_a_missing_chunk_file_means_a_full_replay_not_a_failure(wal_dir, mode):
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=1 << 20) as log:
        log.append_many([b"%d" % i for i in range(1, 201)], term=1)
    os.unlink(wal_dir / INDEX_DIR / "0000000000000000.lidx")
    with pytest.warns(RecoveryWarning, match="missing or short"):
        log = pmemwal.open_log(wal_dir, mode=mode)
    with log:
        assert log.replayed_from is None and bytes(log[200].payload) == b"200"


def test_a_damaged_term_in_an_index_file_is_never_an_answer(wal_dir, mode):
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=1 << 20) as log:
        log.append_many([b"t"] * 100, term=5)
    with open(wal_dir / INDEX_DIR / "0000000000000000.lidx", "r+b") as f:
        for index in (50, 100):  # the terms of entries 50 and 100 := 1
            f.seek(index * 16 + 8)
            f.write((1).to_bytes(8, "little"))
    with pmemwal.open_log(wal_dir, mode=mode) as log:
        assert log.replayed_from is not None
        assert log.term_at(50) == 5 and log.last_term == 5
        with pytest.raises(pmemwal.TermError):
            log.append(b"x", term=2)


def _waiting_for_the_lock(thread) -> bool:
    """Whether ``thread`` is inside the background round's wait for the log's lock."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "_lock_for_writer":
            return True
        frame = frame.f_back
    return False


def test_a_background_index_round_hands_a_busy_log_to_a_thread_of_its_own(wal_dir):
    """A background round that finds the log's lock taken (a compaction, a checkpoint, an
    append in progress) does not hold up the WAL's writer, which also watches for deleted
    segments, makes segments ahead and flushes unsynced appends: it returns while the lock
    is still taken, and a thread of the log's own waits for the lock, then stores the index
    and lets the stored entries go from memory (skipped, with appends that never paused,
    every round was)."""
    with pmemwal.open_log(wal_dir, segment_size=1 << 20, background=False) as log:
        log.append_many([b"x"] * 1000, term=1)
        writes = log._files.last_seq
        log._lock.acquire()                 # held until the round is over: it must not wait
        try:
            round_ = threading.Thread(target=log._background_index_checkpoint, args=(0,))
            round_.start()
            round_.join(60)                 # (a bound on a hang, not a timing)
            assert not round_.is_alive(), "the WAL's writer waits for the log's lock"
            assert log._files.last_seq == writes
        finally:
            log._lock.release()
        deferred = getattr(log, "_deferred_round", None)
        assert deferred is not None, "the round was dropped"
        deferred.join()
        assert log._files.last_seq == writes + 1, "the round wrote no index"
        assert log._index.durable_next == log._index.next == 1001, \
            "the stored entries are still held in memory"


def test_background_index_rounds_keep_up_with_unsynced_appends(wal_dir):
    """Two threads appending with sync=False without a pause: every background round
    (driven here, one after another) stores the index, in the WAL writer's thread or, when
    the lock stays taken past its short wait, in the log's own thread; the entries in memory
    are then only those appended since the last one."""
    with pmemwal.open_log(wal_dir, segment_size=1 << 20, background=False) as log:
        stop = threading.Event()

        def appender() -> None:
            while not stop.is_set():
                log.append(b"e" * 16, term=1)

        threads = [threading.Thread(target=appender) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            writes = log._files.last_seq
            for _ in range(20):
                while len(log) == log._index.durable_next - 1:
                    pass                    # something new to store each round
                log._background_index_checkpoint(0)
                if log._deferred_round is not None:
                    log._deferred_round.join()  # (the lock stayed taken: it went on there)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert log._files.last_seq == writes + 20, "rounds skipped the index checkpoint"
        log._background_index_checkpoint(0)
        assert log._index.durable_next == log._index.next, "stored entries held in memory"
        assert log._index.heap.count == 0
    with pmemwal.open_log(wal_dir, segment_size=1 << 20) as log:
        assert log.replayed_from is not None


def test_close_ends_a_background_index_round_waiting_for_the_lock(wal_dir, monkeypatch):
    """close holds the log's lock while it stops the WAL's writer: a round of that writer
    waiting for the lock gives up once close has begun, whatever its wait."""
    monkeypatch.setattr(log_replay, "_WRITER_WAIT", 3600.0)
    log = pmemwal.open_log(wal_dir, segment_size=1 << 20, background=False)
    log.append_many([b"x"] * 100, term=1)
    log._lock.acquire()
    round_ = threading.Thread(target=log._background_index_checkpoint, args=(0,))
    round_.start()
    while round_.is_alive() and not _waiting_for_the_lock(round_):
        pass
    closer = threading.Thread(target=log.close)
    closer.start()
    round_.join(60)                         # (a bound on a hang, not a timing)
    assert not round_.is_alive(), "the round still waits for a log that is closing"
    assert log._files.last_seq == 0
    log._lock.release()
    closer.join()
    assert log.closed
    with pmemwal.open_log(wal_dir, segment_size=1 << 20) as log:
        assert log.replayed_from is not None and len(log) == 100


def test_close_ends_the_log_index_thread_waiting_for_the_lock(wal_dir):
    """A round handed to the log's own thread (the lock stayed taken) that still waits when
    close begins gives up; close ends that thread before it closes the index files, and the
    index close stores is the one the next open reads."""
    log = pmemwal.open_log(wal_dir, segment_size=1 << 20, background=False)
    log.append_many([b"x"] * 100, term=1)
    log._lock.acquire()
    log._background_index_checkpoint(0)     # returns: the lock is taken
    deferred = log._deferred_round
    assert deferred is not None
    while deferred.is_alive() and not _waiting_for_the_lock(deferred):
        pass
    closer = threading.Thread(target=log.close)
    closer.start()
    deferred.join(60)                       # (a bound on a hang, not a timing)
    assert not deferred.is_alive(), "the log's index thread still waits for a closing log"
    assert log._files.last_seq == 0
    log._lock.release()
    closer.join()
    assert log.closed
    with pmemwal.open_log(wal_dir, segment_size=1 << 20) as log:
        assert log.replayed_from is not None and len(log) == 100


def test_an_index_is_not_used_after_the_wal_lost_its_checkpoint(wal_dir, mode):
    """A log whose WAL was cut once stores its index at cuts 1; then CHECKPOINT is deleted,
    and the open told to truncate reads every record without one, which may cut what the
    index describes: the count goes on to 2, never back to 1, and the index is not used."""
    from test_checkpoint import _garble

    seg = 1 << 20
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=seg) as log:
        log.append_many([os.urandom(500) for _ in range(500)], term=1)
        cut = log.wal.position()[0]
        log.append_many([os.urandom(500) for _ in range(500)], term=1)
    _garble(wal_dir, cut, seg)
    with pytest.warns(RecoveryWarning):
        log = pmemwal.open_log(wal_dir, mode=mode, verify="all", on_corruption="truncate")
    with log:
        log.append_many([b"after" * 100] * 10, term=1)
    with pmemwal.open_log(wal_dir, mode=mode) as log:   # the index, stored at cuts 1, is used
        assert log.replayed_from is not None and log.wal.cuts == 1
    os.unlink(wal_dir / "CHECKPOINT")
    with (pytest.warns(RecoveryWarning, match="CHECKPOINT is missing"),
          pytest.warns(RecoveryWarning, match="index is not used")):
        log = pmemwal.open_log(wal_dir, mode=mode, on_corruption="truncate")
    with log:
        assert log.wal.cuts == 2 and log.replayed_from is None
        assert log.last_index == 510
