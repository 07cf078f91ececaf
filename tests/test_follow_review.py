"""Review of following a live WAL: cases the first tests of the read-only open and of
followers left out (each failed on the code it reviewed)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

import pmemwal
from pmemwal.follow_file import FOLLOW_NAME

SEG = 1 << 20


@pytest.fixture
def wal_path(shm_tmp):
    return str(shm_tmp / "wal")


def _payload(i: int) -> bytes:
    return i.to_bytes(8, "little") + b"p" * (i % 50)


def _numbers(records) -> list[int]:
    return [int.from_bytes(bytes(r.payload[:8]), "little") for r in records]


def _without_follow_file(path: str) -> None:
    """A WAL as a writer of an earlier version left it: no FOLLOW file."""
    with pmemwal.open(path, mode="direct", segment_size=SEG) as wal:
        wal.append(_payload(0), flush=True)
    os.unlink(os.path.join(path, FOLLOW_NAME))


def test_a_follower_that_made_the_follow_file_never_reads_past_the_durable_lsn(wal_path):
    """The follower's read-only WAL looked for FOLLOW before the follower made it: it must
    still see the writer that opens later, and read only what that writer made durable."""
    _without_follow_file(wal_path)
    with pmemwal.follow(wal_path, timeout=0.2) as follower:
        with pmemwal.open(wal_path, mode="direct", background=False, segment_size=SEG) as wal:
            wal.append(_payload(1), flush=True)
            wal.append(_payload(2))  # placed in the mapping, not persisted
            numbers = _numbers(follower)
            assert numbers == [0, 1], f"yielded {numbers}; durable up to {wal.flushed_lsn}"


def test_a_readonly_wal_opened_before_the_follow_file_reads_only_what_is_durable(wal_path):
    _without_follow_file(wal_path)
    with pmemwal.open(wal_path, readonly=True) as reader:
        with pmemwal.open(wal_path, mode="direct", background=False, segment_size=SEG) as wal:
            wal.append(_payload(1), flush=True)
            wal.append(_payload(2))  # not persisted
            assert reader.flushed_lsn <= wal.flushed_lsn
            assert _numbers(reader.records()) == [0, 1]


def test_a_follower_resumes_after_the_last_record_it_yielded(wal_path):
    """Leaving a for loop over the follower and iterating again goes on with the next
    record, as ``position`` says (not after the rest of the batch read ahead)."""
    with pmemwal.open(wal_path, segment_size=SEG) as wal:
        for i in range(10):
            wal.append(_payload(i), flush=True)
    with pmemwal.follow(wal_path, timeout=0.1) as follower:
        seen = []
        for record in follower:
            seen.append(record)
            if len(seen) == 3:
                break
        rest = _numbers(follower)
    assert _numbers(seen) + rest == list(range(10))


def test_a_follower_is_an_iterator(wal_path):
    """follow() gives "an iterator of Records": next() works on it."""
    with pmemwal.open(wal_path, segment_size=SEG) as wal:
        for i in range(3):
            wal.append(_payload(i), flush=True)
    with pmemwal.follow(wal_path, timeout=0.1) as follower:
        assert _numbers([next(follower), next(follower)]) == [0, 1]  # type: ignore[call-overload]


def _append_later(path: str) -> None:
    time.sleep(0.5)
    with pmemwal.open(path, segment_size=SEG) as wal:
        wal.append(_payload(7), flush=True)


def test_a_follower_with_an_infinite_timeout_waits(wal_path):
    """timeout=float("inf") passes the check (>= 0) and means never: the follower waits for
    the record the other process appends, rather than ending at once."""
    pmemwal.open(wal_path, segment_size=SEG).close()
    writer = mp.get_context("spawn").Process(target=_append_later, args=(wal_path,))
    writer.start()
    try:
        with pmemwal.follow(wal_path, timeout=float("inf")) as follower:
            assert _numbers([next(iter(follower), None) or _none()]) == [7]
    finally:
        writer.join()


def _none():
    raise AssertionError("the follower ended at once (timeout=inf)")


def test_a_truncation_that_keeps_a_named_followers_records_does_not_lose_it(wal_path):
    """A named follower far behind is marked lost only by a truncation that takes what it
    has not confirmed: one that cuts below its position leaves its records, and its
    standing (PostgreSQL invalidates a slot only when the WAL it needs goes)."""
    with pmemwal.open(wal_path, segment_size=SEG, background=False,
                      max_follower_lag_bytes=2 * SEG) as wal:
        lsns = [wal.append(b"a" * 1000, flush=True) for _ in range(3000)]  # ~3 segments
        mine = next(lsn for lsn in lsns if lsn // SEG == 2)
        with pmemwal.follow(wal_path, start=mine, name="slow", timeout=0) as follower:
            follower.confirm()  # position: segment 2
        for _ in range(5000):  # ~5 segments more: over 2 segments behind
            wal.append(b"a" * 1000, flush=True)
        cut = next(lsn for lsn in lsns if lsn // SEG == 1)
        assert wal.truncate(cut) == 1  # segment 0: below the follower's
        [info] = pmemwal.followers(wal_path)
        assert info["state"] == "active", info
        with pmemwal.follow(wal_path, name="slow", timeout=0) as follower:
            assert next(iter(follower)).lsn == mine


def test_a_readonly_wal_sees_what_a_writer_that_came_and_truncated_left(wal_path):
    """A reader open across a writer's whole session (open, many segments, truncate, close)
    reads what the WAL holds after it, as a new reader does."""
    with pmemwal.open(wal_path, segment_size=SEG) as wal:
        wal.append(_payload(0), flush=True)
    with pmemwal.open(wal_path, readonly=True) as reader:
        assert _numbers(reader.records()) == [0]
        with pmemwal.open(wal_path, segment_size=SEG, background=False) as wal:
            last = 0
            for i in range(1, 4000):
                last = wal.append(_payload(i) + b"x" * 1000, flush=True)
            assert wal.truncate(last) > 0
        with pmemwal.open(wal_path, readonly=True) as fresh:
            expected = _numbers(fresh.records())
        assert expected and expected[-1] == 3999
        assert _numbers(reader.records()) == expected


def _words(path: str) -> tuple[int, int]:
    """(seq, sleepers) of the FOLLOW file: the futex word and the sleepers' bits."""
    import struct
    with open(os.path.join(path, FOLLOW_NAME), "rb") as f:
        f.seek(128)
        return struct.unpack("<I4xQ", f.read(16))


