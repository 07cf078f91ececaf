"""A growing WAL has its segments made ahead at the pace it grows (pmemwal/growth.py, issue 29)."""

from __future__ import annotations

import errno
import math
import os
import threading
import time

import pytest

import pmemwal
from conftest import payload, read_all
from pmemwal import _core
from pmemwal.errors import StorageError
from pmemwal.growth import HORIZON_MIN, GrowthPace
from pmemwal.wal.rounds import _BRINGS_PER_ROUND

SEG = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_growth_rate_rises_at_once_and_decays_slowly():
    clock = FakeClock()
    pace = GrowthPace(clock)
    pace.observe(0)
    clock.now += 0.1
    pace.observe(100 << 20)                       # 1 GB/s: taken at once
    assert pace.rate == pytest.approx(1000 << 20)
    clock.now += 0.1
    pace.observe(110 << 20)                       # a slower stretch only pulls it down
    assert (100 << 20) < pace.rate < (1000 << 20)
    clock.now += 0.001
    before = pace.rate
    pace.observe(200 << 20)                       # too soon after the last sample: ignored
    assert pace.rate == before


def test_segments_ahead_cover_the_horizon_and_the_slowest_make():
    clock = FakeClock()
    pace = GrowthPace(clock)
    assert pace.segments_ahead(SEG) == 1          # nothing grown yet: the one being made
    pace.observe(0)
    clock.now += 1
    pace.observe(100 * SEG)                       # 100 segments a second
    assert pace.segments_ahead(SEG) == round(100 * HORIZON_MIN) + 1
    pace.made(0.5)                                # one make took half a second
    assert pace.segments_ahead(SEG) == 4 * 50 + 1
    pace.made(0.001)                              # a fast one decays the slowest slowly
    assert 4 * 40 < pace.segments_ahead(SEG) < 4 * 50 + 1


def _segments_ahead(wal: pmemwal.WAL) -> int:
    current = wal.insert_lsn // wal.segment_size
    return sum(1 for s in wal._segments if s > current)


