"""``pmemwal repair``, and every message that suggests a remedy for damage.

- A closed WAL with 8 bytes overwritten mid-way (the case a user meets): ``verify`` fails
  and names the remedy; ``repair --dry-run`` and a "no" change no byte; ``repair`` keeps and
  sets aside what its plan said, the WAL verifies and reads to its end, and the command it
  prints puts the set-aside records back.
- Each remedy message, as printed (records() on damage, open(verify="all"), a deleted
  CHECKPOINT, a deleted segment the checkpoint vouches for, verify's line), is followed in
  both its forms, the command and the open's options, on copies of the WAL: the WAL reads
  to its end afterwards.
- What a cut does not mend (a bad segment header) is refused, as is a WAL a writer holds;
  a sound WAL has nothing to repair; a Log's directory is repaired too.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shlex
import shutil
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import pmemwal
from pmemwal.recovery import RecoveryWarning
from pmemwal.tools import repair as repairing
from pmemwal.tools.cli import main
from tests.conftest import PAGE, REC_HDR, SEG, file_write, seg_file

N = 3000


def _written(path: Path) -> list[tuple[int, bytes]]:
    rng = random.Random(7)
    wal = pmemwal.open(path, segment_size=SEG)
    recs = [(wal.append(p), p) for p in (rng.randbytes(rng.randint(100, 1500)) for _ in range(N))]
    wal.close()
    return recs


def _damage_mid(path: Path, recs: list[tuple[int, bytes]]) -> int:
    """8 bytes of a record's payload overwritten, about half way; the index of that record."""
    i = next(i for i in range(N // 2, N) if recs[i][0] % PAGE < PAGE - 200)
    file_write(path, recs[i][0] + REC_HDR + 40, b"\xa5" * 8)
    return i


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            h.update(name.encode() + Path(root, name).read_bytes())
    return h.hexdigest()


def _cli(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def _read_all(path: Path) -> list[bytes]:
    with pmemwal.open(path) as wal:
        return [bytes(r.payload) for r in wal.records()]


@pytest.fixture
def damaged(shm_tmp: Path) -> tuple[Path, list[tuple[int, bytes]], int]:
    path = shm_tmp / "wal"
    recs = _written(path)
    return path, recs, _damage_mid(path, recs)


def test_repair_shows_its_plan_asks_cuts_and_prints_the_putback_that_works(damaged) -> None:
    path, recs, bad = damaged
    verify = _cli("verify", str(path))
    assert verify.exit_code == 1 and "to repair: `pmemwal repair" in verify.output
    before = _digest(path)

    dry = _cli("repair", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"keep       {bad} records" in dry.output
    aside = int(re.search(r"set aside  (\d+) valid records", dry.output).group(1))
    assert bad + aside == N - 1         # (only the damaged record is lost)
    no = _cli("repair", str(path), input="n\n")
    assert no.exit_code == 1 and "nothing was changed" in no.output
    eof = _cli("repair", str(path), input="")
    assert eof.exit_code == 1
    assert _digest(path) == before

    done = _cli("repair", str(path), input="y\n")
    assert done.exit_code == 0, done.output
    assert "verify: OK" in done.output and f"({aside} records" in done.output
    assert _read_all(path) == [p for _, p in recs[:bad]]
    putback = re.search(r"to append them again: (pmemwal lost-found .*)", done.output).group(1)
    args = shlex.split(putback)
    assert args[0] == "pmemwal"
    again = _cli(*args[1:])
    assert again.exit_code == 0, again.output
    assert _read_all(path) == [p for _, p in recs[:bad] + recs[bad + 1:]]
    assert _cli("repair", str(path)).output.strip().endswith("nothing to repair")


def test_repair_json_plans_and_repairs_without_asking(damaged) -> None:
    path, _, bad = damaged
    assert _cli("repair", str(path), "--json").exit_code == 2       # (it cannot ask)
    out = json.loads(_cli("repair", str(path), "--json", "--yes").output)
    plan, result = out["plan"], out["result"]
    assert plan["needed"] and plan["kept_records"] == bad
    assert result["verify"]["ok"] and result["end_lsn"] == plan["cut_lsn"]
    assert result["entries"][0]["records"] == plan["set_aside"]["records"]


def _hint_command_and_options(message: str) -> tuple[list[str], dict]:
    """The remedy a message names: the command in backquotes, the open's options."""
    command = re.search(r"`(pmemwal repair [^`]+)`", message).group(1)
    options = re.search(r"open with ((?:\w+='\w+'(?:, )?)+)", message).group(1)
    return shlex.split(command), dict(re.findall(r"(\w+)='(\w+)'", options))


def _follow_both(path: Path, message: str) -> None:
    """Follow the remedy in ``message`` as printed, each form on its own copy of the WAL
    (the command's path is the WAL's, rewritten to the copy): each reads to its end after."""
    command, options = _hint_command_and_options(message)
    assert command[:2] == ["pmemwal", "repair"] and command[2] == str(path)
    assert options == {"on_corruption": "truncate", "verify": "all"}
    by_command, by_open = path.with_name("by-command"), path.with_name("by-open")
    shutil.copytree(path, by_command)
    shutil.copytree(path, by_open)
    assert _cli("repair", str(by_command), "--yes").exit_code == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        pmemwal.open(by_open, **options).close()
    for copy in (by_command, by_open):
        assert _cli("verify", str(copy)).exit_code == 0
        _read_all(copy)


def test_the_remedy_of_a_damaged_record_read_works_as_printed(damaged) -> None:
    path, _, _ = damaged
    with pmemwal.open(path) as wal, pytest.raises(pmemwal.CorruptionError) as read:
        list(wal.records())
    with pytest.raises(pmemwal.CorruptionError) as opened:
        pmemwal.open(path, verify="all")
    verify = _cli("verify", str(path)).output
    for message in (str(read.value), str(opened.value), verify):
        _follow_both(path, message)
        for copy in ("by-command", "by-open"):
            shutil.rmtree(path.with_name(copy))


def test_the_remedy_of_a_deleted_checkpoint_works_as_printed(damaged) -> None:
    path, _, _ = damaged
    os.unlink(path / "CHECKPOINT")
    with pytest.raises(pmemwal.CorruptionError) as opened:
        pmemwal.open(path)
    _follow_both(path, str(opened.value))


def test_the_remedy_of_a_deleted_segment_works_as_printed(shm_tmp: Path) -> None:
    path = shm_tmp / "wal"
    _written(path)
    os.unlink(seg_file(path, 1))
    with pytest.raises(pmemwal.CorruptionError) as opened:
        pmemwal.open(path)
    _follow_both(path, str(opened.value))


def test_repair_refuses_what_a_cut_does_not_mend_and_a_held_wal(damaged) -> None:
    path, _, _ = damaged
    with pmemwal.open(path):    # (a writer holds it: the repair's open is refused)
        held = _cli("repair", str(path), "--yes")
    assert held.exit_code == 1 and "LockedError" in held.output
    assert not (path / "lost+found").exists()
    with open(seg_file(path, 2), "r+b") as f:
        f.write(b"junk")            # (a segment header that is no header)
    before = _digest(path)
    refused = _cli("repair", str(path), "--yes")
    assert refused.exit_code == 1 and "a cut does not mend this" in refused.output
    assert "repair will" not in refused.output
    assert _digest(path) == before


def test_repair_of_a_log(shm_tmp: Path) -> None:
    path = shm_tmp / "log"
    log = pmemwal.Log(path, segment_size=SEG)
    for i in range(2000):
        log.append(b"entry %d " % i * 20)
    log.close()
    with pmemwal.open(path) as wal:
        lsns = [r.lsn for r in wal.records()]
    file_write(path, lsns[1000] + REC_HDR + 40, b"\xa5" * 8)
    assert _cli("repair", str(path), "--yes").exit_code == 0
    with pytest.warns(RecoveryWarning, match="the WAL was cut below it"), \
            pmemwal.Log(path) as log:       # (the index is built again from the records)
        assert 900 < log.last_index < 2000
        assert bytes(log.entry(log.last_index).payload) == b"entry %d " % (log.last_index - 1) * 20


def test_a_short_file_past_a_hole_is_a_blocker_as_the_open_refuses_it(shm_tmp: Path) -> None:
    """A spare cut short with the segment before it missing: the open cannot tell that the
    stream never reached it (opening.py, _holds_nothing) and refuses; the plan says so
    instead of promising a repair its open refuses."""
    path = shm_tmp / "wal"
    with pmemwal.open(path, segment_size=SEG, background=False, preallocate=4 * SEG) as wal:
        wal.append(b"x" * 1000, flush=True)
    os.unlink(seg_file(path, 2))
    os.truncate(seg_file(path, 3), SEG // 2)
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(path)
    plan = repairing.plan(path)
    assert [p.segment for p in plan.blockers] == [3], plan.lines()
    assert _cli("repair", str(path), "--yes").exit_code == 1
