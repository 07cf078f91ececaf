"""Reads of many records in one call: WAL.scan, WAL.read_many, Log.entry_batches and
Log.entries_at, and the per-record reads built on them (records, record, entries, entry).
Each is held to what was written, over records of every size (in one page, across pages,
across segments), damage, bad LSNs and threads reading at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pmemwal
from conftest import SEG, flip_byte
from pmemwal.format import first_lsn

SIZES = [0, 1, 7, 64, 8000, 8144, 8200, 20000, 3 * SEG // 2]  # one page .. two segments


def _payload(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def _write(wal: pmemwal.WAL, n: int) -> dict[int, bytes]:
    """n records, their sizes cycling through SIZES; LSN -> payload."""
    written = {}
    for i in range(n):
        data = _payload(i, SIZES[i % len(SIZES)])
        written[wal.append(data)] = data
    wal.flush()
    return written


@pytest.mark.parametrize("max_records,max_bytes", [(1, 0), (3, 5000), (1 << 16, 1 << 20)])
def test_scan_gives_every_record_as_records_does(wal_dir, mode, max_records, max_bytes):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        written = _write(wal, 60)
        lsns, payloads, prevs = [], [], []
        for batch in wal.scan(max_records=max_records, max_bytes=max_bytes):
            assert 1 <= len(batch) <= max_records
            assert len(batch) == 1 or int(batch.lengths.sum()) <= max_bytes  # a large one alone
            assert not batch.data.flags.writeable and not batch.lsns.flags.writeable
            lsns += batch.lsns.tolist()
            prevs += batch.prev_lsns.tolist()
            payloads += [bytes(p) for p in batch.payloads()]
            assert [bytes(r.payload) for r in batch] == [bytes(batch.payload(i))
                                                          for i in range(len(batch))]
        records = list(wal.records())
        assert lsns == sorted(written) == [r.lsn for r in records]
        assert payloads == [written[lsn] for lsn in lsns] == [bytes(r.payload) for r in records]
        assert prevs == [r.prev_lsn for r in records] and prevs[1:] == lsns[:-1]
        start = lsns[len(lsns) // 2]
        assert [lsn for b in wal.scan(start) for lsn in b.lsns.tolist()] == \
            lsns[len(lsns) // 2:]


def test_read_many_reads_lsns_in_any_order_with_repeats(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        written = _write(wal, 45)
        order = np.random.default_rng(1).permutation(list(written) * 2)
        for max_bytes in (0, 10000, 1 << 22):
            batch = wal.read_many(order, max_bytes=max_bytes)
            assert batch.lsns.tolist() == order.tolist()
            assert [bytes(p) for p in batch.payloads()] == [written[lsn] for lsn in order.tolist()]
        assert len(wal.read_many([])) == 0
        one = sorted(written)[3]
        assert bytes(wal.record(one).payload) == written[one]
        assert wal.record(np.uint64(one)).lsn == one


def test_reads_of_what_is_not_a_record_are_value_errors(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        lsns = sorted(_write(wal, 12))
        for bad in (lsns[4] + 8, lsns[4] + 3, 1, -1, 2 ** 64):
            with pytest.raises(ValueError):
                wal.record(bad)
            with pytest.raises(ValueError):
                wal.read_many([lsns[0], bad])
        with pytest.raises(TypeError):
            wal.record(1.5)
        with pytest.raises(ValueError):
            wal.read_many([[lsns[0]]])
        with pytest.raises(ValueError):
            next(wal.scan(lsns[4] + 8))
        with pytest.raises(ValueError):
            next(wal.scan(max_records=0))


def test_damage_stops_scan_and_read_many_at_the_damaged_record(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        written = _write(wal, 30)
        lsns = sorted(written)
        victim = lsns[13]  # 8000 bytes: its payload lies in one page
        assert len(written[victim]) == 8000
    flip_byte(wal_dir, victim + 24 + 4000)
    with pmemwal.open(wal_dir, mode=mode, background=False) as wal:  # (a clean close: open reads past it)
        got = []
        with pytest.raises(pmemwal.CorruptionError) as err:
            for batch in wal.scan(max_records=4):
                got += batch.lsns.tolist()
        assert err.value.lsn == victim and got == lsns[:13]
        with pytest.raises(pmemwal.CorruptionError) as err:
            wal.read_many([lsns[2], victim])
        assert err.value.lsn == victim
        with pytest.raises(pmemwal.CorruptionError):
            wal.record(victim)
        assert bytes(wal.read_many([lsns[20]]).payload(0)) == written[lsns[20]]


def test_records_that_span_many_segments_read_whole(wal_dir, mode):
    """A 5 MiB record runs through six 1 MiB segments, which one batch read holds at once,
    without the GIL (and takes again, one at a time, as it finds it lacks them)."""
    small = 1 << 20
    with pmemwal.open(wal_dir, mode=mode, segment_size=small, max_record_size=8 << 20) as wal:
        written = {}
        for i, size in enumerate([5 << 20, 10, 3 << 20, 5]):
            written[wal.append(_payload(i, size))] = _payload(i, size)
        wal.flush()
        lsns = sorted(written)
        assert [bytes(r.payload) for r in wal.records()] == [written[k] for k in lsns]
        assert [bytes(p) for b in wal.scan(max_bytes=0) for p in b.payloads()] == \
            [written[k] for k in lsns]
        assert [bytes(p) for p in wal.read_many(lsns[::-1]).payloads()] == \
            [written[k] for k in lsns[::-1]]


def test_threads_scanning_and_reading_at_once_see_the_same_records(wal_dir):
    with pmemwal.open(wal_dir, mode="direct", segment_size=SEG) as wal:
        written = _write(wal, 300)
        lsns = sorted(written)
        failures: list[BaseException] = []

        def scan() -> None:
            try:
                for _ in range(5):
                    got = [(int(lsn), bytes(p)) for b in wal.scan(max_records=17)
                           for lsn, p in zip(b.lsns, b.payloads())]
                    assert got == [(k, written[k]) for k in lsns]
                    order = np.random.default_rng().permutation(lsns)
                    assert [bytes(p) for p in wal.read_many(order).payloads()] == \
                        [written[k] for k in order.tolist()]
            except BaseException as exc:  # noqa: BLE001 (reported below)
                failures.append(exc)

        threads = [threading.Thread(target=scan) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures


def test_a_scan_resumed_past_a_truncation_is_a_truncated_error(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        while wal.insert_lsn < 5 * SEG:
            wal.append(b"x" * 500)
        batches = wal.scan(max_records=10)
        next(batches)
        wal.truncate(first_lsn(3, SEG))
        with pytest.raises(pmemwal.TruncatedError):
            for _ in batches:
                pass


# ---- the Log ------------------------------------------------------------------------------

def test_entry_batches_and_entries_at_give_what_entry_gives(wal_dir, mode):
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=SEG) as log:
        for i in range(1, 41):
            log.append(_payload(i, SIZES[i % len(SIZES)]), term=1 + i // 10)
            if i == 20:
                log.checkpoint()  # the older half from the mapped index files
        whole = [log.entry(i) for i in range(1, 41)]
        batched = [e for b in log.entry_batches(max_entries=7, max_bytes=9000) for e in b]
        assert [(e.index, e.term, bytes(e.payload)) for e in batched] == \
            [(e.index, e.term, bytes(e.payload)) for e in whole]
        order = [40, 3, 3, 21, 1, 20]
        batch = log.entries_at(order)
        assert batch.indices.tolist() == order
        assert batch.terms.tolist() == [whole[i - 1].term for i in order]
        assert [bytes(p) for p in batch.payloads()] == [bytes(whole[i - 1].payload) for i in order]
        for bad in ([0], [41], [5, -1]):
            with pytest.raises(pmemwal.LogIndexError):
                log.entries_at(bad)
        for bad in (1.5, "3", None):
            with pytest.raises(pmemwal.LogIndexError):
                log.entry(bad)
        assert log.entry(np.int64(3)) == log.entry(3)
        log.compact(10)
        with pytest.raises(pmemwal.LogIndexError):
            log.entries_at([5])


def test_entries_at_calls_a_record_of_another_entry_damage(wal_dir):
    """The index names the record of entry 5 for entry 6: damage, never entry 5's bytes."""
    with pmemwal.open_log(wal_dir) as log:
        log.append_many([b"e%d" % i for i in range(1, 11)], term=1)
        log._index.heap.lsn[log._index.heap.slot(6)] = log._index.lsn_at(5)
        with pytest.raises(pmemwal.CorruptionError, match="for entry 6"):
            log.entries_at([4, 6])
        with pytest.raises(pmemwal.CorruptionError, match="for entry 6.*'index': 5"):
            log.entry(6)
        with pytest.raises(pmemwal.CorruptionError, match="for entry 6"):
            list(log.entries())


def test_a_damaged_record_in_the_middle_of_a_page_stops_the_scan(wal_dir, mode):
    """Small records read many to a page (two at a time, by their offsets in it): a flipped
    payload byte of one in the middle is CorruptionError there, in the scan as in every read."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        lsns = [wal.append(_payload(i, 40)) for i in range(300)]
        wal.flush()
    for victim in (lsns[50], lsns[51]):  # (the first or the second of a pair, whichever)
        flip_byte(wal_dir, victim + 24 + 5)
        with pmemwal.open(wal_dir, mode=mode, background=False) as wal:
            got = []
            with pytest.raises(pmemwal.CorruptionError) as err:
                for batch in wal.scan():
                    got += batch.lsns.tolist()
            assert err.value.lsn == victim and got == lsns[:lsns.index(victim)]
        flip_byte(wal_dir, victim + 24 + 5)  # (mended for the next)
