"""Putting a lost+found entry back: its records appended to the WAL again, as new records.

Concern: ``pmemwal lost-found WAL --restore NAME``.  What a cut set aside (lostfound.py)
is appended in order, flushed, and only then is the entry removed; a try cut short is safe
to repeat.  Above the WAL (it opens one), which is why it is not in lostfound.py: recovery
imports that module.

A pmemwal.Log's records go back only where its replay reads them as they were written: into
the log as it stood at the cut (nothing appended since), continuing its entries without a
gap.  Otherwise the put-back is refused (LogIndexError) and writes nothing: replayed after
entries appended since, entries with lower indexes would void those (a lower index overrides
what follows) and take the terms back; after a gap, the log would not open.
"""

from __future__ import annotations

import os
from typing import Unpack

from pmemwal import lostfound
from pmemwal.errors import ConfigError, CorruptionError, LogIndexError, format_lsn
from pmemwal.log_format import describe
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
        _check_log_records(wal, entry, records, begun, done)
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


def _check_log_records(wal: WAL, entry: lostfound.SetAside, records: list[bytes],
                       begun: int | None, done: int) -> None:
    """LogIndexError when ``records`` are a Log's and would not go back into it as written:
    the WAL went on since the cut (records other than this put-back's own), or their
    entries would not follow the log's last one (lost at the cut).  Plain records pass."""
    heads = [h for h in map(describe, records) if h is not None]
    if not heads or len(heads) < len(records):
        return
    entries = [h for h in heads if h["kind"] == "entry"]
    what = (f"log records (entries {entries[0]['index']}..{entries[-1]['index']}, terms "
            f"{entries[0]['term']}..{entries[-1]['term']})" if entries else "log records")
    how = (f"Nothing was written.  Read them with `pmemwal lost-found {wal.path} --dump "
           f"{entry.name}`, append what is still wanted through the Log, then drop the "
           "entry with --remove.")
    cut = entry.cut_lsn
    if _went_on(wal, cut, begun, done):
        raise LogIndexError(f"lost+found entry {entry.name} holds {what}, and the log went "
                            f"on after the cut at {format_lsn(cut)}: replayed after what it "
                            "appended since, they would void its newer entries (a lower "
                            f"index overrides what follows) and take terms back.  {how}")
    if begun is not None:
        return  # checked for a gap when this put-back began
    following = _next_index(wal)
    for h in heads:
        if h["kind"] == "entry" and following is not None and _index(h) > following:
            raise LogIndexError(f"lost+found entry {entry.name} holds {what}, and the log's "
                                f"next entry is {following}: entries {following}.."
                                f"{_index(h) - 1} were lost at the cut, and after that gap "
                                f"the log would not open.  {how}")
        following = _after(h, following)


def _went_on(wal: WAL, cut: int, begun: int | None, done: int) -> bool:
    """Whether the WAL holds records past ``cut`` other than this put-back's own (recovery
    left its insert position at the cut; a try cut short noted where it began: there)."""
    insert, last = wal.position()
    if begun is None:
        return insert != cut
    if begun != cut:
        return True
    if done == 0:
        return insert != begun
    mine = [rec.lsn for _, rec in zip(range(done), wal.records(begun))]
    return last != mine[-1]


def _next_index(wal: WAL) -> int | None:
    """The index the log's next entry gets, from its last records back (None: no entry,
    rewind or snapshot yet: the first entry replay reads fixes the numbering)."""
    following, lsn = None, wal.position()[1]
    while lsn and lsn >= wal.first_lsn:
        record = wal.record(lsn)
        head = describe(bytes(record.payload))
        if head is not None and head["kind"] != "state":
            following = max(following or 0, _index(head) + 1)
            if head["kind"] != "snapshot" or head.get("reset"):
                return following  # (a compaction after it moves it up, never down)
        lsn = record.prev_lsn
    return following


def _after(head: dict[str, object], following: int | None) -> int | None:
    """The log's next entry index after log record ``head``, by replay's rules."""
    if head["kind"] == "state":
        return following
    if head["kind"] == "snapshot" and not head.get("reset"):
        return max(following or 0, _index(head) + 1)
    return _index(head) + 1


def _index(head: dict[str, object]) -> int:
    index = head["index"]
    assert isinstance(index, int)
    return index


def _write_synced_over(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    lostfound.write_synced(tmp, data, os.O_TRUNC)
    os.rename(tmp, path)
    sync_directory(os.path.dirname(path))
