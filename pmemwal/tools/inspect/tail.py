"""``pmemwal dump --follow``: the records on disk, then each one a writer makes durable.

``Tail`` lists a view's records as ``dump`` does, then, from where the chain ends, reads
on with ``pmemwal.follow`` (records as they become durable, a batch at a time: each batch
is a block of lines, written at once), until ``--end`` or ``--limit``, or until the user
stops it (Ctrl-C: ``interrupt``).  It counts what it printed itself, so that the summary
after an interruption says what was shown, not what was read.
"""

from __future__ import annotations

from typing import Iterator

import pmemwal
from pmemwal.tools.inspect.results import _END, End, RecordInfo
from pmemwal.tools.inspect.view import Records, WalView

_BLOCK = 4096      # lines at most in one block


class Tail:
    """The lines of ``dump --follow`` over ``view`` (iterate ``blocks()``), then ``summary()``."""

    def __init__(self, view: WalView, start: int | None, limit: int | None,
                 stop_lsn: int | None, preview: int, as_json: bool) -> None:
        self.view, self.limit, self.preview, self.as_json = view, limit, preview, as_json
        self.stop_lsn = _END if stop_lsn is None else stop_lsn
        self.records: Records = view.records(start, limit, self.stop_lsn)
        self.holds_log = view.holds_log()
        self.count = self.payload_bytes = 0
        self.first_lsn: int | None = None
        self.last_lsn: int | None = None
        self.next_lsn = start      # where the next record is (None: not known yet)
        self.end: End | None = None

    def blocks(self) -> Iterator[list[str]]:
        """Blocks of lines: the records on disk, then those that become durable."""
        block: list[str] = []
        for rec in self.records:
            block.append(self._line(rec))
            if len(block) == _BLOCK:
                yield block
                block = []
        if block:
            yield block
        end = self.end = self.records.end
        if end is not None and end.kind in ("clean", "torn"):    # the WAL's end: wait there
            self.end, self.next_lsn = None, end.lsn
            self.view.read_new_segments = True      # the follower reads on: so do the lines
            try:
                yield from self._followed()
            except pmemwal.TruncatedError as exc:   # it fell behind a truncation
                self.end = End("unreadable", self.next_lsn, f"{type(exc).__name__}: {exc}")

    def _followed(self) -> Iterator[list[str]]:
        """Each batch of durable records as a block, until --end or --limit (the follower
        waits for ever; Ctrl-C interrupts its wait)."""
        if self._done(self.next_lsn):
            return
        with pmemwal.follow(self.view.path, start=self.next_lsn, timeout=None) as follower:
            for batch in follower.batches(max_records=_BLOCK):
                block = []
                for rec in batch:
                    if self._done(rec.lsn):   # (when the one before could not say where)
                        break
                    payload = rec.payload
                    info = self.view.record_info(rec.lsn, rec.prev_lsn, len(payload))
                    block.append(self._line(info, payload))
                    if self._done(self.next_lsn):
                        break
                if block:
                    yield block
                if self.end is not None:
                    return

    def _done(self, lsn: int | None) -> bool:
        """Does the record at ``lsn`` (the next one) lie past --end or --limit?  Then the
        end says which; it is known as soon as the record before it is shown."""
        if lsn is not None and lsn >= self.stop_lsn:
            self.end = End("end", lsn, f"--end {pmemwal.format_lsn(self.stop_lsn)} reached")
        elif lsn is not None and self.limit is not None and self.count >= self.limit:
            self.end = End("limit", lsn, "limit")
        return self.end is not None

    def _line(self, rec: RecordInfo, payload: bytes | None = None) -> str:
        if self.count == 0 and not self.holds_log and payload is not None:
            self.holds_log = self.view.log_fields(rec, payload) is not None   # it was empty
        if self.first_lsn is None:
            self.first_lsn = rec.lsn
        self.count += 1
        self.payload_bytes += rec.length
        self.last_lsn = rec.lsn
        self.next_lsn = rec.next_lsn or None
        return self.view.record_line(rec, self.preview, self.holds_log, self.as_json, payload)

    def interrupt(self) -> None:
        """The user stopped it (Ctrl-C): the summary says so, and where the next record is."""
        self.end = End("interrupted", self.next_lsn, "interrupted")

    def summary(self) -> dict:
        """``Records.summary()``, with what was printed and why it stopped."""
        self.records.end = self.end
        summary = self.records.summary()
        summary.update(records=self.count, payload_bytes=self.payload_bytes,
                       first_lsn=self.first_lsn, last_lsn=self.last_lsn)
        return summary
