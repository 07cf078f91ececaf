"""Direct mode against a hand-written pmem_memcpy_persist loop, flush after every record.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/vs_pmem_loop.py [--seconds 2] [--rounds 3]
        [--sizes 64,8k,64k,256k,1m]

Two hand-written loops copy each record into a mapped, pre-faulted file with
libpmem's pmem_memcpy_persist, with no header and no CRC: one in C
(benchmarks/pmem_loop.c, compiled here: the ceiling of what a durable append
can cost), one in Python through ctypes (what a Python program hand-rolls).
pmemwal does the same work plus a record header, CRC32C and one Python call
per record.  Rounds alternate; medians are reported with the ratios (targets
against the C loop: 0.6 at 8 KiB, 0.7 at 64 KiB), with the share of a core pmemwal's
background writer took beside it (bg CPU).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess

from common import build_pmem_loop, human, markdown_table, print_cpu, rate, scratch_dir, share_text
from modes import commit_rate

from pmemwal.tools.harness.config import parse_sizes

TARGET = {8 << 10: 0.6, 64 << 10: 0.7}


def loop_rate(binary, size: int, seconds: float) -> float:
    with scratch_dir() as path:
        out = subprocess.run([str(binary), os.path.join(path, "loop"), str(size), str(seconds)],
                             check=True, capture_output=True, text=True)
    return float(out.stdout)


def ctypes_loop_rate(size: int, seconds: float) -> float:
    """The same loop in Python: pmem_memcpy_persist through ctypes, one call per record."""
    lib = ctypes.CDLL("libpmem.so.1")
    lib.pmem_memcpy_persist.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    lib.pmem_memcpy_persist.restype = ctypes.c_void_p
    span = 64 << 20
    src = ctypes.create_string_buffer(os.urandom(size), size)
    with scratch_dir() as path:
        fd = os.open(os.path.join(path, "loop"), os.O_RDWR | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, span)
        m = mmap.mmap(fd, span, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        copy, slots = lib.pmem_memcpy_persist, span // size
        offsets = [base + i * size for i in range(slots)]
        batch = min(slots, 256)
        position = [0]

        def step() -> int:
            start = position[0]
            for dst in offsets[start:start + batch]:
                copy(dst, src, size)
            position[0] = (start + batch) % (slots - batch + 1)
            return batch

        result = rate(step, seconds)
        del base
        os.close(fd)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="64,8k,64k,256k,1m", help="record sizes (k, m: KiB, MiB)")
    args = parser.parse_args()
    print_cpu()
    binary = build_pmem_loop()
    rows = []
    for size in parse_sizes(args.sizes):
        loop, py, wal, background = [], [], [], []
        for _ in range(args.rounds):
            loop.append(loop_rate(binary, size, args.seconds))
            py.append(ctypes_loop_rate(size, args.seconds))
            value, method, share = commit_rate("direct", size, args.seconds)
            wal.append(value)
            background.append(share)
        lo, pl, wa = (statistics.median(x) for x in (loop, py, wal))
        target = TARGET.get(size)
        rows.append([f"{size:,} B", human(lo), human(pl), f"{human(wa)} ({method})",
                     f"{wa / lo:.2f}", f"{target}" if target else "", f"{wa / pl:.2f}",
                     share_text(statistics.median(background))])
        print(rows[-1], flush=True)
    print(markdown_table(["record", "C loop", "Python ctypes loop", "pmemwal direct, flush each",
                          "pmemwal / C", "target", "pmemwal / ctypes", "pmemwal bg CPU"], rows))


if __name__ == "__main__":
    main()
