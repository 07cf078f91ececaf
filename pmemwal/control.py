"""The control file of a shared WAL (``pmemwal.open(path, shared=True)``).

Several processes writing one WAL share its insert position, insertion slots, flushed
position and counters through ``CONTROL``, a small file in the WAL directory that each of
them maps; the native core updates it with C11 atomics (``wal_shared`` in
native/wal_core.h).  It is a cache of what the segments say, never trusted over them: the
process that opens the WAL while no other has it open rebuilds it from recovery, and the
others only check its header and join.

Header (64 bytes, little-endian), then the core's state:

    0  8s   magic          b"PMWALCTL"
    8  u32  version        _core.CONTROL_VERSION: the layout of this file, header included
   12  u32  state size     _core.CONTROL_SIZE (this build's layout, header included)
   16  16s  WAL id         the segments' WAL identifier
   32  u64  segment size
   40  u32  archive        0: the processes do not archive; else ``archive_tag`` of the archive
                           they all name (truncation keeps what it has not shipped: a process
                           without it, or with another, would remove segments it never got):
                           the place a URL names, however spelt, or a command as written
   44  u32  CRC-32C of bytes 0..43
   48  ...  zero

A later process whose options differ from the first one's where the processes must agree
(segment size, archive) is refused with ConfigError; one whose header differs otherwise
(another WAL, another version, damage) with FormatError.

Locks, each dropped by the kernel when its holder dies:

- ``LOCK`` (flock): exclusive for a WAL open in one process, shared by every process of a
  shared WAL, so that the two kinds never write one WAL at once (LockedError).
- ``CONTROL`` (flock, ``files_lock``): held while a process opens the WAL (the first one
  rebuilds this file) and while any process creates, recycles or removes a segment file,
  so that two processes never make, rename or remove the same segment.  A file lock, not
  atomics: the work is a check of the directory and file-system calls that must happen as
  one step, it comes once per segment (off the append path), and a holder that dies
  mid-way leaves nothing to repair but a ``.tmp`` file.
- ``CONTROL`` byte ``2**20 + i`` (an OFD lock, taken by the core): process entry ``i`` is
  alive.  A waiter that finds it free knows the owner died and cleans up after it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from pmemwal import _core
from pmemwal.errors import ClosedError, ConfigError, FormatError
from pmemwal.segments import close_mapped, storage_errors

CONTROL_NAME = "CONTROL"
MAGIC = b"PMWALCTL"
_HEADER = struct.Struct("<8sII16sQI")
_ARCHIVE = 40  # the archive field's offset
_CRC = _HEADER.size  # 44


def archive_tag(spec: dict[str, Any] | None) -> int:
    """The archive field for a process's archive options (options.py's ``archive_spec``):
    0 without archiving, else a CRC-32C (never 0) of the archive its URL names
    (``archive_place``) or of its command, as written.  archive_options, restore_command
    and the timeouts are not compared."""
    if spec is None:
        return 0
    name = f"url {archive_place(spec['url'])}" if "url" in spec else f"command {spec['command']}"
    return _core.crc32c(name.encode("utf-8", "surrogateescape")) or 1


def archive_place(url: str) -> str:
    """The archive ``url`` names, spelled one way: a local path (no scheme, ``file://``
    or ``local://``) made absolute against this process's working directory (fsspec takes
    a relative one from there), normalised and without a trailing slash; any other URL
    without its trailing slashes."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme not in ("file", "local"):
        return url.rstrip("/") or url
    return "file://" + os.path.abspath(rest if sep else url)


def _pack_header(wal_id: bytes, segment_size: int, archive: int) -> bytes:
    body = _HEADER.pack(MAGIC, _core.CONTROL_VERSION, _core.CONTROL_SIZE, wal_id, segment_size,
                        archive)
    return body + struct.pack("<I", _core.crc32c(body))


def _archive_mismatch(theirs: int, ours: int) -> str:
    """Why a process whose archive options differ from its peers' is refused."""
    if not theirs:
        return ("the processes sharing this WAL do not archive, and this one would (archive or "
                "archive_command): every process passes the same archive options, or none")
    what = "no archive option" if not ours else "another archive"
    return (f"the processes sharing this WAL archive, and this one names {what}: its "
            "truncations would remove segments their archiver has not shipped; every process "
            "passes the same archive (or archive_command)")


