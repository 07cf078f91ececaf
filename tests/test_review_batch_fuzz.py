"""The batch reader (Reader.fill, fetch, records, record: its one-page fast path and its
page walk) held to the one-record reader (Reader.read, the validity rules' reference) over
damaged segment images: the same records, the same payloads, the same status where it
stops, the same position to go on from, for any batch size."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pmemwal
from pmemwal import _core

SEG = 1 << 20
PAGE, PHDR, RHDR, USABLE = 8192, 24, 24, 8192 - 24
ANY = -1


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """Segment images of a small WAL whose records end at every kind of place (mid-page, a
    page's end exactly, a segment's end, across pages and segments, empty ones)."""
    path = tmp_path_factory.mktemp("batchfuzz") / "wal"
    rng = random.Random(11)
    with pmemwal.open(path, mode="buffered", segment_size=SEG, background=False) as wal:
        while wal.insert_lsn < SEG + 30 * PAGE:
            u_in = (wal.insert_lsn % PAGE) - PHDR  # (where the next record starts in its page)
            left = USABLE - u_in
            size = rng.choice([0, 0, 1, 7, 64, 300, 2000, 8144, 8168, 20000,
                               max(0, left - RHDR), max(0, left - RHDR - 8)])
            wal.append(rng.randbytes(size))
        wal.flush()
        wal_id_lo = wal._wal_id_lo
        names = sorted(p for p in path.iterdir() if p.name.endswith(".wal"))
    segs = {int(p.name[:16], 16): bytes(p.read_bytes()) for p in names}
    return segs, wal_id_lo


def _page_crc_fix(seg: bytearray, page_off: int) -> None:
    seg[page_off + 20:page_off + 24] = struct.pack("<I", _core.crc32c(bytes(seg[page_off:page_off + 20])))


def _rec_crc_fix(seg: bytearray, off: int, length: int) -> None:
    """Re-CRC a record lying in one page at file offset off (header and payload)."""
    body = bytes(seg[off + 4:off + RHDR]) + bytes(seg[off + RHDR:off + RHDR + length])
    seg[off:off + 4] = struct.pack("<I", _core.crc32c(body))


def _mutate(segs: dict[int, bytes], rnd: random.Random, n: int,
            fix_records: bool = True) -> dict[int, bytearray]:
    """n mutations of copies of segs; fix_records: a record header changed gets a CRC that
    matches again (a valid record, other than the one written, as far as the rules tell)."""
    out = {k: bytearray(v) for k, v in segs.items()}
    keys = sorted(out)
    for _ in range(n):
        segno = rnd.choice(keys)
        seg = out[segno]
        page = rnd.randrange(1, SEG // PAGE) * PAGE
        kind = rnd.randrange(6)
        if kind == 0:  # a byte flipped anywhere in the page
            seg[page + rnd.randrange(PAGE)] ^= 1 << rnd.randrange(8)
        elif kind == 1:  # a page's rem_len changed, its header still valid
            rem = struct.unpack_from("<I", seg, page + 4)[0]
            new = rnd.choice([0, 8, rem + 8, max(0, rem - 8), rnd.randrange(1 << 16) * 8])
            struct.pack_into("<I", seg, page + 4, new)
            _page_crc_fix(seg, page)
        else:  # a record header in the page changed, its CRC made good again
            off = page + PHDR + rnd.randrange(0, USABLE - RHDR, 8)
            length, prev, info = struct.unpack_from("<IQI", seg, off + 4)
            if kind == 2:
                prev = rnd.choice([0, prev + 8, max(0, prev - 8), segno * SEG + off,
                                   segno * SEG + off + 8, 2**64 - 1])
            elif kind == 3:
                length = rnd.choice([length + 8, max(0, length - 8), 0, 2**32 - 1,
                                     PAGE - (off - page) - RHDR, rnd.randrange(9000)])
            elif kind == 4:
                info = rnd.choice([0, 1, 2, 3, 0x101])
            else:  # a copy of another record's bytes here
                src = page + PHDR + rnd.randrange(0, USABLE - RHDR, 8)
                seg[off:off + RHDR] = seg[src:src + RHDR]
                continue
            struct.pack_into("<IQI", seg, off + 4, length, prev, info)
            if fix_records and off + RHDR + min(length, PAGE) <= page + PAGE:
                _rec_crc_fix(seg, off, length)
    return out


def _reader(segs, wal_id_lo):
    return _core.Reader(SEG, wal_id_lo, lambda segno: segs.get(segno))


def _chain(reader, lsn, prev, stop):
    """The reference: Reader.read record by record (void ones stepped over)."""
    out = []
    while lsn < stop:
        st, _, nxt, p, length, *_rest, void = reader.read(lsn, prev)
        if st:
            return out, st, lsn
        if not void:
            out.append((lsn, p, reader.payload(lsn)))
        prev, lsn = lsn, nxt
    return out, 0, lsn


def _filled(reader, lsn, prev, stop, max_records, max_bytes):
    out = []
    while lsn < stop:
        st, lsn, last, _, (lsns, prevs, lens, offs, data, *_) = reader.fill(
            lsn, prev, stop, max_records, max_bytes)
        lsns, prevs = np.frombuffer(lsns, np.uint64), np.frombuffer(prevs, np.uint64)
        lens, offs = np.frombuffer(lens, np.uint32), np.frombuffer(offs, np.uint64)
        assert len(lsns) <= max_records
        assert len(lsns) <= 1 or int(lens.sum()) <= max_bytes
        data = bytes(data)
        out += [(int(a), int(b), data[int(o):int(o) + int(n)])
                for a, b, o, n in zip(lsns, prevs, offs, lens)]
        if st:
            return out, st, lsn
        assert len(lsns) or last != (0 if prev == ANY else prev)  # (progress)
        prev = last or prev
    return out, 0, lsn


def _starts(segs, rnd):
    """Positions to start from: the first record of a segment, and aligned guesses."""
    starts = [min(segs) * SEG + PAGE + PHDR]
    for _ in range(6):
        segno = rnd.choice(sorted(segs))
        starts.append(segno * SEG + rnd.randrange(PAGE, SEG, 8))
    return starts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), mutations=st.integers(0, 12),
       max_records=st.sampled_from([1, 2, 5, 64, 1 << 16]),
       max_bytes=st.sampled_from([0, 100, 8000, 30000, 1 << 20]))
def test_fill_and_records_follow_the_chain_as_read_does(image, seed, mutations, max_records,
                                                        max_bytes):
    segs, wal_id_lo = image
    rnd = random.Random(seed)
    segs = _mutate(segs, rnd, mutations)
    reader = _reader(segs, wal_id_lo)
    stop = (max(segs) + 1) * SEG
    for start in _starts(segs, rnd):
        want, want_st, want_at = _chain(reader, start, ANY, stop)
        assert _filled(reader, start, ANY, stop, max_records, max_bytes) == \
            (want, want_st, want_at)
        st_, at, last, bad, records = reader.records(start, ANY, stop, 1 << 30, 1 << 40)
        assert [(r.lsn, r.prev_lsn, bytes(r.payload)) for r in records] == want
        assert (st_, at) == (want_st, want_at)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), mutations=st.integers(0, 12),
       max_bytes=st.sampled_from([0, 100, 8000, 1 << 20]))
def test_fetch_and_record_read_each_lsn_as_read_does(image, seed, mutations, max_bytes):
    segs, wal_id_lo = image
    rnd = random.Random(seed)
    good, _, _ = _chain(_reader(segs, wal_id_lo), min(segs) * SEG + PAGE + PHDR, ANY,
                        (max(segs) + 1) * SEG)
    segs = _mutate(segs, rnd, mutations)
    reader = _reader(segs, wal_id_lo)
    lsns = [rnd.choice(good)[0] if rnd.random() < 0.8 else
            rnd.randrange(0, (max(segs) + 1) * SEG, rnd.choice([1, 8])) for _ in range(40)]
    want = []
    for lsn in lsns:
        st_, _, _, p, _, *_rest, void = reader.read(lsn)
        if st_ or void:
            want_status = st_ or 9  # WAL_VOID_RECORD
            break
        want.append((lsn, p, reader.payload(lsn)))
    else:
        want_status = 0
    got, done = [], 0
    while done < len(lsns):
        st_, n, bad, (a, b, lens, offs, data, *_) = reader.fetch(
            np.array(lsns[done:], np.uint64).tobytes(), max_bytes)
        a, b = np.frombuffer(a, np.uint64), np.frombuffer(b, np.uint64)
        lens, offs, data = np.frombuffer(lens, np.uint32), np.frombuffer(offs, np.uint64), bytes(data)
        got += [(int(x), int(y), data[int(o):int(o) + int(k)]) for x, y, o, k in zip(a, b, offs, lens)]
        done += n
        if st_:
            break
    assert (got, st_ if done < len(lsns) else 0) == (want, want_status)
    one_by_one, st2 = [], 0
    for lsn in lsns:
        st2, _, rec = reader.record(lsn)
        if st2:
            break
        one_by_one.append((rec.lsn, rec.prev_lsn, bytes(rec.payload)))
    assert (one_by_one, st2) == (want, want_status)


@pytest.fixture(scope="module")
def written_wal(tmp_path_factory):
    """A closed WAL's directory and its records {lsn: payload}."""
    path = tmp_path_factory.mktemp("batchfuzz-wal") / "wal"
    rng = random.Random(5)
    written = {}
    with pmemwal.open(path, mode="buffered", segment_size=SEG, background=False) as wal:
        while wal.insert_lsn < SEG + 30 * PAGE:
            left = USABLE - ((wal.insert_lsn % PAGE) - PHDR)
            size = rng.choice([0, 1, 64, 300, 8144, 20000, max(0, left - RHDR)])
            data = rng.randbytes(size)
            written[wal.append(data)] = data
    return path, written


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), mutations=st.integers(1, 10),
       max_records=st.sampled_from([1, 3, 1 << 16]), max_bytes=st.sampled_from([0, 5000, 1 << 20]))
