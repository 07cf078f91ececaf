"""How soon another process sees an eventsourcing application's events: its subscription and
a ProjectionRunner over a read-only store, against pmemwal.follow on the same WAL, in one run.

    .venv/bin/python benchmarks/es_follow.py [--events 400] [--interval 2] [--rounds 3]
        (the stores go under /dev/shm, or PMEMWAL_BENCH_DIR)

A writer process runs an application that saves one event at a time, every ``--interval``
ms, ``--events`` of them, each carrying the monotonic clock (shared by the processes)
read just before ``save``.  This process follows them, in one of three ways a round:

- ``wal``: ``pmemwal.follow`` on the application's events log: each WAL record as it is
  durable (the floor: what a reader of the WAL itself waits);
- ``log``: ``pmemwal.follow_log`` on it: each log entry (what the read-only store follows);
- ``subscribe``: the application's recorder, opened read-only (``<APP>_PMEMWAL_READONLY``),
  ``subscribe()``: each notification;
- ``projection``: eventsourcing's ``ProjectionRunner`` over it: each event reaching the
  projection's ``process_event``.

The lag of an event is when it was seen here minus its stamp (so it counts the writer's
save too: its median is printed beside).  Reported, per way: the median lag and the 90th
percentile (medians over the rounds), and the median of the per-round ratios to ``wal``.
The first tenth of each round's events is left out (warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import InfrastructureFactory, Tracking
from eventsourcing.projection import Projection, ProjectionRunner
from eventsourcing.utils import Environment

import pmemwal
from common import markdown_table, scratch_dir
from pmemwal.integrations.eventsourcing import PmemwalTrackingRecorder

CASES = ("wal", "log", "subscribe", "projection")
STAMP = re.compile(rb'"at":(\d+)')


class Clock(Aggregate):
    """One event a save: the time the writer stamped on it."""

    @event("Ticked")
    def tick(self, at: int) -> None:
        self.at = at


class Clocks(Application):
    pass


# ---- the writer (another process) ----------------------------------------------------

def write_events() -> None:
    """The writer: waits for ``go`` on stdin, then saves the events; prints its save times."""
    spec = json.loads(sys.argv[1])
    app = Clocks(env={"PERSISTENCE_MODULE": "pmemwal.integrations.eventsourcing",
                      "PMEMWAL_PATH": spec["path"]})
    clock = Clock()
    app.save(clock)
    print("ready", flush=True)
    sys.stdin.readline()
    saves = []
    interval = spec["interval"] / 1000
    next_at = time.perf_counter()
    for _ in range(spec["events"]):
        next_at += interval
        while time.perf_counter() < next_at:    # (paced: lag, not a backlog, is measured)
            time.sleep(max(next_at - time.perf_counter() - 0.0005, 0))
        start = time.perf_counter_ns()
        clock.tick(start)
        app.save(clock)
        saves.append(time.perf_counter_ns() - start)
    print(json.dumps(saves), flush=True)
    sys.stdin.readline()
    app.close()


class Writer:
    def __init__(self, path: str, events: int, interval: float) -> None:
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        spec = json.dumps({"path": path, "events": events, "interval": interval})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import es_follow; es_follow.write_events()", spec],
            env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def go(self) -> None:
        self._say("go")

    def saves(self) -> list[int]:
        return json.loads(self._line())

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self._say("quit")
        self.proc.wait(60)


# ---- the readers (this process) ----------------------------------------------------------

def follow_wal(path: str, events: int, started: Callable[[], None]) -> list[int]:
    lags = []
    with pmemwal.follow(os.path.join(path, "clocks_events")) as follower:
        started()
        for record in follower:
            now = time.perf_counter_ns()
            found = STAMP.search(record.payload)
            if found:
                lags.append(now - int(found.group(1)))
                if len(lags) == events:
                    return lags
    return lags


def follow_log(path: str, events: int, started: Callable[[], None]) -> list[int]:
    lags = []
    with pmemwal.follow_log(os.path.join(path, "clocks_events")) as follower:
        started()
        for entry in follower:
            now = time.perf_counter_ns()
            found = STAMP.search(entry.payload) if isinstance(entry, pmemwal.Entry) else None
            if found:
                lags.append(now - int(found.group(1)))
                if len(lags) == events:
                    return lags
    return lags


def reader_env(path: str) -> dict[str, str]:
    return {"PERSISTENCE_MODULE": "pmemwal.integrations.eventsourcing", "PMEMWAL_PATH": path,
            "CLOCKS_PMEMWAL_READONLY": "yes"}


def follow_subscription(path: str, events: int, started: Callable[[], None]) -> list[int]:
    factory = InfrastructureFactory.construct(Environment("Clocks", reader_env(path)))
    recorder = factory.application_recorder()
    lags = []
    try:
        with recorder.subscribe(gt=recorder.max_notification_id()) as subscription:
            started()
            for notification in subscription:
                now = time.perf_counter_ns()
                found = STAMP.search(notification.state)
                if found:
                    lags.append(now - int(found.group(1)))
                    if len(lags) == events:
                        return lags
    finally:
        factory.close()
    return lags


class LagView(PmemwalTrackingRecorder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lags: list[int] = []
        self.enough = threading.Event()
        self.wanted = 0


class LagProjection(Projection[LagView]):
    name = "lagprojection"

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        now = time.perf_counter_ns()
        view = self.view
        if hasattr(domain_event, "at"):
            view.lags.append(now - domain_event.at)
            if len(view.lags) == view.wanted:
                view.enough.set()
        view.insert_tracking(tracking)


def follow_projection(path: str, events: int, started: Callable[[], None]) -> list[int]:
    env = {**reader_env(path), "LAGPROJECTION_PMEMWAL_PATH": path + "-view"}
    with ProjectionRunner(application_class=Clocks, projection_class=LagProjection,
                          view_class=LagView, env=env) as runner:
        runner.view.wanted = events
        started()
        if not runner.view.enough.wait(120):
            raise RuntimeError(f"the projection saw {len(runner.view.lags)} of {events}")
        return list(runner.view.lags)


FOLLOW = {"wal": follow_wal, "log": follow_log, "subscribe": follow_subscription,
          "projection": follow_projection}


def one_round(case: str, base: str, n: int, args: argparse.Namespace
              ) -> tuple[list[int], list[int]]:
    path = os.path.join(base, f"{case}-{n}")
    writer = Writer(path, args.events, args.interval)
    try:
        ready = threading.Event()
        got: list[list[int]] = []
        thread = threading.Thread(target=lambda: got.append(
            FOLLOW[case](path, args.events, ready.set)), daemon=True)
        thread.start()
        if not ready.wait(60):
            raise RuntimeError(f"{case}: the reader did not start")
        writer.go()
        saves = writer.saves()
        thread.join(120)
        if not got:
            raise RuntimeError(f"{case}: the reader saw nothing")
    finally:
        writer.close()
    skip = args.events // 10
    return got[0][skip:], saves[skip:]


def percentile(values: list[int], q: float) -> float:
    return sorted(values)[min(int(q * len(values)), len(values) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--interval", type=float, default=2.0, help="ms between saves")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    medians: dict[str, list[float]] = {c: [] for c in CASES}
    p90s: dict[str, list[float]] = {c: [] for c in CASES}
    saves: list[float] = []
    with scratch_dir("pmemwal-es-follow-") as base:
        for n in range(args.rounds):
            for case in CASES:          # (alternated: each round's cases see the same load)
                lags, save = one_round(case, base, n, args)
                medians[case].append(statistics.median(lags) / 1000)
                p90s[case].append(percentile(lags, 0.9) / 1000)
                saves.append(statistics.median(save) / 1000)
    rows = []
    for case in CASES:
        ratio = statistics.median(m / w for m, w in zip(medians[case], medians["wal"]))
        rows.append([case, f"{statistics.median(medians[case]):.0f}",
                     f"{statistics.median(p90s[case]):.0f}", f"{ratio:.2f}"])
    print(f"{args.events} events a round, one every {args.interval} ms, {args.rounds} rounds; "
          f"the writer's save: median {statistics.median(saves):.0f} µs")
    print(markdown_table(["reader", "median lag µs", "p90 lag µs", "median / wal's"], rows))
    print(os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
