"""(the module moved into this package: the split into modules follows)"""
from pmemwal.integrations.eventsourcing.datastore import *  # noqa: F401,F403
from pmemwal.integrations.eventsourcing.datastore import (  # noqa: F401
    __doc__, _datastores, _LogStore, _registry_lock)
for _cls in (PmemwalFactory, PmemwalAggregateRecorder, PmemwalApplicationRecorder,  # noqa: F405
             PmemwalTrackingRecorder, PmemwalProcessRecorder, PmemwalDCBRecorder,  # noqa: F405
             PmemwalDatastore, PmemwalDCBDatastore):  # noqa: F405
    _cls.__module__ = __name__      # the topics eventsourcing resolves name this module
