"""The bench's WAL on disk: opened as the run's main process or a client process opens it
(``_open_wal``), marked as the bench's (``mark_bench_wal``: a ``BENCH`` file), its directory
deleted before and after a run (``remove_wal_dir``, which refuses one that holds anything
else, is in use, or holds records and is not the bench's, unless forced), and the pace this
machine makes fresh segments at beside it (``fresh_segment_rate``: the most a WAL never
truncated grows by).
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
from pmemwal.segments import BENCH_NAME, LOCK_NAME, Segment, WalDirectory, is_wal_own_name
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


def _holds_records(path: str) -> bool:
    """Whether the WAL at ``path`` holds any durable record (one that cannot be read, damaged
    or in use in a way that refuses a reader, counts as holding some)."""
    if not any(parse_segment_name(n) is not None for n in os.listdir(path)):
        return False
    try:
        with pmemwal.open(path, readonly=True) as wal:
            return wal.flushed_lsn > wal.first_lsn
    except pmemwal.WALError:
        return True


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


def mark_bench_wal(path: str) -> None:
    """Mark the WAL at ``path`` as the bench's own, before anything is appended to it: a later
    run may delete it without ``force``."""
    with open(os.path.join(path, BENCH_NAME), "wb"):
        pass


def remove_wal_dir(path: str, force: bool = False) -> None:
    """Delete the WAL directory ``path``, refusing one that holds anything else or is in use,
    and (unless ``force``) one holding records that a bench run did not make."""
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
    if not force and BENCH_NAME not in names and _holds_records(path):
        raise ConfigError(f"{path} is a WAL that holds records, and not one pmemwal bench made: "
                          "refusing to delete it (choose another path, or pass --force to "
                          "delete it)")
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
