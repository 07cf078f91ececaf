"""The crash-torture child: ``python -m pmemwal.tools._torture_child SPEC_JSON``
(see pmemwal.tools.torture).

Opens the WAL as the spec says, writes ``R <persist_method> <insert_lsn>`` to
stdout, then runs ``threads`` writers until the parent kills it.  Each writer
appends records of pmemwal.tools.torture.make_record, mixing append(flush=True),
plain appends flushed later (flush() or flush(lsn)), and append_many + flush(),
and after every flush that returns writes ``A <thread> <seq> <lsn>...`` for
the records it has appended since its last acknowledgement.  Writer 0 now and
then truncates the WAL, announcing ``T <lsn>`` first; with ``checkpoint`` in the
spec, a thread besides them truncates every that many seconds too (to the flushed
LSN of its previous checkpoint, a checkpointer's redo point).  Any error ends the
process with status 70 and a traceback on stderr.  ``Pipe``, ``opened``,
``run_threads`` and ``wal_options`` serve the log workload's child, too.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from typing import Callable, TypeVar

import pmemwal
from pmemwal.tools.torture import make_record, record_size

TRUNCATE_ODDS = 1 / 50   # of writer 0's operations
KEEP_SEGMENTS = 2        # a truncation keeps this much WAL behind the flushed position
T = TypeVar("T")


class Pipe:
    """Whole lines to a file descriptor, one thread at a time, unbuffered."""

    def __init__(self, fd: int) -> None:
        self._fd, self._lock = fd, threading.Lock()

    def say(self, line: str) -> None:
        data = (line + "\n").encode()
        with self._lock:
            while data:
                data = data[os.write(self._fd, data):]


def writer(wal: pmemwal.WAL, pipe: Pipe, spec: dict, thread: int) -> None:
    """Append and flush forever, acknowledging what each flush made durable."""
    rnd, segment_size = spec["round"], spec["segment_size"]
    rng = random.Random(f"{spec['seed']}/{thread}")
    seq = 0            # the next record's number
    pending = []       # LSNs of records appended since the last acknowledgement

    def record() -> bytes:
        nonlocal seq
        seq += 1
        return make_record(rnd, thread, seq - 1, record_size(rng, segment_size))

    while True:
        if thread == 0 and rng.random() < TRUNCATE_ODDS:
            truncate(wal, pipe, segment_size)
        op = rng.random()
        if op < 0.4:                               # a commit: durable when it returns
            pending.append(wal.append(record(), flush=True))
        elif op < 0.75:                            # appended now, flushed some time later
            pending.append(wal.append(record()))
            if rng.random() < 0.7:
                continue
            flushed = wal.flush() if rng.random() < 0.5 else wal.flush(pending[-1])
            assert flushed > pending[-1], (flushed, pending[-1])
        else:                                      # a batch, then a flush
            pending += wal.append_many([record() for _ in range(rng.randint(1, 16))]).tolist()
            flushed = wal.flush()
            assert flushed > pending[-1], (flushed, pending[-1])
        pipe.say(f"A {thread} {seq - len(pending)} {' '.join(map(str, pending))}")
        pending.clear()


def truncate(wal: pmemwal.WAL, pipe: Pipe, segment_size: int, redo: int | None = None) -> None:
    """Drop old segments (below ``redo`` too, when given), telling the parent first:
    records below may go from then on."""
    before = wal.flushed_lsn - KEEP_SEGMENTS * segment_size
    if redo is not None:
        before = min(before, redo)
    if before > 0:
        pipe.say(f"T {before}")
        wal.truncate(before)


def checkpointer(wal: pmemwal.WAL, pipe: Pipe, spec: dict) -> None:
    """Truncate every ``spec['checkpoint']`` seconds to the previous checkpoint's flushed LSN."""
    redo = wal.flushed_lsn
    while True:
        time.sleep(spec["checkpoint"])
        truncate(wal, pipe, spec["segment_size"], redo)
        redo = wal.flushed_lsn


def _die() -> None:
    """The traceback to stderr, then exit 70 at once (other threads must not go on)."""
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(70)


def opened(open_target: Callable[[], T]) -> T:
    """What ``open_target`` opens; a failure to open ends the process like any error."""
    try:
        return open_target()
    except BaseException:
        _die()


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """``work(thread)`` in ``count`` threads until the parent kills the process."""
    def guarded(thread: int) -> None:
        try:
            work(thread)
        except BaseException:
            _die()

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wal_options(spec: dict) -> dict:
    """pmemwal.open's options for the spec's setup.  Checkpoints (the WAL's, and a Log's
    index with them) every 10 ms rather than every second: a round lasts a fraction of a
    second, and its kill should land in the middle of writing one as often as anywhere."""
    return {"mode": spec["mode"], "segment_size": spec["segment_size"],
            "insert_slots": spec["slots"], "background": True,
            "checkpoint_interval": spec.get("checkpoint_interval", 0.01)}


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    pipe = Pipe(sys.stdout.fileno())
    pipe.say("O")  # opening: a kill from here on may land inside recovery
    wal = opened(lambda: pmemwal.open(spec["dir"], **wal_options(spec)))
    pipe.say(f"R {wal.persist_method} {wal.insert_lsn}")
    writers = spec["threads"]
    run_threads(writers + bool(spec.get("checkpoint")),
                lambda t: writer(wal, pipe, spec, t) if t < writers else checkpointer(wal, pipe, spec))


if __name__ == "__main__":
    main(sys.argv)
