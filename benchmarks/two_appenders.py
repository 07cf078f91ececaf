"""Two appending threads against one, pmemwal and a raw pmem_memcpy_persist loop, in one run.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/two_appenders.py [--size 262144] [--seconds 1] [--rounds 3]

pmemwal: ``pmemwal bench``'s engine in direct mode, 16 MiB segments, flush after each
record, 1 and 2 clients.  The raw loop: each thread copies records with libpmem's
pmem_memcpy_persist (through ctypes, which gives the GIL up for the call) into its own
half of a mapped, pre-faulted 256 MiB file, wrapping around: no header, no CRC, no
segment ever made or recycled.  Rounds alternate; medians, and the ratios the project sets
targets on (two pmemwal threads >= 1.0x one, and >= 0.8x two raw threads), with the share
of a core pmemwal's background writer took in each (bg CPU).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import threading
import time

from common import print_cpu, scratch_dir, share_text
from pmemwal import libpmem
from pmemwal.tools.bench import BenchConfig, run

AREA = 256 << 20


def raw_rate(size: int, threads: int, seconds: float) -> float:
    """Records/s of ``threads`` threads each looping pmem_memcpy_persist over its own area."""
    lib = libpmem.load()
    if lib is None:
        raise SystemExit("libpmem is not installed (Debian package libpmem1)")
    copy = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_size_t)(lib.addr_memcpy_persist)
    with scratch_dir() as path:
        fd = os.open(os.path.join(path, "area"), os.O_RDWR | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, AREA)
        area = mmap.mmap(fd, AREA, mmap.MAP_SHARED | mmap.MAP_POPULATE)
        base = libpmem.buffer_address(area)
        source = ctypes.create_string_buffer(os.urandom(size), size)
        counts = [0] * threads
        start = threading.Barrier(threads + 1)
        deadline = [0.0]

        def loop(t: int) -> None:
            share = AREA // threads // size * size
            lo, off, n = base + t * (AREA // threads), 0, 0
            start.wait()
            while time.perf_counter() < deadline[0]:
                copy(lo + off, source, size)
                off = (off + size) % share
                n += 1
            counts[t] = n

        pool = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        t0 = time.perf_counter()
        deadline[0] = t0 + seconds
        start.wait()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - t0
        area.close()
        os.close(fd)
    return sum(counts) / elapsed


def pmemwal_rate(size: int, clients: int, seconds: float) -> tuple[float, float]:
    """Records/s of ``pmemwal bench``'s engine; its background writer's CPU share."""
    with scratch_dir() as path:
        config = BenchConfig(path=os.path.join(path, "wal"), mode="direct", clients=clients,
                             size=size, duration=seconds, flush="each", progress_interval=0)
        result = run(config)
        return result.records_per_s, result.background_cpu_share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256 << 10)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print_cpu()
    cells: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for threads in (1, 2):
            value, share = pmemwal_rate(args.size, threads, args.seconds)
            cells.setdefault(("pmemwal", threads), []).append(value)
            cells.setdefault(("bg CPU", threads), []).append(share)
            cells.setdefault(("raw", threads), []).append(raw_rate(args.size, threads, args.seconds))
    med = {k: statistics.median(v) for k, v in cells.items()}
    print(f"{args.size:,} B records, flush each, median of {args.rounds} rounds of {args.seconds:g} s")
    print("| | 1 thread | 2 threads | 2 / 1 | bg CPU (1 / 2 threads) |")
    print("|---|---|---|---|---|")
    for name in ("pmemwal", "raw"):
        one, two = med[(name, 1)], med[(name, 2)]
        bg = share_text(med[("bg CPU", 1)], med[("bg CPU", 2)]) if name == "pmemwal" else "-"
        print(f"| {name} | {one / 1e3:,.1f} k | {two / 1e3:,.1f} k | {two / one:.2f} | {bg} |")
    print(f"pmemwal / raw, 2 threads: {med[('pmemwal', 2)] / med[('raw', 2)]:.2f}; "
          f"1 thread: {med[('pmemwal', 1)] / med[('raw', 1)]:.2f}")


if __name__ == "__main__":
    main()
