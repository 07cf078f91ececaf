"""eventsourcing persistence on a ``pmemwal.Log``: each stored batch of events durable on return.

Recorders: aggregate, application, tracking and process recorders, and (for eventsourcing's
``DCBApplication``) a DCB recorder: events with a type and tags, read by queries of types and
tags, appended under a condition (dynamic consistency boundaries).

eventsourcing (github.com/pyeventsourcing/eventsourcing, 9.5) finds its persistence module
through the environment variable ``PERSISTENCE_MODULE``; this module is one::

    import os
    os.environ["PERSISTENCE_MODULE"] = "pmemwal.integrations.eventsourcing"
    os.environ["PMEMWAL_PATH"] = "/mnt/pmem/bank"          # a directory; made when missing
    app = BankAccounts()                                   # any eventsourcing Application
    account_id = app.open_account("Alice", "alice@example.com")   # durable when save() returns

Environment.  Read by the factory through eventsourcing's ``Environment``, so each may also be
given for one application as ``<APPLICATION NAME>_<VARIABLE>`` (``BANKACCOUNTS_PMEMWAL_PATH``):

- ``PMEMWAL_PATH``: the base directory (no default: without it the factory raises OSError,
  as eventsourcing's SQLite module does without ``SQLITE_DBNAME``).
- ``PMEMWAL_MODE``: ``auto`` (default), ``direct`` or ``buffered``: ``pmemwal.open``'s mode.
- ``PMEMWAL_SEGMENT_SIZE``: bytes per segment file, a power of two from 1 MiB (default: a
  log's own, 16 MiB for a new one); a log made with another size is refused (OperationalError).
- ``PMEMWAL_CHECKPOINT_INTERVAL``: seconds between the WAL's background checkpoints, which
  the index follows (default: ``pmemwal.open``'s, 1); less makes a reopen after a crash
  replay less, at a synced write each.
- ``CREATE_TABLE``: eventsourcing's own switch, ``yes`` by default; ``no`` opens only log
  directories that exist (OperationalError otherwise), as the SQL modules then create no table.

Layout.  Each recorder purpose has its own log directory under ``PMEMWAL_PATH``, named as
eventsourcing's PostgreSQL module names its tables (``<app>``: the application's name in lower
case; without one, the word in brackets):

    <app [stored]>_events           application_recorder(), process_recorder()
    <app [stored]>_snapshots        aggregate_recorder("snapshots"), the snapshot store
    <app [stored]>_<purpose>        aggregate_recorder(purpose)
    <app [notification]>_tracking   tracking_recorder(), process_recorder()
    <app [dcb]>_dcb_events          dcb_recorder()

A process recorder keeps its tracking records in its events log, inside the entry of the events
they go with (so the two are stored together or not at all); ``tracking_recorder()`` writes to
the tracking log.  The two share their tracking positions, as they share one tracking table in
eventsourcing's PostgreSQL module: ``max_tracking_id`` is the larger of the two logs', and a
notification ID tracked in either is taken for both (IntegrityError), both logs locked while a
record is checked and stored.  So ``process_recorder()`` opens (or makes) the tracking log too,
and ``tracking_recorder()`` opens the application's events log when it exists (a process
recorder made later links them then); the tracking log holds the events log open until it
closes.  In one process, every recorder of a directory shares one open log and its index, even
across factories and applications (``open_datastore``); a log takes one writer process, and a
second one gets OperationalError (pmemwal's LockedError).

Entries.  ``insert_events`` (with its tracking record, for a process recorder) and
``insert_tracking`` each append ONE log entry: one WAL record, so after a crash the batch is
there whole or not at all, and it is durable when the call returns.  It is checked and
appended under the datastore's lock, and synced after the lock is let go, so threads inserting
at once share a flush (group commit); readers see it once it is durable (conflict checks at
once).  Nothing is written for a batch that conflicts.  An insert that raised after its entry
was appended (a failed sync) is indeterminate, as a commit that failed in any database: after
a reopen the batch may be there.  The entry's payload, little-endian (struct formats):

    batch header, 6 bytes (BATCH "<BBI"):
      0  u8   format version, 1
      1  u8   flags: 1 when a tracking record follows
      2  u32  number of events
    tracking record, when flagged (TRACKING "<qH"):
      0  i64  notification ID
      8  u16  application name length n
     10  n    application name, UTF-8
    each event (EVENT "<BHHIq", 17 bytes, then the three parts it gives the lengths of):
      0  u8   originator ID kind: 0 a UUID (its 16 bytes), 1 a str (UTF-8)
      1  u16  originator ID length i
      3  u16  topic length t
      5  u32  state length s
      9  i64  originator version
     17  i, t, s  the originator ID, the topic (UTF-8), the state (bytes as the mapper made them)

For example, Alice's account opened by a process that was following ``upstream`` at its
notification 7: the UUID 00010203-0405-0607-0809-0a0b0c0d0e0f, version 1, topic
``bank:Opened`` and state ``{}`` make a 70-byte payload (pmemwal.Log adds its 24-byte header):

    01 01 01000000                        version 1, tracking follows, 1 event
    0700000000000000 0800 "upstream"      tracking: notification 7, name of 8 bytes
    00 1000 0b00 02000000 0100000000000000   UUID, 16-byte ID, 11-byte topic, 2-byte state, v1
    000102030405060708090a0b0c0d0e0f "bank:Opened" "{}"

Notification IDs are not stored: they are the events' positions in the log, counted on
replay (dense: 1, 2, 3... across entries).  Opening a directory replays every entry to rebuild
the index kept in memory: per notification, the entry and offset of its event and its topic
(numpy columns); per originator, its versions in order and their notification IDs (lists, so
``select_events`` bisects and never scans other events); per application name, the last
tracked notification.  Events are read back from the log (``Log.entry``, zero-copy) when
selected.  An originator is indexed by its UUID, and a str that is a UUID's string form
(``str(uuid)``: 36 characters, lower case) is that UUID, as in eventsourcing's POPO and
PostgreSQL modules: an event stored under either form is found by either, and takes the
version for both.  Each event comes back with the ID as it was stored (kind 0 or 1); other
spellings of a UUID (``uuid.hex``, upper case) are other originators, as in POPO.

A DCB events log holds DCB batches, one entry per ``append`` (all or nothing, durable on
return; nothing is written when the append condition fails: IntegrityError):

    DCB batch header, 6 bytes (BATCH "<BBI"): u8 2 (a DCB batch), u8 flags 0, u32 events
    each event (DCB_EVENT "<HHI", 8 bytes, then what it gives the lengths of):
      0  u16  type length t
      2  u16  number of tags n
      4  u32  data length d
      8  n u16 tag lengths, then the type (UTF-8), the tags (UTF-8, in order), the data

Positions are counted on replay as notification IDs are (dense from 1).  The index: per
position, its entry, offset and type (numpy columns); per tag, its events' positions
(ascending lists).  A query item with tags walks its rarest tag's list from ``after`` and looks
the others up (bisect), then filters by type; an item of types alone scans the type column; the
items' positions are merged.  The two logs refuse each other's entries (DatabaseError).

Errors are eventsourcing's, the pmemwal error chained: IntegrityError (a version or tracking
ID already taken), DataError (a batch over the WAL's max_record_size, a field too long for the
format), InterfaceError (used after close), DatabaseError (damage, an entry that is not a
batch), OperationalError (the rest: locked, storage failures).
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from threading import Event
from typing import Any, NamedTuple, NoReturn, TypeVar
from uuid import UUID

import numpy as np
from eventsourcing.dcb.api import (DCBAppendCondition, DCBEvent, DCBQuery, DCBReadResponse,
                                   DCBRecorder, DCBSequencedEvent)
from eventsourcing.dcb.persistence import DCBInfrastructureFactory, DCBListenNotifySubscription
from eventsourcing.persistence import (AggregateRecorder, ApplicationRecorder, DatabaseError,
                                       DataError, InfrastructureFactory, IntegrityError,
                                       InterfaceError, ListenNotifySubscription, Notification,
                                       OperationalError, PersistenceError, ProcessRecorder,
                                       ProgrammingError, Recorder, StoredEvent, Tracking,
                                       TrackingRecorder)
from eventsourcing.utils import Environment, EnvType, resolve_topic, strtobool

import pmemwal
from pmemwal import _core
from pmemwal.errors import (ClosedError, CorruptionError, FormatError, LogIndexError,
                            RecordTooLargeError, WALError)
from pmemwal.integrations import es_index
from pmemwal.integrations.es_index import ORIGINATORS, TAGS, IndexStore, StoredIndex, Written
from pmemwal.recovery import RecoveryWarning
from pmemwal.wal import _weak

FORMAT_VERSION = 1
HAS_TRACKING = 1                    # batch flags: a tracking record follows the header
ID_UUID, ID_STR = 0, 1              # event: how the originator ID is stored
BATCH = struct.Struct("<BBI")       # format version, flags, number of events
TRACKING = struct.Struct("<qH")     # notification ID, application name length (the name follows)
EVENT = struct.Struct("<BHHIq")     # ID kind, ID length, topic length, state length, version
DCB_FORMAT = 2                      # a DCB batch's first byte (BATCH's "format version" place)
DCB_EVENT = struct.Struct("<HHI")   # type length, number of tags, data length

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
    except OSError as exc:      # (the index's files: es_index.py)
        raise OperationalError(f"pmemwal: {exc}") from exc


# ---- the entry format -------------------------------------------------------------

Key = bytes | str                   # an originator ID in the index: a UUID's bytes, or the str


class Row(NamedTuple):
    """What the index keeps of one event of a batch."""

    key: Key
    version: int
    topic: str
    offset: int                     # of its EVENT header in the entry's payload


def originator_key(originator_id: UUID | str) -> tuple[int, Key, bytes]:
    """(ID kind, index key, stored bytes) of an originator ID."""
    if isinstance(originator_id, UUID):
        return ID_UUID, originator_id.bytes, originator_id.bytes
    if isinstance(originator_id, str):
        return ID_STR, str_key(originator_id), originator_id.encode()
    raise DataError(f"originator ID {originator_id!r}: pmemwal stores a UUID or a str")


def str_key(originator_id: str) -> Key:
    """The index key of a str originator ID: a UUID's string form (``str(uuid)``, 36
    characters, lower case) is that UUID, as in eventsourcing's POPO and PostgreSQL modules;
    any other str, other spellings of a UUID included, is itself."""
    if len(originator_id) == 36 and originator_id[8] == "-":
        try:
            uuid = UUID(originator_id)
        except ValueError:
            return originator_id
        if str(uuid) == originator_id:
            return uuid.bytes
    return originator_id


def encode_batch(events: Sequence[StoredEvent],
                 tracking: Tracking | None) -> tuple[bytes, list[Row]]:
    """The payload of the entry that stores ``events`` (and ``tracking``), and its rows."""
    parts = [BATCH.pack(FORMAT_VERSION, 0 if tracking is None else HAS_TRACKING, len(events))]
    if tracking is not None:
        name = tracking.application_name.encode()
        parts += (TRACKING.pack(tracking.notification_id, len(name)), name)
    offset = sum(map(len, parts))
    rows = []
    for event in events:
        kind, key, ident = originator_key(event.originator_id)
        topic = event.topic.encode()
        parts += (EVENT.pack(kind, len(ident), len(topic), len(event.state),
                             event.originator_version), ident, topic, event.state)
        rows.append(Row(key, event.originator_version, event.topic, offset))
        offset += EVENT.size + len(ident) + len(topic) + len(event.state)
    return b"".join(parts), rows


def decode_batch(payload: memoryview) -> tuple[Tracking | None, list[Row]]:
    """The tracking record and the rows of a batch; ValueError if it is not one."""
    version, flags, count = BATCH.unpack_from(payload)
    if version != FORMAT_VERSION:
        raise ValueError(f"batch format version {version} (this module reads {FORMAT_VERSION})")
    offset, tracking = BATCH.size, None
    if flags & HAS_TRACKING:
        notification_id, length = TRACKING.unpack_from(payload, offset)
        offset += TRACKING.size + length
        tracking = Tracking(application_name=str(payload[offset - length:offset], "utf-8"),
                            notification_id=notification_id)
    rows = []
    for _ in range(count):
        kind, ident, topic, _, version, end = _event_parts(payload, offset)
        key = bytes(ident) if kind == ID_UUID else str_key(str(ident, "utf-8"))
        rows.append(Row(key, version, str(topic, "utf-8"), offset))
        offset = end
    return tracking, rows


def decode_event(payload: memoryview, offset: int) -> tuple[UUID | str, int, str, bytes]:
    """(originator_id, originator_version, topic, state) of the event at ``offset``."""
    kind, ident, topic, state, version, _ = _event_parts(payload, offset)
    originator_id = UUID(bytes=bytes(ident)) if kind == ID_UUID else str(ident, "utf-8")
    return originator_id, version, str(topic, "utf-8"), bytes(state)


def decode_events(payloads: Mapping[int, memoryview], places: Sequence[tuple[int, int]],
                  key: Key | None = None) -> list[tuple[UUID | str, int, str, bytes]]:
    """decode_event's fields of the event at each (entry, offset) place, of the entries'
    ``payloads``; with ``key``, only the events of that originator.  One loop, each ID
    decoded once a call (the events of a batch, or a page, share few originators).
    PlaceError (a ValueError) names a place where no event is."""
    out = []
    known_ids: tuple[dict[bytes, tuple[UUID | str, Key]], ...] = ({}, {})   # by ID kind
    unpack, header = EVENT.unpack_from, EVENT.size
    entry, offset = -1, -1
    try:
        for entry, offset in places:
            payload = payloads[entry]
            kind, id_len, topic_len, state_len, version = unpack(payload, offset)
            a = offset + header
            b, c = a + id_len, a + id_len + topic_len
            end = c + state_len
            if end > len(payload) or kind > ID_STR:
                raise ValueError(f"event at offset {offset} has originator ID kind {kind}"
                                 if kind > ID_STR else
                                 f"event at offset {offset} runs past the entry's end")
            ident = payload[a:b].tobytes()
            known = known_ids[kind].get(ident)
            if known is None:
                known = known_ids[kind][ident] = _originator(kind, ident)
            if key is None or known[1] == key:
                out.append((known[0], version, str(payload[b:c], "utf-8"),
                            payload[c:end].tobytes()))
    except (ValueError, struct.error) as exc:
        raise PlaceError(entry, offset, exc) from exc
    return out


class PlaceError(ValueError):
    """No event is at this (entry, offset) place."""

    def __init__(self, entry: int, offset: int, why: Exception) -> None:
        super().__init__(str(why))
        self.place = (entry, offset)


def _originator(kind: int, ident: bytes) -> tuple[UUID | str, Key]:
    """(originator ID, index key) of an event's stored ID."""
    if kind == ID_UUID:
        return _uuid(ident), ident
    text = str(ident, "utf-8")
    return text, str_key(text)


