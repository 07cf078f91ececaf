"""Reads: pmemwal's WAL and Log against py-lmdb and SQLite over the same payloads, in one run.

    .venv/bin/python benchmarks/read_speed.py [--records 1000000] [--sizes 64,8k,1m]
        [--max-bytes 819200000] [--dir /dev/shm] [--repeat 3] [--json out.json] [--quick]

(py-lmdb comes with the ``bench`` extra: pip install 'pmemwal[bench]'.)

For each payload size the same payloads (seeded random bytes) are written to four stores in
one scratch directory under ``--dir``: a WAL and a Log (``append_many`` in direct mode,
64 MiB segments, flushed), an LMDB environment (8-byte big-endian keys, so that its cursor
order is the append order) and a SQLite table ``t(k INTEGER PRIMARY KEY, v BLOB)``.  A size
gets ``--records`` payloads, or fewer where they would pass ``--max-bytes`` (at the
defaults: 1 M of 64 B, 100 k of 8 KiB, 781 of 1 MiB).  Then each reading runs ``--repeat``
rounds, every reading once per round (the machine is shared and noisy: a slow moment hits
them all alike), and the best round is kept:

- scans: ``WAL.records()``, ``Log.entries()``, LMDB's ``txn.cursor()`` and SQLite's
  ``SELECT v FROM t ORDER BY k`` step loop (the file mapped: ``PRAGMA mmap_size``); each
  takes every payload's length and first byte;
- random reads, every record once in one shuffled order shared by all: ``WAL.record(lsn)``,
  ``Log.entry(i)`` and LMDB's ``txn.get(key)``, touched as above;
- batches: ``WAL.scan()``, ``Log.entry_batches()``, and ``WAL.read_many(lsns)`` and
  ``Log.entries_at(indices)`` over the shuffled order in chunks of 4,096; each counts its
  batches' lengths.  ``WAL.scan()`` is also set against the machine's ceiling: the segment
  files' bytes from the first record to the end (each file mapped once, before the
  rounds) copied into a bytearray in 1 MiB memoryview slices.

LMDB reads both ways, ``buffers=True`` (views, as pmemwal's payloads are) and copies (faster
for small values); each comparison is with the faster of the two, named in the table.

Every reading is reported as records/s and MB/s beside its peer's in the same run, with the
ratio of the records/s, pmemwal / peer: above 1, pmemwal reads faster.  MB/s counts the
payload bytes handed out, whether as views or as copies; the ceiling's MB/s counts the
segment bytes it copied (headers too), its records/s the records they hold, so that its
ratio is the copy's time over the scan's.  The per-record readings must agree on the
payloads (the xor of their first bytes) and every reading must read every record, or the
run stops.  A reading the installed pmemwal lacks is "n/a".
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import lmdb
import numpy as np

import common
import pmemwal
from common import human, markdown_table, scratch_dir
from pmemwal.tools.harness.environment import cpu_model

SEGMENT = 64 << 20
CHUNK = 4096               # LSNs / indices per read_many and entries_at call
WRITE_BYTES = 32 << 20     # payload bytes per append_many while the stores are filled
COPY = 1 << 20             # the ceiling's slice
SEED = 39
MAX_BYTES = 100_000 * 8192  # payload bytes per size, at most


def parse_size(text: str) -> int:
    """'64' -> 64, '8k' -> 8192, '1m' -> 1048576."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def size_label(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


@dataclass
class Stores:
    """The same payloads in every store, and the orders the readings take them in."""
    size: int
    count: int
    root: str
    wal: Any = None
    log: Any = None
    env: Any = None
    db: Any = None
    lsns: list[int] = field(default_factory=list)
    # the random readings' order, made before any is timed: positions 0..count-1 shuffled,
    # and the LSNs, entry indices and LMDB keys at them
    shuffled: list[int] = field(default_factory=list)
    random_lsns: list[int] = field(default_factory=list)
    random_indices: list[int] = field(default_factory=list)
    random_keys: list[bytes] = field(default_factory=list)
    segments: list[tuple[mmap.mmap, int, int]] = field(default_factory=list)  # the ceiling's

    def close(self) -> None:
        for m, _, _ in self.segments:
            m.close()
        for store in (self.wal, self.log, self.env, self.db):
            if store is not None:
                store.close()


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def open_stores(root: str, size: int, count: int) -> Stores:
    """The four stores, new and empty, in ``root``."""
    s = Stores(size, count, root)
    s.wal = pmemwal.open(os.path.join(root, "wal"), mode="direct", segment_size=SEGMENT)
    s.log = pmemwal.open_log(os.path.join(root, "log"), mode="direct", segment_size=SEGMENT)
    s.env = lmdb.open(os.path.join(root, "lmdb"), map_size=count * (size + 4096) + (64 << 20),
                      sync=False, metasync=False)
    s.db = sqlite3.connect(os.path.join(root, "t.sqlite"))
    s.db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
                       "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);")
    return s


