"""The background writer's rounds: segments made ahead, the asynchronous flush, a due checkpoint.

Concern: what the WAL's background thread (background.py: when it runs) does each round.
``_prepare_ahead`` has the next segments ready before an appender reaches them, as many as
the WAL's growth needs (growth.py measures it) before its first truncation, and as the spare
pool needs after; ``_check_removed``, when the directory changed or an interval passed,
that no segment was deleted; ``_flush_async`` that no follower killed asleep is left for
every flush to wake, then makes asynchronously appended records durable, writes a
checkpoint when one is due and hands complete segments to the archiver.  Sets
``_notify_ahead`` (the depth the core wakes the writer at); brings segments through
supply.py, never removes one.
"""

from __future__ import annotations

import os
from typing import cast

from pmemwal.background import BackgroundWriter
from pmemwal.growth import small_mark
from pmemwal.wal.state import _weak
from pmemwal.wal.truncation import _MAX_AHEAD, Truncation

_BRINGS_PER_ROUND = 4  # segments a background round makes or attaches before its flush


class BackgroundRounds(Truncation):
    """The rounds room (see the module docstring)."""

    def _start_background(self, flush_interval: float) -> None:
        self._background = BackgroundWriter(_weak(self, "_prepare_ahead"), _weak(self, "_check_removed"),
                                            _weak(self, "_flush_async"),
                                            flush_interval, f"pmemwal-writer {self._dir.path}",
                                            watch=self._dir.path)
        # the core wakes it when a segment within this depth is missing, and at the first
        # insertion: segments ahead are made once the WAL grows, not at the first timed round
        self._core.set_notify(self._background.notify_fd, self._notify_ahead)

    def _prepare_ahead(self) -> None:
        """Background: have the next segments ready and attached (those a truncation is
        recycling into place are left to it), as many as the most of:

        - prepare_segments, once the WAL shows growth (none while it holds a few records in
          the segment it was opened in: growth.py, ``small``);
        - until this process's first truncation, the WAL's growth over a few times the
          slowest recent make (growth.py), within a quarter of max_wal_size: a log that
          keeps everything fills them no faster than the machine makes them, and a burst
          or a slower make does not reach the end of them.  A shared WAL makes only
          prepare_segments of them and attaches the rest as other processes make or
          recycle them (one of them may be truncating: spares made here would be its
          surplus);
        - after it, what is left of twice the typical distance between two truncations
          once the WAL's advance since the last one is taken off.  Truncation alone cannot
          build that pool: in a steady state it recycles as many segments as the appenders
          used since the last one.  Taking the advance off leaves the next truncation to
          refill what the appenders use, so the background makes segments only for a WAL
          outrunning its truncations (then kept: the late truncation raises the spare
          target), never ones the next truncation removes as surplus.  Those made ahead
          before the first truncation count as its spares, so it removes what it cuts
          rather than recycle more than the pool needs.

        The core wakes this writer when an insertion enters a segment and any of that many
        after it is missing, so each segment taken starts the making of the next.  A round
        brings a few segments, then flushes, and goes on in the next round."""
        if self._closed or self._core.error or not self._prepare_segments:
            return
        insert = self._core.insert_lsn
        current = insert // self.segment_size
        self._growth.observe(insert)
        with self._seg_lock:
            growing = self._growing()
            ahead, make_ahead = self._segments_wanted_ahead(insert, growing)
        # (a small WAL keeps the depth it had: the append that passes its mark then finds
        # segments missing, and wakes this writer)
        depth = ahead or self._notify_ahead
        mark = 0 if ahead else current * self.segment_size + small_mark(self.segment_size)
        if (depth, mark) != (self._notify_ahead, self._notify_mark) and \
                self._background is not None:
            self._notify_ahead, self._notify_mark = depth, mark
            self._core.set_notify(self._background.notify_fd, depth, mark)
            if mark and self._core.insert_lsn >= mark:
                # appends passed it while this round decided (an append that reserved before
                # the mark was set, and read it unset once done, shows here too): at once
                self._notify_mark = 0
                self._background.wake()
        brought = 0
        for segno in range(current, current + ahead + 1):
            if growing and not self._growing():
                return  # a truncation came meanwhile: its pool, not the growth, decides
            if segno in self._arriving:
                continue
            seg = self._segments.get(segno)
            if seg is not None:  # a spare once it is near: armed and attached
                if seg.spare and self._near(segno):
                    self._ensure_segment(segno)
                continue
            if segno > current + make_ahead and segno not in self._segnos and \
                    not os.path.exists(self._dir.file(segno)):
                return  # attached only once another process makes it
            if brought == _BRINGS_PER_ROUND and self._background is not None:
                self._background.wake()  # the round's flush first, then the rest
                return
            self._ensure_segment(segno)
            self._count("segments_prefaulted")
            brought += 1

    def _segments_wanted_ahead(self, insert: int, growing: bool) -> tuple[int, int]:
        """_prepare_ahead's depth, and how many of it this process may make (the rest it
        only attaches); segment lock held."""
        current = insert // self.segment_size
        retained = sum(1 for s in self._segnos if s <= current)
        shared_growth = self._control is not None and self._last_truncation_lsn is None
        if growing and self._growth.small(insert, self.segment_size):
            return 0, 0     # (a few records: one segment, not three; growth.py)
        if growing or shared_growth:
            ahead = min(self._growth.segments_ahead(self.segment_size),
                        self._max_wal_size // self.segment_size // 4, _MAX_AHEAD)
        else:
            since = insert - cast(int, self._last_truncation_lsn)  # (truncated: set)
            ahead = self._spares_within(2 * self._typical_distance - since, retained)
        ahead = min(max(self._prepare_segments, ahead), _MAX_AHEAD)
        return ahead, self._prepare_segments if shared_growth else ahead

    def _growing(self) -> bool:
        """Whether truncate() has not been called since the WAL was opened (a call that cuts
        nothing counts: it starts the distance to the next) and the WAL is not shared: its
        segments made ahead then follow its growth.  (A shared WAL's follow it only as far
        as prepare_segments; further, it attaches what others made: _prepare_ahead.)"""
        return self._last_truncation_lsn is None and self._control is None

    def _check_removed(self) -> None:
        """Background, after a change in the directory and at least every flush_interval:
        stop the writer if a segment file it holds was deleted (background.py: when).  A
        truncation meanwhile is no reason to wait: the segments it cuts leave the table
        before their files are touched, and those it recycles keep their link."""
        if self._closed or self._core.error:
            return
        self._check_segments()

    def _flush_async(self) -> None:
        """Background: make asynchronously appended records durable."""
        if self._closed or self._core.error:
            return
        if self._control is not None:
            self._core.reap_dead()  # a peer that died mid-insert, even if nobody waits for it
        if self._follow is not None:  # a follower killed asleep: every flush would wake it
            self._follow.clear_dead_sleepers()
        position = self._core.position()
        flushed = self._core.flushed_lsn
        if position[0] != flushed:
            flushed = self._core.flush_ready()
        self._background_checkpoint(position, flushed)
        if self._archiver is not None:
            self._archiver.tick(self._oldest_segment(), self._core.flushed_lsn)

    def on_writer_thread(self) -> bool:
        """Whether the caller runs on this WAL's background writer (in a checkpoint
        listener), where ``close`` must not be called: it waits for that thread to end."""
        background = getattr(self, "_background", None)
        return background is not None and background.is_current()
