"""A warning pmemwal gives names the line of the user's code that called it, whichever
entry it came through (pmemwal.open, WAL, Log, open_log: each reaches recovery at its own
depth), not a line inside the library."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pmemwal
from pmemwal.recovery import RecoveryWarning

from conftest import SEG, stream_write

OPTIONS = {"on_corruption": "truncate", "verify": "all", "background": False}
# one line each: the warning must name the line the entry is called on
ENTRIES = {
    "open": lambda path: pmemwal.open(path, **OPTIONS),
    "WAL": lambda path: pmemwal.WAL(path, **OPTIONS),
    "Log": lambda path: pmemwal.Log(path, **OPTIONS),
    "open_log": lambda path: pmemwal.open_log(path, **OPTIONS),
}


def _log_with_damage(path, damage: str) -> None:
    """A closed Log of 300 entries (a WAL underneath), damaged as ``damage`` says."""
    with pmemwal.open_log(path, segment_size=SEG, background=False) as log:
        log.append_many([os.urandom(100) for _ in range(200)], term=1)
        middle = log.wal.position()[0]
        log.append_many([os.urandom(100) for _ in range(100)], term=1)
    if damage == "checkpoint deleted":      # every record read: a full scan, said so
        os.unlink(path / "CHECKPOINT")
    else:                                   # a record garbled: the rest set aside
        stream_write(path, middle + 64, bytes(range(32)), SEG)


@pytest.mark.parametrize("damage", ["checkpoint deleted", "record garbled"])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_recovery_warning_names_the_callers_line(wal_dir, entry, damage):
    _log_with_damage(wal_dir, damage)
    call = ENTRIES[entry]
    with pytest.warns(RecoveryWarning) as caught:
        opened = call(wal_dir)
    opened.close()
    assert [(w.filename, w.lineno) for w in caught] == \
        [(__file__, call.__code__.co_firstlineno)] * len(caught), [str(w.message) for w in caught]


def test_a_log_index_set_aside_names_the_callers_line(wal_dir):
    """The Log's own warning (its stored index not used), found after the WAL opened."""
    _log_with_damage(wal_dir, "record garbled")
    call = ENTRIES["Log"]
    with pytest.warns(RecoveryWarning) as caught:
        call(wal_dir).close()
    assert any("index is not used" in str(w.message) for w in caught)
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, call.__code__.co_firstlineno)}


def test_an_eventsourcing_index_set_aside_names_the_callers_line(shm_dir):
    """The eventsourcing integration's own warning (its stored index not used)."""
    from test_eventsourcing_index import es_index, events_dir, fill, pes, reopen

    store = reopen(shm_dir)
    fill(store, 120)
    store.close()
    next((Path(events_dir(shm_dir)) / es_index.INDEX_DIR).glob("*.run")).unlink()
    call = lambda: pes.open_datastore(events_dir(shm_dir), segment_size=1 << 20)  # noqa: E731
    with pytest.warns(RecoveryWarning, match="index is not used") as caught:
        call().close()
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, call.__code__.co_firstlineno)}
