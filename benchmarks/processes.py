"""Processes writing one shared WAL against one process, threads and separate WALs, in one run.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/processes.py [--sizes 64,8192,65536]
        [--seconds 1.5] [--rounds 5]

Each writer appends records of one size with ``append(data, flush=True)`` in a tight loop
(no per-record timing, unlike ``pmemwal bench``), the first writer truncating every 1024
records to 128 MiB behind, so that segments are recycled, not made.  Per round and size:

- 1 process on a shared WAL (``shared=True``);
- 2 processes on one shared WAL;
- 2 threads of one process on one WAL (not shared), what Python gives without processes;
- 2 processes on 2 separate WALs: what the machine gives two writers that share nothing.

Writers start together at a set time after opening the WAL; each counts its records in
its own window.  Rounds alternate the four; the table gives medians and the ratios
the project's targets are on (2 processes / 1 process, 2 processes / 2 threads), with the
separate-WAL ratio as the ceiling.  Each process also measures its background writer's CPU
time over its own window; the table gives its share of a core, the mean over the processes
(bg CPU per process; with threads, the one WAL's writer).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import threading
import time

import pmemwal
from common import background_share, print_cpu, scratch_dir, share_text

KEEP = 128 << 20
WARM_UP = 20_000


def _writer(wal: pmemwal.WAL, size: int, start_at: float, seconds: float,
            truncates: bool) -> tuple[int, float]:
    """Records appended in the window; this process's background writer's CPU share in it."""
    data, append = bytes(size), wal.append
    for _ in range(WARM_UP // max(1, size // 4096)):
        append(data, True)
    while time.time() < start_at:
        time.sleep(0.0005)
    before, t0 = wal.stats(), time.perf_counter()
    done, end = 0, start_at + seconds
    while time.time() < end:
        for _ in range(1024):
            lsn = append(data, True)
        done += 1024
        if truncates:
            wal.truncate(lsn - KEEP)
    return done, background_share(before, wal.stats(), time.perf_counter() - t0)


def _process(path: str, shared: bool, size: int, start_at: float, seconds: float,
             truncates: bool, results) -> None:
    with pmemwal.open(path, mode="direct", shared=shared) as wal:
        results.put(_writer(wal, size, start_at, seconds, truncates))


def processes(paths: list[str], shared: bool, size: int, seconds: float) -> tuple[float, float]:
    """Records/s of one process per path (the same path: one shared WAL); the mean of the
    processes' background writers' CPU shares."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 1.0 + 0.3 * len(paths)  # after the interpreters start
    procs = [ctx.Process(target=_process, args=(p, shared, size, start_at, seconds, i == 0 or not shared, results))
             for i, p in enumerate(paths)]
    for proc in procs:
        proc.start()
    got = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return sum(n for n, _ in got) / seconds, statistics.fmean(share for _, share in got)


def threads(path: str, size: int, seconds: float) -> tuple[float, float]:
    """Records/s of two threads of this process on one WAL; its background writer's CPU
    share (over the first thread's window: the two start and end together)."""
    counts, shares = [0, 0], [0.0, 0.0]
    with pmemwal.open(path, mode="direct") as wal:
        start_at = time.time() + 0.5

        def run(i: int) -> None:
            counts[i], shares[i] = _writer(wal, size, start_at, seconds, i == 0)

        pool = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    return sum(counts) / seconds, shares[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,8192,65536")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print_cpu()
    print("| size | 1 process | 2 processes, one WAL | 2 threads, one WAL | 2 processes, 2 WALs | "
          "2 proc / 1 proc | 2 proc / 2 threads | ceiling (2 WALs / 1 proc) | "
          "bg CPU per process (1 proc / 2 proc / 2 threads / 2 WALs) |")
    print("|---|---|---|---|---|---|---|---|---|")
    kinds = ("one", "two", "threads", "apart")
    for size in (int(s) for s in args.sizes.split(",")):
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for _ in range(args.rounds):
            with scratch_dir("pmemwal-procs-") as base:
                wal = os.path.join(base, "wal")

                def fresh(*paths: str) -> list[str]:
                    for p in paths:
                        shutil.rmtree(p, ignore_errors=True)
                    return list(paths)

                runs["one"].append(processes(fresh(wal), True, size, args.seconds))
                runs["two"].append(processes(fresh(wal) * 2, True, size, args.seconds))
                runs["threads"].append(threads(fresh(wal)[0], size, args.seconds))
                runs["apart"].append(processes(fresh(wal + "-a", wal + "-b"), False, size,
                                               args.seconds))
        one, two, thr, apart = (statistics.median(r for r, _ in runs[k]) for k in kinds)
        bg = share_text(*(statistics.median(s for _, s in runs[k]) for k in kinds))
        print(f"| {size} | {one:,.0f} | {two:,.0f} | {thr:,.0f} | {apart:,.0f} | {two / one:.2f} | "
              f"{two / thr:.2f} | {apart / one:.2f} | {bg} |", flush=True)


if __name__ == "__main__":
    main()
