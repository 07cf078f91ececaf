"""A child process for the tests: run with one JSON spec argument.

The environment switches pmemwal reads once per process (PMEM_IS_PMEM_FORCE,
PMEMWAL_LIBPMEM) are set by the parent; this script only acts and reports.
The last line it prints is a JSON object with the results.

Operations (spec["op"]):

- ``roundtrip``: append one record per size in spec["sizes"] (content from
  ``payload``; input types rotate), then the same sizes again with
  append_many, flush, read back, check, close, reopen, check again.
  Reports mode, persist_method, the LSNs and the end.
- ``writer``: the crash-test writer.  spec["threads"] threads append records
  of varying sizes forever; each prints ``A <lsn> <tid> <i> <size>`` only
  after flush() has returned for it.  The first line is
  ``READY <persist_method> <insert_lsn>``.  With spec["truncate"], another
  thread keeps about two segments: it prints ``T <lsn>`` and then calls
  truncate(lsn) (intent first, so the parent knows the most that may have
  gone).  The parent SIGKILLs it.
- ``hold``: open the WAL, print ``LOCKED``, wait for stdin to close.
- ``try_open``: try to open the WAL; report the exception's class name.
"""

from __future__ import annotations

import array
import json
import random
import sys
import threading
import time

import numpy as np

import pmemwal


def payload(seed: object, n: int) -> bytes:
    """Deterministic pseudo-random bytes (the tests' conftest uses the same)."""
    return random.Random(f"{seed}/{n}").randbytes(n)


def as_input(data: bytes, kind: int):
    """The same bytes as one of several bytes-like types."""
    kind %= 6
    if kind == 0:
        return data
    if kind == 1:
        return bytearray(data)
    if kind == 2:
        return memoryview(data)
    if kind == 3:
        return np.frombuffer(data, dtype=np.uint8).copy()
    if kind == 4:
        return array.array("B", data)
    return memoryview(bytearray(b"<" + data + b">"))[1:-1]  # a slice of a larger buffer


def prefixed(seed: str, sizes: list[int]) -> list[tuple[bytes, bytes]]:
    """(prefix, data) pairs for append_prefixed: prefixes of 0, 8, 16 and 24 bytes."""
    return [(payload(f"{seed}/prefix/{i}", 8 * (i % 4)), payload(f"{seed}/tail/{i}", n))
            for i, n in enumerate(sizes)]


def check(wal, expected: list[tuple[int, bytes]]) -> None:
    recs = [(r.lsn, bytes(r.payload), r.prev_lsn) for r in wal.records()]
    assert [(lsn, data) for lsn, data, _ in recs] == expected, "records differ"
    for (lsn0, _, _), (_, _, prev1) in zip(recs, recs[1:]):
        assert prev1 == lsn0, "prev-link chain broken"


def roundtrip(spec: dict) -> dict:
    opts = dict(mode=spec["mode"], segment_size=spec.get("segment_size", 1 << 20))
    seed = spec.get("seed", "child")
    expected = []
    with pmemwal.open(spec["dir"], **opts) as wal:
        for i, n in enumerate(spec["sizes"]):
            data = payload(f"{seed}/one/{i}", n)
            expected.append((wal.append(as_input(data, i)), data))
        batch = [payload(f"{seed}/many/{i}", n) for i, n in enumerate(spec["sizes"])]
        lsns = wal.append_many([as_input(d, i) for i, d in enumerate(batch)])
        expected += list(zip((int(x) for x in lsns), batch))
        for i, (prefix, data) in enumerate(prefixed(seed, spec["sizes"])):
            expected.append((wal.append_prefixed(prefix, as_input(data, i)), prefix + data))
        flushed = wal.flush()
        assert flushed == wal.insert_lsn
        check(wal, expected)
        result = {"mode": wal.mode, "persist_method": wal.persist_method,
                  "stream_min": wal.stream_min, "lsns": [lsn for lsn, _ in expected],
                  "insert_lsn": wal.insert_lsn}
    with pmemwal.open(spec["dir"], **opts) as wal:
        check(wal, expected)
        assert wal.insert_lsn == result["insert_lsn"]
    return result


SIZES = (0, 1, 7, 8, 100, 1000, 4096, 8168, 8192, 8200, 20000, 40000)


def writer(spec: dict) -> None:
    wal = pmemwal.open(spec["dir"], mode=spec["mode"], segment_size=spec.get("segment_size", 1 << 20))
    out_lock = threading.Lock()
    seed = spec["seed"]
    flush_every = spec.get("flush_every", 1)
    sys.stdout.write(f"READY {wal.persist_method} {wal.insert_lsn}\n")
    sys.stdout.flush()

    def run(tid: int) -> None:
        rng = random.Random(f"{seed}/sizes/{tid}")
        pending = []
        i = 0
        while True:
            n = rng.choice(SIZES)
            lsn = wal.append(payload(f"{seed}/{tid}/{i}", n))
            pending.append(f"A {lsn} {tid} {i} {n}\n")
            i += 1
            if len(pending) >= flush_every:
                flushed = wal.flush(lsn)
                assert flushed > lsn
                with out_lock:  # acknowledged only now
                    sys.stdout.write("".join(pending))
                    sys.stdout.flush()
                pending.clear()

    def truncator() -> None:
        seg = wal.segment_size
        while True:
            time.sleep(0.02)
            keep_from = wal.flushed_lsn - 2 * seg
            if keep_from > 0:
                with out_lock:
                    sys.stdout.write(f"T {keep_from}\n")
                    sys.stdout.flush()
                wal.truncate(keep_from)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(spec["threads"])]
    if spec.get("truncate"):
        threads.append(threading.Thread(target=truncator, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    spec = json.loads(sys.argv[1])
    op = spec["op"]
    if op == "roundtrip":
        print(json.dumps(roundtrip(spec)))
    elif op == "writer":
        writer(spec)
    elif op == "hold":
        with pmemwal.open(spec["dir"], mode=spec.get("mode", "buffered")):
            print("LOCKED", flush=True)
            sys.stdin.read()
        print(json.dumps({"released": True}))
    elif op == "try_open":
        try:
            with pmemwal.open(spec["dir"], mode=spec.get("mode", "buffered")):
                pass
            print(json.dumps({"error": None}))
        except Exception as exc:  # reported, not raised: the parent checks the class
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    else:
        raise SystemExit(f"unknown op {op!r}")


if __name__ == "__main__":
    main()
