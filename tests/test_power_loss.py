"""Simulated power loss (pmemwal.tools.powerloss): crash images recovered without loss or garbage.

The short version of ``pmemwal powerloss``; each mode crashes a live workload
a hundred times, and a Log's workload (``--workload log``: entries, rewinds,
compactions, resets, hard states) sixty times.  The last tests break the
persist model on purpose and check that the images then do lose acknowledged
records and entries: the check can fail.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import pmemwal
from conftest import child_env, cli_runner
from pmemwal.log_replay import LogReplay
from pmemwal.tools import mutants, powerloss, shadow
from pmemwal.tools.cli import main
from pmemwal.tools.powerloss import LogWorkload, run_power_loss
from pmemwal.tools.shadow import DurableShadow, PmemTracer

IMAGES = 100
LOG_IMAGES = 60
SETUPS = [("pmem", 1), ("pmem", 4), ("msync", 1), ("buffered", 1)]


def opens_through_the_index(monkeypatch) -> list[int | None]:
    """Each Log open's replay point from its stored index (None: it replayed every record)."""
    load, seen = LogReplay._load_index, []

    def counted(self):
        seen.append(load(self))
        return seen[-1]

    monkeypatch.setattr(LogReplay, "_load_index", counted)
    return seen


@pytest.mark.parametrize("mode, threads", SETUPS)
def test_crash_images_keep_every_acknowledged_record(mode: str, threads: int, shm_tmp) -> None:
    report = run_power_loss(mode, IMAGES, threads=threads, seed=7, directory=str(shm_tmp))
    assert report.failures == []
    assert report.ok
    assert report.images == IMAGES
    assert report.records_written > 100 and report.flushed_bytes > 0
    assert report.segments_recycled > 0  # images met stale pages of an earlier cycle
    # ("file sync": in each sync of CHECKPOINT, which every truncation writes)
    if mode == "pmem":
        assert set(report.crash_points) == {"flush", "before drain", "file sync"}
    else:
        assert set(report.crash_points) == {"mid-flush", "between", "file sync"}
        assert set(report.grains) == set(shadow.PAGE_CACHE_GRAINS)
    assert report.recovered_beyond_ack > 0  # unacknowledged records can survive, intact


@pytest.mark.parametrize("mode, threads", SETUPS)
def test_log_crash_images_keep_every_acknowledged_entry(mode: str, threads: int, shm_tmp,
                                                        monkeypatch) -> None:
    """The images hold the Log's index/ (and CHECKPOINT) as their writes and syncs left
    them, torn, stale or not written back: many open through the stored index, as a real
    open after a power cut does, and give exactly what the model requires."""
    seen = opens_through_the_index(monkeypatch)
    report = run_power_loss(mode, LOG_IMAGES, threads=threads, seed=7, directory=str(shm_tmp),
                            workload="log")
    assert report.failures == []
    assert report.ok and report.workload == "log"
    assert report.images == LOG_IMAGES
    assert report.records_written > 200 and report.segments_recycled > 0
    assert report.recovered_beyond_ack > 0  # unacknowledged entries and operations can survive
    if threads == 1:  # (4 writers take their images before the first compaction)
        assert report.crash_points.get("file sync", 0) > 0  # in the syncs of CHECKPOINT, index/
        assert sum(lsn is not None for lsn in seen) > LOG_IMAGES // 4, seen


def test_shared_wal_crash_images_with_a_writer_dying_mid_insert(shm_tmp) -> None:
    """Three handles of one shared WAL, each a writer to it as another process would be; one
    dies now and then with an insertion placed and not persisted, and the others close its
    range with void records, traced like every store: no image loses an acknowledged record
    or returns one that was not written there."""
    report = run_power_loss("pmem", IMAGES, threads=4, seed=3, directory=str(shm_tmp),
                            shared=True)
    assert report.failures == []
    assert report.ok and report.images == IMAGES and report.shared
    assert report.deaths > 0 and report.segments_recycled > 0
    assert report.recovered_beyond_ack > 0


def test_a_writer_descheduled_after_its_snapshot_keeps_its_place_in_write_back_order(
        shm_tmp, monkeypatch) -> None:
    """Four writers, each giving the GIL away right after the tracer copies the lines it
    flushes: another writer's later copy of a shared line must still be the one that lasts.
    (With the copy and its write-back order taken apart, a third of these images failed:
    acknowledged records lost, CorruptionError; the rare failures of the 4-writer ASan runs.)"""
    read = ctypes.string_at

    def slow_read(addr: int, size: int) -> bytes:
        lines = read(addr, size)
        time.sleep(0.0002)  # another writer runs here
        return lines

    monkeypatch.setattr(PmemTracer, "_read", staticmethod(slow_read))
    report = run_power_loss("pmem", 100, threads=4, seed=1, directory=str(shm_tmp))
    assert report.failures == []
    assert report.ok and report.images == 100


