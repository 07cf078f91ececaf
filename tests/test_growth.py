"""A growing WAL has its segments made ahead at the pace it grows (pmemwal/growth.py, issue 29)."""

from __future__ import annotations

import math
import time

import pytest

import pmemwal
from pmemwal.growth import HORIZON_MIN, GrowthPace

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


def test_the_background_writer_prepares_segments_at_the_first_append(wal_dir, mode):
    """Not at the end of the first segment, nor at its first timed round: an appender that
    fills it at once finds the next ones made.  An open that only reads makes none."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, flush_interval=30) as wal:
        time.sleep(0.2)
        assert _segments_ahead(wal) == 0
        wal.append(b"first")  # (buffered mode: it attaches segment 0, a wait of its own)
        waits = wal.stats()["segment_waits"]
        deadline = time.monotonic() + 10
        while _segments_ahead(wal) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _segments_ahead(wal) >= 2
        while wal.insert_lsn < 2 * SEG:
            wal.append(bytes(64 << 10))
        assert wal.stats()["segment_waits"] == waits


def test_segments_ahead_follow_the_growth_until_the_first_truncation(wal_dir, mode):
    """Driven by hand (no background thread, a clock of its own): the depth made ahead is
    the growth over the horizon, capped by a quarter of max_wal_size, and the first
    truncation hands the pool over to the truncation-distance estimate (the segments made
    ahead count as its spares: none is removed or made again)."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      max_wal_size=64 * SEG, recycle_segments=0) as wal:
        clock = FakeClock()
        wal._growth = GrowthPace(clock)
        wal._prepare_ahead()
        for _ in range(4):                         # 100 segments a second: 11 ahead
            clock.now += 0.02
            target = (wal.insert_lsn // SEG + 2) * SEG
            while wal.insert_lsn < target:
                wal.append(bytes(64 << 10))
            wal._prepare_ahead()
        assert wal._growth.rate == pytest.approx(100 * SEG, rel=0.2)
        assert _segments_ahead(wal) == math.ceil(wal._growth.rate * HORIZON_MIN / SEG) + 1 > 10
        wal._growth.made(1.0)                      # slow makes: the cap, a quarter of 64
        wal._prepare_ahead()
        assert _segments_ahead(wal) == 16
        made = wal.stats()["segments_created"]
        wal.truncate(wal.flush())
        stats = wal.stats()
        assert stats["segments_removed"] >= 1 and stats["segments_recycled"] == 0
        wal._prepare_ahead()                       # the truncations' pool now: nothing to make
        assert wal.stats()["segments_created"] == made
        assert _segments_ahead(wal) >= 15
