"""pmemwal.Log: numbered entries, tail rewind, compaction, reset and hard state over one WAL.

The main check is a model test: random operations applied to a Log and to a plain
Python model of it, reopened at random points, must agree on every entry, term,
snapshot and state.  The rest pin down each error and each replay rule.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

import pmemwal
from pmemwal import log_replay
from pmemwal.log import HEADER, MAGIC, SNAPSHOT, VERSION
from pmemwal.recovery import RecoveryWarning

from conftest import SEG, as_made_before_checkpoints, rewind_checkpoint, seg_file


def open_log(path: Path, **options) -> pmemwal.Log:
    options.setdefault("segment_size", SEG)
    return pmemwal.open_log(path, **options)


def contents(log: pmemwal.Log) -> list[tuple[int, int, bytes]]:
    return [(e.index, e.term, bytes(e.payload)) for e in log]


def test_wal_options_name_every_option_of_open() -> None:
    """open_log's typed options (WALOptions, what an editor completes) are pmemwal.open's
    (but readonly, which opens another kind of object and takes no option)."""
    import inspect
    import typing
    params = inspect.signature(pmemwal.open).parameters
    options = {name: p for name, p in params.items()
               if p.kind is p.KEYWORD_ONLY and name != "readonly"}
    assert "readonly" in inspect.signature(pmemwal.open_log).parameters  # (open_log's too)
    hints = typing.get_type_hints(pmemwal.wal.WALOptions)
    assert list(hints) == list(options)
    opened = typing.get_type_hints(pmemwal.open)
    assert all(hints[name] == opened[name] for name in options)


# ---- the basics -------------------------------------------------------------------

def test_entries_are_numbered_from_one_and_survive_reopen(wal_dir: Path, mode: str) -> None:
    with open_log(wal_dir, mode=mode) as log:
        assert (log.first_index, log.last_index, len(log), log.term_at(0)) == (1, 0, 0, 0)
        assert log.append(b"one", term=1) == 1
        assert list(log.append_many([b"two", bytearray(b"three"), memoryview(b"four")], term=2)) \
            == [2, 3, 4]
        assert log.append(np.arange(3, dtype=np.uint8), term=2, sync=True) == 5
        log.sync(3)
        assert log[2] == (2, 2, memoryview(b"two"))
        assert log.entry(5).payload == bytes([0, 1, 2])
        assert log.last_term == 2
    with open_log(wal_dir, mode=mode) as log:
        assert contents(log) == [(1, 1, b"one"), (2, 2, b"two"), (3, 2, b"three"),
                                 (4, 2, b"four"), (5, 2, bytes([0, 1, 2]))]
        assert [e.index for e in log.entries(2, 4)] == [2, 3]
        assert log.append(b"six", term=3) == 6


def test_large_entries_span_pages_and_segments(wal_dir: Path) -> None:
    payloads = [bytes([i]) * n for i, n in enumerate((10, 9000, 300_000, 1_500_000, 5))]
    with open_log(wal_dir) as log:
        for p in payloads:
            log.append(p, term=1)
    with open_log(wal_dir) as log:
        assert [bytes(e.payload) for e in log] == payloads


def test_truncate_after_voids_the_tail_durably(wal_dir: Path) -> None:
    with open_log(wal_dir) as log:
        log.append_many([b"a", b"b", b"c", b"d"], term=1)
        log.truncate_after(2)
        assert (log.last_index, log.last_term) == (2, 1)
        assert log.append(b"C", term=2) == 3
        log.truncate_after(3)  # the end itself: nothing to do
        log.sync()
    with open_log(wal_dir) as log:
        assert contents(log) == [(1, 1, b"a"), (2, 1, b"b"), (3, 2, b"C")]
        log.truncate_after(0)
        assert len(log) == 0 and log.append(b"x", term=2) == 1
    with open_log(wal_dir) as log:
        assert contents(log) == [(1, 2, b"x")]


def test_compact_drops_segments_and_keeps_the_snapshot_term(wal_dir: Path) -> None:
    with open_log(wal_dir) as log:
        log.set_state(term=3, vote="n2", commit=1)  # early: its segment is compacted away
        for term in (1, 2, 3):
            log.append_many([bytes(4000)] * 300, term=term)
        assert log.compact(700) >= 1
        assert (log.first_index, log.term_at(699), log.snapshot) == (700, 3, (699, 3))
        assert log.compact(5) == 0  # already gone: nothing to do
        with pytest.raises(pmemwal.LogIndexError):
            log[699]
    with open_log(wal_dir) as log:
        assert (log.first_index, log.last_index, log.term_at(699)) == (700, 900, 3)
        assert log.state == pmemwal.HardState(3, "n2", 1)
        assert log[700].term == 3
        log.compact(901)  # everything
        assert (len(log), log.first_index, log.last_term) == (0, 901, 3)
        assert log.append(b"next", term=3) == 901
    with open_log(wal_dir) as log:
        assert contents(log) == [(901, 3, b"next")] and log.term_at(900) == 3
        assert log.state == pmemwal.HardState(3, "n2", 1)


def test_reset_restarts_the_numbering(wal_dir: Path) -> None:
    with open_log(wal_dir) as log:
        log.append_many([b"a", b"b", b"c"], term=1)
        log.reset(100, 7)
        assert (len(log), log.first_index, log.term_at(100), log.last_term) == (0, 101, 7, 7)
        with pytest.raises(pmemwal.TermError):
            log.append(b"old", term=6)
        assert log.append(b"new", term=7) == 101
        log.reset(50, 8)  # lower than before is fine: the leader's snapshot wins
    with open_log(wal_dir) as log:
        assert (len(log), log.first_index, log.snapshot) == (0, 51, (50, 8))


@pytest.mark.parametrize("vote", [None, 3, "node-b:4321", b"\x00\xff"])
def test_hard_state_latest_wins(wal_dir: Path, vote) -> None:
    with open_log(wal_dir) as log:
        assert log.state == pmemwal.HardState(0, None, 0)
        log.set_state(term=1, vote="a")
        log.set_state(term=2, vote=vote)
        assert log.set_state(commit=9) == pmemwal.HardState(2, vote, 9)
    with open_log(wal_dir) as log:
        assert log.state == pmemwal.HardState(2, vote, 9)


# ---- bad input: typed errors, nothing durable lost ------------------------------------

def test_bad_indexes_and_terms_raise_typed_errors(wal_dir: Path) -> None:
    with open_log(wal_dir, max_record_size=1 << 20) as log:
        log.append_many([b"a"] * 10, term=2)
        log.compact(4)
        for bad in (3, 11, 0, -1):
            with pytest.raises(pmemwal.LogIndexError):
                log[bad]
        with pytest.raises(IndexError):  # also an IndexError, as Python code expects
            log.entry(11)
        with pytest.raises(pmemwal.LogIndexError):
            log.truncate_after(2)  # below the compacted prefix
        with pytest.raises(pmemwal.LogIndexError):
            log.truncate_after(11)  # above the end
        with pytest.raises(pmemwal.LogIndexError):
            log.compact(12)  # beyond the end
        with pytest.raises(pmemwal.LogIndexError):
            log.term_at(2)
        with pytest.raises(pmemwal.LogIndexError):
            log.sync(11)
        with pytest.raises(pmemwal.TermError):
            log.append(b"x", term=1)
        with pytest.raises(pmemwal.TermError):
            log.append_many([b"x"], term=1)
        log.set_state(term=5)
        with pytest.raises(pmemwal.TermError):
            log.set_state(term=4)
        with pytest.raises(TypeError):
            log.set_state(vote=1.5)
        with pytest.raises(pmemwal.RecordTooLargeError):
            log.append(bytes(2 << 20), term=2)
        assert (log.first_index, log.last_index, log.state.term) == (4, 10, 5)
    with pytest.raises(pmemwal.ClosedError):
        log.append(b"late", term=2)
    with pytest.raises(pmemwal.ClosedError):
        log[5]
    with open_log(wal_dir) as log:
        assert (log.first_index, log.last_index, log.state.term) == (4, 10, 5)


def test_a_plain_wal_is_not_a_log(wal_dir: Path) -> None:
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        wal.append(b"not a log record, but long enough to hold a header")
    with pytest.raises(pmemwal.FormatError, match="not written by pmemwal.Log"):
        open_log(wal_dir)


def test_a_newer_log_version_is_refused(wal_dir: Path) -> None:
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        wal.append(HEADER.pack(MAGIC, VERSION + 1, 1, 0, 1, 0) + b"x")
    with pytest.raises(pmemwal.FormatError, match="version 2"):
        open_log(wal_dir)


@pytest.mark.parametrize("checkpoint", ["vouching", "rewound", "none"])
def test_a_missing_leading_segment_is_damage(wal_dir: Path, checkpoint: str) -> None:
    """A deleted oldest segment holding entries never compacted.  ``vouching``: the clean
    close's checkpoint names segment 0 as the oldest, so the WAL refuses to open first,
    naming it.  Where no checkpoint covers it (``rewound`` to the oldest segment on disk,
    1; ``none``: a WAL made before checkpoints), the WAL opens from segment 1 and the
    Log's own check finds the entries below its first missing."""
    with open_log(wal_dir) as log:
        log.append_many([bytes(5000)] * 400, term=1)  # about two segments
    seg_file(wal_dir, 0).unlink()
    if checkpoint == "vouching":
        with pytest.raises(pmemwal.CorruptionError,
                           match="segment 0000000000000000 is missing, but the checkpoint") as info:
            open_log(wal_dir)
        assert info.value.segment == 0
    else:
        if checkpoint == "rewound":
            assert rewind_checkpoint(wal_dir).oldest_segno == 1
        else:
            as_made_before_checkpoints(wal_dir)
        with pytest.raises(pmemwal.CorruptionError, match="never compacted"):
            open_log(wal_dir)


