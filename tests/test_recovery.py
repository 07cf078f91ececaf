"""Recovery: reopening continues exactly where the last valid record ends.

- reopen-and-continue, in each mode and switching modes between sessions;
- a torn tail (damage after the last flush) is cut silently;
- stale bytes of a recycled segment are never taken for records, also when an
  intact old record lies exactly at the insert position and the next record's
  header is torn over it (seed 004, Tom Lane's scenario);
- damage to flushed records followed by valid ones raises CorruptionError at
  the damaged record, or is cut with on_corruption="truncate";
- a clean close writes a checkpoint at the end of the WAL, which a crash would
  not have left: tests that simulate a crash by closing cleanly and damaging the
  tail rewind it first (conftest.rewind_checkpoint); damage before a checkpoint
  is found when the record is read, or on open with verify="all", never cut;
- retention: truncate() removes or recycles whole segments.

Damage is done to the segment files with ordinary file writes at offsets
computed from the format (LSN % segment_size is the offset in the file).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import random
import shutil
import struct
import warnings

import pytest

import pmemwal
from pmemwal import _core, lostfound
from pmemwal.checkpoint import CheckpointFile
from pmemwal.format import HEADER_SIZE, PAGE_MAGIC, SegmentHeader
from pmemwal.recovery import RecoveryWarning
from conftest import (PAGE, PAGE_HDR, REC_HDR, SEG, USABLE, assert_chain, expected_end,
                      file_bytes, file_write, first_lsn_of_segment, flip_byte, lsn_of, next_lsn, payload,
                      read_all, rec_size, rewind_checkpoint, seg_file, seg_usable, stream_read,
                      stream_write, usable_of)

MODES = ("buffered", "direct")


def _append(wal, sizes, seed, *, flush_each=False):
    out = []
    for i, n in enumerate(sizes):
        data = payload(f"{seed}/{i}", n)
        lsn = wal.append(data)
        if flush_each:
            assert wal.flush(lsn) >= next_lsn(lsn, n)
        out.append((lsn, data))
    return out


def _records(wal):
    return [(lsn, data) for lsn, data, _ in read_all(wal)]


def _dir_digest(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.iterdir()) if p.is_file()}


def _segments_digest(path) -> dict[str, str]:
    """The segment files' contents (an open that succeeds writes CHECKPOINT)."""
    return {name: digest for name, digest in _dir_digest(path).items() if name.endswith(".wal")}


# ---- reopen and continue ----------------------------------------------------------

END_SIZES = {
    "mid": [10, 9000, 0, 20000, 333],
    "page_end": [USABLE - REC_HDR],                       # ends at the last byte of page 1
    "segment_end": [seg_usable() - REC_HDR - rec_size(10), 10],  # ends at segment 0's last byte
}


@pytest.mark.parametrize("end_at", sorted(END_SIZES))
@pytest.mark.parametrize("mode1,mode2", list(itertools.product(MODES, MODES)))
def test_reopen_and_continue(wal_dir, mode1, mode2, end_at):
    with pmemwal.open(wal_dir, mode=mode1, segment_size=SEG) as wal:
        first = _append(wal, END_SIZES[end_at], "s1")
        end1 = wal.insert_lsn
    assert end1 == next_lsn(*[(lsn, len(d)) for lsn, d in first][-1])
    if end_at == "page_end":
        assert end1 == 2 * PAGE + PAGE_HDR
    if end_at == "segment_end":
        assert end1 == first_lsn_of_segment(1)

    with pmemwal.open(wal_dir, mode=mode2) as wal:
        assert wal.mode == mode2
        assert wal.insert_lsn == wal.flushed_lsn == end1
        assert _records(wal) == first
        second = _append(wal, [5, 8168, 70000, 1], "s2")
        assert second[0][0] == end1
        recs = read_all(wal)
        assert recs[len(first)][2] == first[-1][0]   # the new record links to the old last one
        end2 = wal.insert_lsn

    with pmemwal.open(wal_dir, mode=mode1) as wal:
        recs = read_all(wal)
        assert [(lsn, data) for lsn, data, _ in recs] == first + second
        assert recs[0][2] == 0
        assert_chain(recs)
        assert wal.insert_lsn == end2 == expected_end(recs)
        third = _append(wal, [42], "s3")
        assert third[0][0] == end2
    with pmemwal.open(wal_dir, mode=mode2) as wal:
        assert _records(wal) == first + second + third


# ---- torn tail ----------------------------------------------------------------------

TAIL_DAMAGE = ["garbage_last", "zero_inside_last", "garbage_first_unflushed",
               "header_first_unflushed", "unwritten_page"]


