"""What an inspection finds: a Problem (what makes the WAL unsound), a RecordInfo (a valid
record), an End (why reading the chain stopped), and the limits the modules share.

Plain values, made by the view (view.py) and read by verifying.py, stats.py and dump.py;
each can say itself as text and as a dict for JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from pmemwal.errors import format_lsn

_END = (1 << 64) - 1
_LIVE_RETRIES = 8             # re-reads of an end that looked like damage (a writer at work)


@dataclass(frozen=True)
class Problem:
    """Something that makes the WAL unsound, and where: ``kind`` is one of
    io, header, size, gap, damage, restore."""

    kind: str
    reason: str
    segment: int | None = None
    lsn: int | None = None

    @property
    def cut_mends(self) -> bool:
        """Whether cutting the WAL before it mends it (``pmemwal repair``): damaged records
        and deleted segments; a bad or unreadable file needs the user."""
        return self.kind in ("damage", "gap")

    def where(self) -> str:
        """`` at X/X (segment 000...)``, as much of it as is known."""
        text = f" at {format_lsn(self.lsn)}" if self.lsn is not None else ""
        if self.segment is not None:
            text += f" (segment {self.segment:016X})"
        return text

    def __str__(self) -> str:
        return f"{self.where().strip() or 'directory'}: {self.reason}"

    def as_dict(self) -> dict:
        return asdict(self)


class RecordInfo(NamedTuple):
    """A valid record: where it is, its payload length, its prev-link, CRC, and the next LSN."""

    lsn: int
    length: int
    prev_lsn: int
    crc: int
    next_lsn: int

    def as_dict(self) -> dict:
        return {"type": "record", **self._asdict()}


@dataclass(frozen=True)
class End:
    """Why reading records stopped.

    ``kind``: ``clean`` (nothing durable past it, nothing to cut), ``torn``
    (nothing durable past it; ``cut_bytes`` would be zeroed on open), ``damage``
    (the valid record at ``durable_lsn`` proves that the one at ``lsn`` had been
    flushed, or ``lsn`` lies before the checkpoint's end: ``durable_lsn`` is that
    end), ``limit`` (as many records as asked for), ``end`` (the next record lies at or
    past the LSN it was asked to stop at; ``reason`` names it), ``interrupted`` (the user
    stopped ``dump --follow``), ``bad_start`` (no valid
    record at the chosen start), ``unreadable`` (the chain runs into a segment
    that is missing or unreadable while later ones exist, or no segment can be read).
    """

    kind: str
    lsn: int | None
    reason: str
    durable_lsn: int = 0
    cut_bytes: int = 0

    @property
    def failed(self) -> bool:
        """Reading stopped short of the end: damage, a bad start, an unreadable segment."""
        return self.kind in ("damage", "bad_start", "unreadable")

    def describe(self, segment_size: int | None = None) -> str:
        at = format_lsn(self.lsn) if self.lsn is not None else "?"
        if self.kind == "clean":
            return f"end of WAL at {at}"
        if self.kind == "torn":
            return (f"torn tail at {at}: {self.cut_bytes} bytes after the last record would be cut "
                    "on open")
        if self.kind == "limit":
            return f"record limit reached; the next record is at {at}"
        if self.kind in ("end", "interrupted"):
            return f"{self.reason}; the next record is at {at}"
        if self.kind == "damage":
            seg = f" (segment {self.lsn // segment_size:016X})" \
                if segment_size and self.lsn is not None else ""
            return f"damage at {at}{seg}: {self.reason}"
        if self.kind == "bad_start":
            return f"no valid record at {at}: {self.reason}"
        return self.reason      # unreadable

    def as_dict(self) -> dict:
        return asdict(self)
