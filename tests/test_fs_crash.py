"""The file-system metadata crash-state model (pmemwal/tools/fs_model.py and fs_crash.py, issue 28 item 1):
the model's rules, small runs of every workload under ext4 and xfs, and ordering bugs put
into the library on purpose (pmemwal.tools.mutants), each of which the model must catch."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest

from pmemwal.tools import fs_crash, mutants
from pmemwal.tools.fs_crash import WORKLOADS, run_fs_crash, table
from pmemwal.tools.fs_model import FS_MODELS, MetadataModel, MetaOp, Recorder


# ---- the model itself ---------------------------------------------------------------------

def _names(model: MetadataModel, current=lambda ino: b"") -> list[dict[str, bytes]]:
    return [state.files for state in model.states(current) if state.data == "old"]


def test_a_crash_keeps_each_prefix_of_the_pending_operations_and_nothing_else():
    model = MetadataModel("ext4")
    a, b = model.new_inode(), model.new_inode()
    model.record(MetaOp("create", "a", ino=a))
    model.record(MetaOp("create", "b", ino=b))
    model.record(MetaOp("unlink", "a"))
    assert [sorted(files) for files in _names(model)] == [[], ["a"], ["a", "b"], ["b"]]


def test_a_rename_is_atomic_and_replaces_its_target_in_one_step():
    model = MetadataModel("ext4")
    a, b = model.new_inode(), model.new_inode()
    for op in (MetaOp("create", "x.tmp", ino=a), MetaOp("size", ino=a, size=3, data=b"new"),
               MetaOp("create", "x", ino=b), MetaOp("size", ino=b, size=3, data=b"old")):
        model.record(op)
    model.commit()
    model.record(MetaOp("rename", "x.tmp", "x"))
    states = _names(model)
    assert {files.get("x") for files in states} == {b"old", b"new"}
    assert all(("x.tmp" in files) != (files["x"] == b"new") for files in states)  # never both,
    assert all("x" in files for files in states)                                   # never neither


def test_an_fsync_of_a_file_commits_its_size_and_every_earlier_operation():
    model = MetadataModel("ext4")
    a, b = model.new_inode(), model.new_inode()
    model.record(MetaOp("create", "a", ino=a))
    model.record(MetaOp("create", "b", ino=b))
    model.record(MetaOp("size", ino=b, size=4, data=b"data"))
    assert len(model.pending) == 3
    model.fsync(b, b"data")
    assert model.pending == []
    assert _names(model) == [{"a": b"", "b": b"data"}]


def test_an_fdatasync_commits_only_when_the_file_has_a_pending_size_or_create():
    model = MetadataModel("ext4")
    a, b = model.new_inode(), model.new_inode()
    model.record(MetaOp("create", "a", ino=a))
    model.commit()
    model.record(MetaOp("create", "b", ino=b))
    model.fdatasync(a, b"")      # a's own metadata is durable: b's create stays pending
    assert len(model.pending) == 1
    model.fdatasync(b, b"")
    assert model.pending == []


def test_ext4_keeps_appended_data_with_its_size_and_xfs_may_not():
    appended = {}
    for fs in FS_MODELS:
        model = MetadataModel(fs)
        ino = model.new_inode()
        model.record(MetaOp("create", "f", ino=ino))
        model.commit()
        model.record(MetaOp("size", ino=ino, size=5, data=b"hello"))
        appended[fs] = {state.files["f"] for state in model.states(lambda i: b"hello")}
    assert appended["ext4"] == {b"", b"hello"}
    assert appended["xfs"] == {b"", b"hello", b"\0" * 5}


def test_a_file_grown_by_writes_and_renamed_into_place_unsynced_may_be_empty():
    """Delayed allocation (ext4's default) and xfs's size update at I/O completion: a
    commit carries the rename, not the size the writes gave a file never synced."""
    for fs in FS_MODELS:
        model = MetadataModel(fs)
        ino = model.new_inode()
        model.record(MetaOp("create", "f.partial", ino=ino))
        model.record(MetaOp("size", ino=ino, size=5, data=b"hello", written=True))
        model.record(MetaOp("rename", "f.partial", dst="f"))
        model.commit()
        assert {s.files["f"] for s in model.states(lambda i: b"hello")} >= {b"", b"hello"}, fs
        model.fsync(ino, b"hello")  # its own sync: the size is its data's now
        assert {s.files["f"] for s in model.states(lambda i: b"hello")} == {b"hello"}, fs


def test_the_recorder_sees_a_create_its_size_and_syncs(tmp_path):
    model = MetadataModel("ext4")
    with Recorder(model, str(tmp_path)):
        fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
        os.pwrite(fd, b"abc", 0)
        assert [op.kind for op in model.pending] == ["create", "size"]
        os.fdatasync(fd)
        os.close(fd)
        os.rename(tmp_path / "f", tmp_path / "g")
    assert [op.kind for op in model.pending] == ["rename"]
    assert model.durable.names == {"f": 2} and model.durable.data[2] == b"abc"


def test_each_file_system_commits_only_its_own_pending_operations():
    """Two journals: a sync on one leaves the other's operations pending, and a crash keeps a
    prefix of each, independently."""
    model = MetadataModel("ext4", mounts=("far",))
    a, b, c = model.new_inode(), model.new_inode(), model.new_inode()
    model.record(MetaOp("create", "far/x", ino=c))
    model.record(MetaOp("create", "a", ino=a))
    model.record(MetaOp("create", "b", ino=b))
    assert sorted(sorted(files) for files in _names(model)) == [
        [], ["a"], ["a", "b"], ["a", "b", "far/x"], ["a", "far/x"], ["far/x"]]
    model.fsync(b, b"")          # the root's file system: far/x's create stays pending
    assert [op.path for op in model.pending] == ["far/x"]
    assert sorted(sorted(files) for files in _names(model)) == [["a", "b"], ["a", "b", "far/x"]]
    model.record(MetaOp("rename", "far/x", "far/y"))
    model.commit(0)              # the root's directory synced: nothing of far's commits
    assert len(model.pending) == 2
    model.commit(1)
    assert model.pending == [] and sorted(model.durable.names) == ["a", "b", "far/y"]


def test_the_recorder_keeps_a_journal_per_mount_and_refuses_a_rename_across(tmp_path):
    model = MetadataModel("ext4")
    with Recorder(model, str(tmp_path), mounts=("far",)):
        (tmp_path / "f").write_bytes(b"abc")
        with pytest.raises(OSError) as refused:
            os.rename(tmp_path / "f", tmp_path / "far" / "f")
        assert refused.value.errno == errno.EXDEV and (tmp_path / "f").exists()
        shutil.move(tmp_path / "f", tmp_path / "far" / "g")  # falls back to copy + unlink
        fd = os.open(tmp_path, os.O_RDONLY)
        os.fsync(fd)             # the root's directory: the unlink commits, the copy does not
        os.close(fd)
        assert [op.kind for op in model.pending if op.mount == 1] == ["create", "size"]
        assert model.pending and all(op.mount == 1 for op in model.pending)
        fd = os.open(tmp_path / "far", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    assert model.pending == [] and sorted(model.durable.names) == ["far/g"]


# ---- small runs: every workload, both file systems ---------------------------------------------

@pytest.mark.parametrize("fs", FS_MODELS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_crash_state_recovers(fs, workload):
    report = run_fs_crash(fs, 50, seed=3, workload=workload)
    assert report.ok, table([report]) + "\n" + "\n".join(report.failures[:5])
    assert report.distinct_states >= 50 and report.states_checked >= 50
    if workload == "background":  # the writer's creates, slot writes and syncs: crash points
        assert 0 < report.background_points < report.crash_points


def test_shared_writers_killed_mid_truncation_and_reopened_lose_nothing():
    """The control of the CONTROL mutation below: kills, reopens, CONTROL rebuilt."""
    report = run_fs_crash("ext4", 250, seed=2, workload="shared", crash_rate=0.1)
    assert report.ok and report.kills, table([report])


def test_a_thread_pausing_the_recorder_does_not_hide_another_threads_operations(tmp_path):
    """While one thread is paused (enumerating a crash's states), another's create is still
    recorded, once that one's states are done (the lock)."""
    import threading
    model = MetadataModel("ext4")
    recorder = Recorder(model, str(tmp_path))
    paused, go = threading.Event(), threading.Event()

    def pause_a_while() -> None:
        with recorder.lock, recorder.pause():
            paused.set()
            go.wait(5)

    with recorder:
        pauser = threading.Thread(target=pause_a_while)
        pauser.start()
        paused.wait(5)
        creator = threading.Thread(target=lambda: os.close(os.open(
            tmp_path / "made", os.O_CREAT | os.O_WRONLY)))
        creator.start()
        creator.join(0.2)
        assert creator.is_alive()  # it waits for the paused thread's lock
        go.set()
        creator.join(5)
        pauser.join(5)
    assert [(op.kind, op.path) for op in model.pending] == [("create", "made")]


def test_crash_states_with_metadata_not_yet_durable_are_many():
    reports = [run_fs_crash("ext4", 100, seed=5, workload=w) for w in ("recycle", "archive")]
    assert all(r.ok for r in reports), table(reports)
    assert sum(r.metadata_states for r in reports) >= 10


# ---- ordering bugs put in on purpose (pmemwal.tools.mutants) ---------------------------------

def _refusals(report) -> list[str]:
    return [f for f in report.failures if f.startswith("refused")]


def test_a_recycle_without_a_sync_after_its_first_rename_fails():
    with mutants.applied("recycle-without-first-sync"):
        report = run_fs_crash("ext4", 150, seed=1, workload="recycle")
    assert not report.ok
    # the old name survives over the new header: the WAL no longer opens
    assert any("header says segment" in f for f in _refusals(report)), report.failures[:3]


def test_a_recycle_writing_its_header_before_the_rename_is_durable_fails():
    with mutants.applied("recycle-header-first"):
        report = run_fs_crash("xfs", 150, seed=1, workload="recycle")
    assert not report.ok
    assert any("header says segment" in f for f in _refusals(report)), report.failures[:3]


def test_control_rebuilt_from_a_half_renamed_segment_set_fails():
    """The first opener of a shared WAL rebuilds CONTROL from the segments it finds.  Left
    without the directory syncs that make what it found durable first (WAL._open's, and the
    one _make_segments makes before attaching a segment it did not create: either alone
    suffices), it builds on a rename that writers killed mid-recycle never synced, and
    acknowledges records in that segment that a power cut then takes away."""
    with mutants.applied("control-from-unsynced-segments"):
        report = run_fs_crash("ext4", 300, seed=2, workload="shared")
    assert report.kills and report.lost, table([report])
    assert any("had been acknowledged" in f for f in report.failures), report.failures[:3]


def test_an_archive_copy_renamed_into_place_unsynced_fails():
    """FsspecArchive.store without the fsync of its .partial copy: the rename into place
    persists, the copy's data may not (ext4's delayed allocation)."""
    with mutants.applied("archive-partial-unsynced"):
        report = run_fs_crash("ext4", 120, seed=1, workload="archive")
    assert not report.ok and report.lost, table([report])


def test_a_done_status_before_the_upload_fails():
    """A durable .done lets a reopened writer truncate the segment: the archive must hold it."""
    with mutants.applied("done-before-upload"):
        report = run_fs_crash("ext4", 150, seed=1, workload="archive")
    assert not report.ok and any(".done is durable" in f for f in report.failures), \
        report.failures[:3]


def test_an_archive_renamed_into_place_without_syncing_its_own_directory_fails():
    """The archive is a file system of its own: the WAL directory's sync of the .done status
    does not carry the archive's rename, so a state holds the .done and no archived copy.  With
    one journal for both (the archive on the WAL's file system) the same run passes."""
    with mutants.applied("archive-rename-unsynced"):
        report = run_fs_crash("ext4", 40, seed=0, workload="archive")
        assert not report.ok and any(".done is durable" in f for f in report.failures), \
            table([report])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fs_crash.ArchiveWorkload, "mounts", ())
            one_journal = run_fs_crash("ext4", 40, seed=0, workload="archive")
        assert one_journal.ok, table([one_journal])


def test_a_mutant_named_in_the_environment_stays_in_for_the_process():
    """PMEMWAL_MUTANT as a checker's child applies it: the patch must outlive the call."""
    code = ("from pmemwal import archive; f = archive.fsync_path; from pmemwal.tools import "
            "mutants; mutants.apply_from_environment(); assert archive.fsync_path is not f")
    env = {**os.environ, mutants.ENV: "archive-rename-unsynced"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


# ---- per-file data outcomes, and the Log's index ---------------------------------------------

def _per_file(model: MetadataModel, current, n: int = 200) -> list[dict[str, bytes]]:
    import random
    return [s.files for s in model.states(current, n, random.Random(0))
            if s.data.startswith("per file")]


def test_each_file_takes_a_data_outcome_of_its_own():
    """Two files written since their last sync: a crash may keep one's new data and lose the
    other's (the kernel wrote back one on its own), either way round."""
    model = MetadataModel("ext4")
    a, b = model.new_inode(), model.new_inode()
    for ino, name in ((a, "a"), (b, "b")):
        model.record(MetaOp("create", name, ino=ino))
        model.record(MetaOp("size", ino=ino, size=3, data=b"old"))
    model.commit()
    for ino in (a, b):
        model.fsync(ino, b"old")
        model.wrote(ino, ("w", 0, b"new"))
    seen = {(f["a"], f["b"]) for f in _per_file(model, lambda ino: b"new")}
    assert seen == {(b"old", b"old"), (b"old", b"new"), (b"new", b"old"), (b"new", b"new")}


def test_a_file_may_come_back_as_a_version_between_syncs_or_a_mix_of_pages():
    """Written twice since its last sync: the first write's version may be what is on disk
    (a later write lost), and each 4 KiB page (or sector) may be of another version."""
    page = 4096
    old, mid, new = b"o" * 2 * page, b"m" * page + b"o" * page, b"m" * page + b"n" * page
    model = MetadataModel("ext4")
    f = model.new_inode()
    model.record(MetaOp("create", "f", ino=f))
    model.record(MetaOp("size", ino=f, size=len(old), data=old))
    model.fsync(f, old)
    model.wrote(f, ("w", 0, b"m" * page))
    model.wrote(f, ("w", page, b"n" * page))
    seen = {files["f"] for files in _per_file(model, lambda ino: new)}
    assert {old, mid, new, b"o" * page + b"n" * page} <= seen  # (the last: pages of old / new)
    assert all(len(data) == len(old) for data in seen)
    model.fdatasync(f, new)
    assert _per_file(model, lambda ino: new) == []  # one version: nothing drawn


def test_the_recorder_keeps_each_write_since_the_last_sync(tmp_path):
    model = MetadataModel("ext4")
    with Recorder(model, str(tmp_path)) as recorder:
        fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
        os.pwrite(fd, b"aaaa", 0)
        os.fsync(fd)
        os.pwrite(fd, b"bb", 0)
        os.write(fd, b"c")   # (at offset 0: the pwrites left the position there)
        ino = recorder.inodes[os.fstat(fd).st_ino]
        assert [model.version(ino, n) for n in range(3)] == [b"aaaa", b"bbaa", b"cbaa"]
        os.fdatasync(fd)
        os.close(fd)
        assert model.writes.get(ino) is None and model.base[ino] == b"cbaa"


def _log_run(states: int, seed: int, monkeypatch) -> tuple:
    opened = []
    check = fs_crash.LogFsWorkload.check

    def counted(self, *args):
        verdict = check(self, *args)
        opened[:] = [self.indexed, self.rebuilt]
        return verdict

    monkeypatch.setattr(fs_crash.LogFsWorkload, "check", counted)
    return run_fs_crash("ext4", states, seed=seed, workload="log"), opened


def test_the_log_and_its_index_recover_from_every_crash_state(monkeypatch):
    report, (indexed, rebuilt) = _log_run(40, 1, monkeypatch)
    assert report.ok, table([report]) + "\n" + "\n".join(report.failures[:5])
    assert report.per_file_states and indexed > rebuilt  # (the states use their stored index)


def test_an_index_checkpoint_without_its_chunks_fdatasync_fails(monkeypatch):
    """The LOG slot then names entries whose chunk slots a power cut leaves as zeros: the
    Log no longer opens (or reads another record as an entry)."""
    with mutants.applied("index-chunk-unsynced"):
        report, _ = _log_run(20, 1, monkeypatch)
    assert not report.ok, table([report])
    assert any("index" in f or "entry" in f or "entries" in f for f in report.failures), \
        report.failures[:3]


def test_an_eventsourcing_run_file_without_its_fdatasync_fails_only_file_by_file():
    """A run file (key pairs found by hash) named by the manifest while unsynced: whole-state
    outcomes keep it whole or without its size, which the open refuses and rebuilds from;
    only a version with its size and some pages of zeros shows events select_events misses."""
    with mutants.applied("es-run-unsynced"):
        whole = run_fs_crash("ext4", 30, seed=1, workload="eventsourcing", per_file=0)
        per_file = run_fs_crash("ext4", 30, seed=1, workload="eventsourcing")
    assert whole.ok, table([whole])
    assert not per_file.ok and per_file.lost, table([per_file])
    assert any(".run " in f and "select_events does not return" in f
               for f in per_file.failures), per_file.failures[:3]


def test_crash_points_name_the_library_functions_that_made_the_call(tmp_path):
    """The recorder's own frames (its lock included) are left out of a crash point's name."""
    points: list[str] = []
    recorder = Recorder(MetadataModel("ext4"), str(tmp_path), on_point=points.append)

    def make_it() -> None:
        os.close(os.open(tmp_path / "made", os.O_CREAT | os.O_WRONLY))

    with recorder:
        make_it()
    assert points == ["open in make_it < test_crash_points_name_the_library_functions_that_made_the_call"]