@functools.lru_cache(maxsize=1 << 14)
def _uuid(ident: bytes) -> UUID:
    """UUIDs are immutable: an aggregate read again takes the one made before."""
    return UUID(bytes=ident)


def _event_parts(payload: memoryview, offset: int
                 ) -> tuple[int, memoryview, memoryview, memoryview, int, int]:
    """(kind, ID, topic, state, version, end) of the event at ``offset``; the parts are views."""
    kind, id_len, topic_len, state_len, version = EVENT.unpack_from(payload, offset)
    if kind not in (ID_UUID, ID_STR):
        raise ValueError(f"event at offset {offset} has originator ID kind {kind}")
    a = offset + EVENT.size
    b, c = a + id_len, a + id_len + topic_len
    end = c + state_len
    if end > len(payload):
        raise ValueError(f"event at offset {offset} runs past the entry's end")
    return kind, payload[a:b], payload[b:c], payload[c:end], version, end


# ---- the index: rows and originators (stored: pmemwal/integrations/es_index.py) ------

def originator_bytes(key: Key) -> bytes:
    """An originator key's bytes for its hash: a UUID's and a str's never coincide."""
    return b"u" + key if isinstance(key, bytes) else b"s" + key.encode()


class _Index(StoredIndex):
    """Notifications, originators' versions and tracking positions; the caller holds the lock.
    A row is a notification (its ID is its number), a key pair (version, notification ID)."""

    flavor = ORIGINATORS

    def __init__(self) -> None:
        super().__init__(originator_bytes)

    def check(self, rows: list[Row], tracking: Tracking | None,
              key_of: Callable[[int], Key]) -> None:
        """IntegrityError unless every row and the tracking record can be added
        (``key_of(notification_id)``: the originator of a stored event, read back)."""
        batch = set()
        for row in rows:
            where = ("twice in the batch" if (row.key, row.version) in batch else
                     "stored already" if self.has_pair(
                         row.key, row.version, lambda i, k=row.key: key_of(i) == k) else None)
            if where:
                raise IntegrityError(f"the event of originator {_shown(row.key)} with version "
                                     f"{row.version} is {where}")
            batch.add((row.key, row.version))
        if tracking is not None:
            self.check_tracking(tracking)

    def check_tracking(self, tracking: Tracking) -> None:
        """IntegrityError unless ``tracking`` follows what is tracked for its application."""
        last = self.tracking.get(tracking.application_name)
        if last is not None and tracking.notification_id <= last:
            raise IntegrityError(f"tracking {tracking.application_name!r} notification "
                                 f"{tracking.notification_id}: {last} is tracked already")

    def add(self, entry: int, payload: bytes | memoryview, rows: list[Row],
            tracking: Tracking | None) -> list[int]:
        """Add the rows of log entry ``entry``; returns their notification IDs."""
        ids = list(range(self.count + 1, self.count + 1 + len(rows)))
        for row, notification_id in zip(rows, ids):
            self.add_pair(row.key, row.version, notification_id)
        self.add_rows(entry, payload, [row.offset for row in rows],
                      [self.name_id(row.topic) for row in rows])
        if tracking is not None:
            self.tracking[tracking.application_name] = tracking.notification_id
        return ids

    def event_ids(self, key: Key, gt: int | None, lte: int | None, desc: bool,
                  limit: int | None, upto: int
                  ) -> tuple[list[int], bool, tuple[int | None, int | None] | None]:
        """Notification IDs up to ``upto`` of the first ``limit`` of an originator's events
        with gt < version <= lte, in order; whether they are the key's for certain; and the
        bounds (gt, lte) of the events after them (None: there are none).  When not certain
        (a run found them by hash), the caller drops the events of another key and asks for
        the rest while it wants more: a page never splits one version's IDs, so the rest's
        bounds leave none out."""
        n = limit
        while True:         # (one more pair than the page: is the last version's split?)
            versions, ids, from_runs = self.key_pairs(key, gt, lte, desc,
                                                      None if n is None else n + 1, upto)
            if n is None or len(versions) <= n:
                return ids.tolist(), not from_runs, None
            if not from_runs:
                return ids[:n].tolist(), True, None
            kept = n if versions[n] != versions[n - 1] else \
                int(np.argmax(versions == versions[n - 1]))     # that version's first
            if kept:
                last = int(versions[kept - 1])
                return ids[:kept].tolist(), False, ((gt, last - 1) if desc else (last, lte))
            n *= 2                  # (one version's pairs fill the page: keys sharing a hash)

    def notification_ids(self, first: int, stop: int | None, topics: Sequence[str],
                         limit: int, upto: int) -> list[int]:
        """Up to ``limit`` notification IDs from ``first`` to ``stop`` (and ``upto``), of
        ``topics`` (if any)."""
        last = upto if stop is None else min(stop, upto)
        if first > last or limit <= 0:
            return []
        if not topics:
            return list(range(first, min(last, first + limit - 1) + 1))
        wanted = [self.name_ids[t] for t in topics if t in self.name_ids]
        found: list[int] = []
        window = max(4 * limit, 4096)   # a page costs what it reads, not the rest of the log
        while wanted and first <= last and len(found) < limit:
            stop = min(last, first + window - 1)
            hits = np.flatnonzero(np.isin(self.row_names(first, stop), wanted))
            found += (hits[:limit - len(found)] + first).tolist()
            first, window = stop + 1, 2 * window
        return found

    def places(self, ids: list[int]) -> list[tuple[int, int]]:
        """(entry, offset) of each notification ID."""
        rows = self.rows(ids)
        return list(zip(rows["entry"].tolist(), rows["offset"].tolist()))


