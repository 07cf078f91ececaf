"""Following a live WAL from another process: delivery lag, the follower's pace and the
writer's cost, in one run.

    .venv/bin/python benchmarks/follow.py [--mode direct] [--rate 100000] [--seconds 5]
        [--records 1000000] [--rounds 5] [--batches] [--pin W,F] [--dir /dev/shm]
        [--json out.json] [--chart lag.png]

(``PMEM_IS_PMEM_FORCE=1`` on /dev/shm makes direct mode persist as on persistent memory.)

The writer and the follower are processes of their own (spawned), on a fresh WAL for each
run.  The writer appends 64-byte records, each flushed (``append(payload, flush=True)``), each
payload stamped just before its append with ``time.monotonic_ns()`` and a sequence number
(two little-endian u64s).  The follower, ``pmemwal.follow(path, start=..., timeout=2)``, is
already waiting when the writer starts: it reads a first record the writer appends after its
warm-up, says it is ready, and blocks for the next.  It takes the clock as each record is
delivered, checks that every sequence number comes once and in order, and keeps the times in
preallocated arrays.  A last record (sequence number 2**64 - 1) ends the run.  ``--batches``:
the follower reads with ``Follower.batches()`` instead, each record delivered when its batch
is; ``--pin W,F``: the writer runs on CPU W only, the follower on CPU F.

- Paced lag: ``--rate`` records/s for ``--seconds`` on a fixed schedule (the writer
  busy-waits on the clock; sleeping is too coarse).  Lag is the delivery time less the
  stamp; reported: its p50, p99, p99.9 and max (targets: p99 <= 20 us, p99.9 <= 200 us), and
  the rate the writer achieved.
- Full speed: ``--records`` records as fast as the writer appends them; the follower's
  delivered rate over the writer's rate, both over the writer's interval (first append to
  last): the share of the records delivered by the time the last append returned (target
  >= 0.95).  Beside it, the follower's own pace: the same follower reading the records a
  writer left (started once that writer closed the WAL), from its first read to its last.
- Writer cost: the writer's full-speed rate with a follower over its rate with none, A/B
  runs alternated (in turn A-B and B-A) for ``--rounds`` rounds; the median ratio (target
  >= 0.95).  The full-speed figures are the rounds' medians.

Beside the figures, the share of its wall time each process ran (its CPU seconds), the
share of a core the writer's background writer took (its CPU time over the writer's run), and
how often each process slept: on a machine with few CPUs, or a shared one, a follower that
waits for a CPU lags by the scheduler's time slice, and the lag says more about the machine
than the WAL.

A run that loses a record, repeats one or takes one out of order stops the script with exit
status 1 after its figures are printed (and written with ``--json``).  ``--chart`` (or, with
``--json`` only, a PNG beside it) draws the lags' histogram and their percentiles.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import queue
import resource
import shutil
import statistics
import struct
import sys
import time
from typing import Any, Iterator

import numpy as np

import common
import pmemwal
from common import background_share, cpu_name, human, markdown_table, scratch_dir, share_text
from pmemwal.tools.progress import progress

PAYLOAD = 64
STAMP = struct.Struct("<QQ")    # monotonic_ns at the append, sequence number
END = (1 << 64) - 1             # the last record's sequence number: the run is over
WARM_UP = 2000                  # records appended before the first one followed
SETTLE = 0.05                   # s the writer waits once the follower is ready: it is asleep
FOLLOW_TIMEOUT = 2.0            # s without a record before the follower gives up
WAIT = 120.0                    # s a process waits for the other before the run fails
TARGETS = {"lag_p99_us": 20.0, "lag_p99.9_us": 200.0, "follower_over_writer": 0.95,
           "writer_cost": 0.95}


# ---- the two processes ------------------------------------------------------------

def _paced(append: Any, buf: bytearray, count: int, rate: float) -> tuple[int, int]:
    """``count`` appends on a fixed schedule of ``rate`` per second; the first and last
    clock reading (ns).  Behind schedule, it appends without waiting until it catches up."""
    now, pack, period = time.monotonic_ns, STAMP.pack_into, 1e9 / rate
    t0 = now()
    for seq in range(count):
        due = t0 + int(seq * period)
        t = now()
        while t < due:
            t = now()
        pack(buf, 0, now(), seq)
        append(buf, True)
    return t0, now()


def _full_speed(append: Any, buf: bytearray, count: int) -> tuple[int, int]:
    now, pack = time.monotonic_ns, STAMP.pack_into
    t0 = now()
    for seq in range(count):
        pack(buf, 0, now(), seq)
        append(buf, True)
    return t0, now()


def usage(before: dict[str, float] | None = None) -> dict[str, float]:
    """This process's CPU seconds and context switches (since ``before``): on a shared
    machine, whether a process waited for a CPU (involuntary) or slept (voluntary)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    now = {"wall_s": time.monotonic(), "cpu_s": ru.ru_utime + ru.ru_stime,
           "slept": ru.ru_nvcsw, "preempted": ru.ru_nivcsw}
    return now if before is None else {k: round(now[k] - before[k], 6) for k in now}


