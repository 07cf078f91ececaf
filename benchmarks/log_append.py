"""What the log layer costs on top of the WAL: Log.append against WAL.append, in one run.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/log_append.py [--seconds 1] [--rounds 3]

For each payload size, one thread appends either with ``sync`` per entry (a Raft node's
pattern: durable before acknowledging) or without (the background writer flushes), to a
``pmemwal.Log`` and to a bare ``pmemwal.WAL`` (direct mode, 64 MiB segments, truncated behind as
the bench does, and the log compacted as often, so segment creation is out of the picture).  Rounds alternate between the
variants; the median round is reported as appends/s and the Log / WAL ratio, with the
background writer's CPU share in each (its CPU time over the measured window, of one core).
"""

from __future__ import annotations

import argparse
import os
import statistics

import pmemwal
from common import human, markdown_table, print_cpu, rate_and_background, scratch_dir, share_text

SEGMENT = 64 << 20
KEEP = 256 << 20
BATCH = 1000


def wal_rate(path: str, payload: bytes, sync: bool, seconds: float) -> tuple[float, float]:
    """WAL.append/s; the background writer's CPU share."""
    with pmemwal.open(path, mode="direct", segment_size=SEGMENT) as wal:
        def step() -> int:
            for _ in range(BATCH):
                lsn = wal.append(payload, sync)
            if lsn > KEEP:
                wal.truncate(lsn - KEEP)
            return BATCH
        return rate_and_background(wal, step, seconds)


def log_rate(path: str, payload: bytes, sync: bool, seconds: float) -> tuple[float, float]:
    """Log.append/s; its WAL's background writer's CPU share."""
    with pmemwal.open_log(path, mode="direct", segment_size=SEGMENT) as log:
        def step() -> int:
            for _ in range(BATCH):
                index = log.append(payload, 1, sync=sync)
            log.compact(index - KEEP // (len(payload) + 48))  # as the WAL variant truncates
            return BATCH
        return rate_and_background(log.wal, step, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="64,1024,16384")
    args = ap.parse_args()
    print_cpu()
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        payload = os.urandom(size)
        for sync in (True, False):
            got: dict[str, list[tuple[float, float]]] = {"wal": [], "log": []}
            for _ in range(args.rounds):
                for name, fn in (("wal", wal_rate), ("log", log_rate)):
                    with scratch_dir() as path:
                        got[name].append(fn(path, payload, sync, args.seconds))
            wal, log = (statistics.median(r for r, _ in got[k]) for k in ("wal", "log"))
            bg = share_text(*(statistics.median(s for _, s in got[k]) for k in ("wal", "log")))
            rows.append([size, "each" if sync else "background", human(wal), human(log),
                         f"{log / wal:.2f}", bg])
    print(markdown_table(["payload bytes", "sync", "WAL.append/s", "Log.append/s", "Log / WAL",
                          "bg CPU (WAL / Log)"], rows))


if __name__ == "__main__":
    main()
