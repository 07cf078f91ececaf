"""Subscriptions: the notifications (or DCB events) stored after a point, then new ones as
they are stored, woken by each insert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eventsourcing.dcb.api import DCBQuery
from eventsourcing.dcb.persistence import DCBListenNotifySubscription
from eventsourcing.persistence import ListenNotifySubscription

if TYPE_CHECKING:
    from pmemwal.integrations.eventsourcing.recorders import (PmemwalApplicationRecorder,
                                                              PmemwalDCBRecorder)

class PmemwalSubscription(ListenNotifySubscription["PmemwalApplicationRecorder"]):
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


class PmemwalDCBSubscription(DCBListenNotifySubscription["PmemwalDCBRecorder"]):
    """DCB events after ``after`` that match ``query``, then new ones as they are stored."""

    def __init__(self, recorder: PmemwalDCBRecorder, query: DCBQuery | None = None,
                 after: int | None = None) -> None:
        super().__init__(recorder=recorder, query=query, after=after)
        recorder.datastore.listen(self._has_been_notified)
        self._has_been_notified.set()   # as PmemwalSubscription: an insert in between

    def stop(self) -> None:
        super().stop()
        self._recorder.datastore.unlisten(self._has_been_notified)
