"""The bench's WAL on disk: opened as the run's main process or a client process opens it
(``_open_wal``), its directory deleted before and after a run (``remove_wal_dir``, which
refuses one that holds anything else or is in use), and the pace this machine makes fresh
segments at beside it (``fresh_segment_rate``: the most a WAL never truncated grows by).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time

import pmemwal
from pmemwal.errors import ConfigError, LockedError
from pmemwal.format import DEFAULT_SEGMENT_SIZE, parse_segment_name
from pmemwal.segments import LOCK_NAME, Segment, WalDirectory, is_wal_own_name
from pmemwal.tools.bench.config import BenchConfig


def _open_wal(config: BenchConfig, client: bool = False) -> pmemwal.WAL:
    """The WAL ``config`` describes, as the run's main process or (``client``) a client
    process opens it.  With ``processes`` the main process appends only in the warm-up, so
    it runs no background writer: it would map and prefault every segment the clients
    reach, a third process's work on their CPUs."""
    options = config.wal_options()
    if config.processes and not client:
        options["background"] = False
    return pmemwal.open(config.path, mode=config.mode, create=not client,
                        segment_size=config.segment_size, insert_slots=config.insert_slots,
                        recycle_segments=config.recycle_segments(
                            config.segment_size or DEFAULT_SEGMENT_SIZE),
                        shared=config.processes, **options)


def fresh_segment_rate(parent: str, segment_size: int, mode: str = "direct", prefault: bool = True,
                       count: int = 8) -> float:
    """Bytes/s at which this machine makes segments in a scratch directory under ``parent``
    as a WAL in ``mode`` does (created, allocated and synced; with ``prefault``, direct
    mode's mapped with every page faulted in, buffered mode's written with zeros): the
    most a WAL that is never truncated can grow by."""
    path = tempfile.mkdtemp(prefix=".pmemwal-fresh-", dir=parent)
    directory = WalDirectory(path, create=True)
    try:
        t0 = time.perf_counter()
        for segno in range(count):
            directory.create(segno, segment_size, bytes(16), zero_fill=prefault and mode == "buffered")
            segment = Segment(directory.file(segno), segno, segment_size, writable=True)
            if prefault and mode == "direct":
                segment.mapping(populate=True)
            segment.close()
        return count * segment_size / (time.perf_counter() - t0)
    finally:
        directory.close()
        shutil.rmtree(path, ignore_errors=True)


def remove_wal_dir(path: str) -> None:
    """Delete the WAL directory ``path``, refusing one that holds anything else or is in use."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise ConfigError(f"{path} is not a directory")
    names = os.listdir(path)
    strangers = [n for n in names if not is_wal_own_name(n)
                 and parse_segment_name(n.removesuffix(".tmp")) is None]
    if strangers:
        raise ConfigError(f"{path} holds {strangers[0]!r}, which is not part of a pmemwal WAL: "
                          "refusing to delete it (choose another path)")
    if LOCK_NAME in names:  # do not pull a WAL from under its writer
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"{path} is open in another writer") from None
        finally:
            os.close(fd)
    for name in names:
        if os.path.isdir(os.path.join(path, name)):  # archive_status/, lost+found/
            shutil.rmtree(os.path.join(path, name))
        else:
            os.unlink(os.path.join(path, name))
    os.rmdir(path)
