"""pmemwal.integrations.eventsourcing's own promises (tests/test_eventsourcing.py runs
eventsourcing's conformance tests):

- a writer SIGKILLed at a random moment: every acknowledged batch is there after reopening,
  no batch is there in part, versions are dense per originator, notification IDs are dense and
  the same as when they were acknowledged, and a new writer carries on from there;
- the recorders against eventsourcing's in-memory POPO ones, on a random workload, before and
  after closing and replaying;
- one insert, one log entry; a conflicting batch writes nothing;
- the layout, the shared datastores, and the errors;
- an application's tracking and process recorders share tracking positions, and an originator
  is found by its UUID or the UUID's string form;
- the DCB recorder against eventsourcing's in-memory one, one entry per append, and a
  DCBApplication taking this module from its environment.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("eventsourcing")

from conftest import TESTS_DIR, run_and_kill  # noqa: E402
from eventsourcing.dcb.api import (  # noqa: E402
    DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem)
from eventsourcing.dcb.application import DCBApplication  # noqa: E402
from eventsourcing.dcb.popo import InMemoryDCBRecorder  # noqa: E402
from eventsourcing.persistence import (  # noqa: E402
    DatabaseError, DataError, InfrastructureFactory, IntegrityError, InterfaceError,
    OperationalError, ProgrammingError, StoredEvent, Tracking)
from eventsourcing.popo import POPOProcessRecorder  # noqa: E402
from eventsourcing.utils import Environment  # noqa: E402

import pmemwal  # noqa: E402
from pmemwal.integrations.eventsourcing import stored_index as es_index  # noqa: E402
from pmemwal.integrations import eventsourcing as pes  # noqa: E402

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")

CHILD = str(TESTS_DIR / "_eventsourcing_child.py")
SEGMENT = 1 << 20


def module_env(base: Path, **extra: str) -> dict[str, str]:
    return {"PERSISTENCE_MODULE": "pmemwal.integrations.eventsourcing", "PMEMWAL_PATH": str(base),
            "PMEMWAL_SEGMENT_SIZE": str(SEGMENT), **extra}


def factory_for(base: Path, name: str = "", **extra: str) -> pes.PmemwalFactory:
    factory = InfrastructureFactory.construct(Environment(name, module_env(base, **extra)))
    assert isinstance(factory, pes.PmemwalFactory)
    return factory


def event(originator_id, version: int, topic: str = "t", state: bytes = b"s") -> StoredEvent:
    return StoredEvent(originator_id=originator_id, originator_version=version, topic=topic,
                       state=state)


def log_payloads(path: Path) -> list[bytes]:
    """Every entry of the (closed) log directory ``path``."""
    with pmemwal.open_log(path, create=False) as log:
        return [bytes(e.payload) for e in log]


# ---- SIGKILL ------------------------------------------------------------------------

Batches = dict[tuple[int, int], tuple[int, int]]   # (thread, k) -> (events, first ID)


def check_after_crash(base: Path, known: Batches) -> tuple[Batches, bool]:
    """What a killed child leaves is whole and dense, and holds each batch that was known
    (acknowledged, or found by an earlier check) as it was known; returns the batches there."""
    factory = factory_for(base)
    try:
        recorder = factory.process_recorder()
        notes = recorder.select_notifications(None, limit=1 << 30)
        assert [n.id for n in notes] == list(range(1, len(notes) + 1))
        rows: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
        for note in notes:
            thread, k, j, n = map(int, note.state.split(b" ", 4)[:4])
            rows[thread, k].append((note.id, j, n))
        found = {}
        for batch, batch_rows in rows.items():
            ids, js, ns = zip(*batch_rows)
            assert js == tuple(range(ns[0])), f"batch {batch} is there in part: {js}"
            assert ids == tuple(range(ids[0], ids[0] + len(ids))), f"batch {batch} is split"
            found[batch] = (ns[0], ids[0])
        lost = [batch for batch in known if found.get(batch) != known[batch]]
        assert not lost, f"known batches lost or changed: {lost[:5]}"
        for thread in {t for t, _ in found}:
            present = sorted(k for t, k in found if t == thread)
            assert present == list(range(1, len(present) + 1)), f"thread {thread} has gaps"
            # At most the batch in flight when the child died is there unacknowledged.
            assert len(present) <= 1 + sum(1 for t, _ in known if t == thread)
            assert recorder.max_tracking_id(f"upstream-{thread}") == present[-1]
        for oid in {note.originator_id for note in notes}:
            versions = [e.originator_version for e in recorder.select_events(oid)]
            assert versions == list(range(1, len(versions) + 1))
        from_index = recorder.datastore.replayed_from > 1
        stored = answers(recorder)
    finally:
        factory.close()
    # The same answers from an index rebuilt from the log alone: what the killed child's
    # checkpoints stored agrees with the log it stored them beside.
    shutil.rmtree(base / "stored_events" / es_index.INDEX_DIR)
    factory = factory_for(base)
    try:
        recorder = factory.process_recorder()
        assert recorder.datastore.replayed_from == 1
        assert answers(recorder) == stored
    finally:
        factory.close()
    return found, from_index


def answers(recorder) -> tuple:
    """Everything a process recorder answers: notifications, each originator's events by
    select_events (all, the last, a range), the tracking positions."""
    notes = recorder.select_notifications(None, limit=1 << 30)
    oids = sorted({note.originator_id for note in notes}, key=str)
    return (notes, [(recorder.select_events(oid), recorder.select_events(oid, desc=True, limit=1),
                     recorder.select_events(oid, gt=2, lte=5)) for oid in oids],
            [recorder.max_tracking_id(f"upstream-{t}") for t in range(2)])


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_sigkill_keeps_acknowledged_batches_whole(shm_dir: Path, mode: str) -> None:
    rng = random.Random(f"eventsourcing-sigkill-{mode}")
    # index checkpoints every 20 ms: the kill lands before, during or after one
    env = module_env(shm_dir, PMEMWAL_MODE=mode, PMEMWAL_CHECKPOINT_INTERVAL="0.02")
    known: Batches = {}
    from_index = []
    for _ in range(3):      # each child carries on from what the killed one left
        lines, stderr = run_and_kill(CHILD, {"threads": 2}, env, rng.uniform(0.1, 0.3))
        assert lines and lines[0] == b"READY\n", stderr
        acked = [tuple(map(int, line.split()[1:])) for line in lines[1:]]
        known.update({(t, k): (n, first) for t, k, n, first in acked})
        known, used = check_after_crash(shm_dir, known)
        from_index.append(used)
    assert len(known) >= 10, "the writers hardly wrote: the test proved little"
    assert any(from_index), "no reopen read a stored index: the test proved little of it"


# ---- against POPO -------------------------------------------------------------------

def random_batch(rng: random.Random, oids: list, versions: dict) -> list[StoredEvent]:
    """1 to 4 events of one originator; now and then a version taken already (a conflict)."""
    oid = rng.choice(oids)
    start = versions[oid] + (0 if rng.random() < 0.1 and versions[oid] else 1)
    step = rng.choice([1, 1, 1, 3])     # versions may skip (snapshots do)
    return [event(oid, start + i * step, rng.choice("abcd"), rng.randbytes(rng.randint(0, 40)))
            for i in range(rng.randint(1, 4))]


def same_answers(ours, popo, rng: random.Random, oids: list) -> None:
    assert ours.max_notification_id() == popo.max_notification_id()
    assert ours.max_tracking_id("up") == popo.max_tracking_id("up")
    count = popo.max_notification_id() or 0
    for _ in range(20):
        oid = rng.choice(oids)
        kw = {"gt": rng.choice([None, 0, 2, 5]), "lte": rng.choice([None, 1, 4, 9]),
              "desc": rng.random() < 0.5, "limit": rng.choice([None, 1, 3])}
        assert ours.select_events(oid, **kw) == popo.select_events(oid, **kw), kw
        kw = {"start": rng.choice([None, 0, 1, rng.randint(1, count + 2)]),
              "limit": rng.randint(1, 30), "stop": rng.choice([None, rng.randint(0, count + 2)]),
              "topics": rng.choice([(), ("a",), ("b", "d"), ("zz",)]),
              "inclusive_of_start": rng.random() < 0.5}
        assert ours.select_notifications(**kw) == popo.select_notifications(**kw), kw


@pytest.fixture(params=["hashes", "collisions"])
def key_hashes(request, monkeypatch) -> str:
    """Keys with 64-bit hashes; or with 2-bit ones, so that every run holds keys that share
    a hash and every answer it gives must be checked against the events, and with runs
    merged only when the same size, so that several stand at once."""
    if request.param == "collisions":
        monkeypatch.setattr(es_index, "HASH_MASK", 0x3)
        monkeypatch.setattr(es_index, "FANOUT", 1)
    return request.param


def reopened_from_index(datastore) -> None:
    """A datastore opened after a clean close replayed nothing: the index was read."""
    assert datastore.replayed_from == datastore._log.last_index + 1 > 1


def test_same_answers_as_popo_before_and_after_replay(shm_dir: Path, key_hashes: str) -> None:
    """Random inserts, conflicting ones among them, and reads against POPO's, with index
    checkpoints now and then (rows and runs stored, runs merged), then reopened from the
    stored index."""
    rng = random.Random("eventsourcing-popo")
    oids = [uuid.uuid4() for _ in range(4)] + ["str-id-1", "ünï-2"]
    oids.append(str(oids[0]))   # the same originator as oids[0], by its string form
    versions = dict.fromkeys(oids, 0)
    popo, factory = POPOProcessRecorder(), factory_for(shm_dir)
    ours = factory.process_recorder()
    tracked = 0
    for step in range(300):
        batch = random_batch(rng, oids, versions)
        tracking = None
        if rng.random() < 0.3:
            tracked += rng.choice([0, 1, 2])    # 0: a tracking ID taken already
            tracking = Tracking("up", tracked)
        outcomes = []
        for recorder in (popo, ours):
            try:
                outcomes.append(recorder.insert_events(batch, tracking=tracking))
            except IntegrityError:
                outcomes.append("conflict")
        assert outcomes[0] == outcomes[1], (step, batch, tracking)
        if outcomes[0] != "conflict":
            versions[batch[0].originator_id] = batch[-1].originator_version
        if step % 50 == 0:
            same_answers(ours, popo, rng, oids)
        if step % 23 == 0:
            ours.datastore.checkpoint()
    same_answers(ours, popo, rng, oids)
    runs = ours.datastore._index.runs
    assert len(runs) >= (2 if key_hashes == "collisions" else 1), "too few runs to prove much"
    factory.close()
    factory = factory_for(shm_dir)
    reopened = factory.process_recorder()
    reopened_from_index(reopened.datastore)
    same_answers(reopened, popo, rng, oids)
    factory.close()


def test_versions_inserted_out_of_order_are_selected_in_order(shm_dir: Path) -> None:
    factory = factory_for(shm_dir)
    recorder = factory.aggregate_recorder("snapshots")
    oid = uuid.uuid4()
    for version in (5, 2, 9, 3):
        recorder.insert_events([event(oid, version)])
    assert [e.originator_version for e in recorder.select_events(oid)] == [2, 3, 5, 9]
    assert [e.originator_version for e in recorder.select_events(oid, lte=4, desc=True)] == [3, 2]
    factory.close()


# ---- entries ------------------------------------------------------------------------

def test_one_entry_per_insert_and_none_for_a_conflict(shm_dir: Path) -> None:
    factory = factory_for(shm_dir)
    recorder = factory.process_recorder()
    a, b = uuid.uuid4(), "b"
    assert recorder.insert_events([event(a, 1), event(a, 2), event(b, 1)]) == [1, 2, 3]
    recorder.insert_events([], tracking=Tracking("up", 4))
    for conflict in ([event(a, 3), event(b, 1)], [event(a, 3), event(a, 3)]):
        with pytest.raises(IntegrityError):
            recorder.insert_events(conflict)
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(a, 3)], tracking=Tracking("up", 4))
    assert recorder.insert_events([event(a, 3)], tracking=Tracking("up", 5)) == [4]
    assert recorder.insert_events([]) == []     # nothing to store: no entry
    factory.close()
    batches = [pes.decode_batch(memoryview(p)) for p in log_payloads(shm_dir / "stored_events")]
    assert [(t, [(r.key, r.version) for r in rows]) for t, rows in batches] == [
        (None, [(a.bytes, 1), (a.bytes, 2), ("b", 1)]),
        (Tracking("up", 4), []),
        (Tracking("up", 5), [(a.bytes, 3)]),
    ]


def test_a_foreign_log_is_refused(shm_dir: Path) -> None:
    with pmemwal.open_log(shm_dir / "stored_events", segment_size=SEGMENT) as log:
        log.append(b"\x07 not a batch", sync=True)
    factory = factory_for(shm_dir)
    with pytest.raises(DatabaseError, match="entry 1 is not a batch"):
        factory.application_recorder()
    factory.close()


# ---- layout, sharing, errors --------------------------------------------------------

def test_layout_follows_the_application_name(shm_dir: Path) -> None:
    factory = factory_for(shm_dir, "BankAccounts")
    factory.application_recorder()
    factory.aggregate_recorder("snapshots")
    factory.tracking_recorder()
    factory.close()
    factory = factory_for(shm_dir)
    factory.process_recorder()
    factory.tracking_recorder()
    factory.close()
    assert sorted(os.listdir(shm_dir)) == ["bankaccounts_events", "bankaccounts_snapshots",
                                           "bankaccounts_tracking", "notification_tracking",
                                           "stored_events"]


def test_factories_share_a_datastore_until_the_last_closes(shm_dir: Path) -> None:
    first, second = factory_for(shm_dir), factory_for(shm_dir)
    r1, r2 = first.application_recorder(), second.process_recorder()
    assert r1.datastore is r2.datastore
    r1.insert_events([event("x", 1)])
    first.close()
    assert r2.insert_events([event("x", 2)]) == [2]
    second.close()
    assert r2.datastore.closed
    with pytest.raises(InterfaceError):
        r2.select_events("x")
    third = factory_for(shm_dir)
    assert [e.originator_version for e in third.application_recorder().select_events("x")] == [1, 2]
    third.close()


def test_errors_are_eventsourcings(shm_dir: Path) -> None:
    with pytest.raises(OSError, match="PMEMWAL_PATH"):
        pes.PmemwalFactory(Environment(env={}))
    with pytest.raises(OperationalError):       # CREATE_TABLE=no: nothing made
        factory_for(shm_dir, CREATE_TABLE="no").application_recorder()
    assert not os.listdir(shm_dir)
    with pmemwal.open_log(shm_dir / "stored_events"):   # another writer holds it
        with pytest.raises(OperationalError, match="another writer"):
            factory_for(shm_dir).application_recorder()
    store = pes.open_datastore(shm_dir / "small", max_record_size=4096)
    recorder = pes.PmemwalApplicationRecorder(store)
    with pytest.raises(DataError):
        recorder.insert_events([event("big", 1, state=bytes(5000))])
    with pytest.raises(DataError):
        recorder.insert_events([event("long topic", 1, topic="t" * 70000)])
    assert recorder.max_notification_id() is None
    store.close()


# ---- tracking positions shared, UUIDs by their string form (issue 26, point 5) -------

@pytest.mark.parametrize("name", ["", "BankAccounts"])
def test_tracking_and_process_recorders_share_tracking_positions(shm_dir: Path,
                                                                 name: str) -> None:
    """As in eventsourcing's PostgreSQL module, where both write one tracking table: a
    position taken through one recorder is taken for the other, before and after reopening,
    whichever recorder is made first."""
    factory = factory_for(shm_dir, name)
    process, tracking = factory.process_recorder(), factory.tracking_recorder()
    process.insert_events([event("a", 1)], tracking=Tracking("up", 5))
    assert tracking.max_tracking_id("up") == 5
    assert tracking.has_tracking_id("up", 5)
    with pytest.raises(IntegrityError):
        tracking.insert_tracking(Tracking("up", 5))
    tracking.insert_tracking(Tracking("up", 7))
    assert process.max_tracking_id("up") == 7
    with pytest.raises(IntegrityError):
        process.insert_events([event("a", 2)], tracking=Tracking("up", 6))
    assert [e.originator_version for e in process.select_events("a")] == [1]  # nothing written
    with pytest.raises(IntegrityError):
        process.insert_tracking(Tracking("up", 7))
    factory.close()
    for first in ("tracking", "process"):     # reopened, either recorder made first
        factory = factory_for(shm_dir, name)
        made = {first: getattr(factory, f"{first}_recorder")()}
        assert made[first].max_tracking_id("up") == 7, first
        for kind in ("tracking", "process"):
            made.setdefault(kind, getattr(factory, f"{kind}_recorder")())
        with pytest.raises(IntegrityError):
            made["tracking"].insert_tracking(Tracking("up", 7))
        with pytest.raises(IntegrityError):
            made["process"].insert_events([event("a", 2)], tracking=Tracking("up", 6))
        assert made["process"].max_tracking_id("up") == 7
        factory.close()


def test_a_tracking_recorder_made_before_the_events_log_sees_the_process_recorders(
        shm_dir: Path) -> None:
    """The tracking recorder of one factory, made while no events log existed, and the process
    recorder of another factory (same application) made after it."""
    first = factory_for(shm_dir, "Proc")
    tracking = first.tracking_recorder()
    second = factory_for(shm_dir, "Proc")
    process = second.process_recorder()
    process.insert_events([event("a", 1)], tracking=Tracking("up", 3))
    assert tracking.max_tracking_id("up") == 3
    with pytest.raises(IntegrityError):
        tracking.insert_tracking(Tracking("up", 2))
    second.close()          # the first factory's tracking recorder still sees the events log
    assert tracking.max_tracking_id("up") == 3
    tracking.insert_tracking(Tracking("up", 4))
    first.close()
    third = factory_for(shm_dir, "Proc")
    assert third.process_recorder().max_tracking_id("up") == 4
    third.close()


def test_an_event_stored_under_a_uuid_is_found_by_its_string_form(shm_dir: Path) -> None:
    """As in eventsourcing's POPO and PostgreSQL modules: one originator, either form."""
    factory = factory_for(shm_dir)
    recorder = factory.application_recorder()
    a, b = uuid.uuid4(), uuid.uuid4()
    recorder.insert_events([event(a, 1)])
    recorder.insert_events([event(str(b), 1)])
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(str(a), 1)])
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(b, 1)])
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(a, 2), event(str(a), 2)])
    recorder.insert_events([event(str(a), 2)])
    recorder.insert_events([event(b, 2)])
    # Other spellings of a UUID are other originators, as in POPO.
    recorder.insert_events([event(a.hex, 1), event(str(a).upper(), 1)])

    def check(recorder) -> None:
        for oid in (a, str(a)):     # each event comes back with the ID it was stored under
            assert recorder.select_events(oid) == [event(a, 1), event(str(a), 2)]
            assert recorder.select_events(oid, desc=True, limit=1) == [event(str(a), 2)]
        for oid in (b, str(b)):
            assert recorder.select_events(oid) == [event(str(b), 1), event(b, 2)]
        assert recorder.select_events(a.hex) == [event(a.hex, 1)]
        assert recorder.select_events(str(a).upper()) == [event(str(a).upper(), 1)]
        assert recorder.max_notification_id() == 6

    check(recorder)
    factory.close()
    factory = factory_for(shm_dir)
    check(factory.application_recorder())
    factory.close()