def _shown(key: Key) -> str:
    return str(UUID(bytes=key)) if isinstance(key, bytes) else repr(key)


# ---- DCB: the entry format and the index ---------------------------------------------

class DCBRow(NamedTuple):
    """What the index keeps of one DCB event of a batch."""

    type: str
    tags: tuple[str, ...]
    offset: int                     # of its DCB_EVENT header in the entry's payload


def encode_dcb_batch(events: Sequence[DCBEvent]) -> tuple[bytes, list[DCBRow]]:
    """The payload of the entry that stores DCB ``events``, and its rows."""
    parts = [BATCH.pack(DCB_FORMAT, 0, len(events))]
    offset, rows = BATCH.size, []
    for event in events:
        kind, tags = event.type.encode(), [tag.encode() for tag in event.tags]
        tag_lengths = struct.pack(f"<{len(tags)}H", *map(len, tags))
        parts += (DCB_EVENT.pack(len(kind), len(tags), len(event.data)), tag_lengths, kind,
                  *tags, event.data)
        rows.append(DCBRow(event.type, tuple(event.tags), offset))
        offset += (DCB_EVENT.size + len(tag_lengths) + len(kind) + sum(map(len, tags))
                   + len(event.data))
    return b"".join(parts), rows


def decode_dcb_batch(payload: memoryview) -> list[DCBRow]:
    """The rows of a DCB batch; ValueError if it is not one."""
    kind, _, count = BATCH.unpack_from(payload)
    if kind != DCB_FORMAT:
        raise ValueError(f"batch format {kind} (a DCB batch is {DCB_FORMAT})")
    offset, rows = BATCH.size, []
    for _ in range(count):
        event, end = decode_dcb_event(payload, offset)
        rows.append(DCBRow(event.type, tuple(event.tags), offset))
        offset = end
    return rows


