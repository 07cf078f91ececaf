"""The eventsourcing datastores: one log directory each, and its index, shared by the
recorders that use it in this process (``open_datastore``, ``open_dcb_datastore``)."""

from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NoReturn, Protocol, TypeVar
from uuid import UUID

from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBSequencedEvent
from eventsourcing.persistence import (DatabaseError, DataError, IntegrityError, InterfaceError,
                                       Notification, OperationalError, PersistenceError,
                                       ProgrammingError, StoredEvent, Tracking)

import pmemwal
from pmemwal import _core
from pmemwal.errors import (ClosedError, CorruptionError, FormatError, LockedError,
                            LogIndexError, RecordTooLargeError, WALError)
from pmemwal.integrations.eventsourcing import stored_index
from pmemwal.integrations.eventsourcing.encoding import (ID_UUID, DCBRow, Key, PlaceError, Row,
                                                         _event_parts, decode_batch,
                                                         decode_dcb_batch, decode_dcb_event,
                                                         decode_events, encode_batch,
                                                         encode_dcb_batch, originator_key,
                                                         str_key)
from pmemwal.integrations.eventsourcing.following import LogTail
from pmemwal.integrations.eventsourcing.index import _DCBIndex, _Index, dcb_matches
from pmemwal.integrations.eventsourcing.stored_index import IndexStore, StoredIndex, Written
from pmemwal.recovery import RecoveryWarning
from pmemwal.wal import _weak
from pmemwal.warn import warn

# pmemwal's errors as eventsourcing's (PEP 249 names), the first match wins.
_ERRORS: tuple[tuple[type[WALError], type[PersistenceError]], ...] = (
    (RecordTooLargeError, DataError),
    (ClosedError, InterfaceError),
    (CorruptionError, DatabaseError),
    (FormatError, DatabaseError),
    (WALError, OperationalError),
)


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except WALError as exc:
        target = next(target for source, target in _ERRORS if isinstance(exc, source))
        raise target(f"pmemwal: {exc}") from exc
    except OSError as exc:      # (the index's files: stored_index.py)
        raise OperationalError(f"pmemwal: {exc}") from exc


def read_payloads(log: pmemwal.Log, indices: Sequence[int]) -> list[memoryview]:
    """The payloads of log entries ``indices``, in that order (views of one buffer, read in
    one native call): every read of events goes through here, one call for what a read
    needs.  LogIndexError for an index the log does not hold."""
    if len(indices) <= _ONE_BY_ONE:  # (a batch's arrays cost more than a few entry calls)
        entry = log.entry
        return [memoryview(entry(i).payload) for i in indices]
    return log.entries_at(indices).payloads()


class Listener(Protocol):
    """What a datastore wakes after each insert: a threading.Event, or what acts as one."""

    def set(self) -> None: ...


_T = TypeVar("_T")
_ONE_BY_ONE = 8      # reads of this many entries or fewer go one entry at a time
_CLOSE_WAIT = 5.0    # seconds close waits for inserts it overtook to finish their commit
_WRITER_WAIT = 0.5   # seconds the WAL writer's index checkpoint waits for the datastore's lock
_RECENT = 1024       # a reader keeps the payloads of this many entries it followed last