# ---- DCB ------------------------------------------------------------------------------

def dcb_query(rng: random.Random):
    """None, no items, or 1 to 3 items of 0 to 2 types and 0 to 3 tags (some unknown)."""
    if rng.random() < 0.1:
        return None
    return DCBQuery(items=[DCBQueryItem(types=rng.sample("abcz", rng.randint(0, 2)),
                                        tags=rng.sample(["t1", "t2", "t3", "t4", "tz"],
                                                        rng.randint(0, 3)))
                           for _ in range(rng.randint(0, 3))])


def test_dcb_same_answers_as_in_memory_before_and_after_replay(shm_dir: Path,
                                                              key_hashes: str) -> None:
    """The DCB recorder against eventsourcing's in-memory one: random appends, conditional
    ones among them (which conflict or not alike), and random reads, with index checkpoints
    now and then, then reopened from the stored index."""
    rng = random.Random("eventsourcing-dcb")
    memory, factory = InMemoryDCBRecorder(), factory_for(shm_dir, "Courses")
    ours = factory.dcb_recorder()

    def same_reads() -> None:
        for _ in range(30):
            query, after = dcb_query(rng), rng.choice([None, 0, rng.randint(0, 200)])
            limit = rng.choice([None, None, 0, 1, rng.randint(1, 50)])
            mine, theirs = ours.read(query, after=after, limit=limit), memory.read(
                query, after=after, limit=limit)
            assert list(mine) == list(theirs), (query, after, limit)
            assert mine.head == theirs.head, (query, after, limit)

    for step in range(200):
        events = [DCBEvent(type=rng.choice("abc"), data=rng.randbytes(rng.randint(0, 30)),
                           tags=rng.sample(["t1", "t2", "t3", "t4", "ü"], rng.randint(0, 3)))
                  for _ in range(rng.randint(1, 3))]
        condition = None
        if rng.random() < 0.6:
            condition = DCBAppendCondition(dcb_query(rng) or DCBQuery(),
                                           after=rng.choice([None, rng.randint(0, 200)]))
        outcomes = []
        for recorder in (memory, ours):
            try:
                outcomes.append(recorder.append(events, condition))
            except IntegrityError:
                outcomes.append("conflict")
        assert outcomes[0] == outcomes[1], (step, events, condition)
        if step % 40 == 0:
            same_reads()
        if step % 17 == 0:
            ours.datastore.checkpoint()
    same_reads()
    factory.close()
    factory = factory_for(shm_dir, "Courses")
    ours = factory.dcb_recorder()
    reopened_from_index(ours.datastore)
    same_reads()
    factory.close()


