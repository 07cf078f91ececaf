"""Following a live WAL from another process: ``pmemwal.follow(path)``.

A follower yields each record once it is durable, in LSN order, and blocks for the next,
like ``tail -f``, ``pg_waldump --follow`` or a Kafka consumer.  It reads through a read-only
WAL (pmemwal/readonly.py): no lock, nothing the writer waits for.  How far it may read is
the durable LSN that every writer flush publishes in the FOLLOW file (pmemwal/follow_file.py),
a load from mapped memory; when it has read everything, it spins on that word for a while
(as long as records have lately taken to come, up to 50 µs) and then sleeps on a futex that
the writer's next flush wakes.  Never ahead of durability: the published LSN only ever names
what was made durable (in buffered mode what the sync covered, in direct mode what was
persisted).  With no writer it reads no further in the boot the last writer published in:
what a writer that died had not flushed is yielded once the next writer's recovery has made
it durable (after a reboot, everything on the device is, up to where the chain ends).

A follower may take a name (as a replication slot or a consumer group): its position is then
stored durably in the FOLLOW file by ``confirm()``, it resumes there, and the writer's
truncation keeps every segment it has not confirmed, unless it falls further behind than the
writer's ``max_follower_lag_bytes``: then it is marked lost and raises FollowerLostError.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Callable, Iterator, Sequence, TypeVar

from pmemwal import _core
from pmemwal._core import Record
from pmemwal.batch import RecordBatch
from pmemwal.errors import ConfigError, FollowerLostError, NotFoundError, TruncatedError
from pmemwal.follow_file import ACTIVE, LOST, OLDEST, FollowerSlot, FollowFile
from pmemwal.readonly import ReadOnlyWAL, identity
from pmemwal.reading import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_RECORDS

_RECORDS, _BYTES = 1024, 1 << 18  # what iterating reads in one native call at most
_START_SPIN_NS = 20000
_T = TypeVar("_T")
# a native read from (lsn, prev) below end: (status, next_lsn, last_lsn, items, count)
_Read = Callable[[int, int, int], tuple[int, int, int, _T, int]]


class Follower:
    """The records of a WAL as they become durable (see the module docstring).

    Iterate it for Records; ``batches()`` for RecordBatches.  ``position`` is where the
    next record is read from; ``confirm()`` stores a named follower's position.  A context
    manager; ``close()`` lets go of the name, so that another process may follow with it.
    One thread at a time reads and confirms (a thread's ``confirm`` beside another's read
    could store a position the reader has not handed out yet); ``close()`` may come from
    any thread, and ends an iteration blocked in another.
    """

    def __init__(self, path: str | os.PathLike[str], start: int | None = None, *,
                 name: str | None = None, timeout: float | None = None) -> None:
        if timeout is not None and not timeout >= 0:
            raise ConfigError(f"timeout={timeout!r}: seconds, 0 or more (None: wait forever)")
        self.timeout = timeout
        self.name = name
        self._closed = False
        self._slot: FollowerSlot | None = None
        self._sleeper: int | None = None
        # the follower waits on the FOLLOW file's futex, and a named one keeps its position
        # there: made first (the reader then reads what the writers publish in it) if no
        # writer of this version has made it yet
        path = os.path.abspath(os.fspath(path))
        _, wal_id, segment_size = identity(path)
        self._file = FollowFile.for_follower(path, wal_id, segment_size)
        try:
            self._wal = ReadOnlyWAL(path)
            self._sleeper = self._file.claim_sleeper()
            self._lsn, self._prev = self._start(start)
        except BaseException:
            self.close()
            raise
        self._spin = _START_SPIN_NS
        # what was yielded (_yielded): the cursor's list and how many of it it handed out;
        # (position, prev) before that list and after it
        self._cursor = _core.Refill(self._refill)
        self._mark = self._after = (self._lsn, self._prev)

    def _start(self, start: int | None) -> tuple[int, int]:
        """(LSN, expected prev-link or -1) of the first record to read."""
        if self.name is not None:
            first = self._first_record() if start is None else start
            self._slot = self._file.claim(self.name, first, 0)
            if self._slot.state == LOST:
                raise self._lost()
            if start is None:  # (no prev-link check there: a follower killed inside
                return self._slot.position, -1  # confirm may have stored its new link alone)
        return (self._first_record() if start is None else start), -1

    def _first_record(self) -> int:
        """The oldest record's LSN, or where the first record will be."""
        bounds = self._wal._read_bounds(None)
        return bounds[0] if bounds is not None else self._wal.first_lsn

    # -- reading --

    def __iter__(self) -> Iterator[Record]:
        return self._cursor

    def __next__(self) -> Record:
        """The next durable record, once there is one; StopIteration after ``timeout``
        seconds without one, or once closed (a later call waits again)."""
        return next(self._cursor)

    def _refill(self) -> list[Record] | None:
        """The cursor's next list: the records durable from the position on, waited for."""
        return self._read_next(self._read_records)

    def _read_records(self, lsn: int, prev: int, end: int
                      ) -> tuple[int, int, int, list[Record], int]:
        status, nxt, last, _, records = self._wal._reader.records(lsn, prev, end, _RECORDS,
                                                                  _BYTES)
        return status, nxt, last, records, len(records)

    def batches(self, *, max_records: int = DEFAULT_BATCH_RECORDS,
                max_bytes: int = DEFAULT_BATCH_BYTES) -> Iterator[RecordBatch]:
        """The records as RecordBatches of up to ``max_records`` records or ``max_bytes``
        payload bytes, from after the last record yielded: each batch holds what was
        durable when it was read."""
        reader = self._wal._reader
        self._rewind()

        def read(lsn: int, prev: int, end: int) -> tuple[int, int, int, RecordBatch, int]:
            status, nxt, last, _, arrays = reader.fill(lsn, prev, end, max_records, max_bytes)
            batch = RecordBatch.from_native(arrays)
            return status, nxt, last, batch, len(batch)

        for batch in self._follow(read):
            self._mark = self._after  # (yielded whole)
            yield batch

    def _follow(self, read: _Read[_T]) -> Iterator[_T]:
        """What ``read`` reads, batch after batch, for as long as something comes (a layer
        that decodes the records, pmemwal/log_follow.py, reads through it too)."""
        while (items := self._read_next(read)) is not None:
            yield items

    def _rewind(self) -> None:
        """Read on from after the last record yielded: the records of a list the cursor
        had read ahead and not handed out come again."""
        self._lsn, self._prev = self._mark = self._after = self._yielded()
        self._cursor = _core.Refill(self._refill)

    def _read_next(self, read: _Read[_T]) -> _T | None:
        """What ``read`` reads from the position on, once something is durable there (None:
        the timeout passed, or the follower closed).  The path a record comes through when
        records come one by one: a few native calls."""
        mapping, word = self._file.map, _core.atomic_u64
        sleeper = self._sleeper
        assert sleeper is not None
        while not self._closed:
            end, self._spin, status = _core.progress_wait(mapping, self._lsn, 0, self._spin,
                                                          sleeper)  # (the spin)
            if status:
                waited = self._wait()
                if waited is None:
                    return None
                end = waited
            at, prev = self._lsn, self._prev
            status, nxt, last, items, count = read(at, prev, end)
            # what a truncation took before it was copied is not the record (readonly.py)
            if count and word(mapping, OLDEST) > at // self._wal.segment_size:
                self._wal._check_copied(at)
            self._mark, self._after = (at, prev), (nxt, last or prev)
            self._lsn, self._prev = self._after
            if count:
                return items
            if status:
                raise self._error(nxt, status)
            if nxt == at and self._wait(after=end) is None:
                return None  # (the end lies in the page header after the position: nothing yet)
        return None

    def _check_replaced(self) -> None:
        """NotFoundError when another WAL was made in the directory since this follower
        started (a writer replaced FOLLOW, and woke those asleep on the old one): nobody
        publishes to the file it waits on any more."""
        if self._file.replaced():
            raise NotFoundError(errno.ENOENT, "the WAL this follower read is gone: another was "
                                "made in its directory since (follow it anew)", self._file.path)

    def _wait(self, after: int | None = None) -> int | None:
        """Past the spin: the durable end once it passes the position (or ``after``); None
        once the timeout passed with nothing new, or once closed.  Where the writers'
        published LSN is not the end (a reboot since the last writer; no writer of this
        version), the end of the chain."""
        after = self._lsn if after is None else after
        if self._closed or self._sleeper is None:
            return None
        end = self._wal.refresh()  # (only when idle: it asks whether a writer is there)
        if end > after:
            return end
        self._check_replaced()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            durable, self._spin, status = _core.progress_wait(self._file.map, after, left,
                                                              self._spin, self._sleeper)
            if status == 0:
                return durable
            if status == 1 or self._closed:
                return None
            self._check_replaced()
            # woken with nothing new (a truncation, a close): look again
            end = self._wal.refresh()
            if end > after:
                return end

    def _error(self, lsn: int, status: int) -> Exception:
        error = self._wal._read_error(lsn, status, False)
        if isinstance(error, TruncatedError) and self._slot is not None:
            slot = self._file.find(self._slot.name)
            if slot is not None and slot.state == LOST:
                return self._lost()
        return error

    def _lost(self) -> FollowerLostError:
        assert self.name is not None
        slot = self._file.find(self.name)
        return FollowerLostError(self.name, slot.lost_at if slot else 0, self._wal.first_lsn)

    # -- position --

    @property
    def position(self) -> int:
        """The LSN of the next record to read: after the last record yielded."""
        return self._yielded()[0]

    def _yielded(self) -> tuple[int, int]:
        """(position, LSN of the record before it, or -1) after the last record yielded: the
        records of the batch being iterated that come after it are read, not yielded."""
        batch, taken = self._cursor.items, self._cursor.given
        if taken == 0:
            return self._mark
        if taken < len(batch):
            return batch[taken].lsn, batch[taken - 1].lsn
        return self._after

    def _consumed(self, position: int, last_lsn: int) -> None:
        """A layer that hands out a batch's records one at a time (pmemwal/log_follow.py)
        says how far its consumer got: the position after the record at ``last_lsn``."""
        self._cursor, self._mark = _core.Refill(self._refill), (position, last_lsn)

    def confirm(self) -> int:
        """Store this named follower's position (after the last record yielded) durably: it
        resumes there, and truncation keeps what lies after it.  Returns the position;
        FollowerLostError if it had been marked lost."""
        if self._slot is None:
            raise ConfigError("confirm() keeps a named follower's position: follow(path, "
                              "name=...)")
        position, last = self._yielded()
        if self._file.confirm(self._slot, position, max(last, 0)) != ACTIVE:
            raise self._lost()
        return position

    # -- life --

    def close(self) -> None:
        """Let go of the name (not of its stored position) and the WAL.  An iteration
        blocked in another thread ends (StopIteration)."""
        if self._closed:
            return
        self._closed = True
        file = self._file
        _core.progress_wake(file.map)  # (a sleep of this follower in another thread ends)
        if self._slot is not None:
            file.release(self._slot)
            self._slot = None
        if self._sleeper is not None:
            file.release_sleeper(self._sleeper)
        wal = getattr(self, "_wal", None)
        if wal is not None:
            wal.close()
        file.close()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def follow(path: str | os.PathLike[str], start: int | None = None, *, name: str | None = None,
           timeout: float | None = None) -> Follower:
    """Follow the WAL in directory ``path`` from another process (or this one): a
    Follower, an iterator of the records that are durable, blocking for the next.

    ``start``: the LSN of a record to start at (None: a named follower's stored position,
    else the oldest record).  ``name``: keep a durable position under this name (1 to 64
    bytes of UTF-8): ``confirm()`` stores it, and the writer's truncation keeps what it has
    not confirmed (within ``max_follower_lag_bytes``).  ``timeout``: seconds to wait for a
    new record before the iteration ends (None: wait forever).
    """
    return Follower(path, start, name=name, timeout=timeout)


def followers(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """The named followers of the WAL in ``path``: name, state ("active" or "lost"),
    position, lag_bytes (behind the durable end), confirmed_at (seconds since the epoch)."""
    path = os.path.abspath(os.fspath(path))
    _, wal_id, segment_size = identity(path)
    file = FollowFile.open(path, wal_id, segment_size)
    if file is None:
        return []
    try:
        durable = file.durable_lsn
        return [slot.as_dict(durable) for slot in file.slots()]
    finally:
        file.close()


def drop_follower(path: str | os.PathLike[str], name: str) -> bool:
    """Forget the named follower's position (it then holds nothing back): False if there is
    none; LockedError while a live process follows with that name."""
    path = os.path.abspath(os.fspath(path))
    _, wal_id, segment_size = identity(path)
    file = FollowFile.open(path, wal_id, segment_size, writable=True)
    if file is None:
        return False
    try:
        return file.drop(name)
    finally:
        file.close()


__all__: Sequence[str] = ["Follower", "follow", "followers", "drop_follower"]
