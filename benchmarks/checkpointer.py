"""Appends while the WAL is truncated the ways applications do it, in one run.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/checkpointer.py [--size 65536] [--mode direct]
        [--seconds 2] [--interval 0.02] [--cases inline,thread,never,preallocated]

One thread commits records (``append(data, flush=True)``), timing each append.  The cases:

- ``inline``: the appender itself truncates to ``--keep`` bytes behind it each time it
  enters a new segment (what ``pmemwal bench`` does);
- ``thread``: a checkpointer thread truncates every ``--interval`` seconds to the flushed
  LSN it saw at its previous checkpoint (PostgreSQL's redo point);
- ``never``: nothing is truncated (a log that keeps everything), up to ``--grow`` GiB,
  with the bytes/s set against the rate at which this machine makes fresh segments,
  measured right after it beside its WAL (``/ fresh``), and against the pace at which
  the WAL made its own segments in the case (``/ made``: ``segment_make_ns``);
- ``preallocated``: never truncated, the WAL opened with ``--preallocate`` GiB made ready
  (its warm-up ends at 30 % of them, the case at 90 %).

After ``--warm-up`` seconds each case prints records/s (and its ratio to ``inline``), p99.9
and max append latency, the segments created, removed and recycled while measured, and for
the thread the longest gap between two of its truncations (ms, and MiB appended in it: what
the spare pool must cover) and the CPU time its truncations took per second, and the
background writer's CPU share (its CPU time over the measured window, of one core).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

import pmemwal
from common import background_share, print_cpu, scratch_dir, share_text
from pmemwal.tools.bench import fresh_segment_rate

CASES = ("inline", "thread", "never", "preallocated")


def appends(wal: pmemwal.WAL, data: bytes, seconds: float, keep: int | None,
            until_lsn: int = 1 << 64) -> np.ndarray:
    """Latencies (s) of committed appends for ``seconds`` (or until ``until_lsn``); with
    ``keep``, the appender truncates to ``keep`` bytes behind it at every new segment."""
    latencies, clock, append, size = [], time.perf_counter, wal.append, wal.segment_size
    segment = wal.insert_lsn // size
    deadline = clock() + seconds
    while wal.insert_lsn < until_lsn:
        t0 = clock()
        lsn = append(data, True)
        t1 = clock()
        latencies.append(t1 - t0)
        if keep is not None and lsn // size != segment:
            segment = lsn // size
            wal.truncate(lsn - keep)
        if t1 > deadline:
            break
    return np.array(latencies)


def run_case(case: str, args: argparse.Namespace) -> dict:
    """One case on a fresh WAL: records/s, latencies, segment counts while measured."""
    preallocate = args.preallocate if case == "preallocated" else 0
    with scratch_dir() as path, pmemwal.open(path, mode=args.mode, preallocate=preallocate,
                                             max_wal_size=args.max_wal_size) as wal:
        stop = threading.Event()

        marks: list[tuple[float, int, float]] = []  # (time, insert LSN, CPU s) of each truncation

        def checkpointer() -> None:
            redo = wal.flushed_lsn
            while not stop.wait(args.interval):
                cpu = time.thread_time()
                wal.truncate(redo)
                marks.append((time.perf_counter(), wal.insert_lsn, time.thread_time() - cpu))
                redo = wal.flushed_lsn

        thread = threading.Thread(target=checkpointer) if case == "thread" else None
        if thread:
            thread.start()
        keep = args.keep if case == "inline" else None
        data = os.urandom(args.size)
        # the growing cases end at a size, so that they fit in memory whatever the speed
        bounds = {"preallocated": (0.3, 0.9), "never": (0.1, 1.0)}.get(case)
        warm_until, until = ((wal.insert_lsn + int(f * (preallocate or args.grow)) for f in bounds)
                             if bounds else (1 << 64, 1 << 64))
        appends(wal, data, args.warm_up, keep, warm_until)
        before, t0 = wal.stats(), time.perf_counter()
        latencies = appends(wal, data, args.seconds, keep, until)
        elapsed, after = time.perf_counter() - t0, wal.stats()
        stop.set()
        if thread:
            thread.join()
        persist, segment_size = wal.persist_method, wal.segment_size
        # the pace of fresh segments now, beside this WAL; on a VM that hands free memory
        # back to its host, it depends on what the guest touched lately (docs/PERFORMANCE.md,
        # "Reading the figures")
        fresh = (fresh_segment_rate(os.path.dirname(path), wal.segment_size, wal.mode)
                 if case == "never" else None)
    # how late the checkpointer came: the longest gap between its truncations while
    # measured, in time and in WAL bytes (what the spare pool must cover)
    late = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:]) if a[0] >= t0]
    # the CPU time its truncations took (Python with the GIL, and system calls without),
    # per second measured: what it can take from the appender at most
    cpu = sum(m[2] for m in marks if m[0] >= t0) / elapsed
    moved = {k: after[f"segments_{k}"] - before[f"segments_{k}"]
             for k in ("created", "removed", "recycled")}
    made_ns = after["segment_make_ns"] - before["segment_make_ns"]  # making them, in this run
    return {"case": case, "persist": persist, "rate": len(latencies) / elapsed,
            "bytes_per_s": len(latencies) * args.size / elapsed,
            "p999_ms": np.percentile(latencies, 99.9) * 1e3, "max_ms": latencies.max() * 1e3,
            "cpu_ms": cpu * 1e3 if late else None,
            "gap_ms": max(g for g, _ in late) * 1e3 if late else None,
            "gap_mib": max(d for _, d in late) / (1 << 20) if late else None,
            "bg_cpu": background_share(before, after, elapsed),
            "fresh": fresh, "made": moved["created"] * segment_size / made_ns * 1e9 if made_ns else None,
            **moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--mode", default="direct")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=0.02, help="the checkpointer's period (s)")
    parser.add_argument("--keep", type=int, default=256 << 20, help="inline: bytes kept behind")
    parser.add_argument("--warm-up", type=float, default=1.0)
    parser.add_argument("--max-wal-size", type=lambda v: int(float(v) * (1 << 30)), default=1 << 30,
                        help="GiB: the WAL's max_wal_size (retained and recycled segments)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--grow", type=lambda v: int(float(v) * (1 << 30)), default=3 << 29,
                        help="GiB the never-truncated case grows at most (its warm-up: a tenth)")
    parser.add_argument("--preallocate", type=lambda v: int(float(v) * (1 << 30)), default=6 << 30,
                        help="GiB made ready in the preallocated case, which stops at 90 %% of it")
    args = parser.parse_args()
    cases = args.cases.split(",")
    print_cpu()
    results = [run_case(case, args) for case in cases]
    base = next((r["rate"] for r in results if r["case"] == "inline"), None)
    fresh = next((r["fresh"] for r in results if r["fresh"]), None)
    print(f"{args.mode}, {args.size:,} B records, flush each, checkpointer every "
          f"{args.interval * 1e3:g} ms" + (f"; fresh segments at {fresh / 1e9:.2f} GB/s" if fresh else ""))
    print("| case | records/s | / inline | MB/s | / fresh | / made | p99.9 ms | max ms "
          "| created | removed | recycled | longest gap: ms, MiB | truncation CPU ms/s | bg CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['rate'] / base:.2f}" if base else "-"
        vs_fresh, vs_made = (f"{r['bytes_per_s'] / r[k]:.2f}" if r[k] and r["case"] == "never"
                             else "-" for k in ("fresh", "made"))
        print(f"| {r['case']} ({r['persist']}) | {r['rate'] / 1e3:,.1f} k | {ratio} | "
              f"{r['bytes_per_s'] / 1e6:,.0f} | {vs_fresh} | {vs_made} | {r['p999_ms']:.2f} | "
              f"{r['max_ms']:.1f} | "
              f"{r['created']} | {r['removed']} | {r['recycled']} | "
              + (f"{r['gap_ms']:.0f}, {r['gap_mib']:.0f} | {r['cpu_ms']:.1f} |" if r["gap_ms"]
                 else "- | - |") + f" {share_text(r['bg_cpu'])} |")


if __name__ == "__main__":
    main()
