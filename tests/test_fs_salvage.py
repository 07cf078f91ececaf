"""Crashes inside a recovery that cuts and sets aside, then a second (and third) recovery
(pmemwal/tools/fs_salvage.py, the ``salvage`` workload of ``pmemwal powerloss --fs-model``):
the library passes, and the ordering bugs that only such a crash (or one inside a put-back)
shows are caught."""

from __future__ import annotations

import pytest

from pmemwal import lostfound
from pmemwal.tools import fs_crash, mutants
from pmemwal.tools.fs_salvage import PATTERNS, check_recovery, make_case, run_salvage


def _why(report) -> str:
    return fs_crash.table([report]) + "\n" + "\n".join(report.failures[:5])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_each_damage_pattern_cuts_and_sets_aside_every_intact_record(tmp_path, pattern):
    case = make_case(tmp_path / "wal", pattern, seed=11)
    assert case.before and case.after
    verdict, detail, put_back = check_recovery(tmp_path / "wal", case, put_back=True)
    assert verdict == "ok", detail
    assert put_back >= 1 and not lostfound.entries(str(tmp_path / "wal")) or \
        pattern == "damaged-spare"


def test_every_state_of_a_crash_in_the_recovery_recovers_again():
    report = run_salvage("ext4", 45, seed=4, crash_rate=0.25, third_rate=0.0, put_back_rate=0.3,
                         patterns=("torn-page", "across-segments", "damaged-spare"))
    assert report.ok, _why(report)
    assert report.cases >= 3 and report.distinct_states >= 45
    assert report.put_backs and report.metadata_states


def test_a_crash_in_the_second_recovery_recovers_a_third_time():
    report = run_salvage("xfs", 1, seed=6, patterns=("zeroed-range",), crash_rate=0.05,
                         third_rate=1.0, third_crash_rate=0.3)
    assert report.ok, _why(report)
    assert report.third_states >= 5


# ---- bugs only a crash inside the recovery shows -------------------------------------------------

def test_a_set_aside_synced_only_after_the_cut_loses_records():
    with mutants.applied("aside-synced-after-cut"):
        report = run_salvage("ext4", 10, seed=0, patterns=("torn-tail",), crash_rate=0.5,
                             third_rate=0.0, put_back_rate=0.0)
    assert report.lost and not report.ok, _why(report)


def test_an_entry_unpended_before_the_cut_is_synced_is_set_aside_twice():
    with mutants.applied("unpend-before-cut"):
        report = run_salvage("ext4", 10, seed=0, patterns=("torn-tail",), crash_rate=0.5,
                             third_rate=0.0, put_back_rate=0.0)
    assert report.duplicated and not report.ok, _why(report)


# ---- a crash during a put-back ------------------------------------------------------------------

def test_every_state_of_a_crash_in_a_put_back_puts_back_again_exactly_once():
    report = run_salvage("ext4", 1, seed=0, patterns=("torn-page",), crash_rate=0.05,
                         third_rate=0.0, put_back_rate=0.0, put_back_state_rate=1.0)
    assert report.ok, _why(report)
    assert report.put_backs and report.put_back_states >= 5


def test_a_put_back_marker_renamed_unsynced_puts_its_records_back_twice():
    with mutants.applied("putback-marker-unsynced"):
        report = run_salvage("ext4", 1, seed=0, patterns=("torn-page",), crash_rate=0.05,
                             third_rate=0.0, put_back_rate=0.0, put_back_state_rate=1.0)
    assert report.duplicated and not report.ok, _why(report)
    assert any("in a put-back" in f for f in report.failures), _why(report)
