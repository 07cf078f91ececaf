"""CRC32C alone and fused with a copy (cached and streaming), in GB/s, for each CPU path.

    .venv/bin/python benchmarks/crc.py [--seconds 0.1] [--rounds 3]

Each path (PMEMWAL_CPU=table|sse42|pclmul|avx2|avx512, fixed at load) runs in its own
child; paths this CPU lacks are left out.  Buffers of 256 B, 8 KiB, 64 KiB and 1 MiB,
the same source and destination over and over (so in cache, but for the streaming
copy's destination); the best of the rounds is reported, with the ratio to sse4.2.
``crc`` is crc32c over the buffer, ``copy`` crc32c_copy (what direct mode does),
``stream`` crc32c_copy_nt (direct mode on pmem) followed by one fence a call batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import markdown_table

PATHS = ["table", "sse42", "pclmul", "avx2", "avx512"]
SIZES = [256, 8 << 10, 64 << 10, 1 << 20]
OPS = {"crc": 0, "copy": 1, "stream": 2}


def label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB" if size >= 1024 else f"{size} B"


def child(seconds: float, rounds: int) -> None:
    """In the child: GB/s for each op and size, on the path PMEMWAL_CPU chose."""
    from pmemwal import _core

    out = {}
    for size in SIZES:
        src = os.urandom(size)
        dst = bytearray(size + 64)
        view = memoryview(dst)[:size]
        for op, how in OPS.items():
            repeat = 1
            while True:  # calibrate: a batch of about seconds/10
                t = time.perf_counter()
                _core._crc32c_copy(view, src, 0, how, repeat)
                if time.perf_counter() - t > seconds / 10:
                    break
                repeat *= 2
            best = 0.0
            for _ in range(rounds):
                done, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    _core._crc32c_copy(view, src, 0, how, repeat)
                    done += repeat
                best = max(best, done * size / (time.perf_counter() - start) / 1e9)
            out[f"{op}/{size}"] = best
    print(json.dumps({"impl": _core.CRC32C_IMPL, "rates": out}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.1, help="per round (default 0.1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.seconds, args.rounds)
        return
    results = {}
    for path in PATHS:
        env = {**os.environ, "PMEMWAL_CPU": path, "PMEMWAL_NO_CRC_HW": ""}
        proc = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(args.seconds),
                               "--rounds", str(args.rounds)], env=env, check=True,
                              capture_output=True, text=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        if res["impl"] in (r["impl"] for r in results.values()):
            print(f"{path}: not on this CPU (fell back to {res['impl']})", file=sys.stderr)
            continue
        results[path] = res
    base = results.get("sse42")
    rows = []
    for op in OPS:
        for size in SIZES:
            key = f"{op}/{size}"
            row = [op, label(size)]
            for path, res in results.items():
                r = res["rates"][key]
                ratio = f" ({r / base['rates'][key]:.2f}x)" if base else ""
                row.append(f"{r:.1f}{ratio}")
            rows.append(row)
    print(markdown_table(["op", "size", *(r["impl"] for r in results.values())], rows))
    print("\nGB/s, best of rounds; in brackets the ratio to sse4.2.")


if __name__ == "__main__":
    main()