@pytest.mark.parametrize("damage", TAIL_DAMAGE)
def test_torn_tail(wal_dir, mode, damage):
    # no background writer: the "unflushed" records must stay unflushed until close
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        flushed = _append(wal, [100, 9000, 0, 3000, 8168, 17], "flushed", flush_each=True)
        wal.flush()
        boundary = wal.flushed_lsn
        unflushed = _append(wal, [500, 20000, 64, 12000], "unflushed")
    # close() wrote the unflushed records too; now tear them as a crash might have, and
    # leave the checkpoint where the crash would have: the one open wrote, at the start
    rewind_checkpoint(wal_dir)
    assert unflushed[0][0] == boundary
    last_lsn, last = unflushed[-1]
    if damage == "garbage_last":
        stream_write(wal_dir, last_lsn, payload("garbage", rec_size(len(last))))
        good = flushed + unflushed[:-1]
    elif damage == "zero_inside_last":          # written only up to the middle of its payload
        half = REC_HDR + len(last) // 2
        stream_write(wal_dir, last_lsn + 0, stream_read(wal_dir, last_lsn, half)
                     + bytes(rec_size(len(last)) - half))
        good = flushed + unflushed[:-1]
    elif damage == "garbage_first_unflushed":   # later unflushed records are still intact
        stream_write(wal_dir, unflushed[0][0], payload("garbage", REC_HDR + 100))
        good = flushed
    elif damage == "header_first_unflushed":
        flip_byte(wal_dir, unflushed[0][0] + 1)  # its CRC
        good = flushed
    else:  # "unwritten_page": a page the 20000-byte record runs into never reached the disk
        lsn20k = unflushed[1][0]
        page = lsn_of(usable_of(lsn20k) + USABLE - usable_of(lsn20k) % USABLE)
        file_write(wal_dir, page - page % PAGE, bytes(PAGE))
        good = flushed + unflushed[:1]
    cut = expected = next_lsn(good[-1][0], len(good[-1][1]))
    # the valid records past the cut (later unflushed ones the tear left whole) are set aside
    aside = [r for r in unflushed if r[0] > cut and damage not in ("garbage_last", "zero_inside_last")
             and (damage != "unwritten_page" or r[0] > unflushed[1][0])]

    with (pytest.warns(RecoveryWarning, match="set aside") if aside else contextlib.nullcontext()):
        wal = pmemwal.open(wal_dir, mode=mode)       # on_corruption="raise": no error
    entries = lostfound.entries(wal_dir)
    assert [list(e.records()) for e in entries] == ([aside] if aside else [])
    with wal:
        recs = read_all(wal)
        assert [(lsn, data) for lsn, data, _ in recs] == good
        assert_chain(recs)
        assert wal.insert_lsn == wal.flushed_lsn == cut
        more = _append(wal, [7, 9000, 300], "more")
        assert more[0][0] == expected
        recs = read_all(wal)
        assert recs[len(good)][2] == good[-1][0]
    with pmemwal.open(wal_dir, mode=mode) as wal:
        recs = read_all(wal)
        assert [(lsn, data) for lsn, data, _ in recs] == good + more
        assert_chain(recs)
        assert wal.insert_lsn == expected_end(recs)


# ---- stale bytes in recycled segments (seed 004) --------------------------------------

def _fill_and_recycle(wal_dir, mode, **opts):
    """Old records through segments 0-2, then segments 0 and 1 recycled.

    Returns the open WAL, the old records, those kept (segment 2 on), and the
    numbers segments 0 and 1 were recycled to (with the background writer on,
    segments already prepared ahead push them further out).  ``max_wal_size`` keeps the
    background writer's growth depth at ``prepare_segments`` (a quarter of it at most):
    spares made ahead for a growing WAL count toward the pool, and more of them would
    leave the truncation removing what this test wants recycled.
    """
    wal = pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=2,
                       max_wal_size=8 * SEG, **opts)
    old = []
    i = 0
    while wal.insert_lsn < 2 * SEG + 3 * PAGE:
        data = payload(f"old/{i}", 1000)
        old.append((wal.append(data), data))
        wal.flush()
        i += 1
    inodes = [seg_file(wal_dir, s).stat().st_ino for s in (0, 1)]  # a rename keeps the inode
    assert wal.truncate(2 * SEG) == 2
    assert wal.stats()["segments_recycled"] == 2
    by_inode = {p.stat().st_ino: int(p.name[:16], 16) for p in wal_dir.glob("*.wal")}
    recycled = [by_inode[i] for i in inodes]          # old segment 0's new number first
    assert recycled[0] < recycled[1] and recycled[0] > 2
    assert not seg_file(wal_dir, 0).exists() and not seg_file(wal_dir, 1).exists()
    kept = [(lsn, d) for lsn, d in old if lsn >= 2 * SEG]
    return wal, old, kept, recycled


def _pad_to(wal, target: int, seed: str):
    """Append one record so that the next one would start exactly at LSN ``target``."""
    n = usable_of(target) - usable_of(wal.insert_lsn) - REC_HDR
    assert n >= 0
    data = payload(seed, n)
    lsn = wal.append(data)
    wal.flush()
    assert wal.insert_lsn == target
    return lsn, data


@pytest.mark.parametrize("background", [False, True])
def test_write_into_recycled_segment_then_reopen(wal_dir, mode, background):
    """A clean close after writing into a recycled segment reopens without error."""
    wal, old, kept, recycled = _fill_and_recycle(wal_dir, mode, background=background)
    with wal:
        new = []
        while wal.insert_lsn < recycled[0] * SEG + 5 * PAGE:
            new += _append(wal, [1000], f"new/{len(new)}", flush_each=True)
        end = wal.insert_lsn
        assert end // SEG == recycled[0]
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.insert_lsn == end
        recs = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in recs] == kept + new
        assert_chain(recs)


