"""Checkpoints: when the WAL writes one, and the durable point it names.

Concern: the ``CHECKPOINT`` file's contents come from here (its format and its atomic
write are checkpoint.py's): the point below which every record is durable, the record that
ends there, the oldest segment kept and whether the WAL closed cleanly.  The background
writer writes one when one is due (``checkpoint_interval``, ``checkpoint_bytes``), as do
``checkpoint()``, truncation (before it removes what the last one named) and close.  Sets
``_checkpoint``, ``_checkpoint_time`` and ``_position_before``; flushes, never truncates.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable

from pmemwal.checkpoint import Checkpoint
from pmemwal.format import first_lsn
from pmemwal.wal.supply import SegmentSupply

_CHECKPOINT_MIN_GAP = 0.01  # seconds: checkpoints for bytes come no closer (a synced write each)


class Checkpointing(SegmentSupply):
    """The checkpoints room (see the module docstring)."""

    def checkpoint(self) -> int:
        """Make everything appended so far durable and write a checkpoint there; returns its
        LSN.  The next open reads from it on, and takes any invalid record before it for
        damage (CorruptionError), never for the end of the WAL.  The background writer
        writes one every ``checkpoint_interval`` seconds or ``checkpoint_bytes`` bytes."""
        self._check_open()
        written = self._write_checkpoint(*self._flushed_position())
        assert written is not None  # (only a background round's is dropped)
        return written.end_lsn

    @property
    def cuts(self) -> int:
        """How many recoveries of this WAL cut records that had been durable (opened with
        ``on_corruption="truncate"``): an index of the records that a layer made before a
        cut describes other records after it (pmemwal.Log compares it)."""
        return self._cuts

    def position(self) -> tuple[int, int]:
        """(insert LSN, LSN of the last record appended, 0 if none), read together: where a
        layer keeping an index of its own stands (pmemwal.Log's index checkpoints)."""
        self._check_open()
        return self._core.position()

    def add_checkpoint_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(end_lsn)`` from the background writer's thread after each
        checkpoint it writes: a layer with an index of its own (pmemwal.Log) stores it at
        the WAL's pace.  The listener must not wait for anything close() holds."""
        self._checkpoint_listeners.append(listener)

    def _flushed_position(self) -> tuple[int, int]:
        """The insert position and the last record before it, with everything below made
        durable: a pair a checkpoint can name."""
        insert, last = self._core.position()
        if last:
            self._core.flush(last)
        return insert, last

    def _durable_point(self) -> tuple[int, int]:
        """A pair a checkpoint can name without flushing (truncation does not flush): the
        flushed LSN, and the record that ends there, found by following the record headers
        from the last checkpoint (records this WAL flushed: no CRC, a cost per record, at most
        about ``checkpoint_bytes`` of them: truncation and the background writer move it on).
        Flushes only when that chain is not there to follow (a peer truncated the
        checkpoint's segment)."""
        flushed, cp = self._core.flushed_lsn, self._checkpoint
        if cp is not None and cp.end_lsn == flushed:
            return flushed, cp.last_lsn
        oldest = first_lsn(self._oldest_segment(), self.segment_size)
        if cp is not None and oldest <= cp.end_lsn < flushed:
            status, end, last, _, _, _ = self._reader.scan(cp.end_lsn, cp.last_lsn or -1,
                                                           flushed, False)
            if status == 0 and end == flushed:
                return flushed, last or cp.last_lsn
        return self._flushed_position()

    def _background_checkpoint(self, position: tuple[int, int], flushed: int) -> None:
        """Background, after its flush: a checkpoint when one is due, at the position taken
        before the flush or, when an insertion still in progress held that back, at the one
        of the round before (long since complete)."""
        last = self._checkpoint
        before, self._position_before = self._position_before, position
        since = time.monotonic() - self._checkpoint_time
        if last is not None and since < self._checkpoint_interval and (
                flushed - last.end_lsn < self._checkpoint_bytes or since < _CHECKPOINT_MIN_GAP):
            return
        for end, prev in (position, before):
            if end and end <= flushed and (last is None or end > last.end_lsn):
                if self._write_checkpoint(end, prev, background=True) is not None:
                    for listener in self._checkpoint_listeners:
                        listener(end)
                return

    def _write_checkpoint(self, end: int, last: int, oldest: int = 0, clean: bool = False,
                          exact: bool = False, background: bool = False) -> Checkpoint | None:
        """Write a checkpoint naming ``end`` (durable: the caller flushed it), the record
        ``last`` that ends there, and the oldest segment kept: ``oldest`` or the oldest
        retained, whichever is higher.  A shared WAL's processes write it in turn (files
        lock), each never below what another wrote; ``exact``: recovery's, where it ended
        the WAL, which a cut may have moved below the last checkpoint.  A ``background``
        round's is dropped once close is under way (close writes the last)."""
        shared = self._control is not None
        # the files lock first: a shared truncation holds it when it writes one
        with (self._control.files_lock() if self._control is not None else nullcontext()), \
                self._checkpoint_lock:
            if background and self._core_closed:
                return None  # close has written the last one
            current = self._checkpoints.read() if shared or self._checkpoint is None \
                else self._checkpoint
            oldest = max(oldest, self._oldest_segment())
            if current is not None and not exact:
                if current.end_lsn > end:  # written meanwhile, by a truncation or a peer
                    end, last = current.end_lsn, current.last_lsn
                oldest = max(oldest, current.oldest_segno)
                if (current.end_lsn, current.last_lsn, current.oldest_segno, current.clean) == \
                        (end, last, oldest, clean):
                    self._checkpoint = current
                    return current
            self._checkpoint = self._checkpoints.write(end, last, oldest, clean, current,
                                                       self._cuts)
            self._checkpoint_time = time.monotonic()
            self._count("checkpoints")
            return self._checkpoint