@pytest.mark.parametrize("workload", ["wal", "log"])
def test_a_core_that_skips_flushes_loses_records(shm_tmp, monkeypatch, workload: str) -> None:
    """Drop one pmem_flush in three: acknowledged records go missing (or recovery,
    finding valid records past the damage, refuses with CorruptionError)."""
    calls = iter(range(1 << 30))
    flush = PmemTracer._on_flush

    def forgetful(self, addr, length):
        if next(calls) % 3:
            flush(self, addr, length)

    monkeypatch.setattr(PmemTracer, "_on_flush", forgetful)
    report = run_power_loss("pmem", 60, seed=3, directory=str(shm_tmp), workload=workload)
    assert not report.ok
    assert report.lost + report.recovery_errors + report.wrong_state > 0
    assert any(word in f for f in report.failures
               for word in ("acknowledged", "CorruptionError", "is lost"))


@pytest.mark.parametrize("mode", ["pmem", "buffered"])
def test_a_recovery_that_drops_records_fails_the_check(mode: str, shm_tmp) -> None:
    """Issue 28, item 5: recovery patched to drop every 5th record passed the check (ok, 0
    lost, 0 bad): it looked at the records returned and at the end LSN only.  It now holds
    every acknowledged record, by what the calls returned, against what comes back."""
    with mutants.applied("drop-every-fifth-record"):
        report = run_power_loss(mode, 30, seed=3, directory=str(shm_tmp))
    assert not report.ok and report.lost > 0
    assert any("did not come back" in f for f in report.failures), report.failures[:3]


@pytest.mark.parametrize("workload", ["wal", "log"])
@pytest.mark.parametrize("mode", ["msync", "buffered"])
def test_a_flush_that_syncs_nothing_loses_records(mode: str, shm_tmp, monkeypatch,
                                                  workload: str) -> None:
    """A flush that returns without making anything durable: acknowledgements are lies."""
    monkeypatch.setattr(DurableShadow, "settle", lambda self: None)
    report = run_power_loss(mode, 60, seed=3, directory=str(shm_tmp), workload=workload)
    assert report.lost + report.recovery_errors + report.wrong_state > 0


@pytest.mark.parametrize("mode", ["msync", "buffered"])
def test_log_entries_acknowledged_before_their_sync_returned_are_lost(mode: str, shm_tmp,
                                                                     monkeypatch) -> None:
    """The model told of each step's acknowledgements before its flush returned: images
    taken in the middle of those flushes lack them, and the log check says so."""
    monkeypatch.setattr(LogWorkload, "horizon", lambda self, acked: self.acked())
    report = run_power_loss(mode, 60, seed=3, directory=str(shm_tmp), workload="log")
    assert report.lost > 0 and report.recovery_errors == 0, report.failures
    assert any("is lost: not back at its index" in f for f in report.failures)


def test_a_crash_due_in_a_compaction_is_imaged_before_its_segments_go(shm_tmp) -> None:
    """A compaction drops segments once its flush has returned: a crash in that flush
    (page-cache modes image it after the step) must still find them, and recover."""
    log = pmemwal.open_log(shm_tmp / "wal", mode="buffered", segment_size=powerloss.SEGMENT_SIZE,
                           background=False, recycle_segments=1, prepare_segments=0)
    log.append_many([bytes(100_000)] * 40, 1, sync=True)
    shadow = DurableShadow(log.wal, np.random.default_rng(0), (8,))
    before = set(shadow.segments)
    shadow.arm(lambda: shadow.image(None, "mid-flush"))
    assert log.compact(log.last_index + 1) > 0
    image = shadow.disarm()
    assert set(image.segments) == before != set(shadow.segments) and shadow.disarm() is None
    log.close()
    powerloss._write_image(image, shm_tmp / "image")
    with pmemwal.open_log(shm_tmp / "image", mode="buffered", create=False) as recovered:
        assert (recovered.first_index, recovered.last_index) in {(1, 40), (41, 40)}