@pytest.mark.parametrize("tear", ["none", "prev_link", "crc_length", "crc_length_prev"])
def test_stale_record_at_insert_position(wal_dir, mode, tear):
    """An intact old record lies exactly where the next record would start.

    ``none``: nothing more is written (the next record was never begun);
    ``prev_link``: the next record's prev-link reached the disk, nothing else
    (bytes 8..15 new, the rest of the old record intact: Tom Lane's case);
    ``crc_length``: its first 8 bytes (CRC and length) reached the disk;
    ``crc_length_prev``: the first 16 bytes of the next record's header
    (CRC, length, prev-link) reached the disk, the rest is the old record.
    """
    wal, old, kept, recycled = _fill_and_recycle(wal_dir, mode, background=False)
    r0 = recycled[0]                                              # old segment 0 lives on as r0
    with wal:
        new = _append(wal, [1000] * 3, "new", flush_each=True)   # into segment 2's tail ...
        while wal.insert_lsn < r0 * SEG + 2 * PAGE:               # ... and on into segment r0
            new += _append(wal, [777], f"new/{len(new)}", flush_each=True)
        assert wal.insert_lsn // SEG == r0
        # an old record of segment 0 (now 3) further on in a page, with another old
        # record after it in the same page
        cur = wal.insert_lsn % SEG
        idx = next(k for k, (lsn, _) in enumerate(old[:-1])
                   if lsn < SEG and lsn - cur >= 3 * PAGE and lsn % PAGE >= PAGE_HDR + 64
                   and old[k + 1][0] // PAGE == lsn // PAGE)
        stale_lsn, stale_data = old[idx]
        target = r0 * SEG + stale_lsn
        new.append(_pad_to(wal, target, "pad"))
        prev = new[-1][0]
    # the old record is intact where the next one would go
    hdr = stream_read(wal_dir, target, REC_HDR)
    _, old_len, old_prev, info, _ = struct.unpack("<IIQII", hdr)
    assert (old_len, old_prev, info) == (1000, old[idx - 1][0], 1)
    assert stream_read(wal_dir, target + REC_HDR, 1000) == stale_data
    if tear == "none":
        pass
    elif tear == "prev_link":
        stream_write(wal_dir, target + 8, struct.pack("<Q", prev))
    else:  # the header the next record (1000 bytes, other content) would have had
        body = payload("the-next-one", 1000)
        crc = _core.crc32c(body, _core.crc32c(struct.pack("<IQII", 1000, prev, 1, 0)))
        new_header = struct.pack("<IIQII", crc, 1000, prev, 1, 0)
        stream_write(wal_dir, target, new_header[:8 if tear == "crc_length" else 16])

    for _ in range(2):  # reopening twice: the first one's repairs must hold
        with pmemwal.open(wal_dir, mode=mode) as wal:
            recs = read_all(wal)
            assert [(lsn, d) for lsn, d, _ in recs] == kept + new
            assert all(lsn < target for lsn, _, _ in recs)
            assert stale_data not in [d for _, d, _ in recs]
            assert_chain(recs)
            assert wal.insert_lsn == target
    with pmemwal.open(wal_dir, mode=mode) as wal:
        after = _append(wal, [1000, 5], "after")
        assert after[0][0] == target
    with pmemwal.open(wal_dir, mode=mode) as wal:
        recs = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in recs] == kept + new + after
        assert_chain(recs)


def test_current_bytes_under_a_stale_page_header_are_wiped(wal_dir, mode):
    """A crash kept a record (R2) of a page whose header, owed by the unfinished record before
    it (R1, crossing into the page), still is the old cycle's: a later writer owning it, or
    the page cache writing back R2's half of the page and not the header's, leaves that.
    Recovery ends at R1.  Once a record of R1's size lands where R1 was, the page's header is
    valid again and R2 links to it: R2 must have been wiped, or it comes back from the dead."""
    wal, old, kept, recycled = _fill_and_recycle(wal_dir, mode, background=False)
    page = recycled[0] * SEG + 4 * PAGE                       # a page of a recycled segment
    stale_header = file_bytes(wal_dir, page, PAGE_HDR)
    assert struct.unpack_from("<Q", stale_header, 8)[0] == page - recycled[0] * SEG  # old cycle's
    with wal:
        new = []
        while wal.insert_lsn < recycled[0] * SEG + 2 * PAGE:
            new += _append(wal, [777], f"new/{len(new)}", flush_each=True)
        new.append(_pad_to(wal, page - 504, "pad"))          # R1 starts 504 bytes before the page
        (r1, r1_data), (r2, r2_data) = _append(wal, [1000, 300], "r", flush_each=True)
        assert r1 < page < r2 < page + PAGE
    file_write(wal_dir, page, stale_header)                   # the header never reached the media
    stream_write(wal_dir, r1, bytes(REC_HDR))                 # nor did R1's own header
    rewind_checkpoint(wal_dir)    # the crash left the truncation's checkpoint, not close's
    with pytest.warns(RecoveryWarning, match=r"1 valid record\(s\) past it set aside"):  # R2
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert _records(wal) == kept + new and wal.insert_lsn == r1
        again = _append(wal, [1000], "r1-again", flush_each=True)
        assert again[0][0] == r1 and wal.insert_lsn == r2     # R2's place, and R2's prev-link
    with pmemwal.open(wal_dir, mode=mode) as wal:
        recs = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in recs] == kept + new + again
        assert r2_data not in [d for _, d, _ in recs]
        assert_chain(recs)