def test_replay_of_an_unknown_kind_is_a_format_error(wal_dir: Path) -> None:
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        wal.append(HEADER.pack(MAGIC, VERSION, 9, 0, 1, 0))
    with pytest.raises(pmemwal.FormatError, match="unknown kind 9"):
        open_log(wal_dir)


# ---- the model test ---------------------------------------------------------------------

class Model:
    """What a Log should hold, in plain Python."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[int, bytes]] = {}
        self.first, self.next = 1, 1
        self.snapshot, self.state = (0, 0), pmemwal.HardState()

    def last_term(self) -> int:
        if self.next > self.first:
            return self.entries[self.next - 1][0]
        return self.snapshot[1] if self.snapshot[0] == self.first - 1 else 0

    def listing(self) -> list[tuple[int, int, bytes]]:
        return [(i, *self.entries[i]) for i in range(self.first, self.next)]


def step(rng: random.Random, log: pmemwal.Log, model: Model) -> None:
    op = rng.choices(["append", "many", "rewind", "compact", "reset", "state"],
                     weights=[40, 15, 12, 10, 2, 5])[0]
    term = model.last_term() + rng.choice((0, 0, 0, 1))
    if op == "append":
        payload = rng.randbytes(rng.choice((0, 8, 100, 3000, 20_000)))
        assert log.append(payload, term) == model.next
        model.entries[model.next] = (term, payload)
        model.next += 1
    elif op == "many":
        payloads = [rng.randbytes(rng.randrange(200)) for _ in range(rng.randrange(1, 40))]
        indexes = list(log.append_many(payloads, term))
        assert indexes == list(range(model.next, model.next + len(payloads)))
        for p in payloads:
            model.entries[model.next] = (term, p)
            model.next += 1
    elif op == "rewind":
        k = rng.randint(model.first - 1, model.next - 1)
        log.truncate_after(k)
        model.next = k + 1
    elif op == "compact":
        k = rng.randint(model.first, model.next)
        if k > model.first:
            model.snapshot = (k - 1, model.entries[k - 1][0] if k - 1 >= model.first
                              else model.snapshot[1])
            model.first = k
        log.compact(k)
    elif op == "reset":
        k, t = model.next + rng.randrange(-3, 50), model.last_term() + 1
        k = max(k, 0)
        log.reset(k, t)
        model.first = model.next = k + 1
        model.snapshot = (k, t)
    else:
        new = pmemwal.HardState(model.state.term + rng.randrange(2),
                                rng.choice((None, 1, "x", b"y")), rng.randrange(100))
        log.set_state(term=new.term, vote=new.vote, commit=new.commit)
        model.state = new


def check(log: pmemwal.Log, model: Model) -> None:
    assert (log.first_index, log.last_index) == (model.first, model.next - 1)
    assert contents(log) == model.listing()
    assert log.last_term == model.last_term()
    assert log.state == model.state
    if model.snapshot[0] == model.first - 1:
        assert log.snapshot == model.snapshot


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_the_model_across_reopens(wal_dir: Path, seed: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_replay, "_SCAN_BATCH", 7)  # many batch boundaries on replay
    rng = random.Random(seed)
    model = Model()
    log = open_log(wal_dir, mode=("buffered", "direct")[seed % 2])
    try:
        for _ in range(400):
            step(rng, log, model)
            if rng.random() < 0.04:
                log.close()
                log = open_log(wal_dir, mode=("buffered", "direct")[seed % 2])
                check(log, model)
        check(log, model)
    finally:
        log.close()
    with open_log(wal_dir) as log:
        check(log, model)


def test_replay_reads_headers_in_batches(wal_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of pure entries take the vectorised path; a rewind inside one does not."""
    with open_log(wal_dir) as log:
        log.append_many([struct.pack("<I", i) for i in range(1000)], term=1)
        log.truncate_after(500)
        log.append_many([b"second"] * 10, term=2)
    for batch in (1, 3, 64, 1 << 16):
        monkeypatch.setattr(log_replay, "_SCAN_BATCH", batch)
        with open_log(wal_dir) as log:
            assert (log.first_index, log.last_index) == (1, 510)
            assert bytes(log[500].payload) == struct.pack("<I", 499)
            assert (log[501].term, bytes(log[510].payload)) == (2, b"second")