def write(s: Stores, first: int, payloads: list[bytes]) -> None:
    """Payloads ``first``, ``first + 1``, ... to every store."""
    s.lsns += s.wal.append_many(payloads).tolist()
    s.log.append_many(payloads, term=1)
    with s.env.begin(write=True) as txn:
        txn.cursor().putmulti(((key(first + i), p) for i, p in enumerate(payloads)), append=True)
    with s.db:
        s.db.executemany("INSERT INTO t VALUES (?, ?)", enumerate(payloads, first))


def fill(root: str, size: int, count: int) -> Stores:
    """Write ``count`` payloads of ``size`` bytes to the four stores (time not measured)."""
    s = open_stores(root, size, count)
    rng = np.random.default_rng(SEED + size)
    step = max(1, WRITE_BYTES // size)
    for first in range(0, count, step):
        blob = rng.bytes(min(step, count - first) * size)
        write(s, first, [blob[i:i + size] for i in range(0, len(blob), size)])
    s.wal.flush()
    s.log.sync()
    s.env.sync(True)
    # SQLite at its fastest here: the whole file mapped (up to SQLite's own cap), no reads
    s.db.execute(f"PRAGMA mmap_size={os.path.getsize(os.path.join(root, 't.sqlite'))}")
    s.shuffled = np.random.default_rng(SEED).permutation(count).tolist()
    s.random_lsns = [s.lsns[i] for i in s.shuffled]
    s.random_indices = [s.log.first_index + i for i in s.shuffled]
    s.random_keys = [key(i) for i in s.shuffled]
    s.segments = segment_maps(s)
    segment_copy(s)  # its pages faulted in, as the WAL's are by its appends
    return s


# ---- the readings: each returns (records read, xor of their first bytes or -1) ----------

def wal_records(s: Stores) -> tuple[int, int]:
    n = x = 0
    for rec in s.wal.records():
        p = rec.payload
        n += len(p) > 0
        x ^= p[0]
    return n, x


def wal_record(s: Stores) -> tuple[int, int]:
    record = s.wal.record
    n = x = 0
    for lsn in s.random_lsns:
        p = record(lsn).payload
        n += len(p) > 0
        x ^= p[0]
    return n, x


def wal_scan(s: Stores) -> tuple[int, int]:
    return sum(len(batch) for batch in s.wal.scan()), -1


def wal_read_many(s: Stores) -> tuple[int, int]:
    lsns = np.array(s.random_lsns, dtype=np.uint64)  # (a copy: microseconds against the reads)
    read_many = s.wal.read_many
    return sum(len(read_many(lsns[i:i + CHUNK])) for i in range(0, len(lsns), CHUNK)), -1


def log_entries(s: Stores) -> tuple[int, int]:
    n = x = 0
    for entry in s.log.entries():
        p = entry.payload
        n += len(p) > 0
        x ^= p[0]
    return n, x


def log_entry(s: Stores) -> tuple[int, int]:
    entry = s.log.entry
    n = x = 0
    for i in s.random_indices:
        p = entry(i).payload
        n += len(p) > 0
        x ^= p[0]
    return n, x


def log_entry_batches(s: Stores) -> tuple[int, int]:
    return sum(len(batch) for batch in s.log.entry_batches()), -1


def log_entries_at(s: Stores) -> tuple[int, int]:
    indices = np.array(s.random_indices, dtype=np.int64)
    entries_at = s.log.entries_at
    return sum(len(entries_at(indices[i:i + CHUNK])) for i in range(0, len(indices), CHUNK)), -1


def lmdb_cursor(s: Stores, buffers: bool) -> tuple[int, int]:
    n = x = 0
    with s.env.begin(buffers=buffers) as txn:
        for k, v in txn.cursor():
            n += len(k) > 0 and len(v) > 0
            x ^= v[0]
    return n, x


def lmdb_get(s: Stores, buffers: bool) -> tuple[int, int]:
    n = x = 0
    with s.env.begin(buffers=buffers) as txn:
        get = txn.get
        for k in s.random_keys:
            v = get(k)
            n += len(v) > 0
            x ^= v[0]
    return n, x


def sqlite_select(s: Stores) -> tuple[int, int]:
    n = x = 0
    for (v,) in s.db.execute("SELECT v FROM t ORDER BY k"):
        n += len(v) > 0
        x ^= v[0]
    return n, x


def segment_maps(s: Stores) -> list[tuple[mmap.mmap, int, int]]:
    """The WAL's bytes from its first record to its end: each segment file mapped (once, as
    the WAL keeps its own segments mapped) with the part of it they are in."""
    path, first, end = os.path.join(s.root, "wal"), s.wal.first_lsn, s.wal.insert_lsn
    maps = []
    for name in sorted(n for n in os.listdir(path) if n.endswith(".wal")):
        base = int(name[:-len(".wal")], 16) * SEGMENT
        lo, hi = max(first, base) - base, min(end, base + SEGMENT) - base
        if lo < hi:
            with open(os.path.join(path, name), "rb") as f:
                maps.append((mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), lo, hi))
    return maps


