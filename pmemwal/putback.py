"""Putting a lost+found entry back: its records appended to the WAL again, as new records.

Concern: ``pmemwal lost-found WAL --restore NAME``.  What a cut set aside (lostfound.py)
is appended in order, flushed, and only then is the entry removed; a try cut short is safe
to repeat.  Above the WAL (it opens one), which is why it is not in lostfound.py: recovery
imports that module.

A pmemwal.Log's records go back only where its replay reads them as they were written: into
the log as it stood at the cut (nothing appended since, and no entry set aside later at or
past that cut: the log went on from there), continuing its entries without a gap.  The log
is opened to check that (its replay's own rules, applied to a copy of its numbering).
Otherwise the put-back is refused (LogIndexError) and writes nothing: replayed after entries
appended since, entries with lower indexes would void those (a lower index overrides what
follows) and take the terms back; after a gap, the log would not open.  A Log's records all
found at the cut are a put-back that finished: only the entry's removal is left.
"""

from __future__ import annotations

import os
from typing import Unpack

from pmemwal import lostfound
from pmemwal.errors import ConfigError, LogIndexError, WALError, format_lsn, repair_hint
from pmemwal.log import Log
from pmemwal.log_format import ENTRY, HEADER, describe
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
    heads = _log_heads(records)
    if heads is not None:  # a Log's: checked against the log as its own open reads it
        with Log(wal_dir, **options) as log:
            _check_finished(log.wal, name)
            begun, done = _progress(log.wal, entry, records, marker, True)
            if done < len(records):  # (all there: only the removal was left to do)
                _check_log_records(log, entry, heads, begun, done)
    with open_wal(wal_dir, **options) as wal:
        _check_finished(wal, name)
        begun, done = _progress(wal, entry, records, marker, heads is not None)
        if done == 0:  # (again) from here
            _write_synced_over(marker, str(wal.insert_lsn).encode())
        if done < len(records):
            wal.append_many(records[done:])
            wal.flush()
    lostfound.remove(wal_dir, name)
    return len(records)


def _check_finished(wal: WAL, name: str) -> None:
    """A pending entry (lostfound.set_aside) whose cut this open did not finish: a crash
    stopped that cut before it zeroed anything, and its records may still be in the WAL.
    Where the WAL has been truncated past its cut since, they were (and went with the
    truncation): the entry only holds copies, and removing it is what is left."""
    entry = lostfound.find(wal.path, name)
    if not entry.pending:
        return
    if entry.cut_lsn < wal.first_lsn:
        raise ConfigError(f"lost+found entry {name!r} is pending: the cut that made it was "
                          "never made, and the WAL has been truncated past it since, so its "
                          "records stayed in the WAL until then.  Remove it: `pmemwal "
                          f"lost-found {wal.path} --remove {name}`")
    raise ConfigError(f"lost+found entry {name!r} is pending: the open that cut there was "
                      "stopped before the cut was made, and its records may still be in the "
                      f"WAL.  To finish the cut: {repair_hint(wal.path)}.  Or remove the entry")


def _progress(wal: WAL, entry: lostfound.SetAside, records: list[bytes], marker: str,
              log: bool) -> tuple[int | None, int]:
    """Where an earlier try began (None: none noted) and how many records it put back.  A
    Log's go back only at the cut: all of them found there are a put-back whose removal was
    cut short after its note went (or the same entries appended through the Log again)."""
    begun = _begun_at(marker)
    if begun is not None:
        return begun, _already_there(wal, begun, records)
    if log and _already_there(wal, entry.cut_lsn, records) == len(records):
        return None, len(records)
    return None, 0


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
    if not wal.first_lsn <= lsn < wal.insert_lsn:
        return 0
    try:
        for rec in wal.records(lsn):
            if done == len(records) or bytes(rec.payload) != records[done]:
                break
            done += 1
    except (ValueError, WALError):
        pass
    return done


_Head = tuple[int, int, int, int, int, int]


def _log_heads(records: list[bytes]) -> list[_Head] | None:
    """The log record headers of ``records``, or None when not all of them are a Log's."""
    if not records or any(describe(r) is None for r in records):
        return None
    return [HEADER.unpack_from(r) for r in records]


def _check_log_records(log: Log, entry: lostfound.SetAside, heads: list[_Head],
                       begun: int | None, done: int) -> None:
    """LogIndexError when a Log's records would not go back into it as written: the WAL went
    on since the cut (records other than this put-back's own), another entry was set aside
    later at or past this cut (what the log went on with), or replayed after the log's own
    records they would leave entries missing (lost at the cut): the log would not open."""
    wal, cut = log.wal, entry.cut_lsn
    entries = [h for h in heads if h[2] == ENTRY]
    what = (f"log records (entries {entries[0][4]}..{entries[-1][4]}, terms "
            f"{entries[0][5]}..{entries[-1][5]})" if entries else "log records")
    there = (f"the first {done} of them are in the log already (an earlier try put them "
             "back): of the others, " if done else "")
    how = (f"Nothing was written.  Read them with `pmemwal lost-found {wal.path} --dump "
           f"{entry.name}`, {there}append what is still wanted through the Log, then drop "
           "the entry with --remove.")
    later = None if begun is not None else _set_aside_later(wal.path, entry)
    if later is not None:
        raise LogIndexError(f"lost+found entry {entry.name} holds {what}, and {later.name} "
                            f"was set aside after it, at a cut at {format_lsn(later.cut_lsn)}: "
                            "the log went on from this cut before that one, and these "
                            "records are older than what it went on with.  Put back "
                            f"{later.name} first if it is wanted; this one would then be "
                            f"refused too.  {how}")
    if _went_on(wal, cut, begun, done):
        raise LogIndexError(f"lost+found entry {entry.name} holds {what}, and the log went "
                            f"on after the cut at {format_lsn(cut)}: replayed after what it "
                            "appended since, they would void its newer entries (a lower "
                            f"index overrides what follows) and take terms back.  {how}")
    if begun is not None:
        return  # checked for a gap when this put-back began
    gap = log._gap_after(heads)
    if gap is not None:
        raise LogIndexError(f"lost+found entry {entry.name} holds {what}, and the log's "
                            f"next entry is {log.last_index + 1}: replayed after its records, "
                            f"they would start it again at entry {gap[1] + 1}, with entries "
                            f"{gap[0]}..{gap[1]} neither kept nor compacted (lost at the "
                            f"cut), and the log would not open.  {how}")


def _set_aside_later(wal_dir: str, entry: lostfound.SetAside) -> lostfound.SetAside | None:
    """Another lost+found entry made after ``entry`` at a cut at or past its own, if any."""
    made = _made_ns(entry)
    for other in lostfound.entries(wal_dir):
        if other.name != entry.name and other.cut_lsn >= entry.cut_lsn \
                and _made_ns(other) > made:
            return other
    return None


def _made_ns(entry: lostfound.SetAside) -> int:
    """When ``entry`` was set aside: its manifest says, and so does its name (cut-ns)."""
    made, named = entry.manifest.get("made_ns"), entry.name.rpartition("-")[2]
    return made if isinstance(made, int) else int(named) if named.isdigit() else 0


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


def _write_synced_over(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    lostfound.write_synced(tmp, data, os.O_TRUNC)
    os.rename(tmp, path)
    sync_directory(os.path.dirname(path))
