"""A review of three commits: a file not the WAL's ignored by open, a segment missing past a
sound end a note in verify, and ``pmemwal repair``.

Each test failed on the code it reviewed; the docstring says what went wrong (one, marked
xfail, is a known gap left open).  Real files
and real processes throughout: a crash is a child killed with SIGKILL, or the checkpoint a
crash would have left (conftest.rewind_checkpoint); damage is an ordinary file write.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import pmemwal
from pmemwal import lostfound
from pmemwal.checkpoint import CheckpointFile
from pmemwal.format import SegmentHeader, HEADER_SIZE
from pmemwal.recovery import RecoveryWarning
from pmemwal.tools import repair as repairing
from pmemwal.tools.cli import main
from pmemwal.tools.inspect import verify
from conftest import (PAGE, REC_HDR, SEG, child_env, first_lsn_of_segment, flip_byte,
                      payloads_recovered, rewind_checkpoint, seg_file)
from test_checkpoint import _ending_at_a_segment_boundary


def _cli(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


# ---- 5b821f3: files that are not the WAL's -------------------------------------------

def test_a_file_not_the_wals_does_not_refuse_a_truncation_cut_short_at_a_segment_boundary(
        wal_dir):
    """MEDIUM.  A file the WAL now opens beside (``notes.txt``), then a truncation to the first
    byte of a segment not made yet, and a crash after segment 0 was removed: the directory
    holds CHECKPOINT (which vouches for no segment) and no segment file.  Without the file,
    open goes on at the same LSN (Opening._checkpoint_without_segments); with it,
    WalDirectory.__init__ -> list_segments (segments.py:269) refuses before that check:
    FormatError "not a WAL directory"."""
    wal_id, end, last = _ending_at_a_segment_boundary(wal_dir, "buffered")
    (wal_dir / "notes.txt").write_text("kept beside the WAL")
    CheckpointFile(str(wal_dir), wal_id, SEG).write(end, last, 1)  # the truncation's checkpoint
    os.unlink(seg_file(wal_dir, 0))                                 # then the crash
    with pmemwal.open(wal_dir, mode="buffered") as wal:
        assert wal.position() == (end, last)


@pytest.mark.xfail(strict=True, reason="known gap, left: verify and readonly need the WAL's "
                   "identity from a segment header, and this state has no segment file")
def test_verify_reads_a_truncation_cut_short_at_a_segment_boundary_as_open_does(wal_dir):
    """LOW, before these commits (verify vs open, asked of 5b821f3).  The same crash state
    with no other file: open goes on at the same LSN, but ``verify`` raises FormatError
    "holds no segment files: not a pmemwal WAL" (checks.py:96) and ``open(readonly=True)``
    NotFoundError (readonly.identity)."""
    wal_id, end, last = _ending_at_a_segment_boundary(wal_dir, "buffered")
    CheckpointFile(str(wal_dir), wal_id, SEG).write(end, last, 1)
    os.unlink(seg_file(wal_dir, 0))
    assert verify(wal_dir).ok


def test_a_file_not_the_wals_does_not_hide_that_the_segments_were_deleted(wal_dir):
    """LOW.  Every segment deleted, CHECKPOINT and lost+found left, and a file the WAL opened
    beside: open says "not a WAL directory" (FormatError, segments.py:269) where without the
    file it says the segments were deleted, with their records (CorruptionError naming what
    is left, Opening._refuse_without_segments)."""
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        for i in range(100):
            wal.append(b"%d" % i * 100)
    (wal_dir / "notes.txt").write_text("kept beside the WAL")
    for name in os.listdir(wal_dir):
        if name.endswith(".wal"):
            os.unlink(wal_dir / name)
    with pytest.raises(pmemwal.CorruptionError, match="CHECKPOINT.*deleted"):
        pmemwal.open(wal_dir)


# ---- 0273690: a segment missing past the end ------------------------------------------

def _acknowledged_in_a_deleted_segment(wal_dir: Path) -> tuple[list[int], list[int], int]:
    """Records of segments 0 and 1 acknowledged by one flush, then 5 more in segment 1 each
    acknowledged by its own flush (their durable hints pass every record before them);
    segment 2 made ahead (preallocate) and empty.  Then a crash (no checkpoint covers them),
    a record of segment 0 damaged, and segment 1 deleted.  Returns (the first flush's LSNs,
    the later ones', the damaged LSN)."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, preallocate=4 * SEG) as wal:
        once = [wal.append(b"a%05d" % i * 50) for i in range(6000)]
        wal.flush()
        later = [wal.append(b"b%05d" % i * 50, flush=True) for i in range(5)]
    assert once[-1] // SEG == 1 and later[-1] // SEG == 1 and seg_file(wal_dir, 2).exists()
    rewind_checkpoint(wal_dir)
    damaged = next(lsn for lsn in once if lsn > SEG // 2)
    flip_byte(wal_dir, damaged + REC_HDR + 5)
    with pytest.raises(pmemwal.CorruptionError, match="written after this one was flushed"):
        pmemwal.open(wal_dir)           # (segment 1 still there: its records prove the flush)
    os.unlink(seg_file(wal_dir, 1))
    return once, later, damaged


def test_verify_fails_when_a_segment_missing_past_a_torn_end_held_acknowledged_records(wal_dir):
    """HIGH (lies about soundness).  Segment 1 held ~2,800 acknowledged records, among them the
    5 whose durable hints proved the damage in segment 0 was damage.  With it deleted the
    chain ends "torn" in segment 0, and _spares_missing (verifying.py:128) turns "segment 1
    missing between 0 and 2" into a note ("nothing durable was there (a spare segment
    deleted)"): ``verify`` says OK.  Before 0273690 it failed.  A torn end whose tail runs
    to the last page of the segment before the gap says the stream went on into it."""
    _acknowledged_in_a_deleted_segment(wal_dir)
    report = verify(wal_dir)
    assert not report.ok, report.lines()


def test_open_refuses_when_a_segment_missing_past_a_torn_end_held_acknowledged_records(wal_dir):
    """HIGH, in recovery.py (before these commits; the behaviour 0273690 made verify agree
    with).  The same WAL: the default open (on_corruption='raise') cuts at the damage in
    segment 0 with a RecoveryWarning that names 0/80048..0/80190 as lost, not segment 1: the
    acknowledged records of segment 1 are gone, and nothing refused.  _check_deleted
    (recovery.py:299) asks only whether the chain ran into the missing segment; beyond()
    skips missing segments (wal_reader.c, wal_beyond)."""
    _acknowledged_in_a_deleted_segment(wal_dir)
    with pytest.raises(pmemwal.CorruptionError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)
            pmemwal.open(wal_dir).close()


# ---- a973f6a: pmemwal repair ------------------------------------------------------------

def _closed_wal(wal_dir: Path, n: int, **options) -> list[int]:
    with pmemwal.open(wal_dir, segment_size=SEG, **options) as wal:
        return [wal.append(b"r%05d" % i * 60) for i in range(n)]


def test_the_plan_lists_a_damaged_last_record_as_lost(wal_dir):
    """MEDIUM.  A closed WAL whose last record is damaged: the repair loses it (durable: the
    clean close's checkpoint ends past it), but the plan's ``lost`` is computed only between
    the cut and the records set aside (repair.py:104, _gaps at 108), and there are none: the plan
    shows "keep N-1, cut at X" and no "lose" line."""
    lsns = _closed_wal(wal_dir, 500)
    flip_byte(wal_dir, lsns[-1] + REC_HDR + 5)
    plan = repairing.plan(wal_dir)
    assert plan.needed and plan.cut_lsn == lsns[-1]
    assert plan.lost and plan.lost[0][0] == lsns[-1], plan.lines()
    assert any(line.strip().startswith("lose") for line in plan.lines())


def test_the_plan_lists_the_records_of_a_deleted_last_segment_as_lost(wal_dir):
    """MEDIUM.  The segment holding the WAL's last records deleted (the checkpoint vouches for
    it): the repair cuts at the end of the segment before, losing every record that was in
    it, and the plan says "keep, cut at X", with no "lose" line."""
    lsns = _closed_wal(wal_dir, 40_000, background=False)
    last = lsns[-1] // SEG
    assert last >= 2
    os.unlink(seg_file(wal_dir, last))
    plan = repairing.plan(wal_dir)
    assert plan.needed and not plan.blockers and plan.cut_lsn < last * SEG
    assert plan.lost and plan.lost[-1][1] > lsns[-1], plan.lines()


def test_the_plan_of_a_deleted_oldest_segment_says_what_is_lost(wal_dir):
    """MEDIUM.  Segment 0 deleted (the checkpoint vouches for it): the repair's open lets the
    WAL begin in segment 1 (its records are lost, counted as a cut), while the plan says
    "cut the WAL at <its end>" (which cuts nothing) and lists nothing lost."""
    lsns = _closed_wal(wal_dir, 20_000, background=False)
    os.unlink(seg_file(wal_dir, 0))
    plan = repairing.plan(wal_dir)
    assert plan.needed and not plan.blockers
    kept_from = first_lsn_of_segment(1)
    assert plan.kept == sum(1 for lsn in lsns if lsn >= kept_from)
    assert any(lo < SEG for lo, _ in plan.lost), plan.lines()


_KILLED_BEFORE_THE_ZEROING = r"""
import os, signal, sys, warnings
import pmemwal
from pmemwal.recovery import Recovery
warnings.simplefilter("ignore")
Recovery._wipe_beyond = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
pmemwal.open(sys.argv[1], on_corruption="truncate", verify="all")
"""


def _pending_entry(wal_dir: Path, killed_open: str) -> lostfound.SetAside:
    """120 records acknowledged, the 31st garbled, then ``killed_open`` (a repair's open
    killed part-way): the lost+found entry it left, pending."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False) as wal:
        lsns = [wal.append(b"r%04d" % i * 100, flush=True) for i in range(120)]
    flip_byte(wal_dir, lsns[30] + REC_HDR + 5)
    killed = subprocess.run([sys.executable, "-c", killed_open, str(wal_dir)], env=child_env())
    assert killed.returncode == -9
    (entry,) = lostfound.entries(str(wal_dir))
    assert entry.pending
    return entry


def test_a_repair_that_finishes_a_pending_entry_prints_how_to_put_it_back(wal_dir):
    """MEDIUM.  A repair's open killed after its set-aside (a pending entry), then
    ``pmemwal repair`` again, as the pending message says: recovery finishes the pending
    entry instead of making one (the same cut), and RepairResult lists only entries not
    there before (repair.py:158): no "set aside in lost+found" line, no put-back command,
    though the plan said 89 records go there."""
    _pending_entry(wal_dir, _KILLED_BEFORE_THE_ZEROING)
    done = _cli("repair", str(wal_dir), "--yes")
    assert done.exit_code == 0 and "set aside  89 valid records" in done.output
    assert "to append them again: pmemwal lost-found" in done.output, done.output


_WRITER_AFTER_THE_PLAN = r"""
import sys
import pmemwal
with pmemwal.open(sys.argv[1]) as wal:
    for i in range(10):
        wal.append(b"appended after the plan %d" % i, flush=True)
"""


def test_a_repair_does_not_cut_records_appended_after_its_plan_was_shown(wal_dir):
    """MEDIUM.  ``pmemwal repair`` shows its plan and asks, holding no lock; a writer opens
    the WAL meanwhile (a default open starts at the checkpoint and never reads the damage
    below it), appends 10 records, acknowledged, and closes; the user says yes.  The repair
    (repair.py:155) opens anew and cuts at the damage: the 10 records leave the WAL for
    lost+found, which the plan the user agreed to did not list, and it exits 0.  It should
    refuse (the WAL changed since the plan) or keep them."""
    lsns = _closed_wal(wal_dir, 3000)
    flip_byte(wal_dir, lsns[1500] + REC_HDR + 5)
    proc = subprocess.Popen([sys.executable, "-c", "from pmemwal.tools.cli import main; main()",
                             "repair", str(wal_dir)], env=child_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    shown = b""
    while not shown.endswith(b"]: "):           # the plan, then "Repair the WAL? [y/N]: "
        byte = proc.stdout.read(1)
        assert byte, shown.decode()
        shown += byte
    planned = int(re.search(rb"set aside  (\d+) valid records", shown).group(1))
    subprocess.run([sys.executable, "-c", _WRITER_AFTER_THE_PLAN, str(wal_dir)],
                   env=child_env(), check=True)
    out, _ = proc.communicate(b"y\n", timeout=120)
    aside = re.search(rb"set aside in lost\+found: \S+ \((\d+) records", out)
    assert proc.returncode != 0 or int(aside.group(1)) == planned, out.decode()
    assert proc.returncode != 0 or b"appended after the plan 9" in b"".join(payloads_recovered(wal_dir))


def test_repair_mends_a_damaged_spare_as_its_open_does(wal_dir):
    """MEDIUM (a refusal where it works).  A spare segment made ahead (preallocate), never
    written, its header damaged: the open repair makes (and the default open too) sets it
    aside in lost+found and opens with every record; verify calls the header a problem a
    cut does not mend (Problem.cut_mends: only damage and gap), so repair refuses: "move
    the files named out of the directory", exit 1."""
    lsns = _closed_wal(wal_dir, 200, background=False, preallocate=3 * SEG)
    with open(seg_file(wal_dir, 2), "rb") as f:
        written = f.read()
    assert lsns[-1] < SEG and not any(written[PAGE:])   # (nothing of the WAL in it)
    SegmentHeader.unpack(written[:HEADER_SIZE], "2")
    with open(seg_file(wal_dir, 2), "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    done = _cli("repair", str(wal_dir), "--yes")
    assert done.exit_code == 0, done.output
    assert len(payloads_recovered(wal_dir)) == 200


_KILLED_BEFORE_ITS_CHECKPOINT = r"""
import os, signal, sys, warnings
import pmemwal
from pmemwal.checkpoint import CheckpointFile
warnings.simplefilter("ignore")
CheckpointFile.write = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
pmemwal.open(sys.argv[1], on_corruption="truncate", verify="all")
"""


def test_the_remedy_a_pending_entry_names_finishes_it(wal_dir):
    """MEDIUM (a remedy that does nothing).  A repair's open killed after its set-aside and
    before its checkpoint (a pending entry); the default open that follows starts at the
    clean close's checkpoint, past the damage, and the WAL goes on and is truncated past
    the damaged segment.  The put-back refuses: "pending ... To finish the cut: `pmemwal
    repair PATH` ...; or open with on_corruption='truncate', verify='all'" (putback.py:70).
    The command says "nothing to repair" (verify is OK: the damage is gone) and the open
    finishes only pending entries at or past its own end (lostfound.finish): both leave the
    entry pending, and the put-back refuses for ever; only "remove the entry" works."""
    entry = _pending_entry(wal_dir, _KILLED_BEFORE_ITS_CHECKPOINT)
    with pmemwal.open(wal_dir, background=False) as wal:   # (it never reads the damage)
        while wal.insert_lsn < 2 * SEG + 4 * PAGE:
            wal.append(bytes(4000), flush=True)
        assert wal.truncate(2 * SEG) == 2
    refused = _cli("lost-found", str(wal_dir), "--restore", entry.name)
    assert refused.exit_code != 0 and "is pending" in refused.output
    # (fixed: the records stayed in the WAL until the truncation; the remedy named is the
    # entry's removal, and it works as printed)
    command = re.search(r"`(pmemwal lost-found [^`]+)`", refused.output).group(1).split()
    assert command[-2:] == ["--remove", entry.name]
    assert _cli(*command[1:]).exit_code == 0
    assert not lostfound.entries(str(wal_dir)), "the remedy named left it there"


def test_verify_and_a_readonly_open_refuse_a_restore_cut_short(wal_dir):
    """MEDIUM, before these commits (asked of 5b821f3: RESTORING).  open refuses a directory
    holding RESTORING (segments.py:264: a restore cut short, with records at or past its
    ``until``, or part of the archive); ``verify`` ignores the name (checks.py:26, _IGNORED)
    and says OK with no note, and ``open(readonly=True)`` (readonly.identity lists segments
    alone) serves its records."""
    _closed_wal(wal_dir, 10)
    (wal_dir / "RESTORING").write_bytes(b"")
    with pytest.raises(pmemwal.FormatError, match="restore cut short"):
        pmemwal.open(wal_dir)
    assert not verify(wal_dir).ok
    with pytest.raises(pmemwal.FormatError, match="restore cut short"):
        pmemwal.open(wal_dir, readonly=True).close()
