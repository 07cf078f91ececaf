"""``pmemwal repair``: cut a damaged WAL at its first damage, after showing what the cut keeps,
sets aside and loses.

The repair is what ``pmemwal.open(path, on_corruption="truncate", verify="all")`` does (the
options every damage message names: errors.repair_hint): every record is read, the WAL ends before the first one that is damaged
or runs into a deleted segment, and the valid records past that point are copied into
lost+found/ first (pmemwal/lostfound.py), from where ``pmemwal lost-found PATH --restore
NAME`` appends them again.  ``plan`` says beforehand, read-only, what that open would do
(the view ``verify`` reads: pmemwal/tools/inspect); ``repair`` makes the open, which takes the
WAL's lock (a running writer: LockedError, nothing changed), and verifies the result.

Damage a cut cannot mend (a segment file with a bad header, of the wrong size, another WAL's,
or one that cannot be read, where it held records; a restore cut short) is left to the user:
the plan names it, says what to do, and nothing is changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pmemwal.errors import FormatError, format_lsn
from pmemwal.format import HEADER_SIZE, DamagedHeaderError, SegmentHeader, first_lsn, segment_name
from pmemwal.lostfound import Found, entries
from pmemwal.tools.inspect import Problem, VerifyReport, WalView, verify
from pmemwal.tools.recovery_warnings import recovery_warnings
from pmemwal.wal import open as open_wal

@dataclass
class RepairPlan:
    """What a repair of the WAL at ``path`` would do.  ``needed``: there is damage to cut;
    ``blockers``: problems a cut does not mend (the repair refuses while there are any; a
    bad file the open takes for a damaged spare, and sets aside, is none: ``_damaged_spare``).
    The repair keeps ``kept`` records
    (``kept_bytes`` payload bytes, the last at ``last_kept``) from ``begins`` on, and ends the
    WAL at ``cut_lsn``; ``aside`` are the valid records past it, which go to lost+found;
    ``lost`` the LSN ranges where records known durable (the checkpoint's) or valid ones
    lay, and that no record set aside holds: below the oldest segment left, and past the
    cut.  ``new_checkpoint``: CHECKPOINT is missing, and the repair writes one."""

    path: str
    report: VerifyReport
    blockers: list[Problem] = field(default_factory=list)
    begins: int | None = None
    cut_lsn: int | None = None
    kept: int = 0
    kept_bytes: int = 0
    last_kept: int | None = None
    aside: list[Found] = field(default_factory=list)
    lost: list[tuple[int, int]] = field(default_factory=list)
    new_checkpoint: bool = False

    @property
    def needed(self) -> bool:
        return not self.report.ok

    def lines(self) -> list[str]:
        """The plan as text: what is wrong, then what the repair keeps, cuts and sets aside."""
        out = [f"{self.path}: {self.report.summary_line()}"]
        out += [f"  {line}" for line in self.report.more_problem_lines()]
        if not self.needed:
            return out + ["nothing to repair"] + self.report.note_lines()
        if any(p.kind == "restore" for p in self.blockers):
            return out + ["a cut does not mend a restore cut short: run the restore again "
                          "(pmemwal restore), which starts over; RESTORING must stay until then"]
        if self.blockers:
            return out + ["a cut does not mend " + ("this" if len(self.blockers) == 1 else
                                                    "these") +
                          "; move the files named out of the directory (or restore them), "
                          "then run repair again"]
        out.append("repair will:")
        last = f", the last at {format_lsn(self.last_kept)}" if self.last_kept else ""
        begins = f", from {format_lsn(self.begins)}" if self.begins is not None else ""
        out.append(f"  keep       {self.kept} records ({self.kept_bytes} payload bytes"
                   f"{last}{begins})")
        cuts = self.aside or any(hi > (self.cut_lsn or 0) for _, hi in self.lost)
        out.append(f"  {'cut' if cuts else 'end':<10} the WAL at {format_lsn(self.cut_lsn or 0)}")
        if self.aside:
            out.append(f"  set aside  {len(self.aside)} valid records past the cut "
                       f"({format_lsn(self.aside[0].lsn)} .. {format_lsn(self.aside[-1].lsn)}, "
                       f"{sum(f.length for f in self.aside)} payload bytes) in lost+found")
        for lo, hi in self.lost:
            out.append(f"  lose       {format_lsn(lo)} .. {format_lsn(hi)} ({hi - lo} bytes; "
                       "records there, durable or valid, are not kept)")
        if self.new_checkpoint:
            out.append("  write      a new CHECKPOINT, from every record read")
        return out

    def as_dict(self) -> dict:
        return {"path": self.path, "needed": self.needed, "verify": self.report.as_dict(),
                "blockers": [p.as_dict() for p in self.blockers], "begins_lsn": self.begins,
                "cut_lsn": self.cut_lsn, "kept_records": self.kept, "kept_bytes": self.kept_bytes,
                "last_kept_lsn": self.last_kept,
                "set_aside": {"records": len(self.aside),
                              "bytes": sum(f.length for f in self.aside),
                              "first_lsn": self.aside[0].lsn if self.aside else None,
                              "last_lsn": self.aside[-1].lsn if self.aside else None},
                "lost": [list(r) for r in self.lost], "new_checkpoint": self.new_checkpoint}

    def same_cut(self, other: RepairPlan) -> bool:
        """Whether ``other`` (made later) would do the same: the WAL did not change between."""
        return (self.begins, self.cut_lsn, self.kept, self.aside, self.lost,
                self.new_checkpoint) == (other.begins, other.cut_lsn, other.kept, other.aside,
                                         other.lost, other.new_checkpoint)


def plan(path: str | os.PathLike[str]) -> RepairPlan:
    """What ``repair`` would do to the WAL at ``path``, read-only."""
    report = verify(path)
    result = RepairPlan(os.path.abspath(path), report)
    if report.ok:
        return result
    with WalView(path) as view:
        result.blockers = [p for p in report.problems if not p.cut_mends and
                           not _damaged_spare(view, report, p)]
        chain = view.scan()
        end = chain.end
        if result.blockers or end is None or end.lsn is None or view.first_segment is None:
            return result       # (no segment can be read: a blocker)
        size = view.segment_size or 0
        result.begins = first_lsn(view.first_segment, size)
        result.cut_lsn, result.kept, result.kept_bytes = end.lsn, chain.count, chain.payload_bytes
        result.last_kept = chain.last_lsn
        result.aside = view.past_end(end.lsn, chain.last_lsn or 0)
        cp = view.checkpoint
        result.new_checkpoint = cp is None and view.checkpoint_state != "invalid"
        durable_end = max([cp.end_lsn if cp is not None else end.lsn] +
                          [_deleted_end(view, p) for p in report.problems
                           if p.kind == "gap" and p.lsn is not None and p.lsn >= end.lsn])
        if cp is not None and first_lsn(cp.oldest_segno, size) < result.begins:
            result.lost.append((first_lsn(cp.oldest_segno, size), result.begins))
    result.lost += _gaps(end.lsn, result.aside, durable_end)
    return result


def _damaged_spare(view: WalView, report: VerifyReport, problem: Problem) -> bool:
    """Whether a bad segment file is one the open sets aside as a damaged spare (opening.py
    ``_damaged_spares``): past the chain's end and the checkpoint's, bad in a way the open
    takes for damage (a header that does not read, or this WAL's header in a file of the
    wrong size), holding no page written since it became that segment, and whole, or short
    while the segment before it was not written to its last page (``_holds_nothing``).  Any
    other the open refuses: a blocker."""
    size, segno = view.segment_size, problem.segment
    if problem.kind not in ("header", "size") or size is None or segno is None:
        return False
    ends = [report.end_lsn or 0, (report.checkpoint or {}).get("end_lsn") or 0]
    if segno <= max(ends) // size:
        return False
    path = os.path.join(view.path, segment_name(segno))
    try:
        with open(path, "rb") as f:
            data = f.read(HEADER_SIZE)
        whole = os.path.getsize(path) == size
        try:
            header = SegmentHeader.unpack(data, path)
        except DamagedHeaderError:
            pass
        except FormatError:
            return False
        else:
            if whole or header.segno != segno or header.wal_id != view.wal_id:
                return False
        if view.holds_pages(segno):
            return False
    except OSError:
        return False
    return whole or (segno - 1 in view.segments and not view.wrote_last_page(segno - 1))


def _deleted_end(view: WalView, gap: Problem) -> int:
    """Where the run of deleted segments a gap problem names ends: the first LSN of the next
    segment file there is."""
    size, first = view.segment_size or 0, gap.segment or 0
    after = [n for n in view.segments if n > first]
    return (after[0] if after else first + 1) * size


def _gaps(cut: int, aside: list[Found], durable_end: int) -> list[tuple[int, int]]:
    """The LSN ranges from the cut to the end of what was durable (or of the last record set
    aside, if further) that no record set aside covers."""
    gaps, at = [], cut
    for f in aside:
        if f.lsn > at:
            gaps.append((at, f.lsn))
        at = max(at, f.next_lsn)
    if durable_end > at:
        gaps.append((at, durable_end))
    return gaps


@dataclass
class RepairResult:
    """What a repair did: the WAL's end now, the lost+found entries it made, what recovery
    said (its RecoveryWarnings) and ``after``: verify's report of the repaired WAL."""

    path: str
    end_lsn: int
    entries: list[dict]
    said: list[str]
    after: VerifyReport

    def lines(self) -> list[str]:
        out = [f"repaired: the WAL ends at {format_lsn(self.end_lsn)}; verify: "
               f"{self.after.summary_line()}"]
        out += [f"  recovery: {text}" for text in self.said]
        for e in self.entries:
            out.append(f"set aside in lost+found: {e['name']} ({e['records']} records, "
                       f"{e['bytes']} payload bytes)")
            if e["records"]:
                out.append(f"  to append them again: {restore_command(self.path, e['name'])}")
            else:   # (the pages of the damaged records alone: --restore would remove them)
                out.append("  it holds the pages cut and no valid record: nothing to append "
                           "again (keep it to inspect them)")
        return out

    def as_dict(self) -> dict:
        return {"path": self.path, "end_lsn": self.end_lsn, "entries": self.entries,
                "recovery": self.said, "verify": self.after.as_dict()}


def restore_command(path: str, name: str) -> str:
    """The command that appends a lost+found entry's records to the WAL again."""
    return f"pmemwal lost-found {path} --restore {name}"


def repair(path: str | os.PathLike[str]) -> RepairResult:
    """Cut the WAL at ``path`` at its first damage, as the open ``repair_hint`` names does, and
    verify it."""
    path = os.path.abspath(path)
    before = {e.name: e.pending for e in entries(path)}
    with recovery_warnings() as caught:
        wal = open_wal(path, on_corruption="truncate", verify="all")
        end = wal.insert_lsn
        wal.close()
    made = [{"name": e.name, "path": e.path, "records": len(e.manifest["records"]),
             "bytes": sum(r[2] for r in e.manifest["records"])}
            for e in entries(path) if before.get(e.name, True) and not e.pending]
    # (new ones, and a pending one this cut finished: a repair a crash stopped made it)
    said = [text.removeprefix(f"{path}: ") for text in caught]
    return RepairResult(path, end, made, said, verify(path))
