"""The WAL: a directory of segment files, appended to, flushed, read, truncated, recovered.

The ``WAL`` class is one object whose concerns live in rooms, one module each, stacked so
that each room may call the rooms below it and never those above:

- api.py: the face (open, append, flush, read, stats, close);
- opening.py: the order of an open, and recovery's place in it (recovery.py decides torn
  tail or damage);
- rounds.py: the background writer's round (segments made ahead, flush, checkpoint);
- truncation.py: truncate, recycle or remove, and the spare pool's size;
- checkpoints.py: when a checkpoint is written and the durable point it names;
- supply.py: segments made, opened, mapped and attached, in number order;
- peers.py: a shared WAL's segments that other processes made, truncated or recycled;
- persistence.py: cache flush, msync or the sync method;
- state.py: the fields they share;
- options.py: the options' defaults and checks.
"""

from pmemwal._core import Record
from pmemwal.wal.api import WAL, open
from pmemwal.wal.options import (DEFAULT_BUFFER_SIZE, DEFAULT_CHECKPOINT_BYTES,
                                 DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_FLUSH_INTERVAL,
                                 DEFAULT_GIL_RELEASE_SIZE, DEFAULT_MAX_PENDING,
                                 DEFAULT_MAX_RECORD_SIZE, DEFAULT_MAX_WAL_SIZE, INSERTION, MODES,
                                 ON_CORRUPTION, PERSIST, SYNC_METHODS, WALOptions,
                                 check_wal_options)
from pmemwal.wal.state import _weak

__all__ = ["WAL", "Record", "open", "check_wal_options", "DEFAULT_BUFFER_SIZE",
           "DEFAULT_CHECKPOINT_BYTES", "DEFAULT_CHECKPOINT_INTERVAL", "DEFAULT_FLUSH_INTERVAL",
           "DEFAULT_GIL_RELEASE_SIZE", "DEFAULT_MAX_PENDING", "DEFAULT_MAX_RECORD_SIZE",
           "DEFAULT_MAX_WAL_SIZE", "INSERTION", "MODES", "ON_CORRUPTION", "PERSIST",
           "SYNC_METHODS", "WALOptions", "_weak"]
