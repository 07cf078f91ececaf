"""A WAL that is never truncated, against the pace at which this machine makes segments.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/growth.py [--size 65536] [--gib 1]
        [--paces 0.25,0.5] [--mode direct] [--rounds 1]

A log that keeps everything makes a fresh segment for every 16 MiB it grows.  The most it can
grow by is the rate at which this machine makes them: a file allocated, mapped and every page
faulted in (``fresh``, measured here by making ``--gib`` of them one after another).  On a VM
that hands free memory back to its host that rate moves by 2-5x with what the guest touched
lately (docs/PERFORMANCE.md, "Reading the figures"), so each case is measured between two
fresh runs of its own, and everything made stays held until the round ends: both sides draw on
memory in the same state.

The cases, one thread appending ``--size`` records with ``append(data, flush=True)``:

- ``flat out``: as fast as it can, ``--gib`` of them; bytes/s against the fresh rate;
- ``paced P``: at P times the fresh rate measured just before (a writer slower than the
  machine): the share of that pace it keeps, and the p99.9 and max time of one append.

Beside each case, the background writer's CPU share while it appended (its CPU time over
the case's wall time, of one core): the writer that makes the segments ahead.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import pmemwal
from common import background_share, markdown_table, print_cpu, scratch_dir, share_text
from pmemwal.segments import Segment, WalDirectory


class FreshSegments:
    """Segments made one after another in ``path`` as a direct-mode WAL makes them, and
    held (mapped) until ``close()``."""

    def __init__(self, path: str, segment_size: int) -> None:
        self._dir = WalDirectory(path, create=True)
        self._size = segment_size
        self._held: list[Segment] = []

    def make(self, nbytes: int) -> float:
        """Make ``nbytes`` of segments; bytes/s."""
        count = max(1, nbytes // self._size)
        t0 = time.perf_counter()
        for _ in range(count):
            segno = len(self._held)
            self._dir.create(segno, self._size, bytes(16))
            segment = Segment(self._dir.file(segno), segno, self._size, writable=True)
            segment.mapping(populate=True)
            self._held.append(segment)
        return count * self._size / (time.perf_counter() - t0)

    def close(self) -> None:
        for segment in self._held:
            segment.close()
        self._dir.close()


def grow(wal: pmemwal.WAL, data: bytes, nbytes: int, pace: float | None) -> dict:
    """Append ``nbytes`` of ``data`` records, at ``pace`` bytes/s (None: flat out)."""
    clock, append, size = time.perf_counter, wal.append, len(data)
    count = nbytes // size
    latencies = np.empty(count)
    before, start = wal.stats(), clock()
    interval = size / pace if pace else 0.0
    for i in range(count):
        if pace:
            ahead = start + i * interval - clock()
            if ahead > 0.001:  # sleeps are coarse: catch up in a burst, ahead by at most 1 ms
                time.sleep(ahead)
        t0 = clock()
        append(data, True)
        latencies[i] = clock() - t0
    elapsed = clock() - start
    stats = wal.stats()
    return {"bytes_per_s": count * size / elapsed, "p999_ms": np.percentile(latencies, 99.9) * 1e3,
            "max_ms": latencies.max() * 1e3, "created": stats["segments_created"],
            "waits": stats.get("segment_waits", 0),
            "bg_cpu": background_share(before, stats, elapsed)}


def run_round(args: argparse.Namespace, root: str) -> list[list[object]]:
    rows, held = [], []
    data = os.urandom(args.size)
    try:
        for case in ["flat out"] + [f"paced {p:g}" for p in args.paces]:
            fresh = FreshSegments(os.path.join(root, f"fresh-{len(held)}"), args.segment_size)
            held.append(fresh)
            before = fresh.make(args.gib)
            pace = float(case.split()[1]) * before if case.startswith("paced") else None
            wal = pmemwal.open(os.path.join(root, f"wal-{len(held)}"), mode=args.mode,
                               segment_size=args.segment_size, max_wal_size=8 * args.gib)
            held.append(wal)
            result = grow(wal, data, args.gib, pace)
            after = fresh.make(args.gib)
            ceiling = (before + after) / 2
            share = result["bytes_per_s"] / (pace or ceiling)
            rows.append([case, f"{ceiling / 1e9:.2f} ({before / 1e9:.2f}/{after / 1e9:.2f})",
                         f"{result['bytes_per_s'] / 1e9:.2f}", f"**{share:.2f}**",
                         f"{result['p999_ms']:.3f}", f"{result['max_ms']:.2f}", result["created"],
                         share_text(result["bg_cpu"])])
            print(markdown_table(HEADER, rows[-1:]).splitlines()[-1], flush=True)
    finally:
        for thing in reversed(held):
            thing.close()
    return rows


HEADER = ["case", "fresh GB/s (before/after)", "WAL GB/s", "/ fresh or / pace", "p99.9 ms",
          "max ms", "segments made", "bg CPU"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--mode", default="direct")
    parser.add_argument("--segment-size", type=int, default=16 << 20)
    parser.add_argument("--gib", type=lambda v: int(float(v) * (1 << 30)), default=1 << 30,
                        help="GiB each case appends, and each fresh measurement makes")
    parser.add_argument("--paces", type=lambda v: [float(p) for p in v.split(",")],
                        default=[0.25, 0.5], help="paced cases, as shares of the fresh rate")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print_cpu()
    print(f"{args.mode}, {args.size:,} B records, flush each, {args.segment_size >> 20} MiB segments, "
          f"{args.gib / (1 << 30):g} GiB a case")
    print(markdown_table(HEADER, []).split("\n", 2)[0] + "\n|" + "---|" * len(HEADER))
    for _ in range(args.rounds):
        with scratch_dir("pmemwal-growth-") as root:
            run_round(args, root)


if __name__ == "__main__":
    main()
