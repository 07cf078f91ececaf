"""The warm-up: the WAL filled once and truncated before the clock starts, so that the run
appends into recycled, mapped segments as a long-running log does.

It uses up the segments the WAL made ahead for its growth until a truncation recycles
what it cuts (the pool the run settles into; ``BenchConfig.recycle_segments`` sizes the
spares).  With ``archive``, truncation keeps the segments not archived yet, so the warm-up
waits until the archive has taken its own (failing at once if an upload fails) and
truncates again: the run starts with none pending.
"""

from __future__ import annotations

import errno
import os
import time

import pmemwal
from pmemwal.errors import ArchiveError

ARCHIVE_WAIT = 600.0  # s the warm-up waits for the archive to take its segments


def _warm_up(wal: pmemwal.WAL, keep: int | None, recycle: int,
             step: int | None = None) -> dict[str, int]:
    """Fill the WAL once and truncate it, so the run starts on recycled, mapped
    segments, as a long-running log would (and as the peers start on warm files);
    returns the counters to subtract from the run's.

    It appends enough past ``keep`` that the truncation fills the whole pool:
    the ``recycle`` spares, the background writer's prepared ones (the WAL's
    default 2) and the segment in progress.  With ``keep`` None (a log that keeps
    everything) it only appends: the run goes on growing the WAL.
    """
    chunk, spare = bytes(1 << 20), (recycle + 4) * wal.segment_size
    target = wal.insert_lsn + (keep or 0) + spare
    while wal.insert_lsn < target:
        wal.append_many([chunk] * 8)
    if keep is None:  # a log that keeps everything: it grows from here, never truncated
        return wal.stats()
    wal.truncate(wal.flush() - keep)  # the retained window is full from the start
    # Until that first truncation the WAL made segments ahead for its growth (wal/rounds.py:
    # _prepare_ahead); they count as spares, and truncations remove what they cut until
    # they are used: use them here, truncating every ``step`` as the run will, until a
    # truncation recycles what it cuts (the pool the run settles into).
    step = step or max(wal.segment_size, keep // 4)  # (a checkpointer's run: as the clients')
    for _ in range(_segments_ahead(wal)):
        target = wal.insert_lsn + step
        while wal.insert_lsn < target:
            wal.append(chunk)
        removed = wal.stats()["segments_removed"]
        if wal.truncate(wal.flush() - keep) and wal.stats()["segments_removed"] == removed:
            break
    if wal.archive_status() is not None:
        # truncation kept the segments the archive has not taken yet: wait for it, and
        # truncate again, so that the run starts with none pending and a full pool
        deadline = time.monotonic() + ARCHIVE_WAIT
        while not wal.wait_archived(0.1):
            status = wal.archive_status()
            assert status is not None, "the WAL archives (checked above)"
            if status["failed"] or time.monotonic() > deadline:  # no waiting on retries
                raise ArchiveError(errno.EIO, f"the warm-up's segments were not archived to "
                                   f"{status['archive']} ({status['ready']} waiting): "
                                   f"{status['last_error'] or f'not in {ARCHIVE_WAIT:g} s'}")
        wal.truncate(wal.flushed_lsn - keep)
    return wal.stats()


def _segments_ahead(wal: pmemwal.WAL) -> int:
    """Segment files past the one being appended to."""
    current = wal.insert_lsn // wal.segment_size
    return sum(1 for name in os.listdir(wal.path)
               if name.endswith(".wal") and int(name[:16], 16) > current)
