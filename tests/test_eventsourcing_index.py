"""The eventsourcing datastores' stored index (pmemwal/integrations/eventsourcing/stored_index.py):

- a reopen reads it and replays only the entries after it, with memory that does not follow
  the number of events stored;
- an index that does not fit its log (a file gone or damaged, the log rewritten below it) is
  not used: a RecoveryWarning, a rebuild from the log, the same answers, and the stored one
  never comes back;
- a checkpoint that fails loses nothing, and the next one stores all;
- checkpoints leave only the files the two STATE slots name.

tests/test_eventsourcing_crash.py has the SIGKILL test (checkpoints every 20 ms, then the
stored index against one rebuilt from the log) and the comparisons with eventsourcing's own
in-memory recorders across checkpoints and colliding key hashes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import tracemalloc
import uuid
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("eventsourcing")

from eventsourcing.dcb.api import DCBEvent, DCBQuery, DCBQueryItem  # noqa: E402
from eventsourcing.persistence import (DatabaseError, IntegrityError, InterfaceError,  # noqa: E402
                                       OperationalError, StoredEvent, Tracking)

import pmemwal  # noqa: E402
from pmemwal.integrations.eventsourcing import stored_index as es_index  # noqa: E402
from pmemwal.integrations import eventsourcing as pes  # noqa: E402
from pmemwal.recovery import RecoveryWarning  # noqa: E402

OIDS = [uuid.UUID(int=i + 1) for i in range(40)] + ["str-one", "str-two"]


def fill(store: pes.PmemwalDatastore, batches: int, start: int = 0) -> None:
    """``batches`` batches of 1-3 events, one originator each, some with a tracking record."""
    for k in range(start, start + batches):
        oid = OIDS[k % len(OIDS)]
        last = store.select_events(oid, desc=True, limit=1)
        v = last[0].originator_version if last else 0
        events = [StoredEvent(originator_id=oid, originator_version=v + 1 + j,
                              topic=f"topic-{(k + j) % 5}", state=f"{k}/{j}".encode())
                  for j in range(1 + k % 3)]
        store.insert(events, Tracking("up", k + 1) if k % 4 == 0 else None)


def answers(store: pes.PmemwalDatastore) -> tuple:
    return (store.select_notifications(None, 1 << 30),
            store.select_notifications(3, 50, topics=("topic-2", "topic-4")),
            [(store.select_events(oid), store.select_events(oid, desc=True, limit=2),
              store.select_events(oid, gt=1, lte=3)) for oid in OIDS],
            store.max_tracking_id("up"), store.max_notification_id())


def events_dir(base: Path) -> str:
    return str(base / "events")


def reopen(base: Path) -> pes.PmemwalDatastore:
    return pes.open_datastore(events_dir(base), segment_size=1 << 20)


def drop(store: pes._LogStore) -> None:
    """Close without the closing checkpoint, as if the process had died there."""
    with pes._registry_lock:
        del pes._datastores[store._key]
    store._close_log()


def test_a_reopen_reads_the_index_and_replays_only_what_follows(shm_dir: Path) -> None:
    store = reopen(shm_dir)
    fill(store, 300)
    store.checkpoint()
    fill(store, 40, 300)
    expected = answers(store)
    last = store._log.last_index
    drop(store)              # no closing checkpoint: as if the process had died
    store = reopen(shm_dir)
    assert 1 < store.replayed_from <= last - 39
    assert answers(store) == expected
    store.close()
    store = reopen(shm_dir)
    assert store.replayed_from == last + 1
    assert answers(store) == expected
    store.close()


def test_reopen_memory_does_not_follow_the_events_stored(shm_dir: Path) -> None:
    """Reopening 20,000 stored events allocates a small fraction of what a replay does
    (the rows, the originators and their versions stay in the mapped files)."""
    store = reopen(shm_dir)
    for k in range(100):
        store.insert([StoredEvent(originator_id=uuid.UUID(int=k * 200 + j + 1), originator_version=1,
                                  topic="t", state=b"s") for j in range(200)])
    store.close()

    def allocated_by_open() -> tuple[int, int]:
        tracemalloc.start()
        try:
            opened = reopen(shm_dir)
            size = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        replayed = opened.replayed_from
        drop(opened)
        return size, replayed

    stored, replayed_from = allocated_by_open()
    assert replayed_from == 101
    os.rename(os.path.join(events_dir(shm_dir), "index"), str(shm_dir / "moved"))
    rebuilt, replayed_from = allocated_by_open()
    assert replayed_from == 1
    assert stored < rebuilt / 8, (stored, rebuilt)
    assert stored < 256 << 10, stored


@pytest.mark.parametrize("damage", ["run", "manifest", "rows", "rewritten"])
def test_an_index_that_does_not_fit_is_rebuilt_and_never_comes_back(shm_dir: Path,
                                                                     damage: str) -> None:
    store = reopen(shm_dir)
    fill(store, 120)
    store.close()
    index = Path(events_dir(shm_dir)) / es_index.INDEX_DIR
    if damage == "run":
        next(index.glob("*.run")).unlink()
    elif damage == "manifest":
        newest = max(index.glob("*.manifest"))
        newest.write_bytes(newest.read_bytes().replace(b"topic-1", b"topic-X"))
    elif damage == "rows":
        os.truncate(next(index.glob("*.rows")), 4096)
    else:                           # the log's last entry replaced by another, as a user may
        with pmemwal.open_log(events_dir(shm_dir), segment_size=1 << 20) as log:
            payload = bytes(log.entry(log.last_index).payload)
            log.truncate_after(log.last_index - 1)
            log.append(payload.replace(b"119/0", b"999/0"), sync=True)
    with pytest.warns(RecoveryWarning, match="index is not used"):
        store = reopen(shm_dir)
    assert store.replayed_from == 1
    expected = answers(store)
    if damage == "rewritten":
        assert [n.state for n in expected[0][-3:]] == [b"999/0", b"119/1", b"119/2"]
    drop(store)              # before a checkpoint: the void slot stands
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = reopen(shm_dir)     # no warning: nothing stored is offered any more
    assert store.replayed_from == 1
    assert answers(store) == expected
    store.close()
    store = reopen(shm_dir)
    assert store.replayed_from > 1 and answers(store) == expected
    store.close()


def test_a_failed_checkpoint_loses_nothing(shm_dir: Path, monkeypatch) -> None:
    store = reopen(shm_dir)
    fill(store, 60)
    store.checkpoint()
    fill(store, 30, 60)
    real = es_index.write_run

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(es_index, "write_run", fail)
    with pytest.raises(OperationalError, match="No space left"):
        store.checkpoint()
    fill(store, 30, 90)             # the frozen tail is still read, and grows a new one
    expected = answers(store)
    monkeypatch.setattr(es_index, "write_run", real)
    store.checkpoint()
    assert answers(store) == expected
    drop(store)
    store = reopen(shm_dir)
    assert store.replayed_from == store._log.last_index + 1
    assert answers(store) == expected
    store.close()


def test_checkpoints_keep_only_the_files_the_slots_name(shm_dir: Path) -> None:
    store = reopen(shm_dir)
    for k in range(40):
        fill(store, 5, 5 * k)
        store.checkpoint()
    runs = len(store._index.runs)
    store.close()
    assert runs <= 3, runs          # merged as they grow: a key takes a few searches
    index = Path(events_dir(shm_dir)) / es_index.INDEX_DIR
    states = es_index.IndexStore(events_dir(shm_dir), store._log.wal.wal_id, es_index.ORIGINATORS,
                                 pes.originator_bytes)
    newest = states.read_state()
    named = {f"{seq:016X}.manifest" for seq in (newest.seq - 1, newest.seq)}
    for seq in (newest.seq - 1, newest.seq):
        manifest = (index / f"{seq:016X}.manifest").read_text()
        named |= {f"{ident:016X}.run" for ident, _ in __import__("json").loads(manifest)["runs"]}
    on_disk = {p.name for p in index.iterdir() if not p.name.endswith(".rows")}
    assert on_disk == named | {"STATE"}


def test_dcb_reopen_reads_the_index(shm_dir: Path) -> None:
    path = str(shm_dir / "dcb")
    store = pes.open_dcb_datastore(path, segment_size=1 << 20)
    for k in range(200):
        store.append([DCBEvent(type=f"type-{k % 3}", data=b"%d" % k,
                               tags=[f"course-{k % 7}", f"student-{k % 11}"])])
        if k == 150:
            store.checkpoint()
    query = DCBQuery(items=[DCBQueryItem(types=["type-1"], tags=["course-3"]),
                            DCBQueryItem(tags=["student-4", "course-2"])])
    expected = store.read(query), store.read(query, after=100, limit=3), store.read()
    store.close()
    store = pes.open_dcb_datastore(path, segment_size=1 << 20)
    assert store.replayed_from == 201
    assert (store.read(query), store.read(query, after=100, limit=3), store.read()) == expected
    store.close()


# ---- found by an independent read (each failed before its fix) -------------------------

def test_a_datastore_dropped_during_a_background_checkpoint_is_closed(shm_dir: Path,
                                                                      monkeypatch) -> None:
    """Its last reference may be the WAL writer's checkpoint listener: the finalizer then
    runs on that thread, which cannot close the WAL it runs (closing joins it)."""
    store = pes.open_datastore(events_dir(shm_dir), segment_size=1 << 20,
                               checkpoint_interval=0.02)
    started, real = threading.Event(), es_index.IndexStore.write

    def slow(self, *args, **kwargs):
        started.set()
        time.sleep(0.3)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(es_index.IndexStore, "write", slow)
    failures: list = []             # what a finalizer raised (joining its own thread)
    monkeypatch.setattr(sys, "unraisablehook", failures.append)
    store.insert([StoredEvent(originator_id=OIDS[0], originator_version=1, topic="t",
                              state=b"s")])
    assert started.wait(5), "no background checkpoint came"
    alive = weakref.ref(store)
    del store                       # the listener's call holds the only reference now
    deadline = time.monotonic() + 5
    while alive() is not None:
        assert time.monotonic() < deadline, "the datastore outlived its listener's call"
        time.sleep(0.05)
    while True:                     # closed by another thread, once the listener returned
        try:
            store = reopen(shm_dir)
            break
        except OperationalError:
            assert time.monotonic() < deadline, "the log stayed locked"
            time.sleep(0.05)
    assert store.max_notification_id() == 1
    store.close()
    assert not failures, failures[0].exc_value


def test_a_read_racing_close_gets_interface_error(shm_dir: Path, monkeypatch) -> None:
    """A read that begins while close is closing the log finds the datastore closed,
    never an index already unmapped (an empty answer)."""
    store = reopen(shm_dir)
    for v in range(1, 30):
        store.insert([StoredEvent(originator_id=OIDS[0], originator_version=v, topic="t",
                                  state=b"s")])
    store.checkpoint()
    closing, go_on = threading.Event(), threading.Event()
    real_close = pmemwal.Log.close

    def slow_close(self):
        closing.set()
        go_on.wait(5)
        real_close(self)

    monkeypatch.setattr(pmemwal.Log, "close", slow_close)
    got: list = []

    def reader() -> None:
        try:
            got.append(len(store.select_events(OIDS[0])))
        except Exception as exc:
            got.append(type(exc).__name__)

    closer = threading.Thread(target=store.close)
    closer.start()
    assert closing.wait(5)
    r = threading.Thread(target=reader)
    r.start()
    time.sleep(0.2)                 # the reader is in, or waits for close to finish
    go_on.set()
    r.join()
    closer.join()
    assert got == ["InterfaceError"]


def test_background_checkpoints_keep_up_with_steady_inserts(shm_dir: Path) -> None:
    """An insert holds the lock through its sync; the writer's checkpoint waits for it
    (it used to give up, and the index was hardly ever stored under load).  The rounds are
    driven here, each once inserts went on since the last (counted, not timed)."""
    store = pes.open_datastore(events_dir(shm_dir), segment_size=1 << 20,
                               checkpoint_interval=3600)    # (no round of the WAL's own)
    stop = threading.Event()
    inserted = [0, 0]

    def insert(thread: int) -> None:
        while not stop.is_set():
            inserted[thread] += 1
            oid = uuid.UUID(int=(thread << 32) + inserted[thread])
            store.insert([StoredEvent(originator_id=oid, originator_version=1, topic="t",
                                      state=b"s")])

    threads = [threading.Thread(target=insert, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    rounds = 20
    try:
        for _ in range(rounds):
            seen = sum(inserted)
            while sum(inserted) < seen + 2 and all(t.is_alive() for t in threads):
                time.sleep(0.001)   # (inserts on both sides of the round)
            store._background_checkpoint(0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    stored = store._store.last_seq
    assert store.index_error is None
    drop(store)
    assert stored == rounds, f"{stored} index checkpoints in {rounds} rounds amid inserts"
    store = reopen(shm_dir)
    assert store.replayed_from > 1
    store.close()


def test_close_closes_every_log_though_the_last_checkpoint_fails(shm_dir: Path,
                                                                monkeypatch) -> None:
    factory = pes.PmemwalFactory({"PMEMWAL_PATH": str(shm_dir)})
    recorders = [factory.aggregate_recorder("a"), factory.aggregate_recorder("b")]
    for recorder in recorders:
        recorder.insert_events([StoredEvent(originator_id=OIDS[0], originator_version=1,
                                            topic="t", state=b"s")])

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(es_index, "write_run", full)
    with pytest.warns(RuntimeWarning, match="index was not stored at close"):
        factory.close()
    assert [r.datastore.closed for r in recorders] == [True, True]
    monkeypatch.undo()
    factory = pes.PmemwalFactory({"PMEMWAL_PATH": str(shm_dir)})
    recorder = factory.aggregate_recorder("a")
    assert recorder.datastore.replayed_from == 1      # nothing stored: all replayed
    assert len(recorder.select_events(OIDS[0])) == 1
    factory.close()


def test_limit_zero_selects_nothing_whether_or_not_stored(shm_dir: Path) -> None:
    store = reopen(shm_dir)
    for v in (1, 2, 3):
        store.insert([StoredEvent(originator_id=OIDS[0], originator_version=v, topic="t",
                                  state=b"s")])
    assert store.select_events(OIDS[0], limit=0) == []
    store.checkpoint()
    assert store.select_events(OIDS[0], limit=0) == []
    assert len(store.select_events(OIDS[0], desc=True, limit=2)) == 2
    store.close()


def test_closed_runs_are_unmapped(shm_dir: Path) -> None:
    store = reopen(shm_dir)
    fill(store, 20)
    store.checkpoint()
    run = store._index.runs[0]
    store.close()
    assert run._map.closed


def test_an_index_row_that_names_no_event_is_database_error(shm_dir: Path) -> None:
    store = reopen(shm_dir)
    fill(store, 20)
    store.close()
    rows = next((Path(events_dir(shm_dir)) / es_index.INDEX_DIR).glob("*.rows"))
    with open(rows, "r+b") as f:    # row 1's offset points into the middle of its event
        f.seek(8)
        f.write((11).to_bytes(4, "little"))
    store = reopen(shm_dir)
    with pytest.raises(DatabaseError, match="where no event is"):
        store.select_notifications(None, 10)
    store.close()


def test_close_closes_the_log_whatever_its_checkpoint_raised(shm_dir: Path,
                                                             monkeypatch) -> None:
    store = reopen(shm_dir)
    fill(store, 10)

    def broken(*args, **kwargs):
        raise ValueError("not a storage error")

    monkeypatch.setattr(es_index.IndexStore, "write", broken)
    with pytest.raises(ValueError):
        store.close()
    assert store.closed
    monkeypatch.undo()
    store = reopen(shm_dir)         # not locked: the log was closed
    assert store.max_notification_id() is not None
    store.close()


def test_close_called_on_the_wal_writers_thread(shm_dir: Path) -> None:
    """As when a collection of an application's reference cycle runs there, inside the
    index checkpoint that holds the datastore's locks: another thread closes it."""
    store = pes.open_datastore(events_dir(shm_dir), segment_size=1 << 20,
                               checkpoint_interval=0.02)
    fill(store, 5)
    store._log.wal.add_checkpoint_listener(lambda _end: store.close())
    fill(store, 5, 5)               # the next WAL checkpoint calls it
    deadline = time.monotonic() + 5
    while not store.closed:
        assert time.monotonic() < deadline, "close hung on the writer's thread"
        time.sleep(0.02)
    store = reopen(shm_dir)
    assert store.replayed_from == store._log.last_index + 1     # its last checkpoint stored
    store.close()


