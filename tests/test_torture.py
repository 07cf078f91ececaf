"""Crash torture (pmemwal.tools.torture): real child processes, real SIGKILL, real WALs in /dev/shm.

A short run across the persist setups, segment sizes and insertion slots must
lose nothing; and the checker must catch what it is there to catch: an
acknowledged record damaged or gone, a record with wrong content, one out of
order.  The same for the log workload (pmemwal.tools.torture.log): a short
run loses nothing, and its checker catches a lost entry, one misplaced, one
resurrected, a wrong first index or hard state, garbage.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
from conftest import cli_runner

import pmemwal
from pmemwal.tools.cli import main
from pmemwal.format import segment_name
from pmemwal.tools import mutants
from pmemwal.tools.torture import driver as torture
from pmemwal.tools.torture import wal as wal_workload
from pmemwal.tools.torture.driver import play_round
from pmemwal.tools.torture.log import LogLedger
from pmemwal.tools.torture.log_entries import Shared, Worker, make_entry, parse_entry
from pmemwal.tools.torture.log_model import LogModel
from pmemwal.tools.torture.records import HDR, make_record, parse_record
from pmemwal.tools.torture.setups import PERSIST, Setup
from pmemwal.tools.torture.wal import Ledger, check

SEG = 1 << 20


def test_records_regenerate_and_any_changed_byte_is_caught():
    rec = make_record(7, 2, 41, 300)
    assert len(rec) == 300 and parse_record(rec) == (7, 2, 41)
    assert parse_record(make_record(1, 0, 0, HDR)) == (1, 0, 0)
    for i in (0, 5, HDR - 1, HDR, 299):
        bad = bytearray(rec)
        bad[i] ^= 0x40
        assert parse_record(bytes(bad)) is None, i
    assert parse_record(rec[:-1]) is None and parse_record(b"") is None


def test_short_torture_loses_nothing(shm_tmp):
    config = torture.TortureConfig(path=str(shm_tmp), rounds=24, threads=4, rounds_per_dir=8,
                                   delay_ms=(30, 250), recovery_kill_odds=0)  # (every setup acks)
    report = torture.run(config)
    summary = json.dumps(report.to_dict(), indent=1)
    assert report.ok, summary
    assert (report.rounds, report.wal_dirs) == (24, 3)
    assert report.lost == report.garbage == report.order_violations == 0, summary
    assert report.acknowledged > 1000 and report.truncations > 0, summary
    setups = {tuple(key.split("/")) for key in report.per_config}
    assert {(p, s) for p, _, s in setups} == {(p, s) for p in PERSIST
                                               for s in ("1", "8", "256")}
    assert {size for _, size, _ in setups} == {"1M", "2M", "4M"}
    for key, cfg in report.per_config.items():
        assert cfg["acknowledged"] > 0 and cfg["lost"] == 0, (key, summary)
        assert cfg["persist_methods"] == [PERSIST[key.split("/")[0]][1]], (key, summary)
    assert os.listdir(shm_tmp) == []  # nothing left behind


def test_kills_inside_recovery_lose_nothing(shm_tmp):
    """Issue 28, item 4: a kill after the child began to open lands in its recovery now
    and then; the check's recovery is then a second one over what the first left."""
    config = torture.TortureConfig(path=str(shm_tmp), rounds=20, threads=1, rounds_per_dir=20,
                                   delay_ms=(5, 40), recovery_kill_odds=0.5,
                                   recovery_kill_ms=(0.0, 1.0), seed=5)
    report = torture.run(config)
    assert report.ok, json.dumps(report.to_dict(), indent=1)
    # ~10 tries, each killed within 1 ms of "O", while a crash recovery (the round before
    # left its WAL crashed) and the probe before it take longer
    assert report.recovery_kills >= 3 and report.acknowledged > 0


