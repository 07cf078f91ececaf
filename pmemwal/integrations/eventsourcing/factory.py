"""The persistence module's factory: an application's recorders, each over its log directory
under ``PMEMWAL_PATH`` (the package's docstring)."""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar, overload

from eventsourcing.dcb.persistence import DCBInfrastructureFactory
from eventsourcing.persistence import (AggregateRecorder, ApplicationRecorder,
                                       InfrastructureFactory, OperationalError, PersistenceError,
                                       ProcessRecorder)
from eventsourcing.utils import Environment, EnvType, resolve_topic, strtobool

from pmemwal.integrations.eventsourcing.datastore import (PmemwalDatastore, PmemwalDCBDatastore,
                                                          _LogStore, _open_store, _S,
                                                          open_datastore)
from pmemwal.integrations.eventsourcing.recorders import (PmemwalAggregateRecorder,
                                                          PmemwalApplicationRecorder,
                                                          PmemwalDCBRecorder,
                                                          PmemwalProcessRecorder,
                                                          PmemwalRecorder,
                                                          PmemwalTrackingRecorder)

_R = TypeVar("_R", bound=PmemwalRecorder)


class PmemwalFactory(InfrastructureFactory[PmemwalTrackingRecorder],
                     DCBInfrastructureFactory[PmemwalTrackingRecorder]):
    """Makes the recorders of an application (and a DCB application's recorder), each over
    its log directory (see the module)."""

    PMEMWAL_PATH = "PMEMWAL_PATH"
    PMEMWAL_MODE = "PMEMWAL_MODE"
    PMEMWAL_SEGMENT_SIZE = "PMEMWAL_SEGMENT_SIZE"
    PMEMWAL_CHECKPOINT_INTERVAL = "PMEMWAL_CHECKPOINT_INTERVAL"
    PMEMWAL_READONLY = "PMEMWAL_READONLY"
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
        self.readonly = bool(strtobool(self.env.get(self.PMEMWAL_READONLY) or "no"))
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

    @overload
    def datastore(self, name: str) -> PmemwalDatastore: ...
    @overload
    def datastore(self, name: str, kind: type[_S]) -> _S: ...

    def datastore(self, name: str, kind: type[_LogStore] = PmemwalDatastore) -> _LogStore:
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
        if self.readonly:
            return {"readonly": True}
        if size and not size.isdigit():
            raise OSError(f"pmemwal: {self.PMEMWAL_SEGMENT_SIZE}={size!r} is not a number of bytes")
        options: dict[str, Any] = {"mode": self.env.get(self.PMEMWAL_MODE) or "auto",
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
