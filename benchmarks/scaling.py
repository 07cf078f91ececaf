"""Commit throughput by clients x record size x mode x insertion slots, with the two wait times.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/scaling.py [--seconds 1.5] [--rounds 1] [--quick] [--all]

Each client is a thread appending one preallocated payload with
``append(data, flush=True)`` (commit every record) for ``--seconds``, after a
short warm-up; clients 1, 2, 4, 8, records of 64 B, 8 KiB, 64 KiB and
1 MiB, both modes, ``insert_slots`` 1, 8 and 64 (``--quick``: clients 1 and
4, 64 B to 64 KiB, slots 1 and 8).  From the ``stats()`` deltas over the
measured window it reports records/s, MB/s, the time insertions spent
acquiring an insertion slot (slot wait) and the time flushes spent waiting
for insertions in progress (insert wait), both summed over all clients, and
how many flush requests found their records already flushed by another
client (group commit: coalesced / flush requests), and the background writer's CPU
time over the window as a share of one core (bg CPU).

The tables follow the pgsql-hackers threads on WALBufMappingLock and
NUM_XLOGINSERT_LOCKS: throughput by clients x record size per configuration,
ratios between configurations, and TPS beside the two wait times.  For each
point the configurations compared (modes, slot counts) run back to back, so
that a noisy moment of the shared machine hits them alike; ``--rounds N``
repeats the grid and reports medians.  Progress goes to stderr.

Disk use is kept bounded as in modes.py: every 8 records a client (one at a
time) truncates the WAL to 32 MiB behind the flushed LSN once it holds more
than 64 MiB (two 16 MiB segments at a time, both recycled), and the warm-up
lasts until this has begun (up to 2.1 s), so that the writers run on
recycled, pre-faulted segments when measured.  A client that fails (before
commit 1cbc0a8 a truncation often raced with another client's stale segment
request and failed its append with ENOENT; it was seen once since) is
reported on stderr and at the end of the output, and the point is measured
again (three tries in all).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import pmemwal
from common import background_share, human, markdown_table, print_cpu, scratch_dir, share_text

KEEP = 64 << 20   # as modes.py: past this many bytes, truncate to KEEP // 2 behind the flushed LSN
ATTEMPTS = 3      # tries per point when a client fails (the truncation race)
WARMUP = 0.3      # seconds of a warm-up window; up to 1 + WARMUP_MORE of them before measuring
WARMUP_MORE = 6
MODES = ["buffered", "direct"]


def size_name(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def point(mode: str, slots: int, clients: int, size: int, seconds: float) -> dict[str, float]:
    """One measurement: ``clients`` threads committing ``size``-byte records for ``seconds``."""
    data = os.urandom(size)
    with scratch_dir() as path, pmemwal.open(path, mode=mode, insert_slots=slots,
                                             recycle_segments=8) as wal:
        stop = threading.Event()
        cutting = threading.Lock()  # one client at a time keeps the disk use bounded
        gate = threading.Barrier(clients + 1)
        errors: list[BaseException] = []

        def client() -> None:
            append, n = wal.append, 0
            gate.wait()
            try:
                while not stop.is_set():
                    append(data, True)
                    n += 1
                    if n & 7 == 0 and cutting.acquire(blocking=False):
                        try:
                            keep_bounded()
                        finally:
                            cutting.release()
            except Exception as exc:  # reported with the point, never silently dropped
                errors.append(exc)
                stop.set()

        def keep_bounded() -> None:
            """As modes.py: a couple of segments at a time, all of them recycled."""
            flushed = wal.flushed_lsn
            if flushed - wal.first_lsn > KEEP:
                wal.truncate(flushed - KEEP // 2)

        def window(length: float) -> tuple[dict[str, int], dict[str, int], float]:
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            before = wal.stats()
            t0 = time.perf_counter()
            gate.wait()
            stop.wait(length)  # wakes early only when a client fails
            stop.set()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            if errors:
                raise RuntimeError(f"{mode} slots={slots} clients={clients} {size_name(size)}: "
                                   f"a client failed: {errors[0]!r}") from errors[0]
            after = wal.stats()
            stop.clear()
            gate.reset()
            return before, after, elapsed

        # warm-up: segments created and mapped, until truncation has begun to recycle them
        # (unless the log grows too slowly to get there soon)
        window(WARMUP)
        for _ in range(WARMUP_MORE):
            if wal.stats()["segments_recycled"] or wal.flushed_lsn - wal.first_lsn < KEEP // 4:
                break
            window(WARMUP)
        warm = wal.stats()["segments_recycled"] > 0
        before, after, elapsed = window(seconds)
        method = wal.persist_method
    d = {k: after[k] - before[k] for k in ("records", "bytes", "slot_wait_ns", "insert_wait_ns",
                                          "flush_requests", "coalesced", "flushes",
                                          "segments_created", "segments_recycled")}
    return {"rec_s": d["records"] / elapsed, "mb_s": d["records"] * size / elapsed / 1e6,
            "slot_ms": d["slot_wait_ns"] / 1e6, "insert_ms": d["insert_wait_ns"] / 1e6,
            "requests": d["flush_requests"], "coalesced": d["coalesced"],
            "flushes": d["flushes"], "elapsed": elapsed, "method": method,
            "created": d["segments_created"], "recycled": d["segments_recycled"], "warm": warm,
            "bg_cpu": background_share(before, after, elapsed)}


def measure(mode: str, slots: int, clients: int, size: int, seconds: float,
            failures: list[str]) -> dict[str, float]:
    """point(), measured again (up to ATTEMPTS in all) when a client fails; NaNs if all do."""
    for _ in range(ATTEMPTS):
        try:
            return point(mode, slots, clients, size, seconds)
        except RuntimeError as exc:  # the truncation race (see the docstring): say so, retry
            failures.append(str(exc))
            print(f"FAILED: {exc}", file=sys.stderr, flush=True)
    nan = float("nan")
    return dict.fromkeys(("rec_s", "mb_s", "slot_ms", "insert_ms", "requests", "coalesced",
                          "flushes", "elapsed", "created", "recycled", "bg_cpu"), nan) \
        | {"method": "?"}


def pct(a: float, b: float) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="clients 1,4; 64 B..64 KiB; slots 1,8")
    parser.add_argument("--all", action="store_true", help="also print every point in one table")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    clients_list = [1, 4] if args.quick else [1, 2, 4, 8]
    sizes = [64, 8 << 10, 64 << 10] if args.quick else [64, 8 << 10, 64 << 10, 1 << 20]
    slot_list = [1, 8] if args.quick else [1, 8, 64]
    modes = args.modes.split(",")
    wait_size = 8 << 10
    print_cpu()

    raw: dict[tuple, list[dict]] = {}
    total = args.rounds * len(sizes) * len(clients_list) * len(modes) * len(slot_list)
    done, started = 0, time.perf_counter()
    failures: list[str] = []
    for r in range(args.rounds):
        for size in sizes:
            for clients in clients_list:
                for mode in modes:
                    for slots in slot_list:
                        p = measure(mode, slots, clients, size, args.seconds, failures)
                        raw.setdefault((mode, slots, clients, size), []).append(p)
                        done += 1
                        print(f"[{done}/{total} {time.perf_counter() - started:.0f}s] round {r + 1} "
                              f"{mode} slots={slots} clients={clients} {size_name(size)}: "
                              f"{human(p['rec_s'])} rec/s, {p['mb_s']:.0f} MB/s, "
                              f"slot wait {p['slot_ms']:.1f} ms, insert wait {p['insert_ms']:.1f} ms, "
                              f"coalesced {p['coalesced']}/{p['requests']}, "
                              f"segments new/recycled {p['created']}/{p['recycled']}, "
                              f"bg CPU {share_text(p['bg_cpu'])}",
                              file=sys.stderr, flush=True)

    def med(key: tuple, field: str) -> float:
        return statistics.median(p[field] for p in raw[key])

    method = {m: raw[(m, slot_list[0], clients_list[0], sizes[0])][0]["method"] for m in modes}
    header = ["clients"] + [size_name(s) for s in sizes]
    bg_header = header + [f"bg CPU ({' / '.join(size_name(s) for s in sizes)})"]
    out = [f"records/s, append(data, flush=True) in every client, {args.seconds} s per point, "
           f"median of {args.rounds} round(s); {os.cpu_count()} CPUs; MB/s in the full table"]

    for mode in modes:
        for slots in slot_list:
            rows = [[c] + [human(med((mode, slots, c, s), "rec_s")) for s in sizes]
                    + [share_text(*(med((mode, slots, c, s), "bg_cpu") for s in sizes))]
                    for c in clients_list]
            out += [f"\n### {mode} ({method[mode]}), insert_slots={slots}: records/s\n",
                    markdown_table(bg_header, rows)]

    for mode in modes:
        for a, b in zip(slot_list[1:], slot_list):
            rows = [[c] + [pct(med((mode, a, c, s), "rec_s"), med((mode, b, c, s), "rec_s"))
                           for s in sizes] for c in clients_list]
            out += [f"\n### {mode}: insert_slots={a} relative to insert_slots={b}\n",
                    markdown_table(header, rows)]
    if len(modes) == 2:
        mid = 8 if 8 in slot_list else slot_list[-1]
        rows = [[c] + [pct(med((modes[1], mid, c, s), "rec_s"), med((modes[0], mid, c, s), "rec_s"))
                       for s in sizes] for c in clients_list]
        out += [f"\n### {modes[1]} relative to {modes[0]}, insert_slots={mid}\n",
                markdown_table(header, rows)]

    rows = []
    for mode in modes:
        for slots in slot_list:
            for c in clients_list:
                k = (mode, slots, c, wait_size)
                rows.append([mode, slots, c, human(med(k, "rec_s")), f"{med(k, 'slot_ms'):.1f}",
                             f"{med(k, 'insert_ms'):.1f}",
                             f"{med(k, 'coalesced'):.0f} / {med(k, 'requests'):.0f}",
                             share_text(med(k, "bg_cpu"))])
    out += [f"\n### wait times at {size_name(wait_size)} (ms summed over clients, per "
            f"{args.seconds} s window)\n",
            markdown_table(["mode", "insert_slots", "clients", "rec/s", "slot wait ms",
                            "insert wait ms", "coalesced / flush requests", "bg CPU"], rows)]

    if args.all:
        rows = []
        for mode in modes:
            for slots in slot_list:
                for c in clients_list:
                    for s in sizes:
                        k = (mode, slots, c, s)
                        rows.append([mode, slots, c, size_name(s), human(med(k, "rec_s")),
                                     f"{med(k, 'mb_s'):,.0f}", f"{med(k, 'slot_ms'):.1f}",
                                     f"{med(k, 'insert_ms'):.1f}",
                                     f"{med(k, 'coalesced'):.0f} / {med(k, 'requests'):.0f}",
                                     share_text(med(k, "bg_cpu"))])
        out += ["\n### every point\n",
                markdown_table(["mode", "slots", "clients", "record", "rec/s", "MB/s",
                                "slot wait ms", "insert wait ms", "coalesced / requests", "bg CPU"],
                                rows)]
    if failures:
        out += ["\nclient failures (the point was measured again; nan: it failed every time):"]
        out += [f"- {f}" for f in failures]
    print("\n".join(out))


if __name__ == "__main__":
    main()