def test_kills_in_recovery_never_land_in_the_creation_of_a_new_wal(shm_tmp):
    """A new WAL directory (every rounds_per_dir rounds) has nothing to recover: a kill while
    its first child creates the WAL left no WAL for the check to open (found by the loaded
    runs of the suite: 1-round torture runs failed now and then)."""
    config = torture.TortureConfig(path=str(shm_tmp), rounds=6, threads=1, rounds_per_dir=2,
                                   recovery_kill_odds=1.0, recovery_kill_ms=(0.0, 1.0), seed=1)
    report = torture.run(config)
    assert report.ok, report.problems
    assert report.recovery_kills and report.wal_dirs == 3
    assert report.to_dict()["recovery_kills"] == report.recovery_kills


def test_a_recovery_that_skips_records_fails_the_torture_check(shm_tmp):
    """Issue 28, item 4: the WAL torture checked that LSNs increase, never that they are
    contiguous: each record must link to the one read before it.  Recovery patched to skip
    every 7th record must fail it (the ledger may not know the skipped ones: unacknowledged)."""
    config = torture.TortureConfig(path=str(shm_tmp), rounds=2, threads=2, rounds_per_dir=2,
                                   delay_ms=(30, 60))
    with mutants.applied("recovery-skips-records"):  # the last of each thread's run but one
        report = torture.run(config)
    assert not report.ok and report.order_violations > 0


def test_a_record_a_recovery_discarded_must_not_come_back(shm_tmp):
    """Issue 28, item 4: the WAL torture had no resurrection check.  After the recovery that
    followed round 1 ended thread 0's run at seq 5, a later recovery returning its seq 5
    is a record come back from the dead."""
    ledger = Ledger(path=str(shm_tmp), segment_size=1 << 20)
    ledger.rounds.update({1, 2})
    ledger.ended[(1, 0)] = 5
    reading = wal_workload._Reading(ledger)
    reading.add(0x2018, make_record(1, 0, 4, 40))
    assert reading.resurrected == 0
    reading.add(0x2060, make_record(1, 0, 5, 40), 0x2018)
    assert reading.resurrected == 1 and "resurrected: round 1 thread 0 seq 5" in \
        reading.problems[-1]


def test_torture_amid_a_checkpointer_loses_nothing(shm_tmp):
    """A thread truncating every 5 ms beside four writers: kills land while segments are
    removed, recycled and made outside the segment lock (issue 15); nothing is lost."""
    config = torture.TortureConfig(path=str(shm_tmp), rounds=9, threads=4, rounds_per_dir=9,
                                   delay_ms=(30, 250), checkpoint=0.005)
    report = torture.run(config)
    summary = json.dumps(report.to_dict(), indent=1)
    assert report.ok and report.lost == report.garbage == report.order_violations == 0, summary
    # the checkpointer's, mostly: about 20 a round unloaded, 4 under ASan on a busy machine
    assert report.truncations > 2 * report.rounds, summary
    with pytest.raises(ValueError, match="checkpoint"):
        torture.TortureConfig(workload="log", checkpoint=0.005)


def _one_round(path: Path, rnd: int = 0, persist: str = "buffered") -> tuple[Ledger, Setup]:
    ledger = Ledger(str(path), SEG)
    setup = Setup(persist, SEG, 8)
    result = play_round(ledger, setup, rnd, f"test/{rnd}", 3, 0.25)
    assert result.ok, result.check.problems if result.check else result.child.failure
    assert result.child.acknowledged > 0
    return ledger, setup


def _present_acknowledged(ledger: Ledger) -> list[int]:
    """LSNs of acknowledged records that truncation may not take, oldest first."""
    return sorted(int(x) for lsns in ledger.known.values() for x in lsns if x >= ledger.keep_from)


