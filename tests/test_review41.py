"""Reviews of the background writer's check of its segment files.

Of 3db62b0..4727491 (the check only after inotify events): the first tests pass at 23bc072
(the check ran every round) and failed after it.  Of 3a85495 (own_removals, the check at
least every flush_interval, _core.unlinked): the tests from
test_a_deletion_during_a_slow_truncation_is_seen_within_intervals on failed at 3a85495."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import threading
import time

import pmemwal
import pmemwal.background as background
from conftest import SEG, seg_file

PAGE = 4096


def _stops_within(wal, seconds):
    """Whether appends with flush are refused (the writer stopped) within ``seconds``."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            wal.append(b"after", flush=True)
            time.sleep(0.005)
    except pmemwal.WriterStoppedError as exc:
        assert "deleted" in str(exc)
        return True
    return False


def _fill(wal, nbytes):
    while wal.insert_lsn < nbytes:
        wal.append(bytes(PAGE), flush=True)


def test_a_segment_replaced_by_a_rename_from_another_directory_stops_the_writer(shm_tmp):
    """``mv /elsewhere/x <wal>/<segment>`` unlinks the attached segment's inode (its link
    count falls to 0) but gives the WAL directory only IN_MOVED_TO, which the watch does
    not ask for: no inotify event.  The check every round caught it within a flush
    interval; the check after events only never runs, and acknowledged flushes go on into
    the deleted file."""
    wal_dir = shm_tmp / "wal"
    other = shm_tmp / "elsewhere"
    other.mkdir()
    with pmemwal.open(wal_dir, segment_size=SEG, flush_interval=0.01) as wal:
        while wal.insert_lsn < SEG + 4 * PAGE:
            wal.append(bytes(PAGE), flush=True)
        current = wal.insert_lsn // SEG
        time.sleep(0.1)                       # the first rounds (the pending check) are done
        replacement = other / "x"
        replacement.write_bytes(b"not a segment")
        os.replace(replacement, seg_file(wal_dir, current))   # same file system, other directory
        assert _stops_within(wal, 1.0), "acknowledged flushes went on into a deleted segment"


def test_a_segment_deleted_while_an_appender_brings_it_stops_the_writer(shm_tmp):
    """An appender makes the next segment itself (prepare_segments=0: the background writer
    makes none).  The file is deleted after it was opened and before it is in the table;
    inotify wakes the writer, whose one check looks at the table without it, and counts as
    done.  Nothing wakes it for that file again: the appender attaches the deleted file and
    its flushes are acknowledged for good."""
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, segment_size=SEG, flush_interval=0.01, prepare_segments=0) as wal:
        while wal.insert_lsn < SEG - 8 * PAGE:
            wal.append(bytes(PAGE), flush=True)
        time.sleep(0.1)                       # the first rounds (the pending check) are done
        real, gone = wal._arrived, threading.Event()

        def arrived(segno, seg, **kw):
            if segno == 1 and not gone.is_set():
                os.unlink(seg_file(wal_dir, 1))   # opened (seg.fd), not yet in the table
                gone.set()
                time.sleep(0.3)               # the writer's round for the event runs meanwhile
            return real(segno, seg, **kw)

        wal._arrived = arrived
        while wal.insert_lsn < SEG + 4 * PAGE:
            try:
                wal.append(bytes(PAGE), flush=True)
            except pmemwal.WriterStoppedError:
                break
        assert gone.is_set()
        assert _stops_within(wal, 1.0), "acknowledged flushes went on into a deleted segment"


def test_a_shared_wal_attaches_what_a_peer_made_without_waiting_for_its_timer(shm_tmp):
    """A shared WAL's writer attaches the segments other processes make (_prepare_ahead:
    "attaches the rest as other processes make or recycle them").  Their creation is a
    rename in the directory, which wakes this writer through inotify; that round no longer
    prepares, so with a long flush_interval nothing attaches them until this process's own
    insertion wakes it (or its appender stops to open them itself: a segment wait)."""
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, segment_size=SEG, shared=True, flush_interval=30) as a, \
            pmemwal.open(wal_dir, segment_size=SEG, shared=True, flush_interval=30) as b:
        a.append(b"a", flush=True)
        time.sleep(0.2)
        waited = []
        for _ in range(3):
            target = (b.insert_lsn // SEG + 3) * SEG + 4 * PAGE
            while b.insert_lsn < target:
                b.append(bytes(PAGE))
            b.flush()
            time.sleep(0.3)                   # the rename events have woken a's writer
            waits = a.stats()["segment_waits"]
            a.append(b"a again", flush=True)  # into the segment b is in
            waited.append(a.stats()["segment_waits"] - waits)
        assert waited == [0, 0, 0], "a's appender opened b's segments itself"


def test_a_deletion_during_a_slow_truncation_is_seen_within_intervals(shm_tmp):
    """_check_removed sits out while _truncate_lock is held: the whole of truncate(), not
    only the file work that own_removals keeps quiet (the checkpoint before it, with its
    fsync, here slowed as a busy device slows it).  A segment deleted meanwhile is seen
    only after the truncation: 1 s here, 100 flush intervals, not 'at least every
    flush_interval whatever woke it' (background.py's docstring)."""
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, segment_size=SEG, flush_interval=0.01) as wal:
        _fill(wal, 3 * SEG + 4 * PAGE)
        time.sleep(0.1)                       # the first rounds (the pending check) are done
        current = wal.insert_lsn // SEG
        real, entered, release = wal._write_checkpoint, threading.Event(), threading.Event()

        def slow_checkpoint(*args, **kw):
            if threading.current_thread().name == "truncator":
                entered.set()
                release.wait(5)               # the checkpoint's fsync on a busy device
            return real(*args, **kw)

        wal._write_checkpoint = slow_checkpoint
        failed = []

        def truncate():
            try:
                wal.truncate(wal.flushed_lsn)
            except Exception as exc:          # (the writer may be stopped by then)
                failed.append(exc)

        t = threading.Thread(target=truncate, name="truncator")
        t.start()
        try:
            assert entered.wait(5)
            os.unlink(seg_file(wal_dir, current))
            stopped = _stops_within(wal, 1.0)
        finally:
            release.set()
            t.join()
        assert stopped, "acknowledged flushes went on into a deleted segment for a whole truncation"


