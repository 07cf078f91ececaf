"""A Log read from other processes: ``open_log(path, readonly=True)`` and ``follow_log``.

Real files under /dev/shm, real processes (multiprocessing, spawn): a writer process
appends, rewinds, compacts and resets while this process reads.  What a follower yields is
checked against what the writer did (the exact stream, events in place) and against the
Log the writer leaves, reopened.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

import pmemwal
from pmemwal import Compacted, Entry, Reset, Rewound

SEG = 1 << 20
WAIT = 30.0  # s a process waits for the other before the test fails


def payload(index: int, term: int, size: int = 16) -> bytes:
    """Entry ``index``'s payload in ``term``, ``size`` bytes (at least its own label)."""
    label = b"%d/%d:" % (index, term)
    return label + bytes([index % 251]) * max(0, size - len(label))


def apply_stream(stream: list[object]) -> list[Entry]:
    """The entries a consumer holds after applying a follower's stream in order."""
    held: dict[int, Entry] = {}
    for item in stream:
        if isinstance(item, Entry):
            held[item.index] = item
        elif isinstance(item, Rewound):
            held = {i: e for i, e in held.items() if i <= item.index}
        elif isinstance(item, Compacted):
            held = {i: e for i, e in held.items() if i >= item.before_index}
        elif isinstance(item, Reset):
            held = {}
    return [held[i] for i in sorted(held)]


def closed_log_with_history(path: str) -> None:
    """A closed log: entries 1..15 (term 1), 11..15 rewound and written again (term 2), a
    hard state, then compacted below 5: it holds entries 5..15, snapshot (4, 1)."""
    with pmemwal.open_log(path, segment_size=SEG) as log:
        log.append_many([payload(i, 1) for i in range(1, 16)], term=1, sync=True)
        log.truncate_after(10)
        log.append_many([payload(i, 2) for i in range(11, 16)], term=2, sync=True)
        log.set_state(term=2, vote="n1", commit=12)
        log.compact(5)


def _spawn() -> multiprocessing.context.SpawnContext:
    return multiprocessing.get_context("spawn")


# ---- the writer process -------------------------------------------------------------

def _scripted_writer(path: str, go: object, big: int) -> None:
    """Append, rewind, compact and reset, each step made durable, in small paced bursts
    so that the follower reads while it writes; a last entry b"END" ends it."""
    import time
    with pmemwal.open_log(path, segment_size=SEG) as log:
        assert go.wait(WAIT)  # type: ignore[attr-defined]
        for i in range(1, 301):
            log.append(payload(i, 1, big), term=1, sync=i % 10 == 0)
            if i % 50 == 0:
                time.sleep(0.002)
        log.sync()
        log.truncate_after(250)
        for i in range(251, 401):
            log.append(payload(i, 2, big), term=2, sync=i % 7 == 0)
        log.sync()
        log.compact(200)
        log.append_many([payload(i, 2, big) for i in range(401, 451)], term=2, sync=True)
        log.reset(1000, 5)
        for i in range(1001, 1011):
            log.append(payload(i, 5, big), term=5, sync=True)
        log.append(b"END", term=5, sync=True)


def _expected_stream(big: int) -> list[object]:
    out: list[object] = [Entry(i, 1, payload(i, 1, big)) for i in range(1, 301)]
    out.append(Rewound(250))
    out += [Entry(i, 2, payload(i, 2, big)) for i in range(251, 401)]
    out.append(Compacted(200))
    out += [Entry(i, 2, payload(i, 2, big)) for i in range(401, 451)]
    out.append(Reset(1000, 5))
    out += [Entry(i, 5, payload(i, 5, big)) for i in range(1001, 1011)]
    out.append(Entry(1011, 5, b"END"))
    return out


@pytest.mark.parametrize("big", [16, 6000])
def test_follower_sees_the_writers_entries_and_events_in_place(wal_dir: Path, big: int) -> None:
    """A named follower here, the writer in another process: every durable entry once, in
    index order, with the rewind, the compaction and the reset where the writer made them
    (not as entries); applied in order, they leave exactly the writer's reopened Log.  With
    6000-byte entries the compaction removes segments (the name holds them for the follower)."""
    path = str(wal_dir)
    pmemwal.open_log(path, segment_size=SEG).close()
    ctx = _spawn()
    go = ctx.Event()
    writer = ctx.Process(target=_scripted_writer, args=(path, go, big))
    writer.start()
    got: list[object] = []
    try:
        with pmemwal.follow_log(path, name="t", timeout=WAIT) as follower:
            assert follower.position == 1
            go.set()
            for item in follower:
                got.append(item)
                if isinstance(item, Entry) and item.payload == b"END":
                    break
            assert follower.position == 1012
            follower.confirm()
        writer.join(WAIT)
        assert writer.exitcode == 0
    finally:
        if writer.is_alive():
            writer.kill()
    assert got == _expected_stream(big)
    assert all(type(e.payload) is bytes for e in got if isinstance(e, Entry))
    with pmemwal.open_log(path) as log:
        assert apply_stream(got) == list(log.entries())


