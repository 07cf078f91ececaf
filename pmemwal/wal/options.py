"""The WAL's options: their defaults and their checks, made before anything is opened.

Concern: what a caller may pass to ``pmemwal.open`` and what each option defaults to
(the options are documented on ``pmemwal.WAL``).  Touches nothing on disk.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pmemwal import _core
from pmemwal.errors import ConfigError
from pmemwal.format import MAX_RECORD_LIMIT, PAGE_SIZE, is_valid_segment_size
from pmemwal.recovery import VERIFY

MODES = ("auto", "buffered", "direct")
SYNC_METHODS = {
    "fdatasync": _core.PERSIST_FDATASYNC,
    "fsync": _core.PERSIST_FSYNC,
    "open_datasync": _core.PERSIST_DSYNC,
}
ON_CORRUPTION = ("raise", "truncate")
PERSIST = ("auto", "pmem", "msync")  # direct mode: how records become durable
INSERTION = ("parallel", "serial")  # how insertions overlap (PostgreSQL 9.4 made it parallel)
DEFAULT_BUFFER_SIZE = 16 << 20
DEFAULT_MAX_RECORD_SIZE = 64 << 20
DEFAULT_FLUSH_INTERVAL = 0.05
DEFAULT_MAX_WAL_SIZE = 1 << 30
DEFAULT_MAX_PENDING = 4 << 30  # archive_max_pending
# A checkpoint a second, or every 64 MiB flushed: after a crash, open reads at most about
# that much (0.02-0.1 s at the scan rates of docs/PERFORMANCE.md, "Recovery and open time"),
# for one small synced write a second.
DEFAULT_CHECKPOINT_INTERVAL = 1.0
DEFAULT_CHECKPOINT_BYTES = 64 << 20
# Appends smaller than this keep the GIL while they insert (and persist): giving it up and
# taking it back costs more than the insertion.  Two threads at 8 KiB and 16 KiB ran
# 1.02-1.31x faster keeping it, at 64 KiB 1.3x faster giving it up, 32 KiB was a draw
# (docs/PERFORMANCE.md, "Threads and processes"; 8 KiB before c4438da: the history is in
# docs/notes/2026-12-performance-notebook.md §8.1 and §15.3).
DEFAULT_GIL_RELEASE_SIZE = 32 << 10
# How long a call waits for one other writer that holds an insertion it needs, or the
# reservation lock, before StalledWriterError: far above any insertion's time (a 1 GiB
# record copies in well under a second) or a pause of a loaded machine, short enough that a
# stopped peer (SIGSTOP, a debugger, a paused container) does not hang its group for good.
DEFAULT_WAIT_TIMEOUT = 30.0
DEFAULT_MAX_FOLLOWER_LAG = 1 << 30  # bytes a named follower may fall behind before it is lost


class WALOptions(TypedDict, total=False):
    """The options of ``pmemwal.open`` (see ``WAL``), for a layer that takes them on
    (``pmemwal.open_log``): an editor completes them there too."""

    mode: str
    create: bool
    segment_size: int | None
    insert_slots: int
    buffer_size: int
    max_record_size: int
    sync_method: str
    on_corruption: str
    recycle_segments: int
    background: bool
    flush_interval: float
    prepare_segments: int
    prefault: bool
    gil_release_size: int
    max_wal_size: int
    preallocate: int
    persist: str
    insertion: str
    shared: bool
    archive: str | None
    archive_command: str | None
    restore_command: str | None
    archive_options: dict[str, Any] | None
    archive_timeout: float
    archive_max_pending: int
    archive_backoff: float
    checkpoint_interval: float
    checkpoint_bytes: int
    verify: str
    wait_timeout: float | None
    max_follower_lag_bytes: int


def check_checkpoint_options(interval: float, nbytes: int, verify: str) -> None:
    """ConfigError for a checkpoint option pmemwal.open would refuse."""
    if not interval > 0:
        raise ConfigError(f"checkpoint_interval={interval!r}: seconds, more than 0")
    if not isinstance(nbytes, int) or nbytes < 1:
        raise ConfigError(f"checkpoint_bytes={nbytes!r}: a positive number of bytes")
    if verify not in VERIFY:
        raise ConfigError(f"verify={verify!r}: one of {', '.join(VERIFY)}")


def check_wait_timeout(timeout: float | None) -> None:
    """ConfigError for a wait_timeout pmemwal.open would refuse."""
    if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout <= 1e6):
        raise ConfigError(f"wait_timeout={timeout!r}: seconds, above 0 (None: no limit)")


def check_follower_lag(nbytes: int) -> None:
    """ConfigError for a max_follower_lag_bytes pmemwal.open would refuse."""
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ConfigError(f"max_follower_lag_bytes={nbytes!r}: bytes, 0 or more")


def archive_spec(url: str | None, command: str | None, restore_command: str | None,
                 options: dict[str, Any] | None, timeout: float, max_pending: int,
                 backoff: float, background: bool) -> dict[str, Any] | None:
    """The archiver's description of the archive options (None: no archiving), checked."""
    if url is None and command is None:
        if restore_command is not None or options is not None:
            raise ConfigError("restore_command and archive_options go with archive or archive_command")
        return None
    if url is not None and command is not None:
        raise ConfigError("archive (a URL) or archive_command, not both")
    if not background:
        raise ConfigError("archiving needs the background writer (background=True): it hands "
                          "complete segments to the archiver")
    if not 0 < timeout <= 86400:
        raise ConfigError(f"archive_timeout={timeout}: seconds, above 0 and at most a day")
    if max_pending < 0:
        raise ConfigError(f"archive_max_pending={max_pending}: bytes, 0 or more")
    if not 0.1 <= backoff <= 3600:
        raise ConfigError(f"archive_backoff={backoff}: seconds, from 0.1 to 3600")
    if url is not None:
        return {"url": url, "storage_options": options}
    assert command is not None
    if "%p" not in command:
        raise ConfigError(f"archive_command={command!r} names no %p (the segment's path)")
    return {"command": command, "restore_command": restore_command, "timeout": timeout}


