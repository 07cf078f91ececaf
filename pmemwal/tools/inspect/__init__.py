"""Read-only inspection of a WAL directory: list its records, verify it, count it.

Nothing here writes, locks or repairs.  Segment files are opened O_RDONLY and
mapped PROT_READ, the LOCK file is never touched, so the tools work on a WAL
that a writer holds open, and on one that ``pmemwal.open`` would refuse.  They
imitate what ``open`` does (the same segment checks, the same record chain
from the first record of the oldest segment, the same torn-tail/damage test
through the native reader's ``beyond``) but report what it would raise or cut
instead of doing it:

- a *problem* makes the WAL unsound: ``open`` would raise FormatError or
  CorruptionError for it, or a segment is missing from the middle;
- a *note* is something ``open`` tidies or passes over quietly: a torn tail it
  would cut, a temp file it would remove, a file that is not the WAL's (ignored),
  a spare segment missing past the end (made again when needed).

The checkpoint (``CHECKPOINT``, pmemwal/checkpoint.py) is read, never written:
``verify`` reads every record as ``open(..., verify="all")`` does, so an end of
the chain before the checkpoint's end_lsn is damage (those records had been
made durable), never a torn tail, and a segment missing from the checkpoint's
oldest_segno up to the one holding its end is a problem (open refuses both).
The chain starts in the oldest segment from the checkpoint's oldest_segno on:
those below it (a truncation a crash cut short) are no part of the WAL, a note.
A WAL without the file (made before checkpoints) is read as before, unless a
segment header says the WAL kept one (CHECKPOINTED): then the missing file is a
problem, as open refuses it; one whose slots are both invalid is read so too,
with a note (open warns and reads it all).

Malformed files never raise: each OSError or FormatError met reading them
becomes a Problem.  Only a path that is no WAL directory at all raises:
NotFoundError (nothing there) or FormatError (a file, or no segment files).

On a WAL that a writer is appending to, the end moves while it is read: a
record still being written looks like damage for a moment.  Before damage is
reported, the record at the end is read again; if it has become valid, the
chain is followed further.  A writer truncating the WAL removes or renames its
oldest segments: one that vanishes while it is read makes ``verify`` and
``wal_stats`` start again (``dump``, which has printed records by then, says
where it stopped and why).  Files are never truncated by pmemwal, so a mapped
segment never shrinks under the reader.

Split by concern, one module each (the names other code imports are here):

- results.py: what an inspection finds: Problem, RecordInfo, End;
- checks.py: the directory checked as open checks it before it reads a record (listing,
  segment headers, sizes and identity, gaps, the checkpoint): WalView's base;
- view.py: ``WalView``, the read-only view of the segments, and ``Records``, the record
  chain followed to its end (torn tail or damage, as open would tell);
- dump.py: records as lines, their previews and log headers (``pmemwal dump``);
- tail.py: ``Tail``, those lines, then the records a writer makes durable (``dump --follow``);
- verifying.py: ``verify``, what open would refuse or cut (``pmemwal verify``; what a
  repair of it would cut and keep: pmemwal/tools/repair.py);
- stats.py: ``wal_stats`` and ``archive_status``, counted and formatted (``pmemwal stats``,
  ``pmemwal archive-status``).
"""

from pmemwal.tools.inspect.dump import format_log_fields, format_summary, parse_lsn
from pmemwal.tools.inspect.results import _END as END
from pmemwal.tools.inspect.results import End, Problem, RecordInfo
from pmemwal.tools.inspect.stats import (archive_status, format_archive_status, format_stats,
                                         size_histogram, wal_stats)
from pmemwal.tools.inspect.tail import Tail
from pmemwal.tools.inspect.verifying import VerifyReport, verify
from pmemwal.tools.inspect.view import _NO_SEGMENT, Records, WalView

__all__ = ["WalView", "RecordInfo", "Records", "Tail", "End", "END", "Problem", "VerifyReport", "verify",
           "wal_stats", "parse_lsn", "format_summary", "format_stats", "size_histogram",
           # used by cli.py and the tests too
           "format_log_fields", "archive_status", "format_archive_status", "_NO_SEGMENT"]