def test_a_deletion_while_a_shared_truncation_waits_for_the_files_lock_is_seen(shm_tmp):
    """A shared WAL's truncate() holds _truncate_lock while it waits for the files lock
    (flock, not fair: a peer opening the WAL, making a segment or truncating holds it),
    so this process's check sits out for as long as that wait lasts, however many
    flush intervals.  Here a peer's hold is an flock on CONTROL through another open
    file description."""
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG, flush_interval=0.01,
                      checkpoint_interval=3600) as wal:
        _fill(wal, 3 * SEG + 4 * PAGE)
        time.sleep(0.2)                       # segments ahead made, first checks done
        current = wal.insert_lsn // SEG
        peer = os.open(wal_dir / "CONTROL", os.O_RDWR)
        fcntl.flock(peer, fcntl.LOCK_EX)      # a peer holds the files lock
        failed = []

        def truncate():
            try:
                wal.truncate(wal.flushed_lsn)
            except Exception as exc:
                failed.append(exc)

        t = threading.Thread(target=truncate, name="truncator")
        t.start()
        try:
            deadline = time.monotonic() + 5
            while not wal._truncate_lock.locked() and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.05)                  # in files_lock(), waiting
            os.unlink(seg_file(wal_dir, current))
            stopped = _stops_within(wal, 1.0)
        finally:
            fcntl.flock(peer, fcntl.LOCK_UN)
            os.close(peer)
            t.join()
        assert stopped, "acknowledged flushes went on into a deleted segment while a " \
            "truncation waited for the files lock"


def test_a_watch_left_quiet_by_a_failed_restore_still_reports_deletions(shm_tmp, monkeypatch):
    """own_removals ignores inotify_add_watch's result: when restoring the mask fails
    (a transient ENOMEM here; the directory's path no longer resolving), nothing retries
    it or says so: the watch keeps IN_DELETE_SELF for the rest of the WAL's life, and
    every later deletion waits for the timer, a whole flush_interval, instead of being
    seen 'within microseconds of it'."""
    real = background._libc

    class Libc:
        fail_restores = 0  # restores to fail, once each (a transient ENOMEM)

        def inotify_init1(self, flags):
            return real.inotify_init1(flags)

        def inotify_add_watch(self, fd, path, mask):
            if self.fail_restores and mask == background._REMOVALS:
                self.fail_restores -= 1
                ctypes.set_errno(errno.ENOMEM)
                return -1
            return real.inotify_add_watch(fd, path, mask)

    libc = Libc()
    monkeypatch.setattr(background, "_libc", libc)
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, segment_size=SEG, flush_interval=3.0) as wal:
        _fill(wal, 3 * SEG + 4 * PAGE)
        time.sleep(0.2)
        libc.fail_restores = 1                # own_removals' restore fails, once
        assert wal.truncate(wal.flushed_lsn) > 0
        assert libc.fail_restores == 0
        time.sleep(0.2)                       # the check after the truncation has run
        os.unlink(seg_file(wal_dir, wal.insert_lsn // SEG))
        assert _stops_within(wal, 1.0), "a deletion after a failed restore waited for the timer"


def test_a_check_due_after_a_truncation_survives_a_check_running_meanwhile(shm_tmp):
    """own_removals marks a check due as the truncation ends; a check that was already
    running (and had looked before the deletion in the quiet window) must not clear that
    mark when it finishes, or the next look comes only a flush_interval later."""
    wal_dir = shm_tmp / "wal"
    with pmemwal.open(wal_dir, segment_size=SEG, flush_interval=30.0) as wal:
        _fill(wal, 3 * SEG + 4 * PAGE)
        time.sleep(0.2)                               # the first rounds are done
        checked, truncated = threading.Event(), threading.Event()
        check = wal._check_segments

        def slow_check():  # looks, then finishes only once the truncation has ended
            check()
            if not checked.is_set():
                checked.set()
                truncated.wait(5)

        recycle = wal._recycle_or_remove

        def delete_then_recycle(plan):  # a segment deleted inside the quiet window
            os.unlink(seg_file(wal_dir, wal.insert_lsn // SEG))
            recycle(plan)

        wal._check_segments = slow_check
        wal._recycle_or_remove = delete_then_recycle
        wal._background._check_due = True
        wal._background.wake()
        assert checked.wait(5)
        assert wal.truncate(wal.flushed_lsn) > 0
        truncated.set()
        assert _stops_within(wal, 2.0), "the check due after the truncation never ran"