class _LogStore:
    """One log directory and its index, shared by the recorders that use it in this
    process.  Get one with ``open_datastore`` (or ``open_dcb_datastore``); each call is
    matched by one ``close``, and the last closes the log (so does garbage collection, for
    a datastore nobody closed).

    The index is stored beside the log (stored_index.py): at each of the
    WAL's background checkpoints, on ``checkpoint()`` and on close; an open maps it and
    replays only the entries appended after it.

    ``readonly=True`` opens the log for reading beside the process that writes it (or with
    none): the index is built from the log's entries and then follows each new one as it
    becomes durable (following.py), waking the subscriptions; inserting raises
    OperationalError, and nothing is stored."""

    def __init__(self, path: str, *, readonly: bool = False, **wal_options: Any) -> None:
        self.path = path
        self.readonly = readonly
        self._key = (path, readonly)        # in the registry (_datastores)
        self._lock = threading.Lock()       # inserts are checked and indexed in log order
        self._checkpoint_lock = threading.Lock()    # one index checkpoint at a time; first
        self._index = self._new_index()
        self._listeners: set[Listener] = set()
        self._users = 1
        self._closing = False
        self._uninstalled: Written | None = None    # written, not installed yet (busy lock)
        # appended, not durable yet: (entry, rows before it, its tracking record)
        self._pending: deque[tuple[int, int, Tracking | None]] = deque()
        self._visible = 0                   # rows readers see: those of durable entries
        self._committing = 0                # inserts appended, not through _commit yet
        self._committers: set[int] = set()  # the threads of those inserts
        self._committed = threading.Condition(self._lock)   # one of them is through
        self._durable_tracking: dict[str, int] = {}  # tracking positions readers see
        self.replayed_from = 1              # the first log entry the open replayed
        self.index_error: Exception | None = None   # the last background checkpoint's
        if readonly:
            self._open_reader()
            return
        with _translated():
            try:
                self._log = pmemwal.open_log(path, **wal_options)
            except LockedError as exc:
                raise OperationalError(f"pmemwal: {exc} (a process that only reads the log "
                                       "opens it with PMEMWAL_READONLY=yes)") from exc
            self._store = IndexStore(self._log.wal.path, self._log.wal.wal_id,
                                     self._index.flavor, self._index.tagged)
        self._index.attach(self._store.rows)
        self._close_log = weakref.finalize(self, _close_all, self._log, self._index, self._store)
        try:
            self._replay(self._load_index())
        except BaseException:
            self._close_log()
            raise
        self._log.wal.add_checkpoint_listener(_weak(self, "_background_checkpoint"))

    def _new_index(self) -> Any:
        raise NotImplementedError

    # ---- read-only: the index follows the writer's log ----

    def _open_reader(self) -> None:
        """Read every entry of the log, then follow it (the tail starts after the last
        one read, so that none is missed or added twice)."""
        self._tail: LogTail | None = None
        self._broken: BaseException | None = None   # why the index stopped following
        self._recent: dict[int, bytes] = {}         # entry -> payload, the last followed
        # the entry followed last: its first row, the entry and its rows, and its
        # notifications once made (PmemwalDatastore.latest_notifications)
        self._latest: tuple[int, Any, Sequence[Any]] | None = None
        self._latest_notifications: list[Notification] | None = None
        with _translated():
            self._log = pmemwal.open_log(self.path, readonly=True)
        self._close_log = weakref.finalize(self, _close_all, self._log, self._index, None)
        try:
            self._replay(self._log.first_index)
            self._durable_tracking = self._index.tracking    # every entry read is durable
            with _translated():
                self._tail = LogTail(self, self._log.last_index + 1)
        except BaseException:
            self._close_log()
            raise

    def followed(self, item: Any) -> None:
        """The tail's next entry (or a rewind, compaction or reset of the log): indexed,
        visible at once (it is durable), and the subscriptions woken."""
        if not isinstance(item, pmemwal.Entry):
            # A compaction only drops old entries.  A rewind or a reset (which no datastore
            # writes, though a writer's recovery may cut the log) voids what was indexed.
            if not isinstance(item, pmemwal.Compacted):
                self.follow_failed(DatabaseError(
                    f"pmemwal: {self.path}: the log was rewritten under this reader "
                    f"({item}): open it again"))
            return
        with self._lock:
            if self._log.closed:
                return
            first = self._index.count + 1
            try:
                rows = self._replay_entry(item)
            except (ValueError, struct.error) as exc:
                raise DatabaseError(f"{self.path}: log entry {item.index} is not a batch of "
                                    f"{self._what} ({exc})") from exc
            self._visible = self._index.count
            self._latest = (first, item, rows) if rows else None
            self._latest_notifications = None
            self._recent[item.index] = item.payload
            if len(self._recent) > _RECENT:
                del self._recent[next(iter(self._recent))]
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener.set()

    def follow_failed(self, error: BaseException) -> None:
        """The tail stopped: reads raise ``error`` from now on, subscriptions included."""
        with self._lock:
            self._broken = error
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener.set()

    def _replay_entry(self, entry: Any) -> Sequence[Any]:
        """Add log entry ``entry`` to the index, returning its rows; ValueError or
        struct.error if it is not what this datastore writes."""
        raise NotImplementedError

    # ---- open: the stored index, then the entries after it ----

    def _load_index(self) -> int:
        """Take the stored index when it fits the log; returns the entry to replay from."""
        with _translated():
            state = self._store.read_state()
        if state is None or not state.manifest_size:   # none yet, or one made void
            self._index.next_run = self._store.next_free_run()
            return self._log.first_index
        try:
            why = self._unusable(state)
            manifest, runs = ({}, []) if why else self._store.load(state)
        except (OSError, ValueError, KeyError, TypeError, WALError) as exc:
            why = f"it does not read: {exc}"
        if why:
            warn(f"{self.path}: the eventsourcing index is not used ({why}); every "
                 "log entry is read instead", RecoveryWarning)
            with _translated():
                self._store.void(self._log.wal.cuts)    # before anything is appended
                self._index.next_run = self._store.next_free_run()
            return self._log.first_index
        self._index.load(state, manifest, runs)
        return state.next_entry

    def _unusable(self, state: Any) -> str | None:
        """Why the stored index does not describe the log's entries below its next_entry,
        or None: the log must still hold them, ending in the same entry."""
        log, last = self._log, state.next_entry - 1
        if state.wal_cuts != log.wal.cuts:
            return "the WAL was cut below it since (on_corruption='truncate')"
        if not log.first_index - 1 <= last <= log.last_index:
            return f"it reaches entry {last}, the log holds {log.first_index}..{log.last_index}"
        if last >= log.first_index and \
                _core.crc32c(log.entry(last).payload) != state.guard_crc:
            return f"log entry {last} is not the one it was made after"
        return None

    def _replay(self, start: int) -> None:
        self.replayed_from = start
        with _translated():
            for entry in self._log.entries(start):
                try:
                    self._replay_entry(entry)
                except (ValueError, struct.error) as exc:   # UnicodeDecodeError is a ValueError
                    raise DatabaseError(f"{self.path}: log entry {entry.index} is not a batch of "
                                        f"{self._what} ({exc})") from exc
        self._index.seal_guard()
        self._visible = self._index.count   # (recovery made what it read durable)
        self._durable_tracking = dict(self._index.tracking)

    _what = "events"

    # ---- index checkpoints ----

    def checkpoint(self) -> None:
        """Store the index now: the next open replays no entry appended before the call
        (a read-only datastore stores nothing)."""
        if self.readonly:
            return
        with self._checkpoint_lock:
            self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        with self._locked():
            captured = self._capture()
        if captured is not None:
            with _translated():
                self._log.wal.flush()   # what it names is durable (inserts sync after it)
                written = self._store.write(captured, self._log.wal.cuts)
            with self._lock:
                self._install(written)
            with _translated():
                self._store.collect(written.runs)

    def _capture(self) -> Any:
        """Under both locks: what the next checkpoint writes (None: nothing new)."""
        if self._uninstalled is not None:
            self._install(self._uninstalled)
        return self._index.capture()

    def _install(self, written: Written) -> None:
        """Under the lock: a checkpoint written is the index's now."""
        for run in self._index.install(written):
            run.close()
        self._uninstalled = None

    def _background_checkpoint(self, _end: int) -> None:
        """The WAL's background writer wrote a checkpoint: the index follows, unless the
        datastore is busy (its locks are taken, never waited for: an insert holding the lock
        may wait for that writer, and close stops it)."""
        if not self._checkpoint_lock.acquire(blocking=False):
            return
        try:
            if not self._lock_for_writer():
                return
            try:
                if self._closing or self._log.closed:
                    return
                captured = self._capture()
            finally:
                self._lock.release()
            if captured is None:
                return
            self._log.wal.flush()       # what it names is durable (inserts sync after it)
            written = self._store.write(captured, self._log.wal.cuts)
            if self._lock_for_writer():
                try:
                    self._install(written)
                finally:
                    self._lock.release()
            else:
                self._uninstalled = written     # the next capture installs it
            self._store.collect(written.runs)
            self.index_error = None
        except (WALError, OSError) as exc:  # the next one tries again; the open replays more
            self.index_error = exc.with_traceback(None)
        finally:
            self._checkpoint_lock.release()

    def _lock_for_writer(self) -> bool:
        """Take the lock in the WAL writer's thread: an insert holds it through its sync, so
        it is waited for, but never past _WRITER_WAIT (should an insert ever wait for that
        thread) nor once close has begun."""
        deadline = time.monotonic() + _WRITER_WAIT
        while not self._lock.acquire(timeout=0.005):
            if self._closing or time.monotonic() > deadline:
                return False
        return True

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock, _translated():
            if self._log.closed:
                raise InterfaceError(f"pmemwal: the datastore {self.path} is closed")
            if self.readonly and self._broken is not None:
                raise _as_persistence_error(self._broken)
            yield

    def _append(self, payload: bytes, tracking: Tracking | None = None) -> int:
        """Append one entry (the caller holds the lock, then adds it to the index and
        calls ``_commit`` once it has let the lock go)."""
        if self._closing:   # (close waits for the commits in flight, not for new ones)
            raise InterfaceError(f"pmemwal: the datastore {self.path} is closing")
        if self.readonly:
            raise OperationalError(f"pmemwal: the datastore {self.path} is open read-only "
                                   "(PMEMWAL_READONLY): another process writes it")
        entry = self._log.append(payload)
        self._pending.append((entry, self._index.count, tracking))
        self._committing += 1
        self._committers.add(threading.get_ident())
        return entry

    def _commit(self, entry: int) -> None:
        """Outside the lock: make ``entry`` durable, then visible.  Threads inserting at
        once share one flush (group commit); an insert is seen by readers only once it is
        durable, as a commit in SQL is, though checked against (conflicts) at once.  What
        a flush covers is every entry before it too: they all become visible."""
        try:
            with _translated():
                self._log.sync(entry)
            with self._lock:
                self._made_visible(entry)
        finally:
            with self._lock:
                self._committing -= 1
                self._committers.discard(threading.get_ident())
                self._committed.notify_all()

    def _made_visible(self, entry: int) -> None:
        """Under the lock: the entries up to ``entry`` are durable (in the order appended)."""
        while self._pending and self._pending[0][0] <= entry:
            _, _, tracking = self._pending.popleft()
            if tracking is not None:
                self._durable_tracking[tracking.application_name] = tracking.notification_id
        self._visible = self._pending[0][1] if self._pending else self._index.count

    def _payloads(self, places: Sequence[tuple[int, int]]) -> dict[int, memoryview]:
        """The payloads of the entries of these (entry, offset) places, read in one batch.
        Outside the lock: an entry never changes once written, and the log serializes its
        own reads.  An entry the log does not hold (a damaged index) is DatabaseError."""
        entries = list(dict.fromkeys(entry for entry, _ in places))
        try:
            if self.readonly:
                return self._reader_payloads(entries)
            return dict(zip(entries, read_payloads(self._log, entries)))
        except LogIndexError as exc:
            log = self._log
            gone = [p for p in places if not log.first_index <= p[0] <= log.last_index]
            self._misplaced((gone or list(places))[0], exc)
        except WALError as exc:
            with _translated():
                raise exc

    def _reader_payloads(self, entries: list[int]) -> dict[int, memoryview]:
        """A read-only datastore's payloads: those its tail followed lately as they came,
        the others read from the log (looked up again for entries it does not know yet)."""
        recent = self._recent
        found = {e: memoryview(recent[e]) for e in entries if e in recent}
        rest = [e for e in entries if e not in found]
        if rest:
            if max(rest) > self._log.last_index:
                self._log.refresh()
            found.update(zip(rest, read_payloads(self._log, rest)))
        return found

    def _events(self, places: Sequence[tuple[int, int]], key: Key | None = None
                ) -> list[tuple[UUID | str, int, str, bytes]]:
        """decode_events of these places (only ``key``'s events, when given)."""
        payloads = self._payloads(places)
        try:
            return decode_events(payloads, places, key)
        except PlaceError as exc:
            self._misplaced(exc.place, exc)

    def _decoded(self, places: list[tuple[int, int]], decode: Callable[[memoryview, int], _T]
                 ) -> Iterator[_T]:
        """``decode(payload, offset)`` of each (entry, offset) place, decoded as asked for."""
        payloads = self._payloads(places)
        for place in places:
            try:
                yield decode(payloads[place[0]], place[1])
            except (ValueError, struct.error) as exc:
                self._misplaced(place, exc)

    def _misplaced(self, place: tuple[int, int], exc: Exception) -> NoReturn:
        entry, offset = place
        raise DatabaseError(f"pmemwal: {self.path}: the index names offset {offset} of entry "
                            f"{entry}, where no event is ({exc}); removing "
                            f"{stored_index.INDEX_DIR}/ there rebuilds it") from exc

    # ---- subscriptions: events set after each insert ----

    def listen(self, listener: Listener) -> None:
        """``listener.set()`` after each insert (in a read-only datastore, each entry
        followed), outside the lock."""
        with self._lock:
            self._listeners.add(listener)

    def unlisten(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    # ---- lifecycle ----

    def retain(self) -> None:
        """One more user: one more ``close`` before the log closes."""
        with _registry_lock:
            if self._users == 0:
                raise InterfaceError(f"pmemwal: the datastore {self.path} is closed")
            self._users += 1

    def close(self) -> None:
        """Release this user's hold; the last one closes the log.  Called on the WAL
        writer's thread (a collection of an application's reference cycle may run there,
        inside the index checkpoint it holds the locks of), another thread closes."""
        if not self.readonly and self._log.wal.on_writer_thread():
            threading.Thread(target=self.close, daemon=True,
                             name=f"pmemwal-close {self.path}").start()
            return
        with _registry_lock:    # held while the log closes: a new open must find it closed
            if self._users == 0:
                return
            self._users -= 1
            if self._users:
                return
            if _datastores.get(self._key) is self:
                del _datastores[self._key]
            try:
                self._last_checkpoint()
            except PersistenceError as exc:     # nothing is lost: the next open replays more
                self.index_error = exc.with_traceback(None)
                warn(f"{self.path}: the index was not stored at close ({exc}); the "
                     "next open replays the entries since its last checkpoint",
                     RuntimeWarning)
            finally:                            # (whatever else it raised)
                try:
                    with self._lock, _translated():  # (a reader holding it finds it closed)
                        self._close_log()
                finally:
                    held = self._release_held()
        for store in held:
            store.close()

    def _last_checkpoint(self) -> None:
        """Store the index before the log closes (no background one starts after this);
        a read-only datastore's tail stops."""
        if self.readonly:
            if self._tail is not None:
                self._tail.stop()
            return
        with self._checkpoint_lock:
            with self._lock:
                self._closing = True    # no insert starts; those appended finish first, so
                # that none reports a failure for a stored batch: unless this thread is one
                # of them (a collection in its commit closing the store), and for at most
                # _CLOSE_WAIT (its sync may wait long, and close holds the registry lock)
                deadline = time.monotonic() + _CLOSE_WAIT
                while self._committing and threading.get_ident() not in self._committers:
                    if not self._committed.wait(max(deadline - time.monotonic(), 0)):
                        break
            if not self._log.closed:
                self._write_checkpoint()

    def _release_held(self) -> list[_LogStore]:
        """The datastores this one holds open, to close after it."""
        return []

    @property
    def closed(self) -> bool:
        return self._log.closed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path} {self._index.count} events>"


