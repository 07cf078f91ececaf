"""``verify``: whether the WAL is sound, as ``open(..., verify="all")`` would find it.

The view (view.py) finds the problems in the files and follows the chain to its end; this
module turns the end into what open would do there (damage it would refuse, a torn tail
it would cut, a note) and reports it as a VerifyReport (``pmemwal verify``).  A writer
truncating the WAL while it is read makes ``verify`` look again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pmemwal.errors import format_lsn, repair_hint
from pmemwal.tools.inspect.results import _LIVE_RETRIES, End, Problem
from pmemwal.tools.inspect.view import WalView

@dataclass
class VerifyReport:
    """What ``verify`` found.  ``ok``: the WAL is sound (open would accept it and
    cut at most a torn tail); ``bytes`` are the payload bytes of the valid records."""

    path: str
    segments: int
    segment_size: int | None = None
    records: int = 0
    bytes: int = 0
    first_lsn: int | None = None
    last_lsn: int | None = None
    end_lsn: int | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    torn_tail: End | None = None
    checkpoint: dict | None = None       # WalView.checkpoint_dict()
    checkpoint_line: str = ""            # WalView.describe_checkpoint()
    vanished: bool = field(default=False, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_problem(self) -> Problem | None:
        """The problem earliest in the WAL (those without a position first)."""
        if not self.problems:
            return None
        return min(self.problems, key=lambda p: -1 if p.lsn is None else p.lsn)

    def summary_line(self) -> str:
        """``OK: N records, M segments, end X/X`` or ``FAIL at X/X (segment ...): reason``."""
        first = self.first_problem
        if first is None:       # (ok)
            end = format_lsn(self.end_lsn) if self.end_lsn is not None else "-"
            return f"OK: {self.records} records, {self.segments} segments, end {end}"
        more = len(self.problems) - 1
        return f"FAIL{first.where()}: {first.reason}" + \
            (f" (and {more} more {'problem' if more == 1 else 'problems'})" if more else "")

    def more_problem_lines(self) -> list[str]:
        """Every problem but the first, a line each (the summary line names the first)."""
        first = self.first_problem
        return [f"problem{p.where()}: {p.reason}" for p in self.problems if p is not first]

    def note_lines(self) -> list[str]:
        return [f"note: {n}" for n in self.notes]

    def lines(self) -> list[str]:
        """The text report: the summary line, the other problems, the checkpoint, then the notes
        (when OK) or how to repair it (when a cut mends it)."""
        out = [self.summary_line()] + self.more_problem_lines()
        if self.checkpoint_line:
            out.append(self.checkpoint_line)
        if self.ok:
            return out + self.note_lines()
        if all(p.cut_mends for p in self.problems):
            out.append(f"to repair: {repair_hint(self.path)}")
        return out

    def as_dict(self) -> dict:
        first = self.first_problem
        return {"path": self.path, "ok": self.ok, "segments": self.segments,
                "segment_size": self.segment_size, "records": self.records, "bytes": self.bytes,
                "first_lsn": self.first_lsn, "last_lsn": self.last_lsn, "end_lsn": self.end_lsn,
                "first_problem": first.as_dict() if first else None,
                "problems": [p.as_dict() for p in self.problems], "notes": list(self.notes),
                "torn_tail": self.torn_tail.as_dict() if self.torn_tail else None,
                "checkpoint": self.checkpoint}


def verify(path: str | os.PathLike[str]) -> VerifyReport:
    """Check every segment header and the record chain to its end, as open would.

    Raises NotFoundError or FormatError only when ``path`` is no WAL directory at all.
    """
    for _ in range(_LIVE_RETRIES):      # segments truncated while they were read: look again
        report = _verify(path)
        if not report.vanished:
            break
    return report


def _verify(path: str | os.PathLike[str]) -> VerifyReport:
    with WalView(path) as view:
        chain = view.scan()
        report = VerifyReport(view.path, len(view.segments), view.segment_size, chain.count,
                              chain.payload_bytes, chain.first_lsn, chain.last_lsn,
                              chain.ended.lsn, notes=list(view.notes),
                              checkpoint=view.checkpoint_dict(),
                              checkpoint_line=view.describe_checkpoint())
        end = chain.ended
        damage = view.end_problem(end)
        if damage is not None:
            view.problems.append(damage)
        elif end.kind == "torn":
            report.torn_tail = end
            report.notes.insert(0, end.describe())
        report.problems = list(view.problems)
        if end.kind in ("clean", "torn") and end.lsn is not None:
            _spares_missing(report, view, end.lsn)
        report.vanished = bool(view.vanished)
    return report


def _spares_missing(report: VerifyReport, view: WalView, end: int) -> None:
    """Segments missing past the end of a chain that ended soundly are no problem where the
    WAL's stream never went into them (recovery's test, recovery.py ``_deleted_past``: the
    segment before the gap is missing too, or was not written to its last page; or the
    checkpoint's end is at the chain's end or past it): nothing durable lay in them (the
    scan found no valid record past the end, and the checkpoint vouches for none), and open
    makes them again.  A note, as open reads every record."""
    cp = view.checkpoint
    for p in [p for p in report.problems if p.kind == "gap" and p.lsn is not None and p.lsn >= end]:
        segno = p.segment if p.segment is not None else 0
        if (cp is None or cp.end_lsn < end) and segno - 1 in view.segments and \
                view.wrote_last_page(segno - 1):
            continue
        report.problems.remove(p)
        report.notes.append(f"{p.reason}: past the end of the WAL, which never went into it; "
                            "open makes it again")
