"""The read path: which error a failed read raises (damage, a truncated position, a bad LSN),
reads from several threads at once, and how long a payload view keeps the bytes it shows."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import subprocess
import sys
import threading

import pytest

import pmemwal
from conftest import PAGE, SEG, file_bytes, file_write, flip_byte, next_lsn
from pmemwal import _core, segments
from pmemwal.format import first_lsn
from pmemwal.log_index import INDEX_DIR
from pmemwal.wal import supply


def _payload(i: int, size: int = 200) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def _fill(wal: pmemwal.WAL, segments: int, start: int = 0, size: int = 200) -> list[int]:
    """Append records numbered from ``start`` until ``segments`` more segments are full."""
    stop = wal.insert_lsn + segments * SEG
    lsns, i = [], start
    while wal.insert_lsn < stop:
        lsns.append(wal.append(_payload(i, size)))
        i += 1
    wal.flush()
    return lsns


# ---- damage at the oldest segment's first record -----------------------------------------

def _damage_first_page(wal_dir) -> None:
    """Garble the page header of segment 0's first data page (after a clean close, open
    reads nothing and finds nothing wrong)."""
    file_write(wal_dir, PAGE + 2, bytes([file_bytes(wal_dir, PAGE + 2, 1)[0] ^ 0xFF]))


def test_damage_at_the_oldest_segments_first_page_is_corruption_for_every_read(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        _fill(wal, 2)
    _damage_first_page(wal_dir)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        with pytest.raises(pmemwal.CorruptionError) as err:
            list(wal.records())
        assert err.value.lsn == first_lsn(0, SEG)
        with pytest.raises(pmemwal.CorruptionError):
            list(wal.record_heads(8))


def test_an_empty_wal_still_reads_as_empty(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        assert list(wal.records()) == [] and list(wal.record_heads(8)) == []


def test_a_wal_whose_only_record_left_ends_where_it_ends_reads_as_empty(wal_dir, mode):
    """The oldest segment holds only the end of a record from a truncated one, and it ends at
    a page boundary: the next page, where the first record would start, is not written."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        wal.append(b"x" * 100)
        start, target = wal.insert_lsn, first_lsn(1, SEG) + PAGE
        length = next(n for n in range(SEG - start, 2 * SEG, 8) if next_lsn(start, n) >= target)
        assert next_lsn(start, length) == target
        wal.append(b"y" * length, flush=True)
        assert wal.truncate(wal.insert_lsn) == 1
        assert list(wal.records()) == [] and list(wal.record_heads(8)) == []


def test_a_log_without_its_index_refuses_to_open_over_a_damaged_first_page(wal_dir, mode):
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=SEG) as log:
        log.append_many([_payload(i) for i in range(9000)], term=1)
        log.sync()
    shutil.rmtree(wal_dir / INDEX_DIR)
    _damage_first_page(wal_dir)
    with pytest.raises(pmemwal.CorruptionError):
        pmemwal.open_log(wal_dir, mode=mode)  # never an empty log that writes entry 1 again


# ---- a damaged record, a bad LSN, a truncated LSN: three errors --------------------------

def _damaged_wal(wal_dir, mode) -> list[int]:
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        lsns = _fill(wal, 1)
    flip_byte(wal_dir, lsns[100] + 40)  # record 100's payload: its checksum fails
    return lsns


def test_a_damaged_record_asked_for_by_its_lsn_is_corruption_not_a_bad_lsn(wal_dir, mode):
    lsns = _damaged_wal(wal_dir, mode)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        with pytest.raises(pmemwal.CorruptionError) as err:
            wal.record(lsns[100])
        assert err.value.lsn == lsns[100]
        with pytest.raises(pmemwal.CorruptionError):
            next(wal.records(lsns[100]))
        assert bytes(wal.record(lsns[101]).payload) == _payload(101)


def test_an_lsn_where_no_record_starts_is_a_value_error(wal_dir, mode):
    lsns = _damaged_wal(wal_dir, mode)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        for bad in (lsns[50] + 8, lsns[100] + 8, lsns[150] + 16):
            with pytest.raises(ValueError):
                wal.record(bad)
            with pytest.raises(ValueError):
                next(wal.records(bad))
        with pytest.raises(ValueError):
            wal.record(wal.insert_lsn + 64)
        with pytest.raises(ValueError):
            wal.record(lsns[50] + 3)  # not even a record position