class PmemwalDatastore(_LogStore):
    """An events log (aggregate, application and process recorders) or a tracking log."""

    def __init__(self, path: str, **wal_options: Any) -> None:
        # The events log of this tracking log's application, held open while this is: its
        # process recorders keep their tracking records there.  Set by the factory.
        self.tracking_peer: PmemwalDatastore | None = None
        super().__init__(path, **wal_options)

    def _new_index(self) -> _Index:
        return _Index()

    def _replay_entry(self, entry: Any) -> list[Row]:
        tracking, rows = decode_batch(entry.payload)
        self._index.add(entry.index, entry.payload, rows, tracking)
        return rows

    def _originator_of(self, notification_id: int) -> Key:
        """The originator key of a stored event, read back (the caller holds the lock)."""
        (kind, ident), = self._decoded(self._index.places([notification_id]),
                                       lambda payload, at: _event_parts(payload, at)[:2])
        return bytes(ident) if kind == ID_UUID else str_key(str(ident, "utf-8"))

    def _release_held(self) -> list[_LogStore]:
        peer, self.tracking_peer = self.tracking_peer, None
        return [peer] if peer is not None else []

    # ---- writing ----

    def insert(self, events: Sequence[StoredEvent], tracking: Tracking | None = None, *,
               tracked_also: Sequence[PmemwalDatastore] = ()) -> list[int]:
        """Store ``events`` (and ``tracking``) as one log entry, durable on return; returns the
        events' notification IDs.  IntegrityError, nothing written, if one is taken already,
        here or, for the tracking record, in the datastores ``tracked_also`` (the logs that
        share this one's tracking positions: all are locked while it is checked and stored)."""
        if not events and tracking is None:
            return []
        try:
            payload, rows = encode_batch(events, tracking)
        except struct.error as exc:
            raise DataError(f"pmemwal: a value does not fit the entry format: {exc}") from exc
        tracked = tracking is not None and tracked_also
        entry = None
        try:
            with _all_locked(self, *tracked_also) if tracked else self._locked():
                self._index.check(rows, tracking, self._originator_of)
                if tracked:
                    for other in tracked_also:
                        other._index.check_tracking(tracking)
                entry = self._append(payload, tracking)
                ids = self._index.add(entry, payload, rows, tracking)
                listeners = tuple(self._listeners)
        finally:
            if entry is not None:   # appended: committed, whatever came after
                self._commit(entry)
        for listener in listeners:
            listener.set()
        return ids

    # ---- reading ----

    def select_events(self, originator_id: UUID | str, *, gt: int | None = None,
                      lte: int | None = None, desc: bool = False,
                      limit: int | None = None) -> list[StoredEvent]:
        key = originator_key(originator_id)[1]
        events: list[StoredEvent] = []
        while True:     # (pages found by hash: read until ``limit`` are the key's)
            want = None if limit is None else limit - len(events)
            with self._locked():
                if want is not None and want <= 0:
                    return events
                ids, sure, rest = self._index.event_ids(key, gt, lte, desc, want,
                                                        self._visible)
                places = self._index.places(ids)
            events += [StoredEvent(*fields) for fields in
                       self._events(places, None if sure else key)]
            if rest is None or len(events) == limit:
                return events
            gt, lte = rest

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *,
                             inclusive_of_start: bool = True) -> list[Notification]:
        first = 1 if start is None else start + (0 if inclusive_of_start else 1)
        with self._locked():
            ids = self._index.notification_ids(max(first, 1), stop, topics, limit,
                                               self._visible)
            places = self._index.places(ids)
        return [Notification(*fields, id=i) for i, fields in zip(ids, self._events(places))]

    def latest_notifications(self, after: int, topics: Sequence[str] = ()
                             ) -> list[Notification] | None:
        """A read-only datastore's notifications after ``after`` when they are those of the
        entry its follower indexed last (of ``topics``, if any); None otherwise (then
        ``select_notifications``).  Made once for every subscription, from the entry as
        followed: a follower's subscriptions get it with no look-up."""
        with self._lock:    # (not _locked: this is on the way of every event followed)
            latest = self._latest
            if latest is None or latest[0] != after + 1 or self._log.closed:
                return None
            made = self._latest_notifications
            if made is None:
                first, entry, rows = latest
                places = [(entry.index, row.offset) for row in rows]
                made = self._latest_notifications = [
                    Notification(*fields, id=i) for i, fields in enumerate(
                        decode_events({entry.index: memoryview(entry.payload)}, places), first)]
        return made if not topics else [n for n in made if n.topic in topics]

    def max_notification_id(self) -> int | None:
        with self._locked():
            return self._visible or None

    def max_tracking_id(self, application_name: str, *,
                        tracked_also: Sequence[PmemwalDatastore] = ()) -> int | None:
        """The last notification ID tracked for ``application_name``, here and in the
        datastores ``tracked_also``."""
        with _all_locked(self, *tracked_also):
            found = [store._durable_tracking.get(application_name)
                     for store in (self, *tracked_also)]
        return max((i for i in found if i is not None), default=None)


