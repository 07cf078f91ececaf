"""Subscriptions: the notifications (or DCB events) stored after a point, then new ones as
they are stored, woken by each insert into the datastore they listen to.

Over a read-only datastore (``PMEMWAL_READONLY``) the thread that follows the log wakes them,
and pulls what it indexed at once, in its own thread, while the subscription's pull thread
is idle and its queue empty: a new event then reaches the iterating thread in one thread
switch, not two (a reader's lag, measured by benchmarks/es_follow.py).  Otherwise, or when
that pull cannot finish at once (the queue is full, a page is full, it raised), the pull
thread is woken to do it, as in the writing process."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from eventsourcing.dcb.api import DCBQuery
from eventsourcing.dcb.persistence import DCBListenNotifySubscription, DCBRecorder
from eventsourcing.persistence import ApplicationRecorder, ListenNotifySubscription, Notification

from pmemwal.integrations.eventsourcing.datastore import PmemwalDatastore, _LogStore


class _Nudge:
    """What a read-only datastore's follower sets, for a subscription: pull now."""

    __slots__ = ("pull_now",)

    def __init__(self, subscription: Any) -> None:
        self.pull_now = subscription._pull_now

    def set(self) -> None:
        self.pull_now()


class _Listening:
    """A subscription's listening to its datastore, and the follower's pulls (a mixin
    over eventsourcing's listen-notify subscriptions)."""

    _datastore: _LogStore
    _has_been_notified: threading.Event
    _has_been_stopped: bool
    _pull_lock: threading.Lock              # (each subscription makes it before it starts)

    def _listen(self, datastore: _LogStore) -> None:
        self._datastore = datastore
        self._listener: Any = _Nudge(self) if datastore.readonly else self._has_been_notified
        datastore.listen(self._listener)
        # The pull thread started before we listened: pull once more, or an insert made in
        # between would wait for the next one.
        self._has_been_notified.set()

    def _pull_now(self) -> None:
        """In the follower's thread: pull, unless the pull thread is at it or its queue
        holds something (then wake it instead: pulls take turns, under the pull lock)."""
        if not self._pull_lock.acquire(blocking=False):
            self._has_been_notified.set()
            return
        try:
            if self._has_been_stopped:
                return
            if not self._pulled_at_once():
                self._has_been_notified.set()
        except BaseException:   # the pull thread meets it again, and reports it
            self._has_been_notified.set()
        finally:
            self._pull_lock.release()

    def _pulled_at_once(self) -> bool:
        raise NotImplementedError

    def _unlisten(self) -> None:
        self._datastore.unlisten(self._listener)


class PmemwalSubscription(_Listening, ListenNotifySubscription[ApplicationRecorder]):
    """Notifications after ``gt``, then new ones as they are stored (woken by each insert
    into ``datastore``, the recorder's, or in a read-only one by its follower)."""

    _datastore: PmemwalDatastore

    def __init__(self, recorder: ApplicationRecorder, datastore: PmemwalDatastore,
                 gt: int | None = None,
                 topics: Sequence[str] = ()) -> None:
        self._pull_lock = threading.Lock()     # (the pull thread starts in __init__)
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._listen(datastore)

    def _pull(self) -> None:
        with self._pull_lock:
            super()._pull()

    def _pulled_at_once(self) -> bool:
        """Pull in this thread: False when the pull thread should (see the module)."""
        if self._notifications_queue.qsize():
            return False
        after = self._last_notification_id or 0
        notifications: Sequence[Notification] | None = \
            self._datastore.latest_notifications(after, self._topics)
        if notifications is None:
            notifications = self._recorder.select_notifications(
                start=after, limit=self._select_limit, topics=self._topics,
                inclusive_of_start=False)
        if notifications:
            try:
                self._notifications_queue.put_nowait(notifications)
            except queue.Full:
                return False
            self._last_notification_id = notifications[-1].id
        return len(notifications) < self._select_limit

    def stop(self) -> None:
        super().stop()
        self._unlisten()


_DCBRecorderT = TypeVar("_DCBRecorderT", bound=DCBRecorder, covariant=True)


class PmemwalDCBSubscription(_Listening, DCBListenNotifySubscription[_DCBRecorderT]):
    """DCB events after ``after`` that match ``query``, then new ones as they are stored."""

    def __init__(self, recorder: _DCBRecorderT, datastore: _LogStore,
                 query: DCBQuery | None = None, after: int | None = None) -> None:
        self._pull_lock = threading.Lock()
        super().__init__(recorder=recorder, query=query, after=after)
        self._listen(datastore)

    def _pull(self) -> None:
        with self._pull_lock:
            super()._pull()

    def _pulled_at_once(self) -> bool:
        if self._events_queue.qsize():
            return False
        events = list(self._recorder.read(query=self._query, after=self._last_position,
                                          limit=self.select_limit))
        if events:
            try:
                self._events_queue.put_nowait(events)
            except queue.Full:
                return False
            self._last_position = events[-1].position
        return len(events) < self.select_limit

    def stop(self) -> None:
        super().stop()
        self._unlisten()