def test_a_truncated_lsn_is_a_truncated_error(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        lsns = _fill(wal, 3)
        wal.truncate(first_lsn(2, SEG))
        for call in (lambda: wal.record(lsns[0]), lambda: next(wal.records(lsns[0]))):
            with pytest.raises(pmemwal.TruncatedError) as err:
                call()
            assert not isinstance(err.value, (ValueError, pmemwal.CorruptionError))
            assert err.value.lsn == lsns[0] and err.value.first_lsn == wal.first_lsn


@pytest.mark.parametrize("recycle", [0, 4])
def test_a_reader_that_a_truncation_overtakes_gets_a_truncated_error(wal_dir, mode, recycle):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=recycle) as wal:
        lsns = _fill(wal, 4)
        reader, heads = wal.records(), wal.record_heads(4, batch=100)
        assert bytes(next(reader).payload) == _payload(0)
        assert bytes(next(heads)[2][0]) == _payload(0)[:4]
        assert wal.truncate(first_lsn(3, SEG)) == 3
        _fill(wal, 4, start=len(lsns))  # the recycled files written again
        for read in (reader, heads):
            with pytest.raises(pmemwal.TruncatedError) as err:
                for _ in read:
                    pass
            assert err.value.lsn < first_lsn(3, SEG) <= err.value.first_lsn


# ---- readers in several threads -----------------------------------------------------------