def check_wal_options(mode: str = "auto", segment_size: int | None = None, insert_slots: int = 8,
                      buffer_size: int = DEFAULT_BUFFER_SIZE,
                      max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
                      sync_method: str = "fdatasync", on_corruption: str = "raise",
                      recycle_segments: int = 2, flush_interval: float = DEFAULT_FLUSH_INTERVAL,
                      prepare_segments: int = 2,
                      gil_release_size: int = DEFAULT_GIL_RELEASE_SIZE,
                      max_wal_size: int = DEFAULT_MAX_WAL_SIZE, preallocate: int = 0,
                      persist: str = "auto", insertion: str = "parallel",
                      shared: bool = False) -> None:
    """ConfigError for an option pmemwal.open would refuse, checked before opening
    anything (benchmarks check a grid's options before its first run)."""
    def choose(name: str, value: str, valid: tuple[str, ...]) -> None:
        if value not in valid:
            raise ConfigError(f"{name}={value!r}: valid values are {', '.join(valid)}")

    choose("mode", mode, MODES)
    choose("sync_method", sync_method, tuple(SYNC_METHODS))
    choose("on_corruption", on_corruption, ON_CORRUPTION)
    choose("persist", persist, PERSIST)
    choose("insertion", insertion, INSERTION)
    if shared and mode == "buffered":
        raise ConfigError("shared=True works in direct mode only (mode='direct' or 'auto')")
    if segment_size is not None and not is_valid_segment_size(segment_size):
        raise ConfigError(f"segment_size={segment_size}: a power of two from 1 MiB to 1 GiB")
    if not 1 <= insert_slots <= 256:
        raise ConfigError(f"insert_slots={insert_slots}: from 1 to 256")
    if buffer_size % PAGE_SIZE or buffer_size < 16 * PAGE_SIZE:
        raise ConfigError(f"buffer_size={buffer_size}: a multiple of {PAGE_SIZE}, 16 pages or more")
    if not 0 <= max_record_size <= MAX_RECORD_LIMIT:
        raise ConfigError(f"max_record_size={max_record_size}: from 0 to {MAX_RECORD_LIMIT}")
    if recycle_segments < 0:
        raise ConfigError(f"recycle_segments={recycle_segments}: 0 or more")
    if not 0 < flush_interval <= 60:
        raise ConfigError(f"flush_interval={flush_interval}: seconds, above 0 and at most 60")
    if not 0 <= prepare_segments <= 64:
        raise ConfigError(f"prepare_segments={prepare_segments}: from 0 to 64")
    if not 0 <= gil_release_size < 1 << 64:
        raise ConfigError(f"gil_release_size={gil_release_size}: bytes, 0 or more")
    if max_wal_size < 0:
        raise ConfigError(f"max_wal_size={max_wal_size}: bytes, 0 or more")
    if preallocate < 0:
        raise ConfigError(f"preallocate={preallocate}: bytes, 0 or more")