def test_closing_unmaps_the_rows(shm_dir: Path) -> None:
    store = reopen(shm_dir)
    fill(store, 10)
    store.checkpoint()
    store.select_notifications(None, 5)
    maps = [mapping for mapping, _ in store._store.rows._maps.values()]
    assert maps
    store.close()
    assert all(mapping.closed for mapping in maps)


def test_a_page_of_notifications_by_topic_reads_about_its_page(shm_dir: Path,
                                                               monkeypatch) -> None:
    """Issue 27, item 14: select_notifications with topics scanned every notification from
    ``start`` to the end on every call, so reading a backlog page by page was O(N^2)."""
    store = reopen(shm_dir)
    for k in range(200):
        store.insert([StoredEvent(originator_id=uuid.UUID(int=k * 100 + j + 1),
                                  originator_version=1, topic=f"topic-{j % 2}", state=b"s")
                      for j in range(100)])
    read: list[int] = []
    real = es_index.StoredIndex.row_names
    monkeypatch.setattr(es_index.StoredIndex, "row_names",
                        lambda self, a, b: (read.append(b - a + 1), real(self, a, b))[1])
    page = store.select_notifications(1, 10, topics=("topic-1",))
    assert [n.id for n in page] == list(range(2, 21, 2))
    assert sum(read) <= 4096, read
    store.close()