@pytest.mark.parametrize("damage", ["zero-header", "delete-segment"])
def test_checker_reports_a_damaged_or_missing_acknowledged_record(shm_tmp, damage):
    ledger, setup = _one_round(shm_tmp / "wal")
    lsns = _present_acknowledged(ledger)
    if damage == "zero-header":  # crc and length of a record in the middle: 8 aligned bytes
        lsn = lsns[len(lsns) // 2]
        fd = os.open(shm_tmp / "wal" / segment_name(lsn // SEG), os.O_RDWR)
        os.pwrite(fd, bytes(8), lsn % SEG)
        os.close(fd)
    else:                        # the segment of the newest acknowledged record, and all later
        last = lsns[-1] // SEG
        for name in os.listdir(shm_tmp / "wal"):
            if name.endswith(".wal") and int(name[:16], 16) >= last:
                os.unlink(shm_tmp / "wal" / name)
    result = check(ledger, setup.mode)
    assert not result.ok
    assert result.lost >= 1, result.problems
    assert any(p.startswith("lost:") for p in result.problems)


def test_checker_reports_garbage_and_disorder(shm_tmp):
    ledger, setup = _one_round(shm_tmp / "wal", rnd=3)
    first = check(ledger, setup.mode)
    assert first.ok, first.problems
    ledger.absorb(first)
    (rnd, thread), (seq, _) = max(first.runs.items(), key=lambda kv: len(kv[1][1]))
    wrong = bytearray(make_record(rnd, thread, 10**6, 500))
    wrong[400] ^= 1
    with pmemwal.open(ledger.path, mode=setup.mode, background=False) as wal:
        wal.append(bytes(wrong))                           # content that does not regenerate
        wal.append(make_record(99, 0, 0, 100))             # a round never run here
        wal.append(make_record(rnd, thread, seq, 64), flush=True)  # a sequence number again
    result = check(ledger, setup.mode)
    assert (result.garbage, result.order, result.lost) == (2, 1, 0), result.problems
    assert result.error is None and not result.ok


def test_cli_torture_json(shm_tmp):
    out = cli_runner().invoke(main, ["torture", str(shm_tmp / "base"), "--rounds", "3",
                                  "--threads", "2", "--seed", "11", "--json"])
    assert out.exit_code == 0, (out.output, out.stderr)
    report = json.loads(out.stdout)
    assert report["ok"] and report["rounds"] == 3 and report["seed"] == 11
    assert report["lost"] == report["garbage"] == 0 and report["acknowledged"] > 0
    assert set(report["recovery_ms"]) == {"p50", "p99", "max"}
    assert sum(c["rounds"] for c in report["per_config"].values()) == 3
    assert "torture" in out.stderr  # the progress bar
    assert report["path"] == str(shm_tmp / "base") and report["kept"] == []


def test_cli_torture_default_dir_is_removed():
    out = cli_runner().invoke(main, ["torture", "--rounds", "1", "--threads", "1", "--json"])
    assert out.exit_code == 0, (out.output, out.stderr)
    assert json.loads(out.stdout)["path"] is None


def test_cli_torture_rejects_unknown_mode(shm_tmp):
    out = cli_runner().invoke(main, ["torture", str(shm_tmp), "--modes", "buffered,dax"])
    assert out.exit_code == 2 and "modes" in out.stderr


# ---- the log workload ----------------------------------------------------------------


def test_entries_regenerate_and_any_changed_byte_is_caught():
    entry = make_entry(7, 2, 41, 1234, 9, 300)
    assert len(entry) == 300 and parse_entry(entry) == (7, 2, 41, 1234, 9)
    for i in (0, 12, 20, 35, 36, 299):
        bad = bytearray(entry)
        bad[i] ^= 0x40
        assert parse_entry(bytes(bad)) is None, i
    assert parse_entry(entry[:-1]) is None and parse_entry(make_record(7, 2, 41, 300)) is None


def test_short_log_torture_loses_nothing(shm_tmp):
    config = torture.TortureConfig(path=str(shm_tmp), rounds=8, threads=4, rounds_per_dir=4,
                                   delay_ms=(30, 200), seed=8, workload="log")
    report = torture.run(config)
    summary = json.dumps(report.to_dict(), indent=1)
    assert report.ok, summary
    assert (report.rounds, report.wal_dirs, report.workload) == (8, 2, "log")
    assert report.lost == report.resurrected == report.garbage == report.state_errors == 0
    assert report.acknowledged > 1000 and report.checked > 500, summary
    assert min(report.ops[k] for k in ("rewinds", "compactions", "state_changes")) > 0, summary
    assert "entries resurrected:  0" in report.table()
    assert os.listdir(shm_tmp) == []


class _LogRun:
    """A Log written here by one Worker, every event kept and fed to a LogModel."""

    def __init__(self, path: Path) -> None:
        self.path, self.events, self.model = path, [], LogModel()
        self.log = pmemwal.open_log(path, mode="buffered", segment_size=SEG, background=False)
        self.worker = Worker(Shared(self.log, 0, 1, self._say, lambda rng: 200), 0)
        self.rng = random.Random(5)

    def _say(self, tag: str, *ints: int) -> None:
        self.events.append((tag, ints))
        self.model.feed(tag, ints)

    def append(self, n: int) -> None:
        self.worker.append(self.rng, n, sync=True)
        self.worker.acknowledge()

    def model_of(self, events: list) -> LogModel:
        model = LogModel()
        for tag, ints in events:
            model.feed(tag, ints)
        return model


def _recover(model: LogModel, path: Path):
    return model.recover(path, mode="buffered", segment_size=SEG)


def test_log_checker_passes_every_operation_of_the_workload(shm_tmp):
    run = _LogRun(shm_tmp / "wal")
    for _ in range(300):
        run.worker.step(run.rng)
    run.append(5)
    run.worker.reset(10)
    run.append(3)
    run.log.close()
    chk = _recover(run.model, run.path)
    assert chk.ok, chk.problems
    assert (chk.checked, chk.scanned, chk.beyond) == (3, 3, False)
    assert min(run.model.ops.values()) > 0, run.model.ops


@pytest.mark.parametrize("operation, counter", [
    ("rewind", "resurrected"), ("reset", "resurrected"), ("compact", "state_errors"),
    ("set_state", "state_errors")])
def test_log_checker_allows_either_side_of_an_operation_in_flight_only(shm_tmp, operation,
                                                                       counter):
    """Before the operation finished, the directory as before it or as after it passes;
    once it finished, the directory as before it fails."""
    run = _LogRun(shm_tmp / "wal")
    run.append(10)
    shutil.copytree(run.path, shm_tmp / "before")
    {"rewind": lambda: run.worker.rewind(3), "reset": lambda: run.worker.reset(5),
     "compact": lambda: run.worker.compact(4), "set_state": lambda: run.worker.set_state(run.rng),
     }[operation]()
    run.log.close()
    in_flight = run.model_of(run.events[:-1])
    assert _recover(in_flight, shm_tmp / "before").ok
    assert _recover(in_flight, run.path).ok
    assert _recover(run.model, run.path).ok
    stale = _recover(run.model, shm_tmp / "before")
    assert getattr(stale, counter) >= 1 and not stale.ok, stale.problems
    assert stale.lost == 0, stale.problems


@pytest.mark.parametrize("where", ["tail", "middle"])
def test_log_checker_reports_an_acknowledged_entry_gone(shm_tmp, where):
    run = _LogRun(shm_tmp / "wal")
    run.append(10)
    entries = [(e.term, bytes(e.payload)) for e in run.log]
    run.log.close()
    if where == "tail":   # the log rewritten without entries 9 and 10
        with pmemwal.open_log(run.path, mode="buffered", background=False) as log:
            log.truncate_after(8)
        expected = {"lost": 2, "order": 0}
    else:                 # without entry 5: 6..10 each one index down
        shutil.rmtree(run.path)
        with pmemwal.open_log(run.path, mode="buffered", segment_size=SEG) as log:
            for term, payload in entries[:4] + entries[5:]:
                log.append(payload, term)
        expected = {"lost": 6, "order": 5}
    chk = _recover(run.model, run.path)
    assert {"lost": chk.lost, "order": chk.order} == expected, chk.problems
    assert not chk.ok and "entry 10 (round 0 thread 0 seq 9, term 1) is lost: not back at its " \
        "index" in chk.problems


def test_log_checker_reports_garbage_and_misplaced_entries(shm_tmp):
    run = _LogRun(shm_tmp / "wal")
    run.append(3)
    run.log.append(b"not an entry at all" * 3, 1)
    run.log.append(make_entry(0, 0, 99, 999, 1, 100), 1)   # appended elsewhere
    run.log.append(make_entry(7, 0, 0, 6, 1, 100), 1)      # of a round never run here
    run.log.close()
    chk = _recover(run.model, run.path)
    assert (chk.garbage, chk.order, chk.lost) == (2, 1, 0), chk.problems


def test_log_checker_reports_an_earlier_round_entry_the_round_did_not_begin_with(shm_tmp):
    run = _LogRun(shm_tmp / "wal")
    run.append(10)
    run.log.close()
    began_with = _recover(run.model, run.path).recovered
    for index in (8, 9, 10):
        del began_with.entries[index]
    chk = _recover(LogModel(1, (0, 1), 5, began_with), run.path)
    assert chk.resurrected == 3 and chk.lost == 0, chk.problems


def test_log_ledger_holds_a_round_to_what_the_last_recovery_returned(shm_tmp):
    for attempt in range(5):  # a round whose kill came amid a reset returns no entry: again
        ledger = LogLedger(str(shm_tmp / f"wal{attempt}"), SEG)
        result = play_round(ledger, Setup("buffered", SEG, 8), 0, f"test/{attempt}", 3, 0.25)
        assert result.ok, result.check.problems if result.check else result.child.failure
        returned = len(ledger.start.entries)
        if returned:
            break
    assert result.child.acknowledged > 0 and returned > 0
    ledger.begin(1)   # the next round, before its child: all that came back must be there
    assert ledger.check("buffered").ok
    with pmemwal.open_log(ledger.path, mode="buffered", background=False) as log:
        log.truncate_after(log.first_index - 1)
    chk = ledger.check("buffered")
    assert chk.lost == returned and chk.checked == returned and not chk.ok, chk.problems


def test_cli_torture_log_workload_json(shm_tmp):
    out = cli_runner().invoke(main, ["torture", str(shm_tmp / "base"), "--workload", "log",
                                     "--rounds", "2", "--threads", "2", "--seed", "4", "--json"])
    assert out.exit_code == 0, (out.output, out.stderr)
    report = json.loads(out.stdout)
    assert report["ok"] and report["workload"] == "log" and report["acknowledged"] > 0
    assert report["lost"] == report["resurrected"] == report["state_errors"] == 0
    assert {"rewinds", "compactions", "resets", "state_changes"} <= set(report)


def test_cli_torture_processes_json(shm_tmp):
    """--processes: writer processes share one WAL and are SIGKILLed, mostly mid-insert
    (the short version of docs/SHARED.md's long torture)."""
    out = cli_runner().invoke(main, ["torture", str(shm_tmp / "shared"), "--processes", "2",
                                     "--threads", "2", "--seconds", "2", "--kill-interval", "0.3",
                                     "--seed", "5", "--checkpoint-every", "200", "--json"])
    assert out.exit_code == 0, (out.output, out.stderr)
    report = json.loads(out.stdout)
    assert report["ok"] and report["kills"] >= 1 and report["acknowledged"] > 100
    assert report["lost"] == report["garbage"] == report["order"] == report["blocked"] == []
    assert report["max_stall_s"] < 10
    assert "torture" in out.stderr  # progress