def decode_dcb_event(payload: memoryview, offset: int) -> tuple[DCBEvent, int]:
    """The DCB event at ``offset``, and the offset after it."""
    type_len, tag_count, data_len = DCB_EVENT.unpack_from(payload, offset)
    at = offset + DCB_EVENT.size
    tag_lengths = struct.unpack_from(f"<{tag_count}H", payload, at)
    at += 2 * tag_count
    kind = str(payload[at:at + type_len], "utf-8")
    at += type_len
    tags = []
    for length in tag_lengths:
        tags.append(str(payload[at:at + length], "utf-8"))
        at += length
    end = at + data_len
    if end > len(payload):
        raise ValueError(f"DCB event at offset {offset} runs past the entry's end")
    return DCBEvent(type=kind, data=bytes(payload[at:end]), tags=tags), end


def tag_bytes(tag: str) -> bytes:
    return b"t" + tag.encode()


class _DCBIndex(StoredIndex):
    """Positions (dense from 1), their types and tags; the caller holds the lock.  A row is
    a position, a key pair (position, position) of each of its tags."""

    flavor = TAGS

    def __init__(self) -> None:
        super().__init__(tag_bytes)

    def add(self, entry: int, payload: bytes | memoryview, rows: list[DCBRow]) -> int:
        """Add the rows of log entry ``entry``; returns the last one's position."""
        for position, row in enumerate(rows, self.count + 1):
            for tag in set(row.tags):
                self.add_pair(tag, position, position)
        self.add_rows(entry, payload, [row.offset for row in rows],
                      [self.name_id(row.type) for row in rows])
        return self.count

    def match(self, query: DCBQuery | None, after: int | None, limit: int | None, upto: int
              ) -> tuple[list[int], bool]:
        """Positions after ``after`` and up to ``upto`` of the events that match an item of
        ``query`` (every event when it has none), ascending, at most ``limit``, and whether
        they match for certain: when not (a tag's positions came by its hash), the limit is
        not applied and the caller checks each event (``dcb_matches``).  An event matches an
        item when its type is one of the item's types (or the item has none) and it has all
        its tags."""
        first, last = max(after or 0, 0) + 1, upto
        if first > last or (limit is not None and limit <= 0):
            return [], True
        items = query.items if query is not None else []
        if not items or any(not item.types and not item.tags for item in items):
            end = last if limit is None else min(last, first + limit - 1)
            return list(range(first, end + 1)), True
        hits, sure = [], True
        for item in items:
            wanted = [self.name_ids[t] for t in item.types if t in self.name_ids]
            if item.types and not wanted:
                continue
            if not item.tags:       # types only: scan the type column
                at = np.flatnonzero(np.isin(self.row_names(first, last), wanted))
                hits.append(at + first)
                continue
            lists = []
            for tag in set(item.tags):
                positions, _, unsure = self.key_pairs(tag, first - 1, last)
                sure &= not unsure
                lists.append(positions)
            lists.sort(key=len)     # the rarest tag's positions, in every other tag's
            found = lists[0]
            for other in lists[1:]:
                found = found[np.isin(found, other)]
            if wanted and len(found):
                found = found[np.isin(self.rows(found)["name"], wanted)]
            hits.append(found)
        positions = np.sort(np.concatenate(hits)) if hits else _NO_POSITIONS
        if len(positions) > 1:      # (items may match one event twice)
            positions = positions[np.concatenate(([True], positions[1:] != positions[:-1]))]
        if limit is not None and sure:
            positions = positions[:limit]
        return positions.tolist(), sure

    def places(self, positions: list[int]) -> list[tuple[int, int]]:
        """(entry, offset) of each position."""
        rows = self.rows(positions)
        return list(zip(rows["entry"].tolist(), rows["offset"].tolist()))


