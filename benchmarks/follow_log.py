"""A Log follower's delivery lag behind a paced writer, against the WAL follower's in the
same run.

    .venv/bin/python benchmarks/follow_log.py [--rate 10000] [--seconds 3] [--rounds 3]
        [--mode auto] [--dir /dev/shm] [--json out.json]

Each run has a writer process and a follower process (spawned) on a fresh directory under
/dev/shm (or $PMEMWAL_BENCH_DIR).  The writer appends 64-byte payloads, each made durable
before the next (``Log.append(payload, sync=True)``, or ``WAL.append(payload, True)``), on a
fixed schedule of ``--rate`` per second for ``--seconds`` (it busy-waits on the clock), each
stamped just before its append with ``time.monotonic_ns()`` and a sequence number.  The
follower (``pmemwal.follow_log``, or ``pmemwal.follow``) is already waiting from the
writer's first payload on; it takes the clock as each one is delivered.  Lag is the
delivery time less the stamp.  Log and WAL runs alternate for ``--rounds`` rounds (in turn
Log-WAL and WAL-Log); printed: each kind's lag percentiles (medians over the rounds), the
ratio of the median lags, and each round's ratio (the two runs of a round ran seconds apart,
so a machine shared with other work loads them more alike).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import struct
import sys
import time
from typing import Any

import numpy as np

import pmemwal
from common import SCRATCH, markdown_table
from follow import collect
from pmemwal.tools.harness.environment import cpu_model

PAYLOAD = 64
STAMP = struct.Struct("<QQ")    # monotonic_ns at the append, sequence number
END = (1 << 64) - 1             # the last payload's sequence number: the run is over
WARM_UP = 2000                  # payloads appended before the first one followed
SETTLE = 0.05                   # s the writer waits once the follower is ready
WAIT = 60.0                     # s a process waits for the other before the run fails


def _writer(kind: str, path: str, mode: str, count: int, rate: float, start: Any,
            ready: Any, results: Any) -> None:
    if kind == "log":
        target: Any = pmemwal.open_log(path, mode=mode)

        def append(buf: bytearray) -> int:
            return target.append(buf, 0, sync=True)
    else:
        target = pmemwal.open(path, mode=mode)

        def append(buf: bytearray) -> int:
            return target.append(buf, True)
    with target:
        buf = bytearray(PAYLOAD)
        for _ in range(WARM_UP):
            append(buf)
        start.put(append(buf))  # the index (or LSN) the follower starts at
        if not ready.wait(WAIT):
            raise SystemExit("the follower never became ready")
        time.sleep(SETTLE)
        now, pack, period = time.monotonic_ns, STAMP.pack_into, 1e9 / rate
        t0 = now()
        for seq in range(count):
            due = t0 + int(seq * period)
            while now() < due:
                pass
            pack(buf, 0, now(), seq)
            append(buf)
        t1 = now()
        STAMP.pack_into(buf, 0, 0, END)
        append(buf)
    results.put({"role": "writer", "rate": count / ((t1 - t0) / 1e9)})


def _follower(kind: str, path: str, count: int, start: Any, ready: Any, results: Any) -> None:
    stamps, delivered = np.zeros(count, np.int64), np.zeros(count, np.int64)
    s, d = memoryview(stamps), memoryview(delivered)
    now, unpack = time.monotonic_ns, STAMP.unpack_from
    n = misplaced = 0
    first = start.get(timeout=WAIT)
    follower: Any = (pmemwal.follow_log(path, start=first, timeout=2.0) if kind == "log"
                     else pmemwal.follow(path, start=first, timeout=2.0))
    with follower:
        items = iter(follower)
        next(items)  # the writer's first payload: from here on the follower waits
        ready.set()
        for item in items:
            t = now()
            stamp, seq = unpack(item.payload)
            if seq == END:
                break
            if seq != n or n >= count:
                misplaced += 1
            else:
                s[n], d[n] = stamp, t
            n += 1
    lags = (delivered - stamps)[:min(n, count)]
    results.put({"role": "follower", "delivered": n, "misplaced": misplaced,
                 "lag_us": _percentiles(lags) if len(lags) else None})


def _percentiles(lags_ns: np.ndarray) -> dict[str, float]:
    p50, p99, p999 = np.percentile(lags_ns, [50, 99, 99.9]) / 1e3
    return {"p50": float(p50), "p99": float(p99), "p99.9": float(p999)}


def run_once(kind: str, mode: str, count: int, rate: float, scratch: str) -> dict[str, Any]:
    """One paced writer and one follower of ``kind`` ("log" or "wal") on a fresh directory."""
    ctx = mp.get_context("spawn")
    root = os.path.join(scratch, f"pmemwal-bench-follow-log-{os.getpid()}")
    path = os.path.join(root, kind)
    os.makedirs(root, exist_ok=True)
    start, ready, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_follower, args=(kind, path, count, start, ready, results)),
             ctx.Process(target=_writer,
                         args=(kind, path, mode, count, rate, start, ready, results))]
    try:
        for proc in procs:
            proc.start()
        out = collect(results, procs)
        for proc in procs:
            proc.join(WAIT)
        return out
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10000, help="payloads per second")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of each run")
    parser.add_argument("--rounds", type=int, default=3, help="Log and WAL runs, in turn")
    parser.add_argument("--mode", default="auto", help="the writer's mode (pmemwal.open's)")
    parser.add_argument("--dir", default=SCRATCH, help="where the runs' logs and WALs go")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    count = max(1, int(args.rate * args.seconds))
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"log": [], "wal": []}
    for r in range(args.rounds):
        for kind in (("log", "wal") if r % 2 == 0 else ("wal", "log")):
            got = run_once(kind, args.mode, count, args.rate, args.dir)
            runs[kind].append(got)
            f = got["follower"]
            print(f"round {r + 1} {kind}: lag {f['lag_us']} us, writer "
                  f"{got['writer']['rate']:.0f}/s, misplaced {f['misplaced']}", file=sys.stderr)
    ok = all(g["follower"]["misplaced"] == 0 and g["follower"]["delivered"] == count
             for rs in runs.values() for g in rs)
    summary = {kind: {p: statistics.median(g["follower"]["lag_us"][p] for g in rs)
                      for p in ("p50", "p99", "p99.9")} for kind, rs in runs.items()}
    ratio = summary["log"]["p50"] / summary["wal"]["p50"]
    pairs = [log["follower"]["lag_us"]["p50"] / wal["follower"]["lag_us"]["p50"]
             for log, wal in zip(runs["log"], runs["wal"])]  # (the runs of one round)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; {args.rate:.0f} payloads/s of "
          f"{PAYLOAD} B for {args.seconds} s, each synced; {args.rounds} rounds; load average before "
          f"{' '.join(f'{v:.2f}' for v in load_before)}, after "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(markdown_table(["follower", "lag p50 us", "lag p99 us", "lag p99.9 us"],
                         [[k, f"{v['p50']:.1f}", f"{v['p99']:.1f}", f"{v['p99.9']:.1f}"]
                          for k, v in (("follow_log", summary["log"]),
                                       ("follow (WAL)", summary["wal"]))]))
    print(f"median lag, Log follower / WAL follower: {ratio:.2f} (medians over the rounds); "
          f"each round's: {' '.join(f'{p:.2f}' for p in pairs)}, their median "
          f"{statistics.median(pairs):.2f}"
          + ("" if ok else "  (a run lost, repeated or reordered a payload)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "args": vars(args), "runs": runs, "summary": summary,
                       "ratio_p50": ratio, "round_ratios_p50": pairs, "in_order": ok,
                       "load_before": load_before, "load_after": os.getloadavg()}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