def test_damaged_wal_reads_give_written_records_or_typed_errors(
        written_wal, tmp_path_factory, seed, mutations, max_records, max_bytes):
    """Through the WAL's own reads (scan, records, read_many, record) over files damaged with
    valid-looking headers: every record returned is one written, with its payload, at its
    LSN; anything else is a typed error."""
    source, written = written_wal
    path = tmp_path_factory.mktemp("case") / "wal"
    path.mkdir()
    rnd = random.Random(seed)
    files = {int(p.name[:16], 16): p for p in source.iterdir() if p.name.endswith(".wal")}
    damaged = _mutate({k: p.read_bytes() for k, p in files.items()}, rnd, mutations,
                      fix_records=False)  # (a record made valid again would be a record)
    for p in source.iterdir():
        (path / p.name).write_bytes(p.read_bytes())
    for segno, data in damaged.items():
        (path / files[segno].name).write_bytes(bytes(data))
    typed = (pmemwal.WALError, ValueError)
    try:
        wal = pmemwal.open(path, mode="buffered", on_corruption="truncate", background=False)
    except pmemwal.WALError:
        return
    with wal:
        def check(lsn, payload):
            assert bytes(payload) == written[int(lsn)]
        try:
            for batch in wal.scan(max_records=max_records, max_bytes=max_bytes):
                assert len(batch) <= max_records
                for i, lsn in enumerate(batch.lsns.tolist()):
                    check(lsn, batch.payload(i))
        except typed:
            pass
        try:
            for rec in wal.records():
                check(rec.lsn, rec.payload)
        except typed:
            pass
        lsns = sorted(written)
        pick = [rnd.choice(lsns) if rnd.random() < 0.9 else rnd.randrange(2 * SEG) for _ in range(30)]
        try:
            batch = wal.read_many(pick, max_bytes=max_bytes)
            assert batch.lsns.tolist() == pick
            for i, lsn in enumerate(pick):
                check(lsn, batch.payload(i))
        except typed:
            pass
        for lsn in pick[:10]:
            try:
                check(lsn, wal.record(lsn).payload)
            except typed:
                pass
