"""Review of the log readers and the follow core (failing tests: bugs found in review)."""

from __future__ import annotations

from pathlib import Path

import pmemwal

SEG = 1 << 20


def _payload(i: int) -> bytes:
    return (b"%d:" % i).ljust(8000, b"x")


def test_readonly_log_refresh_after_the_writer_compacted_past_it_and_closed(
        wal_dir: Path) -> None:
    """A read-only log opened while the writer runs; the writer appends, compacts past
    where the reader's replay stopped (its segments go) and closes.  refresh() must take in
    the log the writer left (as a reopen does), not raise TruncatedError for ever."""
    path = str(wal_dir)
    log = pmemwal.open_log(path, segment_size=SEG)
    log.append_many([_payload(i) for i in range(1, 301)], term=1, sync=True)
    ro = pmemwal.open_log(path, readonly=True)
    assert ro.last_index == 300
    log.append_many([_payload(i) for i in range(301, 901)], term=1, sync=True)
    log.compact(800)
    assert log.wal.first_lsn > ro._at[0]  # (the segments the reader would read on are gone)
    log.close()
    try:
        assert ro.refresh() == 900
        assert ro.first_index == 800
        assert ro[900].payload == _payload(900)
    finally:
        ro.close()


def test_a_follower_killed_inside_confirm_resumes(wal_dir: Path) -> None:
    """confirm() stores the slot's last LSN, then its position (follow_file.py confirm): a
    follower SIGKILLed between the two stores leaves the new last LSN beside the old
    position.  The FOLLOW file as that kill leaves it (written here: the two stores are
    two Python statements apart) must still let the name resume at the old position,
    yielding the records after it once (at least once up to the last confirm)."""
    import struct

    from pmemwal.follow_file import _SLOT_BASE, _SLOT_SIZE
    path = str(wal_dir)
    with pmemwal.open(path, segment_size=SEG) as wal:
        lsns = [wal.append(b"r%d" % i) for i in range(10)]
        wal.flush()
    with pmemwal.follow(path, name="n", timeout=0.1) as f:
        it = iter(f)
        assert [next(it).lsn for _ in range(3)] == lsns[:3]
        f.confirm()
        assert [next(it).lsn for _ in range(2)] == lsns[3:5]
        slot = f._slot
        assert slot is not None
        # the first store of the next confirm(), and then the kill
        struct.pack_into("<Q", f._file.map, _SLOT_BASE + slot.index * _SLOT_SIZE + 16, lsns[4])
    with pmemwal.follow(path, name="n", timeout=0.1) as f:
        assert [r.lsn for r in f] == lsns[3:]
