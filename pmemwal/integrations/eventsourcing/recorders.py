"""eventsourcing's recorders over the datastores: aggregate, application, tracking, process
and DCB recorders, and a DCB read's response."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self
from uuid import UUID

from eventsourcing.dcb.api import (DCBAppendCondition, DCBEvent, DCBQuery, DCBReadResponse,
                                   DCBRecorder, DCBSequencedEvent)
from eventsourcing.persistence import (AggregateRecorder, ApplicationRecorder, Notification,
                                       ProcessRecorder, Recorder, StoredEvent, Tracking,
                                       TrackingRecorder)

from pmemwal.integrations.eventsourcing.datastore import PmemwalDatastore, PmemwalDCBDatastore
from pmemwal.integrations.eventsourcing.subscriptions import (PmemwalDCBSubscription,
                                                              PmemwalSubscription)

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
        return PmemwalSubscription(self, self.datastore, gt=gt, topics=topics)


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
                  after: int | None = None) -> PmemwalDCBSubscription[Self]:
        return PmemwalDCBSubscription(self, self.datastore, query=query, after=after)


class PmemwalDCBReadResponse(DCBReadResponse):
    def __init__(self, events: list[DCBSequencedEvent], head: int | None) -> None:
        self._events = iter(events)
        self._head = head

    @property
    def head(self) -> int | None:
        return self._head

    def __next__(self) -> DCBSequencedEvent:
        return next(self._events)
