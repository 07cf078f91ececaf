"""``run``: one benchmark run from start to end, the engine of ``pmemwal bench``.

The WAL directory made fresh, the warm-up (unless ``cold``), the clients as threads or
processes measured by ``_Run``, the WAL closed and removed (unless ``keep_wal``, on
Ctrl-C too), and, for a WAL never truncated, the pace fresh segments are made at here.
"""

from __future__ import annotations

import dataclasses
import os

import pmemwal
from pmemwal.format import DEFAULT_SEGMENT_SIZE
from pmemwal.tools.bench.clients import _Threads
from pmemwal.tools.bench.config import BenchConfig
from pmemwal.tools.bench.latency import _hdr_histogram
from pmemwal.tools.bench.processes import _Processes
from pmemwal.tools.bench.report import BenchResult
from pmemwal.tools.bench.session import Progress, _Run
from pmemwal.tools.bench.wal_dir import _open_wal, fresh_segment_rate, mark_bench_wal, remove_wal_dir
from pmemwal.tools.bench.warmup import _warm_up


def run(config: BenchConfig, progress: Progress | None = None,
        stop_on_ctrl_c: bool = False) -> BenchResult:
    """Run the benchmark ``config`` describes; ``progress(dict)`` gets each progress line.

    The dict has ``elapsed`` (s), ``records_per_s``, ``mb_per_s``, ``lat_ms``,
    ``stddev_ms``, ``max_ms`` (of the interval) and ``line`` (the same, formatted).  The
    last line covers the remainder of the run, so a run shorter than one
    interval still gets one.

    With ``stop_on_ctrl_c`` (``pmemwal bench``), Ctrl-C while the clients append stops
    them early (where it would raise KeyboardInterrupt in this thread): the result covers
    the run until then, with ``interrupted`` set.  Otherwise, before that, or a second time,
    it raises KeyboardInterrupt (the clients stopped and the WAL removed).
    """
    _hdr_histogram()  # the 'bench' extra, before anything is touched
    if config.fresh:
        remove_wal_dir(config.path, force=config.force)
    recycle = config.recycle_segments(config.segment_size or DEFAULT_SEGMENT_SIZE)
    try:
        wal = _open_wal(config)
        try:
            if config.fresh:
                mark_bench_wal(wal.path)
            probe = wal.probe or pmemwal.probe(wal.path)
            baseline = wal.stats() if config.cold else _warm_up(
                wal, config.keep_bytes, recycle, config.truncate_step(wal.segment_size))
            kind = _Processes if config.processes else _Threads  # (processes.py imports _Run)
            result = _Run(config, wal, progress, baseline).measure(probe, kind, stop_on_ctrl_c)
        finally:
            wal.close()
    finally:
        if not config.keep_wal:  # a run's WAL can be GiBs of RAM on /dev/shm
            remove_wal_dir(config.path, force=config.force)  # (this run's: marked, or empty)
    # a WAL that grew, against the pace this machine makes segments (not after Ctrl-C: the
    # user wants out)
    if config.keep_bytes is None and not result.interrupted:
        rate = fresh_segment_rate(os.path.dirname(os.path.abspath(config.path)), wal.segment_size,
                                  wal.mode, config.prefault)
        result = dataclasses.replace(result, fresh_segment_rate=rate)
    return result