def _writer(path: str, mode: str, count: int, rate: float | None, start: Any, ready: Any,
            results: Any, background: bool = True) -> None:
    """Warm up, append the record the follower starts at, wait for it, then run."""
    with pmemwal.open(path, mode=mode, background=background) as wal:
        buf, append = bytearray(PAYLOAD), wal.append
        for _ in range(WARM_UP):
            append(buf, True)
        first = append(buf, True)
        if start is not None:
            start.put(first)
        if not ready.wait(WAIT):
            raise SystemExit("the follower never became ready")
        time.sleep(SETTLE)
        before, stats = usage(), wal.stats()
        t0, t1 = _paced(append, buf, count, rate) if rate else _full_speed(append, buf, count)
        used = usage(before)
        background = background_share(stats, wal.stats(), used["wall_s"])
        STAMP.pack_into(buf, 0, 0, END)
        append(buf, True)
        results.put({"role": "writer", "t0": t0, "t1": t1, "mode": wal.mode,
                     "persist_method": wal.persist_method, "usage": used,
                     "background_cpu": background})


def _follower(path: str, count: int, batches: bool, start: Any, ready: Any, results: Any
              ) -> None:
    """Follow from the writer's first record; every later record's stamp and delivery time."""
    stamps, delivered = np.zeros(count, np.int64), np.zeros(count, np.int64)
    with pmemwal.follow(path, start=start.get(timeout=WAIT), timeout=FOLLOW_TIMEOUT) as follower:
        began = time.monotonic_ns()
        items: Iterator[Any] = follower.batches() if batches else iter(follower)
        first = next(items)  # the writer's first record: from here on the follower waits
        ready.set()
        before = usage()
        if batches:  # (the first batch holds more than the first record once a writer is done)
            n, misplaced, ended = _take_batches(itertools.chain([first], items), stamps, delivered)
        else:
            n, misplaced, ended = _take_records(items, stamps, delivered)
        done = time.monotonic_ns()
        used = usage(before)
    results.put({"role": "follower", "records": n, "misplaced": misplaced, "ended": ended,
                 "usage": used, "began": began, "done": done,
                 "stamps": stamps, "delivered": delivered})


def _take_records(records: Any, stamps: np.ndarray, delivered: np.ndarray
                  ) -> tuple[int, int, bool]:
    """Record by record until the last: (records, misplaced ones, whether the last came)."""
    s, d = stamps.data, delivered.data  # a memoryview's item stores are the fastest
    now, unpack, count = time.monotonic_ns, STAMP.unpack_from, len(stamps)
    n = misplaced = 0
    for rec in records:
        t = now()
        stamp, seq = unpack(rec.payload)
        if seq == END:
            return n, misplaced, True
        if seq != n or n >= count:
            misplaced += 1
        else:
            s[n], d[n] = stamp, t
        n += 1
    return n, misplaced, False


def _take_batches(batches: Any, stamps: np.ndarray, delivered: np.ndarray
                  ) -> tuple[int, int, bool]:
    """The same a batch at a time: each record delivered when its batch is.  The first batch
    starts with the writer's first record (alone in it, unless the writer is done)."""
    count, skip = len(stamps), 1
    n = misplaced = 0
    for batch in batches:
        t = time.monotonic_ns()
        # every payload is PAYLOAD bytes, one after another: the rows' first two u64s
        fields = np.frombuffer(batch.data, "<u8").reshape(len(batch), -1)[skip:, :2]
        skip = 0
        if not len(fields):
            continue
        ended = fields[-1, 1] == END
        fields = fields[:-1] if ended else fields
        k = len(fields)
        expected = np.arange(n, n + k, dtype=np.uint64)
        if n + k > count:
            misplaced += k
        elif not np.array_equal(fields[:, 1], expected):
            misplaced += int(np.count_nonzero(fields[:, 1] != expected))
        else:
            stamps[n:n + k], delivered[n:n + k] = fields[:, 0], t
        n += k
        if ended:
            return n, misplaced, True
    return n, misplaced, False


