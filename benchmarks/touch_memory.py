"""How fast this machine hands out memory it has not touched lately (docs/PERFORMANCE.md,
"Reading the figures").

Maps GIB GiB of anonymous memory and faults it in 1 GiB at a time (``MADV_POPULATE_WRITE``,
as pmemwal pre-faults segments), three times: at once, again right after unmapping the first
(the guest's free pages still backed by the host), and again after a pause.  On a VM whose
balloon device reports free pages to the host (virtio-balloon free page reporting), memory left
free for a few seconds goes back to the host, and touching it again costs host page faults:
the first and third passes then run several times slower than the second.  Making a fresh WAL
segment is mostly this, so its pace depends on what the guest touched lately.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import time

_MADV_POPULATE_WRITE = 23  # Linux 5.14
_GIB = 1 << 30


def touch_pass(gib: int) -> list[float]:
    """GiB/s for each GiB of a fresh anonymous mapping of ``gib`` GiB, faulted in."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    area = mmap.mmap(-1, gib * _GIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    rates = []
    try:
        for i in range(gib):
            t0 = time.perf_counter()
            if libc.madvise(base + i * _GIB, _GIB, _MADV_POPULATE_WRITE) != 0:
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
            rates.append(1 / (time.perf_counter() - t0))
    finally:
        del base
        area.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, default=4, help="GiB mapped each pass")
    parser.add_argument("--pause", type=float, default=20.0,
                        help="seconds left free before the third pass")
    args = parser.parse_args()
    for name, pause in (("first", 0.0), ("right after", 0.0), (f"after {args.pause:g} s", args.pause)):
        time.sleep(pause)
        rates = touch_pass(args.gib)
        print(f"{name:>14}: " + " ".join(f"{r:.2f}" for r in rates) + " GiB/s per GiB")


if __name__ == "__main__":
    main()