def test_a_few_records_take_one_segment_and_growth_brings_the_next_ones_soon(wal_dir, mode):
    """A WAL of a few records has no segment made ahead (one segment on disk, not three).
    The append that takes it past an eighth of its segment wakes the writer (not its timed
    round, 30 s away), which makes the next ones: an appender that then fills them at once
    never waits for one."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, flush_interval=30) as wal:
        for i in range(6):
            wal.append(b"record %d" % i)
        wal.flush()
        time.sleep(0.2)
        assert _segments_ahead(wal) == 0
        assert len(list(wal_dir.glob("*.wal"))) == 1
        while wal.insert_lsn < SEG // 8:
            wal.append(bytes(16 << 10))
        waits = wal.stats()["segment_waits"]
        deadline = time.monotonic() + 10   # (the append past the eighth woke the writer)
        while _segments_ahead(wal) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _segments_ahead(wal) >= 2
        while wal.insert_lsn < 2 * SEG:
            wal.append(bytes(64 << 10))
        assert wal.stats()["segment_waits"] == waits


def test_segments_ahead_follow_the_growth_until_the_first_truncation(wal_dir, mode):
    """Driven by hand (no background thread, a clock of its own): the depth made ahead is
    the growth over the horizon, capped by a quarter of max_wal_size, and the first
    truncation hands the pool over to the truncation-distance estimate: the segments made
    ahead count as its spares, so it removes what it cuts, and none is made again."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      max_wal_size=64 * SEG, recycle_segments=2) as wal:
        clock = FakeClock()
        wal._growth = GrowthPace(clock)
        wal._prepare_ahead()
        for _ in range(4):                         # about 80 segments a second
            clock.now += 0.025
            target = (wal.insert_lsn // SEG + 2) * SEG
            while wal.insert_lsn < target:
                wal.append(bytes(64 << 10))
            wal._prepare_ahead()
        assert wal._growth.rate == pytest.approx(80 * SEG, rel=0.2)
        assert _segments_ahead(wal) == math.ceil(wal._growth.rate * HORIZON_MIN / SEG) + 1 > 8
        wal._growth.made(1.0)                      # slow makes: the cap, a quarter of 64
        wal._prepare_ahead()
        assert _segments_ahead(wal) == 16
        made = wal.stats()["segments_created"]
        assert wal.truncate(wal.flush()) >= 8
        stats = wal.stats()
        assert stats["segments_removed"] >= 8 and stats["segments_recycled"] == 0
        wal._prepare_ahead()                       # the truncations' pool now: nothing to make
        assert wal.stats()["segments_created"] == made
        assert _segments_ahead(wal) >= 15


def test_segment_makes_are_timed_by_the_paces_clock(wal_dir):
    """The depth follows the slowest recent make, timed by the pace's own clock like the
    growth: a test that sets the clock decides both, whatever the machine's speed (by the
    real clock, one make slower than 25 ms under load changed the depth)."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False) as wal:
        clock = FakeClock()
        wal._growth = GrowthPace(clock)
        real = wal._dir.create

        def creating_in_half_a_second(*args, **kwargs):
            clock.now += 0.5
            return real(*args, **kwargs)

        wal._dir.create = creating_in_half_a_second
        wal._ensure_segment(1)
        assert wal._growth.slowest_make == 0.5
        assert wal.stats()["segment_make_ns"] == 500_000_000


def test_the_depth_stays_within_the_cores_segment_table(wal_dir):
    """Made that far ahead, a segment would take the current one's entry in the core's
    table (indexed by number modulo its size): the depth is bounded whatever max_wal_size
    says, and the core refuses a notify depth that large."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, max_wal_size=1 << 40) as wal:
        clock = FakeClock()
        wal._growth = GrowthPace(clock)
        wal._growth.observe(0)
        clock.now += 1
        wal._growth.observe(1 << 40)               # a terabyte a second
        assert wal._segments_wanted_ahead(wal.insert_lsn, True)[0] == _core.SEG_TABLE // 4
        with pytest.raises(ValueError):
            wal._core.set_notify(-1, _core.SEG_TABLE // 2)


def test_a_large_recycle_setting_keeps_the_spares_within_the_cores_segment_table(wal_dir):
    """recycle_segments=1100 and a truncation of 1,100 segments: recycled into spares that
    far ahead, the 1,025th, attached, would take the entry of the segment being written,
    and appenders would wait for it to be attached again.  The spares are capped like the
    depth ahead; every segment the appends reach is attached before they do (the
    background writer's rounds, run by hand: no segment wait)."""
    with pmemwal.open(wal_dir, mode="direct", segment_size=SEG, background=False,
                      recycle_segments=1100, max_wal_size=1 << 40) as wal:
        while wal.insert_lsn < 1101 * SEG:
            wal.append(bytes(256 << 10))
        assert wal.truncate(wal.flush()) == 1101
        assert wal.stats()["segments_recycled"] <= _core.SEG_TABLE // 4
        waits = wal.stats()["segment_waits"]
        for _ in range(2000):
            wal.append(bytes(4000))
            wal._prepare_ahead()                           # the background writer's round
        assert wal.insert_lsn // SEG > 1101 + 3           # into several spares
        assert wal.stats()["segment_waits"] == waits


def test_a_shared_wals_background_writer_prepares_segments(wal_dir):
    """A shared WAL keeps prepare_segments ready before this process ever truncates (it
    makes no more: another process may be truncating it)."""
    with pmemwal.open(wal_dir, segment_size=SEG, shared=True) as wal:
        while wal.insert_lsn < 3 * SEG:
            wal.append(bytes(64 << 10))
            time.sleep(0.001)
        deadline = time.monotonic() + 10
        while wal.stats()["segments_prefaulted"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wal.stats()["segments_prefaulted"] > 0
        assert wal._background.error is None


def test_a_deep_round_does_not_hold_up_the_flush(wal_dir, monkeypatch):
    """A deep pool to make (16 segments, as when makes are slow on memory the host took
    back): an asynchronous record is durable within two rounds' makes (the round under
    way, and the next: each flushes after a few makes), not after all of them.  Counted
    in makes begun before the flush covered it, not in time."""
    with pmemwal.open(wal_dir, mode="direct", segment_size=SEG, flush_interval=0.02,
                      max_wal_size=64 * SEG) as wal:
        real, appended, unflushed = wal._dir.create, threading.Event(), []

        def counting(*args, **kwargs):
            if appended.is_set() and wal.flushed_lsn <= lsn:
                unflushed.append(args[0])
            return real(*args, **kwargs)

        monkeypatch.setattr(wal._dir, "create", counting)
        wal._growth.made(1.0)                      # a depth of a quarter of max_wal_size
        wal._growth.rate = 100 * SEG
        lsn = wal.append(b"async")
        appended.set()
        deadline = time.monotonic() + 30
        while wal.flushed_lsn <= lsn and time.monotonic() < deadline:
            time.sleep(0.005)
        assert wal.flushed_lsn > lsn
        assert len(unflushed) <= 2 * _BRINGS_PER_ROUND
        while wal.stats()["segments_created"] < 16 and time.monotonic() < deadline:
            time.sleep(0.005)                      # the rest of the pool: it was that deep
        assert wal.stats()["segments_created"] >= 16 > 2 * _BRINGS_PER_ROUND + 1


def _fast_growth(wal: pmemwal.WAL) -> None:
    """``wal``'s growth made to read 1000 segments a second: a depth capped at 16."""
    clock = FakeClock()
    wal._growth = GrowthPace(clock)
    wal._growth.observe(0)
    clock.now += 1
    wal._growth.observe(1000 * SEG)


def _files(wal_dir) -> list[int]:
    return sorted(int(p.name[:16], 16) for p in wal_dir.glob("*.wal"))


def test_a_shared_wal_attaches_far_ahead_only_what_others_made(wal_dir):
    """A process of a shared WAL makes prepare_segments ahead, and attaches as far as its
    growth depth the segments another process made or recycled, up to the first one
    missing: its appenders then never stop to map a recycled segment, and no process
    makes spares that a truncation by another removes as surplus."""
    a = pmemwal.open(wal_dir, segment_size=SEG, shared=True, background=False, recycle_segments=6)
    b = pmemwal.open(wal_dir, segment_size=SEG, shared=True, background=False)
    try:
        _fast_growth(a)
        a._prepare_ahead()                         # nothing made by others: prepare_segments
        assert _files(wal_dir) == [0, 1, 2]
        while a.insert_lsn < 8 * SEG:
            a.append(bytes(64 << 10))
        a.truncate(a.flush())                      # recycled into the 6 segments after this one
        current = b.insert_lsn // SEG
        assert _files(wal_dir)[-1] == current + 6
        mapped = a._segments[current + 5].inode    # a's mapping of a recycled file
        os.unlink(wal_dir / f"{current + 6:016X}.wal")  # (as if its recycling had not come yet)
        made = _files(wal_dir)
        _fast_growth(b)
        b._prepare_ahead()
        assert set(range(current, current + 6)) <= set(b._segments)
        assert current + 6 not in b._segments and _files(wal_dir) == made
        assert b._segments[current + 5].inode == mapped
    finally:
        b.close()
        a.close()


# ---- a spare's header write fails ----------------------------------------------------

def _fails_once(wal: pmemwal.WAL, monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """``wal._dir.<name>`` fails with EIO at its first call, as a disk error would, and works
    after; the segment it failed for (once it has)."""
    real, failed = getattr(wal._dir, name), []

    def once(segno: int, *args: object) -> None:
        if not failed:
            failed.append(segno)
            raise StorageError(errno.EIO, "an injected I/O error", wal._dir.file(segno))
        real(segno, *args)

    monkeypatch.setattr(wal._dir, name, once)
    return failed


def _outcome(call) -> BaseException | None:
    """What ``call()`` raised (None: nothing) in a thread of its own; a call that never
    returns (a wait for a segment nobody brings) fails the test instead of hanging it."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert out, "the call hung"
    return out[0]


def _spares_ahead(wal_dir, mode: str) -> None:
    """A closed WAL of segments 0..5 on disk, 2..5 of them spares."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      prepare_segments=1, preallocate=6 * SEG):
        pass


def test_a_spare_whose_arming_fails_is_armed_at_the_next_request(wal_dir, mode, monkeypatch):
    """The header write that takes a spare into use fails: the append that needed it
    raises the StorageError, and the next one asks again (it waited forever for the spare
    to arrive before); every record acknowledged is there after a reopen."""
    _spares_ahead(wal_dir, mode)
    with pmemwal.open(wal_dir, mode=mode, background=False, prepare_segments=1) as wal:
        assert wal._dir.is_spare(2)
        failed = _fails_once(wal, monkeypatch, "arm")
        lsns: list[int] = []

        def fill() -> None:
            while wal.insert_lsn < 3 * SEG + SEG // 2:
                lsns.append(wal.append(payload(f"a/{len(lsns)}", 3000), flush=True))

        error = _outcome(fill)
        assert isinstance(error, StorageError) and error.errno == errno.EIO and failed == [2]
        assert wal._dir.is_spare(2) and 2 not in wal._arriving
        assert _outcome(fill) is None and not wal._dir.is_spare(3)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [lsn for lsn, _, _ in read_all(wal)] == lsns


def test_a_recycled_spare_whose_arming_fails_stays_open_in_the_table(wal_dir, monkeypatch):
    """A truncation recycles segment 0 into segment 3, which is near the insert position
    and so is armed at once; that fails: the truncation raises, segment 3 stays in the
    table with its file open (the failed truncation closed it there), and appending goes
    on into it once the next request arms it."""
    with pmemwal.open(wal_dir, mode="direct", segment_size=SEG, background=False,
                      prepare_segments=1, recycle_segments=1) as wal:
        lsns: list[int] = []

        def fill(until: int) -> None:
            while wal.insert_lsn < until:
                lsns.append(wal.append(payload(f"r/{len(lsns)}", 3000), flush=True))

        fill(2 * SEG + SEG // 2)
        failed = _fails_once(wal, monkeypatch, "arm")
        error = _outcome(lambda: wal.truncate(SEG))
        assert isinstance(error, StorageError) and error.errno == errno.EIO and failed == [3]
        assert wal._segments[3].fd >= 0 and 3 not in wal._arriving
        assert _outcome(lambda: fill(4 * SEG + SEG // 2)) is None
        assert wal.stats()["segments_recycled"] == 1
        lsns = [lsn for lsn in lsns if lsn >= SEG]
    with pmemwal.open(wal_dir, verify="all") as wal:
        assert [lsn for lsn, _, _ in read_all(wal)] == lsns