def test_recovery_reads_no_spare_past_the_end(wal_dir, mode):
    """A spare (recycled, or made ahead) says in its header that nothing was written to it
    since: the writer rewrites that header, synced, before it attaches the segment to
    append there, which it does only for those prepare_segments ahead of the insert
    position.  After a crash, recovery passes spares by instead of reading every page of
    them (1 GiB of spares cost half a second).  Shown with a page forged into each
    segment past the end that a read would take for this cycle's (a valid header naming
    its place): the segment next to the insert position is attached, so read, and the
    forged page wiped; the spares past it are passed by, and their forged pages stay."""
    wal, old, kept, recycled = _fill_and_recycle(wal_dir, mode, background=False,
                                                 prepare_segments=0)
    wal._ensure_segment(max(recycled) + 1)                      # and one made ahead
    end, lo = wal.insert_lsn, int.from_bytes(wal.wal_id[:4], "little")
    attached, *spares = range(end // SEG + 1, max(recycled) + 2)
    assert attached == recycled[0] and spares == [recycled[1], recycled[1] + 1]
    wal.close()
    rewind_checkpoint(wal_dir, kept[-1][0])                     # a crash: the tail is read
    forged = {}
    for segno in [attached] + spares:
        page = segno * SEG + 3 * PAGE
        header = struct.pack("<IIQI", PAGE_MAGIC, 0, page, lo)
        forged[segno] = header + struct.pack("<I", _core.crc32c(header))
        file_write(wal_dir, page, forged[segno])
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == kept and wal.insert_lsn == end
    assert file_bytes(wal_dir, attached * SEG + 3 * PAGE, PAGE_HDR) == bytes(PAGE_HDR)
    for segno in spares:
        assert file_bytes(wal_dir, segno * SEG + 3 * PAGE, PAGE_HDR) == forged[segno]


def test_recycled_segment_pages_are_not_records(wal_dir, mode):
    """Reopening right after recycling: the old pages of the recycled segments stay invisible."""
    wal, old, kept, _ = _fill_and_recycle(wal_dir, mode)
    end = wal.insert_lsn
    wal.close()
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == kept
        assert wal.insert_lsn == end
        assert wal.first_lsn == first_lsn_of_segment(2)


# ---- damage to flushed records ----------------------------------------------------------

def _make_flushed(wal_dir, mode, sizes, seed="mid"):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        return _append(wal, sizes, seed, flush_each=True)


DAMAGE = ["payload", "crc", "length_huge", "prev_link", "page_header", "segment_spanning"]


@pytest.mark.parametrize("after", ["crash", "clean_close"])
@pytest.mark.parametrize("where", DAMAGE)
def test_mid_log_damage(wal_dir, mode, where, after):
    """Damage to flushed records with valid ones after it.  ``crash``: the checkpoint a
    crash would have left (the start): open reads the damage and refuses it, or cuts it.
    ``clean_close``: the damage lies before the checkpoint of the clean close, which
    vouches for every record before it: open reads nothing there and succeeds, reading
    the record raises, open with verify="all" refuses it, and nothing is cut unasked."""
    sizes = [3000] * 30 if where != "segment_spanning" else [3000] * 400
    recs = _make_flushed(wal_dir, mode, sizes)
    end = next_lsn(recs[-1][0], len(recs[-1][1]))
    if after == "crash":
        rewind_checkpoint(wal_dir)
    k = 12
    if where == "payload":
        flip_byte(wal_dir, recs[k][0] + REC_HDR + 100)
    elif where == "crc":
        flip_byte(wal_dir, recs[k][0])
    elif where == "length_huge":
        flip_byte(wal_dir, recs[k][0] + 7)      # length's top byte: ~4 GiB, far past the WAL
    elif where == "prev_link":
        flip_byte(wal_dir, recs[k][0] + 9)
    elif where == "page_header":
        page = (recs[k][0] // PAGE) * PAGE       # the page record k starts in
        file_write(wal_dir, page + 9, b"\xAA")   # a byte of its page_lsn
        # the first record touching that page is the one that fails
        k = next(i for i, (lsn, d) in enumerate(recs)
                 if lsn_of(usable_of(lsn) + rec_size(len(d)) - 1) >= page + PAGE_HDR)
    else:  # a record running from segment 0 into segment 1: damage its part in segment 1
        k = next(i for i, (lsn, d) in enumerate(recs) if lsn < SEG <= next_lsn(lsn, len(d)))
        lsn, data = recs[k]
        last_byte = lsn_of(usable_of(lsn) + REC_HDR + len(data) - 1)
        assert last_byte // SEG == 1
        flip_byte(wal_dir, last_byte)
        assert any(l >= SEG for l, _ in recs[k + 1:])
    bad = recs[k][0]
    before = _dir_digest(wal_dir)

    def check(err):
        assert isinstance(err, pmemwal.WALError)
        assert err.lsn == bad
        assert err.segment == bad // SEG
        assert isinstance(err.reason, str) and err.reason
        assert pmemwal.format_lsn(bad) in str(err)

    # verify="all" reads every record: both ways, the damage is refused
    for verify in (("checkpoint", "all") if after == "crash" else ("all",)):
        with pytest.raises(pmemwal.CorruptionError) as info:
            pmemwal.open(wal_dir, mode=mode, verify=verify)
        check(info.value)
        assert _dir_digest(wal_dir) == before, "a refused open changed the files"

    if after == "clean_close":   # from the checkpoint: nothing to read, nothing cut
        segments = _segments_digest(wal_dir)
        with pmemwal.open(wal_dir, mode=mode) as wal:
            assert wal.insert_lsn == end and wal.recovery["scanned_bytes"] == 0
            got = []
            with pytest.raises(pmemwal.CorruptionError) as info:
                for rec in wal.records():
                    got.append((rec.lsn, bytes(rec.payload)))
            check(info.value)
            assert got == recs[:k]
            assert bytes(wal.record(recs[-1][0]).payload) == recs[-1][1]   # the rest is there
            with pytest.raises(pmemwal.CorruptionError) as info:  # damage, not a bad LSN
                wal.record(bad)
            check(info.value)
        assert _segments_digest(wal_dir) == segments, "an open that read damage changed a segment"
        assert lostfound.entries(wal_dir) == []

    # the cut, which must be asked for: verify="all" finds the damage of the clean close's WAL
    with pytest.warns(RecoveryWarning, match="set aside"):
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate",
                           verify="all" if after == "clean_close" else "checkpoint")
    with wal:
        assert _records(wal) == recs[:k]
        assert wal.insert_lsn == bad
        more = _append(wal, [10, 5000], "after-cut")
        assert more[0][0] == bad
    (entry,) = lostfound.entries(wal_dir)    # the valid records past the cut, set aside first
    kept = list(entry.records())
    # (a damaged page header leaves the records in its page intact: those are set aside too)
    assert kept and set(kept) <= set(recs[k if where == "page_header" else k + 1:])
    with pmemwal.open(wal_dir, mode=mode) as wal:   # the default again: nothing left to report
        got = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in got] == recs[:k] + more
        assert_chain(got)