def test_threads_append_dense_indexes(wal_dir: Path) -> None:
    import threading

    with open_log(wal_dir) as log:
        got: list[int] = []

        def writer(tag: int) -> None:
            for i in range(300):
                index = log.append(struct.pack("<II", tag, i), term=1)
                got.append(index)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == list(range(1, 1201))
    with open_log(wal_dir) as log:
        seen = [struct.unpack("<II", e.payload) for e in log]
        for tag in range(4):  # each writer's entries in its own order
            assert [i for t, i in seen if t == tag] == list(range(300))


def test_snapshot_marker_layout(wal_dir: Path) -> None:
    """The documented header (docs/FORMAT.md, "Log records") is what is on disk."""
    with open_log(wal_dir) as log:
        log.append(b"abc", term=4)
        log.compact(2)
    with pmemwal.open(wal_dir) as wal:
        records = [bytes(r.payload) for r in wal.records()]
    assert records[0] == struct.pack("<HBBIQQ", 0x4C50, 1, 1, 0, 1, 4) + b"abc"
    assert records[1] == struct.pack("<HBBIQQ", 0x4C50, 1, SNAPSHOT, 0, 1, 4)


def test_reading_an_entry_does_not_flush_in_direct_mode(wal_dir: Path) -> None:
    """Direct mode reads an appended entry in place: reading is no hidden sync (a journal's
    missing sync would go unseen).  Buffered mode must flush: the entry is in the ring."""
    for mode in ("direct", "buffered"):
        path = wal_dir / mode
        with open_log(path, mode=mode, background=False) as log:
            log.append(b"durable", term=1, sync=True)
            flushed = log.wal.flushed_lsn
            index = log.append(b"not yet", term=1)
            assert bytes(log[index].payload) == b"not yet"
            assert (log.wal.flushed_lsn == flushed) == (mode == "direct")


