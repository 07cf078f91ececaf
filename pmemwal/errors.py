"""pmemwal's exceptions, in one place (the native core raises these too).

    WALError
    ├── CorruptionError      damaged data that had been made durable (lsn, segment, reason)
    ├── TruncatedError       the records asked for were truncated (lsn, first_lsn)
    ├── FormatError          not a pmemwal WAL, another WAL's segment, a size mismatch
    ├── LockedError          another writer holds the WAL
    ├── ClosedError          the WAL was closed
    ├── NotFoundError        no WAL here and create=False (also FileNotFoundError)
    ├── ConfigError          a bad option value (also ValueError)
    ├── RecordTooLargeError  a record over max_record_size (also ValueError)
    ├── LogIndexError        pmemwal.Log: an entry index outside the log (also IndexError)
    ├── TermError            pmemwal.Log: a term going backwards (also ValueError)
    ├── StalledWriterError   another writer, alive but not running, held a wait up past
    │                        wait_timeout (also TimeoutError)
    └── StorageError         the file system failed: ENOSPC, EIO (also OSError)
        └── WriterStoppedError   ...in a way that stopped the writer: reopen to go on

This module imports nothing from pmemwal, so the C extension can load it.
"""

from __future__ import annotations

import errno


class WALError(Exception):
    """Base class of every error pmemwal raises on purpose."""


class CorruptionError(WALError):
    """Damage to records that had been made durable, or later data past damage."""

    def __init__(self, lsn: int, segment: int, reason: str) -> None:
        super().__init__(f"WAL damaged at LSN {format_lsn(lsn)} (segment {segment:016X}): {reason}")
        self.lsn = lsn
        self.segment = segment
        self.reason = reason


class TruncatedError(WALError):
    """The records asked for are gone: a truncation (in this process or, for a shared WAL,
    another) removed or recycled their segment, before or while they were read.  Not
    damage: read again from ``first_lsn``, the oldest record's segment start now (like
    PostgreSQL's "requested WAL segment has already been removed")."""

    def __init__(self, lsn: int, first_lsn: int) -> None:
        super().__init__(f"LSN {format_lsn(lsn)} was truncated: the WAL now starts at "
                         f"{format_lsn(first_lsn)}")
        self.lsn = lsn
        self.first_lsn = first_lsn

    def __reduce__(self) -> tuple[object, ...]:  # (it crosses process boundaries whole)
        return type(self), (self.lsn, self.first_lsn)


class FollowerLostError(TruncatedError):
    """A named follower fell further behind than the writer's ``max_follower_lag_bytes``:
    it no longer holds back truncation, and the records it had not confirmed may be gone
    (PostgreSQL's replication slot whose WAL status is "lost").  ``drop_follower`` frees its
    name; following again from ``first_lsn`` starts over."""

    def __init__(self, name: str, lsn: int, first_lsn: int) -> None:
        WALError.__init__(self, f"follower {name!r} fell too far behind and was marked lost "
                          f"(at LSN {format_lsn(lsn)}; the WAL now starts at "
                          f"{format_lsn(first_lsn)})")
        self.name = name
        self.lsn = lsn
        self.first_lsn = first_lsn

    def __reduce__(self) -> tuple[object, ...]:
        return type(self), (self.name, self.lsn, self.first_lsn)


class ReadOnlyError(WALError):
    """A write to a WAL opened with readonly=True."""


class FormatError(WALError):
    """The directory or a segment is not (this) pmemwal WAL."""


class LockedError(WALError):
    """Another writer, in this process or another, has the WAL open."""


class ClosedError(WALError):
    """The WAL was closed."""


class NotFoundError(WALError, FileNotFoundError):
    """No WAL directory at the path, and create=False."""


class ConfigError(WALError, ValueError):
    """An option has a value pmemwal does not accept."""


class RecordTooLargeError(WALError, ValueError):
    """A record is larger than the WAL's max_record_size."""


class LogIndexError(WALError, IndexError):
    """A log entry index outside what the operation accepts (pmemwal.Log)."""


class TermError(WALError, ValueError):
    """A term lower than the log's last one (pmemwal.Log): terms never go backwards."""


class StalledWriterError(WALError, TimeoutError):
    """A wait for another writer outlasted ``wait_timeout``: a process of a shared WAL (or
    a thread of this one) that holds an insertion below what the call needed, or the
    reservation lock, is alive but does not run (SIGSTOP, a debugger, a paused container).
    ``pid`` names it.  The call gave up where nothing was half done: an append that raises
    it appended nothing, and a flush made nothing durable that it would not have.  An
    ``append(..., flush=True)`` whose record was appended before its flush gave up sets
    ``lsn`` to that record's LSN (not known durable: ``flush(lsn)`` again); else ``lsn`` is
    None."""

    def __init__(self, pid: int, message: str) -> None:
        super().__init__(errno.ETIMEDOUT, message)
        self.pid = pid
        self.lsn: int | None = None


class StorageError(WALError, OSError):
    """The storage failed (no space, I/O error); durable data is untouched."""


class ArchiveError(StorageError):
    """The archive (an fsspec URL or an archive command) failed or holds something else:
    archiving retries it; appends get it once ``archive_max_pending`` bytes of completed
    segments wait for it, and restore when the archive cannot be read."""


class WriterStoppedError(StorageError):
    """A write, sync or msync failed (or a segment file was deleted) after records
    were placed: the writer stopped, and refuses every later append and flush with
    this error, whose errno is the original failure's.  Every record acknowledged
    before it stays readable; reopen the WAL to append again.  A StorageError that
    is not a WriterStoppedError (no space for a new segment) stopped nothing."""


def format_lsn(lsn: int) -> str:
    """An LSN in PostgreSQL's X/X form: high and low 32 bits in hex."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def repair_hint(path: str) -> str:
    """What cuts a damaged WAL at its first damage, setting what follows aside in lost+found:
    the command, or the open's options (both work wherever damage is reported)."""
    return (f"`pmemwal repair {path}` shows what a cut there keeps and sets aside, and makes "
            "it; or open with on_corruption='truncate', verify='all'")
