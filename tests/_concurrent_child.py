"""Self-describing payloads, the concurrent workload, and a child process for
tests/test_concurrency.py; run as a script with one JSON spec argument.

Payloads: ``make_payload(run, tid, seq, n)`` is ``n`` bytes.  From 20 bytes
on it starts with a header (magic, run, thread id, sequence number, length)
and goes on with a slice of a fixed pseudo-random block at an offset derived
from those four numbers, so ``parse_payload`` can name the record a payload
belongs to and check every byte of it without knowing anything else.
Shorter payloads are the slice alone: only their LSN identifies them.

Operations (spec["op"]):

- ``stress``: open the WAL with spec["opts"], run ``stress`` (the workload of
  test_concurrent_stress) for spec["seconds"], close, write the result as JSON
  to spec["out"] and print ``{"persist_method": ...}``.  The parent reopens
  the WAL and checks it against the result.
- ``crash_writer``: the SIGKILL test's writer.  The first line is
  ``READY <persist_method> <insert_lsn>``; then, from 4 appender threads and
  2 flusher threads, forever (the parent kills it):

  - ``A <run> <tid> <seq> <lsn> <n>``: that record is acknowledged (durable):
    printed only after append(flush=True), or the thread's own flush(lsn)
    covering it, has returned;
  - ``U <run> <tid> <seq> <lsn> <n>``: appended, not acknowledged yet;
  - ``F <lsn> <flushed>``: flush(lsn) (lsn -1: flush()) returned ``flushed``,
    so every record below ``flushed`` is durable.
"""

from __future__ import annotations

import json
import random
import struct
import sys
import threading
import time
import traceback

import pmemwal

# ---- payloads ----------------------------------------------------------------------

MAGIC = b"CWAL"
HEADER = struct.Struct("<4sIIII")      # magic, run, tid, seq, n
HDR = HEADER.size                      # 20
_BLOCK_SIZE = 4 << 20
_BLOCK = random.Random(20240917).randbytes(_BLOCK_SIZE)
HUGE = 1_250_000                       # spans a 1 MiB segment


def _offset(run: int, tid: int, seq: int, n: int) -> int:
    h = (run * 0x9E3779B1 + tid * 0x85EBCA77 + seq * 0xC2B2AE3D + n * 0x27D4EB2F) & 0xFFFFFFFF
    return h % (_BLOCK_SIZE - n + 1)


def make_payload(run: int, tid: int, seq: int, n: int) -> bytes:
    """The payload of thread ``tid``'s record number ``seq`` in run ``run``: ``n`` bytes."""
    if n < HDR:
        o = _offset(run, tid, seq, n)
        return _BLOCK[o:o + n]
    o = _offset(run, tid, seq, n)
    return HEADER.pack(MAGIC, run, tid, seq, n) + _BLOCK[o:o + n - HDR]


def parse_payload(data: bytes) -> tuple[int, int, int] | None:
    """(run, tid, seq) of a payload that verifies byte for byte; None otherwise."""
    if len(data) < HDR:
        return None
    magic, run, tid, seq, n = HEADER.unpack_from(data)
    if magic != MAGIC or n != len(data) or data != make_payload(run, tid, seq, n):
        return None
    return run, tid, seq


# ---- the stress workload (test_concurrent_stress) ---------------------------------------

SIZES = (0, 1, 7, 19, 20, 24, 100, 1000, 4096, 8144, 8168, 8169, 8192, 9000, 16400, 20000,
         40000)
APPEND, MANY, COMMIT = "append", "append_many", "commit"
KINDS = (APPEND, MANY, COMMIT)


def stress_size(rng: random.Random, seq: int) -> int:
    return HUGE if seq % 400 == 7 else rng.choice(SIZES)


