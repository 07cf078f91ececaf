"""How records become durable: libpmem's cache flush, msync, or buffered mode's sync method.

Concern: choosing the persistence of an open WAL once its first segment is mapped, checking
that each later segment's mapping persists the same way, and agreeing on it with the other
processes of a shared WAL.  Sets ``persist_method`` and ``stream_min``; tells the core
(``set_persist``); reads the segment it is given, never makes one.  The device probe that
chose the mode is device.py's.
"""

from __future__ import annotations

import dataclasses
import functools

from pmemwal import _core, libpmem
from pmemwal.device import FORCE_ENV_VAR, ProbeResult, force_ignored, fs_type, probe, stream_min
from pmemwal.errors import ConfigError
from pmemwal.segments import Segment
from pmemwal.warn import warn
from pmemwal.wal.options import SYNC_METHODS
from pmemwal.wal.state import WALState


class PersistenceChoice(WALState):
    """The persistence room (see the module docstring)."""

    def _choose_persist(self, seg: Segment | None) -> None:
        """libpmem's cache flush where the mapping of ``seg`` (direct mode: the segment the
        WAL goes on in, mapped) is pmem, msync otherwise (or as the ``persist`` option
        says); or the sync method."""
        self.stream_min = None
        if not self._direct:
            if self._persist != "auto":
                raise ConfigError(f"persist={self._persist!r}: buffered mode persists with "
                                  f"sync_method ({self._sync_method}); persist is direct mode's")
            self.persist_method = self._sync_method
            self._core.set_persist(SYNC_METHODS[self._sync_method])
            return
        assert seg is not None
        lib = libpmem.load()
        pmem = self._persist != "msync" and lib is not None and self._flushes_persist(seg)
        if self._persist == "pmem" and not pmem:
            why = ("libpmem is not installed" if lib is None else
                   "libpmem does not take this mapping for persistent memory (no DAX)")
            raise ConfigError(f"persist='pmem': {why}; PMEM_IS_PMEM_FORCE=1 emulates it on "
                              "tmpfs, persist='auto' uses msync here")
        if self._control is not None:
            pmem = self._agree_persist(pmem)
        if pmem and lib is not None:
            self.persist_method = "pmem"
            self.stream_min = stream_min()
            self._core.set_persist(_core.PERSIST_PMEM, lib.addr_flush, lib.addr_drain,
                                   self.stream_min)
        else:
            self.persist_method = "msync"
            self._core.set_persist(_core.PERSIST_MSYNC)

    @functools.cached_property
    def _fs_type(self) -> str | None:
        """The WAL directory's file system type (read once: every segment made or attached
        asks, and reading the mount table costs 0.4 ms)."""
        return fs_type(self._dir.path)

    def _flushes_persist(self, seg: Segment) -> bool:
        """Whether cache flushes make stores to segment ``seg``'s mapping durable: it is
        MAP_SYNC (the probe's scratch file may be DAX where this file is not: XFS and ext4
        set DAX per inode), or libpmem takes it for persistent memory."""
        lib = libpmem.load()
        if lib is None or seg.map_sync:
            return lib is not None
        assert seg.map is not None  # (mapped by the caller)
        if not lib.is_pmem(libpmem.buffer_address(seg.map), len(seg.map)):
            return False
        if force_ignored(self._fs_type, False):
            warn(f"{FORCE_ENV_VAR}=1 is set, but {self._dir.path} is on "
                 f"{self._fs_type}, not DAX: cache flushes would leave "
                 "records in the page cache, so this WAL persists by msync",
                 RuntimeWarning)
            return False
        return True

    def _agree_persist(self, pmem: bool) -> bool:
        """A shared WAL: every process persists the same way, as the first one chose.  One
        persisting by cache flush moves the flushed position past records it only waited
        for, which in a process using msync are not synced yet: a process that would use
        cache flushes follows msync, and one that cannot flush caches is refused."""
        wanted = _core.PERSIST_PMEM if pmem else _core.PERSIST_MSYNC
        agreed = self._core.agree_persist(wanted) == _core.PERSIST_PMEM
        if pmem and not agreed and self._persist == "pmem":
            raise ConfigError("persist='pmem', but the processes sharing this WAL persist by "
                              "msync, as the first of them chose")
        if agreed and not pmem:
            raise ConfigError("the processes sharing this WAL persist by cache flush (pmem), and "
                              "this one cannot (persist='msync', no libpmem, or a mapping libpmem "
                              "does not take for pmem: PMEM_IS_PMEM_FORCE must match)")
        return agreed

    @property
    def probe(self) -> ProbeResult | None:
        """The device probe that chose the mode (mode ``"auto"``), else None.  The open
        takes the verdict only; the report's fields (CPU, governor) are read when asked."""
        if self._verdict is not None and not self._verdict_full:
            verdict = self._verdict
            self._verdict = dataclasses.replace(
                probe(self._dir.path), recommended_mode=verdict.recommended_mode,
                persist_method=verdict.persist_method, reason=verdict.reason,
                calibration=verdict.calibration)
            self._verdict_full = True
        return self._verdict

