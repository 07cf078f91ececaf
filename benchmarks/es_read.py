"""Reads of an eventsourcing application recorder: pmemwal against eventsourcing's own SQLite
module on the same file system, in one run.

    .venv/bin/python benchmarks/es_read.py [--aggregates 1000] [--per-aggregate 300]
        [--read 40] [--page 1000] [--versions 200000] [--rounds 5] [--quick]
        (the stores go under /dev/shm, or PMEMWAL_BENCH_DIR)

Both stores get the same events: ``--aggregates`` aggregates (UUIDs) of ``--per-aggregate``
events each, 100-byte states, inserted 30 events of one aggregate at a time, the aggregates in
turn (so an aggregate's events are spread over the log); pmemwal's index is then stored (a
checkpoint), so that it is read from its files, as after a reopen.  Then (the median of
``--rounds`` rounds, or of ``--repeat`` calls for single events):

- ``--read`` aggregates read whole (``select_events``);
- the whole notification log read in pages of ``--page`` (``select_notifications``);
- in another store, one originator with ``--versions`` versions and one with 10: the time
  to insert one more event of each, and to read its last event
  (``select_events(desc=True, limit=1)``).

Reported: each time, pmemwal's over SQLite's, and the large originator's over the small one's.
``--quick`` makes every size small (a smoke run of a few seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any, Callable

from eventsourcing.persistence import InfrastructureFactory, StoredEvent
from eventsourcing.utils import Environment

from common import SCRATCH, markdown_table, scratch_dir

NAMESPACE = uuid.UUID("e5000000-0000-4000-8000-000000000001")
STATE = bytes(100)
BIG, SMALL = uuid.uuid5(NAMESPACE, "big"), uuid.uuid5(NAMESPACE, "small")


def environments(base: str, store: str) -> dict[str, dict[str, str]]:
    """Each module's environment for a store named ``store`` under ``base``."""
    os.makedirs(os.path.join(base, "pmemwal", store), exist_ok=True)
    return {"pmemwal": {"PERSISTENCE_MODULE": "pmemwal.integrations.eventsourcing",
                        "PMEMWAL_PATH": os.path.join(base, "pmemwal", store)},
            "sqlite": {"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                       "SQLITE_DBNAME": os.path.join(base, f"{store}.sqlite")}}


def aggregate(i: int) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, str(i))


def events(oid: uuid.UUID, first: int, count: int) -> list[StoredEvent]:
    return [StoredEvent(originator_id=oid, originator_version=v, topic="bench:Event", state=STATE)
            for v in range(first, first + count)]


def fill(recorder: Any, aggregates: int, per_aggregate: int) -> None:
    for first in range(1, per_aggregate + 1, 30):
        for a in range(aggregates):
            recorder.insert_events(events(aggregate(a), first, min(30, per_aggregate + 1 - first)))
    stored(recorder)


def fill_versions(recorder: Any, versions: int) -> None:
    for first in range(1, versions + 1, 1000):
        recorder.insert_events(events(BIG, first, min(1000, versions + 1 - first)))
    recorder.insert_events(events(SMALL, 1, 10))
    stored(recorder)


def stored(recorder: Any) -> None:
    """pmemwal: the index stored (a checkpoint), so that what was inserted is read from its
    files, as after a reopen."""
    checkpoint = getattr(getattr(recorder, "datastore", None), "checkpoint", None)
    if checkpoint is not None:
        checkpoint()


def median_time(step: Callable[[int], object], rounds: int) -> float:
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        step(r)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_aggregates(recorder: Any, aggregates: int, read: int, per_aggregate: int
                    ) -> Callable[[int], object]:
    def step(r: int) -> None:
        for k in range(read):
            got = recorder.select_events(aggregate((r * read + k) * 7919 % aggregates))
            assert len(got) == per_aggregate, len(got)
    return step


def read_log(recorder: Any, page: int, total: int) -> Callable[[int], object]:
    def step(_: int) -> None:
        start, seen = 1, 0
        while True:
            got = recorder.select_notifications(start, page)
            if not got:
                break
            seen += len(got)
            start = got[-1].id + 1
        assert seen == total, (seen, total)
    return step


def measure(env: dict[str, str], versions_env: dict[str, str], args: argparse.Namespace
            ) -> dict[str, float]:
    factory = InfrastructureFactory.construct(Environment(env=env))
    try:
        recorder = factory.application_recorder()
        fill(recorder, args.aggregates, args.per_aggregate)
        total = args.aggregates * args.per_aggregate
        out = {"aggregates": median_time(read_aggregates(recorder, args.aggregates, args.read,
                                                         args.per_aggregate), args.rounds),
               "log": median_time(read_log(recorder, args.page, total), args.rounds)}
    finally:
        factory.close()
    factory = InfrastructureFactory.construct(Environment(env=versions_env))
    try:
        recorder = factory.application_recorder()
        fill_versions(recorder, args.versions)
        next_version = {BIG: args.versions + 1, SMALL: 11}
        for name, oid in (("big", BIG), ("small", SMALL)):
            def insert(_: int, oid: uuid.UUID = oid) -> None:
                recorder.insert_events(events(oid, next_version[oid], 1))
                next_version[oid] += 1

            def last(_: int, oid: uuid.UUID = oid) -> None:
                got = recorder.select_events(oid, desc=True, limit=1)
                assert got[0].originator_version == next_version[oid] - 1

            out[f"insert {name}"] = median_time(insert, args.repeat)
            out[f"last {name}"] = median_time(last, args.repeat)
        return out
    finally:
        factory.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aggregates", type=int, default=1000)
    parser.add_argument("--per-aggregate", type=int, default=300)
    parser.add_argument("--read", type=int, default=40)
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--versions", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=200, help="single inserts and reads timed")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.aggregates, args.per_aggregate, args.read = 20, 60, 5
        args.page, args.versions, args.rounds, args.repeat = 100, 2000, 2, 20
    results = {}
    with scratch_dir() as base:
        versions_envs = environments(base, "versions")
        for name, env in environments(base, "aggregates").items():
            print(f"{name}: filling and reading", file=sys.stderr, flush=True)
            results[name] = measure(env, versions_envs[name], args)
    p, s = results["pmemwal"], results["sqlite"]
    rows = [[f"read {args.read} aggregates of {args.per_aggregate} events", "aggregates"],
            [f"read the log ({args.aggregates * args.per_aggregate:,} events) in pages of "
             f"{args.page}", "log"],
            [f"insert 1 event, originator of {args.versions:,} versions", "insert big"],
            ["insert 1 event, originator of 10 versions", "insert small"],
            [f"last event (desc, limit 1), originator of {args.versions:,} versions", "last big"],
            ["last event (desc, limit 1), originator of 10 versions", "last small"]]
    print(f"{args.aggregates * args.per_aggregate:,} events over {args.aggregates} aggregates "
          f"(another store: {args.versions + 10:,} over 2), under {SCRATCH}; median of "
          f"{args.rounds} rounds (reads) or {args.repeat} calls (single events)")
    print(markdown_table(["operation", "pmemwal", "sqlite", "pmemwal / sqlite"],
                         [[label, f"{p[k] * 1e3:.3f} ms", f"{s[k] * 1e3:.3f} ms",
                           f"{p[k] / s[k]:.2f}x"] for label, k in rows]))
    for name, r in results.items():
        print(f"{name}: {args.versions:,} versions / 10 versions: insert "
              f"{r['insert big'] / r['insert small']:.2f}x, last event "
              f"{r['last big'] / r['last small']:.2f}x")


if __name__ == "__main__":
    main()
