"""Does the appender leave the GIL to others?  A pure-Python thread beside a committing appender.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/gil.py [--seconds 2] [--rounds 5] [--size 262144] [--switch-interval S]

Two workers, each timed over the same window:

* the Python thread: a loop of integer arithmetic in pure Python (it holds
  the GIL all the time it runs), counting its iterations;
* the appender: ``wal.append(data, flush=True)`` of 256 KiB records (one
  native call per record: reserve, header, CRC32C, copy and persist with the
  GIL released), counting its records.

Each runs alone, then both run at once in two threads; the pace of each
beside the other is reported as a fraction of its solo pace (target: 0.7
both ways, direct mode).  The three runs alternate round by round in one run
and medians are reported.  Buffered mode is a second row.  The machine this
was written on has 2 cores: the two threads, plus the WAL's background
writer (which mostly sleeps here: every record is flushed by its appender),
share them.  The appender's rows also give the background writer's CPU share, alone and
beside the Python thread (its CPU time over the appender's window, of one core).

The GIL is taken back after each native call: a thread that wants it while
another thread runs Python waits up to ``sys.getswitchinterval()`` (5 ms by
default) before it forces a switch.  ``--switch-interval`` sets that for the
whole run, to show how much of the appender's loss is this hand-over.  A
control row runs ``hashlib.sha256`` of the same buffer (a stdlib call that
also drops the GIL) in the appender's place: it meets the same hand-over.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import threading
import time
from typing import Callable

import pmemwal
from common import background_share, markdown_table, print_cpu, scratch_dir, share_text

KEEP = 64 << 20


class Worker:
    """A loop run in a thread until ``stop`` is set; ``count`` units done over ``elapsed`` s
    (and for an appender, its WAL's background writer's CPU share then)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.elapsed = 0.0
        self.background: float | None = None

    @property
    def pace(self) -> float:
        return self.count / self.elapsed

    def run(self, start: threading.Barrier, stop: threading.Event) -> None:
        raise NotImplementedError


class PythonLoop(Worker):
    """Pure-Python integer arithmetic, 1000 iterations between looks at the stop flag."""

    def run(self, start: threading.Barrier, stop: threading.Event) -> None:
        x, n = 1, 0
        start.wait()
        t0 = time.perf_counter()
        while not stop.is_set():
            for i in range(1000):
                x = (x * 1103515245 + i) & 0xFFFFFFFF
            n += 1000
        self.elapsed = time.perf_counter() - t0
        self.count = n


class Appender(Worker):
    """append(data, flush=True) of one preallocated record, truncating behind itself."""

    def __init__(self, wal: pmemwal.WAL, size: int) -> None:
        super().__init__("appender")
        self.wal = wal
        self.data = os.urandom(size)

    def run(self, start: threading.Barrier, stop: threading.Event) -> None:
        wal, data, n = self.wal, self.data, 0
        start.wait()
        before, t0 = wal.stats(), time.perf_counter()
        while not stop.is_set():
            wal.append(data, flush=True)
            n += 1
            if wal.flushed_lsn - wal.first_lsn > KEEP:
                wal.truncate(wal.flushed_lsn - KEEP // 2)
        self.elapsed = time.perf_counter() - t0
        self.count = n
        self.background = background_share(before, wal.stats(), self.elapsed)


def together(workers: list[Worker], seconds: float) -> None:
    """Run ``workers`` in threads of their own at once for ``seconds``."""
    start = threading.Barrier(len(workers) + 1)
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(start, stop)) for w in workers]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()


class Hasher(Worker):
    """The control: hashlib.sha256 of the same buffer, a stdlib call that drops the GIL too."""

    def __init__(self, size: int) -> None:
        super().__init__("sha256")
        self.data = os.urandom(size)

    def run(self, start: threading.Barrier, stop: threading.Event) -> None:
        data, n = self.data, 0
        start.wait()
        t0 = time.perf_counter()
        while not stop.is_set():
            hashlib.sha256(data).digest()
            n += 1
        self.elapsed = time.perf_counter() - t0
        self.count = n


