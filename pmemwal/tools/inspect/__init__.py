"""Read-only inspection of a WAL directory: list its records, verify it, count it.

Split by concern, one module each (the names other code imports are here):

- results.py: what an inspection finds: Problem, RecordInfo, End;
- view.py: the read-only view of the segments and the record chain;
- dump.py: records as lines, their previews and log headers (``pmemwal dump``);
- verifying.py: ``verify``, what open would refuse or cut (``pmemwal verify``);
- stats.py: ``wal_stats`` and ``archive_status``, counted and formatted (``pmemwal stats``,
  ``pmemwal archive-status``).
"""

from pmemwal.tools.inspect.stats import (archive_status, format_archive_status, format_stats,
                                         size_histogram, wal_stats)
from pmemwal.tools.inspect.verifying import VerifyReport, verify
from pmemwal.tools.inspect.dump import format_log_fields, format_summary, parse_lsn
from pmemwal.tools.inspect.results import End, Problem, RecordInfo
from pmemwal.tools.inspect.view import _NO_SEGMENT, Records, WalView

__all__ = ["WalView", "RecordInfo", "Records", "End", "Problem", "VerifyReport", "verify",
           "wal_stats", "parse_lsn", "format_summary", "format_stats", "size_histogram",
           # used by cli.py and the tests too
           "format_log_fields", "archive_status", "format_archive_status", "_NO_SEGMENT"]
