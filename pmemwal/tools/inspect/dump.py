"""``pmemwal dump``: records listed as lines, like pg_waldump.

A record's line (LSN, length, prev-link, CRC; aligned columns), a preview of its payload
(hex, and the same bytes as text, as ``hexdump -C`` shows them), its log header when the WAL holds a log (pmemwal.Log), the summary line after the
records, and the LSN text ``--start`` takes.  ``RecordLines`` is the part of ``WalView``
(view.py) that makes the lines: it reads through the view's ``segments``,
``segment_size``, ``payload`` and ``records``.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from typing import Iterable

from pmemwal.errors import format_lsn
from pmemwal.format import PAGE_SIZE
from pmemwal.log import describe as describe_log_record
from pmemwal.tools.inspect.results import _END, RecordInfo

_LSN_TEXT = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
# printable ASCII as is, every other byte as '.' (one bytes.translate per record, no loop)
_TEXT = bytes(b if 0x20 <= b < 0x7F else 0x2E for b in range(256))


def parse_lsn(text: str) -> int:
    """An LSN given as ``X/X`` (PostgreSQL's form: high/low 32 bits in hex) or as a decimal integer."""
    match = _LSN_TEXT.match(text)
    if match:
        return int(match.group(1), 16) << 32 | int(match.group(2), 16)
    stripped = text.strip()
    if stripped.isdigit():
        value = int(stripped)
        if value <= _END:
            return value
    raise ValueError(f"{text!r} is not an LSN: give X/X (hex, e.g. 0/2018) or a decimal integer "
                     "below 2^64")


class RecordLines:
    """A view's records as lines, previews and log headers (a base of WalView, whose
    ``payload`` and ``records`` it calls)."""

    segments: list[int]
    segment_size: int | None

    def records(self, start: int | None = None, limit: int | None = None,
                stop_lsn: int = _END) -> Iterable[RecordInfo]:
        raise NotImplementedError       # (WalView's)

    def payload(self, lsn: int) -> bytes:
        raise NotImplementedError       # (WalView's)

    def holds_log(self) -> bool:
        """Is the oldest record a log record (pmemwal.Log)?  Then the WAL holds a log."""
        first = next(iter(self.records(None, 1)), None)
        return first is not None and self.log_fields(first) is not None

    def log_fields(self, rec: RecordInfo, payload: bytes | None = None) -> dict | None:
        """The record's log header (kind, index, term...), None when it is not a log record
        (``payload``: the record's, when the caller has it already)."""
        try:
            return describe_log_record(self.payload(rec.lsn) if payload is None else payload)
        except ValueError:              # changed since it was read: a writer at work
            return None

    def record_line(self, rec: RecordInfo, preview: int, holds_log: bool, as_json: bool,
                    payload: bytes | None = None) -> str:
        """The dump's line for a record: text, or a JSON object (``payload``: the record's,
        when the caller has it already; else it is read when the line needs it)."""
        fields = self.log_fields(rec, payload) if holds_log else None
        if as_json:
            obj = rec.as_dict()
            if rec.crc < 0:             # (a followed record that no longer reads here)
                obj["crc"] = obj["next_lsn"] = None
            if preview:
                obj["data"], obj["text"] = self.preview(rec, preview, payload)
            if holds_log:
                obj["log"] = fields
            return json.dumps(obj)
        line = self.format_record(rec, preview, payload)
        return line + format_log_fields(fields) if holds_log else line

    def lsn_width(self) -> int:
        """Characters the largest LSN in these files takes as X/X (for aligned columns)."""
        return len(format_lsn((self.segments[-1] + 1) * (self.segment_size or PAGE_SIZE) - 1))

    def length_width(self) -> int:
        """Digits the largest record these files could hold takes."""
        span = (self.segments[-1] - self.segments[0] + 1) * (self.segment_size or PAGE_SIZE)
        return len(str(span))

    @cached_property
    def _widths(self) -> tuple[int, int]:
        """(lsn_width, length_width): the files' span, the same for every line."""
        return self.lsn_width(), self.length_width()

    def format_record(self, rec: RecordInfo, preview: int = 0, payload: bytes | None = None) -> str:
        """``lsn: 0/2018  len:   100 prev: 0/0     crc: 0x1234abcd`` (pg_waldump-like, aligned),
        then with ``preview`` `` data: 48690a... |Hi.|`` (the text column aligned too)."""
        w, lw = self._widths
        line = (f"lsn: {format_lsn(rec.lsn):<{w}} len: {rec.length:>{lw}} "
                f"prev: {format_lsn(rec.prev_lsn):<{w}} crc: "
                + (f"0x{rec.crc:08x}" if rec.crc >= 0 else "?         "))
        if preview > 0:
            hex_text, text = self.preview(rec, preview, payload)
            line += f" data: {hex_text}" if text is None else \
                f" data: {hex_text:<{2 * preview + 3}} |{text}|"
        return line

    def preview(self, rec: RecordInfo, n: int, payload: bytes | None = None
                ) -> tuple[str, str | None]:
        """The first ``n`` payload bytes of a record: (hex, ``...`` when there are more;
        text: printable ASCII as is, other bytes as '.'); (why, None) when it cannot be read."""
        if payload is None:
            try:
                payload = self.payload(rec.lsn)[:n] if rec.length and n > 0 else b""
            except ValueError as exc:       # changed since it was read: a writer at work
                return f"({exc})", None
        data = payload[:n]
        return (data.hex() + ("..." if rec.length > n else ""),
                data.translate(_TEXT).decode("ascii"))


def format_log_fields(fields: dict | None) -> str:
    """`` log: entry 12 term 3`` for a dump line; `` log: -`` for a record that is not one."""
    if fields is None:
        return " log: -"
    words = [fields["kind"]]
    for key, value in fields.items():
        if key != "kind":
            words.append(str(value) if key == "index" else key if value is True else f"{key} {value}")
    return " log: " + " ".join(words)


def format_summary(summary: dict) -> str:
    """A dump's last line, from ``Records.summary()``."""
    def lsn(value):
        return format_lsn(value) if value is not None else "-"
    return (f"records: {summary['records']}, payload bytes: {summary['payload_bytes']}, "
            f"first: {lsn(summary['first_lsn'])}, last: {lsn(summary['last_lsn'])}, "
            f"end: {lsn(summary['end_lsn'])}; stopped: {summary['reason']}")