_NO_POSITIONS = np.empty(0, np.int64)


def dcb_matches(event: DCBEvent, query: DCBQuery) -> bool:
    """Whether ``event`` matches an item of ``query`` (which has items)."""
    return any((not item.types or event.type in item.types) and set(item.tags) <= set(event.tags)
               for item in query.items)


# ---- datastores: one log directory each -----------------------------------------------

def read_payloads(log: pmemwal.Log, indices: Sequence[int]) -> list[memoryview]:
    """The payloads of log entries ``indices``, in that order (zero-copy views): every read
    of events goes through here, one call for what a read needs.  LogIndexError for an
    index the log does not hold."""
    entry = log.entry
    return [entry(i).payload for i in indices]


_T = TypeVar("_T")
_CLOSE_WAIT = 5.0    # seconds close waits for inserts it overtook to finish their commit
_WRITER_WAIT = 0.5   # seconds the WAL writer's index checkpoint waits for the datastore's lock


class _LogStore:
    """One log directory and its index, shared by the recorders that use it in this
    process.  Get one with ``open_datastore`` (or ``open_dcb_datastore``); each call is
    matched by one ``close``, and the last closes the log (so does garbage collection, for
    a datastore nobody closed).

    The index is stored beside the log (pmemwal/integrations/es_index.py): at each of the
    WAL's background checkpoints, on ``checkpoint()`` and on close; an open maps it and
    replays only the entries appended after it."""

    def __init__(self, path: str, **wal_options: Any) -> None:
        self.path = path
        self._lock = threading.Lock()       # inserts are checked and indexed in log order
        self._checkpoint_lock = threading.Lock()    # one index checkpoint at a time; first
        self._index = self._new_index()
        self._listeners: set[Event] = set()
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
        with _translated():
            self._log = pmemwal.open_log(path, **wal_options)
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

    def _replay_entry(self, entry: Any) -> None:
        """Add log entry ``entry`` to the index; ValueError or struct.error if it is not what
        this datastore writes."""
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
            warnings.warn(f"{self.path}: the eventsourcing index is not used ({why}); every "
                          "log entry is read instead", RecoveryWarning, stacklevel=4)
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
        """Store the index now: the next open replays no entry appended before the call."""
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
            yield

    def _append(self, payload: bytes, tracking: Tracking | None = None) -> int:
        """Append one entry (the caller holds the lock, then adds it to the index and
        calls ``_commit`` once it has let the lock go)."""
        if self._closing:   # (close waits for the commits in flight, not for new ones)
            raise InterfaceError(f"pmemwal: the datastore {self.path} is closing")
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
            return dict(zip(entries, read_payloads(self._log, entries)))
        except LogIndexError as exc:
            log = self._log
            gone = [p for p in places if not log.first_index <= p[0] <= log.last_index]
            self._misplaced((gone or list(places))[0], exc)
        except WALError as exc:
            with _translated():
                raise exc

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
                            f"{es_index.INDEX_DIR}/ there rebuilds it") from exc

    # ---- subscriptions: events set after each insert ----

    def listen(self, listener: Event) -> None:
        with self._lock:
            self._listeners.add(listener)

    def unlisten(self, listener: Event) -> None:
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
        if self._log.wal.on_writer_thread():
            threading.Thread(target=self.close, daemon=True,
                             name=f"pmemwal-close {self.path}").start()
            return
        with _registry_lock:    # held while the log closes: a new open must find it closed
            if self._users == 0:
                return
            self._users -= 1
            if self._users:
                return
            if _datastores.get(self.path) is self:
                del _datastores[self.path]
            try:
                self._last_checkpoint()
            except PersistenceError as exc:     # nothing is lost: the next open replays more
                self.index_error = exc.with_traceback(None)
                warnings.warn(f"{self.path}: the index was not stored at close ({exc}); the "
                              "next open replays the entries since its last checkpoint",
                              RuntimeWarning, stacklevel=2)
            finally:                            # (whatever else it raised)
                try:
                    with self._lock, _translated():  # (a reader holding it finds it closed)
                        self._close_log()
                finally:
                    held = self._release_held()
        for store in held:
            store.close()

    def _last_checkpoint(self) -> None:
        """Store the index before the log closes (no background one starts after this)."""
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

    def _replay_entry(self, entry: Any) -> None:
        tracking, rows = decode_batch(entry.payload)
        self._index.add(entry.index, entry.payload, rows, tracking)

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
        bounds: tuple[int | None, int | None] | None = (gt, lte)
        while True:     # (pages found by hash: read until ``limit`` are the key's)
            want = None if limit is None else limit - len(events)
            with self._locked():
                if want is not None and want <= 0:
                    return events
                ids, sure, bounds = self._index.event_ids(key, *bounds, desc, want,
                                                          self._visible)
                places = self._index.places(ids)
            events += [StoredEvent(*fields) for fields in
                       self._events(places, None if sure else key)]
            if bounds is None or len(events) == limit:
                return events

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *,
                             inclusive_of_start: bool = True) -> list[Notification]:
        first = 1 if start is None else start + (0 if inclusive_of_start else 1)
        with self._locked():
            ids = self._index.notification_ids(max(first, 1), stop, topics, limit,
                                               self._visible)
            places = self._index.places(ids)
        return [Notification(*fields, id=i) for i, fields in zip(ids, self._events(places))]

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

    def _replay_entry(self, entry: Any) -> None:
        self._index.add(entry.index, entry.payload, decode_dcb_batch(entry.payload))

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
        events = []
        for position, (event, _) in zip(positions, self._decoded(places, decode_dcb_event)):
            if sure or dcb_matches(event, query):
                events.append(DCBSequencedEvent(event=event, position=position))
                if len(events) == limit:
                    break
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


