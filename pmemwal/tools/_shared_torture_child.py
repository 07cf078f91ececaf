"""A writer process of the shared-WAL torture (pmemwal.tools.shared_torture).

Run as ``python -m pmemwal.tools._shared_torture_child SPEC`` (SPEC: JSON with path,
incarnation, threads, seed, min_size, max_size, checkpoint_every, stall).  It opens the
WAL with ``shared=True``, prints ``R <pid>``, then appends self-describing records
(torture.make_record, round = incarnation) from its threads with ``flush=True``, forever:
the parent kills it.  Pipe lines, one locked write each:

    A <thread> <seq> <lsn>   that record is durable: its append(flush=True) returned
    T <lsn>                  about to truncate before lsn (checkpoint_every > 0)

SIGUSR1 (SIGUSR2) arms the core's "stall" ("stall_locked") test hook: the next insertion
stops for good once its space is reserved (inside the reservation lock), so that the
parent's SIGKILL finds this process mid-insert.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import sys
import threading
import traceback

import pmemwal
from pmemwal.tools.torture import make_record


def main(spec: dict) -> None:
    out = sys.stdout.buffer
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            out.write(line.encode() + b"\n")
            out.flush()

    faulthandler.dump_traceback_later(20)  # a writer that cannot open says where it waits
    wal = pmemwal.open(spec["path"], shared=True, segment_size=spec.get("segment_size"),
                       max_wal_size=spec.get("max_wal_size", 1 << 30))
    faulthandler.cancel_dump_traceback_later()
    for signum, hook in ((signal.SIGUSR1, "stall"), (signal.SIGUSR2, "stall_locked")):
        signal.signal(signum, lambda *_, hook=hook: wal._core.inject_fault(hook, 0))
    say(f"R {wal.stats()['processes']}")  # (after the hooks: the parent may signal at once)
    inc = spec["incarnation"]

    def appender(thread: int) -> None:
        rng = random.Random(f"{spec['seed']}-{inc}-{thread}")
        every = spec.get("checkpoint_every", 0)
        for seq in range(1 << 62):
            record = make_record(inc, thread, seq, rng.randint(spec["min_size"], spec["max_size"]))
            lsn = wal.append(record, flush=True)
            say(f"A {thread} {seq} {lsn}")
            if every and thread == 0 and seq % every == every - 1:
                keep = 4 * wal.segment_size
                before = wal.flushed_lsn - keep
                if before > 0:
                    say(f"T {before}")
                    wal.truncate(before)

    def guarded(thread: int) -> None:
        """A thread that fails ends the process (exit 70): its siblings must not go on
        acknowledging as if it were writing."""
        try:
            appender(thread)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(70)

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True)
               for t in range(spec["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