def test_follower_from_an_index_sees_the_entries_the_log_holds(wal_dir: Path) -> None:
    """start=i: the entries the log holds from i on (a rewound entry's new version, never the
    voided one, and no event for what happened before), then what comes; an index that was
    compacted away is a LogIndexError, and so is one past the next entry."""
    path = str(wal_dir)
    closed_log_with_history(path)  # entries 5..15 (11..15 written again), compacted below 5
    with pmemwal.follow_log(path, start=8, timeout=0.2) as follower:
        got = list(follower)
        assert follower.position == 16
    with pmemwal.open_log(path) as log:
        assert got == list(log.entries(8))
        assert [e.payload for e in got][-1] == payload(15, 2)
    for start in (1, 4, 17):
        with pytest.raises(pmemwal.LogIndexError):
            pmemwal.follow_log(path, start=start)
    with pmemwal.follow_log(path, timeout=0.2) as follower:  # no start, no name: the first
        assert [e.index for e in follower] == list(range(5, 16))


def test_follower_at_the_end_waits_for_the_next_entry(wal_dir: Path) -> None:
    path = str(wal_dir)
    closed_log_with_history(path)
    with pmemwal.follow_log(path, start=16, timeout=0.1) as follower:
        assert list(follower) == []
        with pmemwal.open_log(path) as log:
            log.append(b"sixteen", term=3, sync=True)
            log.truncate_after(15)
        assert list(follower) == [Entry(16, 3, b"sixteen"), Rewound(15)]
        assert follower.position == 16


def test_named_follower_resumes_after_what_it_confirmed(wal_dir: Path) -> None:
    """A name's stored position is the WAL position after the last entry confirmed: a new
    follower of that name resumes there, and learns of a rewind made meanwhile as such."""
    path = str(wal_dir)
    with pmemwal.open_log(path, segment_size=SEG) as log:
        log.append_many([payload(i, 1) for i in range(1, 11)], term=1, sync=True)
    with pmemwal.follow_log(path, name="n", timeout=0.1) as follower:
        it = iter(follower)
        assert [next(it).index for _ in range(4)] == [1, 2, 3, 4]
        assert follower.position == 5
        follower.confirm()
    with pmemwal.open_log(path) as log:
        log.truncate_after(2)
        log.append(payload(3, 2), term=2, sync=True)
    with pmemwal.follow_log(path, name="n", timeout=0.1) as follower:
        assert follower.position == 5
        got = list(follower)
        assert follower.position == 4
    assert got == [Entry(i, 1, payload(i, 1)) for i in range(5, 11)] + \
        [Rewound(2), Entry(3, 2, payload(3, 2))]
    with pmemwal.follow_log(path, name="n", timeout=0.1) as follower:
        assert follower.position == 5  # (nothing confirmed since)
    assert [f["name"] for f in pmemwal.followers(path)] == ["n"]


def test_a_loop_left_early_goes_on_where_it_stopped(wal_dir: Path) -> None:
    path = str(wal_dir)
    with pmemwal.open_log(path, segment_size=SEG) as log:
        log.append_many([payload(i, 1) for i in range(1, 11)], term=1, sync=True)
        log.truncate_after(7)
    with pmemwal.follow_log(path, start=2, timeout=0.1) as follower:
        for entry in follower:
            if entry == Entry(3, 1, payload(3, 1)):
                break
        assert follower.position == 4
        assert list(follower) == [Entry(i, 1, payload(i, 1)) for i in range(4, 8)]
    with pmemwal.follow_log(path, start=1, timeout=0.1) as follower:  # (a batch of records)
        first = [next(follower) for _ in range(2)]
        assert first == [Entry(1, 1, payload(1, 1)), Entry(2, 1, payload(2, 1))]
        assert follower.position == 3
        assert [e.index for e in follower] == [3, 4, 5, 6, 7]


@pytest.mark.parametrize("size", [10, 5000])
def test_a_record_no_log_wrote_is_a_format_error(wal_dir: Path, size: int) -> None:
    """A WAL record that is not a log record stops a follower with FormatError, whether it
    comes alone (read as a Record) or in a batch; and a read-only open of such a WAL too."""
    path = str(wal_dir)
    with pmemwal.open_log(path, segment_size=SEG) as log:
        log.append(b"one", term=1, sync=True)
    with pmemwal.follow_log(path, timeout=0.1) as follower:
        assert list(follower) == [Entry(1, 1, b"one")]
        with pmemwal.open(path) as wal:
            wal.append(b"x" * size, flush=True)
        with pytest.raises(pmemwal.FormatError):
            next(follower)
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open_log(path, readonly=True)


# ---- the read-only log --------------------------------------------------------------

