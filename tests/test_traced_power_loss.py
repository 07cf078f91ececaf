"""Power loss on the traced core (pmemwal.tools.traced): streaming stores, fences and syncs.

pmem mode is checked with records streamed past the cache on every CPU path this machine
has, under the flush instruction libpmem would use (CLWB, or CLFLUSH where ``pmem_drain``
is empty); the page-cache modes count only what the WAL's syncs covered; writers are
killed, their WAL reopened and crashed again, inside and after its recovery.  Each
mutation puts a persistence bug back and must make its run fail: the checkers can fail.
Each run is a child process (the core is chosen at import).
"""

from __future__ import annotations

import json

import pytest

from conftest import cli_runner
from pmemwal.tools import mutants
from pmemwal.tools.cli import main
from pmemwal.tools.traced import STREAMING_PATHS, run_traced, streaming_paths

IMAGES = 40
IMPL = {"sse42": "sse4.2", "pclmul": "pclmul", "avx2": "avx2-vpclmulqdq",
        "avx512": "avx512-vpclmulqdq"}  # _core.CRC32C_IMPL of each PMEMWAL_CPU path


def _ok(report) -> None:
    assert report.ok, "\n".join(report.failures[:5])
    assert report.images == IMAGES and not report.failures


@pytest.mark.parametrize("path", sorted(STREAMING_PATHS))
def test_streaming_stores_of_every_cpu_path_persist_under_threads_and_a_checkpointer(path):
    if path not in streaming_paths():
        pytest.skip(f"this CPU has no {path} path")
    report = run_traced("pmem", IMAGES, cpu=path, seed=11, streaming=True, threads=4,
                        checkpointer=True)
    _ok(report)
    assert report.streaming and report.crc32c_path == IMPL[path]
    assert report.crash_points.get("streamed") and report.crash_points.get("before fence")


def _streamed(report) -> None:
    assert report.streaming and report.crash_points.get("streamed")


def test_streaming_with_clflush_where_pmem_drain_is_empty(monkeypatch):
    """libpmem's CLFLUSH configuration (PMEM_NO_CLWB=1 PMEM_NO_CLFLUSHOPT=1)."""
    monkeypatch.setenv("PMEM_NO_CLWB", "1")
    monkeypatch.setenv("PMEM_NO_CLFLUSHOPT", "1")
    report = run_traced("pmem", IMAGES, seed=12, streaming=True, threads=4)
    _ok(report)
    _streamed(report)
    assert report.flush_instruction == "clflush"


def test_streaming_writers_of_a_shared_wal():
    report = run_traced("pmem", IMAGES, seed=13, streaming=True, threads=4, shared=True)
    _ok(report)
    _streamed(report)
    assert report.deaths


@pytest.mark.parametrize("mode", ["msync", "buffered"])
def test_page_cache_modes_durable_by_their_syncs_through_kills_and_reopens(mode):
    report = run_traced(mode, IMAGES, seed=14, kills=True)
    _ok(report)
    assert report.kills and report.crash_points.get("in sync")
    assert report.crash_points.get("in recovery")


@pytest.mark.parametrize("mode", ["msync", "buffered"])
def test_page_cache_writers_in_threads_are_durable_by_their_group_commits(mode):
    """Four writers: crash points inside each one's sync while the others append and
    flush, each image held to what the calls had returned when it was taken."""
    report = run_traced(mode, IMAGES, seed=17, threads=4)
    _ok(report)
    assert report.threads == 4 and report.crash_points.get("in sync")


def test_log_workload_durable_by_its_syncs():
    report = run_traced("buffered", IMAGES, seed=15, workload="log")
    _ok(report)
    assert report.crash_points.get("in sync")


# ---- mutations: each bug put back fails its run --------------------------------------

def _caught(report) -> None:
    assert not report.ok and report.lost + report.recovery_errors > 0, report.to_dict()
    assert report.failures


def test_a_deleted_stream_fence_fails_where_pmem_drain_is_empty(monkeypatch):
    """Issue 27's first hole: without the core's own sfence, streamed records are never
    fenced where libpmem's pmem_drain is empty."""
    monkeypatch.setenv("PMEM_NO_CLWB", "1")
    monkeypatch.setenv("PMEM_NO_CLFLUSHOPT", "1")
    _caught(run_traced("pmem", 60, seed=1, streaming=True, mutation="skip-stream-fence"))


def test_a_deleted_stream_fence_is_covered_where_pmem_drain_is_an_sfence():
    """The control: with CLWB, libpmem's pmem_drain is an sfence and fences the streamed
    stores too, so the same deletion loses nothing (the model does not over-report)."""
    _ok(run_traced("pmem", IMAGES, seed=1, streaming=True, flush_instruction="clwb",
                   mutation="skip-stream-fence"))


def test_a_skipped_drain_fails():
    _caught(run_traced("pmem", 60, seed=1, flush_instruction="clwb", mutation="skip-drain"))


def test_a_skipped_fdatasync_fails(monkeypatch):
    """Put in by PMEMWAL_MUTANT, as `pmemwal powerloss --traced` passes it to its children."""
    monkeypatch.setenv("PMEMWAL_MUTANT", "skip-sync")
    _caught(run_traced("buffered", 40, seed=1))


def test_a_short_msync_fails():
    _caught(run_traced("msync", 80, seed=1, mutation="short-msync"))


def test_an_open_that_does_not_sync_what_it_recovered_fails():
    """Issue 27's second hole: a reopen after a kill took page-cache records for durable;
    the new writer's msync covers only its own records, and a power cut loses the rest."""
    _caught(run_traced("msync", 200, seed=1, kills=True, mutation="no-recovery-sync"))


def test_a_reopen_that_loses_a_recovered_record_fails():
    """Each reopen after a kill is checked like an image: a loss there, hidden by later
    appends, would otherwise be forgotten with the ledger entries past its end."""
    report = run_traced("msync", 150, seed=16, kills=True, mutation="reopen-loses-last-record")
    assert not report.ok and any("the reopen after kill" in f for f in report.failures), \
        report.to_dict()


def test_a_recycle_that_keeps_the_old_header_fails():
    report = run_traced("pmem", 100, seed=1, mutation="recycle-keeps-header")
    assert report.recovery_errors and "header says segment" in report.failures[0]


def test_a_commit_that_syncs_only_its_own_record_fails_with_concurrent_writers():
    """Group commit's promise: a flush returns once a sync covers its record.  A commit
    that syncs to its own record's end but publishes the frontier acknowledges other
    writers' records unsynced; only concurrent writers put records past it."""
    _caught(run_traced("msync", IMAGES, seed=1, threads=4, mutation="commit-syncs-own-record"))


def test_a_commit_that_syncs_only_its_own_record_is_invisible_to_one_writer():
    """The control: a lone writer's record ends at the frontier, so the same mutation
    changes nothing there (why the setups with one writer could not catch it)."""
    _ok(run_traced("msync", IMAGES, seed=1, mutation="commit-syncs-own-record"))


def test_the_default_powerloss_catches_it_with_its_page_cache_threads_setup():
    """``pmemwal powerloss`` runs the page-cache setups on the traced core without
    --traced; the registry's mutant reaches its child through PMEMWAL_MUTANT."""
    with mutants.applied("commit-syncs-own-record"):
        result = cli_runner().invoke(main, ["powerloss", "--images", str(IMAGES), "--setups",
                                            "msync-threads", "--seed", "1", "--json", "--quiet"])
    assert result.exit_code == 1, result.output
    (report,) = json.loads(result.stdout)["reports"]
    assert report["threads"] == 4 and report["images"] == IMAGES and not report["ok"]
