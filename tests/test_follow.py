"""Reading a WAL from outside its writer: the read-only open and followers.

Real writers in other processes (spawned), real segment files and mappings on /dev/shm.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

import pmemwal
from pmemwal.follow_file import FOLLOW_NAME

SEG = 1 << 20
MODES = ["direct", "buffered"]


@pytest.fixture
def wal_path(shm_tmp):
    return str(shm_tmp / "wal")


def _payload(i: int) -> bytes:
    return i.to_bytes(8, "little") + b"p" * (i % 50)


def _write(path: str, start: int, n: int, mode: str, shared: bool = False) -> None:
    """A writer process: records start..start+n, each flushed."""
    with pmemwal.open(path, mode=mode, segment_size=SEG, shared=shared) as wal:
        for i in range(start, start + n):
            wal.append(_payload(i), flush=True)


def _spawn(target, *args) -> mp.process.BaseProcess:
    proc = mp.get_context("spawn").Process(target=target, args=args)
    proc.start()
    return proc


def _numbers(records) -> list[int]:
    return [int.from_bytes(bytes(r.payload[:8]), "little") for r in records]


def _run_then_kill(code: str, wal_path: str) -> None:
    """A writer process running ``code`` (which prints "done", then waits), SIGKILLed."""
    child = subprocess.Popen([sys.executable, "-c", code, wal_path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"done\n"
    child.send_signal(signal.SIGKILL)
    child.wait()


# ---- the read-only open -----------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_readonly_reads_what_is_durable_beside_a_live_writer(wal_path, mode):
    with pmemwal.open(wal_path, mode=mode, background=False, segment_size=SEG) as wal:
        for i in range(10):
            wal.append(_payload(i))
        wal.flush()
        for i in range(10, 15):
            wal.append(_payload(i))  # not flushed: no reader may see these
        with pmemwal.open(wal_path, readonly=True) as reader:
            assert reader.writer_alive
            assert _numbers(reader.records()) == list(range(10))
            assert reader.flushed_lsn == wal.flushed_lsn
            wal.flush()
            assert _numbers(reader.records()) == list(range(15))
            assert reader.read_many([r.lsn for r in wal.records()]).lengths.tolist() == \
                [len(_payload(i)) for i in range(15)]


def test_readonly_takes_no_lock_and_writes_nothing(wal_path):
    _write(wal_path, 0, 100, "direct")
    before = {n: os.stat(os.path.join(wal_path, n)).st_mtime_ns for n in os.listdir(wal_path)}
    with pmemwal.open(wal_path, readonly=True) as reader:
        with pmemwal.open(wal_path) as wal:  # a writer opens beside it
            wal.append(b"more", flush=True)
            assert _numbers(reader.records())[:100] == list(range(100))
        for write in (lambda: reader.append(b"x"), reader.flush, lambda: reader.truncate(0)):
            with pytest.raises(pmemwal.ReadOnlyError):
                write()
    wal_files = sorted(os.listdir(wal_path))
    with pmemwal.open(wal_path, readonly=True) as reader:
        assert len(list(reader.records())) == 101
    assert sorted(os.listdir(wal_path)) == wal_files
    assert before.keys() <= set(wal_files)


def test_readonly_on_a_wal_whose_writer_was_killed(wal_path):
    """No writer: the reader follows the chain to its end, what the next open keeps."""
    code = ("import pmemwal, os, sys\n"
            "wal = pmemwal.open(sys.argv[1], segment_size=1 << 20, background=False)\n"
            "for i in range(3000):\n"
            "    wal.append(i.to_bytes(8, 'little') + b'k' * 100, flush=(i % 7 == 0))\n"
            "wal.flush(); print('done', flush=True); sys.stdin.read()\n")
    _run_then_kill(code, wal_path)
    with pmemwal.open(wal_path, readonly=True) as reader:
        assert not reader.writer_alive
        read = _numbers(reader.records())
    assert read == list(range(3000))
    with pmemwal.open(wal_path) as wal:
        assert _numbers(wal.records()) == read


def test_readonly_open_of_no_wal_is_not_found(shm_tmp):
    with pytest.raises(pmemwal.NotFoundError):
        pmemwal.open(str(shm_tmp / "none"), readonly=True)
    os.mkdir(shm_tmp / "empty")
    with pytest.raises(pmemwal.NotFoundError):
        pmemwal.open(str(shm_tmp / "empty"), readonly=True)


# ---- following ------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_follower_sees_every_record_of_a_writer_in_another_process(wal_path, mode):
    pmemwal.open(wal_path, mode=mode, segment_size=SEG).close()
    with pmemwal.follow(wal_path, timeout=3.0) as follower:
        writer = _spawn(_write, wal_path, 0, 20000, mode)  # crosses segments
        numbers = _numbers(follower)
        writer.join()
    assert writer.exitcode == 0
    assert numbers == list(range(20000))


def test_a_shared_wal_is_followed_across_its_writers(wal_path):
    pmemwal.open(wal_path, mode="direct", segment_size=SEG, shared=True).close()
    with pmemwal.follow(wal_path, timeout=3.0) as follower:
        writers = [_spawn(_write, wal_path, k * 100000, 1500, "direct", True) for k in range(2)]
        numbers = _numbers(follower)
        for w in writers:
            w.join()
    with pmemwal.open(wal_path, readonly=True) as reader:
        assert numbers == _numbers(reader.records())
    assert sorted(numbers) == list(range(1500)) + list(range(100000, 101500))


def test_a_follower_never_yields_what_is_not_durable(wal_path):
    with pmemwal.open(wal_path, mode="direct", background=False, segment_size=SEG) as wal:
        wal.append(_payload(0), flush=True)
        wal.append(_payload(1))  # placed in the mapping, not persisted
        with pmemwal.follow(wal_path, timeout=0.2) as follower:
            assert _numbers(follower) == [0]
            wal.flush()
            follower.timeout = 0.2
            assert _numbers(follower) == [1]


def test_a_follower_wakes_for_a_flush_after_it_slept(wal_path):
    """The follower sleeps on the futex (a pause far longer than its spin) and the other
    process's flush wakes it: a lost wake-up would wait out the whole timeout.  In a thread
    other than the main one, whose sleeps end every 50 ms to run signal handlers."""
    import threading
    pmemwal.open(wal_path, segment_size=SEG).close()
    got: list[int] = []
    with pmemwal.follow(wal_path, timeout=30.0) as follower:
        writer = _spawn(_write_with_pause, wal_path)
        reader = threading.Thread(target=lambda: got.extend(
            _numbers([next(follower), next(follower)])))
        reader.start()
        reader.join()
        writer.join()
    assert got == [0, 1]


def _write_with_pause(path: str) -> None:
    with pmemwal.open(path, segment_size=SEG) as wal:
        wal.append(_payload(0), flush=True)
        time.sleep(0.3)
        wal.append(_payload(1), flush=True)
        time.sleep(0.3)  # (the test's next() returns before this writer closes)


def test_a_follower_ends_after_its_timeout(wal_path):
    pmemwal.open(wal_path).close()
    started = time.monotonic()
    assert list(pmemwal.follow(wal_path, timeout=0.1)) == []
    assert time.monotonic() - started < 2.0


def test_a_follower_below_a_truncation_is_told(wal_path):
    with pmemwal.open(wal_path, segment_size=SEG, background=False) as wal:
        lsns = [wal.append(b"t" * 1000, flush=True) for _ in range(3000)]
        follower = pmemwal.follow(wal_path, start=lsns[0], timeout=0.1)
        assert wal.truncate(lsns[-1]) > 0
        with pytest.raises(pmemwal.TruncatedError):
            list(follower)
        follower.close()


# ---- named followers ---------------------------------------------------------------

def test_a_named_follower_resumes_where_it_confirmed(wal_path):
    with pmemwal.open(wal_path, segment_size=SEG) as wal:
        for i in range(100):
            wal.append(_payload(i), flush=True)
        with pmemwal.follow(wal_path, name="proj", timeout=0.1) as follower:
            it = iter(follower)
            seen = _numbers(next(it) for _ in range(40))
            follower.confirm()
            next(it)  # read, not confirmed: comes again
        assert seen == list(range(40))
        with pmemwal.follow(wal_path, name="proj", timeout=0.1) as follower:
            assert _numbers(follower) == list(range(40, 100))
        [info] = pmemwal.followers(wal_path)
        assert info["name"] == "proj" and info["state"] == "active"
        assert info["lag_bytes"] > 0


def test_a_name_is_followed_by_one_process_at_a_time(wal_path):
    pmemwal.open(wal_path).close()
    with pmemwal.follow(wal_path, name="one", timeout=0):
        with pytest.raises(pmemwal.LockedError):
            pmemwal.follow(wal_path, name="one", timeout=0)
        with pytest.raises(pmemwal.LockedError):
            pmemwal.drop_follower(wal_path, "one")
    assert pmemwal.drop_follower(wal_path, "one")
    assert not pmemwal.drop_follower(wal_path, "one")
    assert pmemwal.followers(wal_path) == []


def test_a_named_follower_holds_back_truncation_until_it_lags_too_far(wal_path):
    with pmemwal.open(wal_path, segment_size=SEG, background=False,
                      max_follower_lag_bytes=8 * SEG) as wal:
        first = wal.append(b"a" * 1000, flush=True)
        with pmemwal.follow(wal_path, name="slow", timeout=0):
            pass  # registered at the oldest record, confirming nothing
        for _ in range(4000):  # ~4 segments
            last = wal.append(b"a" * 1000, flush=True)
        assert wal.truncate(last) == 0  # all of it is the follower's still
        assert wal.record(first).payload == b"a" * 1000
        for _ in range(6000):  # now more than 8 segments behind
            last = wal.append(b"a" * 1000, flush=True)
        assert wal.truncate(last) > 0
        [info] = pmemwal.followers(wal_path)
        assert info["state"] == "lost"
        with pytest.raises(pmemwal.FollowerLostError):
            pmemwal.follow(wal_path, name="slow", timeout=0)


def test_a_follower_name_must_be_short_text(wal_path):
    pmemwal.open(wal_path).close()
    for bad in ("", "x" * 65, "a\0b"):
        with pytest.raises(pmemwal.ConfigError):
            pmemwal.follow(wal_path, name=bad, timeout=0)


def test_the_follow_file_is_remade_for_another_wal(wal_path, shm_tmp):
    pmemwal.open(wal_path).close()
    other = str(shm_tmp / "other")
    pmemwal.open(other).close()
    os.replace(os.path.join(other, FOLLOW_NAME), os.path.join(wal_path, FOLLOW_NAME))
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(wal_path, readonly=True)
    with pmemwal.open(wal_path) as wal:  # the writer, alone, makes it again
        wal.append(b"x", flush=True)
        with pmemwal.open(wal_path, readonly=True) as reader:
            assert [bytes(r.payload) for r in reader.records()] == [b"x"]


def test_stats_show_the_named_followers(wal_path):
    from click.testing import CliRunner

    from pmemwal.tools.cli import main
    with pmemwal.open(wal_path) as wal:
        for i in range(10):
            wal.append(_payload(i), flush=True)
        with pmemwal.follow(wal_path, name="projector", timeout=0) as follower:
            it = iter(follower)
            next(it)
            follower.confirm()
        out = CliRunner().invoke(main, ["stats", wal_path])
        assert out.exit_code == 0, out.output
        assert "'projector' active" in out.output and "open in a writer" in out.output
        data = CliRunner().invoke(main, ["stats", "--json", wal_path])
        following = __import__("json").loads(data.output)["following"]
        assert following["writer_open"] and following["followers"][0]["name"] == "projector"


def test_a_follower_killed_asleep_beside_a_live_writer_is_cleared_by_its_rounds(wal_path):
    """The writer is open throughout: its background rounds find the dead sleeper's bit."""
    import struct
    with pmemwal.open(wal_path, segment_size=SEG, flush_interval=0.01) as wal:
        code = "import pmemwal, sys\nlist(pmemwal.follow(sys.argv[1]))\n"
        child = subprocess.Popen([sys.executable, "-c", code, wal_path])
        path = os.path.join(wal_path, FOLLOW_NAME)

        def sleepers() -> int:
            with open(path, "rb") as f:
                return struct.unpack("<Q", f.read()[136:144])[0]
        try:
            deadline = time.monotonic() + 20
            while not sleepers() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sleepers()
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        wal.append(b"x")  # (a round runs when there is something to flush)
        deadline = time.monotonic() + 20
        while sleepers() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sleepers() == 0