def segment_copy(s: Stores) -> tuple[int, int]:
    """The ceiling: the segments' bytes copied out in 1 MiB slices; the bytes copied."""
    buf, copied = bytearray(COPY), 0
    for m, lo, hi in s.segments:
        with memoryview(m) as view:
            for off in range(lo, hi, COPY):
                n = min(COPY, hi - off)
                buf[:n] = view[off:off + n]
                copied += n
    return copied, -1


@dataclass
class Reading:
    name: str
    fn: Callable[[Stores], tuple[int, int]]
    needs: str = ""            # "WAL.scan": the attribute it needs; n/a without it


READINGS = [
    Reading("WAL.records()", wal_records),
    Reading("WAL.record(lsn) random", wal_record),
    Reading("WAL.scan()", wal_scan, "WAL.scan"),
    Reading("WAL.read_many(4096 random)", wal_read_many, "WAL.read_many"),
    Reading("Log.entries()", log_entries),
    Reading("Log.entry(i) random", log_entry),
    Reading("Log.entry_batches()", log_entry_batches, "Log.entry_batches"),
    Reading("Log.entries_at(4096 random)", log_entries_at, "Log.entries_at"),
    Reading("lmdb cursor (views)", lambda s: lmdb_cursor(s, True)),
    Reading("lmdb cursor (bytes)", lambda s: lmdb_cursor(s, False)),
    Reading("lmdb get random (views)", lambda s: lmdb_get(s, True)),
    Reading("lmdb get random (bytes)", lambda s: lmdb_get(s, False)),
    Reading("sqlite select", sqlite_select),
    Reading("segment copy (ceiling)", segment_copy),
]

# LMDB hands out views (buffers=True) or copies: copies are faster for small values, views
# for large ones; each comparison is with the faster of the two at that size.
PEER_VARIANTS = {"lmdb cursor": ["lmdb cursor (views)", "lmdb cursor (bytes)"],
                 "lmdb get random": ["lmdb get random (views)", "lmdb get random (bytes)"]}

# (pmemwal's reading, its peer, the target ratio or "", the sizes the target is for)
COMPARISONS = [
    ("WAL.records()", "lmdb cursor", ">= 1.0", (64, 8192)),
    ("WAL.records()", "sqlite select", "", ()),
    ("WAL.record(lsn) random", "lmdb get random", ">= 1.0", (64, 8192)),
    ("WAL.scan()", "lmdb cursor", ">= 10", (64,)),
    ("WAL.scan()", "segment copy (ceiling)", "", ()),
    ("WAL.read_many(4096 random)", "lmdb get random", "", ()),
    ("Log.entries()", "lmdb cursor", ">= 1.0", (64, 8192)),
    ("Log.entry(i) random", "lmdb get random", ">= 1.0", (64, 8192)),
    ("Log.entry_batches()", "lmdb cursor", "", ()),
    ("Log.entries_at(4096 random)", "lmdb get random", "", ()),
]


def available(reading: Reading) -> bool:
    if not reading.needs:
        return True
    owner, attr = reading.needs.split(".")
    return hasattr(pmemwal.WAL if owner == "WAL" else pmemwal.Log, attr)


def timed(reading: Reading, s: Stores) -> tuple[float, int, int]:
    start = time.perf_counter()
    n, x = reading.fn(s)
    return time.perf_counter() - start, n, x


def measure(s: Stores, repeat: int) -> dict[str, dict[str, Any] | None]:
    """Every available reading ``repeat`` rounds, interleaved; the best round of each."""
    best: dict[str, dict[str, Any] | None] = {r.name: None for r in READINGS}
    for rnd in range(repeat):
        for reading in READINGS:
            if not available(reading):
                continue
            seconds, n, x = timed(reading, s)
            print(f"{size_label(s.size)} round {rnd + 1}/{repeat} {reading.name}: "
                  f"{seconds:.3f} s", file=sys.stderr, flush=True)
            kept = best[reading.name]
            if kept is None or seconds < kept["seconds"]:
                best[reading.name] = {"seconds": seconds, "count": n, "xor": x}
    return {name: result and finish(s, name, result) for name, result in best.items()}


