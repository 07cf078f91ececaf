"""What the eventsourcing datastores' indexes mean: notifications and originators' versions
(an events log), positions and tags (a DCB events log), and tracking positions.  Their storage
is stored_index.py's; the caller holds the datastore's lock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from uuid import UUID

import numpy as np
from eventsourcing.dcb.api import DCBEvent, DCBQuery
from eventsourcing.persistence import IntegrityError, Tracking

from pmemwal.integrations.eventsourcing.encoding import DCBRow, Key, Row
from pmemwal.integrations.eventsourcing.stored_index import ORIGINATORS, TAGS, StoredIndex

def originator_bytes(key: Key) -> bytes:
    """An originator key's bytes for its hash: a UUID's and a str's never coincide."""
    return b"u" + key if isinstance(key, bytes) else b"s" + key.encode()


class _Index(StoredIndex[Key]):
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
                     "stored already" if self.has_pair(     # (which calls the check at once)
                         row.key, row.version, lambda i: key_of(i) == row.key) else None)
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


# ---- DCB ----------------------------------------------------------------------------

def tag_bytes(tag: str) -> bytes:
    return b"t" + tag.encode()


class _DCBIndex(StoredIndex[str]):
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
