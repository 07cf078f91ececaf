"""Reopen an eventsourcing application recorder holding many events and read one aggregate:
pmemwal (its stored index, and rebuilt by replaying the log) against eventsourcing's own
SQLite module, on the same file system, and how much memory each open takes.

    .venv/bin/python benchmarks/es_open.py [--events 1000000] [--per-aggregate 10]
        [--rounds 5]          (the stores go under /dev/shm, or PMEMWAL_BENCH_DIR)

Both stores get the same events: ``--events`` of ``--per-aggregate`` per aggregate (UUIDs),
inserted ten aggregates' events at a time, 100-byte states.  Each round opens each store in
a fresh process (imports done, and libpmem loaded, before the clock starts, as importing
sqlite3 loads libsqlite3; dlopen of libpmem with its libndctl takes another 2 ms here): make
the factory and the application recorder, then select one aggregate's events (a different one
each round).  Reported: the
median time, and how much the process's RSS grew over the open and read, against the same
open of an empty store of its kind.  The ratio is pmemwal's time over SQLite's, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

from eventsourcing.persistence import InfrastructureFactory, StoredEvent
from eventsourcing.utils import Environment

from common import SCRATCH, markdown_table, scratch_dir

NAMESPACE = uuid.UUID("e5000000-0000-4000-8000-000000000000")
_CHILD = r"""
import json, resource, sys, time, uuid
from eventsourcing.persistence import InfrastructureFactory
from eventsourcing.utils import Environment
import pmemwal.integrations.eventsourcing, pmemwal.libpmem, eventsourcing.sqlite
pmemwal.libpmem.load()      # loaded before the clock, as importing sqlite3 loads libsqlite3
env, oid = json.loads(sys.argv[1]), uuid.UUID(sys.argv[2])

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

before = rss()
start = time.perf_counter()
factory = InfrastructureFactory.construct(Environment(env=env))
recorder = factory.application_recorder()
events = recorder.select_events(oid)
took = time.perf_counter() - start
grown = rss() - before
replayed = getattr(getattr(recorder, "datastore", None), "replayed_from", None)
factory.close()
print(json.dumps({"seconds": took, "rss": grown, "events": len(events), "replayed": replayed}))
"""


def environments(base: str) -> dict[str, dict[str, str]]:
    return {"pmemwal": {"PERSISTENCE_MODULE": "pmemwal.integrations.eventsourcing",
                        "PMEMWAL_PATH": os.path.join(base, "pmemwal")},
            "sqlite": {"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                       "SQLITE_DBNAME": os.path.join(base, "events.sqlite")}}


def aggregate(i: int) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, str(i))


def fill(env: dict[str, str], events: int, per_aggregate: int) -> None:
    os.makedirs(env.get("PMEMWAL_PATH", os.path.dirname(env.get("SQLITE_DBNAME", "."))),
                exist_ok=True)
    factory = InfrastructureFactory.construct(Environment(env=env))
    recorder = factory.application_recorder()
    state = bytes(100)
    aggregates = events // per_aggregate
    last = time.monotonic()
    for first in range(0, aggregates, 10):
        batch = [StoredEvent(originator_id=aggregate(a), originator_version=v, topic="bench:Event",
                             state=state)
                 for a in range(first, min(first + 10, aggregates))
                 for v in range(1, per_aggregate + 1)]
        recorder.insert_events(batch)
        if time.monotonic() - last > 5:
            last = time.monotonic()
            print(f"  {env['PERSISTENCE_MODULE']}: {first * per_aggregate:,} events",
                  file=sys.stderr, flush=True)
    factory.close()


def open_once(env: dict[str, str], oid: uuid.UUID) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(env), str(oid)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def median_open(env: dict[str, str], rounds: int, aggregates: int) -> dict:
    runs = [open_once(env, aggregate(r * 7919 % max(aggregates, 1))) for r in range(rounds)]
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "rss": statistics.median(r["rss"] for r in runs),
            "events": runs[0]["events"], "replayed": runs[0]["replayed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--per-aggregate", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    aggregates = args.events // args.per_aggregate
    rows, seconds = [], {}
    with scratch_dir() as empty_base, scratch_dir() as base:
        for name, env in environments(base).items():
            print(f"filling {name} with {args.events:,} events", file=sys.stderr, flush=True)
            fill(env, args.events, args.per_aggregate)
            empty_env = environments(empty_base)[name]
            fill(empty_env, 0, 1)
            empty = median_open(empty_env, args.rounds, 1)
            full = median_open(env, args.rounds, aggregates)
            seconds[name] = full["seconds"]
            rows.append([name, f"{full['seconds'] * 1e3:.2f} ms", full["events"],
                         f"{(full['rss'] - empty['rss']) / (1 << 20):+.1f} MiB",
                         full["replayed"] if full["replayed"] is not None else "-"])
            if name == "pmemwal":       # the same without the stored index: every entry replayed
                index = os.path.join(env["PMEMWAL_PATH"], "stored_events", "index", "es")
                os.rename(index, index + ".moved")
                rebuilt = open_once(env, aggregate(1))
                shutil.rmtree(index + ".moved")     # (that open's close stored it again)
                rows.append(["pmemwal, index removed (replay)",
                             f"{rebuilt['seconds'] * 1e3:.1f} ms",
                             rebuilt["events"],
                             f"{(rebuilt['rss'] - empty['rss']) / (1 << 20):+.1f} MiB",
                             rebuilt["replayed"]])
    print(f"{args.events:,} events, {args.per_aggregate} per aggregate, under {SCRATCH}; "
          f"median of {args.rounds} fresh processes each")
    print(markdown_table(["store", "reopen + read one aggregate", "events read",
                          "RSS over an empty store's open", "replayed from entry"], rows))
    print(f"\npmemwal / sqlite: {seconds['pmemwal'] / seconds['sqlite']:.2f}x")


if __name__ == "__main__":
    main()
