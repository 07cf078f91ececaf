"""Which records to stream past the cache in direct mode on pmem, with and without CLWB.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/stream_min.py [--rounds 3] [--seconds 0.7]
    PMEM_IS_PMEM_FORCE=1 PMEM_NO_CLWB=1 .venv/bin/python benchmarks/stream_min.py

One thread commits records of each size (``append(data, flush=True)``) with
the streaming threshold set to 0, 64 and 256 bytes and to never: records
whose payload reaches it are stored with non-temporal stores, header
included, and need only the fence; smaller ones are stored through the cache
and written back with libpmem's flush (CLWB, or CLFLUSHOPT under
``PMEM_NO_CLWB=1`` or on a CPU without CLWB, which evicts the line: the next
small record then misses on it).  Rounds alternate the thresholds; medians
are reported, as ratios to 256 B (libpmem's own threshold), with the background
writer's CPU share at each threshold (its CPU time over the measured window, of one
core).  What it found
chose ``pmemwal.device.stream_min`` (docs/PERFORMANCE.md, "Zen 5"; every cell in
docs/notes/2026-12-performance-notebook.md §8.3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import pmemwal
from common import background_share, markdown_table, print_cpu, scratch_dir, share_text
from pmemwal import _core, libpmem

KEEP = 64 << 20
THRESHOLDS = {"0": 0, "64 B": 64, "256 B": 256, "never": _core.STREAM_NEVER}


def commit_rate(size: int, threshold: int, seconds: float) -> tuple[float, float]:
    """Records/s committed; the background writer's CPU share meanwhile."""
    with scratch_dir() as path, pmemwal.open(path, mode="direct", recycle_segments=8) as wal:
        if wal.persist_method != "pmem":
            raise SystemExit("needs libpmem and pmem (PMEM_IS_PMEM_FORCE=1 on tmpfs)")
        lib = libpmem.load()
        wal._core.set_persist(_core.PERSIST_PMEM, lib.addr_flush, lib.addr_drain, threshold)
        data, append = os.urandom(size), wal.append
        for window in (0.3, seconds):  # the first fills the recycle pool
            n, before, t0 = 0, wal.stats(), time.perf_counter()
            while True:
                for _ in range(256):
                    append(data, True)
                n += 256
                if wal.flushed_lsn - wal.first_lsn > KEEP:
                    wal.truncate(wal.flushed_lsn - KEEP // 2)
                t = time.perf_counter()
                if t > t0 + window:
                    break
        return n / (t - t0), background_share(before, wal.stats(), t - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,200,1024,8192,65536")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.7)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print_cpu()
    runs: dict[tuple[int, str], list[float]] = {}
    shares: dict[tuple[int, str], list[float]] = {}
    for r in range(args.rounds):
        for size in sizes:
            for name, threshold in THRESHOLDS.items():
                value, share = commit_rate(size, threshold, args.seconds)
                runs.setdefault((size, name), []).append(value)
                shares.setdefault((size, name), []).append(share)
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    rows = []
    for size in sizes:
        base = statistics.median(runs[size, "256 B"])
        rows.append([f"{size:,} B"] + [
            f"{statistics.median(runs[size, name]) / 1e3:,.0f} k "
            f"({statistics.median(runs[size, name]) / base:.2f})" for name in THRESHOLDS]
            + [share_text(*(statistics.median(shares[size, name]) for name in THRESHOLDS))])
    flush = "CLFLUSHOPT (PMEM_NO_CLWB=1)" if os.environ.get("PMEM_NO_CLWB") == "1" else "CLWB"
    print(f"\nrecords/s committed (ratio to 256 B), one thread, libpmem flush by {flush}, "
          f"CRC32C path {_core.CRC32C_IMPL}, median of {args.rounds} rounds\n")
    print(markdown_table(["record"] + [f"stream from {name}" for name in THRESHOLDS]
                         + [f"bg CPU ({' / '.join(THRESHOLDS)})"], rows))


if __name__ == "__main__":
    main()
