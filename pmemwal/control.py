"""The control file of a shared WAL (``pmemwal.open(path, shared=True)``).

Several processes writing one WAL share its insert position, insertion slots, flushed
position and counters through ``CONTROL``, a small file in the WAL directory that each of
them maps; the native core updates it with C11 atomics (``wal_shared`` in
native/wal_core.h).  It is a cache of what the segments say, never trusted over them: the
process that opens the WAL while no other has it open rebuilds it from recovery, and the
others only check its header and join.

Header (64 bytes, little-endian), then the core's state:

    0  8s   magic          b"PMWALCTL"
    8  u32  version        _core.CONTROL_VERSION: the layout of what follows
   12  u32  state size     _core.CONTROL_SIZE (this build's layout, header included)
   16  16s  WAL id         the segments' WAL identifier
   32  u64  segment size
   40  u32  CRC-32C of bytes 0..39
   44  ...  zero

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
from typing import Iterator

from pmemwal import _core
from pmemwal.errors import ClosedError, FormatError
from pmemwal.segments import close_mapped, storage_errors

CONTROL_NAME = "CONTROL"
MAGIC = b"PMWALCTL"
_HEADER = struct.Struct("<8sII16sQ")


def _pack_header(wal_id: bytes, segment_size: int) -> bytes:
    body = _HEADER.pack(MAGIC, _core.CONTROL_VERSION, _core.CONTROL_SIZE, wal_id, segment_size)
    return body + struct.pack("<I", _core.crc32c(body))


class ControlFile:
    """``CONTROL`` in a WAL directory: its mapping and its files lock."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CONTROL_NAME)
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
            os.pwrite(self.fd, _pack_header(wal_id, segment_size), 0)
        return self._map()

    def join(self, wal_id: bytes, segment_size: int) -> mmap.mmap:
        """A later process: the state the processes that have the WAL open share, once its
        header shows it is this WAL's, of this layout (FormatError otherwise)."""
        with storage_errors(f"reading {self.path}"):
            data = os.pread(self.fd, _core.CONTROL_HEADER, 0)
            size = os.fstat(self.fd).st_size
        expected = _pack_header(wal_id, segment_size)
        if len(data) < len(expected) or data[:8] != MAGIC:
            raise FormatError(f"{self.path} is not a pmemwal control file")
        if struct.unpack_from("<I", data, 40)[0] != _core.crc32c(data[:40]):
            raise FormatError(f"{self.path}: its header is damaged (CRC mismatch)")
        version, state_size = struct.unpack_from("<II", data, 8)
        if (version, state_size) != (_core.CONTROL_VERSION, _core.CONTROL_SIZE):
            raise FormatError(f"{self.path} was made by another pmemwal version (control layout "
                              f"{version}, {state_size} bytes; this one: {_core.CONTROL_VERSION}, "
                              f"{_core.CONTROL_SIZE}): every process must run the same version")
        if data[16:32] != wal_id:
            raise FormatError(f"{self.path} belongs to another WAL")
        if data[:44] != expected or size < _core.CONTROL_SIZE:
            raise FormatError(f"{self.path} does not match the WAL's segments")
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