def run_once(root: str, mode: str, count: int, rate: float | None, follow: str,
             pin: list[int] | None = None, batches: bool = False,
             background: bool = True) -> dict[str, Any]:
    """One writer (paced at ``rate``, or at full speed) on a fresh WAL under ``root`` (removed
    after), with ``follow``: "live" (a follower waiting before the writer starts), "after" (a
    follower started once the writer has closed the WAL: its own pace over records already
    durable) or "none".  ``pin``: the writer's CPU and the follower's; ``batches``: the
    follower reads a batch at a time; ``background``: the writer's WAL runs its background
    writer.  What the processes reported, keyed by role."""
    ctx = mp.get_context("spawn")
    path = os.path.join(root, "wal")
    start = ctx.Queue() if follow != "none" else None
    ready, results = ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=_writer,
                         args=(path, mode, count, rate, start, ready, results, background))
    procs, cpus = [writer], {writer: pin[0]} if pin else {}
    if follow != "none":
        follower = ctx.Process(target=_follower,
                               args=(path, count, batches, start, ready, results))
        procs.insert(0, follower)  # (started first: it waits for the writer's first record)
        if pin:
            cpus[follower] = pin[1]
    if follow != "live":
        ready.set()
    try:
        if follow == "after":
            launch(writer, cpus)
            out = collect(results, [writer])
            writer.join(WAIT)
            launch(follower, cpus)
            out.update(collect(results, [follower]))
        else:
            for proc in procs:
                launch(proc, cpus)
            out = collect(results, procs)
        for proc in procs:
            proc.join(WAIT)
        return out
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(path, ignore_errors=True)


def launch(proc: Any, cpus: dict[Any, int]) -> None:
    """Start a process, on its own CPU if given one (while it is still importing)."""
    proc.start()
    if proc in cpus:
        os.sched_setaffinity(proc.pid, {cpus[proc]})


def collect(results: Any, procs: list[Any]) -> dict[str, Any]:
    """Each process's report, keyed by role; SystemExit as soon as one fails or all stall."""
    out: dict[str, Any] = {}
    deadline = time.monotonic() + 2 * WAIT
    while len(out) < len(procs):
        try:
            got = results.get(timeout=0.2)
            out[got.pop("role")] = got
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise SystemExit(f"a run failed: exit codes {[p.exitcode for p in procs]}")
    return out


# ---- the figures --------------------------------------------------------------------

def delivery(count: int, writer: dict[str, Any], follower: dict[str, Any] | None
             ) -> dict[str, Any]:
    """A run's figures: the writer's rate, and with a follower its lags and pace."""
    t0, t1 = writer["t0"], writer["t1"]
    out: dict[str, Any] = {"records": count, "writer_rate": count / ((t1 - t0) / 1e9),
                           "writer_usage": writer["usage"],
                           "writer_background_cpu": writer["background_cpu"]}
    if follower is None:
        return out
    ok = follower["ended"] and follower["misplaced"] == 0 and follower["records"] == count
    out.update({"delivered": follower["records"], "misplaced": follower["misplaced"],
                "ended": follower["ended"], "in_order": ok, "follower_usage": follower["usage"]})
    if not ok:
        return out
    lags = follower["delivered"] - follower["stamps"]
    last = int(follower["delivered"].max())
    by_end = int(np.count_nonzero(follower["delivered"] <= t1))
    out.update({"lag_us": lag_stats(lags), "follower_over_writer": by_end / count,
                "follower_rate": count / ((last - t0) / 1e9),
                "catch_up_us": max(0, last - t1) / 1e3, "_lags": lags})
    return out


def lag_stats(lags_ns: np.ndarray) -> dict[str, float]:
    p50, p99, p999 = np.percentile(lags_ns, [50, 99, 99.9]) / 1e3
    return {"p50": float(p50), "p99": float(p99), "p99.9": float(p999),
            "max": float(lags_ns.max()) / 1e3, "mean": float(lags_ns.mean()) / 1e3,
            # the share the p99 target holds for (on a busy machine: those that came while
            # both processes ran)
            "within_20us": float(np.count_nonzero(lags_ns <= 20_000)) / len(lags_ns)}


