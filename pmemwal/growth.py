"""How far ahead a growing WAL has its segments made: the pace of growth against the pace of making.

A WAL that is not truncated (a log that keeps everything, or one whose first
truncation has not come yet) makes a fresh segment for every segment it fills.
The background writer makes them ahead, and an appender waits only when it
reaches one not made yet.  How many to keep ready is a matter of time, not of
count: enough that the WAL cannot fill them in the time it takes to make the
next ones, including when making one suddenly costs several times more (a VM
whose host took free memory back: docs/PERFORMANCE.md, "Reading the figures").  So the depth
is the growth over a time horizon, itself several times the slowest recent
make, measured as the WAL grows.

This module only measures and answers; the WAL (wal/rounds.py: _prepare_ahead) acts.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from pmemwal.format import PAGE_HEADER_SIZE

HORIZON_MIN = 0.1      # seconds of growth kept ready at least ...
HORIZON_MAKES = 4      # ... and at least this many of the slowest recent makes
_RATE_WINDOW = 0.02    # seconds between two samples of the growth rate, at least
_DECAY = 0.9           # of a larger past estimate, per sample (a burst is held a while)


class GrowthPace:
    """The WAL's recent growth rate (bytes/s) and the slowest recent segment make (s)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # seconds: the samples and the makes are timed by it (a test's own)
        self._sample: tuple[float, int] | None = None  # (time, insert LSN) of the last sample
        self.rate = 0.0        # bytes/s: a larger sample at once, a smaller one decays to it
        self.slowest_make = 0.0
        self.first_lsn: int | None = None  # the insert position first observed

    def observe(self, insert_lsn: int) -> None:
        """Fold in the insert position now (called by each background round)."""
        now = self.clock()
        if self._sample is None:
            self._sample = (now, insert_lsn)
            self.first_lsn = insert_lsn
            return
        then, lsn = self._sample
        if now - then < _RATE_WINDOW:
            return
        self._sample = (now, insert_lsn)
        rate = (insert_lsn - lsn) / (now - then)
        self.rate = rate if rate > self.rate else _DECAY * self.rate + (1 - _DECAY) * rate

    def made(self, seconds: float) -> None:
        """A segment was made (created, allocated, mapped and pre-faulted) in ``seconds``."""
        self.slowest_make = (seconds if seconds > self.slowest_make
                             else _DECAY * self.slowest_make + (1 - _DECAY) * seconds)

    def segments_within(self, seconds: float, segment_size: int) -> int:
        """Segments the WAL fills in ``seconds`` at its recent rate, rounded up."""
        return math.ceil(self.rate * seconds / segment_size)

    def horizon_bytes(self) -> float:
        """What the WAL grows by over the horizon at its recent rate."""
        return self.rate * max(HORIZON_MIN, HORIZON_MAKES * self.slowest_make)

    def segments_ahead(self, segment_size: int) -> int:
        """Segments the WAL fills over the horizon at its recent rate, rounded up, plus the
        one being made."""
        return math.ceil(self.horizon_bytes() / segment_size) + 1

    def small(self, insert_lsn: int, segment_size: int) -> bool:
        """Whether the WAL has shown no growth that needs segments ahead: still in the segment
        it was first observed in, short of its ``small_mark``, and not reaching the next one
        over the horizon at its recent rate.  A WAL of a few records then takes one segment,
        not that and its spares; one that grows gets them at the next round."""
        offset = insert_lsn % segment_size
        first = self.first_lsn if self.first_lsn is not None else insert_lsn
        return (insert_lsn // segment_size == first // segment_size and
                offset < small_mark(segment_size) and
                offset + self.horizon_bytes() < segment_size)


def small_mark(segment_size: int) -> int:
    """Where in its segment a small WAL stops being one: the first record byte of the page an
    eighth into it (the WAL's core wakes the background writer as an append passes it)."""
    return segment_size // 8 + PAGE_HEADER_SIZE