class PmemwalDCBDatastore(_LogStore):
    """A DCB events log: DCB events with their types and tags, at dense positions from 1."""

    _what = "DCB events"

    def _new_index(self) -> _DCBIndex:
        return _DCBIndex()

    def _replay_entry(self, entry: Any) -> list[DCBRow]:
        rows = decode_dcb_batch(entry.payload)
        self._index.add(entry.index, entry.payload, rows)
        return rows

    def append(self, events: Sequence[DCBEvent], condition: DCBAppendCondition | None = None
               ) -> int:
        """Store ``events`` as one log entry, durable on return, unless an event stored
        already matches ``condition`` (IntegrityError, nothing written); the last position."""
        if not events:
            raise ProgrammingError("pmemwal: append at least one DCB event")
        try:
            payload, rows = encode_dcb_batch(events)
        except struct.error as exc:
            raise DataError(f"pmemwal: a value does not fit the entry format: {exc}") from exc
        entry = None
        try:
            with self._locked():    # (checked against every event appended, durable or not)
                if condition is not None and self._checked(*self._candidates(
                        condition.fail_if_events_match, condition.after, 1, self._index.count),
                        1):
                    raise IntegrityError(condition)
                entry = self._append(payload)
                position = self._index.add(entry, payload, rows)
                listeners = tuple(self._listeners)
        finally:
            if entry is not None:   # appended: committed, whatever came after
                self._commit(entry)
        for listener in listeners:
            listener.set()
        return position

    def read(self, query: DCBQuery | None = None, *, after: int | None = None,
             limit: int | None = None) -> tuple[list[DCBSequencedEvent], int | None]:
        """The matching events, and the head: without a limit the last position stored, with
        one the last position returned (None for none), as eventsourcing's DCB recorders."""
        with self._locked():
            candidates = self._candidates(query, after, limit, self._visible)
            count = self._visible
        events = self._checked(*candidates, limit)
        head = (count or None) if limit is None else (events[-1].position if events else None)
        return events, head

    def _candidates(self, query: DCBQuery | None, after: int | None, limit: int | None,
                    upto: int) -> tuple[DCBQuery | None, list[int], list[tuple[int, int]], bool]:
        """Under the lock: the index's matches up to ``upto``, their places, and whether
        they are sure."""
        positions, sure = self._index.match(query, after, limit, upto)
        return query, positions, self._index.places(positions), sure

    def _checked(self, query: DCBQuery | None, positions: list[int],
                 places: list[tuple[int, int]], sure: bool, limit: int | None
                 ) -> list[DCBSequencedEvent]:
        """The events at these positions, up to ``limit``, each checked against ``query``
        where the index found it by a tag's hash (not ``sure``)."""
        events: list[DCBSequencedEvent] = []
        done, step = 0, max(2 * (limit or 0), 64)
        while done < len(places):   # (a limit, and candidates by hash: read a part at a time)
            part = places[done:] if limit is None else places[done:done + step]
            for position, (event, _) in zip(positions[done:],
                                            self._decoded(part, decode_dcb_event)):
                if sure or query is None or dcb_matches(event, query):  # (None: every event)
                    events.append(DCBSequencedEvent(event=event, position=position))
                    if len(events) == limit:
                        return events
            done, step = done + len(part), 2 * step
        return events


