"""Crash torture (pmemwal.tools.torture): real child processes, real SIGKILL, real WALs in /dev/shm.

A short run across the persist setups, segment sizes and insertion slots must
lose nothing; and the checker must catch what it is there to catch: an
acknowledged record damaged or gone, a record with wrong content, one out of
order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import cli_runner

import pmemwal
from pmemwal.tools import torture
from pmemwal.tools.cli import main
from pmemwal.format import segment_name
from pmemwal.tools.torture import Ledger, Setup, check, make_record, parse_record, play_round

SEG = 1 << 20


def test_records_regenerate_and_any_changed_byte_is_caught():
    rec = make_record(7, 2, 41, 300)
    assert len(rec) == 300 and parse_record(rec) == (7, 2, 41)
    assert parse_record(make_record(1, 0, 0, torture.HDR)) == (1, 0, 0)
    for i in (0, 5, torture.HDR - 1, torture.HDR, 299):
        bad = bytearray(rec)
        bad[i] ^= 0x40
        assert parse_record(bytes(bad)) is None, i
    assert parse_record(rec[:-1]) is None and parse_record(b"") is None


def test_short_torture_loses_nothing(shm_tmp):
    config = torture.TortureConfig(path=str(shm_tmp), rounds=24, threads=4, rounds_per_dir=8,
                                   delay_ms=(30, 250))
    report = torture.run(config)
    summary = json.dumps(report.to_dict(), indent=1)
    assert report.ok, summary
    assert (report.rounds, report.wal_dirs) == (24, 3)
    assert report.lost == report.garbage == report.order_violations == 0, summary
    assert report.acknowledged > 1000 and report.truncations > 0, summary
    setups = {tuple(key.split("/")) for key in report.per_config}
    assert {(p, s) for p, _, s in setups} == {(p, s) for p in torture.PERSIST
                                               for s in ("1", "8", "256")}
    assert {size for _, size, _ in setups} == {"1M", "2M", "4M"}
    for key, cfg in report.per_config.items():
        assert cfg["acknowledged"] > 0 and cfg["lost"] == 0, (key, summary)
        assert cfg["persist_methods"] == [torture.PERSIST[key.split("/")[0]][1]], (key, summary)
    assert os.listdir(shm_tmp) == []  # nothing left behind


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
