"""Round trips: what is appended comes back byte for byte, at the predicted LSNs.

Both modes, in this process and in children that hide libpmem or force it to
treat tmpfs as pmem (checked through persist_method); payload sizes around
the page (8192 bytes, 8168 usable) and beyond a whole segment; every
bytes-like input type; append_many; concurrent appenders; reopening.
"""

from __future__ import annotations

import array
import mmap
import random
import threading
import time

import numpy as np
import pytest

import pmemwal
from conftest import (PERSIST_CASES, REC_HDR, SEG, USABLE, as_input, assert_chain,
                      expected_end, first_lsn_of_segment, next_lsn, payload, read_all, rec_size,
                      prefixed, run_child, seg_usable)

PAGE_SIZES = [0, 1, 7, 8, 9, USABLE - REC_HDR, USABLE - 1, USABLE, USABLE + 1,
              8191, 8192, 8193, 3 * USABLE + 5]
BIG = SEG + SEG // 2  # 1.5 MiB: more than a whole 1 MiB segment
SIZES = PAGE_SIZES + [BIG, 3]


def _append_all(wal, sizes, seed):
    expected = []
    for i, n in enumerate(sizes):
        data = payload(f"{seed}/{i}", n)
        expected.append((wal.append(as_input(data, i)), data))
    return expected


def _check(wal, expected, *, first_prev=0):
    recs = read_all(wal)
    assert [(lsn, data) for lsn, data, _ in recs] == expected
    assert recs[0][2] == first_prev
    assert_chain(recs)
    assert wal.insert_lsn == expected_end(recs)
    return recs


