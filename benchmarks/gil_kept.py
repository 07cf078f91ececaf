"""Small appends that keep the GIL: one thread against two, GIL kept against given up.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/gil_kept.py [--sizes 64,8192,32768,65536] [--rounds 3] [--seconds 1] [--mode direct]

Each client is a thread in a loop of ``append(data, flush=True)`` (one record
committed per call), truncating behind itself so that the run stays on
recycled segments.  For each record size, and for ``gil_release_size=0``
(every append gives the GIL up before copying: the behaviour before it
existed) against a limit above every size (appends keep the GIL unless they
must wait), one client and two clients run back to back in each round;
medians of the rounds are reported, with two clients / one and kept / given
up, and the background writer's CPU share in each (its CPU time over the measured
window, of one core).  This is what chose ``DEFAULT_GIL_RELEASE_SIZE`` (docs/PERFORMANCE.md,
"Threads and processes"; docs/notes/2026-12-performance-notebook.md §8.1 and §15.3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import pmemwal
from common import background_share, markdown_table, print_cpu, scratch_dir, share_text

KEEP = 64 << 20
ALWAYS_KEEP = 1 << 40


def commit_rate(mode: str, size: int, clients: int, gil_release_size: int,
                seconds: float) -> tuple[float, float]:
    """Records/s of ``clients`` threads committing ``size``-byte records, after a warm-up;
    the background writer's CPU share meanwhile."""
    with scratch_dir() as path, pmemwal.open(path, mode=mode, recycle_segments=8,
                                             gil_release_size=gil_release_size) as wal:
        data = os.urandom(size)
        cutting = threading.Lock()
        counts = [0] * clients

        def client(i: int, until: float) -> None:
            append, n = wal.append, 0
            while True:
                append(data, True)
                n += 1
                if n & 63 == 0:
                    if time.perf_counter() > until:
                        break
                    if wal.flushed_lsn - wal.first_lsn > KEEP and cutting.acquire(False):
                        try:
                            wal.truncate(wal.flushed_lsn - KEEP // 2)
                        finally:
                            cutting.release()
            counts[i] = n

        for window in (0.5, seconds):  # the first fills the recycle pool
            before, t0 = wal.stats(), time.perf_counter()
            threads = [threading.Thread(target=client, args=(i, t0 + window))
                       for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
        return sum(counts) / elapsed, background_share(before, wal.stats(), elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,8192,32768,65536")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--mode", default="direct")
    args = parser.parse_args()
    print_cpu()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        runs: dict[tuple[str, int], list[float]] = {}
        shares: dict[tuple[str, int], list[float]] = {}
        for r in range(args.rounds):
            for name, limit in (("given up", 0), ("kept", ALWAYS_KEEP)):
                for clients in (1, 2):
                    value, share = commit_rate(args.mode, size, clients, limit, args.seconds)
                    runs.setdefault((name, clients), []).append(value)
                    shares.setdefault((name, clients), []).append(share)
            print(f"{size} B round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        bg = {k: statistics.median(v) for k, v in shares.items()}
        rows.append([f"{size:,} B",
                     f"{med['given up', 1] / 1e3:,.0f} k", f"{med['given up', 2] / 1e3:,.0f} k",
                     f"{med['given up', 2] / med['given up', 1]:.2f}",
                     f"{med['kept', 1] / 1e3:,.0f} k", f"{med['kept', 2] / 1e3:,.0f} k",
                     f"**{med['kept', 2] / med['kept', 1]:.2f}**",
                     f"{med['kept', 1] / med['given up', 1]:.2f} / "
                     f"{med['kept', 2] / med['given up', 2]:.2f}",
                     share_text(*(bg[k] for k in (("given up", 1), ("given up", 2),
                                                  ("kept", 1), ("kept", 2))))])
    print(f"\n{args.mode} mode, append(flush=True), records/s, median of {args.rounds} rounds of "
          f"{args.seconds} s; CRC32C path {pmemwal._core.CRC32C_IMPL}\n")
    print(markdown_table(["record", "GIL given up: 1 thread", "2 threads", "2 / 1",
                          "GIL kept: 1 thread", "2 threads", "2 / 1",
                          "kept / given up (1 / 2 threads)",
                          "bg CPU (given up 1 / 2, kept 1 / 2 threads)"], rows))


if __name__ == "__main__":
    main()