def _close_all(log: pmemwal.Log, index: StoredIndex, store: IndexStore) -> None:
    """Close a datastore's log and unmap its index (no checkpoint: close writes that).  A
    datastore nobody closed may die in the WAL writer's own thread (its last reference
    was the index checkpoint listener's): another thread closes it, as closing the WAL
    waits for that one to end."""
    if log.wal.on_writer_thread():
        threading.Thread(target=_close_all, args=(log, index, store), daemon=True,
                         name=f"pmemwal-close {log.wal.path}").start()
        return
    try:
        log.close()
    finally:
        index.close()
        store.close()


_datastores: weakref.WeakValueDictionary[str, _LogStore] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()
_S = TypeVar("_S", bound=_LogStore)


def _open_store(kind: type[_S], path: str | os.PathLike[str], **wal_options: Any) -> _S:
    key = os.path.realpath(path)
    with _registry_lock:
        store = _datastores.get(key)    # one that was closed for good has left the registry
        if store is None:
            store = _datastores[key] = kind(key, **wal_options)
        elif not isinstance(store, kind):
            raise OperationalError(f"pmemwal: {key} is open as a {type(store).__name__}, "
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


# ---- the recorders ----------------------------------------------------------------

class PmemwalRecorder(Recorder):
    """A recorder over a datastore (one log directory)."""

    def __init__(self, datastore: Any) -> None:
        self.datastore = datastore


class PmemwalAggregateRecorder(PmemwalRecorder, AggregateRecorder):
    def insert_events(self, stored_events: Sequence[StoredEvent],
                      **kwargs: Any) -> Sequence[int] | None:
        self.datastore.insert(stored_events)
        return None     # what eventsourcing's tests expect of an aggregate recorder

    def select_events(self, originator_id: UUID | str, *, gt: int | None = None,
                      lte: int | None = None, desc: bool = False,
                      limit: int | None = None) -> list[StoredEvent]:
        return self.datastore.select_events(originator_id, gt=gt, lte=lte, desc=desc, limit=limit)


class PmemwalApplicationRecorder(PmemwalAggregateRecorder, ApplicationRecorder):
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        return self.datastore.insert(stored_events)

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *,
                             inclusive_of_start: bool = True) -> list[Notification]:
        return self.datastore.select_notifications(start, limit, stop, topics,
                                                   inclusive_of_start=inclusive_of_start)

    def max_notification_id(self) -> int | None:
        return self.datastore.max_notification_id()

    def subscribe(self, gt: int | None = None,
                  topics: Sequence[str] = ()) -> PmemwalSubscription:
        return PmemwalSubscription(self, gt=gt, topics=topics)


