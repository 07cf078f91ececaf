"""An eventsourcing application's events followed from another process.

A writer process (tests/_eventsourcing_child.py, ``app``) saves aggregates to its pmemwal
store; this process opens the same store read-only (``<APP>_PMEMWAL_READONLY``):

- eventsourcing's ProjectionRunner projects every event, in order, those written after it
  started included;
- ``subscribe(gt=N)`` here yields what the writer's own subscription yields: the same
  notifications, IDs and order, as they are written;
- a read-only recorder refuses to write, and a second writer is told how to read instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("eventsourcing")

from _eventsourcing_child import Tallies  # noqa: E402
from conftest import TESTS_DIR, child_env  # noqa: E402
from eventsourcing.dcb.api import DCBEvent, DCBQuery, DCBQueryItem  # noqa: E402
from eventsourcing.persistence import (  # noqa: E402
    InfrastructureFactory, OperationalError, StoredEvent, Tracking)
from eventsourcing.projection import Projection, ProjectionRunner  # noqa: E402
from eventsourcing.utils import Environment  # noqa: E402

from pmemwal.integrations import eventsourcing as pes  # noqa: E402

CHILD = str(TESTS_DIR / "_eventsourcing_child.py")
APP = "Tallies"     # the writer's application (tests/_eventsourcing_child.py)


def module_env(base: Path, **extra: str) -> dict[str, str]:
    return {"PERSISTENCE_MODULE": "pmemwal.integrations.eventsourcing",
            "PMEMWAL_PATH": str(base), "PMEMWAL_SEGMENT_SIZE": str(1 << 20), **extra}


class Writer:
    """The writer process, driven one command at a time (see ``app_writer``)."""

    def __init__(self, base: Path) -> None:
        env = child_env(**module_env(base))
        env["PYTHONPATH"] = f"{TESTS_DIR}:{env['PYTHONPATH']}"
        self.proc = subprocess.Popen([sys.executable, CHILD, "app"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._answer() == "READY"

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def _answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the writer ended (exit status {self.proc.poll()})"
        return json.loads(line)

    def close(self) -> None:
        try:
            self.ask("quit")
        except (AssertionError, BrokenPipeError, json.JSONDecodeError):
            pass
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def writer(shm_dir: Path) -> Iterator[Writer]:
    w = Writer(shm_dir)
    try:
        yield w
    finally:
        w.close()


def reader_env(base: Path) -> dict[str, str]:
    """The writer's application, read only; a projection's own tracking log is written."""
    return module_env(base, **{f"{APP.upper()}_PMEMWAL_READONLY": "yes"})


class TallyView(pes.PmemwalTrackingRecorder):
    """A materialised view: the events projected, in order, with their notification IDs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[list] = []

    def record(self, domain_event: Any, tracking: Tracking) -> None:
        self.rows.append([tracking.notification_id, str(domain_event.originator_id),
                          domain_event.originator_version,
                          f"{type(domain_event).__module__}:{type(domain_event).__qualname__}"])
        self.insert_tracking(tracking)


class TallyProjection(Projection[TallyView]):
    name = "tallyprojection"

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        self.view.record(domain_event, tracking)


def test_a_projection_runner_projects_what_another_process_writes(
        shm_dir: Path, writer: Writer) -> None:
    writer.ask("new 3 2")                       # before the runner starts
    with ProjectionRunner(application_class=Tallies, projection_class=TallyProjection,
                          view_class=TallyView, env=reader_env(shm_dir)) as runner:
        assert runner.app.recorder.datastore.readonly
        for _ in range(4):                      # after: each seen as it is written
            last = writer.ask("new 2 3")
            runner.wait(last, timeout=10)
        expected = writer.ask("all")
        assert len(expected) == 3 * 3 + 8 * 4
        assert runner.view.rows == expected
        assert runner.view.max_tracking_id(runner.app.name) == expected[-1][0]


def test_subscribe_in_a_reader_yields_what_the_writer_subscription_yields(
        shm_dir: Path, writer: Writer) -> None:
    first = writer.ask("new 2 4")
    assert writer.ask(f"sub {first - 3}")
    factory = InfrastructureFactory.construct(Environment(APP, reader_env(shm_dir)))
    recorder = factory.application_recorder()
    seen: list[list] = []
    last: list[int] = []
    done = threading.Event()
    with recorder.subscribe(gt=first - 3) as subscription:

        def iterate() -> None:
            for n in subscription:
                seen.append([n.id, str(n.originator_id), n.originator_version, n.topic])
                if last and n.id >= last[0]:
                    done.set()

        thread = threading.Thread(target=iterate, daemon=True)
        thread.start()
        # Written after the subscription began, while it iterates: single events and a
        # burst of more than a page (500), handed over by the follower or the pull thread.
        for _ in range(10):
            writer.ask("new 1 0")
        last.append(writer.ask("new 200 2"))
        if seen and seen[-1][0] >= last[0]:
            done.set()
        assert done.wait(10), seen[-3:]
        subscription.stop()
        thread.join(10)
    factory.close()
    theirs = writer.ask("subbed")
    assert seen == theirs
    assert [row[0] for row in seen] == list(range(first - 2, last[0] + 1))


