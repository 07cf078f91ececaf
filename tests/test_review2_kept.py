"""Independent review: the Reader's kept segment buffers against truncation."""
from __future__ import annotations

import pytest

import pmemwal
from pmemwal.errors import TruncatedError

SEG = 1 << 20


def test_kept_buffer_taken_while_truncating_outlives_forget(tmp_path):
    """A segment buffer the getter handed out just before a truncation forgot the Reader's
    buffers is kept by the Reader after the truncation: a later read of the truncated LSN
    is served from it (the old bytes) instead of TruncatedError."""
    with pmemwal.open(tmp_path / "w", segment_size=SEG, background=False) as wal:
        lsns = []
        while wal.insert_lsn < 2 * SEG + 4096:
            lsns.append(wal.append(b"x" * 20000, flush=True))
        first = lsns[0]
        orig = wal._segment_buffer
        state = {"done": False}

        def getter(segno):
            buf = orig(segno)
            if segno == 0 and not state["done"]:
                state["done"] = True
                # another thread's truncation, between the getter's return and keep()
                assert wal.truncate(2 * SEG) == 2
            return buf

        wal._segment_buffer = getter
        try:
            wal.record(first)  # the read in flight: may see its buffer (it holds it)
        except TruncatedError:
            pass
        assert state["done"]
        with pytest.raises(TruncatedError):
            wal.record(first)