class PmemwalTrackingRecorder(PmemwalRecorder, TrackingRecorder):
    """Tracking records in a tracking log; its application's process recorders keep theirs
    in the events log (``datastore.tracking_peer``), and both count for both."""

    def _tracked_also(self) -> tuple[PmemwalDatastore, ...]:
        peer = self.datastore.tracking_peer
        return () if peer is None else (peer,)

    def insert_tracking(self, tracking: Tracking) -> None:
        self.datastore.insert((), tracking, tracked_also=self._tracked_also())

    def max_tracking_id(self, application_name: str) -> int | None:
        return self.datastore.max_tracking_id(application_name,
                                              tracked_also=self._tracked_also())


class PmemwalProcessRecorder(PmemwalTrackingRecorder, PmemwalApplicationRecorder, ProcessRecorder):
    """Events and their tracking records in the events log; ``tracking_datastore``, when
    given, is the application's tracking log, whose tracking positions count here too."""

    def __init__(self, datastore: PmemwalDatastore,
                 tracking_datastore: PmemwalDatastore | None = None) -> None:
        super().__init__(datastore)
        self.tracking_datastore = tracking_datastore

    def _tracked_also(self) -> tuple[PmemwalDatastore, ...]:
        return () if self.tracking_datastore is None else (self.tracking_datastore,)

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        """The events and their tracking record go in one entry: both are stored, or neither."""
        return self.datastore.insert(stored_events, kwargs.get("tracking"),
                                     tracked_also=self._tracked_also())


class PmemwalSubscription(ListenNotifySubscription[PmemwalApplicationRecorder]):
    """Notifications after ``gt``, then new ones as they are stored (woken by each insert)."""

    def __init__(self, recorder: PmemwalApplicationRecorder, gt: int | None = None,
                 topics: Sequence[str] = ()) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        recorder.datastore.listen(self._has_been_notified)
        # The pull thread started before we listened: pull once more, or an insert made in
        # between would wait for the next one.
        self._has_been_notified.set()

    def stop(self) -> None:
        super().stop()
        self._recorder.datastore.unlisten(self._has_been_notified)


class PmemwalDCBRecorder(PmemwalRecorder, DCBRecorder):
    """eventsourcing's DCB recorder (dynamic consistency boundaries) over a DCB events log."""

    datastore: PmemwalDCBDatastore

    def read(self, query: DCBQuery | None = None, *, after: int | None = None,
             limit: int | None = None) -> DCBReadResponse:
        events, head = self.datastore.read(query, after=after, limit=limit)
        return PmemwalDCBReadResponse(events, head)

    def append(self, events: Sequence[DCBEvent],
               condition: DCBAppendCondition | None = None) -> int:
        return self.datastore.append(events, condition)

    def subscribe(self, query: DCBQuery | None = None, *,
                  after: int | None = None) -> PmemwalDCBSubscription:
        return PmemwalDCBSubscription(self, query=query, after=after)


class PmemwalDCBReadResponse(DCBReadResponse):
    def __init__(self, events: list[DCBSequencedEvent], head: int | None) -> None:
        self._events = iter(events)
        self._head = head

    @property
    def head(self) -> int | None:
        return self._head

    def __next__(self) -> DCBSequencedEvent:
        return next(self._events)


class PmemwalDCBSubscription(DCBListenNotifySubscription[PmemwalDCBRecorder]):
    """DCB events after ``after`` that match ``query``, then new ones as they are stored."""

    def __init__(self, recorder: PmemwalDCBRecorder, query: DCBQuery | None = None,
                 after: int | None = None) -> None:
        super().__init__(recorder=recorder, query=query, after=after)
        recorder.datastore.listen(self._has_been_notified)
        self._has_been_notified.set()   # as PmemwalSubscription: an insert in between

    def stop(self) -> None:
        super().stop()
        self._recorder.datastore.unlisten(self._has_been_notified)


# ---- the factory --------------------------------------------------------------------

_R = TypeVar("_R", bound=PmemwalRecorder)


