"""Salvage: what a cut keeps, and what it sets aside in lost+found.

- the header of the page that holds the checkpoint's end is checked on open: damage there is
  damage to records the checkpoint covers;
- a cut copies every non-zero page it is about to zero into lost+found, whether or not a record
  in it still validates;
- the set-aside starts at the first record after the damage that validates (each record's own
  CRC), not at the next page whose header is whole: a damaged page header loses no record;
- a crash inside ``lostfound.remove`` (a put-back's last step) or while recovery zeroes the cut
  range (children killed with SIGKILL at each step) leaves no record to be appended twice;
- damage past the checkpoint raises only when a record reserved after the damaged one was
  flushed follows it (docs/RELIABILITY.md, promise 3);
- a pending entry is reused only by the same cut (the same records by CRC, no byte it lacks),
  and a cut resolves the pending entries at or past it: none stays pending, no record is held
  by two entries;
- a record image inside a damaged record's payload is neither set aside nor taken for proof
  of a flush; the position scan, on random damage, finds only records that were written.

Damage is done with ordinary file writes at offsets computed from the format.
"""

from __future__ import annotations

import json
import struct
import os
import random
import shutil
import signal
import subprocess
import sys
import warnings

import pytest
from click.testing import CliRunner

import pmemwal
from pmemwal import _core, lostfound, putback
from pmemwal.format import first_lsn
from pmemwal.recovery import RecoveryWarning
from pmemwal.tools.cli import main as cli
from conftest import (PAGE, PAGE_HDR, REC_HDR, SEG, child_env, file_bytes, file_write, flip_byte,
                      payload, read_all, rewind_checkpoint, usable_of)


def _append(wal, sizes, seed, *, flush_each=False):
    out = []
    for i, n in enumerate(sizes):
        data = payload(f"{seed}/{i}", n)
        out.append((wal.append(data, flush=flush_each), data))
    return out


def _records(wal_dir, mode, **options):
    with pmemwal.open(wal_dir, mode=mode, **options) as wal:
        return [(lsn, data) for lsn, data, _ in read_all(wal)]


def _aside(wal_dir):
    return [rec for e in lostfound.entries(wal_dir) for rec in e.records()]


def _page_of(lsn):
    return lsn - lsn % PAGE


# ---- the page that holds the checkpoint's end ----------------------------------------

