"""pmemwal: a write-ahead-log writer for persistent memory.

    import pmemwal
    with pmemwal.open("/dev/shm/wal") as wal:
        lsn = wal.append(b"hello")
        wal.flush(lsn)
        for rec in wal.records():
            print(rec.lsn, bytes(rec.payload))
"""

import os as _os

if _os.environ.get("PMEMWAL_TRACED_CORE") == "1":  # the power-loss simulator's build (setup.py)
    from pmemwal._traced import use_traced_core
    use_traced_core()

from pmemwal.device import ProbeResult, probe
from pmemwal.errors import (ArchiveError, ClosedError, ConfigError, CorruptionError,
                            FollowerLostError, FormatError, LockedError, LogIndexError,
                            NotFoundError, ReadOnlyError, RecordTooLargeError, StalledWriterError,
                            StorageError, TermError, TruncatedError, WALError, WriterStoppedError,
                            format_lsn)
from pmemwal.wal import WAL, Record, open
from pmemwal.log import Entry, HardState, Log, open_log
from pmemwal.follow import Follower, drop_follower, follow, followers
from pmemwal.readonly import ReadOnlyWAL
from pmemwal.recovery import RecoveryWarning
from pmemwal.log_readonly import ReadOnlyLog
from pmemwal.log_follow import Compacted, LogFollower, Reset, Rewound, follow_log

__all__ = [
    "open", "WAL", "Record", "probe", "ProbeResult", "format_lsn",
    "open_log", "Log", "Entry", "HardState", "LogIndexError", "TermError",
    "WALError", "CorruptionError", "FormatError", "LockedError", "ClosedError",
    "NotFoundError", "ConfigError", "RecordTooLargeError", "StorageError", "WriterStoppedError",
    "ArchiveError", "TruncatedError", "StalledWriterError",
    "ReadOnlyWAL", "ReadOnlyError", "follow", "Follower", "followers", "drop_follower",
    "FollowerLostError", "ReadOnlyLog", "follow_log", "LogFollower", "Rewound", "Compacted",
    "Reset", "RecoveryWarning",
]
__version__ = "0.1.0"
