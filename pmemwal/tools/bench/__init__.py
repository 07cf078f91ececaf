"""The write benchmark: N client threads append records of one size for T seconds.

    from pmemwal.tools.bench import BenchConfig, run
    result = run(BenchConfig("/dev/shm/pmemwal-bench", size=8192, flush="each"),
                 progress=lambda p: print(p["line"]))
    print(result.report())

Every client appends the same preallocated payload in a tight loop and times each
append and each flush; before the clock starts the WAL is filled once and truncated, so
the run appends into recycled, mapped segments as a long-running log does, and the
clients truncate it by position as they go.  A module per concern, each calling only
those below it:

- engine.py: ``run``, one run from start to end (the engine of ``pmemwal bench``);
- processes.py: the clients as processes, on a WAL they share (``processes``);
- session.py: ``_Run``, the state one run shares: the clock, truncation by position,
  the checkpointer, the progress lines, and ``measure``;
- clients.py: the clients as threads, and the loop every client runs (flush policies,
  ``rate``);
- warmup.py: the warm-up (growth spares used up, recycling, the archive caught up);
- wal_dir.py: the WAL opened, its directory removed, and the pace fresh segments are made at;
- report.py: ``BenchResult``, its summary and JSON, and the progress line's format;
- latency.py: the samples, their HdrHistograms, and ``Latency``;
- config.py: ``BenchConfig`` and the text forms of sizes and flush policies.
"""

from pmemwal.tools.bench.config import (DEFAULT_KEEP, DEFAULT_PATH, FLUSH_POLICIES, MODES,
                                        BenchConfig, parse_flush, parse_keep, parse_size)
from pmemwal.tools.bench.engine import run
from pmemwal.tools.bench.latency import (_DRAIN_EVERY, HIST_DIGITS, HIST_HIGHEST, HIST_LOWEST,
                                         Latency, _Timings)
from pmemwal.tools.bench.report import BenchResult, format_progress
from pmemwal.tools.bench.session import ARCHIVE_COUNTERS, Progress
from pmemwal.tools.bench.wal_dir import fresh_segment_rate, remove_wal_dir
from pmemwal.tools.bench.warmup import ARCHIVE_WAIT

__all__ = ["BenchConfig", "BenchResult", "Latency", "run", "parse_size", "parse_keep",
           "parse_flush", "format_progress", "fresh_segment_rate", "remove_wal_dir",
           "DEFAULT_PATH", "DEFAULT_KEEP", "FLUSH_POLICIES", "MODES", "ARCHIVE_COUNTERS",
           "ARCHIVE_WAIT", "HIST_LOWEST", "HIST_HIGHEST", "HIST_DIGITS", "Progress",
           "_Timings", "_DRAIN_EVERY"]
