"""Subscriptions: the notifications (or DCB events) stored after a point, then new ones as
they are stored, woken by each insert into the datastore they listen to."""

from __future__ import annotations

from collections.abc import Sequence

from eventsourcing.dcb.api import DCBQuery
from eventsourcing.dcb.persistence import DCBListenNotifySubscription, DCBRecorder
from eventsourcing.persistence import ApplicationRecorder, ListenNotifySubscription

from pmemwal.integrations.eventsourcing.datastore import _LogStore


class PmemwalSubscription(ListenNotifySubscription[ApplicationRecorder]):
    """Notifications after ``gt``, then new ones as they are stored (woken by each insert
    into ``datastore``, the recorder's)."""

    def __init__(self, recorder: ApplicationRecorder, datastore: _LogStore, gt: int | None = None,
                 topics: Sequence[str] = ()) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._datastore = datastore
        datastore.listen(self._has_been_notified)
        # The pull thread started before we listened: pull once more, or an insert made in
        # between would wait for the next one.
        self._has_been_notified.set()

    def stop(self) -> None:
        super().stop()
        self._datastore.unlisten(self._has_been_notified)


class PmemwalDCBSubscription(DCBListenNotifySubscription[DCBRecorder]):
    """DCB events after ``after`` that match ``query``, then new ones as they are stored."""

    def __init__(self, recorder: DCBRecorder, datastore: _LogStore,
                 query: DCBQuery | None = None, after: int | None = None) -> None:
        super().__init__(recorder=recorder, query=query, after=after)
        self._datastore = datastore
        datastore.listen(self._has_been_notified)
        self._has_been_notified.set()   # as PmemwalSubscription: an insert in between

    def stop(self) -> None:
        super().stop()
        self._datastore.unlisten(self._has_been_notified)
