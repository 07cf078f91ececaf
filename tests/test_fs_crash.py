"""The file-system metadata crash-state model (pmemwal/tools/fs_model.py and fs_crash.py, issue 28 item 1):
the model's rules, small runs of every workload under ext4 and xfs, and ordering bugs put
into the library on purpose (pmemwal.tools.mutants), each of which the model must catch."""

from __future__ import annotations

import os

import pytest

from pmemwal.tools import mutants
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


# ---- small runs: every workload, both file systems ---------------------------------------------

@pytest.mark.parametrize("fs", FS_MODELS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_crash_state_recovers(fs, workload):
    report = run_fs_crash(fs, 50, seed=3, workload=workload)
    assert report.ok, table([report]) + "\n" + "\n".join(report.failures[:5])
    assert report.distinct_states >= 50 and report.states_checked >= 50


def test_shared_writers_killed_mid_truncation_and_reopened_lose_nothing():
    """The control of the CONTROL mutation below: kills, reopens, CONTROL rebuilt."""
    report = run_fs_crash("ext4", 250, seed=2, workload="shared", crash_rate=0.1)
    assert report.ok and report.kills, table([report])


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
        report = run_fs_crash("ext4", 500, seed=2, workload="shared", crash_rate=0.1)
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
