"""A datastore's log followed from a process that does not write it (``PMEMWAL_READONLY``).

One thread per read-only datastore follows the log (``pmemwal.follow_log``): it sleeps on
the writer's futex until a flush makes entries durable, hands each entry to the datastore,
which adds it to its index and wakes its subscriptions.  So a reader sees an insert once it
is durable, as the writing process's own readers do, and never polls.  Its only timeout
lets ``stop`` end it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

import pmemwal

_STOP_CHECK = 0.2   # seconds a follower waits for entries before it looks whether to stop


class Followed(Protocol):
    """What a read-only datastore gives the thread that follows its log."""

    path: str

    def followed(self, item: Any) -> None: ...

    def follow_failed(self, error: BaseException) -> None: ...


class LogTail:
    """Follows the log of ``store`` from entry ``start`` in a daemon thread, handing each
    entry (and each rewind, compaction or reset the follower reports) to
    ``store.followed``.  Holds the store weakly: a store nobody holds still goes."""

    def __init__(self, store: Followed, start: int) -> None:
        self._store = weakref.ref(store)
        self._stopping = threading.Event()
        self._follower = pmemwal.follow_log(store.path, start, timeout=_STOP_CHECK)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"pmemwal-es-follow {store.path}")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                for item in self._follower:     # (ends after _STOP_CHECK with nothing new)
                    store = self._store()
                    if store is None or self._stopping.is_set():
                        return
                    store.followed(item)
                    del store
                if self._store() is None:
                    return
        except BaseException as exc:   # reads then raise it: the index stopped following
            store = self._store()
            if store is not None and not self._stopping.is_set():
                store.follow_failed(exc)
        finally:
            self._follower.close()

    def stop(self) -> None:
        """End the thread (within _STOP_CHECK), unless this is it."""
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