def _all_locked(*stores: _LogStore) -> AbstractContextManager[None]:
    """Every datastore given locked, in the order of their paths (one order for all)."""
    if len(stores) == 2:        # the common case: an events log and a tracking log
        a, b = stores
        if a is b:
            return a._locked()
        return _LockedInOrder([a, b] if a.path < b.path else [b, a])
    if len(stores) == 1 or all(store is stores[0] for store in stores):
        return stores[0]._locked()
    return _LockedInOrder(sorted({id(s): s for s in stores}.values(), key=lambda s: s.path))


class _LockedInOrder:
    """``_locked`` of several datastores: a class, not a generator, as it is on the path of
    every insert with a tracking record."""

    __slots__ = ("stores",)

    def __init__(self, stores: list[_LogStore]) -> None:
        self.stores = stores

    def __enter__(self) -> None:
        held = 0
        try:
            for store in self.stores:
                store._lock.acquire()
                held += 1
            for store in self.stores:
                if store._log.closed:
                    raise InterfaceError(f"pmemwal: the datastore {store.path} is closed")
        except BaseException:
            for store in reversed(self.stores[:held]):
                store._lock.release()
            raise

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        for store in reversed(self.stores):
            store._lock.release()
        if isinstance(exc, WALError):
            with _translated():
                raise exc