def test_unknown_mode_threads_outside_pmem_and_unknown_workload_are_refused() -> None:
    with pytest.raises(ValueError, match="mode="):
        run_power_loss("dax", 1)
    with pytest.raises(ValueError, match="threads="):
        run_power_loss("buffered", 1, threads=2)
    with pytest.raises(ValueError, match="workload="):
        run_power_loss("buffered", 1, workload="raft")


@pytest.mark.parametrize("workload", ["wal", "log"])
def test_cli_reports_every_setup_as_json(workload: str) -> None:
    result = cli_runner().invoke(main, ["powerloss", "--images", "5", "--setups", "pmem-threads,buffered",
                                       "--workload", workload, "--json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)["reports"]
    assert [(r["mode"], r["threads"], r["images"], r["ok"], r["workload"]) for r in reports] == [
        ("pmem", 4, 5, True, workload), ("buffered", 1, 5, True, workload)]


def test_cli_progress_is_plain_lines_off_a_terminal_and_quiet_silences_it() -> None:
    """stderr here is not a terminal: a line per 10 s and one at the end, no bar's
    carriage returns; --quiet: nothing."""
    args = ["powerloss", "--images", "3", "--setups", "buffered"]
    plain = cli_runner().invoke(main, args)
    assert plain.exit_code == 0, plain.output
    assert "\r" not in plain.stderr
    assert re.search(r"^powerloss: 3/3 images \(100%\), 0:\d\d elapsed; buffered$", plain.stderr, re.M)
    quiet = cli_runner().invoke(main, args + ["--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and "| buffered" in quiet.stdout


def test_the_checkers_own_recoveries_are_counted_not_warned(shm_tmp) -> None:
    """A crash image's recovery may set records aside (a torn insert, what a crash leaves):
    the checker counts those RecoveryWarnings in its report; none reaches the caller."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_power_loss("pmem", 20, threads=4, seed=7, directory=str(shm_tmp))
    assert report.ok and report.recovery_warnings > 0
    assert [str(w.message) for w in caught] == []


def test_cli_quiet_prints_the_summary_alone() -> None:
    """``pmemwal powerloss --quiet``, a real process: the table on stdout, nothing on
    stderr (no progress, no warning), the recoveries' warnings counted in --json."""
    args = [sys.executable, "-m", "pmemwal.tools.cli", "powerloss", "--images", "20",
            "--setups", "pmem-threads,msync-kill", "--seed", "7", "--quiet"]
    table = subprocess.run(args, capture_output=True, text=True, env=child_env(), timeout=300)
    assert table.returncode == 0 and "| pmem x4 writers" in table.stdout, table.stderr
    assert table.stderr == ""
    as_json = subprocess.run(args + ["--json"], capture_output=True, text=True, env=child_env(),
                             timeout=300)
    assert as_json.returncode == 0 and as_json.stderr == ""
    reports = json.loads(as_json.stdout)["reports"]
    assert sum(r["recovery_warnings"] for r in reports) > 0


def test_cli_table_has_the_log_columns() -> None:
    result = cli_runner().invoke(main, ["powerloss", "--images", "3", "--setups", "buffered",
                                        "--workload", "log"])
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0]
    assert "| entries written | lost | resurrected | wrong state | bad |" in header


def test_cli_refuses_an_unknown_setup() -> None:
    result = cli_runner().invoke(main, ["powerloss", "--setups", "dax"])
    assert result.exit_code == 2
    assert "unknown setup" in result.output


def test_crash_images_amid_a_checkpointer_keep_every_acknowledged_record(shm_tmp) -> None:
    """Four writers and a thread truncating every 2 ms: crashes land while segments are
    removed and recycled under the writers (issue 15); nothing acknowledged is lost."""
    report = run_power_loss("pmem", IMAGES, threads=4, seed=7, directory=str(shm_tmp),
                            checkpointer=True)
    assert report.failures == []
    assert report.ok and report.images == IMAGES
    assert report.checkpointer and report.checkpointed > 0 and report.segments_recycled > 0


def test_a_checkpointer_runs_in_pmem_mode_with_the_wal_workload_only() -> None:
    with pytest.raises(ValueError, match="checkpointer"):
        run_power_loss("msync", 1, checkpointer=True)
    with pytest.raises(ValueError, match="checkpointer"):
        run_power_loss("pmem", 1, checkpointer=True, workload="log")


def test_a_failing_image_prints_how_to_reproduce_it(monkeypatch) -> None:
    """Issue 28, item 4: every failure prints the seed (and setup) that reproduces it."""
    monkeypatch.setenv(mutants.ENV, "drop-every-fifth-record")  # (each setup runs in a child)
    result = cli_runner().invoke(main, ["powerloss", "--images", "20", "--setups",
                                        "pmem,pmem-threads", "--seed", "5", "--quiet",
                                        "--max-failures", "1"])
    assert result.exit_code == 1
    assert "(reproduce: pmemwal powerloss --images 20 --setups pmem --workload wal " \
           "--seed 5)" in result.output
    # the failures stopped the run before its second setup
    assert "--setups pmem-threads" not in result.output and "x4 writers" not in result.output
    assert "stopped after" in result.stderr and "--max-failures 1" in result.stderr


def test_page_cache_images_hold_versions_written_back_and_overwritten_since_the_sync():
    """Issue 28: images mixed only the durable state and the current one, so a value the
    kernel wrote back and the WAL later overwrote (before any sync) was never imaged."""
    mix = DurableShadow._mix.__get__(type("S", (), {"rng": np.random.default_rng(1)})())
    old, between, new = (np.full(64 * 8, v, np.uint8) for v in (0, 1, 2))
    units = set(np.frombuffer(mix(old, new, 8, [between]), np.uint64).tolist())
    assert units == {0, 0x0101010101010101, 0x0202020202020202}
    assert set(np.frombuffer(mix(old, new, 8), np.uint64).tolist()) <= {0, 0x0202020202020202}


def test_a_log_index_whose_chunks_are_not_synced_fails_the_check(shm_tmp) -> None:
    """The index's chunk files written without their fdatasync before the LOG slot that
    names them: images whose chunk pages were not written back open through an index
    naming LSN 0 (or none of the entries' records): refused or wrong.  Images that
    replayed every record, or held the index as written and synced in one step, passed."""
    with mutants.applied("index-chunk-unsynced"):
        report = run_power_loss("buffered", 40, seed=3, directory=str(shm_tmp), workload="log")
    assert not report.ok and report.recovery_errors + report.lost + report.bad > 0, report
    assert any("index" in f or "never compacted" in f for f in report.failures), report.failures[:3]


def test_files_between_syncs_are_imaged_as_any_version_and_renamed_unsynced_as_partial(
        shm_tmp) -> None:
    """A followed file of the WAL directory: its durable content is its last sync's; an
    image takes each unit from that, a version written since, or the current one; a file
    renamed into place before its sync comes along empty or partial."""
    wal = pmemwal.open(shm_tmp / "wal", mode="buffered", segment_size=powerloss.SEGMENT_SIZE,
                       background=False)
    tracker, pwrite = DurableShadow(wal, np.random.default_rng(5), (512,)), os.pwrite
    tracker.follow_files()
    path = str(shm_tmp / "wal" / "NOTES")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, b"a" * 4096, 0)
        os.fsync(fd)
        for version in (b"b", b"c"):
            os.pwrite(fd, version * 4096, 0)
        os.close(fd)
        fd = os.open(path + ".tmp", os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, b"d" * 1024, 0)
        os.close(fd)
        os.rename(path + ".tmp", path + "2")
        images = [tracker.image(0, "test") for _ in range(200)]
        fd = os.open(path, os.O_RDWR)
        os.fdatasync(fd)
        os.close(fd)
        synced = tracker.image(0, "test")
    finally:
        tracker.stop_following()
        wal.close()
    sectors = {image.files["NOTES"][i:i + 512] for image in images for i in range(0, 4096, 512)}
    assert sectors == {v * 512 for v in (b"a", b"b", b"c")}
    assert {(len(image.files["NOTES2"]), image.files["NOTES2"][:1]) for image in images} >= {
        (0, b""), (1024, b"d"), (1024, b"\0")}
    assert synced.files["NOTES"] == b"c" * 4096
    assert os.pwrite is pwrite  # (the calls are followed no longer)


def test_the_default_run_has_a_log_setup_that_names_its_workload() -> None:
    """buffered-log runs the log workload in the wal run (CHECKPOINT and index/ amid a Log's
    steps); --workload log runs buffered already, and leaves it out."""
    assert "buffered-log" in powerloss.SETUPS and powerloss.wal_workload_only("buffered-log")
    result = cli_runner().invoke(main, ["powerloss", "--images", "3", "--setups",
                                        "buffered,buffered-log", "--json"])
    assert result.exit_code == 0, result.output
    assert [(r["mode"], r["workload"]) for r in json.loads(result.stdout)["reports"]] == [
        ("buffered", "wal"), ("buffered", "log")]


# ---- the background writer: its flushes, segments made ahead and checkpoints under the model --

def test_crash_images_with_the_background_writer_on_keep_every_acknowledged_record(shm_tmp):
    """pmem mode with the WAL's background writer on: it makes and arms segments ahead and
    writes a checkpoint every few milliseconds while the writer appends; crash points fall
    just before its file operations and slot writes (the writer mid-insertion)."""
    report = run_power_loss("pmem", 40, seed=21, directory=str(shm_tmp),
                            **{k: v for k, v in powerloss.SETUPS["pmem-background"].items()
                               if k != "mode"})
    assert report.failures == [] and report.ok and report.images == 40
    assert report.background and report.background_ops.get("checkpoint", 0) > 10
    assert report.background_ops.get("create", 0) + report.background_ops.get("arm", 0) > 0
    assert any(where.endswith("(background)") for where in report.crash_points)


def test_the_background_writer_in_a_page_cache_mode_needs_the_traced_core() -> None:
    """The regular core's page-cache model counts what a step's flush returned for as
    durable: the writer's own syncs return at no step's end, so it refuses them."""
    if _core_is_traced():
        pytest.skip("the traced core runs them")
    with pytest.raises(ValueError, match="traced core"):
        run_power_loss("msync", 1, background=True)
    with pytest.raises(ValueError, match="background"):
        run_power_loss("pmem", 1, background=True, workload="log")


def _core_is_traced() -> bool:
    from pmemwal import _core
    return bool(_core.TRACED)


def test_page_cache_setups_with_the_background_writer_pass_in_a_traced_child() -> None:
    """msync-background runs on the traced core even without --traced (a child process):
    only what the writer's syncs covered is durable, a crash point inside each of them."""
    result = cli_runner().invoke(main, ["powerloss", "--images", "40", "--setups",
                                        "msync-background", "--seed", "3", "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["reports"]
    assert report["ok"] and report["images"] == 40 and report["background"]
    assert report["background_ops"].get("checkpoint", 0) > 10
    assert any(where.endswith("(background)") for where in report["crash_points"])


def test_a_background_checkpoint_written_before_its_flush_fails() -> None:
    """The mutant background-checkpoint-before-msync: a direct-mode WAL's background round
    names the insert position in a checkpoint before its flush made the records below it
    durable.  The setups with the background writer off never run that round, and a SIGKILL
    (torture) keeps the mapping's pages; msync-background must fail."""
    from pmemwal.tools.traced import run_traced
    options = {k: v for k, v in powerloss.SETUPS["msync-background"].items() if k != "mode"}
    # a crash at most points: the window (a checkpoint durable, its records not yet synced)
    # is one background round's, and the writer's clock, not the seed, times the rounds
    report = run_traced("msync", 120, seed=1, crash_rate=0.8,
                        mutation="background-checkpoint-before-msync", **options)
    assert report.recovery_errors + report.lost + report.bad > 0, report.to_dict()
    assert any("(background)" in failure for failure in report.failures)


def test_a_spare_armed_without_its_sync_fails(monkeypatch) -> None:
    """The mutant arm-without-sync: a spare's header rewritten as in use with no fdatasync.
    The shadow took every armed file for synced (it did not look), so powerloss missed it;
    now the header stays spare in the durable bytes until a sync of the file is seen, and
    on pmem (whose flushes cover the records' cache lines, not the header's) records are
    acknowledged under a header a crash can leave spare or torn."""
    monkeypatch.setenv(mutants.ENV, "arm-without-sync")
    result = cli_runner().invoke(main, ["powerloss", "--images", "60", "--setups", "pmem",
                                        "--seed", "1", "--json", "--quiet"])
    assert result.exit_code == 1, result.output
    [report] = json.loads(result.stdout)["reports"]
    assert report["recovery_errors"] + report["lost"] + report["bad"] > 0


def test_a_segment_created_without_its_sync_fails(monkeypatch) -> None:
    """The mutant create-header-unsynced: a new segment renamed into place without the
    fdatasync of its .tmp.  Its durable bytes are zeros (a new file) until a sync of it
    is seen, so an image can hold no header under acknowledged records."""
    monkeypatch.setenv(mutants.ENV, "create-header-unsynced")
    result = cli_runner().invoke(main, ["powerloss", "--images", "80", "--setups",
                                        "msync,msync-background", "--seed", "1", "--json",
                                        "--quiet"])
    assert result.exit_code == 1, result.output
    reports = json.loads(result.stdout)["reports"]
    assert sum(r["recovery_errors"] + r["lost"] + r["bad"] for r in reports) > 0