def test_entries_meeting_a_compaction_raise_log_index_error(tmp_path):
    """Issue 27, item 13: an iteration open while compact() removes the segments ahead of
    it raised CorruptionError (segment missing): a harmless race reported as damage."""
    with pmemwal.open_log(tmp_path / "log", segment_size=1 << 20) as log:
        for i in range(1, 401):
            log.append(bytes(10_000), term=1)
        log.sync()
        it = log.entries()
        assert next(it).index == 1
        log.compact(300)
        with pytest.raises(pmemwal.LogIndexError, match="went while entries"):
            for entry in it:
                assert entry.index < 300
        assert [e.index for e in log.entries()][:2] == [300, 301]


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_a_sync_fault_in_truncate_after_leaves_a_log_that_reopens(tmp_path, mode):
    """Issue 27, item 15 (suspect): truncate_after appends its rewind with a flush before it
    updates the index.  The flush fails (EIO) after the rewind's bytes were written: the
    writer stops; a reopen must give the log as the WAL holds it (the rewind applied or not,
    never a gap), and appending goes on from there."""
    import errno
    path = tmp_path / "log"
    options = {"persist": "msync"} if mode == "direct" else {}
    with pmemwal.open_log(path, mode=mode, segment_size=1 << 20, background=False,
                          **options) as log:
        for i in range(1, 11):
            log.append(b"e%d" % i, term=1)
        log.sync()
        log.wal._core.inject_fault("msync" if mode == "direct" else "sync", errno.EIO)
        with pytest.raises(pmemwal.StorageError):
            log.truncate_after(5)
        with pytest.raises(pmemwal.WALError):
            log.append(b"after", term=1)        # the writer stopped
    with pmemwal.open_log(path, mode=mode) as log:
        assert log.last_index in (5, 10)        # the rewind was written (bytes kept) or not
        kept = [bytes(e.payload) for e in log]
        assert kept == [b"e%d" % i for i in range(1, log.last_index + 1)]
        index = log.append(b"after", term=1, sync=True)
        assert index == log.last_index and bytes(log[index].payload) == b"after"
    with pmemwal.open_log(path, mode=mode) as log:
        assert [bytes(e.payload) for e in log][-1] == b"after"
        assert [e.index for e in log] == list(range(1, log.last_index + 1))