def test_threads_reading_a_wal_of_many_segments_at_once_all_read_it_whole(wal_dir, mode,
                                                                         monkeypatch):
    """More segments than the read cache keeps (made small here, so that it happens all
    the time): each thread's reads open mappings that evict (and close) those another
    thread is reading through, and the threads take turns inside each other's reads."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        lsns = _fill(wal, 24, size=3000)
    monkeypatch.setattr(supply, "_READ_CACHE", 2)
    switch = sys.getswitchinterval()
    with pmemwal.open(wal_dir, mode=mode) as wal:
        failures: list[BaseException] = []
        counts: list[int] = []

        def read() -> None:
            try:
                counts.append(sum(1 for rec in wal.records() if len(rec.payload) == 3000))
            except BaseException as exc:  # noqa: BLE001 (reported below)
                failures.append(exc)

        threads = [threading.Thread(target=read) for _ in range(6)]
        sys.setswitchinterval(1e-6)  # the threads take turns often
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(switch)
        assert not failures, failures
        assert counts == [len(lsns)] * 6


# ---- how long a payload view keeps its bytes ----------------------------------------------

def test_a_held_payload_view_keeps_its_bytes_when_its_segment_is_truncated(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        lsns = _fill(wal, 3)
        held = [wal.record(lsns[0]).payload, next(wal.records(lsns[1])).payload]
        wal.truncate(first_lsn(3, SEG))
        _fill(wal, 6, start=len(lsns))  # into whatever files the truncation recycled
        assert [bytes(v) for v in held] == [_payload(0), _payload(1)]
        assert wal.stats()["segments_recycled"] >= 1  # a payload is a copy: it pins nothing


def test_segments_whose_payloads_are_held_are_recycled_all_the_same(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        lsns = _fill(wal, 3)
        held = [wal.record(lsns[0]).payload, next(iter(wal.scan())).payload(0)]
        wal.truncate(first_lsn(3, SEG))
        assert wal.stats()["segments_recycled"] == 3 and wal.stats()["segments_removed"] == 0
        _fill(wal, 6, start=len(lsns))  # into the recycled files
        assert [bytes(v) for v in held] == [_payload(0), _payload(0)]


def test_a_held_payload_view_keeps_its_bytes_after_close(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        lsns = _fill(wal, 3)
        held = wal.record(lsns[0]).payload
    with pmemwal.open(wal_dir, mode=mode, background=False, recycle_segments=8) as wal:
        wal.truncate(first_lsn(3, SEG))
        _fill(wal, 6, start=len(lsns))  # another open reuses the files
    assert bytes(held) == _payload(0)


def test_a_held_log_entry_payload_keeps_its_bytes_through_compaction(wal_dir, mode):
    with pmemwal.open_log(wal_dir, mode=mode, segment_size=SEG, background=False,
                          recycle_segments=8) as log:
        n = 15000  # about three segments
        log.append_many([_payload(i) for i in range(n)], term=1, sync=True)
        held = log.entry(1).payload
        log.compact(n)
        log.append_many([_payload(i) for i in range(n, 3 * n)], term=1, sync=True)
        assert bytes(held) == _payload(0)
    assert bytes(held) == _payload(0)


def test_a_shared_wals_own_truncation_keeps_this_processs_views(wal_dir):
    """A shared WAL: a truncation in the process that holds the view is bound by it as in a
    WAL of one process (another process's is not: docs/SHARED.md)."""
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        lsns = _fill(wal, 3)
        held = wal.record(lsns[0]).payload
        wal.truncate(first_lsn(3, SEG))
        _fill(wal, 6, start=len(lsns))
        assert bytes(held) == _payload(0)


def test_another_processs_truncation_keeps_this_processs_views(wal_dir):
    """A shared WAL: another process truncates past a record this one holds a view of, then
    appends on into the segments it recycled.  The payload keeps its bytes: a shared WAL's
    payloads are copies, since no process knows of another's views."""
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        lsns = _fill(wal, 3)
        held = wal.record(lsns[0]).payload
        code = f"""
import pmemwal
with pmemwal.open({str(wal_dir)!r}, shared=True, segment_size={SEG}, background=False,
                  recycle_segments=8) as wal:
    assert wal.truncate({first_lsn(3, SEG)}) > 0
    stop = wal.insert_lsn + 6 * {SEG}
    while wal.insert_lsn < stop:
        wal.append(bytes([0xEE]) * 200)
    wal.flush()
"""
        from conftest import child_env
        subprocess.run([sys.executable, "-c", code], env=child_env(), check=True)
        assert bytes(held) == _payload(0)


# ---- what lands between the steps of one read ---------------------------------------------

class _ReaderThen:
    """The WAL's own reader, with ``act`` run once right after (``after``) or right before
    one call of ``method``: what another thread would do at that point of a read."""

    def __init__(self, wal: pmemwal.WAL, method: str, act, after: bool = True) -> None:
        self._real, self._method, self._act, self._after = wal._reader, method, act, after

    def __getattr__(self, name: str):
        call = getattr(self._real, name)
        if name != self._method or self._act is None:
            return call

        def wrapped(*args):
            act, self._act = self._act, None
            if not self._after:
                act()
            result = call(*args)
            if self._after:
                act()
            return result
        return wrapped


@pytest.mark.parametrize("size", [200, 20000])  # in one page, across pages
def test_a_truncation_right_after_a_read_leaves_the_record_read_whole(wal_dir, mode, size):
    """The record, read and copied in one native call, comes back whole; read again, it is
    a TruncatedError; a truncation just before the call makes the call one."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        lsns = _fill(wal, 10, size=size)

        def truncate_past_it() -> None:
            wal.truncate(first_lsn(wal.first_lsn // SEG + 1, SEG))

        reads = {"record": lambda lsn: wal.record(lsn),
                 "records": lambda lsn: next(wal.records(lsn)),
                 "fetch": lambda lsn: next(iter(wal.read_many([lsn]))),
                 "fill": lambda lsn: next(iter(next(wal.scan(lsn))))}
        for method, read in reads.items():
            first = next(wal.records()).lsn
            wal._reader = _ReaderThen(wal, method, truncate_past_it)
            assert bytes(read(first).payload) == _payload(lsns.index(first), size)
            wal._reader = wal._reader._real
            with pytest.raises(pmemwal.TruncatedError) as err:
                read(first)
            assert err.value.lsn == first and err.value.first_lsn == wal.first_lsn
            first = next(wal.records()).lsn
            wal._reader = _ReaderThen(wal, method, truncate_past_it, after=False)
            with pytest.raises(pmemwal.TruncatedError):
                read(first)
            wal._reader = wal._reader._real


def test_three_readers_a_truncating_appender_and_close_see_only_typed_errors(wal_dir, mode):
    """Records of many sizes (many span pages), truncated under the readers all along,
    then the WAL closed under them: every read returns a whole record or raises
    TruncatedError or ClosedError, and a payload held through all of it keeps its bytes."""
    wal = pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=4)
    _fill(wal, 4)
    failures: list[BaseException] = []
    held: list[tuple[int, memoryview]] = []
    reads = threading.Barrier(4)

    def append() -> None:
        i = 0
        for i in range(1, 30001):
            wal.append(_payload(i, 100 + (i * 37) % 3000))
            if i % 2000 == 0:
                wal.truncate(wal.flush() - 3 * SEG)
        reads.wait()  # the readers have read through truncations: close under them now
        wal.close()

    def read() -> None:
        waited = False
        try:
            while True:
                try:
                    for n, rec in enumerate(wal.records()):
                        i = int.from_bytes(bytes(rec.payload[:4]), "little")
                        assert bytes(rec.payload) == _payload(i, len(rec.payload)), rec.lsn
                        if n % 997 == 0:
                            held.append((i, rec.payload))
                except pmemwal.TruncatedError:
                    pass
                if not waited:
                    waited = True
                    reads.wait()
        except pmemwal.ClosedError:
            if not waited:
                reads.wait()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)
            reads.abort()

    threads = [threading.Thread(target=append)] + [threading.Thread(target=read) for _ in range(3)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
        wal.close()
    assert not failures, failures
    with pmemwal.open(wal_dir, mode=mode, recycle_segments=8) as again:  # the files reused
        again.truncate(again.flush())
        _fill(again, 6, start=10**6)
    assert all(bytes(v) == _payload(i, len(v)) for i, v in held)


# ---- reads after close --------------------------------------------------------------------

def test_a_records_iterator_resumed_after_close_raises_closed_error(wal_dir, mode):
    """Once what it had read ahead (whole records, copies) is handed out."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        lsns = _fill(wal, 3)
        reader, heads, batches = wal.records(), wal.record_heads(4, batch=10), \
            wal.scan(max_records=10)
        next(reader), next(heads), next(batches)
    read_ahead = []
    with pytest.raises(pmemwal.ClosedError):
        for record in reader:
            read_ahead.append(record)
    assert 0 < len(read_ahead) < len(lsns) - 1
    assert [bytes(r.payload) for r in read_ahead] == [_payload(i) for i in
                                                      range(1, len(read_ahead) + 1)]
    for read in (heads, batches):
        with pytest.raises(pmemwal.ClosedError):
            next(read)
    assert not wal._read_cache and not wal._segments  # nothing mapped again after close


def test_a_read_that_close_overtakes_raises_closed_error(wal_dir, mode):
    """close() lands just before a read's native call: the call's first segment is refused
    (a mapping made after close would never be let go)."""
    for method, read in (("records", lambda wal, lsn: next(wal.records(lsn))),
                         ("record", lambda wal, lsn: wal.record(lsn)),
                         ("fill", lambda wal, lsn: next(wal.scan(lsn)))):
        wal = pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False)
        lsns = _fill(wal, 3)
        wal._reader = _ReaderThen(wal, method, wal.close, after=False)
        with pytest.raises(pmemwal.ClosedError):
            read(wal, lsns[1])
        assert not wal._read_cache and not wal._segments


