"""``wal_stats`` and ``archive_status``: what the WAL holds, counted (``pmemwal stats``,
``pmemwal archive-status``).

Segments (sizes on disk, spares past the end), records, payload and stream bytes, a
record-size histogram, the checkpoint, the archive's progress and the followers (their
positions and lag, from the FOLLOW file), read through the view
(view.py) and formatted as text.  A writer truncating the WAL while it is read makes
``wal_stats`` look again.
"""

from __future__ import annotations

import array
import os

import numpy as np

from pmemwal.archive import ArchiveStatus
from pmemwal.errors import FormatError, format_lsn
from pmemwal.follow_file import FollowFile
from pmemwal.segments import writer_open
from pmemwal.tools.inspect.results import _LIVE_RETRIES, Problem
from pmemwal.tools.inspect.view import WalView

def size_histogram(lengths: np.ndarray) -> list[dict]:
    """Counts of record lengths in buckets 0, 1-8, 9-64, 65-512, ... up to the largest."""
    lengths = np.asarray(lengths, dtype=np.uint64)
    top = int(lengths.max()) if lengths.size else 0
    edges = [0, 8]
    while edges[-1] < top:
        edges.append(edges[-1] * 8)
    index = np.searchsorted(np.array(edges, dtype=np.uint64), lengths, side="left")
    counts = np.bincount(index, minlength=len(edges)) if lengths.size else np.zeros(len(edges), int)
    out = [{"range": "0", "low": 0, "high": 0, "count": int(counts[0])}]
    for i in range(1, len(edges)):
        low, high = edges[i - 1] + 1, edges[i]
        out.append({"range": f"{low}-{high}", "low": low, "high": high, "count": int(counts[i])})
    return out


def wal_stats(path: str | os.PathLike[str]) -> dict:
    """Segments, records, payload bytes, a record-size histogram and spare segments.

    Raises NotFoundError or FormatError only when ``path`` is no WAL directory at all.
    """
    for _ in range(_LIVE_RETRIES):      # segments truncated while they were read: look again
        stats = _stats(path)
        if not stats.pop("vanished"):
            break
    return stats