def test_values_beyond_the_format_raise_typed_errors(wal_dir: Path) -> None:
    """Terms are u64 fields, indexes and the commit index below 2**63 (append_many's int64
    answer): a value past them is the caller's error, typed, and writes nothing."""
    big = 1 << 64
    with open_log(wal_dir) as log:
        log.append(b"a", term=1)
        for call in (lambda: log.append(b"x", term=big),
                     lambda: log.append_many([b"x"], term=big),
                     lambda: log.reset(5, big),
                     lambda: log.set_state(term=big)):
            with pytest.raises(pmemwal.TermError, match="64"):
                call()
        for call in (lambda: log.reset(big, 1), lambda: log.reset((1 << 63) - 1, 1),
                     lambda: log.set_state(commit=big)):
            with pytest.raises(pmemwal.LogIndexError, match="2\\*\\*63"):
                call()
        with pytest.raises(pmemwal.LogIndexError, match="entries"):
            log[1:2]
        assert contents(log) == [(1, 1, b"a")] and log.state == pmemwal.log.HardState()
        log.reset((1 << 63) - 2, (1 << 64) - 1)  # the largest of each still fits
        assert log.append(b"last", term=(1 << 64) - 1) == (1 << 63) - 1
        for call in (lambda: log.append(b"past", term=(1 << 64) - 1),
                     lambda: log.append_many([b"past"], term=(1 << 64) - 1)):
            with pytest.raises(pmemwal.LogIndexError, match="2\\*\\*63"):
                call()
        log.set_state(term=(1 << 64) - 1, commit=(1 << 63) - 1)
    with open_log(wal_dir) as log:
        assert contents(log) == [((1 << 63) - 1, (1 << 64) - 1, b"last")]
        assert log.state == ((1 << 64) - 1, None, (1 << 63) - 1)


def test_entries_holds_a_bounded_part_of_the_index_at_a_time(wal_dir: Path) -> None:
    """entries() reads the index a bounded chunk at a time: starting an iteration over
    200,000 entries costs a chunk's memory, not a list of every LSN (taken under the
    log's lock, which appends wait for)."""
    import tracemalloc

    with open_log(wal_dir) as log:
        for _ in range(20):
            log.append_many([b"%08d" % i for i in range(10_000)], term=1)
        log.checkpoint()                    # half of them from the mapped index files
        log.append_many([b"%08d" % i for i in range(100_000)], term=1)
        tracemalloc.start()
        try:
            it = log.entries()
            assert next(it).index == 1
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 512 << 10, f"the first entry took {peak} bytes"
        assert sum(1 for _ in it) == 299_999


def test_entries_meeting_appends_and_rewinds(wal_dir: Path) -> None:
    """What entries() yields is the entries there when it began: appends meanwhile are not
    in it, a rewind above where it stops changes nothing, and one that voids an entry it has
    yet to yield is a LogIndexError, never a voided entry nor another entry's bytes."""
    chunk = pmemwal.log_reading._ENTRIES_AHEAD
    n = 3 * chunk
    with open_log(wal_dir) as log:
        log.append_many([b"a%d" % i for i in range(1, n + 1)], term=1)
        seen = []
        for e in log.entries(1, n - 10):
            seen.append((e.index, e.term, bytes(e.payload)))
            if e.index % 1000 == 0:
                log.append(b"new", term=2)  # past the end: not in this iteration
        assert seen == [(i, 1, b"a%d" % i) for i in range(1, n - 10)]
        it = log.entries(1, n - 10)
        assert next(it).index == 1
        log.truncate_after(n - 5)           # above its stop: nothing it yields goes
        assert [e.index for e in it] == list(range(2, n - 10))
        it = log.entries()
        for e in it:
            if e.index == chunk // 2:
                break
        log.truncate_after(2 * chunk)       # voids entries it has yet to reach ...
        log.append_many([b"b"] * chunk, term=3)  # ... and their indexes name others now
        with pytest.raises(pmemwal.LogIndexError, match="went while entries"):
            for e in it:
                assert e.term == 1 and bytes(e.payload) == b"a%d" % e.index
        it = log.entries()
        assert next(it).index == 1
        log.truncate_after(10)              # within the part of the index it has read
        got = []
        with pytest.raises(pmemwal.LogIndexError, match="entry 11 went while entries"):
            for e in it:
                got.append(e.index)
        assert got == list(range(2, 11))
        log.append_many([b"a%d" % i for i in range(11, n + 1)], term=3)
        it = log.entries()
        assert next(it).index == 1
        log.truncate_after(chunk)           # no entry appended after: they went
        with pytest.raises(pmemwal.LogIndexError, match=f"entry {chunk + 1} went while"):
            for e in it:
                assert bytes(e.payload) == b"a%d" % e.index


# ---- putting a lost+found entry back into a Log's WAL --------------------------------