# ---- close releases everything, whatever fails --------------------------------------------

# ---- a bad LSN on an undamaged WAL --------------------------------------------------------

def test_an_lsn_inside_a_record_covering_a_segment_at_the_wals_end_is_a_value_error(wal_dir,
                                                                                    mode):
    """The record covers segment 1 and ends at a page boundary where the WAL ends: segment 1
    has no first record, and the page after the record is not written yet."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        wal.append(b"x" * 100)
        start, target = wal.insert_lsn, first_lsn(2, SEG) + PAGE
        length = next(n for n in range(SEG, 3 * SEG, 8) if next_lsn(start, n) >= target)
        assert next_lsn(start, length) == target
        big = wal.append(b"y" * length, flush=True)
        for bad in (first_lsn(1, SEG) + 4 * PAGE + 64, big + 64):
            with pytest.raises(ValueError):
                wal.record(bad)
        assert len(wal.record(big).payload) == length


def test_a_truncation_while_a_bad_lsn_is_looked_into_is_a_truncated_error(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=8) as wal:
        lsns = _fill(wal, 4)
        wal._reader = _ReaderThen(wal, "first_record",
                                  lambda: wal.truncate(first_lsn(2, SEG)), after=False)
        with pytest.raises(pmemwal.TruncatedError) as err:
            wal.record(lsns[5] + 8)
        assert err.value.lsn == lsns[5] + 8
        assert not wal._damage_read  # no damage was read


# ---- the Reader refuses what it cannot work with ------------------------------------------

def test_a_reader_never_initialised_refuses_every_call():
    script = """
import pmemwal._core as c
r = c.Reader.__new__(c.Reader)  # __init__ never ran
for call in (lambda: r.read(0), lambda: r.payload(0), lambda: r.scan(0, -1, 100),
             lambda: r.heads(0, -1, 100, 8, 10), lambda: r.first_record(0),
             lambda: r.beyond(0, 0, 0), lambda: r.fill(0, -1, 100, 10, 100),
             lambda: r.fetch(bytes(8), 100), lambda: r.records(0, -1, 100, 10, 100),
             lambda: r.record(0)):
    try:
        call()
    except RuntimeError:
        continue
    raise SystemExit("no error")
print("refused")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # (a crash here must not take the test run with it)
    assert done.returncode == 0 and done.stdout.strip() == "refused", (done.returncode,
                                                                      done.stderr)


# ---- held views and the read cache --------------------------------------------------------

def test_held_views_of_many_segments_keep_one_descriptor_each_at_most(wal_dir, mode,
                                                                      monkeypatch):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        _fill(wal, 12)
    monkeypatch.setattr(supply, "_READ_CACHE", 2)
    with pmemwal.open(wal_dir, mode=mode, background=False) as wal:
        before = len(os.listdir("/proc/self/fd"))
        held, last = [], -1
        for rec in wal.records():
            if rec.lsn // SEG != last:
                held.append(rec.payload)
                last = rec.lsn // SEG
        assert len(held) >= 12
        assert len(os.listdir("/proc/self/fd")) - before <= len(held)