def finish(s: Stores, name: str, result: dict[str, Any]) -> dict[str, Any]:
    """Rates of one reading, after checking it read every record (the ceiling: the bytes
    that hold them, its records/s the records whose bytes it copied)."""
    seconds, n = result["seconds"], result["count"]
    if name == "segment copy (ceiling)":
        return {"seconds": seconds, "bytes": n, "records_per_s": s.count / seconds,
                "mb_per_s": n / seconds / 1e6}
    if n != s.count:
        raise SystemExit(f"{name} read {n} records of {s.count}")
    return {"seconds": seconds, "records": n, "bytes": n * s.size, "xor": result["xor"],
            "records_per_s": n / seconds, "mb_per_s": n * s.size / seconds / 1e6}


def check_same_bytes(results: dict[str, dict[str, Any] | None]) -> None:
    """The per-record readings saw the same first bytes: they read the same payloads."""
    seen = {name: r["xor"] for name, r in results.items() if r and r.get("xor", -1) >= 0}
    if len(set(seen.values())) > 1:
        raise SystemExit(f"the stores disagree on the payloads: {seen}")


def comparisons(size: int, results: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    rows = []
    for ours, peer, target, target_sizes in COMPARISONS:
        peer = max(PEER_VARIANTS.get(peer, [peer]),
                   key=lambda name: results[name]["records_per_s"])
        a, b = results[ours], results[peer]
        rows.append({"reading": ours, "peer": peer,
                     "ratio": a["records_per_s"] / b["records_per_s"] if a and b else None,
                     "target": target if size in target_sizes else ""})
    return rows


def rate_cells(result: dict[str, Any] | None) -> list[str]:
    if result is None:
        return ["n/a", "n/a"]
    return [human(result["records_per_s"]), f"{result['mb_per_s']:.0f}"]


def _ratio(value: float) -> str:
    """Two decimals, or two significant digits below 0.1 (a ratio against LMDB's views of
    1 MiB values, which read nothing, is far below 0.01)."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def table(results: dict[str, dict[str, Any] | None], rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        ratio = "n/a" if row["ratio"] is None else _ratio(row["ratio"])
        lines.append([row["reading"], *rate_cells(results[row["reading"]]), row["peer"],
                      *rate_cells(results[row["peer"]]), ratio, row["target"]])
    return markdown_table(["pmemwal", "rec/s", "MB/s", "peer", "rec/s", "MB/s",
                           "ratio", "target"], lines)


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def run_size(size: int, count: int, repeat: int) -> dict[str, Any]:
    with scratch_dir("pmemwal-reads-") as root:
        print(f"{size_label(size)}: writing {count:,} records to each store",
              file=sys.stderr, flush=True)
        s = fill(root, size, count)
        try:
            results = measure(s, repeat)
        finally:
            s.close()
    check_same_bytes(results)
    return {"size": size, "records": count, "readings": results,
            "comparisons": comparisons(size, results)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="per size (default 1,000,000)")
    ap.add_argument("--sizes", default="64,8k,1m", help="payload sizes (default 64,8k,1m)")
    ap.add_argument("--max-bytes", default=str(MAX_BYTES),
                    help="payload bytes per size at most: fewer records of large payloads "
                         "(default 819200000: 100,000 of 8 KiB)")
    ap.add_argument("--dir", default=common.SCRATCH, help="scratch directories go here (/dev/shm)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best is kept (default 3)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke test: 3,000 records, 2 MiB per size at most, 1 round")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.max_bytes, args.repeat = 3000, "2m", 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.SCRATCH = args.dir
    budget = parse_size(args.max_bytes)
    header = (f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; load average {load()}; "
              f"Python {platform.python_version()}, py-lmdb {lmdb.__version__}, "
              f"SQLite {sqlite3.sqlite_version}; dir {args.dir}; best of {args.repeat}")
    print(header)
    report: dict[str, Any] = {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_before": load(),
                              "dir": args.dir, "repeat": args.repeat, "sizes": []}
    for size in [parse_size(t) for t in args.sizes.split(",")]:
        count = max(16, min(args.records, budget // size))
        done = run_size(size, count, args.repeat)
        report["sizes"].append(done)
        print(f"\n{size_label(size)} payloads, {count:,} records\n")
        print(table(done["readings"], done["comparisons"]))
    report["load_after"] = load()
    print(f"\nload average after: {report['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