def _cut_at_entry(wal_dir: Path, damaged: int, n: int = 200, before: int = 0) -> None:
    """A log of entries 1..n (term 1; a state record before entry ``before``, when given),
    the record at entry ``damaged`` (or that state record, when 0) damaged, and the log
    reopened with on_corruption="truncate": lost+found holds the valid records past it."""
    from conftest import stream_write

    with open_log(wal_dir) as log:
        for i in range(1, n + 1):
            if i == before:
                log.set_state(term=1)
                state_lsn = log._state_lsn
            log.append(b"p%d" % i, term=1)
        log.sync()
        lsn = log._index.lsn_at(damaged) if damaged else state_lsn
    stream_write(wal_dir, lsn + 24 + 8, bytes(b ^ 0xA5 for b in range(16)))
    with pytest.warns(RecoveryWarning):
        open_log(wal_dir, verify="all", on_corruption="truncate").close()


def test_a_put_back_into_a_log_that_went_on_is_refused(wal_dir: Path) -> None:
    """Entries 102..200 set aside, then the log went on with entries 101..120 in term 2:
    put back, replay's rule (a lower index voids what follows) made the old term-1 entries
    void 19 of the 20 new ones.  Refused, with nothing written, saying how to read them."""
    from click.testing import CliRunner

    from pmemwal import lostfound, putback
    from pmemwal.tools.cli import main as cli

    _cut_at_entry(wal_dir, 101)
    with open_log(wal_dir) as log:
        assert log.last_index == 100
        log.append_many([b"new%d" % i for i in range(101, 121)], term=2, sync=True)
    (entry,) = lostfound.entries(wal_dir)
    with pytest.raises(pmemwal.LogIndexError, match="--dump"):
        putback.restore(str(wal_dir), entry.name)
    result = CliRunner().invoke(cli, ["lost-found", str(wal_dir), "--restore", entry.name])
    assert result.exit_code == 1 and "--dump" in result.output, result.output
    assert [e.name for e in lostfound.entries(wal_dir)] == [entry.name]
    dumped = CliRunner().invoke(cli, ["lost-found", str(wal_dir), "--dump", entry.name])
    assert "entry index=102 term=1" in dumped.output, dumped.output
    with open_log(wal_dir) as log:
        assert contents(log)[99:] == [(100, 1, b"p100")] + \
            [(i, 2, b"new%d" % i) for i in range(101, 121)]


def test_a_put_back_that_leaves_a_gap_in_a_log_is_refused(wal_dir: Path) -> None:
    """Entry 101 damaged, 102..200 set aside, nothing appended since: put back, they would
    follow entry 100 with 101 missing, and the log would no longer open."""
    from pmemwal import lostfound, putback

    _cut_at_entry(wal_dir, 101)
    (entry,) = lostfound.entries(wal_dir)
    with pytest.raises(pmemwal.LogIndexError, match="101"):
        putback.restore(str(wal_dir), entry.name)
    with open_log(wal_dir) as log:
        assert (log.first_index, log.last_index) == (1, 100)


def test_a_put_back_that_continues_a_log_goes_back(wal_dir: Path) -> None:
    """A damaged state record cut the log after entry 100: entries 101..150 past it were
    set aside, and put back into the log as it stood they are entries 101..150 again."""
    from pmemwal import lostfound, putback

    _cut_at_entry(wal_dir, 0, n=150, before=101)
    (entry,) = lostfound.entries(wal_dir)
    kept = [payload for _, payload in entry.records()]
    with pmemwal.open(wal_dir) as wal:  # a put-back that got 20 records in, then died
        with open(os.path.join(entry.path, "RESTORING"), "w") as f:
            f.write(str(wal.insert_lsn))
        wal.append_many(kept[:20])
    assert putback.restore(str(wal_dir), entry.name) == 50
    with open_log(wal_dir) as log:
        assert contents(log) == [(i, 1, b"p%d" % i) for i in range(1, 151)]


def _records_after_a_state(wal_dir: Path, n: int, raw: list[bytes]) -> None:
    """Entries 1..n (term 1), a state record, then ``raw`` appended as they are; the state
    record damaged and the log reopened with on_corruption="truncate": lost+found holds
    ``raw`` (records a damage past several records could leave there)."""
    from conftest import stream_write

    with open_log(wal_dir) as log:
        log.append_many([b"p%d" % i for i in range(1, n + 1)], term=1)
        log.set_state(term=1)
        state_lsn = log._state_lsn
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        wal.append_many(raw)
        wal.flush()
    stream_write(wal_dir, state_lsn + 24 + 8, bytes(b ^ 0xA5 for b in range(16)))
    with pytest.warns(RecoveryWarning):
        open_log(wal_dir, verify="all", on_corruption="truncate").close()