def test_a_reader_refuses_to_write_and_a_second_writer_is_told_to_read(
        shm_dir: Path, writer: Writer) -> None:
    writer.ask("new 1 1")
    with pytest.raises(OperationalError, match="PMEMWAL_READONLY"):
        InfrastructureFactory.construct(Environment(APP, module_env(shm_dir))
                                        ).application_recorder()
    factory = InfrastructureFactory.construct(Environment(APP, reader_env(shm_dir)))
    try:
        recorder = factory.application_recorder()
        assert recorder.max_notification_id() == 2
        with pytest.raises(OperationalError, match="read-only"):
            recorder.insert_events([StoredEvent("x", 1, "t", b"s")])
        assert len(recorder.select_notifications(1, 10)) == 2
    finally:
        factory.close()


def subscribed(recorder: Any, gt: int, until: int, topics: tuple[str, ...] = ()) -> list[list]:
    """What ``recorder.subscribe(gt, topics)`` yields up to notification ``until``."""
    seen: list[list] = []
    with recorder.subscribe(gt=gt, topics=topics) as subscription:
        for n in subscription:
            seen.append([n.id, str(n.originator_id), n.originator_version, n.topic])
            if n.id >= until:
                break
    return seen


def test_a_reader_subscription_of_some_topics_skips_the_others(
        shm_dir: Path, writer: Writer) -> None:
    factory = InfrastructureFactory.construct(Environment(APP, reader_env(shm_dir)))
    try:
        recorder = factory.application_recorder()
        writer.ask("new 2 2")
        last = writer.ask("new 3 0")            # the last notification: a Created event
        created = "_eventsourcing_child:Tally.Created"
        expected = [row for row in writer.ask("all") if row[3] == created]
        assert len(expected) == 5
        assert subscribed(recorder, 0, last, (created,)) == expected
    finally:
        factory.close()


def test_a_reader_opened_with_no_writer_follows_the_next_one(shm_dir: Path) -> None:
    first = Writer(shm_dir)
    try:
        before = first.ask("new 2 1")
    finally:
        first.close()
    factory = InfrastructureFactory.construct(Environment(APP, reader_env(shm_dir)))
    try:
        recorder = factory.application_recorder()
        assert recorder.max_notification_id() == before
        second = Writer(shm_dir)                # (the same application: its logs reopened)
        try:
            last = second.ask("new 2 2")
            assert subscribed(recorder, before, last) == second.ask("all")[before:]
        finally:
            second.close()
    finally:
        factory.close()


def test_closing_a_reader_ends_its_follower_thread(shm_dir: Path, writer: Writer) -> None:
    writer.ask("new 1 1")
    factory = InfrastructureFactory.construct(Environment(APP, reader_env(shm_dir)))
    factory.application_recorder()

    def followers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("pmemwal-es-follow")]

    assert len(followers()) == 1
    factory.close()
    assert followers() == []


def test_a_reader_in_the_writing_process_shares_the_writers_datastore(shm_dir: Path) -> None:
    writing = InfrastructureFactory.construct(Environment(APP, module_env(shm_dir)))
    reading = InfrastructureFactory.construct(Environment(APP, reader_env(shm_dir)))
    try:
        recorder = writing.application_recorder()
        assert reading.application_recorder().datastore is recorder.datastore
    finally:
        reading.close()
        writing.close()


def test_a_dcb_reader_follows_appends_and_its_subscription_yields_them(shm_dir: Path) -> None:
    path = shm_dir / "dcb"
    writer = pes.open_dcb_datastore(path, segment_size=1 << 20)
    reader = pes.PmemwalDCBDatastore(os.path.realpath(path), readonly=True)  # (as another
    try:                                                                     # process's)
        events = [DCBEvent("Registered", f"{i}".encode(), [f"student-{i % 3}"])
                  for i in range(30)]
        writer.append(events[:10])
        recorder = pes.PmemwalDCBRecorder(reader)
        with recorder.subscribe(DCBQuery([DCBQueryItem([], ["student-1"])]), after=2) as sub:
            for event in events[10:]:           # one entry each, after it began
                writer.append([event])
            seen = []
            for sequenced in sub:
                seen.append((sequenced.position, sequenced.event.data))
                if sequenced.position >= 29:
                    break
        wanted, _ = writer.read(DCBQuery([DCBQueryItem([], ["student-1"])]), after=2)
        assert seen == [(e.position, e.event.data) for e in wanted]
        assert reader.read()[1] == 30
    finally:
        reader.close()
        writer.close()
