"""Truncation: segments below a point removed or recycled, and the pool of spares sized.

Concern: ``truncate(before_lsn)``.  The checkpoint naming the new oldest segment is written
first (checkpoints.py), then the segments below it leave the table under the segment lock
(``_release_below``, which also reserves each recycled file's future number), and the file
work happens after the lock is released (``_recycle_or_remove``: each file renamed to a
future number with its header rewritten, by segments.py's ``WalDirectory.recycle``, or
removed, oldest first).  How many to keep as spares follows the WAL's advance between two
truncations (``_spare_target``, PostgreSQL's CheckPointDistanceEstimate) within
``max_wal_size``.  A shared WAL truncates under the files lock, raising the oldest segment
in the control file first (peers.py reads it).  Sets ``_segnos``, ``_segments`` and the
distance estimates; appenders never take its lock.
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager, nullcontext

from pmemwal import _core
from pmemwal.errors import ClosedError
from pmemwal.segments import Segment
from pmemwal.wal.checkpoints import Checkpointing
from pmemwal.wal.peers import _OLDEST

# Segments made ahead (or kept as spares) at most: the core's table of attached segments is
# indexed by number modulo SEG_TABLE, and one that far ahead would evict the current one.
_MAX_AHEAD = _core.SEG_TABLE // 4


class Truncation(Checkpointing):
    """The truncation room (see the module docstring)."""

    def truncate(self, before_lsn: int) -> int:
        """Remove or recycle the segments wholly below ``before_lsn`` (and the flushed LSN).

        Returns how many segments went.  Appenders do not wait for it: the segment table
        changes under the segment lock, and the files are renamed, rewritten, removed and
        synced after it is released (an appender that reaches a segment still being
        recycled into place waits for that one).  Truncations run one at a time.
        """
        self._check_open()
        with self._truncate_lock:
            if self._core_closed:  # close ran since the check (it holds this lock to close)
                raise ClosedError("the WAL is closed")
            cut = self._archived_cut(min(before_lsn, self._core.flushed_lsn) // self.segment_size)
            cut = min(cut, self._segnos[-1])  # the newest segment stays (the flushed LSN can
            # lie at the first byte of one not made yet)
            cut = self._followers_cut(cut)
            if self._control is None:
                if cut > self._oldest_segment():  # the checkpoint first: see checkpoint.py
                    self._write_checkpoint(*self._durable_point(), oldest=cut)
                    self._publish_oldest(cut)
                with self._seg_lock:
                    plan = self._release_below(cut)
                with self._own_removals(plan):
                    self._recycle_or_remove(plan)
            else:
                plan = self._truncate_shared(cut)
        background = self._background
        if plan and background is not None:
            background.wake()  # the check its own removals are due (own_removals)
        return len(plan)

    def _own_removals(self, plan: list[tuple[int, int | None, Segment | None]]) \
            -> AbstractContextManager[None]:
        """The background writer's watch quiet while ``plan``'s files are renamed and
        removed (BackgroundWriter.own_removals); truncate() wakes it for the check after."""
        background = self._background
        return background.own_removals() if plan and background is not None else nullcontext()

    def _followers_cut(self, cut: int) -> int:
        """``cut`` lowered to keep what a named follower has not confirmed, unless it fell
        further than ``max_follower_lag_bytes`` behind (then it is marked lost)."""
        if self._follow is None or cut <= self._oldest_segment():
            return cut
        return max(self._follow.hold_back(cut, self._core.flushed_lsn, self._max_follower_lag),
                   self._oldest_segment())

    def _publish_oldest(self, cut: int) -> None:
        """Before the files go: followers in other processes take what they read from the
        segments below ``cut`` from here on as truncated (their copies are checked after)."""
        if self._follow is not None:
            self._follow.raise_oldest(cut)

    def _archived_cut(self, cut: int) -> int:
        """``cut`` lowered to the oldest segment not archived yet, counting what that keeps."""
        if self._archiver is None:
            return cut
        archived = self._archiver.archived_below(self._oldest_segment())
        if archived < cut:
            self._archiver.kept(sum(1 for s in self._segnos if archived <= s < cut))
        return min(cut, archived)

    def _truncate_shared(self, cut: int) -> list[tuple[int, int | None, Segment | None]]:
        """A shared WAL's truncation: under the files lock, with the segment list read
        again (other processes make segments too), the checkpoint naming ``cut`` written
        (its point found before the lock: finding it may flush, and a flush may wait for a
        peer's insertion that needs the lock for a segment) and the oldest segment raised
        first, so that the
        others take what goes as truncated, not as deleted under them.  Nothing to cut
        takes no lock: processes that truncate often would keep one that waits to open the
        WAL or make a segment from ever getting it (flock is not fair)."""
        if cut <= self._oldest_shared():
            return []
        position = self._durable_point()
        assert self._control is not None  # (a shared WAL's)
        with self._control.files_lock():
            self._write_checkpoint(*position, oldest=cut)
            self._core.shared(_OLDEST, cut)
            self._publish_oldest(cut)
            with self._seg_lock:  # our own mappings of what goes are recycled with it
                on_disk = self._dir.list_segments(tidy=False)
                self._segnos = sorted(set(on_disk) | set(self._arriving))
                plan = self._release_below(cut)
            with self._own_removals(plan):
                self._recycle_or_remove(plan)
        return plan

    def _release_below(self, cut: int) -> list[tuple[int, int | None, Segment | None]]:
        """Take the segments below ``cut`` out of the table (segment lock held): for each,
        (its number, the future number it is recycled to or None to remove it, its open
        Segment if any).  Future numbers are reserved at once, so that no appender makes a
        new file under one while the recycled file is renamed into it."""
        current = self._core.insert_lsn // self.segment_size
        self._estimate_distance(self._core.insert_lsn)  # (one that cuts nothing starts a distance)
        victims = [s for s in self._segnos if s < cut]
        spares = sum(1 for s in self._segnos if s > current)
        target = self._spare_target(sum(1 for s in self._segnos if cut <= s <= current))
        plan = []
        self._forget_mappings()
        for segno in victims:
            self._core.detach(segno)
            seg, cached = self._segments.pop(segno, None), self._read_cache.pop(segno, None)
            if cached is not None:
                cached.close()
            self._segnos.remove(segno)
            new = None
            if spares < target:
                new = self._segnos[-1] + 1
                self._segnos.append(new)
                self._arriving[new] = threading.Event()
                spares += 1
            plan.append((segno, new, seg))
        return plan

    def _recycle_or_remove(self, plan: list[tuple[int, int | None, Segment | None]]) -> None:
        """The file work of a truncation, oldest segment first (a crash part-way leaves the
        oldest ones gone, never a gap); the segment lock is not held."""
        for i, (segno, new, seg) in enumerate(plan):
            try:
                if new is None:
                    if seg is not None:
                        seg.close()
                    self._dir.remove(segno)
                    self._count("segments_removed")
                else:
                    self._lower_made(new)
                    spare = self._control is None  # (a shared WAL's peers attach at once)
                    self._dir.recycle(segno, new, self.segment_size, self.wal_id,
                                      seg.fd if seg else -1, spare=spare)
                    if seg is not None:
                        seg.spare = spare
                    self._recycled(new, seg)
                if self._archiver is not None:
                    self._archiver.forget(segno)
            except BaseException:
                self._abandon_recycling(plan[i:])
                raise

    def _lower_made(self, segno: int) -> None:
        """Before a recycled file becomes segment ``segno``: the segments below it that this
        process has on their way exist.  One process's WAL waits for them; a shared WAL
        holds the files lock here, which they need, so it makes their files itself (the
        threads bringing them then find them made)."""
        if self._control is None:
            self._await_lower(segno)
            return
        with self._seg_lock:  # (none below the oldest: this truncation may have taken them)
            oldest = self._oldest_shared()
            lower = sorted(n for n in self._arriving if oldest <= n < segno)
        for n in lower:
            if not os.path.exists(self._dir.file(n)):
                self._dir.create(n, self.segment_size, self.wal_id)

    def _recycled(self, new: int, seg: Segment | None) -> None:
        """A recycled file is in place as segment ``new``: an open one stays open and
        mapped, and is attached, so the writer finds its pages allocated and faulted in."""
        if seg is not None:
            self._arrived(new, seg, recycled=True)
            return
        with self._seg_lock:
            self._count("segments_recycled")
            self._arriving.pop(new).set()

    def _abandon_recycling(self, rest: list[tuple[int, int | None, Segment | None]]) -> None:
        """A truncation failed: the future numbers it had not filled are free again (an
        appender reaching one makes a new file), and their old files stay where they are,
        closed.  One recycled into place (in the table: its arming may be what failed, or
        what followed) stays open there."""
        with self._seg_lock:
            for _, new, seg in rest:
                if seg is not None and (new is None or self._segments.get(new) is not seg):
                    seg.close()
                if new is not None and new in self._arriving:
                    self._segnos.remove(new)
                    self._arriving.pop(new).set()

    def _estimate_distance(self, insert_lsn: int) -> None:
        """Fold the WAL's advance since the last truncation into the estimates: a larger
        one is taken at once, a smaller one decays it slowly (PostgreSQL's
        CheckPointDistanceEstimate), so a burst does not leave the next one short; and
        the moving average, which never exceeds it.  The decay is 2 % a truncation, not
        PostgreSQL's 10 %: its checkpoints are minutes apart, ours can be 20 ms, and at
        10 % a late truncation was forgotten within a fraction of a second, so the
        spares it had the background make were removed and made again."""
        if self._last_truncation_lsn is not None:
            distance = insert_lsn - self._last_truncation_lsn
            largest, typical = self._truncation_distance, self._typical_distance
            self._truncation_distance = (distance if distance > largest
                                         else 0.98 * largest + 0.02 * distance)
            self._typical_distance = 0.9 * typical + 0.1 * distance if typical else distance
        self._last_truncation_lsn = insert_lsn

    def _spare_target(self, retained: int) -> int:
        """Future segments a truncation keeps, recycled or made ahead by the background
        writer: those for 2.5 times the largest recent distance, at least
        recycle_segments, plus the background writer's pipeline.  PostgreSQL keeps about
        2.2 times (checkpoint_completion_target and 10 %) for a checkpoint that comes
        late; the background writer makes segments up to twice the typical distance, and
        the margin between the two absorbs truncations that come a few segments early or
        late, which would otherwise have one make what the other removes.  At most
        _MAX_AHEAD, whatever recycle_segments says: a spare that far ahead would take the
        entry of the segment being written in the core's table."""
        wanted = self._spares_within(2.5 * self._truncation_distance, retained)
        return min(max(self._recycle_segments, wanted) + self._pipeline_depth(), _MAX_AHEAD)

    def _spares_within(self, nbytes: float, retained: int) -> int:
        """Segments for ``nbytes`` of WAL, within max_wal_size beside the ``retained``
        segments."""
        room = self._max_wal_size // self.segment_size - retained
        return max(0, min(self._segments_for(nbytes), room, _MAX_AHEAD))

    def _segments_for(self, nbytes: float) -> int:
        """Segments that ``nbytes`` of WAL fill, rounded up."""
        return -(-int(nbytes) // self.segment_size)

    def _pipeline_depth(self) -> int:
        """Future segments the background writer keeps ready (they count as spares)."""
        return self._prepare_segments if self._background is not None else 0