def test_a_put_back_with_a_gap_behind_a_rewind_is_refused(wal_dir: Path) -> None:
    """Entries 1..9, and set aside a rewind to 11 then entry 12: replay's rewind above the
    end changes nothing, so entry 12 would follow 9 with 10 and 11 missing, and the log
    would not open.  Refused, as replay itself would read them, with nothing written."""
    from pmemwal import lostfound, putback
    from pmemwal.log import ENTRY, REWIND

    _records_after_a_state(wal_dir, 9, [HEADER.pack(MAGIC, VERSION, REWIND, 0, 11, 0),
                                        HEADER.pack(MAGIC, VERSION, ENTRY, 0, 12, 1) + b"x"])
    (entry,) = lostfound.entries(wal_dir)
    with pytest.raises(pmemwal.LogIndexError, match="would not open"):
        putback.restore(str(wal_dir), entry.name)
    with open_log(wal_dir) as log:
        assert (log.first_index, log.last_index) == (1, 9)
    assert [e.name for e in lostfound.entries(wal_dir)] == [entry.name]


def test_a_put_back_that_rewinds_then_continues_goes_back(wal_dir: Path) -> None:
    """Set aside a rewind to 5 then entries 6 and 7: replayed, the log is entries 1..7 again
    (the rewind voids 6..9 first), and the put-back goes through."""
    from pmemwal import lostfound, putback
    from pmemwal.log import ENTRY, REWIND

    _records_after_a_state(wal_dir, 9, [HEADER.pack(MAGIC, VERSION, REWIND, 0, 5, 0),
                                        HEADER.pack(MAGIC, VERSION, ENTRY, 0, 6, 2) + b"q6",
                                        HEADER.pack(MAGIC, VERSION, ENTRY, 0, 7, 2) + b"q7"])
    (entry,) = lostfound.entries(wal_dir)
    assert putback.restore(str(wal_dir), entry.name) == 3
    with open_log(wal_dir) as log:
        assert contents(log) == [(i, 1, b"p%d" % i) for i in range(1, 6)] + \
            [(6, 2, b"q6"), (7, 2, b"q7")]


def _damage_and_cut(wal_dir: Path, lsn: int) -> None:
    from conftest import stream_write

    stream_write(wal_dir, lsn + 24 + 8, bytes(b ^ 0xA5 for b in range(16)))
    with pytest.warns(RecoveryWarning):
        open_log(wal_dir, verify="all", on_corruption="truncate").close()


def test_a_put_back_older_than_another_cut_at_the_same_place_is_refused(wal_dir: Path) -> None:
    """Entries 101..150 (term 1) set aside at a cut; the log went on from there (a state in
    term 2, entries 101..120 in term 2, acknowledged) and was cut at the same place again.
    The older entry's stale entries may not go back (they would take the place of the
    acknowledged ones, which then could not): refused, naming the later entry, which goes
    back."""
    from pmemwal import lostfound, putback

    with open_log(wal_dir) as log:
        for i in range(1, 151):
            if i == 101:
                log.set_state(term=1)
                cut = log._state_lsn
            log.append(b"old%d" % i, term=1)
        log.sync()
    _damage_and_cut(wal_dir, cut)
    with open_log(wal_dir) as log:
        log.set_state(term=2)
        assert log._state_lsn == cut
        log.append_many([b"new%d" % i for i in range(101, 121)], term=2, sync=True)
    _damage_and_cut(wal_dir, cut)
    older, later = lostfound.entries(wal_dir)
    assert older.cut_lsn == later.cut_lsn == cut
    with pytest.raises(pmemwal.LogIndexError, match=later.name):
        putback.restore(str(wal_dir), older.name)
    assert putback.restore(str(wal_dir), later.name) == 20
    with pytest.raises(pmemwal.LogIndexError):
        putback.restore(str(wal_dir), older.name)
    with open_log(wal_dir) as log:
        assert contents(log)[100:] == [(i, 2, b"new%d" % i) for i in range(101, 121)]


def test_a_finished_put_back_whose_removal_was_cut_short_is_removed(wal_dir: Path) -> None:
    """A put-back that got every record in, durable, then died before it removed the entry;
    the log appended an entry since.  Run again, it appends nothing and removes the entry
    (it refused before, advising to append entries that the log holds).  So too when the
    removal was cut short after the RESTORING note went, but not the manifest."""
    from pmemwal import lostfound, putback

    _cut_at_entry(wal_dir, 0, n=150, before=101)
    (entry,) = lostfound.entries(wal_dir)
    kept = [payload for _, payload in entry.records()]
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        with open(os.path.join(entry.path, "RESTORING"), "w") as f:
            f.write(str(wal.insert_lsn))
        wal.append_many(kept)
        wal.flush()
    with open_log(wal_dir) as log:
        assert log.last_index == 150
        log.append(b"next", term=1, sync=True)
    assert putback.restore(str(wal_dir), entry.name) == 50
    assert lostfound.entries(wal_dir) == []
    expected = [(i, 1, b"p%d" % i) for i in range(1, 151)] + [(151, 1, b"next")]
    with open_log(wal_dir) as log:
        assert contents(log) == expected