def test_a_killed_writers_unflushed_records_are_not_read_until_a_writer_recovers_them(wal_path):
    """In direct mode a SIGKILLed writer's unflushed records lie readable in the page cache,
    but a power loss would take them: a reader reads what the writer published, until the
    next writer's recovery makes them durable."""
    code = ("import pmemwal, sys\n"
            "wal = pmemwal.open(sys.argv[1], mode='direct', background=False)\n"
            "for i in range(15):\n"
            "    wal.append(i.to_bytes(8, 'little'), flush=(i == 9))\n"
            "print('done', flush=True); sys.stdin.read()\n")
    _run_then_kill(code, wal_path)
    with pmemwal.open(wal_path, readonly=True) as reader:
        assert _numbers(reader.records()) == list(range(10))
        assert _numbers(pmemwal.follow(wal_path, timeout=0)) == list(range(10))
        pmemwal.open(wal_path).close()  # recovery keeps and persists them
        assert _numbers(reader.records()) == list(range(15))


def test_a_closed_follower_ends_its_iteration_and_batches(wal_path):
    with pmemwal.open(wal_path) as wal:
        for i in range(5):
            wal.append(_payload(i), flush=True)
        follower = pmemwal.follow(wal_path, timeout=0)
        assert _numbers([next(follower)]) == [0]
        assert [len(b) for b in follower.batches()] == [4]  # from after what was yielded
        follower.close()
        assert list(follower) == [] and list(follower.batches()) == []