@pytest.mark.parametrize("k", [0, 4])
def test_records_of_live_wal_after_damage(wal_dir, mode, k):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        recs = _append(wal, [200] * 10, "live", flush_each=True)
        flip_byte(wal_dir, recs[k][0] + REC_HDR + 3)
        with pytest.raises(pmemwal.CorruptionError) as info:
            list(wal.records())
        assert info.value.lsn == recs[k][0]
        # reading from a later record is unaffected
        assert _records_from(wal, recs[k + 1][0]) == recs[k + 1:]
        flip_byte(wal_dir, recs[k][0] + REC_HDR + 3)   # repaired: all readable again
        assert _records(wal) == recs


def _records_from(wal, start):
    return [(lsn, data) for lsn, data, _ in read_all(wal, start)]


def test_damage_in_unflushed_record_between_flushes_is_a_torn_tail(wal_dir, mode):
    """Records appended without a flush in between carry no proof of each other."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        a = _append(wal, [100] * 3, "a", flush_each=True)
        b = _append(wal, [100] * 5, "b")   # one group, flushed at close
    rewind_checkpoint(wal_dir)             # a crash, not a clean close, after the group's flush
    flip_byte(wal_dir, b[2][0] + REC_HDR)
    with pytest.warns(RecoveryWarning, match="set aside"):   # b[3:], whole, kept aside
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert _records(wal) == a + b[:2]
        assert wal.insert_lsn == b[2][0]
    assert [list(e.records()) for e in lostfound.entries(wal_dir)] == [b[3:]]


# ---- retention ---------------------------------------------------------------------

@pytest.mark.parametrize("recycle", [0, 1, 2])
def test_truncate_removes_or_recycles(wal_dir, mode, recycle):
    # no background writer: it would prepare segments ahead, which count as spares
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=recycle,
                      background=False) as wal:
        recs = []
        while wal.insert_lsn < 2 * SEG + 20 * PAGE:
            recs += _append(wal, [4000], f"r/{len(recs)}", flush_each=True)
        assert sorted(p.name for p in wal_dir.glob("*.wal")) == [seg_file(wal_dir, s).name
                                                                  for s in range(3)]
        assert wal.truncate(recs[0][0]) == 0          # nothing wholly below
        stats = wal.stats()
        assert stats["segments_recycled"] == stats["segments_removed"] == 0
        first2 = next(lsn for lsn, _ in recs if lsn >= 2 * SEG)
        assert wal.truncate(first2) == 2
        stats = wal.stats()
        assert stats["segments_recycled"] == min(recycle, 2)
        assert stats["segments_removed"] == 2 - min(recycle, 2)
        names = sorted(p.name for p in wal_dir.glob("*.wal"))
        assert names == [seg_file(wal_dir, s).name for s in range(2, 3 + min(recycle, 2))]
        assert all(p.stat().st_size == SEG for p in wal_dir.glob("*.wal"))
        kept = [(lsn, d) for lsn, d in recs if lsn >= 2 * SEG]
        assert kept[0][0] == first2
        assert wal.first_lsn == first_lsn_of_segment(2)
        assert _records(wal) == kept
        assert wal.truncate(first2) == 0               # idempotent
        end = wal.insert_lsn
    _reopen_and_continue(wal_dir, mode, kept, end)


def test_truncate_with_background_writer(wal_dir, mode):
    """The same with the background writer on: segments it prepared count as spares."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=2) as wal:
        recs = []
        while wal.insert_lsn < 2 * SEG + 20 * PAGE:
            recs += _append(wal, [4000], f"r/{len(recs)}", flush_each=True)
        first2 = next(lsn for lsn, _ in recs if lsn >= 2 * SEG)
        assert wal.truncate(first2) == 2
        stats = wal.stats()
        assert stats["segments_recycled"] + stats["segments_removed"] == 2
        segnos = sorted(int(p.name[:16], 16) for p in wal_dir.glob("*.wal"))
        assert segnos[0] == 2
        assert all(p.stat().st_size == SEG for p in wal_dir.glob("*.wal"))
        kept = [(lsn, d) for lsn, d in recs if lsn >= 2 * SEG]
        assert wal.first_lsn == first_lsn_of_segment(2)
        assert _records(wal) == kept
        end = wal.insert_lsn
    _reopen_and_continue(wal_dir, mode, kept, end)


