"""Direct against buffered mode: records/s with a flush after every record.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/modes.py [--seconds 2] [--rounds 3]

One client, records of 64 B, 8 KiB, 64 KiB and 1 MiB, each committed with
``append(data, flush=True)``; the modes alternate round by round in one run
(the machine is shared and noisy) and the median round is reported, with the
direct/buffered ratio and the background writer's CPU share in each mode (its CPU
time over the measured window, a fraction of one core).  The WAL is truncated behind
the writer, so the run uses recycled, pre-faulted segments as a long-running log would.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from contextlib import contextmanager
from typing import Iterator

import pmemwal
from common import (human, markdown_table, print_cpu, rate, rate_and_background, scratch_dir,
                    share_text)

SIZES = [64, 8 << 10, 64 << 10, 1 << 20]
KEEP = 64 << 20


def commit_rate(mode: str, size: int, seconds: float,
                checkpointer: float | None = None) -> tuple[float, str, float]:
    """Records/s of append(flush=True) in ``mode``; the persist method used; the background
    writer's CPU share over the measured window.  The appender truncates behind itself, or
    with ``checkpointer`` a thread does, every that many seconds, to the flushed LSN of its
    previous round (PostgreSQL's arrangement: backends never recycle)."""
    data = os.urandom(size)
    with scratch_dir() as path, pmemwal.open(path, mode=mode, recycle_segments=8) as wal, \
            _checkpointing(wal, checkpointer):
        batch = max(1, (1 << 20) // size)

        def step() -> int:
            for _ in range(batch):
                wal.append(data, flush=True)
            if checkpointer is None and wal.flushed_lsn - wal.first_lsn > KEEP:
                wal.truncate(wal.flushed_lsn - KEEP // 2)
            return batch

        # warm-up: segments created, mapped, then recycled; a checkpointer's spare pool grows
        # with the distance between its truncations, over its first second or so
        rate(step, 0.3 if checkpointer is None else 1.5)
        value, share = rate_and_background(wal, step, seconds)
        return value, wal.persist_method, share


@contextmanager
def _checkpointing(wal: pmemwal.WAL, interval: float | None) -> Iterator[None]:
    """A thread truncating ``wal`` every ``interval`` seconds while the block runs (none:
    nothing)."""
    if interval is None:
        yield
        return
    stop = threading.Event()

    def run() -> None:
        redo = wal.flushed_lsn
        while not stop.wait(interval):
            wal.truncate(redo)
            redo = wal.flushed_lsn

    thread = threading.Thread(target=run, name="checkpointer")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print_cpu()
    rows = []
    for size in SIZES:
        runs: dict[str, list[float]] = {"buffered": [], "direct": []}
        shares: dict[str, list[float]] = {"buffered": [], "direct": []}
        methods = {}
        for _ in range(args.rounds):
            for mode in runs:
                value, methods[mode], share = commit_rate(mode, size, args.seconds)
                runs[mode].append(value)
                shares[mode].append(share)
        b, d = (statistics.median(runs[m]) for m in ("buffered", "direct"))
        rows.append([human_size(size), f"{human(b)} ({methods['buffered']})",
                     f"{human(d)} ({methods['direct']})", f"{d / b:.2f}",
                     share_text(*(statistics.median(shares[m]) for m in ("buffered", "direct")))])
        print(rows[-1], flush=True)
    print(markdown_table(["record", "buffered rec/s", "direct rec/s", "direct / buffered",
                          "bg CPU (buffered / direct)"], rows))


def human_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


if __name__ == "__main__":
    main()