def _steady_writer(path: str, started: object, stop: object) -> None:
    """Appends entries b"<index>:<term>", rewinding and compacting now and then, until told
    to stop; every entry it ever makes durable says its own index and term."""
    with pmemwal.open_log(path, segment_size=SEG) as log:
        term, i = 1, 0
        started.set()  # type: ignore[attr-defined]
        while not stop.is_set():  # type: ignore[attr-defined]
            i += 1
            index = log.last_index + 1
            log.append(b"%d:%d" % (index, term), term=term, sync=i % 5 == 0)
            if i % 400 == 0:
                term += 1
                log.truncate_after(log.last_index - 7)
            if i % 1000 == 0:
                log.compact(log.last_index - 100)
        log.set_state(term=term, vote="me", commit=log.last_index)


def _check_consistent(ro: pmemwal.ReadOnlyLog) -> None:
    for _ in range(10):
        try:
            entries = list(ro.entries())
            break
        except pmemwal.LogIndexError:  # the writer compacted (or rewound) what it was reading
            ro.refresh()
    else:
        raise AssertionError("entries() never got through a live writer's compactions")
    assert [e.index for e in entries] == list(range(ro.first_index, ro.last_index + 1))
    for e in entries:
        assert e.payload == b"%d:%d" % (e.index, e.term)
    assert len(ro) == len(entries)


def test_readonly_log_beside_a_live_writer(wal_dir: Path) -> None:
    """Opened while another process appends, rewinds and compacts: what it reads is entries
    as the writer made them durable, dense from first_index; refresh() picks up more; once
    the writer closed, it holds exactly the log the writer left."""
    path = str(wal_dir)
    pmemwal.open_log(path, segment_size=SEG).close()
    ctx = _spawn()
    started, stop = ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_steady_writer, args=(path, started, stop))
    writer.start()
    try:
        assert started.wait(WAIT)
        seen = []
        with pmemwal.open_log(path, readonly=True) as ro:
            while len(seen) < 20 or ro.last_index < 2500:
                ro.refresh()
                _check_consistent(ro)
                seen.append(ro.last_index)
            with pmemwal.open_log(path, readonly=True) as other:
                _check_consistent(other)
        stop.set()
        writer.join(WAIT)
        assert writer.exitcode == 0
    finally:
        if writer.is_alive():
            writer.kill()
    assert len(set(seen)) > 1
    with pmemwal.open_log(path, readonly=True) as ro, pmemwal.open_log(path) as log:
        _check_consistent(ro)
        assert list(ro.entries()) == list(log.entries())
        assert (ro.first_index, ro.last_index, ro.snapshot, ro.state, ro.last_term) == \
            (log.first_index, log.last_index, log.snapshot, log.state, log.last_term)
        assert ro.term_at(ro.first_index - 1) == log.term_at(log.first_index - 1)
        assert ro.entries_at([ro.last_index, ro.first_index]).entries() == \
            [log[log.last_index], log[log.first_index]]


def test_readonly_log_refuses_writes_and_writes_nothing(wal_dir: Path) -> None:
    path = str(wal_dir)
    closed_log_with_history(path)
    before = _snapshot_dir(wal_dir)
    with pmemwal.open_log(path, readonly=True) as ro:
        assert isinstance(ro, pmemwal.ReadOnlyLog)
        assert [e.index for e in ro] == list(range(5, 16))
        assert ro[15] == ro.entry(15) == Entry(15, 2, payload(15, 2))
        assert [len(b) for b in ro.entry_batches(max_entries=4)] == [4, 4, 3]
        assert ro.term_at(4) == 1 and ro.snapshot == (4, 1)
        assert ro.state == pmemwal.HardState(2, "n1", 12)
        for write in (lambda: ro.append(b"x"), lambda: ro.append_many([b"x"]), ro.sync,
                      lambda: ro.truncate_after(6), lambda: ro.compact(6),
                      lambda: ro.reset(100, 3), lambda: ro.set_state(term=9), ro.checkpoint):
            with pytest.raises(pmemwal.ReadOnlyError):
                write()
        with pytest.raises(pmemwal.LogIndexError):
            ro.entry(4)
    assert ro.closed
    with pytest.raises(pmemwal.ClosedError):
        ro.entry(5)
    assert _snapshot_dir(wal_dir) == before


def test_readonly_log_of_a_log_without_an_index_stores_none(wal_dir: Path) -> None:
    """A log whose index is not stored yet (or unusable) is replayed whole, and nothing is
    written for it: the index is the writer's to store."""
    path = str(wal_dir)
    closed_log_with_history(path)
    index_dir = wal_dir / "index"
    for name in os.listdir(index_dir):
        os.unlink(index_dir / name)
    os.rmdir(index_dir)
    before = _snapshot_dir(wal_dir)
    with pmemwal.open_log(path, readonly=True) as ro:
        assert [e.index for e in ro.entries()] == list(range(5, 16))
    assert _snapshot_dir(wal_dir) == before


def _snapshot_dir(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root``: size, mtime and a hash of its bytes."""
    import hashlib
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = os.path.join(dirpath, name)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns,
                                                 hashlib.sha256(f.read()).digest())
    return out