def rounds_of(label: str, make: Callable[[], Worker], seconds: float, rounds: int) -> dict:
    """Solo and shared paces of the Python loop and ``make()``'s worker, alternating by round."""
    solo_py, solo_nat, both_py, both_nat = [], [], [], []
    solo_bg: list[float | None] = []
    both_bg: list[float | None] = []
    for r in range(rounds):
        py = PythonLoop("python")
        together([py], seconds)
        solo_py.append(py.pace)
        nat = make()
        together([nat], seconds)
        solo_nat.append(nat.pace)
        solo_bg.append(nat.background)
        py, nat = PythonLoop("python"), make()
        together([py, nat], seconds)
        both_py.append(py.pace)
        both_nat.append(nat.pace)
        both_bg.append(nat.background)
        print(f"{label} round {r + 1}/{rounds}: python {py.pace / solo_py[-1]:.2f}, "
              f"{nat.name} {nat.pace / solo_nat[-1]:.2f} of solo", file=sys.stderr, flush=True)
    med = statistics.median
    return {"solo_py": med(solo_py), "solo_nat": med(solo_nat),
            "both_py": med(both_py), "both_nat": med(both_nat),
            # the ratio per round (solo and shared runs close in time), then the median
            "py_ratio": med(b / s for b, s in zip(both_py, solo_py)),
            "nat_ratio": med(b / s for b, s in zip(both_nat, solo_nat)),
            "bg_solo": med_known(solo_bg), "bg_both": med_known(both_bg)}


def med_known(values: list[float | None]) -> float | None:
    """The median of the values measured (None: a worker without a WAL)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def measure(mode: str, size: int, seconds: float, rounds: int) -> dict:
    """The appender in ``mode`` beside the Python loop."""
    with scratch_dir() as path, pmemwal.open(path, mode=mode, recycle_segments=8) as wal:
        together([Appender(wal, size)], 0.3)  # warm-up: segments created, mapped, recycled
        result = rounds_of(mode, lambda: Appender(wal, size), seconds, rounds)
        result["label"] = f"pmemwal {mode} ({wal.persist_method}), append(flush=True)"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=256 << 10, help="record bytes (256 KiB)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval() for the run (default: leave it, 0.005)")
    parser.add_argument("--modes", default="direct,buffered")
    parser.add_argument("--no-control", action="store_true", help="skip the hashlib.sha256 row")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    print_cpu()
    rows = []
    results = [measure(mode, args.size, args.seconds, args.rounds) for mode in args.modes.split(",")]
    if not args.no_control:
        results.append(rounds_of("sha256", lambda: Hasher(args.size), args.seconds, args.rounds))
        results[-1]["label"] = "control: hashlib.sha256 (stdlib, drops the GIL)"
    mbs = args.size / 1e6
    for m in results:
        rows.append([m["label"], f"{m['solo_py'] / 1e6:.1f} M it/s", f"{m['both_py'] / 1e6:.1f} M it/s",
                     f"**{m['py_ratio']:.2f}**",
                     f"{m['solo_nat']:,.0f} calls/s ({m['solo_nat'] * mbs:,.0f} MB/s)",
                     f"{m['both_nat']:,.0f} calls/s ({m['both_nat'] * mbs:,.0f} MB/s)",
                     f"**{m['nat_ratio']:.2f}**", share_text(m["bg_solo"], m["bg_both"])])
    print(f"\n{args.size:,}-byte records, append(flush=True); switch interval "
          f"{sys.getswitchinterval() * 1e3:g} ms; median of {args.rounds} rounds of {args.seconds} s; "
          f"{os.cpu_count()} CPUs\n")
    print(markdown_table(["native worker", "Python loop alone", "Python loop beside it",
                          "Python kept (target >= 0.7)", "worker alone", "worker beside Python",
                          "worker kept (target >= 0.7)", "bg CPU (worker alone / beside)"],
                         rows))


if __name__ == "__main__":
    main()