def _reopen_and_continue(wal_dir, mode, kept, end):
    with pmemwal.open(wal_dir, mode=mode) as wal:
        got = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in got] == kept
        assert_chain(got)
        assert wal.insert_lsn == end
        more = _append(wal, [10, 20], "more")
        assert more[0][0] == end
        assert read_all(wal)[len(kept)][2] == kept[-1][0]
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == kept + more


@pytest.mark.parametrize("recycle", [0, 2])
def test_truncate_stops_at_flushed_lsn(wal_dir, mode, recycle):
    # no background writer: it would flush on its own
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=recycle,
                      background=False) as wal:
        recs = []
        while wal.insert_lsn < SEG + 10 * PAGE:
            recs += _append(wal, [6000], f"f/{len(recs)}", flush_each=True)
        flushed = wal.flushed_lsn
        while wal.insert_lsn < 2 * SEG + 10 * PAGE:       # into segment 2, not flushed
            recs += _append(wal, [6000], f"f/{len(recs)}")
        assert wal.flushed_lsn == flushed
        assert wal.truncate(1 << 62) == 1                # only segment 0: flushed is in segment 1
        assert wal.stats()["segments_recycled"] + wal.stats()["segments_removed"] == 1
        assert wal.flushed_lsn == flushed                 # truncate does not flush
        wal.flush()
        assert wal.truncate(1 << 62) == 1                # now segment 1 too; never the current one
        kept = [(lsn, d) for lsn, d in recs if lsn >= 2 * SEG]
        assert _records(wal) == kept
        end = wal.insert_lsn
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == kept
        assert wal.insert_lsn == end
        # run on through the recycled segments (if any) and reopen again
        more = []
        while wal.insert_lsn < 4 * SEG + 10 * PAGE:
            more += _append(wal, [6000], f"m/{len(more)}", flush_each=True)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        got = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in got] == kept + more
        assert_chain(got)


# ---- arbitrary damage --------------------------------------------------------------------

def _read_prefix(wal) -> tuple[list[tuple[int, bytes]], pmemwal.CorruptionError | None]:
    """The records up to the first that raises CorruptionError when read, and that error."""
    got = []
    try:
        for lsn, data, _ in ((r.lsn, bytes(r.payload), r.prev_lsn) for r in wal.records()):
            got.append((lsn, data))
    except pmemwal.CorruptionError as error:
        return got, error
    return got, None


@pytest.mark.parametrize("after", ["crash", "clean_close"])
def test_random_damage_never_crashes(shm_tmp, mode, after):
    """Garbage or zeros anywhere: a typed error or a prefix of the records, never anything else.

    With on_corruption="truncate" the WAL opens (unless a segment header was hit),
    holds exactly a prefix of what was written, takes new records, and then
    reopens with the default "raise" without complaint.  ``crash``: the checkpoint a
    crash would have left (the start), so open reads, and judges, every record.
    ``clean_close``: the clean close's checkpoint vouches for every record: open reads
    none of them, a damaged one raises CorruptionError when read (after a prefix), and
    the cut takes verify="all".
    """
    pristine = shm_tmp / "pristine"
    with pmemwal.open(pristine, mode=mode, segment_size=SEG, background=False) as wal:
        recs = []
        while wal.insert_lsn < SEG + 30 * PAGE:
            n = random.Random(len(recs)).choice([0, 8, 300, 5000, 8168, 12000])
            recs += _append(wal, [n], f"fuzz/{len(recs)}", flush_each=len(recs) % 3 == 0)
    if after == "crash":
        rewind_checkpoint(pristine)
    rng = random.Random(1234)
    outcomes = {"format": 0, "corruption": 0, "opened": 0}
    for it in range(40):
        d = shm_tmp / f"c{it}"
        shutil.copytree(pristine, d)
        (d / "LOCK").unlink(missing_ok=True)
        for _ in range(rng.choice([1, 1, 2, 3])):
            segno = rng.choice([0, 1])
            r = rng.random()
            if r < 0.1:
                off = rng.randrange(0, 64)            # the segment header
            elif r < 0.3:
                off = rng.randrange(0, SEG)           # anywhere, past the end included
            else:
                off = rng.randrange(PAGE, SEG // 4 + segno * SEG // 2)
            n = rng.choice([1, 8, 24, 100, 3000, 9000])
            data = bytes(n) if rng.random() < 0.3 else rng.randbytes(n)
            with open(seg_file(d, segno), "r+b") as f:
                f.seek(off)
                f.write(data[:SEG - off])
        try:
            with pmemwal.open(d, mode=mode) as wal:
                got, error = _read_prefix(wal)
            assert got == recs[:len(got)]
            if error is not None:
                assert after == "clean_close", "an open that read every record left damage"
                assert error.lsn == next_lsn(got[-1][0], len(got[-1][1])) if got \
                    else error.lsn == recs[0][0]
                outcomes["corruption"] += 1
        except pmemwal.FormatError:
            outcomes["format"] += 1
            shutil.rmtree(d)
            continue
        except pmemwal.CorruptionError:
            outcomes["corruption"] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)   # what was set aside
            wal = pmemwal.open(d, mode=mode, on_corruption="truncate",
                               verify="all" if after == "clean_close" else "checkpoint")
        with wal:
            got = _records(wal)
            assert got == recs[:len(got)]
            end = wal.insert_lsn
            assert end == (next_lsn(got[-1][0], len(got[-1][1])) if got
                           else first_lsn_of_segment(0))
            extra = wal.append(b"after damage")
            assert extra == end
        with pmemwal.open(d, mode=mode) as wal:
            assert _records(wal) == got + [(extra, b"after damage")]
        outcomes["opened"] += 1
        shutil.rmtree(d)
    assert outcomes["opened"] > 10, outcomes
    assert outcomes["corruption"] > 0 and outcomes["format"] > 0, outcomes


