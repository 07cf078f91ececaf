"""How long pmemwal.Log takes to open when it rebuilds its index by one scan, per GiB of retained log.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/log_open.py [--gib 1] [--sizes 64,1k,16k]

For each entry size, a log of about ``--gib`` GiB is written once (append_many in batches,
direct mode, 64 MiB segments), then opened ``--rounds`` times; the median open is reported
as seconds per GiB and entries per second, beside a plain ``WAL.open`` of the same directory
(its own recovery scan, which the Log's open includes) and a Python loop over
``WAL.records()`` (what an index rebuilt without native batches would cost).  The Log's stored
index (``index/``) is removed before each open, so that every open rebuilds it: the cost of a
log with no usable index.  benchmarks/open_time.py measures the open through the index.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

import pmemwal
from common import human, markdown_table, scratch_dir

SEGMENT = 64 << 20
GIB = 1 << 30


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def fill(path: str, size: int, total: int) -> int:
    """Write entries of ``size`` bytes until about ``total`` WAL bytes; returns the count."""
    batch = [bytes(size)] * max(1, (1 << 20) // (size + 48))
    with pmemwal.open_log(path, mode="direct", segment_size=SEGMENT) as log:
        while log.wal.insert_lsn < total:
            log.append_many(batch, term=1)
        return len(log)


def timed(fn) -> float:
    """Seconds ``fn`` takes, or what it returns when it times itself."""
    start = time.perf_counter()
    own = fn()
    return own if own is not None else time.perf_counter() - start


def open_log(path: str) -> float:
    """The open alone: its close then stores the whole index, which is not what is timed."""
    shutil.rmtree(os.path.join(path, "index"), ignore_errors=True)  # rebuilt: see the docstring
    start = time.perf_counter()
    log = pmemwal.open_log(path, mode="direct")
    elapsed = time.perf_counter() - start
    log.close()
    return elapsed


def open_wal(path: str) -> None:
    pmemwal.open(path, mode="direct").close()


def python_scan(path: str) -> None:
    with pmemwal.open(path, mode="direct") as wal:
        for rec in wal.records():
            rec.payload[:24]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--sizes", default="64,1k,16k")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        with scratch_dir() as path:
            count = fill(path, size, int(args.gib * GIB))
            with pmemwal.open(path, mode="direct") as wal:
                gib = (wal.insert_lsn - wal.first_lsn) / GIB
            med = {name: statistics.median(timed(lambda: fn(path)) for _ in range(args.rounds))
                   for name, fn in (("log", open_log), ("wal", open_wal), ("py", python_scan))}
            rows.append([size, human(count), f"{gib:.2f}", f"{med['wal'] / gib:.2f}",
                         f"{med['log'] / gib:.2f}", human(count / med["log"]),
                         f"{med['py'] / gib:.2f}", f"{med['py'] / med['log']:.1f}"])
    print(markdown_table(["entry bytes", "entries", "GiB", "WAL.open s/GiB", "Log open s/GiB",
                          "Log open entries/s", "Python loop s/GiB", "loop / Log"], rows))


if __name__ == "__main__":
    main()