def _as_persistence_error(error: BaseException) -> PersistenceError:
    """eventsourcing's error for why a reader's tail stopped."""
    if isinstance(error, PersistenceError):
        return error
    if isinstance(error, WALError):
        target = next(target for source, target in _ERRORS if isinstance(error, source))
        return target(f"pmemwal: {error}")
    return OperationalError(f"pmemwal: following the log stopped: {error!r}")


def _close_all(log: Any, index: StoredIndex, store: IndexStore | None) -> None:
    """Close a datastore's log and unmap its index (no checkpoint: close writes that).  A
    datastore nobody closed may die in the WAL writer's own thread (its last reference
    was the index checkpoint listener's): another thread closes it, as closing the WAL
    waits for that one to end."""
    if store is not None and log.wal.on_writer_thread():
        threading.Thread(target=_close_all, args=(log, index, store), daemon=True,
                         name=f"pmemwal-close {log.wal.path}").start()
        return
    try:
        log.close()
    finally:
        index.close()
        if store is not None:
            store.close()


# (real path, read-only?) -> the datastore open in this process
_datastores: weakref.WeakValueDictionary[tuple[str, bool], _LogStore] = \
    weakref.WeakValueDictionary()
_registry_lock = threading.Lock()
_S = TypeVar("_S", bound=_LogStore)


