"""A review of cb14cd0: a shared WAL's first process fills the holes past its end (in use,
opening.py ``_fill_gaps``), and the repair plan's damaged spare mirrors the open's
(repair.py ``_damaged_spare`` against opening.py ``_damaged_spares`` / ``_holds_nothing``).

Each test fails on the code it reviews; the docstring ranks it and says what went wrong.
Real files and real processes: damage is ordinary file writes, copies, truncations and
unlinks; a shared writer is a child process that appends, acknowledges and closes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pmemwal
from pmemwal.recovery import RecoveryWarning
from pmemwal.tools import repair as repairing
from conftest import SEG, child_env, first_lsn_of_segment, seg_file


def _payloads(wal_dir: Path, **options) -> list[bytes]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        with pmemwal.open(wal_dir, **options) as wal:
            return [bytes(r.payload) for r in wal.records()]


def _with_spares(wal_dir: Path, records: int = 10) -> None:
    """A closed WAL of ``records`` records in segment 0, spares 1..4 made ahead."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, preallocate=4 * SEG) as wal:
        for _ in range(records):
            wal.append(b"x" * 1000)


def _repair_open(wal_dir: Path) -> None:
    """The open ``pmemwal repair`` makes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        pmemwal.open(wal_dir, on_corruption="truncate", verify="all").close()


@pytest.mark.parametrize("foreign", ["another WAL's spare", "this WAL's spare 4, copied"])
def test_the_plan_does_not_promise_a_repair_past_a_file_the_open_refuses_by_its_header(
        wal_dir, shm_tmp, foreign):
    """MEDIUM (a plan the repair cannot carry out).  Spare 3 replaced by a whole file whose
    header reads but is not this segment's: another WAL's spare 3, or this WAL's spare 4
    copied to 3's name.  The open refuses whatever on_corruption says (FormatError "belongs
    to another WAL" from the header check in ``_open_segments``; "header says segment 4"
    from segments.py ``read_headers``): only a header that does not read
    (DamagedHeaderError) or a wrong size with this WAL's id can be a damaged spare
    (opening.py ``_damaged_spares``).  repair.py ``_damaged_spare`` takes any "header"
    problem verify reports: ``holds_pages`` finds no page naming segment 3 in this WAL,
    the file is whole, so no blocker, "repair will: ...", and the repair's open then
    raises the same FormatError."""
    _with_spares(wal_dir)
    if foreign == "another WAL's spare":
        other = shm_tmp / "other"
        _with_spares(other)
        shutil.copyfile(seg_file(other, 3), seg_file(wal_dir, 3))
    else:
        shutil.copyfile(seg_file(wal_dir, 4), seg_file(wal_dir, 3))
    with pytest.raises(pmemwal.FormatError):
        _repair_open(wal_dir)
    plan = repairing.plan(wal_dir)
    assert plan.needed
    assert plan.blockers, plan.lines()


def test_the_plan_does_not_promise_a_repair_past_a_short_file_after_a_missing_segment(wal_dir):
    """MEDIUM (a plan the repair cannot carry out; cb14cd0's own rule, one case off).  Spare
    2 deleted, spare 3 cut to half its size.  The open refuses (FormatError "... is 524288
    bytes, expected 1048576"): opening.py ``_holds_nothing`` takes a short file for a
    damaged spare only when the segment before it is there ("segno - 1 in self._segnos")
    and was not written to its last page.  repair.py ``_damaged_spare`` says
    ``not (segno - 1 in view.segments and view.wrote_last_page(segno - 1))``: a missing
    segment before it reads as "not written", so the short file is a damaged spare, no
    blocker, and the repair's open fails with the FormatError."""
    _with_spares(wal_dir)
    os.unlink(seg_file(wal_dir, 2))
    os.truncate(seg_file(wal_dir, 3), SEG // 2)
    with pytest.raises(pmemwal.FormatError):
        _repair_open(wal_dir)
    plan = repairing.plan(wal_dir)
    assert plan.blockers, plan.lines()


_TO_A_BOUNDARY = r"""
import sys
import pmemwal
with pmemwal.open(sys.argv[1], segment_size=1 << 20, background=False,
                  preallocate=4 << 20) as wal:
    for seg in range(2):                 # 1012 x 1024 + 1048 stream bytes: one segment, exactly
        for i in range(1012):
            wal.append(b"a" * 1000)
        wal.append(b"b" * 1024)
    print(wal.insert_lsn, flush=True)
"""

_SHARED_APPENDS = r"""
import sys
import pmemwal
with pmemwal.open(sys.argv[1], background=False, shared=True) as wal:
    for i in range(20):
        wal.append(b"s" * 1000, flush=True)
print(20, flush=True)
"""


def _child(wal_dir: Path, script: str) -> int:
    done = subprocess.run([sys.executable, "-c", script, str(wal_dir)], env=child_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_shared_first_opener_replaces_a_damaged_spare_at_its_end_before_writing_there(
        wal_dir):
    """HIGH (acknowledged records a later open refuses to read).  A one-process WAL ends
    exactly at segment 2's first byte (closed there), spares 2..4 made ahead; spare 2's
    header damaged (a torn header write: it holds nothing).  A shared writer opens it
    first, recovers, and appends 20 records, each flushed and acknowledged, and closes.

    Order read (opening.py ``_open``): ``_damaged_spares`` leaves 2 out of ``_segnos`` ->
    recovery ends at 2's first byte -> ``_start_core`` -> ``_ensure_segment(2)`` ->
    supply.py ``_claim_segments``: 2 is not in ``_segnos``, but peers.py ``_made_by_peer``
    (the core exists now, and the file is there) takes the damaged file for one another
    process made, so it is opened and attached as it is, not created over -> its header
    never rewritten -> ``_set_aside_spares`` passes it by ("a segment made at its number
    since replaced the file"), so it is not set aside either.  The records go into a file
    whose header does not read; the next open finds a damaged header on a segment that
    holds pages and refuses (FormatError), and the repair plan names it a blocker: every
    acknowledged record there is hidden.  One process (shared=False) creates segment 2
    over the damaged file: no such loss."""
    boundary = _child(wal_dir, _TO_A_BOUNDARY)
    assert boundary == first_lsn_of_segment(2) and seg_file(wal_dir, 2).exists()
    with open(seg_file(wal_dir, 2), "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    appended = _child(wal_dir, _SHARED_APPENDS)
    assert len(_payloads(wal_dir, background=False)) == 2 * 1013 + appended
