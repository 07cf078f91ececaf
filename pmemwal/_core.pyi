"""Types of ``pmemwal._core``, the C core (native/module.c): the typed boundary between the
library and the native code.

Keep this in step with module.c's method tables and argument parsing: a ``METH_VARARGS``
method parsed with ``PyArg_ParseTuple`` takes its arguments by position only (hence the ``/``);
``__init__`` and ``inject_fault`` (``PyArg_ParseTupleAndKeywords``) take keywords too.

``pmemwal._core_traced`` is the same module built with ``PMEMWAL_TRACE``; pmemwal/_traced.py
loads it under the name ``pmemwal._core``, so this one stub covers both.  Only the traced build
has ``_trace`` and ``_trace_forget`` (its ``TRACED`` is 1).
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Final, Generic, Literal, TypeVar, final

from _typeshed import ReadableBuffer, WriteableBuffer

import numpy as np

_T = TypeVar("_T")

# the shared WAL's control file (wal_shared)
CONTROL_SIZE: Final[int]
CONTROL_HEADER: Final[int]
CONTROL_VERSION: Final[int]
SHARED_COUNTERS: Final[int]  # Core.shared(SHARED_COUNTERS, add): the oldest segment
MAX_PROCESSES: Final[int]
# the format
SEG_TABLE: Final[int]
PAGE_SIZE: Final[int]
PAGE_HEADER_SIZE: Final[int]
RECORD_HEADER_SIZE: Final[int]
FORMAT_VERSION: Final[int]
# persist methods: Core.set_persist's and Core.agree_persist's kind
PERSIST_PMEM: Final[int]
PERSIST_MSYNC: Final[int]
PERSIST_FDATASYNC: Final[int]
PERSIST_FSYNC: Final[int]
PERSIST_DSYNC: Final[int]
CRC32C_IMPL: Final[str]
BUILD_FLAGS: Final[str]  # setup.py's compiler flags
STREAM_MIN: Final[int]  # set_persist's stream_min by default
STREAM_NEVER: Final[int]
TRACED: Final[int]  # 1 in pmemwal._core_traced, 0 otherwise
# _trace's mutations (trace.h)
TRACE_SKIP_STREAM_FENCE: Final[int]
TRACE_SKIP_DRAIN: Final[int]
TRACE_SKIP_SYNC: Final[int]
TRACE_SHORT_MSYNC: Final[int]
TRACE_SYNC_OWN_RECORD: Final[int]
TRACE_PUBLISH_EARLY: Final[int]

# the FOLLOW file's progress lines (native/wal_follow.h), through a mapping of the file
def progress_wait(mapping: WriteableBuffer, after: int, timeout: float | None, spin_ns: int,
                  sleeper: int, /) -> tuple[int, int, int]:
    """(durable_lsn, spin_ns, status): wait without the GIL until the durable LSN passes
    after (status 0), timeout passes (1), or a wake that did not move it (2)."""
def progress_publish(mapping: WriteableBuffer, lsn: int, reset: bool = False, /) -> None: ...
def progress_wake(mapping: WriteableBuffer, /) -> None: ...
def atomic_u64(mapping: ReadableBuffer, offset: int, value: int | None = None, op: int = 0, /
               ) -> int:
    """The 8-byte word at offset before the call: loaded, or then stored (op 0), raised to
    value (1), ANDed (2) or ORed (3) with it."""

_FaultOp = Literal["write", "sync", "msync", "stall", "stall_locked", "die"]

@final
class Core:
    """The native WAL writer: reservation, copy, flush."""

    def __init__(self, segment_size: int, wal_id_lo: int, direct: bool,
                 ring: WriteableBuffer | None, insert_slots: int, max_record_size: int,
                 segment_callback: Callable[[int], object], gil_release_size: int = 0) -> None:
        """ring: the WAL buffer ring (buffered mode; direct mode ignores it);
        segment_callback(segno): called when the core needs a segment it does not have."""
    @property
    def insert_lsn(self) -> int: ...
    @property
    def flushed_lsn(self) -> int: ...
    @property
    def error(self) -> int:
        """The errno that stopped the writer, 0 if none."""
    def set_position(self, insert_lsn: int, prev_lsn: int, /) -> None: ...
    def set_persist(self, kind: int, pmem_flush_address: int = 0, pmem_drain_address: int = 0,
                    stream_min: int = ..., /) -> None: ...
    def position(self) -> tuple[int, int]:
        """(insert LSN, the last record's LSN or 0), read together."""
    def flush_ready(self) -> int: ...
    def set_notify(self, eventfd: int, ahead: int = 0, mark: int = 0, /) -> None: ...
    def set_serial(self, on: bool, /) -> None: ...
    def set_wait_timeout(self, seconds: float, /) -> None:
        """A wait for one other writer gives up after this many seconds (StalledWriterError);
        0: never."""
    def share(self, control_mapping: WriteableBuffer, fd: int, init: bool, /) -> None: ...
    def set_progress(self, fd: int, length: int, /) -> None:
        """Publish every flush's durable LSN in the FOLLOW file (mapped by the core, let go
        at close)."""
    def reap_dead(self) -> int: ...
    def agree_persist(self, kind: int, /) -> int: ...
    def forsake(self) -> None: ...
    def shared(self, index: int, add: int = 0, /) -> int: ...
    def attach(self, segno: int, fd: int, mapping: WriteableBuffer | None, /) -> None:
        """mapping: the segment's writable mapping in direct mode (ignored in buffered mode)."""
    def detach(self, segno: int, /) -> None: ...
    def append(self, data: ReadableBuffer, /, flush: bool = False) -> int: ...
    def append_prefixed(self, prefix: ReadableBuffer, data: ReadableBuffer, /) -> int: ...
    def append_many(self, records: Iterable[ReadableBuffer], /) -> bytes:
        """The records' LSNs, as native-endian u64s."""
    def flush(self, lsn: int | None = None, /) -> int: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def stop(self, errno: int, reason: str, /) -> int: ...
    def inject_fault(self, op: _FaultOp, errno: int, after: int = 0, count: int = 1) -> None: ...

@final
class Reader:
    """Validates and reads records from mapped segments."""

    def __init__(self, segment_size: int, wal_id_lo: int,
                 getter: Callable[[int], ReadableBuffer | None], salvage: bool = False) -> None:
        """getter(segno): a mapping of the segment, or None when it does not exist.
        salvage: page headers go unchecked (each record's CRC still must match): for finding
        the records a damaged page header alone made unreadable, never for the WAL itself."""
    def read(self, lsn: int, expect_prev: int = -1, /
             ) -> tuple[int, int, int, int, int, int, int, int, int, bool]:
        """(status, lsn, next, prev, length, crc, hint, payload_lsn, bad_lsn, void)."""
    def payload(self, lsn: int, /) -> bytes: ...
    def scan(self, lsn: int, expect_prev: int, stop_lsn: int, check_body: bool = True, /
             ) -> tuple[int, int, int, int, int, int]:
        """(status, end_lsn, last_lsn, count, bytes, bad_lsn)."""
    def heads(self, lsn: int, expect_prev: int, stop_lsn: int, head_bytes: int, max_count: int, /
              ) -> tuple[int, int, int, bytes, bytes, bytes]:
        """(status, next_lsn, last_lsn, lsns (u64s), lengths (u32s), heads)."""
    def fill(self, lsn: int, expect_prev: int, stop_lsn: int, max_records: int, max_bytes: int, /
             ) -> tuple[int, int, int, int, tuple[memoryview, ...]]:
        """(status, next_lsn, last_lsn, bad_lsn, (lsns, prev_lsns, lengths, offsets, data,
        crcs, next_lsns)): the chain from lsn in one batch, read without the GIL."""
    def fetch(self, lsns: ReadableBuffer | np.ndarray, max_bytes: int, /
              ) -> tuple[int, int, int, tuple[memoryview, ...]]:
        """(status, done, bad_lsn, arrays): the records at lsns (u64s), in one batch."""
    def records(self, lsn: int, expect_prev: int, stop_lsn: int, max_records: int,
                max_bytes: int, /) -> tuple[int, int, int, int, list[Record]]:
        """(status, next_lsn, last_lsn, bad_lsn, records)."""
    def entry(self, lsn: int, index: int, prefix: bytes, /) -> tuple[int, int, int, bytes | None]:
        """(status, bad_lsn, term, payload): the record at lsn as the Log's entry index (status
        -2: it reads, but is not that entry)."""
    def record(self, lsn: int, /) -> tuple[int, int, Record | None]:
        """(status, bad_lsn, the record or None)."""
    def forget(self) -> None:
        """Let go of the segment buffers kept between calls."""
    def first_record(self, segno: int, /) -> tuple[int, int]:
        """(status, lsn)."""
    def beyond(self, x: int, last_segno: int, min_prev: int, /) -> tuple[int, list[int]]:
        """(durable_lsn, the LSNs of the pages after x's page to wipe)."""
    def salvage(self, x: int, pages: Sequence[int], link: int, floor: int, /
                ) -> list[tuple[int, int, int, int]]:
        """(lsn, next_lsn, length, crc) of each valid record past a cut at x (a salvage
        reader's: lostfound.records_past), the scan run without the GIL."""

@final
class Refill(Generic[_T]):
    """The items of the lists refill() gives, one list after another (None: the end, for
    now)."""

    def __new__(cls, refill: Callable[[], list[_T] | None], /) -> Refill[_T]: ...
    def __iter__(self) -> Refill[_T]: ...
    def __next__(self) -> _T: ...
    @property
    def items(self) -> list[_T]: ...
    @property
    def given(self) -> int: ...

@final
class Record:
    """A record read back: its LSN, its payload, and the LSN of the record before it."""

    def __new__(cls, lsn: int, payload: bytes, prev_lsn: int) -> Record: ...
    @property
    def lsn(self) -> int: ...
    @property
    def payload(self) -> bytes:
        """The record's payload, bytes of its own."""
    @property
    def prev_lsn(self) -> int: ...

def crc32c(data: ReadableBuffer, crc: int = 0, /) -> int: ...
def status_text(status: int, /) -> str: ...
def heads(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, width: int, /) -> bytes:
    """Each payload's first width bytes, one after another (zeros past a shorter one)."""
def entries(type: type[_T], indices: np.ndarray, terms: np.ndarray, data: np.ndarray,
            offsets: np.ndarray, lengths: np.ndarray, /) -> list[_T]:
    """A Log batch's entries as instances of type (a tuple of index, term, payload)."""

@final
class Unchanged(Generic[_T]):
    """Unchanged(items, counter, expected): the items, until the u64 counter changes."""

    def __new__(cls, items: list[_T], counter: np.ndarray, expected: int, /) -> Unchanged[_T]: ...
    @property
    def given(self) -> int: ...
    def __iter__(self) -> Unchanged[_T]: ...
    def __next__(self) -> _T: ...
def split(data: ReadableBuffer | np.ndarray, offsets: ReadableBuffer | np.ndarray,
          lengths: ReadableBuffer | np.ndarray, /) -> list[bytes]:
    """Each payload data[offsets[i]:offsets[i] + lengths[i]] as bytes of its own."""
def unlinked(fds: Sequence[int], /) -> int:
    """The first descriptor whose file was deleted (st_nlink 0), or -1; one GIL release."""
def _crc32c_copy(dst: WriteableBuffer, src: ReadableBuffer, crc: int = 0, how: int = 1,
                 repeat: int = 1, /) -> int: ...

# pmemwal._core_traced only (TRACED == 1)
def _trace(stream: int, fence: int, sync: int, mutations: int = 0, /) -> None: ...
def _trace_forget() -> None: ...