def _open_store(kind: type[_S], path: str | os.PathLike[str], *, readonly: bool = False,
                **wal_options: Any) -> _S:
    """The datastore open in this process (a reader takes the writer's, should this
    process write the log), else a new one."""
    real = os.path.realpath(path)
    with _registry_lock:
        # one that was closed for good has left the registry
        store = _datastores.get((real, False)) if readonly else None
        if store is None:
            store = _datastores.get((real, readonly))
        if store is None:
            store = kind(real, readonly=readonly, **({} if readonly else wal_options))
            _datastores[store._key] = store
        elif not isinstance(store, kind):
            raise OperationalError(f"pmemwal: {real} is open as a {type(store).__name__}, "
                                   f"not a {kind.__name__}")
        else:
            store._users += 1
        return store


def open_datastore(path: str | os.PathLike[str], **wal_options: Any) -> PmemwalDatastore:
    """The datastore of directory ``path``: the one open in this process already (which keeps
    the options it was opened with), else a new one with ``pmemwal.open``'s ``wal_options``."""
    return _open_store(PmemwalDatastore, path, **wal_options)


def open_dcb_datastore(path: str | os.PathLike[str], **wal_options: Any) -> PmemwalDCBDatastore:
    """As ``open_datastore``, for a DCB events log."""
    return _open_store(PmemwalDCBDatastore, path, **wal_options)
