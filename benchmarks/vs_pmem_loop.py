"""Direct mode against a hand-written pmem_memcpy_persist loop, flush after every record.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/vs_pmem_loop.py [--seconds 2] [--rounds 3]

The loop (benchmarks/pmem_loop.c, compiled here) copies each record into a
mapped, pre-faulted file with libpmem's pmem_memcpy_persist: no header, no
CRC, no Python: the ceiling of what a durable append can cost.  pmemwal does
the same work plus a record header, CRC32C and a Python call per record.
Rounds alternate; medians are reported with the ratio (target: 0.6 at 8 KiB,
0.7 at 64 KiB).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess

from common import build_pmem_loop, human, markdown_table, scratch_dir
from modes import commit_rate

SIZES = [64, 8 << 10, 64 << 10, 256 << 10, 1 << 20]
TARGET = {8 << 10: 0.6, 64 << 10: 0.7}


def loop_rate(binary, size: int, seconds: float) -> float:
    with scratch_dir() as path:
        out = subprocess.run([str(binary), os.path.join(path, "loop"), str(size), str(seconds)],
                             check=True, capture_output=True, text=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    binary = build_pmem_loop()
    rows = []
    for size in SIZES:
        loop, wal = [], []
        for _ in range(args.rounds):
            loop.append(loop_rate(binary, size, args.seconds))
            value, method = commit_rate("direct", size, args.seconds)
            wal.append(value)
        lo, wa = statistics.median(loop), statistics.median(wal)
        target = TARGET.get(size)
        rows.append([f"{size:,} B", human(lo), f"{human(wa)} ({method})", f"{wa / lo:.2f}",
                     f"{target}" if target else ""])
        print(rows[-1], flush=True)
    print(markdown_table(["record", "pmem_memcpy_persist loop (C)", "pmemwal direct, flush each",
                          "ratio", "target"], rows))


if __name__ == "__main__":
    main()
