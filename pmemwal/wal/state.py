"""The state the WAL's rooms share: its fields, their first values, and its counters.

A WAL is one object whose methods live in rooms, a module each, stacked so that each room
may call the rooms below it and never those above (PostgreSQL 15 split xlog.c by concern the
same way, around one shared XLogCtl):

    state → persistence → peers → supply → checkpoints → truncation → rounds → opening → api

This module declares every field that more than one room reads; a room's docstring says
which fields it sets.  Fields declared without a value here are set while opening
(opening.py): ``hasattr(self, "_core")`` is how the rooms tell that the core exists yet.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from pmemwal.errors import ClosedError
from pmemwal.growth import GrowthPace
from pmemwal.segments import Segment, WalDirectory

if TYPE_CHECKING:
    from pmemwal import _core as native
    from pmemwal.archiver import Archiver
    from pmemwal.background import BackgroundWriter
    from pmemwal.checkpoint import Checkpoint, CheckpointFile
    from pmemwal.control import ControlFile
    from pmemwal.follow_file import FollowFile
    from pmemwal.device import ProbeResult

# The WAL's own counters (stats()), in the order a shared WAL keeps them in its control file.
COUNTERS = ("segments_created", "segments_recycled", "segments_removed", "segments_prefaulted",
            "segment_make_ns", "checkpoints", "segment_waits")


class WALState:
    """The fields of one open WAL.  Set while opening (opening.py and persistence.py):"""

    _dir: WalDirectory           # the WAL directory, locked (api.py sets it first)
    segment_size: int
    wal_id: bytes
    _wal_id_lo: int              # the first 4 bytes of wal_id, in every page header
    _segnos: list[int]           # segment numbers retained (on disk, or claimed to be made)
    mode: str                    # "buffered" or "direct"
    _direct: bool
    _map_sync: bool              # the probe found MAP_SYNC (DAX): map segments with it
    _verdict: ProbeResult | None
    _verdict_full: bool
    _reader: native.Reader
    _core: native.Core           # absent until the core starts (recovery runs before)
    _checkpoints: CheckpointFile
    persist_method: str          # "pmem", "msync" or buffered mode's sync method
    stream_min: int | None       # pmem: records streamed past the cache from this size on
    recovery: dict[str, Any] | None  # what this open's recovery found (None: a shared joiner)
    max_record_size: int

    def _init_state(self, *, insertion: str, prepare_segments: int, prefault: bool,
                    sync_method: str, persist: str, recycle_segments: int, max_wal_size: int,
                    checkpoint_interval: float, checkpoint_bytes: int) -> None:
        """The fields' first values, from the options (options.py checked them)."""
        # the WAL's life: api.py
        self._closed = True
        self._core_closed = False
        self._insertion = insertion
        self._archiver: Archiver | None = None
        self._background: BackgroundWriter | None = None
        self._control: ControlFile | None = None  # a shared WAL's CONTROL
        self._follow: FollowFile | None = None    # FOLLOW: progress for readers elsewhere
        self._max_follower_lag = 0                # (api.py sets it)
        self._counters = dict.fromkeys(COUNTERS, 0)
        # persistence.py
        self._sync_method = sync_method
        self._persist = persist
        # the segment table: supply.py and peers.py
        self._prepare_segments = prepare_segments if prefault else 0
        self._prefault = prefault
        self._segments: dict[int, Segment] = {}
        self._read_cache: OrderedDict[int, Segment] = OrderedDict()
        self._seg_lock = threading.RLock()      # the segment table; appenders may need it
        self._arriving: dict[int, threading.Event] = {}  # segments being made, opened or recycled
        self._retired: dict[tuple[int, int], Segment] = {}  # shared: truncated, mapped, by inode
        self._needed = 0  # the furthest segment the core asked for (supply.py: _near)
        # checkpoints.py
        self._checkpoint_interval = checkpoint_interval
        self._checkpoint_bytes = checkpoint_bytes
        self._checkpoint_lock = threading.Lock()  # one checkpoint written at a time
        self._checkpoint: Checkpoint | None = None    # the last one this process read or wrote
        self._cuts = 0  # recoveries that cut durable records (checkpoint.py: cuts)
        self._opened_at = 0  # the insert LSN the open left (opening.py)
        self._checkpointed = False  # a segment header says the WAL kept a CHECKPOINT
        self._header_cuts = 0  # the highest count of cuts a segment header holds
        self._damage_read = False  # a read raised CorruptionError (api.py: close)
        self._checkpoint_time = time.monotonic()
        self._position_before = (0, 0)  # the background's position snapshot of its last round
        self._checkpoint_listeners: list[Callable[[int], None]] = []  # after each background one
        # truncation.py
        self._truncate_lock = threading.Lock()  # one truncation at a time; appenders never take it
        self._recycle_segments = recycle_segments
        self._max_wal_size = max_wal_size
        self._truncation_distance = 0.0  # bytes appended between two truncations: the largest, decaying
        self._typical_distance = 0.0     # the same, a plain moving average
        self._last_truncation_lsn: int | None = None
        # rounds.py
        self._growth = GrowthPace()  # until the first truncation: how far ahead to make segments
        self._notify_ahead = self._prepare_segments
        self._notify_mark = 0  # (wal/rounds.py: a small WAL's, where it stops being one)
        self._made_here = False  # this open made the WAL (a one-process one): undone if it fails
        self._opening_alone = False  # a shared WAL's first process, until it shares (peers.py)

    def _count(self, name: str, n: int = 1) -> None:
        """Add to one of the WAL's own counters (a shared WAL's are in the control file)."""
        if self._control is not None and not self._core_closed and hasattr(self, "_core"):
            self._core.shared(COUNTERS.index(name), n)
        else:
            self._counters[name] += n

    def _forget_mappings(self) -> None:
        """Before a segment's mapping is closed or its file moved: the reader lets go of the
        buffers it keeps between reads (an export it kept would hold an unmapped segment
        mapped, and show a recycled file under its old number until then)."""
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.forget()

    def _check_open(self) -> None:
        """ClosedError once the WAL is closed (or was opened before fork())."""
        if self._closed:
            raise ClosedError("the WAL was opened before fork(): a child process opens it again"
                              if getattr(self, "_forked", False) else "the WAL is closed")


def _weak(obj: object, method: str) -> Callable[..., Any]:
    """A callable for the native core that does not keep ``obj`` alive (no cycle)."""
    ref = weakref.ref(obj)

    def call(*args: Any) -> Any:
        target = ref()
        if target is None:
            raise ClosedError("the WAL is gone")
        return getattr(target, method)(*args)

    return call
