"""The entry formats of the eventsourcing datastores: a batch of stored events (with a
tracking record), a DCB batch, and the events inside them (the package's docstring gives the
layouts).  Pure functions of bytes: nothing here reads or writes a log."""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple
from uuid import UUID

from eventsourcing.dcb.api import DCBEvent
from eventsourcing.persistence import DataError, StoredEvent, Tracking

FORMAT_VERSION = 1
HAS_TRACKING = 1                    # batch flags: a tracking record follows the header
ID_UUID, ID_STR = 0, 1              # event: how the originator ID is stored
BATCH = struct.Struct("<BBI")       # format version, flags, number of events
TRACKING = struct.Struct("<qH")     # notification ID, application name length (the name follows)
EVENT = struct.Struct("<BHHIq")     # ID kind, ID length, topic length, state length, version
DCB_FORMAT = 2                      # a DCB batch's first byte (BATCH's "format version" place)
DCB_EVENT = struct.Struct("<HHI")   # type length, number of tags, data length


# ---- stored events ------------------------------------------------------------------

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
    ``payloads``; with ``key``, only the events of that originator.  One loop, in which the
    ID and topic, read as one piece, are decoded once a call (the events of a batch, or of
    a page, share few originators and topics).  PlaceError (a ValueError) names a place
    where no event is."""
    out = []
    known: tuple[dict[bytes, tuple[UUID | str, Key, str, int]], ...] = ({}, {})   # by ID kind
    unpack, header = EVENT.unpack_from, EVENT.size
    entry, offset = -1, -1
    try:
        for entry, offset in places:
            payload = payloads[entry]
            kind, id_len, topic_len, state_len, version = unpack(payload, offset)
            c = offset + header + id_len + topic_len
            end = c + state_len
            if end > len(payload) or kind > ID_STR:
                raise ValueError(f"event at offset {offset} has originator ID kind {kind}"
                                 if kind > ID_STR else
                                 f"event at offset {offset} runs past the entry's end")
            head = payload[offset + header:c].tobytes()       # the ID, then the topic
            fields = known[kind].get(head)
            if fields is None or fields[3] != id_len:    # (str IDs: "ab"+"c" is "a"+"bc")
                fields = known[kind][head] = _id_and_topic(kind, head, id_len)
            if key is None or fields[1] == key:
                out.append((fields[0], version, fields[2], payload[c:end].tobytes()))
    except (ValueError, struct.error) as exc:
        raise PlaceError(entry, offset, exc) from exc
    return out


class PlaceError(ValueError):
    """No event is at this (entry, offset) place."""

    def __init__(self, entry: int, offset: int, why: Exception) -> None:
        super().__init__(str(why))
        self.place = (entry, offset)


def _id_and_topic(kind: int, head: bytes, id_len: int
                  ) -> tuple[UUID | str, Key, str, int]:
    """(originator ID, index key, topic, ID length) of an event's ID and topic, stored one
    after the other."""
    ident, topic = head[:id_len], str(head[id_len:], "utf-8")
    if kind == ID_UUID:
        return _uuid(ident), ident, topic, id_len
    text = str(ident, "utf-8")
    return text, str_key(text), topic, id_len


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


# ---- DCB events ---------------------------------------------------------------------

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