def test_a_damaged_header_of_the_checkpoints_end_page_is_damage(wal_dir, mode):
    """Recovery starts mid-page at the checkpoint's end: that page's header, written by an
    earlier record, must be checked there, or records appended after it are unreadable."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG) as wal:
        recs = _append(wal, [300] * 60, "end-page")
        end = wal.insert_lsn
    page = _page_of(end)
    assert end % PAGE > PAGE_HDR and _page_of(recs[0][0]) < page   # the end lies mid-page
    covered = [r for r in recs if _page_of(r[0] + REC_HDR + len(r[1]) - 1) >= page]
    assert len(covered) >= 2
    file_write(wal_dir, page + 4, random.Random(2).randbytes(8))      # rem_len and page_lsn

    with pytest.raises(pmemwal.CorruptionError) as info:
        pmemwal.open(wal_dir, mode=mode)
    assert info.value.lsn <= covered[0][0]

    with pytest.warns(RecoveryWarning, match="set aside"):
        wal = pmemwal.open(wal_dir, mode=mode, on_corruption="truncate")
    with wal:
        kept = [(lsn, data) for lsn, data, _ in read_all(wal)]
        more = _append(wal, [10, 9000], "after", flush_each=True)
    assert kept == recs[:len(kept)] and len(kept) < len(recs)
    assert sorted(kept + _aside(wal_dir)) == sorted(recs), "a covered record was lost"
    assert _records(wal_dir, mode, verify="all") == kept + more


def test_a_cut_copies_every_page_it_zeroes(wal_dir, mode):
    """No record past the cut validates any more: the pages are copied aside all the same."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = _append(wal, [2000] * 20, "copied", flush_each=True)
    k = 8
    for lsn, data in recs[k:]:                    # each record's payload garbled
        flip_byte(wal_dir, lsn + REC_HDR + len(data) // 2)
    zeroed = sorted({_page_of(lsn) for lsn, _ in recs[k:]})
    before = {p: file_bytes(wal_dir, p, PAGE) for p in zeroed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate").close()
    (entry,) = lostfound.entries(wal_dir)
    assert entry.manifest["records"] == []
    for p, data in before.items():
        with open(os.path.join(entry.path, f"{p // SEG:016X}.wal"), "rb") as f:
            f.seek(p % SEG)
            assert f.read(PAGE) == data, f"page {p} was zeroed without a copy"


# ---- every intact record kept or set aside ---------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_damaged_page_header_loses_no_intact_record(wal_dir, seed):
    """8 random bytes over a page header in the middle of a segment of a closed WAL of
    3,000 records, then the documented repair: every record is either kept or in lost+found,
    and none in both."""
    rng = random.Random(seed)
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG) as wal:
        recs = _append(wal, [rng.randrange(0, 700) for _ in range(3000)], f"salvage{seed}")
    assert recs[-1][0] > SEG                     # the damage lies well inside segment 0
    page = rng.randrange(40, 100) * PAGE
    file_write(wal_dir, page + rng.randrange(0, 17), rng.randbytes(8))

    with pytest.warns(RecoveryWarning) as caught:
        wal = pmemwal.open(wal_dir, mode="buffered", verify="all", on_corruption="truncate")
    with wal:
        kept = [(lsn, data) for lsn, data, _ in read_all(wal)]
        cut = wal.insert_lsn
    aside = _aside(wal_dir)
    assert kept == recs[:len(kept)]
    assert sorted(kept + aside) == sorted(recs), "an intact record was neither kept nor set aside"
    message = " ".join(str(w.message) for w in caught)
    assert pmemwal.format_lsn(cut) in message and f"{len(aside)} valid record" in message


def test_the_warning_names_the_range_that_held_no_valid_record(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = _append(wal, [100] * 30, "range", flush_each=True)
    for lsn, data in recs[10:13]:               # three records garbled, the rest intact
        flip_byte(wal_dir, lsn + REC_HDR + 7)
    with pytest.warns(RecoveryWarning) as caught:
        pmemwal.open(wal_dir, mode=mode, verify="all", on_corruption="truncate").close()
    assert _aside(wal_dir) == recs[13:]
    lost = f"{pmemwal.format_lsn(recs[10][0])}..{pmemwal.format_lsn(recs[13][0])}"
    assert any(lost in str(w.message) for w in caught), [str(w.message) for w in caught]


# ---- crashes inside lost+found's own steps ----------------------------------------

# A child that runs one lost+found step and SIGKILLs itself at the n-th call of the file
# operations named, made from inside that step: a real crash at a chosen point.
_KILLER = r"""
import functools, json, os, signal, sys, warnings
import pmemwal
from pmemwal import _core, lostfound, putback
from pmemwal.format import first_lsn
spec = json.loads(sys.argv[1])
calls = [0]

def killing(fn, only):
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        if only is None or only(args):
            calls[0] += 1
            if calls[0] == spec["n"]:
                os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kw)
    return wrapper

def segment_fd(args):
    path = os.readlink(f"/proc/self/fd/{args[0]}")
    return path.endswith(".wal") and "lost+found" not in path

def checkpoint_fd(args):
    return os.readlink(f"/proc/self/fd/{args[0]}").endswith("CHECKPOINT")

def armed(step, names, only=None):
    saved = {name: getattr(os, name) for name in names}
    for name in names:
        setattr(os, name, killing(saved[name], only))
    try:
        return step()
    finally:
        for name, fn in saved.items():
            setattr(os, name, fn)

warnings.simplefilter("ignore")
if spec["step"] == "remove":
    remove = lostfound.remove
    lostfound.remove = lambda *a: armed(lambda: remove(*a), ("unlink", "rename", "rmdir"))
    putback.restore(spec["wal"], spec["name"])
elif spec["step"] == "finish":
    finish = lostfound.finish
    lostfound.finish = lambda *a: armed(lambda: finish(*a), ("write", "rename", "unlink", "rmdir"))
    pmemwal.open(spec["wal"], on_corruption="truncate", **spec["options"]).close()
else:
    only = segment_fd if spec["step"] == "recover" else checkpoint_fd
    armed(lambda: pmemwal.open(spec["wal"], on_corruption="truncate", **spec["options"]).close(),
          ("pwrite", "fdatasync"), only)
print("done")
"""


def _killed_at(step, wal_dir, n, options=None, **spec):
    """Run ``step`` in a child killed at its n-th file operation; whether it was."""
    spec.update(step=step, wal=str(wal_dir), n=n, options=options or {})
    proc = subprocess.run([sys.executable, "-c", _KILLER, json.dumps(spec)],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    if proc.returncode == -signal.SIGKILL:
        return True
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    return False


def _damaged_wal(path, n=120, k=30):
    """A closed WAL of n flushed records whose record k is garbled after a crash-like end:
    opening it with on_corruption="truncate" keeps records[:k] and sets aside records[k+1:]."""
    with pmemwal.open(path, mode="buffered", segment_size=SEG, background=False) as wal:
        recs = _append(wal, [700] * n, "crash", flush_each=True)
    rewind_checkpoint(path)
    flip_byte(path, recs[k][0] + REC_HDR + 5)
    return recs, k


def test_a_crash_inside_remove_never_makes_a_put_back_append_twice(shm_tmp):
    template = shm_tmp / "template"
    recs, k = _damaged_wal(template)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        pmemwal.open(template, on_corruption="truncate").close()
    (entry,) = lostfound.entries(template)
    want = [data for _, data in recs[:k] + recs[k + 1:]]
    n = 0
    while True:
        n += 1
        wal_dir = shm_tmp / f"try{n}"
        shutil.copytree(template, wal_dir)
        killed = _killed_at("remove", wal_dir, n, name=entry.name)
        for left in lostfound.entries(wal_dir):     # the put-back again, as a user would
            putback.restore(wal_dir, left.name)
        assert lostfound.entries(wal_dir) == []
        with pmemwal.open(wal_dir) as wal:
            got = [data for _, data, _ in read_all(wal)]
        assert got == want, f"killed at step {n} of the removal: {len(got)} records, " \
                            f"{len(want)} written"
        shutil.rmtree(wal_dir)
        if not killed:
            break
    assert n > 3


def test_a_crash_while_recovery_zeroes_leaves_one_entry(shm_tmp):
    template = shm_tmp / "template"
    recs, k = _damaged_wal(template)
    n = 0
    while True:
        n += 1
        wal_dir = shm_tmp / f"try{n}"
        shutil.copytree(template, wal_dir)
        killed = _killed_at("recover", wal_dir, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)
            with pmemwal.open(wal_dir, on_corruption="truncate") as wal:
                kept = [data for _, data, _ in read_all(wal)]
        entries = lostfound.entries(wal_dir)
        assert len(entries) == 1, f"killed at write {n} of the cut: {len(entries)} entries"
        assert kept + [data for _, data in entries[0].records()] == \
            [data for _, data in recs[:k] + recs[k + 1:]]
        shutil.rmtree(wal_dir)
        if not killed:
            break
    assert n > 3


def test_a_cut_stopped_before_its_checkpoint_then_passed_over_loses_nothing_later(wal_dir):
    """A verify="all" cut below the checkpoint, killed after its set-aside and before it wrote
    the checkpoint: a default open then reads from the old checkpoint, does not cut, and
    appends.  A later verify="all" cut at the same place must set the new records aside too,
    not take the pending entry for its own."""
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        recs = _append(wal, [700] * 60, "first", flush_each=True)
    flip_byte(wal_dir, recs[20][0] + REC_HDR + 5)          # before the clean close's checkpoint
    assert _killed_at("cut-checkpoint", wal_dir, 1, options={"verify": "all"})
    (pending,) = lostfound.entries(wal_dir)
    assert pending.pending
    listed = CliRunner().invoke(cli, ["lost-found", str(wal_dir)])
    assert listed.exit_code == 0 and "pending" in listed.output, listed.output
    with pytest.raises(pmemwal.ConfigError, match="pending"):   # its records are in the WAL
        putback.restore(wal_dir, pending.name)
    with pmemwal.open(wal_dir, mode="buffered") as wal:    # the damage is not read: no cut
        recs += _append(wal, [700] * 10, "second", flush_each=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        kept = _records(wal_dir, "buffered", verify="all", on_corruption="truncate")
    assert kept == recs[:20]
    assert _aside(wal_dir) == recs[21:], "records appended after the stopped cut were lost"


# ---- what makes open() raise past the checkpoint --------------------------------

@pytest.mark.parametrize("later", [False, True])
def test_damage_past_the_checkpoint_raises_only_before_a_record_reserved_after_its_flush(
        wal_dir, mode, later):
    """docs/RELIABILITY.md: 1,099 records acknowledged by one flush, then a crash, then record
    700 garbled.  The records flushed with it prove nothing (a torn tail looks the same): the
    default open cuts there, with a warning, and sets the valid records past it aside.  A
    record reserved after that flush (its durable hint passes the damage) makes it raise."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = _append(wal, [200] * 1099, "once")
        wal.flush()
        if later:
            recs += _append(wal, [50], "later", flush_each=True)
    rewind_checkpoint(wal_dir)                   # a crash: no checkpoint covers them
    flip_byte(wal_dir, recs[700][0] + REC_HDR + 3)
    if later:
        with pytest.raises(pmemwal.CorruptionError) as info:
            pmemwal.open(wal_dir, mode=mode)
        assert info.value.lsn == recs[700][0]
        return
    with pytest.warns(RecoveryWarning, match="set aside"):
        wal = pmemwal.open(wal_dir, mode=mode)
    with wal:
        assert [(lsn, d) for lsn, d, _ in read_all(wal)] == recs[:700]
    assert _aside(wal_dir) == recs[701:]


# ---- a pending entry: reused only for the same cut, never stuck --------------------

def _held(wal_dir):
    """Every record lost+found holds, one item per entry that holds it."""
    return [data for e in lostfound.entries(wal_dir) for _, data in e.records()]


def test_a_pending_entry_is_not_reused_for_a_later_cut_of_other_records(wal_dir):
    """A cut stopped after its set-aside (records 31-59 pending), then an ordinary cut lower
    (at record 10), then 50 records appended over the same LSNs and the same place damaged
    again: the pending entry must not be taken for the last cut (its records are old ones,
    and the new ones past the damage would be zeroed with no copy), and no record may be
    held by two entries (a put-back of both would append it twice)."""
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        old = _append(wal, [700] * 60, "old", flush_each=True)
    flip_byte(wal_dir, old[30][0] + REC_HDR + 5)
    assert _killed_at("cut-checkpoint", wal_dir, 1, options={"verify": "all"})
    assert [e.pending for e in lostfound.entries(wal_dir)] == [True]
    flip_byte(wal_dir, old[10][0] + REC_HDR + 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        assert _records(wal_dir, "buffered", verify="all",
                        on_corruption="truncate") == old[:10]
    assert not any(e.pending for e in lostfound.entries(wal_dir)), "an entry left pending"
    with pmemwal.open(wal_dir, mode="buffered", background=False) as wal:
        new = _append(wal, [700] * 50, "new", flush_each=True)
    assert new[20][0] == old[30][0]
    flip_byte(wal_dir, new[20][0] + REC_HDR + 5)          # the same place fails again
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        kept = [d for _, d in _records(wal_dir, "buffered", verify="all",
                                       on_corruption="truncate")]
    held = _held(wal_dir)
    assert not any(e.pending for e in lostfound.entries(wal_dir))
    assert [d for d in held if held.count(d) > 1] == [], "a record held by two entries"
    assert sorted(kept + held) == sorted(
        d for _, d in old[:10] + old[11:30] + old[31:] + new[:20] + new[21:])


def test_a_pending_entry_of_no_record_is_not_reused_for_new_pages(wal_dir):
    """A cut of durable records of which none validates, stopped after its set-aside (an
    entry of pages, no record), then passed over by a default open that appends more: a later
    cut at the same place that again finds no valid record must copy the new pages too."""
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        recs = _append(wal, [2000] * 20, "first", flush_each=True)
    for lsn, data in recs[8:]:
        flip_byte(wal_dir, lsn + REC_HDR + len(data) // 2)
    assert _killed_at("cut-checkpoint", wal_dir, 1, options={"verify": "all"})
    with pmemwal.open(wal_dir, mode="buffered", background=False) as wal:
        more = _append(wal, [2000] * 10, "second", flush_each=True)
    for lsn, data in more:
        flip_byte(wal_dir, lsn + REC_HDR + len(data) // 2)
    zeroed = sorted({_page_of(lsn) for lsn, _ in more})
    before = {p: file_bytes(wal_dir, p, PAGE) for p in zeroed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        pmemwal.open(wal_dir, mode="buffered", verify="all", on_corruption="truncate").close()
    copies = {}
    for entry in lostfound.entries(wal_dir):
        assert not entry.pending
        for p in zeroed:
            name = os.path.join(entry.path, f"{p // SEG:016X}.wal")
            if os.path.exists(name):
                with open(name, "rb") as f:
                    f.seek(p % SEG)
                    copies.setdefault(p, []).append(f.read(PAGE))
    for p, data in before.items():
        assert data in copies.get(p, []), f"page {p} was zeroed without a copy"


# ---- record images inside a damaged record's payload -------------------------------

def _image(prev, body, gap=0):
    """A record's bytes as the writer lays them out (CRC over header bytes 4..23 and the
    payload), to be carried inside another record's payload."""
    tail = struct.pack("<IQII", len(body), prev, 1, gap)
    return struct.pack("<I", _core.crc32c(tail + body)) + tail + body


def _carrier(wal, at_offset, image, n=20000):
    """A record of n bytes whose payload holds ``image`` at ``at_offset`` stream bytes past
    its header (the offset kept clear of page headers by the caller)."""
    big = bytearray(b"z" * n)
    big[at_offset:at_offset + len(image)] = image
    return wal.append(bytes(big), flush=True)


def test_a_record_image_inside_a_damaged_record_is_not_set_aside(wal_dir):
    """An application payload that carries a valid-looking record image: once the record
    carrying it is damaged, the image is no record of the WAL (it lies inside the damaged
    record's extent, which the next record confirms) and must not be set aside."""
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        before = _append(wal, [100] * 5, "a", flush_each=True)
        r = wal.insert_lsn
        step = PAGE - PAGE_HDR
        target = (usable_of(r) // step + 1) * step + 800     # in the next page
        big = _carrier(wal, target - usable_of(r) - REC_HDR, _image(r, b"not-a-record-of-this-wal"))
        after = _append(wal, [100] * 5, "b", flush_each=True)
    assert big == r
    flip_byte(wal_dir, r + REC_HDR + 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        assert _records(wal_dir, "buffered", verify="all", on_corruption="truncate") == before
    assert _aside(wal_dir) == after


def test_a_record_image_in_the_cut_page_proves_no_flush(wal_dir):
    """A torn last record whose payload carries, in its own page, an image whose durable hint
    passes it: no record was written after the damaged one, so the open cuts a torn tail
    instead of refusing (the image lies inside the damaged record's extent, and does not link
    to the damaged record itself)."""
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        before = _append(wal, [100] * 5, "a", flush_each=True)
        r = wal.insert_lsn
        assert PAGE - r % PAGE > 3000                         # room for the image in r's page
        _carrier(wal, 1000, _image(r + 8, b"x" * 40), n=4000)
    rewind_checkpoint(wal_dir)
    flip_byte(wal_dir, r + REC_HDR + 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        assert _records(wal_dir, "buffered") == before
    assert _aside(wal_dir) == []


def test_a_damaged_length_loses_no_record_it_claims_to_cover(wal_dir, mode):
    """The damage is to a record's length (claiming 256 bytes more, its header otherwise
    plausible): the records inside the extent it claims are genuine, and are set aside."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = _append(wal, [100] * 30, "length")          # one flush: a torn tail
    rewind_checkpoint(wal_dir)
    file_write(wal_dir, recs[10][0] + 4, struct.pack("<I", 100 + 256))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        assert _records(wal_dir, mode) == recs[:10]
    assert _aside(wal_dir) == recs[11:]


# ---- the position scan on arbitrary damage ---------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_the_position_scan_finds_only_records_written(shm_tmp, seed):
    """Random damage (bytes, page headers, runs, huge lengths) over a WAL of 2,500 records of
    random sizes, then the scan from a random cut over every later page: each record found is
    one that was written, and reads back."""
    rng = random.Random(seed)
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False) as wal:
        written = {payload(f"f/{i}", rng.randrange(0, 3000)) for i in range(2500)}
        for data in sorted(written):
            wal.append(data)
        wal_id = bytes(wal.wal_id)
    segnos = sorted(int(n[:16], 16) for n in os.listdir(wal_dir) if n.endswith(".wal"))
    orig = {s: (wal_dir / f"{s:016X}.wal").read_bytes() for s in segnos}
    wal_id_lo = int.from_bytes(wal_id[:4], "little")
    for _ in range(6):
        bufs = {s: bytearray(b) for s, b in orig.items()}
        for _ in range(rng.randrange(1, 6)):
            b = bufs[rng.choice(segnos)]
            off = rng.randrange(PAGE, SEG - 64)
            kind = rng.randrange(4)
            if kind == 0:
                b[off:off + 8] = rng.randbytes(8)
            elif kind == 1:
                b[off - off % PAGE:off - off % PAGE + 24] = rng.randbytes(24)
            elif kind == 2:
                k = min(rng.randrange(1, 20000), SEG - off)
                b[off:off + k] = rng.randbytes(k)
            else:
                off -= off % 8
                b[off + 4:off + 8] = struct.pack("<I", rng.choice(
                    [0xFFFFFFFF, 0x7FFFFFFF, SEG, rng.randrange(1 << 32)]))
        x = first_lsn(segnos[0], SEG) + 8 * rng.randrange(0, 1000)
        pages = [s * SEG + p * PAGE for s in segnos for p in range(1, SEG // PAGE)
                 if s * SEG + p * PAGE > x]
        found = lostfound.records_past(x, pages, 0, first_lsn(segnos[0], SEG), bufs.get, SEG,
                                       wal_id_lo)
        reader = _core.Reader(SEG, wal_id_lo, bufs.get, salvage=True)
        for f in found:
            assert reader.read(f.lsn, -1)[0] == 0
            assert reader.payload(f.lsn) in written, f"not a record written: {f}"


def test_a_cut_below_a_stopped_cut_leaves_each_record_in_one_entry(shm_tmp):
    """A cut at record 30 killed while it zeroes (some of its pages zeroed already: their
    records are in its pending entry alone), then damage lower and a cut there: the pending
    entry is finished with just the records the new entry lacks, and every record past the
    new cut is in exactly one entry."""
    template = shm_tmp / "template"
    recs, k = _damaged_wal(template)
    for n in (2, 4, 6):
        wal_dir = shm_tmp / f"try{n}"
        shutil.copytree(template, wal_dir)
        assert _killed_at("recover", wal_dir, n)
        (pending,) = lostfound.entries(wal_dir)
        assert pending.pending
        flip_byte(wal_dir, recs[10][0] + REC_HDR + 5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)
            kept = [d for _, d in _records(wal_dir, "buffered", verify="all",
                                           on_corruption="truncate")]
        held = _held(wal_dir)
        assert not any(e.pending for e in lostfound.entries(wal_dir))
        assert [d for d in held if held.count(d) > 1] == [], f"killed at write {n}"
        assert sorted(kept + held) == sorted(d for _, d in recs[:10] + recs[11:k] + recs[k + 1:])
        shutil.rmtree(wal_dir)


def test_a_crash_while_a_cut_resolves_pending_entries_loses_nothing(shm_tmp):
    """The cut below a stopped one (above) killed at each file operation of its finish (the
    pending entry trimmed, removed, finished): the next open, which finds the same cut, ends
    with no entry pending and every record past the cut in exactly one entry."""
    template = shm_tmp / "template"
    recs, k = _damaged_wal(template)
    assert _killed_at("recover", template, 4)
    flip_byte(template, recs[10][0] + REC_HDR + 5)
    want = sorted(d for _, d in recs[:10] + recs[11:k] + recs[k + 1:])
    n = 0
    while True:
        n += 1
        wal_dir = shm_tmp / f"try{n}"
        shutil.copytree(template, wal_dir)
        killed = _killed_at("finish", wal_dir, n, options={"verify": "all"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)
            kept = [d for _, d in _records(wal_dir, "buffered", verify="all",
                                           on_corruption="truncate")]
        held = _held(wal_dir)
        assert not any(e.pending for e in lostfound.entries(wal_dir)), f"killed at step {n}"
        assert [d for d in held if held.count(d) > 1] == [], f"killed at step {n}"
        assert sorted(kept + held) == want, f"killed at step {n}"
        shutil.rmtree(wal_dir)
        if not killed:
            break
    assert n > 3