def paced(root: str, args: argparse.Namespace) -> dict[str, Any]:
    count = max(1, int(args.rate * args.seconds))
    got = run_once(root, args.mode, count, args.rate, "live", args.pin, args.batches,
                   args.background)
    out = delivery(count, got["writer"], got["follower"])
    out.update({"target_rate": args.rate, "seconds": args.seconds,
                "mode": got["writer"]["mode"], "persist_method": got["writer"]["persist_method"]})
    return out


def full_speed(root: str, args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """``--rounds`` rounds of the writer alone and with a follower, in turn A-B and B-A, and
    then a follower reading what a writer left (its own pace)."""
    rounds = []
    for r in range(args.rounds):
        runs: dict[str, dict[str, Any]] = {}
        for follow in (("none", "live") if r % 2 == 0 else ("live", "none")) + ("after",):
            got = run_once(root, args.mode, args.records, None, follow, args.pin, args.batches,
                           args.background)
            runs[follow] = (own_pace(args.records, got["follower"]) if follow == "after" else
                            delivery(args.records, got["writer"], got.get("follower")))
            bar.update()
        live = runs["live"]
        live["writer_cost"] = live["writer_rate"] / runs["none"]["writer_rate"]
        bar.set_postfix_str(f"round {r + 1}: writer cost {live['writer_cost']:.2f}")
        rounds.append({"alone": runs["none"], "follower": live, "after": runs["after"]})
    return {"records": args.records, "rounds": rounds, **medians(rounds)}


def own_pace(count: int, follower: dict[str, Any]) -> dict[str, Any]:
    """A follower's rate over records already durable: from its first read (the writer's
    first record) to its last."""
    ok = follower["ended"] and follower["misplaced"] == 0 and follower["records"] == count
    out = {"delivered": follower["records"], "in_order": ok, "follower_usage": follower["usage"]}
    if ok:
        out["follower_rate"] = (count + 1) / ((follower["done"] - follower["began"]) / 1e9)
    return out


def medians(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def median(role: str, key: str) -> float | None:
        values = [r[role][key] for r in rounds if key in r[role]]
        return statistics.median(values) if values else None
    return {"writer_rate_alone": median("alone", "writer_rate"),
            "writer_rate_followed": median("follower", "writer_rate"),
            "follower_rate": median("follower", "follower_rate"),
            "follower_rate_alone": median("after", "follower_rate"),
            "follower_over_writer": median("follower", "follower_over_writer"),
            "writer_cost": median("follower", "writer_cost"),
            "writer_background_cpu_alone": median("alone", "writer_background_cpu"),
            "writer_background_cpu_followed": median("follower", "writer_background_cpu"),
            "in_order": all(r[k]["in_order"] for r in rounds for k in ("follower", "after"))}


# ---- the report -----------------------------------------------------------------------

def verdict(value: float | None, target: float, at_most: bool) -> str:
    if value is None:
        return "n/a"
    return "met" if (value <= target if at_most else value >= target) else "missed"


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def summary_table(lag: dict[str, Any], full: dict[str, Any]) -> str:
    stats = lag.get("lag_us", {})
    rows: list[list[object]] = [
        ["paced: writer's rate", f"{human(lag['writer_rate'])}/s "
         f"(asked {human(lag['target_rate'])}/s)", "", ""],
        ["paced: records in order", f"{lag.get('delivered', 0):,} of {lag['records']:,}",
         "all", "met" if lag.get("in_order") else "missed"],
        ["paced: lag p50", f"{fmt(stats.get('p50'))} us", "", ""],
        ["paced: lag p99", f"{fmt(stats.get('p99'))} us", "<= 20 us",
         verdict(stats.get("p99"), TARGETS["lag_p99_us"], True)],
        ["paced: lag p99.9", f"{fmt(stats.get('p99.9'))} us", "<= 200 us",
         verdict(stats.get("p99.9"), TARGETS["lag_p99.9_us"], True)],
        ["paced: lag max", f"{fmt(stats.get('max'))} us", "", ""],
        ["paced: records within 20 us", f"{fmt(100 * stats.get('within_20us', 0))} %", "", ""],
        ["paced: writer's background CPU", share_text(lag["writer_background_cpu"]), "", ""],
        ["full speed: writer, alone", f"{human(full['writer_rate_alone'])}/s", "", ""],
        ["full speed: writer, followed", f"{human(full['writer_rate_followed'])}/s", "", ""],
        ["full speed: writer's background CPU (alone / followed)",
         share_text(full["writer_background_cpu_alone"], full["writer_background_cpu_followed"]),
         "", ""],
        ["full speed: follower, over records already durable",
         f"{human(full['follower_rate_alone'] or 0)}/s", "", ""],
        ["full speed: follower / writer", fmt(full["follower_over_writer"], 3), ">= 0.95",
         verdict(full["follower_over_writer"], TARGETS["follower_over_writer"], False)],
        ["writer cost: followed / alone", fmt(full["writer_cost"], 3), ">= 0.95",
         verdict(full["writer_cost"], TARGETS["writer_cost"], False)],
    ]
    return markdown_table(["measurement", "figure", "target", ""], rows)


def rounds_table(full: dict[str, Any]) -> str:
    rows: list[list[object]] = []
    for i, r in enumerate(full["rounds"], 1):
        f, a = r["follower"], r["alone"]
        rows.append([i, human(a["writer_rate"]), human(f["writer_rate"]),
                     human(r["after"].get("follower_rate", 0)),
                     fmt(f.get("writer_cost"), 3), fmt(f.get("follower_over_writer"), 3),
                     fmt(f.get("catch_up_us")), fmt(f.get("lag_us", {}).get("p99")),
                     f"{on_cpu(a['writer_usage'])} / {on_cpu(f['writer_usage'])}",
                     f"{on_cpu(f['follower_usage'])}, {f['follower_usage']['slept']:,}",
                     share_text(a["writer_background_cpu"], f["writer_background_cpu"])])
    return markdown_table(["round", "writer alone rec/s", "writer followed rec/s",
                           "follower alone rec/s", "cost ratio",
                           "follower / writer", "catch-up us", "lag p99 us",
                           "writer on a CPU (alone / followed)",
                           "follower on a CPU, sleeps",
                           "writer's bg CPU (alone / followed)"], rows)


def on_cpu(u: dict[str, float]) -> str:
    """The share of its wall time a process ran: below 100 %, it slept or waited for a CPU."""
    return f"{100 * u['cpu_s'] / u['wall_s']:.0f} %" if u["wall_s"] > 0 else "n/a"


def usage_line(run: dict[str, Any]) -> str:
    """Where the processes' time went: CPU seconds over wall seconds, and switches."""
    parts = []
    for role in ("writer", "follower"):
        u = run.get(f"{role}_usage")
        if u:
            parts.append(f"{role} on a CPU {u['cpu_s']:.2f} s of {u['wall_s']:.2f} s, "
                         f"slept {u['slept']:,} times, preempted {u['preempted']:,} times")
    return "; ".join(parts)


def chart(png: str, lag: dict[str, Any], full: dict[str, Any], title: str) -> None:
    """The paced lags' histogram, and their percentiles beside the last full-speed round's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    hist, cdf = fig.subplots(1, 2)
    series = [("paced", lag.get("_lags"))]
    series += [("full speed (last round)", full["rounds"][-1]["follower"].get("_lags"))
               if full["rounds"] else ("", None)]
    lags = series[0][1]
    if lags is not None:
        us = np.maximum(lags / 1e3, 0.1)
        hist.hist(us, bins=np.geomspace(us.min(), us.max() * 1.01, 80))
    hist.set(xscale="log", yscale="log", xlabel="lag (us)", ylabel="records",
             title=f"paced at {human(lag['target_rate'])}/s")
    nines = np.array([0, 50, 90, 99, 99.9, 99.99, 99.999])
    for name, values in series:
        if values is None:
            continue
        # even steps in nines (-log10 of the share above), up to the last record's
        pct = 100 * (1 - np.geomspace(1, max(1e-5, 1 / len(values)), 400))
        cdf.plot(-np.log10(1 - pct / 100), np.percentile(values, pct) / 1e3, label=name)
    cdf.set_xticks(-np.log10(1 - nines / 100), [f"{n:g}" for n in nines])
    cdf.set(yscale="log", xlabel="percentile", ylabel="lag (us)", title="lag by percentile")
    for ax in (hist, cdf):
        for target in (TARGETS["lag_p99_us"], TARGETS["lag_p99.9_us"]):
            (ax.axvline if ax is hist else ax.axhline)(target, color="grey", ls="--", lw=0.8)
    cdf.legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    fig.savefig(png, format="png")


def public(value: Any) -> Any:
    """The figures without the raw lag arrays (keys starting with _)."""
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [public(v) for v in value]
    return value


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--mode", default="direct", choices=["direct", "buffered", "auto"],
                    help="the WAL's mode (default direct)")
    ap.add_argument("--rate", type=float, default=100_000,
                    help="paced lag: records/s (default 100000)")
    ap.add_argument("--seconds", type=float, default=5.0, help="paced lag: seconds (default 5)")
    ap.add_argument("--records", type=int, default=1_000_000,
                    help="full speed: records per run (default 1000000)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="full speed: rounds of the writer alone and followed (default 5)")
    ap.add_argument("--dir", default=common.SCRATCH,
                    help="the scratch directory goes here, removed after (default /dev/shm)")
    ap.add_argument("--pin", metavar="W,F", type=lambda t: [int(c) for c in t.split(",")],
                    help="run the writer on CPU W and the follower on CPU F (default: where "
                         "the scheduler puts them)")
    ap.add_argument("--batches", action="store_true",
                    help="the follower reads with Follower.batches(), a batch at a time "
                         "(each record delivered when its batch is), not record by record")
    ap.add_argument("--no-background", dest="background", action="store_false",
                    help="the writer's WAL runs without its background writer (a thread whose "
                         "rounds take the GIL: a record stamped just before one waits for it "
                         "before its append, which shows in the lag's tail)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    ap.add_argument("--chart", metavar="PNG",
                    help="draw the lags to PNG (default: beside --json's FILE, if given)")
    args = ap.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.records < 1 or args.rounds < 1:
        ap.error("--rate, --seconds, --records and --rounds must be positive")
    if args.pin is not None and len(args.pin) != 2:
        ap.error("--pin takes two CPUs: the writer's and the follower's")
    if args.chart is None and args.json:
        args.chart = os.path.splitext(args.json)[0] + ".png"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.SCRATCH = args.dir
    report: dict[str, Any] = {"cpu": cpu_name(), "cpus": os.cpu_count(), "load_before": load(),
                              "python": platform.python_version(), "mode": args.mode,
                              "pin": args.pin,
                              "follower_reads": "batches" if args.batches else "records",
                              "background": args.background,
                              "targets": TARGETS}
    print(f"CPU: {report['cpu']}, {report['cpus']} CPUs; load average "
          f"{' '.join(map(str, report['load_before']))}; Python {report['python']}; "
          f"mode {args.mode}; dir {args.dir}; the follower reads "
          f"{report['follower_reads']}"
          + (f"; writer on CPU {args.pin[0]}, follower on CPU {args.pin[1]}" if args.pin else ""))
    with scratch_dir("pmemwal-follow-") as root, \
            progress(1 + 3 * args.rounds, "run", "follow", "benchmarks/follow.py",
                     interval=5.0) as bar:
        report["paced"] = lag = paced(root, args)
        bar.update()
        bar.set_postfix_str(f"paced: p99 {fmt(lag.get('lag_us', {}).get('p99'))} us")
        report["full_speed"] = full = full_speed(root, args, bar)
    report["persist_method"] = lag["persist_method"]
    report["load_after"] = load()
    print(f"\npersist method {report['persist_method']}; paced {lag['records']:,} records, "
          f"full speed {args.records:,} records x {args.rounds} rounds\n")
    print(summary_table(lag, full))
    print(f"\npaced: {usage_line(lag)}\n")
    print(rounds_table(full))
    print(f"\nload average after: {' '.join(map(str, report['load_after']))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(public(report), f, indent=1)
    if args.chart:
        chart(args.chart, lag, full, f"pmemwal.follow, reading {report['follower_reads']}: "
              f"{report['cpu']}, {args.mode} ({report['persist_method']}), "
              f"load {report['load_before'][0]}")
        print(f"chart: {args.chart}")
    if not (lag.get("in_order") and full["in_order"]):
        print("a follower lost, repeated or reordered records", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