def test_a_follower_killed_asleep_does_not_make_every_flush_wake(wal_path, shm_tmp):
    """A follower killed while asleep on the futex (SIGKILL, or a process that exits with a
    daemon thread following) leaves no sleeper behind: a writer with no follower then
    flushes without a wake-up (a system call) per flush."""
    import signal
    import subprocess
    import sys
    pmemwal.open(wal_path, segment_size=SEG).close()
    code = "import pmemwal, sys\nlist(pmemwal.follow(sys.argv[1]))\n"
    child = subprocess.Popen([sys.executable, "-c", code, wal_path])
    try:
        for _ in range(500):
            if _words(wal_path)[1]:
                break
            time.sleep(0.01)
        assert _words(wal_path)[1] == 1  # asleep
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with pmemwal.open(wal_path, segment_size=SEG, background=False) as wal:
        seq = _words(wal_path)[0]
        for i in range(100):
            wal.append(_payload(i), flush=True)
        assert _words(wal_path) == (seq, 0)  # nobody sleeps: no wake


def test_closing_a_follower_ends_an_iteration_blocked_in_another_thread(wal_path):
    """close() from another thread (a consumer's shutdown) ends an iteration that waits with
    no timeout, rather than leaving its thread asleep for good."""
    import threading
    pmemwal.open(wal_path, segment_size=SEG).close()
    follower = pmemwal.follow(wal_path)
    ended = threading.Event()

    def consume() -> None:
        try:
            for _ in follower:
                pass
        except Exception:
            pass
        ended.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    time.sleep(0.3)  # (asleep on the futex by now)
    follower.close()
    assert ended.wait(10.0), "the iteration still waits after close()"


def test_readonly_read_many_reads_nothing_past_the_durable_lsn(wal_path):
    """read_many, as record(), refuses a record a live writer placed but did not persist."""
    with pmemwal.open(wal_path, mode="direct", background=False, segment_size=SEG) as wal:
        durable = wal.append(_payload(0), flush=True)
        placed = wal.append(_payload(1))  # in the mapping, not persisted
        with pmemwal.open(wal_path, readonly=True) as reader:
            with pytest.raises(ValueError):
                reader.record(placed)
            assert _numbers(reader.read_many([durable])) == [0]
            with pytest.raises(ValueError):
                reader.read_many([placed])