def test_roundtrip_sizes(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        assert wal.mode == mode
        assert wal.segment_size == SEG
        assert wal.insert_lsn == wal.first_lsn == first_lsn_of_segment(0)
        expected = _append_all(wal, SIZES, "sizes")
        assert expected[0][0] == first_lsn_of_segment(0)
        # LSNs follow exactly from the sizes, page and segment headers included
        for (lsn0, d0), (lsn1, _) in zip(expected, expected[1:]):
            assert lsn1 == next_lsn(lsn0, len(d0))
        end = next_lsn(expected[-1][0], len(expected[-1][1]))
        assert wal.insert_lsn == end
        assert wal.flush() == end
        assert wal.flushed_lsn == end
        _check(wal, expected)
        assert wal.stats()["records"] == len(SIZES)
        # "bytes" counts payload bytes or stream bytes (headers, padding): not fixed yet
        assert wal.stats()["bytes"] in (sum(SIZES), sum(map(rec_size, SIZES)))
    assert end // SEG >= 1  # the 1.5 MiB record ran from segment 0 into segment 1
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.segment_size == SEG
        assert wal.insert_lsn == wal.flushed_lsn == end
        _check(wal, expected)


@pytest.mark.parametrize("case", sorted(PERSIST_CASES))
def test_roundtrip_persist_methods(shm_tmp, case):
    """A child with libpmem present, hidden, or forced to see tmpfs as pmem."""
    mode, env, method = PERSIST_CASES[case]
    sizes = [0, 1, 8191, 8192, 8193, USABLE, BIG, 5]
    out = run_child({"op": "roundtrip", "dir": str(shm_tmp / "w"), "mode": mode,
                     "sizes": sizes, "seed": case}, env=env)
    assert out["mode"] == mode
    assert out["persist_method"] == method
    # read the child's WAL here, in the other mode too
    expected = [payload(f"{case}/one/{i}", n) for i, n in enumerate(sizes)]
    expected += [payload(f"{case}/many/{i}", n) for i, n in enumerate(sizes)]
    expected += [prefix + data for prefix, data in prefixed(case, sizes)]
    other = "direct" if mode == "buffered" else "buffered"
    with pmemwal.open(shm_tmp / "w", mode=other) as wal:
        recs = read_all(wal)
        assert [lsn for lsn, _, _ in recs] == out["lsns"]
        assert [data for _, data, _ in recs] == expected
        assert_chain(recs)
        assert wal.insert_lsn == out["insert_lsn"]


def test_input_types(wal_dir, mode):
    raw = payload("types", 8200)
    floats = np.arange(1000, dtype=np.float64) * 1.5
    mm = mmap.mmap(-1, 4096)
    mm[:] = payload("mmap", 4096)
    inputs = [
        raw,
        bytearray(raw),
        memoryview(raw),
        memoryview(raw)[10:5000],                    # a slice, not at offset 0
        np.frombuffer(raw, dtype=np.uint8),
        floats,                                      # another dtype: its bytes
        np.arange(600, dtype=np.int32).reshape(20, 30),  # 2-D, C-contiguous
        array.array("d", [1.0, 2.5, -3.25]),
        mm,
        b"",
        bytearray(),
        np.zeros(0, dtype=np.uint8),
    ]
    expected_bytes = [bytes(memoryview(x).cast("B")) for x in inputs]
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        lsns = [wal.append(x) for x in inputs]
        lsns += [int(x) for x in wal.append_many(inputs)]
        recs = read_all(wal)
    assert [lsn for lsn, _, _ in recs] == lsns
    assert [data for _, data, _ in recs] == expected_bytes * 2
    assert_chain(recs)
    mm.close()


def test_non_contiguous_input_is_copied_or_refused(wal_dir, mode):
    """A strided array: either its logical bytes are stored, or a TypeError and nothing appended."""
    a = np.arange(100, dtype=np.uint8)[::2]
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        before = wal.insert_lsn
        try:
            lsn = wal.append(a)
        except (TypeError, BufferError):
            assert wal.insert_lsn == before
            assert read_all(wal) == []
        else:
            assert read_all(wal) == [(lsn, a.tobytes(), 0)]


def test_append_many(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        empty = wal.append_many([])
        assert isinstance(empty, np.ndarray) and empty.dtype == np.uint64 and len(empty) == 0
        assert wal.insert_lsn == first_lsn_of_segment(0)
        first = wal.append(b"first")
        # a batch of mixed types and sizes that runs over a segment boundary
        sizes = [random.Random(7).choice([0, 1, 100, 8168, 8192, 30000]) for _ in range(60)]
        sizes += [SEG // 2, SEG // 2, 17]
        batch = [payload(f"many/{i}", n) for i, n in enumerate(sizes)]
        lsns = wal.append_many([as_input(d, i) for i, d in enumerate(batch)])
        assert lsns.dtype == np.uint64 and lsns.shape == (len(batch),)
        assert int(lsns[0]) == next_lsn(first, 5)
        for i in range(1, len(batch)):
            assert int(lsns[i]) == next_lsn(int(lsns[i - 1]), sizes[i - 1])
        assert wal.insert_lsn == next_lsn(int(lsns[-1]), sizes[-1])
        tup = wal.append_many((b"a", b"bb"))
        assert int(tup[0]) == wal.insert_lsn - rec_size(1) - rec_size(2)
        expected = [(first, b"first")] + list(zip(map(int, lsns), batch))
        expected += [(int(tup[0]), b"a"), (int(tup[1]), b"bb")]
        _check(wal, expected)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        _check(wal, expected)


def test_exact_segment_and_page_fits(wal_dir, mode):
    """A record that fills a segment to its last byte, a header split across pages."""
    fill = seg_usable() - REC_HDR            # one record takes all of segment 0
    split = USABLE - REC_HDR - 8              # leaves 8 bytes in the page: the next header splits
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        a = wal.append(payload("fill", fill))
        b = wal.append(payload("split", split))
        c = wal.append(payload("after-split", 50))
        d = wal.append(payload("tail", 0))
        assert a == first_lsn_of_segment(0)
        assert b == first_lsn_of_segment(1)          # segment 1, page 1, first usable byte
        assert c == b + rec_size(split)              # still in the first data page
        assert c % 8192 == 8192 - 8                  # its header runs into the next page
        assert d == next_lsn(c, 50)
        expected = [(a, payload("fill", fill)), (b, payload("split", split)),
                    (c, payload("after-split", 50)), (d, b"")]
        _check(wal, expected)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        _check(wal, expected)


@pytest.mark.parametrize("insert_slots", [1, 3, 8])
def test_concurrent_appenders(wal_dir, mode, insert_slots):
    nthreads, per_thread = 4, 120
    results: list[list[tuple[int, bytes]]] = [[] for _ in range(nthreads)]
    errors = []
    barrier = threading.Barrier(nthreads)

    def work(tid, wal):
        try:
            rng = random.Random(tid)
            barrier.wait()
            i = 0
            while i < per_thread:
                if rng.random() < 0.2:
                    datas = [payload(f"c/{tid}/{i + k}", rng.choice([0, 10, 9000])) for k in range(3)]
                    lsns = wal.append_many(datas)
                    results[tid] += list(zip(map(int, lsns), datas))
                    i += 3
                else:
                    data = payload(f"c/{tid}/{i}", rng.choice([1, 64, 5000, 8168, 8200, 25000]))
                    results[tid].append((wal.append(data), data))
                    i += 1
                if rng.random() < 0.3:
                    assert wal.flush(results[tid][-1][0]) > results[tid][-1][0]
        except BaseException as exc:  # reported below
            errors.append(exc)

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, insert_slots=insert_slots) as wal:
        threads = [threading.Thread(target=work, args=(t, wal)) for t in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        expected = sorted(x for r in results for x in r)
        assert len({lsn for lsn, _ in expected}) == len(expected)
        _check(wal, expected)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        _check(wal, expected)


def test_buffered_ring_smaller_than_records(wal_dir):
    """The smallest WAL buffer ring (16 pages) with records far larger than it."""
    sizes = [100, 300_000, 5, BIG, 8168, 16 * 8192 + 1] + [3000] * 100
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, buffer_size=16 * 8192) as wal:
        expected = _append_all(wal, sizes, "ring")
        _check(wal, expected)
    with pmemwal.open(wal_dir, mode="buffered") as wal:
        _check(wal, expected)


@pytest.mark.parametrize("sync_method", ["fdatasync", "fsync", "open_datasync"])
def test_sync_methods(wal_dir, sync_method):
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, sync_method=sync_method) as wal:
        assert wal.persist_method == sync_method
        expected = _append_all(wal, [10, 9000, SEG], sync_method)
        wal.flush()
    with pmemwal.open(wal_dir, mode="direct") as wal:
        assert wal.persist_method in ("msync", "pmem")  # sync_method is buffered mode's
        _check(wal, expected)


def test_records_from_start(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        expected = _append_all(wal, [5, 9000, 0, 20000, 7], "start")
        k = 2
        recs = read_all(wal, start=expected[k][0])
        assert [(lsn, data) for lsn, data, _ in recs] == expected[k:]
        assert recs[0][2] == expected[k - 1][0]
        with pytest.raises(ValueError):
            list(wal.records(start=expected[1][0] + 8))  # inside a record's payload


def test_empty_wal(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        assert read_all(wal) == []
        assert wal.flush() == wal.insert_lsn == first_lsn_of_segment(0)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert read_all(wal) == []
        assert wal.insert_lsn == first_lsn_of_segment(0)
        lsn = wal.append(b"x")
        assert lsn == first_lsn_of_segment(0)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert read_all(wal) == [(lsn, b"x", 0)]


def test_mode_auto(wal_dir):
    with pmemwal.open(wal_dir, mode="auto", segment_size=SEG) as wal:
        assert wal.mode in ("buffered", "direct")
        lsn = wal.append(b"auto")
    with pmemwal.open(wal_dir) as wal:
        assert read_all(wal) == [(lsn, b"auto", 0)]


def test_append_with_flush(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        a = wal.append(b"lazy")
        assert wal.flushed_lsn <= a
        b = wal.append(payload("commit", 9000), flush=True)
        assert wal.flushed_lsn == wal.insert_lsn == next_lsn(b, 9000)
        c = wal.append(b"lazy again", flush=False)
        assert wal.flushed_lsn == c
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert [(l, d) for l, d, _ in read_all(wal)] == [
            (a, b"lazy"), (b, payload("commit", 9000)), (c, b"lazy again")]


@pytest.mark.parametrize("background", [True, False])
def test_background_flushes(wal_dir, mode, background):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=background,
                      flush_interval=0.01) as wal:
        start = wal.flushed_lsn
        lsn = wal.append(b"async")
        deadline = time.monotonic() + (5 if background else 0.2)
        while time.monotonic() < deadline and wal.flushed_lsn < wal.insert_lsn:
            time.sleep(0.005)
        if background:
            assert wal.flushed_lsn == wal.insert_lsn == next_lsn(lsn, 5)
        else:
            assert wal.flushed_lsn == start


def test_concurrent_appenders_small_ring(wal_dir):
    """Several threads through the smallest WAL buffer ring, with records larger than it
    (and batches larger than it): no deadlock, nothing lost or mixed up."""
    nthreads = 4
    results: list[list[tuple[int, bytes]]] = [[] for _ in range(nthreads)]
    errors = []

    def work(tid, wal):
        try:
            rng = random.Random(100 + tid)
            for i in range(40):
                if i % 10 == 9:
                    datas = [payload(f"r/{tid}/{i}/{k}", 9000) for k in range(20)]   # 180 KB
                    results[tid] += list(zip(map(int, wal.append_many(datas)), datas))
                else:
                    data = payload(f"r/{tid}/{i}", rng.choice([10, 8168, 40_000, 200_000]))
                    results[tid].append((wal.append(data), data))
                if rng.random() < 0.2:
                    wal.flush()
        except BaseException as exc:  # reported below
            errors.append(exc)

    wal = pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, buffer_size=16 * 8192)
    threads = [threading.Thread(target=work, args=(t, wal), daemon=True) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if any(t.is_alive() for t in threads):
        pytest.fail("appenders stuck (deadlock in the buffer ring?)")  # the WAL is leaked
    try:
        assert not errors, errors
        expected = sorted(x for r in results for x in r)
        _check(wal, expected)
    finally:
        wal.close()
    with pmemwal.open(wal_dir, mode="direct") as wal:
        _check(wal, expected)


def test_append_prefixed_refuses_a_ragged_prefix(wal_dir, mode):
    """The prefix must end 8-aligned (the streaming copy's pieces do); nothing is written."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, max_record_size=100_000) as wal:
        before = wal.insert_lsn
        with pytest.raises(ValueError, match="multiple of 8"):
            wal.append_prefixed(b"12345", b"data")
        with pytest.raises(TypeError):
            wal.append_prefixed(b"12345678", 42)
        with pytest.raises(pmemwal.RecordTooLargeError):
            wal.append_prefixed(bytes(8), bytes(wal.max_record_size - 7))
        assert wal.insert_lsn == before
        lsn = wal.append_prefixed(bytes(8), bytes(wal.max_record_size - 8))  # exactly the limit
        assert len(wal.record(lsn).payload) == wal.max_record_size