class ControlFile:
    """``CONTROL`` in a WAL directory: its mapping and its files lock; ``archive``: this
    process's ``archive_tag``."""

    def __init__(self, directory: str, archive: int = 0) -> None:
        self.path = os.path.join(directory, CONTROL_NAME)
        self.archive = archive
        with storage_errors(f"opening {self.path}"):
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.map: mmap.mmap | None = None
        self._thread_lock = threading.RLock()
        self._depth = 0

    @contextmanager
    def files_lock(self) -> Iterator[None]:
        """Held while opening, and while changing which segment files exist; one thread of
        one process at a time, re-entrant within a thread."""
        with self._thread_lock:
            if self.fd < 0:  # closed (close takes this lock too: never under a holder)
                raise ClosedError("the WAL is closed")
            if self._depth == 0:
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)

    def rebuild(self, wal_id: bytes, segment_size: int) -> mmap.mmap:
        """The first process: a fresh header over a state the core then resets."""
        with storage_errors(f"writing {self.path}"):
            os.ftruncate(self.fd, 0)  # nothing from an earlier layout survives
            os.ftruncate(self.fd, _core.CONTROL_SIZE)
            os.pwrite(self.fd, _pack_header(wal_id, segment_size, self.archive), 0)
        return self._map()

    def join(self, wal_id: bytes, segment_size: int) -> mmap.mmap:
        """A later process: the state the processes that have the WAL open share, once its
        header shows it is this WAL's, of this layout (FormatError otherwise), archived as
        this process would (ConfigError otherwise).  The version is checked before the CRC,
        which covers another layout's header differently."""
        with storage_errors(f"reading {self.path}"):
            data = os.pread(self.fd, _core.CONTROL_HEADER, 0)
            size = os.fstat(self.fd).st_size
        expected = _pack_header(wal_id, segment_size, self.archive)
        if len(data) < len(expected) or data[:8] != MAGIC:
            raise FormatError(f"{self.path} is not a pmemwal control file")
        version, state_size = struct.unpack_from("<II", data, 8)
        if (version, state_size) != (_core.CONTROL_VERSION, _core.CONTROL_SIZE):
            raise FormatError(f"{self.path} was made by another pmemwal version (control layout "
                              f"{version}, {state_size} bytes; this one: {_core.CONTROL_VERSION}, "
                              f"{_core.CONTROL_SIZE}): every process must run the same version")
        if struct.unpack_from("<I", data, _CRC)[0] != _core.crc32c(data[:_CRC]):
            raise FormatError(f"{self.path}: its header is damaged (CRC mismatch)")
        if data[16:32] != wal_id:
            raise FormatError(f"{self.path} belongs to another WAL")
        if data[:_ARCHIVE] != expected[:_ARCHIVE] or size < _core.CONTROL_SIZE:
            raise FormatError(f"{self.path} does not match the WAL's segments")
        theirs = struct.unpack_from("<I", data, _ARCHIVE)[0]
        if theirs != self.archive:
            raise ConfigError(_archive_mismatch(theirs, self.archive))
        return self._map()

    def _map(self) -> mmap.mmap:
        with storage_errors(f"mapping {self.path}"):
            self.map = mmap.mmap(self.fd, _core.CONTROL_SIZE)
        return self.map

    def close(self) -> None:
        """Close, once no thread of this process holds the files lock (closing the descriptor
        would drop its flock), and unmap, unless the closed core still exports the mapping
        to calls in flight: its last reference unmaps it then."""
        with self._thread_lock:
            close_mapped(self.map, self.fd)
            self.map, self.fd = None, -1

    def forsake(self) -> None:
        """In a child after fork(): drop this process's copies, touching nothing shared
        (closing the descriptor copy leaves the parent's locks as they are)."""
        close_mapped(None, self.fd)  # the mapping's copy dies with the child
        self.map, self.fd = None, -1
