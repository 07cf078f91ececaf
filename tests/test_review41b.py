"""Review of 3a85495 (own_removals, the check at least every flush_interval, _core.unlinked).

Each test here fails at 3a85495."""

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
