"""append_many of small records against a bare Python loop of mmap slice assignments.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/batch.py [--seconds 1] [--rounds 3] [--size 64]

The baseline is the cheapest way to put records into memory from Python: a
loop ``m[off:off + 64] = rec`` over a prebuilt list of 64-byte ``bytes``,
into an anonymous 64 MiB ``mmap`` (no header, no CRC, nothing made durable).
pmemwal is ``wal.append_many(batch)`` over prebuilt batches of 1,000 and
10,000 records, in both modes, with ``wal.flush()`` after each batch in one
variant and with no flush at all in the other (the background writer then
flushes every 50 ms).  Rounds alternate between all variants in one run (the
machine is shared and noisy); the median round is reported as records/s,
ns per record and the ratio to the loop (target: at least 1.0), with the background
writer's CPU share (its CPU time over the measured window, of one core).
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from typing import Callable

import pmemwal
from common import (human, markdown_table, print_cpu, rate, rate_and_background, scratch_dir,
                    share_text)

KEEP = 64 << 20
MAP_SIZE = 64 << 20
BATCHES = [1000, 10000]
MODES = ["buffered", "direct"]


def make_records(count: int, size: int) -> list[bytes]:
    """``count`` distinct ``bytes`` objects of ``size`` bytes (the same for every variant)."""
    return [os.urandom(size) for _ in range(count)]


def mmap_rate(records: list[bytes], size: int, seconds: float) -> float:
    """Records/s of a Python loop assigning each record to the next slice of an anonymous mmap."""
    m = mmap.mmap(-1, MAP_SIZE)
    span = len(records) * size
    state = [0]

    def step() -> int:
        off = state[0]
        if off + span > MAP_SIZE:
            off = 0
        for rec in records:
            m[off:off + size] = rec
            off += size
        state[0] = off
        return len(records)

    try:
        rate(step, 0.2)  # warm-up: the anonymous pages faulted in
        return rate(step, seconds)
    finally:
        m.close()


def wal_rate(mode: str, records: list[bytes], flush: bool,
             seconds: float) -> tuple[float, str, float]:
    """Records/s of wal.append_many(records) (then wal.flush() if ``flush``); the persist
    method; the background writer's CPU share."""
    with scratch_dir() as path, pmemwal.open(path, mode=mode, recycle_segments=8) as wal:
        n = len(records)

        def step() -> int:
            wal.append_many(records)
            if flush:
                wal.flush()
            if wal.flushed_lsn - wal.first_lsn > KEEP:
                wal.truncate(wal.flushed_lsn - KEEP // 2)
            return n

        rate(step, 0.3)  # warm-up: segments created, mapped, then recycled
        value, share = rate_and_background(wal, step, seconds)
        return value, wal.persist_method, share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=64, help="record payload bytes (default 64)")
    args = parser.parse_args()
    print_cpu()

    lists = {n: make_records(n, args.size) for n in BATCHES}
    # every variant of one round runs back to back, so a noisy moment hits them all alike
    variants: dict[str, Callable[[], float]] = {}
    for n in BATCHES:
        variants[f"mmap loop|{n}"] = lambda n=n: mmap_rate(lists[n], args.size, args.seconds)
    methods: dict[str, str] = {}
    shares: dict[str, list[float]] = {}
    for mode in MODES:
        for n in BATCHES:
            for flush in (True, False):
                key = f"{mode}|{n}|{flush}"

                def run(mode=mode, n=n, flush=flush, key=key) -> float:
                    value, methods[key], share = wal_rate(mode, lists[n], flush, args.seconds)
                    shares.setdefault(key, []).append(share)
                    return value
                variants[key] = run

    runs: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for key, fn in variants.items():
            t0 = time.perf_counter()
            runs[key].append(fn())
            print(f"round {r + 1}/{args.rounds} {key}: {human(runs[key][-1])} rec/s "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}

    loop_rows = []
    for n in BATCHES:
        v = med[f"mmap loop|{n}"]
        loop_rows.append([f"mmap slice loop, list of {n:,}", human(v), f"{1e9 / v:.0f}"])
    baseline = max(med[f"mmap loop|{n}"] for n in BATCHES)
    rows = []
    for mode in MODES:
        for n in BATCHES:
            for flush in (True, False):
                key = f"{mode}|{n}|{flush}"
                v = med[key]
                rows.append([f"{mode} ({methods[key]})", f"{n:,}",
                             "after each batch" if flush else "none (background)",
                             human(v), f"{1e9 / v:.0f}", f"{v / baseline:.2f}",
                             share_text(statistics.median(shares[key]))])

    print(f"\n{args.size}-byte records, median of {args.rounds} rounds of {args.seconds} s\n")
    print(markdown_table(["baseline", "rec/s", "ns/record"], loop_rows))
    print()
    print(markdown_table(["pmemwal append_many", "batch", "flush", "rec/s", "ns/record",
                          "ratio to mmap loop (target >= 1)", "bg CPU"], rows))
    print(f"\n(ratio: against the faster of the two mmap loops, {human(baseline)} rec/s)")


if __name__ == "__main__":
    main()
