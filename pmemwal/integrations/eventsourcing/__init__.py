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
- ``PMEMWAL_READONLY``: ``yes`` opens the logs for reading only, beside the process that
  writes them (or with none): see "Other processes" below.  ``no`` by default.  Give it for
  the one application that another process writes (``BANKACCOUNTS_PMEMWAL_READONLY=yes``), so
  that a projection's own tracking log, in the same process, is still written.

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

Other processes.  A log takes one writer process; another that opens it for writing gets
OperationalError (saying so).  A process that only reads an application's events (a
``ProjectionRunner`` of eventsourcing's ``eventsourcing.projection``, a subscription, a report)
sets ``<APP>_PMEMWAL_READONLY=yes``: its recorders then open the logs read-only
(``pmemwal.open_log(path, readonly=True)``: no lock, nothing written), read every entry into
their index at open, and follow the log from there: a thread per log sleeps in
``pmemwal.follow_log`` until the writer's flush makes entries durable (a futex wake-up, no
polling), indexes each, and wakes the subscriptions, which see the same notification IDs in
the same order as the writer's own, each once it is durable (as the writer's readers do).  A
subscription whose iterating thread waits gets the new entry's notifications from that
thread at once (no look-up, one thread switch).  ``insert_events`` (and every write) raises
OperationalError.  Nothing is stored beside the log by a reader: its index is in memory (the
writer's stored index is not used), and its open reads every entry.  Should the log be rewound
under it (a writer's recovery cutting damaged entries), its reads raise DatabaseError: open it
again.  A process may write one application and read another.

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

Notification IDs are not stored: they are the events' positions in the log, counted on replay
(dense: 1, 2, 3... across entries).  The index is stored beside the log (``index/es/``), and
opening a directory maps it and replays the entries after it: per notification, the entry and
offset of its event and its topic (numpy columns); per originator, its versions in order and
their notification IDs (sorted runs, and lists for those added since: ``select_events`` and an
insert's version check search them by bisection, so that neither follows the originator's
number of versions nor scans other events); per application name, the last tracked
notification.  Events are read back from the log when selected, the entries a read needs in one
batch (zero-copy).  An originator is indexed by its UUID, and a str that is a UUID's string form
(``str(uuid)``: 36 characters, lower case) is that UUID, as in eventsourcing's POPO and
PostgreSQL modules: an event stored under either form is found by either, and takes the version
for both.  Each event comes back with the ID as it was stored (kind 0 or 1); other
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

from pmemwal.integrations.eventsourcing.datastore import (PmemwalDatastore, PmemwalDCBDatastore,
                                                          _datastores, _LogStore,
                                                          _registry_lock, open_datastore,
                                                          open_dcb_datastore, read_payloads)
from pmemwal.integrations.eventsourcing.encoding import (BATCH, DCB_EVENT, DCB_FORMAT, EVENT,
                                                         FORMAT_VERSION, HAS_TRACKING, ID_STR,
                                                         ID_UUID, TRACKING, DCBRow, Key, Row,
                                                         decode_batch, decode_dcb_batch,
                                                         decode_dcb_event, decode_event,
                                                         decode_events, encode_batch,
                                                         encode_dcb_batch, originator_key,
                                                         str_key)
from pmemwal.integrations.eventsourcing.factory import Factory, PmemwalFactory
from pmemwal.integrations.eventsourcing.index import dcb_matches, originator_bytes, tag_bytes
from pmemwal.integrations.eventsourcing.recorders import (PmemwalAggregateRecorder,
                                                          PmemwalApplicationRecorder,
                                                          PmemwalDCBReadResponse,
                                                          PmemwalDCBRecorder,
                                                          PmemwalProcessRecorder,
                                                          PmemwalRecorder,
                                                          PmemwalTrackingRecorder)
from pmemwal.integrations.eventsourcing.subscriptions import (PmemwalDCBSubscription,
                                                              PmemwalSubscription)

__all__ = [
    "BATCH", "DCB_EVENT", "DCB_FORMAT", "EVENT", "FORMAT_VERSION", "HAS_TRACKING", "ID_STR",
    "ID_UUID", "TRACKING", "DCBRow", "Factory", "Key", "PmemwalAggregateRecorder",
    "PmemwalApplicationRecorder", "PmemwalDatastore", "PmemwalDCBDatastore",
    "PmemwalDCBReadResponse", "PmemwalDCBRecorder", "PmemwalDCBSubscription", "PmemwalFactory",
    "PmemwalProcessRecorder", "PmemwalRecorder", "PmemwalSubscription",
    "PmemwalTrackingRecorder", "Row", "dcb_matches", "decode_batch", "decode_dcb_batch",
    "decode_dcb_event", "decode_event", "decode_events", "encode_batch", "encode_dcb_batch",
    "open_datastore", "open_dcb_datastore", "originator_bytes", "originator_key",
    "read_payloads", "str_key", "tag_bytes", "_LogStore", "_datastores", "_registry_lock",
]

for _cls in (PmemwalFactory, PmemwalRecorder, PmemwalAggregateRecorder, PmemwalApplicationRecorder,
             PmemwalTrackingRecorder, PmemwalProcessRecorder, PmemwalDCBRecorder,
             PmemwalDCBReadResponse, PmemwalSubscription, PmemwalDCBSubscription,
             PmemwalDatastore, PmemwalDCBDatastore):
    _cls.__module__ = __name__      # the topics eventsourcing makes of them name this module
