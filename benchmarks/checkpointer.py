"""Appends while a checkpointer thread truncates, as applications do (issue 15's first case).

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/checkpointer.py [--size 65536] [--mode direct] [--seconds 2] [--interval 0.02]

One thread commits records (``append(data, flush=True)``), timing each
append; another truncates every ``--interval`` seconds to the flushed LSN it
saw at the previous checkpoint (PostgreSQL's redo point); ``--interval 0``
never truncates; ``--preallocate GIB`` opens the WAL with that much made
ready (a log that keeps everything).  After ``--warm-up`` seconds it prints records/s, p99.9 and max
append latency, and the segments created, removed and recycled in the
measured window.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

import pmemwal
from common import scratch_dir


def appends(wal: pmemwal.WAL, data: bytes, seconds: float) -> np.ndarray:
    """Latencies (s) of committed appends for ``seconds``."""
    latencies, clock, append = [], time.perf_counter, wal.append
    deadline = clock() + seconds
    while True:
        t0 = clock()
        append(data, True)
        t1 = clock()
        latencies.append(t1 - t0)
        if t1 > deadline:
            return np.array(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--mode", default="direct")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--warm-up", type=float, default=1.0)
    parser.add_argument("--preallocate", type=lambda v: int(float(v) * (1 << 30)), default=0,
                        help="GiB made ready when the WAL is opened")
    args = parser.parse_args()
    with scratch_dir() as path, pmemwal.open(path, mode=args.mode,
                                             preallocate=args.preallocate) as wal:
        stop = threading.Event()

        def checkpointer() -> None:
            redo = wal.flushed_lsn
            while not stop.wait(args.interval):
                wal.truncate(redo)
                redo = wal.flushed_lsn

        thread = threading.Thread(target=checkpointer) if args.interval > 0 else None
        if thread:
            thread.start()
        data = os.urandom(args.size)
        appends(wal, data, args.warm_up)
        before, t0 = wal.stats(), time.perf_counter()
        latencies = appends(wal, data, args.seconds)
        elapsed, after = time.perf_counter() - t0, wal.stats()
        stop.set()
        if thread:
            thread.join()
    moved = {k: after[f"segments_{k}"] - before[f"segments_{k}"]
             for k in ("created", "removed", "recycled")}
    every = f"every {args.interval * 1e3:g} ms" if thread else "never"
    print(f"{args.mode} ({wal.persist_method}), {args.size:,} B, truncated {every}: "
          f"{len(latencies) / elapsed / 1e3:,.1f} k records/s, append p99.9 "
          f"{np.percentile(latencies, 99.9) * 1e3:.2f} ms, max {latencies.max() * 1e3:.1f} ms; "
          f"segments {moved['created']} created, {moved['removed']} removed, "
          f"{moved['recycled']} recycled")


if __name__ == "__main__":
    main()