def hold_first_sync(store, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The store's first log sync waits (once ``in_sync`` is set) until ``go_on`` is set;
    later ones go through: an insert caught between its append and its durability."""
    real_sync, in_sync, go_on = store._log.sync, threading.Event(), threading.Event()

    def first_sync_waits(index=None):
        if not in_sync.is_set():
            in_sync.set()
            assert go_on.wait(10)
        return real_sync(index)

    monkeypatch.setattr(store._log, "sync", first_sync_waits)
    return in_sync, go_on


def test_inserts_share_flushes_and_are_seen_once_durable(shm_dir: Path, monkeypatch) -> None:
    """Issue 27, item 14: the datastore's lock was held through each insert's sync, so
    threads inserting at once got a flush each.  Now the sync waits outside the lock (a
    flush covers every insert before it), and readers see an insert once it is durable."""
    store = reopen(shm_dir)
    in_sync, go_on = hold_first_sync(store, monkeypatch)

    def event(oid) -> StoredEvent:
        return StoredEvent(originator_id=oid, originator_version=1, topic="t", state=b"s")

    a = threading.Thread(target=store.insert, args=([event(OIDS[0])],))
    a.start()
    assert in_sync.wait(10)
    # A's entry is appended, not yet durable: not seen, though it conflicts already
    assert store.max_notification_id() is None and store.select_events(OIDS[0]) == []
    assert store.select_notifications(None, 10) == []
    with pytest.raises(IntegrityError):
        store.insert([event(OIDS[0])])
    b = threading.Thread(target=store.insert, args=([event(OIDS[1])],))
    b.start()
    b.join(10)
    assert not b.is_alive(), "B waited for A's sync: the lock is held through it"
    # B's flush covered A's entry (appended before): both durable, both seen
    assert store.max_notification_id() == 2
    assert [n.originator_id for n in store.select_notifications(None, 10)] == OIDS[:2]
    go_on.set()
    a.join(10)
    store.close()


def test_a_dcb_read_by_tag_sees_no_append_before_it_is_durable(shm_dir: Path,
                                                              monkeypatch) -> None:
    """From a read of the group commit: a tag query's positions were cut at ``after`` only,
    so a read found an append whose sync had not returned (beyond the head it gave)."""
    store = pes.open_dcb_datastore(str(shm_dir / "dcb"), segment_size=1 << 20)
    store.append([DCBEvent(type="t", data=b"0", tags=["x"])])
    in_sync, go_on = hold_first_sync(store, monkeypatch)
    a = threading.Thread(target=store.append, args=([DCBEvent(type="t", data=b"1", tags=["x"])],))
    a.start()
    assert in_sync.wait(10)
    query = DCBQuery(items=[DCBQueryItem(tags=["x"])])
    for got in (store.read(query), store.read(query, limit=5), store.read(None),
                store.read(DCBQuery(items=[DCBQueryItem(types=["t"])]))):
        assert [e.position for e in got[0]] == [1] and got[1] == 1
    go_on.set()
    a.join(10)
    assert [e.position for e in store.read(query)[0]] == [1, 2]
    store.close()


def test_close_waits_for_the_inserts_it_overtook(shm_dir: Path, monkeypatch) -> None:
    """From a read of the group commit: an insert appended, close flushed and closed the
    log, and the insert's own sync then raised InterfaceError for a batch that was stored."""
    store = reopen(shm_dir)
    in_sync, go_on = hold_first_sync(store, monkeypatch)
    got: list = []

    def insert() -> None:
        try:
            got.append(store.insert([StoredEvent(originator_id=OIDS[0], originator_version=1,
                                                 topic="t", state=b"s")]))
        except Exception as exc:
            got.append(type(exc).__name__)

    a = threading.Thread(target=insert)
    a.start()
    assert in_sync.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    time.sleep(0.2)                 # close waits for the insert it overtook
    assert closer.is_alive()
    with pytest.raises(InterfaceError):     # no insert starts once close has begun
        store.insert([StoredEvent(originator_id=OIDS[1], originator_version=1, topic="t",
                                  state=b"s")])
    go_on.set()
    a.join(10)
    closer.join(10)
    assert got == [[1]]
    store = reopen(shm_dir)
    assert store.max_notification_id() == 1
    store.close()


def test_close_from_inside_an_inserts_commit_does_not_hang(shm_dir: Path, monkeypatch) -> None:
    """From a read of the close/commit handshake: a collection running inside an insert's
    commit (eventsourcing's Application.__del__ closes its factory) closed the store whose
    commit its own thread was in, and waited for that commit forever, holding the registry
    lock that every open and close takes."""
    store = reopen(shm_dir)
    real_sync, closed = store._log.sync, []

    def collected_here(index=None):
        if not closed:
            closed.append(True)
            store.close()               # as a finalizer on this thread would
        return real_sync(index)

    monkeypatch.setattr(store._log, "sync", collected_here)
    done = threading.Event()

    def insert() -> None:
        try:
            store.insert([StoredEvent(originator_id=OIDS[0], originator_version=1, topic="t",
                                      state=b"s")])
        except Exception:
            pass                        # (its log closed under it: indeterminate)
        done.set()

    threading.Thread(target=insert, daemon=True).start()
    assert done.wait(10), "close waited for a commit of its own thread"
    store = reopen(shm_dir)             # the registry lock is free: opens go on
    assert store.max_notification_id() == 1
    store.close()


# ---- a key with many versions: found by binary search, across runs and tails ----------

def versions_in_runs(shm_dir: Path, monkeypatch, collide: bool) -> tuple:
    """A datastore where originator BIG has versions 1..1170 spread over three runs (each
    under an eighth of the one before: a merge leaves them apart) and the tail, with other
    originators' events between (sharing BIG's key hash when ``collide``)."""
    if collide:
        monkeypatch.setattr(es_index, "HASH_MASK", 0x3)
    big, others = OIDS[0], OIDS[1:6]
    store = reopen(shm_dir)
    version, other_version = 0, dict.fromkeys(others, 0)

    def add(n: int) -> None:
        nonlocal version
        for first in range(version + 1, version + n + 1, 50):
            count = min(50, version + n + 1 - first)
            store.insert([StoredEvent(originator_id=big, originator_version=v, topic="t",
                                      state=b"%d" % v) for v in range(first, first + count)])
            oid = others[first % len(others)]
            other_version[oid] += 1
            store.insert([StoredEvent(originator_id=oid, originator_version=other_version[oid],
                                      topic="t", state=b"other")])
        version += n

    for n in (1000, 100, 10):
        add(n)
        store.checkpoint()
    add(60)
    return store, big, version


BOUNDS = [(None, None), (0, None), (None, 0), (10, 20), (995, 1005), (1095, 1115), (1105, 1165),
          (1050, 5000), (5, 5), (1169, None), (None, 1), (-5, 3)]


def check_every_bound(store: pes.PmemwalDatastore, big, last: int) -> None:
    for gt, lte in BOUNDS:
        expected = list(range(max(gt or 0, 0) + 1, min(lte if lte is not None else last, last) + 1))
        for desc in (False, True):
            want = expected[::-1] if desc else expected
            for limit in (None, 1, 2, 7, 100, 2000):
                got = store.select_events(big, gt=gt, lte=lte, desc=desc, limit=limit)
                assert [e.originator_version for e in got] == want[:limit], (gt, lte, desc,
                                                                            limit)
                assert all(e.originator_id == big and e.state == b"%d" % e.originator_version
                           for e in got)


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "shared-hash"])
def test_every_version_of_a_key_across_runs_is_found_within_bounds(shm_dir: Path, monkeypatch,
                                                                   collide: bool) -> None:
    store, big, last = versions_in_runs(shm_dir, monkeypatch, collide)
    assert len(store._index.runs) >= 3, store._index.runs
    assert store._index.tail and not store._index.frozen
    check_every_bound(store, big, last)
    with pytest.raises(IntegrityError):     # a version in each part is taken
        for v in (3, 1050, 1105, last):
            try:
                store.insert([StoredEvent(originator_id=big, originator_version=v, topic="t",
                                          state=b"x")])
            except IntegrityError:
                continue
            raise AssertionError(f"version {v} was taken again")
        raise IntegrityError("all taken")
    store._index.capture()                  # the tail frozen, as a checkpoint in flight has it
    check_every_bound(store, big, last)
    drop(store)
    store = reopen(shm_dir)                 # the runs read back, the rest replayed
    check_every_bound(store, big, last)
    store.close()
    store = reopen(shm_dir)
    assert store.replayed_from == store._log.last_index + 1
    check_every_bound(store, big, last)
    store.close()