def stress(wal: pmemwal.WAL, seconds: float, run: int, seed: str, appenders: int = 6,
           flushers: int = 2) -> dict:
    """Appender threads (kinds APPEND, MANY, COMMIT in turn) and flusher threads for
    ``seconds``; returns what they did, for the checks:

    - ``appended[tid]``: [seq, lsn, n] in the order append returned them;
    - ``own_flushes``: [lsn, flushed] of append(flush=True) (flushed: the
      returned-then-read flushed_lsn) and of the appenders' own flush(lsn);
    - ``flushes[f]``: [lsn or -1, insert_lsn before, returned] in call order;
    - ``reads``: how many concurrent reads ran; ``errors``: tracebacks;
    - ``stats``: wal.stats() afterwards; ``stuck``: threads that did not end.
    """
    stop = threading.Event()
    appended: list[list[list[int]]] = [[] for _ in range(appenders)]
    own_flushes: list[list[int]] = []
    flushes: list[list[list[int]]] = [[] for _ in range(flushers)]
    errors: list[str] = []
    reads = [0]
    start_gate = threading.Barrier(appenders + flushers)

    def guarded(fn, *args):
        try:
            start_gate.wait()
            fn(*args)
        except BaseException:  # reported to the test
            errors.append(traceback.format_exc())
            stop.set()

    def appender(tid: int) -> None:
        rng = random.Random(f"{seed}/size/{tid}")
        kind = KINDS[tid % len(KINDS)]
        mine = appended[tid]
        seq = 0
        while not stop.is_set():
            if kind == MANY:
                k = rng.randint(1, 12)
                sizes = [stress_size(rng, seq + j) for j in range(k)]
                datas = [make_payload(run, tid, seq + j, n) for j, n in enumerate(sizes)]
                lsns = wal.append_many(datas)
                assert len(lsns) == k
                mine.extend([seq + j, int(lsn), n] for j, (lsn, n) in enumerate(zip(lsns, sizes)))
                seq += k
                if rng.random() < 0.2:
                    lsn = mine[-1][1]
                    own_flushes.append([lsn, wal.flush(lsn)])
                continue
            n = stress_size(rng, seq)
            data = make_payload(run, tid, seq, n)
            if kind == COMMIT:
                lsn = wal.append(data, flush=True)
                mine.append([seq, lsn, n])
                own_flushes.append([lsn, wal.flushed_lsn])
            else:
                lsn = wal.append(data)
                mine.append([seq, lsn, n])
                if rng.random() < 0.1:
                    own_flushes.append([lsn, wal.flush(lsn)])
            seq += 1

    def flusher(f: int) -> None:
        rng = random.Random(f"{seed}/flush/{f}")
        mine = flushes[f]
        i = 0
        while not stop.is_set():
            i += 1
            if f == 0 and (reads[0] == 0 or i % 50 == 0):  # the first read as soon as it can
                read_some(rng)
            if rng.random() < 0.3:
                before = wal.insert_lsn
                mine.append([-1, before, wal.flush()])
            else:
                lst = appended[rng.randrange(appenders)]
                if not lst:
                    time.sleep(0.0002)
                    continue
                idx = len(lst) - 1 if rng.random() < 0.7 else rng.randrange(len(lst))
                lsn = lst[idx][1]
                before = wal.insert_lsn
                mine.append([lsn, before, wal.flush(lsn)])
            if rng.random() < 0.5:
                time.sleep(0.0005)

    def read_some(rng: random.Random) -> None:
        """records(start) from a random appended record, while the others go on."""
        tid = rng.randrange(appenders)
        lst = appended[tid]
        if not lst:
            return
        seq, lsn, n = lst[rng.randrange(len(lst))]
        for k, rec in enumerate(wal.records(lsn)):
            data = bytes(rec.payload)
            if k == 0:
                assert rec.lsn == lsn and data == make_payload(run, tid, seq, n), \
                    f"concurrent read: record at {lsn} differs"
            elif len(data) >= HDR:
                assert parse_payload(data), f"concurrent read: record at {rec.lsn} garbled"
            if k == 20:
                break
        reads[0] += 1

    threads = [threading.Thread(target=guarded, args=(appender, t), daemon=True)
               for t in range(appenders)]
    threads += [threading.Thread(target=guarded, args=(flusher, f), daemon=True)
                for f in range(flushers)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    if not stuck:
        # Buffered mode: an insertion whose reservation passed the segments it attached
        # beforehand leaves its segment to the flush that writes it out; write all out,
        # so that the counters below cover every segment the records reach.
        wal.flush()
    return {"appended": appended, "own_flushes": own_flushes, "flushes": flushes,
            "reads": reads[0], "errors": errors, "stuck": stuck,
            "stats": wal.stats() if not stuck else {}}


def stress_op(spec: dict) -> dict:
    wal = pmemwal.open(spec["dir"], **spec["opts"])
    result = stress(wal, spec["seconds"], spec["run"], spec["seed"])
    result["persist_method"] = wal.persist_method
    if not result["stuck"]:
        wal.close()
    with open(spec["out"], "w") as f:
        json.dump(result, f)
    return {"persist_method": result["persist_method"], "stuck": result["stuck"]}


# ---- the SIGKILL writer -----------------------------------------------------------------

CRASH_SIZES = (20, 21, 64, 100, 1000, 4096, 8144, 8168, 8169, 8192, 9000, 20000, 40000)


def crash_writer(spec: dict) -> None:
    wal = pmemwal.open(spec["dir"], mode=spec["mode"], segment_size=1 << 20,
                       insert_slots=spec["insert_slots"], gil_release_size=8192)  # (parallel copies)
    run, seed = spec["run"], spec["seed"]
    out = sys.stdout
    out_lock = threading.Lock()
    recent: list[int] = []           # LSNs appended, for the flushers

    def emit(text: str) -> None:
        with out_lock:
            out.write(text)
            out.flush()

    def size(rng: random.Random, seq: int) -> int:
        return HUGE if seq % 150 == 40 else rng.choice(CRASH_SIZES)

    def line(tag: str, tid: int, seq: int, lsn: int, n: int) -> str:
        return f"{tag} {run} {tid} {seq} {lsn} {n}\n"

    def appender(tid: int) -> None:
        rng = random.Random(f"{seed}/{tid}")
        seq = 0
        while True:
            if tid == 0:        # commits: append(flush=True)
                n = size(rng, seq)
                lsn = wal.append(make_payload(run, tid, seq, n), flush=True)
                recent.append(lsn)
                emit(line("A", tid, seq, lsn, n))
                seq += 1
                time.sleep(0.0003)
            elif tid == 1:      # group commits: a few appends, then flush(last)
                pending = []
                for _ in range(rng.randint(1, 6)):
                    n = size(rng, seq)
                    lsn = wal.append(make_payload(run, tid, seq, n))
                    recent.append(lsn)
                    pending.append(line("A", tid, seq, lsn, n))
                    seq += 1
                flushed = wal.flush(lsn)
                assert flushed > lsn, (flushed, lsn)
                emit("".join(pending))
                time.sleep(0.001)
            elif tid == 2:      # batches: append_many, then flush(last)
                sizes = [size(rng, seq + j) for j in range(rng.randint(1, 8))]
                lsns = wal.append_many([make_payload(run, tid, seq + j, n)
                                        for j, n in enumerate(sizes)])
                recent.append(int(lsns[-1]))
                flushed = wal.flush(int(lsns[-1]))
                assert flushed > int(lsns[-1]), (flushed, int(lsns[-1]))
                emit("".join(line("A", tid, seq + j, int(lsn), n)
                             for j, (lsn, n) in enumerate(zip(lsns, sizes))))
                seq += len(sizes)
                time.sleep(0.001)
            else:               # no flush of its own: the flushers' promises cover it
                n = size(rng, seq)
                lsn = wal.append(make_payload(run, tid, seq, n))
                recent.append(lsn)
                emit(line("U", tid, seq, lsn, n))
                seq += 1
                if seq % 2 == 0:
                    time.sleep(0.001)

    def flusher(f: int) -> None:
        rng = random.Random(f"{seed}/flusher/{f}")
        while True:
            time.sleep(rng.uniform(0, 0.002))
            if not recent or rng.random() < 0.3:
                emit(f"F -1 {wal.flush()}\n")
            else:
                lsn = recent[-1] if rng.random() < 0.6 else rng.choice(recent[-200:])
                flushed = wal.flush(lsn)
                assert flushed > lsn, (flushed, lsn)
                emit(f"F {lsn} {flushed}\n")

    emit(f"READY {wal.persist_method} {wal.insert_lsn}\n")
    threads = [threading.Thread(target=appender, args=(t,), daemon=True) for t in range(4)]
    threads += [threading.Thread(target=flusher, args=(f,), daemon=True) for f in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    spec = json.loads(sys.argv[1])
    op = spec["op"]
    if op == "stress":
        print(json.dumps(stress_op(spec)))
    elif op == "crash_writer":
        crash_writer(spec)
    else:
        raise SystemExit(f"unknown op {op!r}")


if __name__ == "__main__":
    main()
