"""Review of 3db62b0..4727491 (the background round: check only after inotify events).

Each test here passes at 23bc072 (the check ran every round) and fails after it."""

from __future__ import annotations

import os
import threading
import time


import pmemwal
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
