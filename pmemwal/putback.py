"""Putting a lost+found entry back: its records appended to the WAL again, as new records.

Concern: ``pmemwal lost-found WAL --restore NAME``.  What a cut set aside (lostfound.py)
is appended in order, flushed, and only then is the entry removed; a try cut short is safe
to repeat.  Above the WAL (it opens one), which is why it is not in lostfound.py: recovery
imports that module.
"""

from __future__ import annotations

import os
from typing import Unpack

from pmemwal import lostfound
from pmemwal.errors import ConfigError, CorruptionError
from pmemwal.segments import sync_directory
from pmemwal.wal import WAL, WALOptions
from pmemwal.wal import open as open_wal

_RESTORING = "RESTORING"  # the insert LSN a put-back began at: a second try checks it


def restore(wal_dir: str, name: str, **wal_options: Unpack[WALOptions]) -> int:
    """Append the records of lost+found entry ``name`` to the WAL, in order, as new records
    (new LSNs), flush them, then remove the entry; returns how many it holds.  A try cut
    short is safe to repeat: the LSN it began at is noted first, and a repeat appends only
    the records it does not find there, in order."""
    entry = lostfound.find(wal_dir, name)
    records = [payload for _, payload in entry.records()]
    marker = os.path.join(entry.path, _RESTORING)
    if "create" in wal_options:
        raise ConfigError("restore puts records back into a WAL that exists: no create option")
    options: WALOptions = {**wal_options, "create": False}
    with open_wal(wal_dir, **options) as wal:
        _check_finished(wal_dir, name)
        begun = _begun_at(marker)
        done = 0 if begun is None else _already_there(wal, begun, records)
        if done == 0:  # (again) from here
            _write_synced_over(marker, str(wal.insert_lsn).encode())
        if done < len(records):
            wal.append_many(records[done:])
            wal.flush()
    lostfound.remove(wal_dir, name)
    return len(records)


def _check_finished(wal_dir: str, name: str) -> None:
    """A pending entry (lostfound.set_aside) whose cut this open did not finish: a crash
    stopped that cut before it zeroed anything, and its records may still be in the WAL."""
    if lostfound.find(wal_dir, name).pending:
        raise ConfigError(f"lost+found entry {name!r} is pending: the open that cut there was "
                          "stopped before the cut was made, and its records may still be in "
                          "the WAL; open the WAL as that open did (verify='all', "
                          "on_corruption='truncate') to finish the cut, or remove the entry")


def _begun_at(marker: str) -> int | None:
    try:
        with open(marker, "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _already_there(wal: WAL, lsn: int, records: list[bytes]) -> int:
    """How many of ``records`` the WAL holds from ``lsn`` on, in order (a put-back cut short
    after part of it became durable): those are not appended again."""
    done = 0
    if lsn >= wal.insert_lsn:
        return 0
    try:
        for rec in wal.records(lsn):
            if done == len(records) or bytes(rec.payload) != records[done]:
                break
            done += 1
    except (ValueError, CorruptionError):
        pass
    return done


def _write_synced_over(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    lostfound.write_synced(tmp, data, os.O_TRUNC)
    os.rename(tmp, path)
    sync_directory(os.path.dirname(path))
