"""A shared WAL's segments that other processes made, truncated or recycled.

Concern: in a WAL open with ``shared=True``, segment files change under this process: a
peer makes the next segment first, truncates old ones (the oldest kept is in the control
file, slot ``_OLDEST``), or recycles a file this process still has mapped to a future
number.  This room finds those changes and lets go of, or takes over, this process's
mappings; it sets ``_segnos``, ``_segments``, ``_read_cache`` and ``_retired`` under the
segment lock, and never makes or removes a file.  For a WAL open in one process each call
here is a no-op (``_oldest_shared`` is 0).  docs/SHARED.md describes the protocol.
"""

from __future__ import annotations

import os

from pmemwal.segments import Segment
from pmemwal.wal.persistence import PersistenceChoice

_OLDEST = 8  # _core.Core.shared: the oldest segment a shared WAL's truncations left


class SharedSegments(PersistenceChoice):
    """The peers room (see the module docstring)."""

    def _truncated_meanwhile(self, rest: list[tuple[int, bool]]) -> None:
        """A shared WAL: the segments claimed in ``rest`` went in another process's
        truncation before this one opened them (a request for one is stale: the insert
        position had passed it): nobody waits for them."""
        with self._seg_lock:
            for n, _ in rest:
                if n in self._segnos:
                    self._segnos.remove(n)
                self._arriving.pop(n).set()

    def _made_by_peer(self, segno: int) -> bool:
        """A shared WAL: whether another process made segment ``segno`` (it is then added to
        this one's list; segment lock held).  Not while the first opener recovers, alone:
        a file recovery did not list (a damaged spare) is no other process's, and no other
        process can make one before it shares the WAL (the files lock held)."""
        if self._control is None or self._opening_alone or not hasattr(self, "_core") or \
                segno < self._oldest_shared():
            return False
        if not os.path.exists(self._dir.file(segno)):
            return False
        self._segnos.append(segno)
        self._segnos.sort()
        return True

    def _oldest_segment(self) -> int:
        """The oldest segment not truncated (by any process of a shared WAL)."""
        return max(self._segnos[0], self._oldest_shared())

    def _oldest_shared(self) -> int:
        """A shared WAL: the oldest segment the processes' truncations left (0 otherwise)."""
        if self._control is None or self._core_closed or not hasattr(self, "_core"):
            return 0  # (recovery reads before the core exists: the first opener, alone)
        return self._core.shared(_OLDEST)

    def _drop_truncated(self) -> None:
        """A shared WAL: let go of the segments another process truncated (they are
        removed, or renamed to a future number, under our mappings)."""
        if self._control is None:
            return
        with self._seg_lock:
            oldest = self._oldest_shared()
            if oldest <= self._segnos[0]:
                return
            self._forget_mappings()
            for segno in [n for n in self._read_cache if n < oldest]:
                self._read_cache.pop(segno).close()
            for segno in [n for n in self._segments if n < oldest]:
                self._core.detach(segno)
                self._retire(self._segments.pop(segno))
            for inode, seg in list(self._retired.items()):
                if os.fstat(seg.fd).st_nlink == 0:  # removed, not recycled
                    del self._retired[inode]
                    seg.close()
            self._segnos = [n for n in self._segnos if n >= oldest] or [oldest]

    def _retire(self, seg: Segment) -> None:
        """Keep a truncated segment's mapping: another process may have recycled its file to
        a future number, which this one will then map without mapping it again."""
        if seg.map is None:
            seg.close()
        else:
            self._retired[seg.inode] = seg

    def _recycled_here(self, segno: int) -> Segment | None:
        """A shared WAL: when segment ``segno``'s file is one this process still has mapped
        under the number it had before another process recycled it (the same inode), that
        segment, taken over: mapping and pre-faulting 16 MiB again in every process for
        every segment would cost about as much as appending into it at 64 KiB records."""
        if self._control is None:
            return None
        try:
            st = os.stat(self._dir.file(segno))
        except FileNotFoundError:
            return None
        inode, oldest = (st.st_dev, st.st_ino), self._oldest_shared()
        with self._seg_lock:
            for old in [n for n, seg in self._segments.items() if n < oldest]:
                self._core.detach(old)
                self._retire(self._segments.pop(old))
            return self._retired.pop(inode, None)