def test_truncate_leaves_segment_of_pure_continuation(wal_dir, mode):
    """After truncation the oldest segment holds only the middle of a record larger than
    a segment: reading starts at the first record that begins later (two segments on)."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, recycle_segments=0,
                      background=False) as wal:
        recs = []
        while wal.insert_lsn < SEG + SEG // 2:
            recs += _append(wal, [20000], f"s/{len(recs)}", flush_each=True)
        big_lsn, big = _append(wal, [SEG + 3 * SEG // 4], "big", flush_each=True)[0]
        assert big_lsn // SEG == 1 and next_lsn(big_lsn, len(big)) // SEG == 3
        tail = _append(wal, [100, 200, 300], "tail", flush_each=True)
        recs += [(big_lsn, big)] + tail
        assert wal.truncate(2 * SEG) == 2               # segments 0 and 1: the big record's start
        assert wal.first_lsn == first_lsn_of_segment(2)
        assert _records(wal) == tail                    # nothing begins in segment 2
        end = wal.insert_lsn
    with pmemwal.open(wal_dir, mode=mode) as wal:
        got = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in got] == tail
        assert got[0][2] == big_lsn                     # its prev-link still names the big one
        assert wal.insert_lsn == end
        more = _append(wal, [1], "more")
        assert more[0][0] == end
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == tail + more


@pytest.mark.parametrize("after", ["crash", "clean_close"])
def test_missing_middle_segment_is_reported(wal_dir, mode, after):
    """A lost segment with durable records after it is damage, not a torn tail.
    ``crash``: the checkpoint a crash would have left (the start): the chain runs into the
    gap.  ``clean_close``: the checkpoint vouches for the segment: open says it is missing
    before it reads anything, and the cut takes verify="all"."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = []
        while wal.insert_lsn < 2 * SEG + 5 * PAGE:
            recs += _append(wal, [10000], f"gap/{len(recs)}", flush_each=True)
    if after == "crash":
        rewind_checkpoint(wal_dir)
    seg_file(wal_dir, 1).unlink()
    # the first record with bytes in segment 1 is where reading stops
    k = next(i for i, (lsn, d) in enumerate(recs)
             if lsn_of(usable_of(lsn) + rec_size(len(d)) - 1) >= SEG)
    before = _dir_digest(wal_dir)
    for verify in ("checkpoint", "all"):
        with pytest.raises(pmemwal.CorruptionError) as info:
            pmemwal.open(wal_dir, mode=mode, verify=verify)
        if after == "crash":
            assert info.value.lsn == recs[k][0]
        else:   # the checkpoint's check, before any record is read: it names the segment
            assert (info.value.lsn, info.value.segment) == (first_lsn_of_segment(1), 1)
            assert "segment 0000000000000001 is missing" in str(info.value)
        assert _dir_digest(wal_dir) == before, "a refused open changed the files"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecoveryWarning)
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate",
                           verify="all" if after == "clean_close" else "checkpoint")
    assert any("set aside" in str(w.message) for w in caught)   # segment 2's records
    with wal:
        assert _records(wal) == recs[:k]
        assert wal.insert_lsn == recs[k][0]
        more = []
        while wal.insert_lsn < 2 * SEG + 10 * PAGE:    # through a new segment 1 into segment 2
            more += _append(wal, [10000], f"gap2/{len(more)}", flush_each=True)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        got = read_all(wal)
        assert [(lsn, d) for lsn, d, _ in got] == recs[:k] + more
        assert_chain(got)


def test_torn_header_claiming_a_missing_next_segment_is_a_torn_tail(wal_dir, mode):
    """A crash tore the last record's header, in the segment's last page: new prev-link
    and type, a stale length that runs into the next segment, not made yet.  Its CRC
    can't be checked, so it proves no segment was deleted: open cuts it, as any torn tail."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = []
        while wal.insert_lsn < SEG - PAGE + 100:         # into the last page of segment 0
            recs += _append(wal, [7000], f"torn-hdr/{len(recs)}", flush_each=True)
        end = wal.insert_lsn
    assert end // SEG == 0 and not seg_file(wal_dir, 1).exists()
    stale = struct.pack("<IIQII", 0xDEADBEEF, 50_000, recs[-1][0], 1, 0)
    stream_write(wal_dir, end, stale)
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == recs
        assert wal.insert_lsn == end


def test_preallocate_makes_the_segments_appends_will_reach(wal_dir, mode):
    def files():
        return sorted(p.name for p in wal_dir.glob("*.wal"))

    def reach(insert_lsn, nbytes):  # the segments that appending nbytes from there reaches
        return [seg_file(wal_dir, s).name for s in range((insert_lsn + nbytes - 1) // SEG + 1)]

    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      preallocate=5 * SEG) as wal:
        assert files() == reach(wal.insert_lsn, 5 * SEG)
        made = wal.stats()["segments_created"]
        while wal.insert_lsn < 5 * SEG:
            wal.append(bytes(3 * PAGE))
        assert wal.stats()["segments_created"] == made    # none made while appending
    existing = len(files())
    with pmemwal.open(wal_dir, mode=mode, preallocate=3 * SEG) as wal:   # from the end on
        assert files() == reach(wal.insert_lsn, 3 * SEG)
        assert wal.stats()["segments_created"] == len(files()) - existing > 0


def test_a_segment_asked_for_before_the_one_below_it_is_made_after_it(wal_dir, mode):
    """An appender whose reservation reached segment n + 2 may ask for it before the appender
    that reserved n + 1 does: the segments are still made in order, or a crash between the two
    leaves a gap that reopening takes for a deleted segment (CorruptionError)."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      prepare_segments=0) as wal:
        n = wal.insert_lsn // SEG
        wal._ensure_segment(n + 2)                       # what the native core asks for
        assert sorted(p.name for p in wal_dir.glob("*.wal")) == [
            seg_file(wal_dir, s).name for s in range(n + 3)]
        assert wal.stats()["segments_created"] == 2