def test_a_lookup_copies_what_it_gives_not_every_version_of_the_key(shm_dir: Path) -> None:
    """Inserting the next version of an originator of 60,000 versions, and reading its last
    event, allocate about what they do for an originator of 10 (they used to copy the key's
    every (version, notification ID) pair from each run: about 1 MiB here)."""
    store = reopen(shm_dir)
    big, small = OIDS[0], OIDS[1]
    for first in range(1, 60_001, 2000):
        store.insert([StoredEvent(originator_id=big, originator_version=v, topic="t", state=b"")
                      for v in range(first, first + 2000)])
    store.insert([StoredEvent(originator_id=small, originator_version=v, topic="t", state=b"")
                  for v in range(1, 11)])
    store.checkpoint()
    allocated = {}
    for name, oid, version in (("big", big, 60_001), ("small", small, 11)):
        store.insert([StoredEvent(originator_id=oid, originator_version=version, topic="t",
                                  state=b"")])     # (warm)
        tracemalloc.start()
        try:
            store.insert([StoredEvent(originator_id=oid, originator_version=version + 1,
                                      topic="t", state=b"")])
            last = store.select_events(oid, desc=True, limit=1)
            allocated[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert last[0].originator_version == version + 1
    assert allocated["big"] < allocated["small"] + (64 << 10), allocated
    store.close()


# ---- run merges: streamed, chunk by chunk --------------------------------------------

def random_pairs(rng, count: int, ties: bool) -> tuple:
    """Pairs with few hashes and versions (many equal (hash, a) pairs), or spread ones;
    b numbers each pair, so the order among equal pairs shows."""
    hashes = rng.integers(0, 5, count, dtype=np.uint64) * np.uint64(1 << 61) if ties else \
        rng.integers(0, 1 << 64, count, dtype=np.uint64)
    a = rng.integers(-3, 4 if ties else 1 << 40, count, dtype=np.int64)
    return es_index.sorted_pairs(hashes, a, rng.permutation(count).astype(np.int64))


def test_a_streamed_merge_is_the_sort_of_both_runs(shm_dir: Path) -> None:
    """Whatever the chunk, a merge writes the file a sort of the older run's pairs, then the
    newer's, writes (the whole-run merge it replaced: equal pairs keep that order)."""
    rng = np.random.default_rng(39)
    for trial in range(40):
        ties = trial % 2 == 0
        runs = []
        for ident in (1, 2):
            path = str(shm_dir / f"{trial}-{ident}.run")
            pairs = random_pairs(rng, int(rng.integers(1, 3000)), ties)
            es_index.write_run(path, *pairs)
            runs.append(es_index.Run(ident, path, len(pairs[0])))
        older, newer = runs
        chunk = int(rng.choice([1, 2, 3, 17, 256, 5000]))
        merged, sorted_ = shm_dir / f"{trial}.merged", shm_dir / f"{trial}.sorted"
        es_index.merge_runs(str(merged), older, newer, chunk)
        es_index.write_run(str(sorted_), *es_index.sorted_pairs(
            *(np.concatenate([getattr(older, c), getattr(newer, c)]) for c in ("hash", "a", "b"))))
        assert merged.read_bytes() == sorted_.read_bytes(), (trial, chunk)
        for run in runs:
            run.close()


def test_a_merge_holds_a_chunk_of_the_runs_not_both(shm_dir: Path) -> None:
    """Merging runs of 200,000 pairs each allocates a few MiB (it used to load both runs
    and sort them: about 20 MiB here, +80 MiB at a million pairs)."""
    store = es_index.IndexStore(str(shm_dir), bytes(16), es_index.ORIGINATORS,
                                pes.originator_bytes)
    os.makedirs(store.path)
    rng = np.random.default_rng(7)
    older = store._run(1, *random_pairs(rng, 200_000, False))
    newer = store._run(2, *random_pairs(rng, 200_000, False))
    tracemalloc.start()
    try:
        merged = store._merge(older, newer, 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    expected = es_index.sorted_pairs(
        *(np.concatenate([getattr(older, c), getattr(newer, c)]) for c in ("hash", "a", "b")))
    assert all((getattr(merged, c) == e).all() for c, e in zip(("hash", "a", "b"), expected))
    for run in (older, newer, merged):
        run.close()


_MERGING_CHILD = r"""
import sys, uuid
from eventsourcing.persistence import StoredEvent
from pmemwal.integrations import eventsourcing as pes
from pmemwal.integrations.eventsourcing import stored_index as es_index
es_index.MERGE_CHUNK = 16       # a merge of many steps, for the parent to kill it amid them
store = pes.open_datastore(sys.argv[1], segment_size=1 << 24, checkpoint_interval=3600)
for k in range(int(sys.argv[2]), int(sys.argv[3]), 100):
    store.insert([StoredEvent(originator_id=uuid.UUID(int=1 + (k + j) % 50),
                              originator_version=1 + (k + j) // 50, topic="t",
                              state=b"%d" % (k + j)) for j in range(100)])
print("checkpoint", flush=True)
store.checkpoint()          # a run of the new pairs, merged into the stored one
print("done", flush=True)
store.close()
"""


def named_runs(index: Path) -> set[str]:
    import json
    return {f"{ident:016X}.run" for manifest in index.glob("*.manifest")
            for ident, _ in json.loads(manifest.read_text())["runs"]}


def test_a_merge_killed_midway_leaves_the_index_openable_and_whole(shm_dir: Path) -> None:
    """SIGKILL at several points of a checkpoint that merges runs (a real child process):
    the next open takes the last stored index (no warning), finds every event, and the
    merge's unfinished file goes."""
    import shutil
    import signal
    import subprocess
    from conftest import child_env
    base = shm_dir / "base"
    store = pes.open_datastore(str(base), segment_size=1 << 24, checkpoint_interval=3600)
    stored, added = 24_000, 4_000       # (4,000 pairs: over an eighth of 24,000, so merged)
    for k in range(0, stored, 1000):
        store.insert([StoredEvent(originator_id=uuid.UUID(int=1 + (k + j) % 50),
                                  originator_version=1 + (k + j) // 50, topic="t",
                                  state=b"%d" % (k + j)) for j in range(1000)])
    store.close()
    rng = np.random.default_rng(5)
    cut_midway = 0
    for trial in range(6):
        path = shm_dir / f"trial-{trial}"
        shutil.copytree(base, path)
        index = path / es_index.INDEX_DIR
        before = {p.name for p in index.glob("*.run")}
        child = subprocess.Popen([sys.executable, "-c", _MERGING_CHILD, str(path), str(stored),
                                  str(stored + added)], env=child_env(),
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "checkpoint\n"
            deadline = time.monotonic() + 10
            while len({p.name for p in index.glob("*.run")} - before) < 2:  # merging
                assert time.monotonic() < deadline and child.poll() is None, "no merge seen"
                time.sleep(0.0002)
            time.sleep(float(rng.uniform(0, 0.02)))
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
        left = {p.name for p in index.glob("*.run")} - named_runs(index)
        cut_midway += bool(left)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            store = pes.open_datastore(str(path), segment_size=1 << 24)
        assert store.replayed_from > 1     # the stored index, and the inserts after it
        assert store.max_notification_id() == stored + added
        for n in range(50):
            events = store.select_events(uuid.UUID(int=1 + n))
            versions = (stored + added) // 50
            assert [e.originator_version for e in events] == list(range(1, 1 + versions))
            assert [e.state for e in events] == [b"%d" % (n + 50 * i) for i in range(len(events))]
        last = store.select_events(uuid.UUID(int=7), desc=True, limit=1)
        assert last[0].originator_version == (stored + added) // 50
        store.close()               # (its checkpoint merges again, and collects the rest)
        assert not {p.name for p in index.glob("*.run")} - named_runs(index)
    assert cut_midway, "no kill landed between a merge's file and the manifest naming it"


def test_events_whose_id_and_topic_join_alike_read_back_apart(shm_dir: Path) -> None:
    """A read decodes each (ID, topic) once: "ab" + "c" and "a" + "bc" are two of them."""
    store = reopen(shm_dir)
    stored = [StoredEvent(originator_id="ab", originator_version=1, topic="c", state=b"1"),
              StoredEvent(originator_id="a", originator_version=1, topic="bc", state=b"2"),
              StoredEvent(originator_id="ab", originator_version=2, topic="c", state=b"3"),
              StoredEvent(originator_id="a", originator_version=2, topic="bc", state=b"4")]
    store.insert(stored)
    got = store.select_notifications(None, 10)
    assert [(n.originator_id, n.topic, n.state) for n in got] == \
        [(e.originator_id, e.topic, e.state) for e in stored]
    store.close()


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "shared-hash"])
def test_a_tag_of_many_positions_across_runs_reads_within_after_and_limit(
        shm_dir: Path, monkeypatch, collide: bool) -> None:
    if collide:
        monkeypatch.setattr(es_index, "HASH_MASK", 0x3)
    path = str(shm_dir / "dcb")
    store = pes.open_dcb_datastore(path, segment_size=1 << 20)
    tags = {}
    for n in (1000, 100, 10, 30):           # three runs, then the tail
        for _ in range(0, n, 10):
            events = [DCBEvent(type=f"type-{k % 3}", data=b"", tags=[
                "many", f"few-{k % 5}"] if k % 4 else [f"few-{k % 5}"]) for k in range(10)]
            last = store.append(events)
            for position, event in zip(range(last - 9, last + 1), events):
                for tag in event.tags + [event.type]:
                    tags.setdefault(tag, []).append(position)
        if n != 30:
            store.checkpoint()
    assert len(store._index.runs) >= 3

    def check(store) -> None:
        for after in (None, 0, 5, 999, 1100, 1139):
            for limit in (None, 1, 3, 500):
                for query, expected in (
                        (DCBQuery(items=[DCBQueryItem(tags=["many"])]), tags["many"]),
                        (DCBQuery(items=[DCBQueryItem(tags=["many", "few-2"])]),
                         sorted(set(tags["many"]) & set(tags["few-2"]))),
                        (DCBQuery(items=[DCBQueryItem(types=["type-1"], tags=["few-1"]),
                                         DCBQueryItem(tags=["few-3"])]),
                         sorted(set(tags["few-1"]) & set(tags["type-1"]) | set(tags["few-3"])))):
                    expected = [p for p in expected if p > (after or 0)][:limit]
                    got, _ = store.read(query, after=after, limit=limit)
                    assert [e.position for e in got] == expected, (after, limit, query)

    check(store)
    store.close()
    store = pes.open_dcb_datastore(path, segment_size=1 << 20)
    check(store)
    store.close()


def test_the_read_benchmark_runs_quick() -> None:
    """benchmarks/es_read.py --quick: every measurement, against eventsourcing.sqlite."""
    import subprocess
    from conftest import REPO_ROOT, child_env
    out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "es_read.py"), "--quick"],
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("x |") == 6, out.stdout      # six rows, each with its ratio
    assert "pmemwal: 2,000 versions / 10 versions" in out.stdout
