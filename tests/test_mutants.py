"""The mutants registry (pmemwal.tools.mutants): each mutant goes in and comes out whole,
PMEMWAL_MUTANT reaches the checkers and their children, and the runner tells a caught mutant
from a missed one.  (Each mutant is held against its checker in that checker's tests.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pmemwal import archive, archiver, segments, wal
from pmemwal.tools import fs_crash, mutant_runner, mutants
from pmemwal.tools.torture.setups import child_env

# where the library mutants patch
_TARGETS = [(wal.WAL, "records"), (wal.WAL, "_persist_recovered"),
            (segments.WalDirectory, "recycle"), (segments.WalDirectory, "sync"),
            (archive, "fsync_path"), (archiver, "archive_ready"), (fs_crash, "archive_ready")]


def _snapshot() -> list[object]:
    return [getattr(owner, attr) for owner, attr in _TARGETS]


_LIBRARY_MUTANTS = ["no-recovery-sync", "reopen-loses-last-record", "recycle-keeps-header",
                    "recycle-without-first-sync", "recycle-header-first",
                    "control-from-unsynced-segments", "archive-partial-unsynced",
                    "done-before-upload", "drop-every-fifth-record", "recovery-skips-records"]


@pytest.mark.parametrize("name", _LIBRARY_MUTANTS)
def test_a_mutant_changes_the_library_inside_its_with_and_nothing_after(name):
    before, owned = _snapshot(), [set(vars(wal.WAL)), set(vars(segments.WalDirectory))]
    with mutants.applied(name):
        assert _snapshot() != before
    assert _snapshot() == before
    assert [set(vars(wal.WAL)), set(vars(segments.WalDirectory))] == owned


def test_a_mutant_a_checker_reaches_through_an_imported_copy_is_put_there_too():
    """fs_crash calls the archiver's archive_ready by the name it imported."""
    with mutants.applied("done-before-upload"):
        assert fs_crash.archive_ready is archiver.archive_ready
        assert fs_crash.archive_ready.__name__ == "done_before_upload"
    assert fs_crash.archive_ready.__name__ == "archive_ready"


def test_a_core_mutant_on_the_regular_core_goes_only_into_the_children_it_starts():
    """The regular core cannot carry it: no bit here, PMEMWAL_MUTANT for the traced children
    a checker starts, and the variable as it was afterwards."""
    before = os.environ.get(mutants.ENV)
    with mutants.applied("skip-sync"):
        assert mutants.core_mask() == 0 and os.environ[mutants.ENV] == "skip-sync"
    assert os.environ.get(mutants.ENV) == before


def test_an_unknown_mutant_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="drop-every-fifth-record"):
        with mutants.applied("no-such-mutant"):
            pass


def test_the_torture_children_keep_and_read_PMEMWAL_MUTANT(monkeypatch):
    monkeypatch.setenv(mutants.ENV, "no-such-mutant")
    assert child_env("pmem")[mutants.ENV] == "no-such-mutant"
    proc = subprocess.run([sys.executable, "-m", "pmemwal.tools.torture.child", "{}"],
                          capture_output=True, text=True, env=child_env("buffered"), timeout=60)
    assert proc.returncode != 0 and "unknown mutant 'no-such-mutant'" in proc.stderr


def test_the_runner_calls_a_failing_checker_run_caught_and_a_passing_one_missed():
    argv = ["powerloss", "--setups", "buffered", "--images", "20", "--seed", "5"]
    caught = mutant_runner.run_checker("buffered", argv, "drop-every-fifth-record", 300)
    assert caught.verdict == "caught", caught
    assert "did not come back" in caught.detail
    assert caught.command.startswith("PMEMWAL_MUTANT=drop-every-fifth-record pmemwal powerloss")
    # it drops records of the torture's format only: the power-loss run cannot see it
    missed = mutant_runner.run_checker("buffered", argv, "recovery-skips-records", 300)
    assert missed.verdict == "missed", missed


def test_the_runner_names_what_caught_each_mutant():
    runs = [mutant_runner.Run("powerloss", "", "missed"), mutant_runner.Run("fs", "", "missed"),
            mutant_runner.Run("torture", "", "missed"), mutant_runner.Run("pmemwal x", "", "caught")]
    assert mutant_runner.verdict(runs) == "ONLY a non-default run: pmemwal x"
    assert mutant_runner.verdict(runs[:2] + [mutant_runner.Run("torture", "", "caught")]) == "torture"
    assert mutant_runner.verdict(runs[:3]).startswith("MISSED")
    assert mutant_runner._command_of("A=1 pmemwal powerloss --images 3") == (
        {"A": "1"}, ["powerloss", "--images", "3"])


def test_the_runner_lists_every_mutant():
    out = subprocess.run([sys.executable, "-m", "pmemwal.tools.mutant_runner", "--list"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert [line.split(":")[0] for line in out.splitlines()] == list(mutants.MUTANTS)