@pytest.mark.parametrize("prefault", [True, False])
def test_prefault_leaves_no_unwritten_block_in_a_new_segment(wal_dir, mode, prefault):
    """Made ahead with ``prefault``, a segment has no block still unwritten (a hole to
    SEEK_HOLE: a tmpfs page not cleared yet, an ext4 unwritten extent), so no append pays
    for clearing or converting one; without it, only the header page is written."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      prefault=prefault, preallocate=2 * SEG) as wal:
        assert wal.stats()["segments_created"] >= 1 and wal.stats()["segment_make_ns"] > 0
        with open(seg_file(wal_dir, 1), "rb") as f:
            first_hole = os.lseek(f.fileno(), 0, os.SEEK_HOLE)
    assert (first_hole == SEG) == prefault


# ---- segments below the checkpoint's oldest, and what a refused open leaves ---------------

def _truncation_cut_short(wal_dir, mode):
    """A WAL whose truncation to segment 2 a crash cut short: the checkpoint names segment 2
    as the oldest, segments 0 and 1 are still there.  Returns the records from segment 2's
    first record on (what the WAL holds)."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False,
                      recycle_segments=0) as wal:
        recs = []
        while wal.insert_lsn < 3 * SEG + 5 * PAGE:
            recs += _append(wal, [10000], f"cut-short/{len(recs)}")
        wal.flush()
        left = {n: seg_file(wal_dir, n).read_bytes() for n in (0, 1)}
        assert wal.truncate(2 * SEG) == 2
    for n, data in left.items():   # (the removals the crash kept from the disk)
        seg_file(wal_dir, n).write_bytes(data)
    first = next(i for i, (lsn, _) in enumerate(recs) if lsn >= first_lsn_of_segment(2))
    return recs, first


@pytest.mark.parametrize("on_corruption", ["raise", "truncate"])
def test_verify_all_reads_from_the_checkpoints_oldest_segment(wal_dir, mode, on_corruption):
    """Damage in a segment below the checkpoint's oldest (a truncation a crash cut short
    left it): those records were truncated, so it is no damage to the WAL.  verify="all"
    reads from the checkpoint's oldest segment, cuts nothing, and the open finishes the
    truncation."""
    recs, first = _truncation_cut_short(wal_dir, mode)
    flip_byte(wal_dir, recs[3][0] + REC_HDR + 5)      # in segment 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        wal = pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption=on_corruption)
    with wal:
        assert wal.cuts == 0 and wal.recovery["set_aside"] is None
        assert _records(wal) == recs[first:]
        more = _append(wal, [500], "after")
    assert not seg_file(wal_dir, 0).exists() and not seg_file(wal_dir, 1).exists()
    assert lostfound.entries(wal_dir) == []
    with pmemwal.open(wal_dir, mode=mode, verify="all") as wal:
        assert _records(wal)[-1] == more[0]


def test_a_refused_open_leaves_every_file_as_it_was(wal_dir, mode):
    """A temp file of a segment being made, and a deleted segment: the open that refuses
    removes neither the temp file nor anything else; the one that goes on tidies it."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        while wal.insert_lsn < 2 * SEG + 5 * PAGE:
            _append(wal, [10000], "refused")
    seg_file(wal_dir, 1).unlink()
    tmp = wal_dir / (seg_file(wal_dir, 7).name + ".tmp")
    tmp.write_bytes(b"a segment being made")
    before = _dir_digest(wal_dir)
    with pytest.raises(pmemwal.CorruptionError, match="missing"):
        pmemwal.open(wal_dir, mode=mode)
    assert _dir_digest(wal_dir) == before, "a refused open changed the files"
    with pytest.warns(RecoveryWarning):
        pmemwal.open(wal_dir, mode=mode, on_corruption="truncate").close()
    assert not tmp.exists()


def test_a_checkpoint_whose_end_lies_below_its_oldest_segment_is_read_from_that_segment(
        wal_dir, mode):
    """A checkpoint naming an end in segment 0 and segment 2 as the oldest (an earlier
    version's cut wrote such): the end is below the WAL, so every record is read from
    segment 2, and damage in segment 0 is none of the WAL's."""
    recs, first = _truncation_cut_short(wal_dir, mode)
    header = SegmentHeader.unpack(seg_file(wal_dir, 2).read_bytes()[:HEADER_SIZE], "segment 2")
    CheckpointFile(str(wal_dir), header.wal_id, SEG).write(recs[2][0], recs[1][0], 2)
    flip_byte(wal_dir, recs[5][0] + REC_HDR + 5)      # in segment 0, past that end
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert _records(wal) == recs[first:] and wal.cuts == 0