def _stats(path: str | os.PathLike[str]) -> dict:
    with WalView(path) as view:
        lengths = array.array("Q")
        recs = view.records()
        for rec in recs:
            lengths.append(rec.length)
        end = recs.ended
        damage = view.end_problem(end)
        if damage is not None:
            view.problems.append(damage)
        size = view.segment_size
        files = [view._files[s] for s in view.segments]
        spares = [s for s in view.segments if size and end.lsn is not None and s > end.lsn // size]
        stream = view.usable(end.lsn) - view.usable(recs.first_lsn) \
            if end.lsn is not None and recs.first_lsn is not None else 0    # (records read)
        length_array = np.frombuffer(lengths, dtype=np.uint64) if lengths else np.zeros(0, np.uint64)
        return {
            "path": view.path,
            "segment_size": size,
            "wal_id": view.wal_id.hex() if view.wal_id else None,
            "segments": {"count": len(files), "numbers": list(view.segments),
                         "sizes": [f.size for f in files],
                         "bytes_on_disk": sum(max(f.size, 0) for f in files),
                         "allocated_bytes": sum(f.allocated for f in files)},
            "spare_segments": {"count": len(spares), "numbers": spares},
            "records": recs.count,
            "payload_bytes": recs.payload_bytes,
            "stream_bytes": stream,
            "first_lsn": recs.first_lsn,
            "last_lsn": recs.last_lsn,
            "end_lsn": end.lsn,
            "end": {**end.as_dict(), "text": end.describe(size)},
            "record_sizes": {
                "min": int(length_array.min()) if length_array.size else None,
                "max": int(length_array.max()) if length_array.size else None,
                "mean": float(length_array.mean()) if length_array.size else None,
                "histogram": size_histogram(length_array),
            },
            "problems": [p.as_dict() for p in view.problems],
            "notes": list(view.notes),
            "checkpoint": view.checkpoint_dict(),
            "checkpoint_text": view.describe_checkpoint(),
            "archive": archive_status(view.path, size),
            "following": following(view.path, view.wal_id, size),
            "vanished": bool(view.vanished),
        }


def following(path: str, wal_id: bytes | None, segment_size: int | None) -> dict | None:
    """What the FOLLOW file says: whether a writer has the WAL open, the durable LSN it
    published, and the named followers (position, lag, state); None when there is none."""
    if wal_id is None or segment_size is None:
        return None
    try:
        file = FollowFile.open(path, wal_id, segment_size)
    except FormatError as exc:
        return {"error": str(exc)}
    if file is None:
        return None
    try:
        durable = file.durable_lsn
        return {"writer_open": writer_open(path), "durable_lsn": durable,
                "followers": [slot.as_dict(durable) for slot in file.slots()]}
    finally:
        file.close()


def format_following(info: dict | None) -> list[str]:
    """Text lines for ``following``."""
    if info is None:
        return []
    if "error" in info:
        return [f"followers:       unreadable ({info['error']})"]
    writer = "open in a writer" if info["writer_open"] else "no writer has it open"
    lines = [f"published:       durable to {format_lsn(info['durable_lsn'])} ({writer})"]
    if not info["followers"]:
        lines.append("followers:       none named")
    for f in info["followers"]:
        lines.append(f"follower:        {f['name']!r} {f['state']} at {format_lsn(f['position'])}, "
                     f"{f['lag_bytes']} bytes behind")
    return lines


def archive_status(path: str | os.PathLike[str], segment_size: int | None = None) -> dict | None:
    """The WAL directory's archive status (ready, done and failed segment counts, the
    oldest unarchived segment, the last error), or None when it was never archived."""
    status = ArchiveStatus(os.fspath(path), create=False)
    if not os.path.isdir(status.path):
        return None
    if segment_size is None:
        with WalView(path) as view:
            segment_size = view.segment_size or 0
    return status.summary(segment_size)


def format_archive_status(status: dict | None) -> list[str]:
    """Text lines for ``archive_status``."""
    if status is None:
        return ["archive:         not archived (no archive_status/)"]
    lines = [f"archive:         {status['done']} segments archived, {status['ready']} waiting "
             f"({status['pending_bytes']} bytes), {status['failed']} failing"]
    if status["oldest_unarchived"]:
        lines.append(f"oldest waiting:  {status['oldest_unarchived']}")
    if status["last_error"]:
        lines.append(f"last error:      {status['last_error']} ({status['attempts']} attempts)")
    return lines


def format_stats(stats: dict) -> str:
    """``wal_stats`` as text, the size histogram as a small table."""
    def lsn(value):
        return format_lsn(value) if value is not None else "-"

    def names(numbers):
        if not numbers:
            return "none"
        return f"{numbers[0]:016X}" + (f" .. {numbers[-1]:016X}" if len(numbers) > 1 else "")

    seg = stats["segments"]
    size = stats["segment_size"]
    spare = stats["spare_segments"]
    sizes = stats["record_sizes"]
    lines = [
        f"path:            {stats['path']}",
        f"segment size:    {size if size is not None else 'unknown'}"
        + (f" bytes ({size >> 20} MiB)" if size else ""),
        f"segments:        {seg['count']} ({names(seg['numbers'])}), "
        f"{seg['bytes_on_disk']} bytes on disk ({seg['allocated_bytes']} allocated)",
        f"spare segments:  {spare['count']} ({names(spare['numbers'])})",
        f"records:         {stats['records']}",
        f"payload bytes:   {stats['payload_bytes']} ({stats['stream_bytes']} in the stream)",
        f"first record:    {lsn(stats['first_lsn'])}",
        f"last record:     {lsn(stats['last_lsn'])}",
        f"end:             {lsn(stats['end_lsn'])} ({stats['end']['text']})",
    ]
    if stats.get("checkpoint_text"):
        lines.append(f"checkpoint:      {stats['checkpoint_text'].removeprefix('checkpoint: ')}")
    if sizes["max"] is not None:
        lines.append(f"record size:     min {sizes['min']}, mean {sizes['mean']:.1f}, max {sizes['max']}")
    width = max(len("bytes"), *(len(b["range"]) for b in sizes["histogram"]))
    lines.append(f"  {'bytes':>{width}}  {'records':>9}")
    for bucket in sizes["histogram"]:
        lines.append(f"  {bucket['range']:>{width}}  {bucket['count']:>9}")
    lines.extend(format_archive_status(stats.get("archive")))
    lines.extend(format_following(stats.get("following")))
    for problem in stats["problems"]:
        lines.append(f"problem: {Problem(**problem)}")
    for note in stats["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
