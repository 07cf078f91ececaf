"""Latency: the clients' samples, their HdrHistograms, and the distribution a result reports.

Every client times each append and each flush with ``time.perf_counter_ns`` into a
``_Timings`` of its own (submission and sync apart, as fio reports them); ``Latency``
is such a distribution in microseconds, and ``_encode`` a histogram as the JSON
carries it and a client process sends it.

Latencies are first kept in arrays and folded into the HdrHistograms in
batches (rounded to the histogram's 3 significant digits with numpy): a pure
Python ``record_value`` per sample costs more than an append does.  hdrh is the
'bench' extra, imported on first use (``_hdr_histogram``).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pmemwal.tools._extras import require
from pmemwal.tools.progress import plural

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram

HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS = 1, 60_000_000_000, 3  # ns: 1 ns to 60 s
_DRAIN_EVERY = 1 << 16  # latency samples kept per client before folding into its histogram
_SUB_BUCKET_BITS = 11  # 3 significant digits: 2048 sub-buckets, resolution 2**(bitlen - 11)


@dataclass(frozen=True)
class Latency:
    """A latency distribution in microseconds."""

    count: int
    mean: float
    stddev: float
    min: float
    p50: float
    p99: float
    p999: float
    max: float

    @classmethod
    def of(cls, timings: _Timings) -> Latency | None:
        hist, count = timings.hist, timings.hist.get_total_count()
        if count == 0:
            return None
        mean = timings.total / count
        stddev = math.sqrt(max(timings.squares / count - mean * mean, 0.0))
        return cls(count=count, mean=mean / 1000, stddev=stddev / 1000,
                   min=hist.get_min_value() / 1000,
                   p50=hist.get_value_at_percentile(50) / 1000,
                   p99=hist.get_value_at_percentile(99) / 1000,
                   p999=hist.get_value_at_percentile(99.9) / 1000,
                   max=hist.get_max_value() / 1000)

    def line(self) -> str:
        return (f"p50 {self.p50:.2f}  p99 {self.p99:.2f}  p99.9 {self.p999:.2f}  "
                f"max {self.max:.2f}  (mean {self.mean:.2f}, stddev {self.stddev:.2f}, "
                f"{plural(self.count, 'sample')})")


class _Timings:
    """Latency samples (ns): an array the hot loop appends to, folded in batches
    into an HdrHistogram and exact sums (for the mean and standard deviation,
    which hdrh computes slowly and only to its buckets' precision)."""

    def __init__(self) -> None:
        self.samples = array("q")
        self.hist = _hdr_histogram()(HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS)
        self.total = 0.0
        self.squares = 0.0

    def drain(self) -> None:
        """Fold the samples in and empty the array.

        Each sample is first rounded down to its histogram bucket's lowest
        value, so that one ``record_value(value, count)`` per distinct bucket
        suffices.
        """
        if not self.samples:
            return
        values = np.frombuffer(self.samples, dtype=np.int64).copy()  # no view outlives the clear
        np.maximum(values, HIST_LOWEST, out=values)
        as_float = values.astype(np.float64)
        self.total += float(as_float.sum())
        # (not np.dot: a BLAS call wakes OpenBLAS's worker threads, which then spin for a
        # while after it, taking 40 % of a core from the appenders on 2 cores)
        self.squares += float(np.square(as_float).sum())
        _, bitlen = np.frexp(as_float)  # exact for values below 2**53
        shift = np.maximum(bitlen - _SUB_BUCKET_BITS, 0).astype(np.int64)
        buckets, counts = np.unique((values >> shift) << shift, return_counts=True)
        for value, count in zip(buckets.tolist(), counts.tolist()):
            self.hist.record_value(value, count)
        del self.samples[:]

    def add(self, other: _Timings) -> None:
        self.hist.add(other.hist)
        self.total += other.total
        self.squares += other.squares

    def state(self) -> tuple[str | None, float, float]:
        """What ``add_state`` takes, picklable: the histogram encoded, and the sums."""
        return _encode(self.hist), self.total, self.squares

    def add_state(self, state: tuple[str | None, float, float]) -> None:
        encoded, total, squares = state
        if encoded:
            self.hist.decode_and_add(encoded)
        self.total += total
        self.squares += squares


def _hdr_histogram() -> type[HdrHistogram]:
    """hdrh's HdrHistogram (the 'bench' extra), imported on first use."""
    return require("hdrh.histogram", "bench", "pmemwal bench").HdrHistogram


def _encode(hist: HdrHistogram) -> str | None:
    if hist.get_total_count() == 0:
        return None
    encoded = hist.encode()
    return encoded.decode("ascii") if isinstance(encoded, bytes) else encoded
