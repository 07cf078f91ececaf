"""The crash tests' writer for pmemwal.integrations.eventsourcing: run with one JSON spec.

It takes its persistence module and directory from the environment (``PERSISTENCE_MODULE``,
``PMEMWAL_PATH``...), as an eventsourcing application would, and makes a process recorder.
Then spec["threads"] threads each store batches forever: thread ``t``'s batch ``k`` is 1 to 20
events of one of its three originators (their next versions), states of 0 to 3000 bytes that
start with ``"t k j n"`` (the event's place in its batch), and the tracking record
``("upstream-t", k)``.  After each insert_events returns it prints ``A t k n first_id``.
A thread resumes at the batch after the last one tracked, so a child can carry on where a
killed one stopped.  The first line is ``READY``.  The parent SIGKILLs it.

With the argument ``app`` it is the follow tests' writer instead (``app_writer``).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import uuid

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import InfrastructureFactory, Notification, StoredEvent, Tracking
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


# ---- the follow tests' writer: an application, driven line by line ---------------------

class Tally(Aggregate):
    """An aggregate of the follow tests: created, then counted."""

    @event("Created")
    def __init__(self, name: str) -> None:
        self.name = name
        self.total = 0

    @event("Counted")
    def count(self, n: int) -> None:
        self.total += n


class Tallies(Application):
    """The follow tests' application (its events log: ``tallies_events``)."""

    def new(self, name: str, counts: int) -> None:
        tally = Tally(name)
        for n in range(counts):
            tally.count(n)
        self.save(tally)


def as_row(notification: Notification) -> list:
    return [notification.id, str(notification.originator_id),
            notification.originator_version, notification.topic]


def app_writer() -> None:
    """The follow tests' writer: a Tallies application from the environment, commands read
    from stdin, a JSON answer printed for each:

    - ``new K E``: K tallies saved, one at a time, each created and counted E times;
      answers the max notification ID;
    - ``sub G``: this process's own subscription from after G starts (in a thread);
    - ``subbed``: what it has yielded, once it reached the max notification ID;
    - ``all``: every notification, as the application's recorder selects them.
    """
    app = Tallies(env=dict(os.environ))
    recorder = app.recorder
    seen: list[list] = []
    subscribed = threading.Event()
    k = 0

    def follow(gt: int) -> None:
        with recorder.subscribe(gt=gt) as subscription:
            subscribed.set()
            for notification in subscription:
                seen.append(as_row(notification))

    print(json.dumps("READY"), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "new":
            for _ in range(int(args[0])):
                k += 1
                app.new(f"tally {k}", int(args[1]))
            answer: object = recorder.max_notification_id()
        elif command == "sub":
            threading.Thread(target=follow, args=(int(args[0]),), daemon=True).start()
            answer = subscribed.wait(30)
        elif command == "subbed":
            last = recorder.max_notification_id()
            deadline = time.monotonic() + 30
            while (not seen or seen[-1][0] != last) and time.monotonic() < deadline:
                time.sleep(0.01)
            answer = seen
        elif command == "all":
            answer = [as_row(n) for n in recorder.select_notifications(1, 1 << 30)]
        else:
            break
        print(json.dumps(answer), flush=True)


def main() -> None:
    if sys.argv[1] == "app":    # (imported by name: its events' topics name the module)
        import _eventsourcing_child
        _eventsourcing_child.app_writer()
        return
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