def test_dcb_one_entry_per_append_and_none_for_a_conflict(shm_dir: Path) -> None:
    factory = factory_for(shm_dir)
    recorder = factory.dcb_recorder()
    first = [DCBEvent("Registered", b"{}", ["student-1"]), DCBEvent("Opened", b"", [])]
    assert recorder.append(first) == 2
    taken = DCBAppendCondition(DCBQuery([DCBQueryItem(["Registered"], ["student-1"])]))
    with pytest.raises(IntegrityError):
        recorder.append([DCBEvent("Registered", b"again", ["student-1"])], taken)
    with pytest.raises(ProgrammingError):
        recorder.append([])
    assert recorder.append([DCBEvent("Joined", b"x", ["student-1", "course-1"])],
                           DCBAppendCondition(taken.fail_if_events_match, after=2)) == 3
    factory.close()
    # The application's layout: its own directory, and nothing else touched.
    assert os.listdir(shm_dir) == ["dcb_dcb_events"]
    payloads = log_payloads(shm_dir / "dcb_dcb_events")
    assert [[(r.type, r.tags) for r in pes.decode_dcb_batch(memoryview(p))] for p in payloads] == [
        [("Registered", ("student-1",)), ("Opened", ())],
        [("Joined", ("student-1", "course-1"))],
    ]
    # A DCB log is not an events log, nor the other way round.
    with pytest.raises(DatabaseError, match="not a batch of events"):
        pes.open_datastore(shm_dir / "dcb_dcb_events")
    factory = factory_for(shm_dir)
    factory.application_recorder().insert_events([event("a", 1)])
    factory.close()
    with pytest.raises(DatabaseError, match="not a batch of DCB events"):
        pes.open_dcb_datastore(shm_dir / "stored_events")


def test_a_dcb_application_takes_the_module_from_its_environment(shm_dir: Path) -> None:
    class Enrolment(DCBApplication):
        pass

    with Enrolment(env=module_env(shm_dir)) as app:
        assert isinstance(app.factory, pes.PmemwalFactory)
        app.recorder.append([DCBEvent("CourseRegistered", b"{}", ["course-1"])])
    with Enrolment(env=module_env(shm_dir)) as app:
        found = list(app.recorder.read(DCBQuery([DCBQueryItem(tags=["course-1"])])))
        assert [(e.position, e.event.type) for e in found] == [(1, "CourseRegistered")]
    assert os.listdir(shm_dir) == ["enrolment_dcb_events"]
