"""The crash tests' writer for pmemwal.integrations.eventsourcing: run with one JSON spec.

It takes its persistence module and directory from the environment (``PERSISTENCE_MODULE``,
``PMEMWAL_PATH``...), as an eventsourcing application would, and makes a process recorder.
Then spec["threads"] threads each store batches forever: thread ``t``'s batch ``k`` is 1 to 20
events of one of its three originators (their next versions), states of 0 to 3000 bytes that
start with ``"t k j n"`` (the event's place in its batch), and the tracking record
``("upstream-t", k)``.  After each insert_events returns it prints ``A t k n first_id``.
A thread resumes at the batch after the last one tracked, so a child can carry on where a
killed one stopped.  The first line is ``READY``.  The parent SIGKILLs it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import uuid

from eventsourcing.persistence import InfrastructureFactory, StoredEvent, Tracking
from eventsourcing.utils import Environment

from pmemwal.integrations.eventsourcing import PmemwalProcessRecorder

NAMESPACE = uuid.UUID("5e1f0000-0000-4000-8000-000000000000")
ORIGINATORS = 3
TOPIC = "crash:Event"


def originator(thread: int, k: int) -> uuid.UUID:
    """The originator of thread ``thread``'s batch ``k`` (the parent uses this too)."""
    return uuid.uuid5(NAMESPACE, f"{thread}/{k % ORIGINATORS}")


def padding(rng: random.Random) -> bytes:
    """0 to 3000 random bytes: records of many sizes, some across pages and segments."""
    return rng.randbytes(rng.randint(0, 3000))


def writer(recorder, thread: int, say) -> None:
    name = f"upstream-{thread}"
    k = recorder.max_tracking_id(name) or 0
    rng = random.Random(f"{thread}/{k}")
    while True:
        k += 1
        oid = originator(thread, k)
        last = recorder.select_events(oid, desc=True, limit=1)
        version = last[0].originator_version if last else 0
        n = rng.randint(1, 20)
        events = [StoredEvent(originator_id=oid, originator_version=version + 1 + j, topic=TOPIC,
                              state=f"{thread} {k} {j} {n} ".encode() + padding(rng))
                  for j in range(n)]
        ids = recorder.insert_events(events, tracking=Tracking(name, k))
        say(f"A {thread} {k} {n} {ids[0]}")


def main() -> None:
    spec = json.loads(sys.argv[1])
    # As an Application does: construct() alone would not read os.environ.
    recorder = InfrastructureFactory.construct(Environment(env=dict(os.environ))).process_recorder()
    assert isinstance(recorder, PmemwalProcessRecorder), recorder
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            print(line, flush=True)

    threads = [threading.Thread(target=writer, args=(recorder, t, say), daemon=True)
               for t in range(spec["threads"])]
    say("READY")
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
