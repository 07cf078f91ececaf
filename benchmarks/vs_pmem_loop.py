"""Direct mode against a hand-written pmem_memcpy_persist loop, flush after every record.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/vs_pmem_loop.py [--seconds 2] [--rounds 3]
        [--sizes 64,8k,64k,256k,1m]

Two hand-written loops copy each record into a mapped, pre-faulted file with
libpmem's pmem_memcpy_persist, with no header and no CRC: one in C
(benchmarks/pmem_loop.c, compiled here: the ceiling of what a durable append
can cost), one in Python through ctypes (what a Python program hand-rolls).
pmemwal does the same work plus a record header, CRC32C and one Python call
per record, and recycles its segments: the appender truncates behind itself, and
in a second run a checkpointer thread does, every 20 ms (PostgreSQL's arrangement).
Rounds alternate; medians are reported with the ratios (targets against the C
loop: 0.6 at 8 KiB, 0.9 at 64 KiB and 1 MiB), with the share of a core pmemwal's
background writer took beside each (bg CPU).
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

TARGET = {8 << 10: 0.6, 64 << 10: 0.9, 1 << 20: 0.9}
CHECKPOINTER = 0.02  # seconds between the checkpointer thread's truncations


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
        runs: dict[str, list[float]] = {k: [] for k in ("loop", "py", "wal", "bg", "ckpt", "ckpt_bg")}
        for _ in range(args.rounds):
            runs["loop"].append(loop_rate(binary, size, args.seconds))
            runs["py"].append(ctypes_loop_rate(size, args.seconds))
            value, method, share = commit_rate("direct", size, args.seconds)
            runs["wal"] += [value]
            runs["bg"] += [share]
            value, _, share = commit_rate("direct", size, args.seconds, checkpointer=CHECKPOINTER)
            runs["ckpt"] += [value]
            runs["ckpt_bg"] += [share]
        m = {k: statistics.median(v) for k, v in runs.items()}
        target = TARGET.get(size)
        rows.append([f"{size:,} B", human(m["loop"]), human(m["py"]), f"{human(m['wal'])} ({method})",
                     f"{m['wal'] / m['loop']:.2f}", f"{m['ckpt'] / m['loop']:.2f}",
                     f"{target}" if target else "", f"{m['wal'] / m['py']:.2f}",
                     share_text(m["bg"], m["ckpt_bg"])])
        print(rows[-1], flush=True)
    print(markdown_table(["record", "C loop", "Python ctypes loop", "pmemwal direct, flush each",
                          "pmemwal / C", "with a checkpointer thread / C", "target",
                          "pmemwal / ctypes", "bg CPU (inline / checkpointer)"], rows))


if __name__ == "__main__":
    main()