class PmemwalFactory(InfrastructureFactory[PmemwalTrackingRecorder],
                     DCBInfrastructureFactory[PmemwalTrackingRecorder]):
    """Makes the recorders of an application (and a DCB application's recorder), each over
    its log directory (see the module)."""

    PMEMWAL_PATH = "PMEMWAL_PATH"
    PMEMWAL_MODE = "PMEMWAL_MODE"
    PMEMWAL_SEGMENT_SIZE = "PMEMWAL_SEGMENT_SIZE"
    PMEMWAL_CHECKPOINT_INTERVAL = "PMEMWAL_CHECKPOINT_INTERVAL"
    CREATE_TABLE = "CREATE_TABLE"

    aggregate_recorder_class = PmemwalAggregateRecorder
    application_recorder_class = PmemwalApplicationRecorder
    tracking_recorder_class = PmemwalTrackingRecorder
    process_recorder_class = PmemwalProcessRecorder
    dcb_recorder_class = PmemwalDCBRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        path = self.env.get(self.PMEMWAL_PATH)
        if not path:
            keys = ", ".join(self.env.create_keys(self.PMEMWAL_PATH))
            raise OSError(f"pmemwal: no directory in the environment (keys: {keys})")
        self.path = path
        self._datastores: dict[str, _LogStore] = {}
        self._lock = threading.Lock()

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        return self.aggregate_recorder_class(self.datastore(f"{self._prefix('stored')}_{purpose}"))

    def application_recorder(self) -> ApplicationRecorder:
        cls = self._recorder_class(self.APPLICATION_RECORDER_TOPIC, self.application_recorder_class)
        return cls(self.datastore(self._events_name()))

    def tracking_recorder(self, tracking_recorder_class: type[PmemwalTrackingRecorder] | None = None
                          ) -> PmemwalTrackingRecorder:
        cls = self._recorder_class(self.TRACKING_RECORDER_TOPIC, self.tracking_recorder_class,
                                   tracking_recorder_class)
        tracking = self.datastore(self._tracking_name())
        self._share_tracking(tracking)
        return cls(tracking)

    def process_recorder(self) -> ProcessRecorder:
        cls = self._recorder_class(self.PROCESS_RECORDER_TOPIC, self.process_recorder_class)
        events = self.datastore(self._events_name())
        tracking = self.datastore(self._tracking_name())
        self._share_tracking(tracking, events)
        return cls(events, tracking)

    def dcb_recorder(self) -> PmemwalDCBRecorder:
        return self.dcb_recorder_class(
            self.datastore(f"{self._prefix('dcb')}_dcb_events", PmemwalDCBDatastore))

    def datastore(self, name: str, kind: type[_S] = PmemwalDatastore) -> _S:  # type: ignore
        """The datastore of directory ``name`` under the base path, opened on first use."""
        if not name or os.sep in name or name in (".", ".."):
            raise ValueError(f"pmemwal: {name!r} is not a directory name")
        with self._lock:
            if name not in self._datastores:
                self._datastores[name] = _open_store(kind, os.path.join(self.path, name),
                                                     **self._wal_options())
            store = self._datastores[name]
        if not isinstance(store, kind):
            raise OperationalError(f"pmemwal: {name} is open as a {type(store).__name__}")
        return store

    def _share_tracking(self, tracking: PmemwalDatastore,
                        events: PmemwalDatastore | None = None) -> None:
        """Let the application's tracking log see the tracking positions its process
        recorders keep in the events log, as eventsourcing's PostgreSQL module has its
        tracking and process recorders share one tracking table.  The tracking log holds the
        events log open: ``events``, else the application's events log if it exists (a
        process recorder made later links them then)."""
        with _link_lock:
            if tracking.tracking_peer is not None:
                return
            if events is not None:
                events.retain()
            else:
                path = os.path.join(self.path, self._events_name())
                if not os.path.isdir(path):
                    return
                events = open_datastore(path, **{**self._wal_options(), "create": False})
            tracking.tracking_peer = events

    def close(self) -> None:
        """Release the datastores this factory opened (the last user of each closes its log)."""
        with self._lock:
            datastores, self._datastores = list(self._datastores.values()), {}
        errors = []
        for datastore in datastores:    # each, whatever another raised
            try:
                datastore.close()
            except PersistenceError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _prefix(self, default: str) -> str:
        return self.env.name.lower() or default

    def _events_name(self) -> str:
        return f"{self._prefix('stored')}_events"

    def _tracking_name(self) -> str:
        return f"{self._prefix('notification')}_tracking"

    def _wal_options(self) -> dict[str, Any]:
        size = self.env.get(self.PMEMWAL_SEGMENT_SIZE)
        if size and not size.isdigit():
            raise OSError(f"pmemwal: {self.PMEMWAL_SEGMENT_SIZE}={size!r} is not a number of bytes")
        options = {"mode": self.env.get(self.PMEMWAL_MODE) or "auto",
                   "segment_size": int(size) if size else None,
                   "create": bool(strtobool(self.env.get(self.CREATE_TABLE) or "yes"))}
        interval = self.env.get(self.PMEMWAL_CHECKPOINT_INTERVAL)
        if interval:
            try:
                options["checkpoint_interval"] = float(interval)
            except ValueError:
                raise OSError(f"pmemwal: {self.PMEMWAL_CHECKPOINT_INTERVAL}={interval!r} is "
                              "not a number of seconds") from None
        return options

    def _recorder_class(self, topic_key: str, default: type[_R], given: type[_R] | None = None
                        ) -> type[_R]:
        """``given``, else the class named by the topic in ``topic_key``, else ``default``."""
        topic = self.env.get(topic_key)
        cls = given or (resolve_topic(topic) if topic else default)
        if not (isinstance(cls, type) and issubclass(cls, default)):
            raise TypeError(f"pmemwal: {cls!r} is not a subclass of {default.__qualname__}")
        return cls


_link_lock = threading.Lock()

Factory = PmemwalFactory