def test_a_put_back_whose_note_went_but_not_its_manifest_is_removed(wal_dir: Path) -> None:
    """Every record put back, and the removal cut short after it deleted the RESTORING note
    (its files go in any order): the log went on since.  Run again, it sees its records at
    the cut, appends nothing and removes the entry, never advising to append them again."""
    from pmemwal import lostfound, putback

    _cut_at_entry(wal_dir, 0, n=150, before=101)
    (entry,) = lostfound.entries(wal_dir)
    kept = [payload for _, payload in entry.records()]
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        assert wal.insert_lsn == entry.cut_lsn
        wal.append_many(kept)
        wal.flush()
    with open_log(wal_dir) as log:
        log.append(b"next", term=1, sync=True)
    assert putback.restore(str(wal_dir), entry.name) == 50
    assert lostfound.entries(wal_dir) == []
    with open_log(wal_dir) as log:
        assert contents(log)[100:] == [(i, 1, b"p%d" % i) for i in range(101, 151)] + \
            [(151, 1, b"next")]


def test_entries_never_yields_an_entry_voided_while_its_record_was_read(wal_dir: Path) -> None:
    """A rewind (and entries appended again after it) by another thread between entries()'
    look at the index and its read of the records: the entries it voided are a
    LogIndexError, not the voided entries' bytes under indexes that name others now."""
    with open_log(wal_dir) as log:
        log.append_many([b"e%d" % i for i in range(1, 11)], term=1)
        fetch = log.wal._fetch

        def fetch_then_rewind(*args):  # another thread's turn, once the records are read
            log.wal._fetch = fetch
            read = fetch(*args)
            log.truncate_after(1)
            log.append_many([b"f2", b"f3"], term=2)
            return read

        log.wal._fetch = fetch_then_rewind
        got = []
        with pytest.raises(pmemwal.LogIndexError, match="entry 2 went while entries"):
            for e in log.entries():
                got.append((e.index, bytes(e.payload)))
        assert got == [(1, b"e1")]


def test_a_term_that_is_not_an_int_is_a_term_error(wal_dir: Path) -> None:
    with open_log(wal_dir) as log:
        log.append(b"a", term=1)
        with pytest.raises(pmemwal.TermError, match="term must be an int"):
            log.append(b"x", term=2.0)  # type: ignore[arg-type]
        with pytest.raises(pmemwal.TermError, match="term must be an int"):
            log.append_many([b"x"], term=2.0)  # type: ignore[arg-type]
        with pytest.raises(pmemwal.TermError, match="term must be an int"):
            log.append(b"x", term="2")  # type: ignore[arg-type]
        with pytest.raises(pmemwal.TermError, match="term must be an int"):
            log.append_many([b"x"], term="2")  # type: ignore[arg-type]
        with pytest.raises(pmemwal.TermError, match="term must be an int"):
            log.reset(5, 2.0)  # type: ignore[arg-type]
        with pytest.raises(pmemwal.LogIndexError, match="index must be an int"):
            log.reset(5.0, 2)  # type: ignore[arg-type]
        assert log.append(b"b", term=np.uint64(2)) == 2  # type: ignore[arg-type]
        assert contents(log) == [(1, 1, b"a"), (2, 2, b"b")]


def test_a_refused_repeat_says_which_records_are_in_the_log_already(wal_dir: Path) -> None:
    """A put-back that got 20 records in, then died; the log appended an entry since.  Run
    again, it is refused (the log went on), and says that those 20 are in the log already:
    advice to append what is still wanted must not have them appended twice."""
    from pmemwal import lostfound, putback

    _cut_at_entry(wal_dir, 0, n=150, before=101)
    (entry,) = lostfound.entries(wal_dir)
    kept = [payload for _, payload in entry.records()]
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        with open(os.path.join(entry.path, "RESTORING"), "w") as f:
            f.write(str(wal.insert_lsn))
        wal.append_many(kept[:20])
        wal.flush()
    with open_log(wal_dir) as log:
        assert log.last_index == 120
        log.append(b"next", term=1, sync=True)
    with pytest.raises(pmemwal.LogIndexError, match="the first 20 of them are in the log"):
        putback.restore(str(wal_dir), entry.name)
    with open_log(wal_dir) as log:
        assert log.last_index == 121
