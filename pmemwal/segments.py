"""The WAL directory: its lock, its segment files, and their life cycle.

A new segment is made as ``<name>.tmp``: allocated in full (posix_fallocate,
so that no write into it can fail for space; buffered mode writes zeros over
it instead, so that appends never meet an unwritten block), its header page
written and synced, then renamed into place and the directory
synced (etcd's file pipeline).  Recycling renames an old segment to a future
number through the same temp name and rewrites only its header: its pages
stay allocated, and the page LSNs in them mark the old bytes as stale.  A
``.tmp`` left by a crash is removed on open.

Files changed under a running writer.  Deleted: writes, syncs and mappings of
an unlinked file still succeed, and what they hold vanishes with it.  The
background writer watches the directory (inotify), checks the segments' link
counts when a file leaves it or is renamed over (and every flush_interval), and stops
the writer (WriterStoppedError, ENOENT); flushes acknowledged in between
(about one GIL switch interval, ~5 ms, after an event; up to flush_interval for
a file deleted as it was being brought in) are lost with the file.  Without the
background writer, nothing notices.  Records already acknowledged in a deleted
segment are lost in every mode; on reopen, a missing segment with a later one
present (segments are made in order) is a CorruptionError, while a missing
last segment looks like the end of the WAL.  Made read-only: an open
descriptor or mapping keeps writing (POSIX checks permissions at open), so
nothing changes until a segment must be created, recycled or opened again,
which fails with a StorageError (EACCES, EROFS) that stops nothing.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

from pmemwal import _core
from pmemwal.errors import ClosedError, FormatError, LockedError, NotFoundError, StorageError
from pmemwal.format import (CHECKPOINTED, HEADER_SIZE, PAGE_MAGIC, PAGE_SIZE, SPARE, SegmentHeader,
                            page_names_its_place, parse_segment_name, segment_name)
from pmemwal.libpmem import buffer_address

LOCK_NAME = "LOCK"
CONTROL_NAME = "CONTROL"  # a shared WAL's control file (pmemwal/control.py)
CHECKPOINT_NAME = "CHECKPOINT"  # where recovery starts (pmemwal/checkpoint.py)
RESTORING_NAME = "RESTORING"  # a restore is building this WAL (pmemwal/tools/restore.py)
LOST_FOUND_NAME = "lost+found"  # what a cut set aside (pmemwal/lostfound.py)
INDEX_NAME = "index"  # pmemwal.Log's durable index (pmemwal/log_index.py)
MAP_SHARED_VALIDATE = 0x03
MAP_SYNC = 0x80000
MADV_POPULATE_WRITE = 23  # Linux 5.14+
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
ARCHIVE_STATUS_NAME = "archive_status"  # archiving's status files (pmemwal/archive.py)
# What a WAL directory holds besides its segments (and their temp files)
FOLLOW_NAME = "FOLLOW"  # what writers publish for readers in other processes (pmemwal/follow_file.py)
BENCH_NAME = "BENCH"  # an empty file: pmemwal bench made this WAL, and may delete it
# What only a WAL that held records keeps beside its segments (and outlives them)
WAL_DATA_NAMES = (CHECKPOINT_NAME, LOST_FOUND_NAME, INDEX_NAME, ARCHIVE_STATUS_NAME)
WAL_OWN_NAMES = {LOCK_NAME, CONTROL_NAME, CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp",
            ARCHIVE_STATUS_NAME, LOST_FOUND_NAME, INDEX_NAME, FOLLOW_NAME, BENCH_NAME}


WRITER_BYTE = 1 << 20  # of LOCK: read-locked (OFD) by every writer while it has the WAL open


def ofd_lock(fd: int, offset: int, kind: int, wait: bool = False) -> bool:
    """Take (F_RDLCK, F_WRLCK) or drop (F_UNLCK) an OFD lock on one byte of a file: False
    when another holder's conflicts (and ``wait`` is False).  The kernel drops it when the
    last descriptor of its open file closes, however the process ends."""
    lock = struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, lock)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def ofd_held(fd: int, offset: int) -> bool:
    """Whether another open file holds an OFD lock on the byte (none is taken)."""
    lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    kind = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, lock))[0]
    return kind != fcntl.F_UNLCK


def writer_open(path: str) -> bool:
    """Whether a writer has the WAL in directory ``path`` open (its lock on LOCK is held),
    found without taking any lock."""
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return ofd_held(fd, WRITER_BYTE)
    finally:
        os.close(fd)


def file_holds_pages(path: str, segno: int, segment_size: int, wal_id_lo: int) -> bool:
    """Whether the segment file at ``path`` (segment ``segno``) has a data page whose header
    names its own place in this WAL (magic, page LSN, the WAL id's first 4 bytes; the CRC
    not asked, so that a torn header counts too): a page written since the file became
    segment ``segno``.  A spare's pages are zero, or an older cycle's, whose page LSNs name
    the segment the file was before it was recycled."""
    base = segno * segment_size
    with storage_errors(f"reading {path}"):
        fd = os.open(path, os.O_RDONLY)
        try:
            for chunk in range(0, min(os.fstat(fd).st_size, segment_size), 1 << 20):
                data = os.pread(fd, 1 << 20, chunk)
                for off in range(PAGE_SIZE if chunk == 0 else 0, len(data) - 23, PAGE_SIZE):
                    magic, _, page_lsn, lo = _PAGE_HEADER.unpack_from(data, off)
                    if (magic, page_lsn, lo) == (PAGE_MAGIC, base + chunk + off, wal_id_lo):
                        return True
        finally:
            os.close(fd)
    return False


def is_wal_own_name(name: str) -> bool:
    """Whether a name in a WAL directory is one of the WAL's own files besides segments (a
    FOLLOW file being made by a process, which links it into place, included)."""
    return name in WAL_OWN_NAMES or name.startswith(FOLLOW_NAME + ".tmp.")


_ZEROS = memoryview(bytes(1 << 20))  # a new segment's zero fill, a MiB per write
_PAGE_HEADER = struct.Struct("<IIQI")  # a data page's magic, rem_len, page LSN, wal_id_lo


def sync_directory(path: str) -> None:
    """Make the renames, creations and removals in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(path: str, mode: int = 0o777) -> None:
    """Make directory ``path`` (with ``mode``) and any missing parents (as os.makedirs
    makes them), each entry durable (the parent of every directory made is synced): a
    lost entry would leave an open(create=True) to build a new WAL over nothing."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for made in reversed(missing):
        try:
            os.mkdir(made, mode if made == missing[0] else 0o777)
        except FileExistsError:
            pass    # another thread made it: its entry is synced below all the same
        sync_directory(os.path.dirname(made))


@contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Turn an OSError from the file system into a StorageError naming ``what``."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(exc.errno or errno.EIO, f"{what}: {exc.strerror or exc}") from exc


_LOCKED: weakref.WeakSet[WalDirectory] = weakref.WeakSet()  # directories whose lock we hold


def _after_fork_in_child() -> None:
    for directory in list(_LOCKED):
        directory._drop_lock_in_child()
    _LOCKED.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


class WalDirectory:
    """One WAL directory, locked against other writers while this object lives (``shared``:
    locked by ``lock_shared`` against writers that do not share it)."""

    def __init__(self, path: str, create: bool, shared: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.may_create = create
        self.cuts = 0   # the WAL's count of cuts, for the headers written (pmemwal/format.py)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise FormatError(f"{self.path} is a file, not a WAL directory")
        if not os.path.isdir(self.path):
            if not create:
                raise NotFoundError(errno.ENOENT, "no WAL directory (create=False)", self.path)
            with storage_errors(f"creating {self.path}"):
                make_directories(self.path, mode=0o700)
        self.list_segments(tidy=False)  # refuse a foreign directory before leaving a LOCK in it
        self._checkpoint_seen = False  # (header_flags)
        with storage_errors(f"opening {self.path}"):
            self.dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            self.lock_fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        _LOCKED.add(self)
        # readers in other processes tell that a writer has the WAL open by this lock, which
        # they test without taking (writer_open); it goes with the descriptor, or the process
        ofd_lock(self.lock_fd, WRITER_BYTE, fcntl.F_RDLCK, wait=True)
        if shared:
            return
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise LockedError(f"{self.path} is open in another writer (lock file {LOCK_NAME}); "
                              "several processes write one WAL when all open it with "
                              "shared=True") from None

    def refuse_unshared_writer(self) -> None:
        """Before a shared open makes CONTROL: LockedError when a writer that does not share
        the WAL has it open, so that the refused open leaves no file in that writer's WAL.
        Told apart, without waiting, from a shared WAL's first process, which holds LOCK
        exclusively while it opens too: that one made CONTROL before it took LOCK, and
        CONTROL, once made, is never removed.  So LOCK held, then CONTROL absent: the holder
        shares nothing.  (LOCK held and CONTROL there: ``lock_shared`` decides, under the
        files lock.)  A window remains: a writer that takes LOCK after this test and before
        CONTROL is made gets an empty CONTROL, which it ignores."""
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            if not os.path.lexists(os.path.join(self.path, CONTROL_NAME)):
                raise LockedError(f"{self.path} is open in a writer that does not share it "
                                  f"(lock file {LOCK_NAME}; open it with shared=True "
                                  "everywhere)") from None
            return
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)   # (only a test: lock_shared takes it)

    def undo_create(self) -> None:
        """After an open that made this WAL failed (its lock held, no other writer can have
        joined): remove what it made, so that a failed create leaves no segment behind.  In
        an order whose every crash point (and every subset a power loss keeps of what was
        synced since) leaves a directory the next open takes: archive_status/ first (left
        without segments, it would read as a WAL whose segments were deleted), the segments
        newest first (a lone segment 0 with CHECKPOINT is a new WAL), CHECKPOINT last (one
        that vouches for no segment reopens), the directory synced after each.  LOCK stays:
        another open may hold it open, waiting, and one that then locked an unlinked LOCK
        while a third made a new one would be a second writer of the WAL.  FOLLOW stays: a
        follower that came meanwhile waits on it, and the next writer publishes there.
        Best effort: the open's own error is what the caller raises."""
        def removed(remove: Callable[[str], None], name: str) -> None:
            try:
                remove(os.path.join(self.path, name))
                self.sync()
            except OSError:
                pass

        removed(os.rmdir, ARCHIVE_STATUS_NAME)  # (made, and empty: this open's archiver's)
        names = os.listdir(self.path)
        temps = [n for n in names if n.endswith(".wal.tmp")
                 and parse_segment_name(n[:-4]) is not None]
        segnos = sorted((n for n in map(parse_segment_name, names) if n is not None),
                        reverse=True)
        for name in temps + [segment_name(n) for n in segnos] + [CHECKPOINT_NAME + ".tmp",
                                                                 CHECKPOINT_NAME]:
            if name in names:
                removed(os.unlink, name)

    def lock_shared(self) -> bool:
        """A shared WAL (the caller holds the control file's files lock): True when no other
        process has the WAL open (this one then rebuilds the control file and calls
        ``share_lock``), False when processes sharing it have; LockedError when a writer
        that does not share it has it open."""
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            raise LockedError(f"{self.path} is open in a writer that does not share it "
                              f"(lock file {LOCK_NAME}; open it with shared=True everywhere)") from None

    def share_lock(self) -> None:
        """The first process of a shared WAL, once it has rebuilt the control file: from
        exclusive to shared.  flock converts by unlocking first, so a writer that does not
        share the WAL can take it in between: then this one gives way (LockedError)."""
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"{self.path} was opened by a writer that does not share it "
                              "while this one was opening it") from None

    def _drop_lock_in_child(self) -> None:
        """After fork, in the child: close (never unlock) our copy of the lock's descriptor.

        An flock belongs to the open file, which a forked child shares: without this, a
        child that outlives its parent (pysyncobj forks one to write snapshots) would keep
        the WAL locked after the parent closed it or died.  Closing the child's copy
        leaves the parent's lock as it is; unlocking would release it."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def close(self) -> None:
        """Release the lock and the directory."""
        _LOCKED.discard(self)
        for fd in (self.lock_fd, self.dir_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.lock_fd = self.dir_fd = -1

    def file(self, segno: int) -> str:
        return os.path.join(self.path, segment_name(segno))

    def list_segments(self, tidy: bool = True) -> list[int]:
        """Segment numbers present, sorted; with ``tidy`` (under the lock) removes the temp
        files of an interrupted create or recycle.  Files that are not the WAL's are ignored
        in a WAL (never read, never removed: as PostgreSQL ignores unknown files in pg_wal),
        but refused in a directory with no segment file nor anything a WAL keeps beside its
        segments: a WAL is not made among files it does not know (a wrong path).  (With
        CHECKPOINT or lost+found there, the open decides what the missing segments mean.)"""
        segnos, foreign = [], []
        for name in os.listdir(self.path):
            segno = parse_segment_name(name)
            if segno is not None:
                segnos.append(segno)
            elif name.endswith(".wal.tmp") and parse_segment_name(name[:-4]) is not None:
                if tidy:
                    try:
                        os.unlink(os.path.join(self.path, name))
                    except FileNotFoundError:
                        pass  # gone already: renamed by a writer the lock did not exclude
            elif name == RESTORING_NAME:
                raise FormatError(f"{self.path} is a restore cut short ({name} is there): run "
                                  "the restore again, which starts over")
            elif not is_wal_own_name(name):
                foreign.append(name)
        if foreign and not segnos and not any(os.path.lexists(os.path.join(self.path, name))
                                              for name in WAL_DATA_NAMES):
            raise FormatError(f"{self.path} holds {min(foreign)!r}, which is not part of a "
                              "pmemwal WAL, and no segment file: not a WAL directory")
        return sorted(segnos)

    def read_headers(self, segnos: list[int]) -> list[tuple[SegmentHeader | FormatError, int]]:
        """The checked headers of segment files (or the FormatError that says why one does
        not check), and their sizes.  Open reads every one, so this is lean: descriptors
        relative to the directory's, no file objects."""
        out: list[tuple[SegmentHeader | FormatError, int]] = []
        for segno in segnos:
            name = segment_name(segno)
            with storage_errors(f"reading {self.file(segno)}"):
                fd = os.open(name, os.O_RDONLY, dir_fd=self.dir_fd)
                try:
                    data = os.pread(fd, HEADER_SIZE, 0)
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
            try:
                header = SegmentHeader.unpack(data, self.file(segno))
            except FormatError as exc:
                out.append((exc, size))
                continue
            if header.segno != segno:
                raise FormatError(f"{self.file(segno)}: header says segment {header.segno:016X}")
            out.append((header, size))
        return out

    def holds_pages(self, segno: int, segment_size: int, wal_id_lo: int) -> bool:
        """Whether segment file ``segno`` has a data page written since it became that
        segment (``file_holds_pages``)."""
        return file_holds_pages(self.file(segno), segno, segment_size, wal_id_lo)

    def wrote_page(self, page_lsn: int, segment_size: int, wal_id_lo: int) -> bool:
        """Whether the data page at ``page_lsn`` has a header naming that place in this WAL
        (as ``holds_pages`` asks it): written since its file became that segment.  False
        where the file is cut short before the page."""
        segno, offset = divmod(page_lsn, segment_size)
        with storage_errors(f"reading {self.file(segno)}"):
            fd = os.open(segment_name(segno), os.O_RDONLY, dir_fd=self.dir_fd)
            try:
                data = os.pread(fd, _PAGE_HEADER.size, offset)
            finally:
                os.close(fd)
        return page_names_its_place(data, page_lsn, wal_id_lo)

    def sync(self) -> None:
        """Make renames and removals durable."""
        if self.dir_fd < 0:  # an appender making a segment as another thread closes the WAL
            raise ClosedError("the WAL is closed")
        os.fsync(self.dir_fd)

    def header_flags(self) -> int:
        """The flags of a segment header written now: CHECKPOINTED once the WAL has a
        CHECKPOINT (pmemwal/format.py).  A stat at each segment made or recycled until one
        is seen; then the flag stays (it says the WAL kept one, which a deletion since
        does not undo)."""
        if not self._checkpoint_seen:
            self._checkpoint_seen = os.path.exists(os.path.join(self.path, CHECKPOINT_NAME))
        return CHECKPOINTED if self._checkpoint_seen else 0

    def create(self, segno: int, segment_size: int, wal_id: bytes, zero_fill: bool = False,
               flags: int | None = None, spare: bool = False) -> None:
        """A new, fully allocated segment file (``spare``: its header says so, until ``arm``
        rewrites it); ``zero_fill`` writes every byte of it
        instead (PostgreSQL's wal_init_zero): allocated blocks are still unwritten
        (ext4's unwritten extents, tmpfs pages not yet cleared), so the first write to
        each would cost an appender a page clear or an extent conversion at its sync.
        ``flags``: its header's (None: ``header_flags()``)."""
        flags = self.header_flags() if flags is None else flags
        path = self.file(segno)
        tmp = path + ".tmp"
        with storage_errors(f"creating {path}"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if zero_fill:
                    offset = 0
                    while offset < segment_size:  # a short write only ever means no space left
                        offset += os.pwrite(fd, _ZEROS[:segment_size - offset], offset)
                else:
                    os.posix_fallocate(fd, 0, segment_size)
                header = SegmentHeader(segno, segment_size, wal_id, flags | (SPARE if spare else 0),
                                       cuts=self.cuts)
                os.pwrite(fd, header.pack(), 0)
                os.fdatasync(fd)
            except OSError:
                os.unlink(tmp)
                raise
            finally:
                os.close(fd)
            os.rename(tmp, path)
            self.sync()

    def recycle(self, old: int, new: int, segment_size: int, wal_id: bytes, fd: int = -1,
                spare: bool = False) -> None:
        """Reuse segment ``old`` as future segment ``new``: a rename and a new header
        (``spare``: one that says so, and what the file was, until ``arm`` rewrites it).

        ``fd``, an open descriptor of the file, is written through when given:
        the file keeps its inode, so open descriptors and mappings stay valid.
        """
        path = self.file(new)
        tmp = path + ".tmp"
        with storage_errors(f"recycling {self.file(old)}"):
            os.rename(self.file(old), tmp)
            self.sync()  # before the new header: a crash must not leave the old name over it
            own = fd < 0
            if own:
                fd = os.open(tmp, os.O_RDWR)
            try:
                header = SegmentHeader(new, segment_size, wal_id,
                                       self.header_flags() | (SPARE if spare else 0),
                                       old if spare else None, self.cuts)
                os.pwrite(fd, header.pack(), 0)
                os.fdatasync(fd)
            finally:
                if own:
                    os.close(fd)
            os.rename(tmp, path)
            self.sync()

    def arm(self, segno: int, segment_size: int, wal_id: bytes, fd: int) -> None:
        """Spare segment ``segno`` (``fd`` open on it) about to be written: its header
        rewritten as a segment in use, and synced, before any page of it can be (recovery
        passes by a segment whose header says spare).  A crash tearing this write leaves a
        header that does not read on a segment that holds nothing: set aside on open."""
        with storage_errors(f"writing the header of {self.file(segno)}"):
            header = SegmentHeader(segno, segment_size, wal_id, self.header_flags(),
                                   cuts=self.cuts)
            os.pwrite(fd, header.pack()[:HEADER_SIZE], 0)
            os.fdatasync(fd)

    def is_spare(self, segno: int) -> bool:
        """Whether segment ``segno``'s header says spare (one that does not read: no)."""
        with storage_errors(f"reading {self.file(segno)}"):
            fd = os.open(segment_name(segno), os.O_RDONLY, dir_fd=self.dir_fd)
            try:
                data = os.pread(fd, HEADER_SIZE, 0)
            finally:
                os.close(fd)
        try:
            return SegmentHeader.unpack(data, self.file(segno)).spare
        except FormatError:
            return False

    def remove(self, segno: int) -> None:
        with storage_errors(f"removing {self.file(segno)}"):
            os.unlink(self.file(segno))
            self.sync()


def close_mapped(mapping: mmap.mmap | None, fd: int) -> None:
    """Unmap ``mapping`` (one still exported to a view lives on until that dies) and close
    ``fd`` (-1: none)."""
    if mapping is not None:
        try:
            mapping.close()
        except BufferError:
            pass
    if fd >= 0:
        os.close(fd)


class Segment:
    """An open segment file: its descriptor, and a mapping when one is needed."""

    def __init__(self, path: str, segno: int, size: int, *, writable: bool, dsync: bool = False) -> None:
        self.segno = segno
        flags = os.O_RDWR if writable else os.O_RDONLY
        if dsync:
            flags |= os.O_DSYNC
        with storage_errors(f"opening {path}"):
            self.fd = os.open(path, flags)
            st = os.fstat(self.fd)
        self.inode = (st.st_dev, st.st_ino)  # the file, whatever it is named after a recycling
        self.size = size
        self.writable = writable
        self.map: mmap.mmap | None = None
        self.map_sync = False  # whether the mapping is MAP_SYNC (DAX: cache flushes persist)
        self.spare = False  # its header says spare: not attached to the writer (wal/supply.py)

    def mapping(self, *, populate: bool = False, sync: bool = False,
                populate_from: int = 0) -> mmap.mmap:
        """The shared mapping (made on first use); ``populate`` pre-faults every page from
        the page of offset ``populate_from`` on (the part appends will write: a WAL opened
        where it left off leaves the written part to fault in as it is read).

        Pre-faulting takes about half of making a segment (8 ms of 14 for 16 MiB on tmpfs),
        and Python's mmap holds the GIL through MAP_POPULATE, stalling every other thread:
        madvise(MADV_POPULATE_WRITE), called through ctypes, does it with the GIL released
        (MAP_POPULATE, of the whole mapping, where the kernel lacks it)."""
        populate_later = populate and self.writable
        if populate_later and self.map is None:
            mapping = self._map(populate=False, sync=sync)
            start = min(populate_from - populate_from % mmap.PAGESIZE, self.size)
            if start == self.size or _libc.madvise(buffer_address(mapping) + start,
                                                   self.size - start, MADV_POPULATE_WRITE) == 0:
                return mapping
            mapping.close()  # no MADV_POPULATE_WRITE here (EINVAL before Linux 5.14)
            self.map, self.map_sync = None, False
        return self._map(populate=populate, sync=sync)

    def _map(self, *, populate: bool, sync: bool) -> mmap.mmap:
        if self.map is None:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0)
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
            with storage_errors(f"mapping segment {self.segno:016X}"):
                if sync:
                    try:
                        self.map = mmap.mmap(self.fd, self.size, flags | MAP_SHARED_VALIDATE | MAP_SYNC, prot)
                        self.map_sync = True
                    except OSError:
                        pass  # not DAX (this file): an ordinary mapping; map_sync says so
                if self.map is None:
                    self.map = mmap.mmap(self.fd, self.size, flags, prot)
        return self.map

    def close_fd(self) -> None:
        """Close the descriptor of a segment mapped for reading alone: the mapping keeps the
        file's pages (Python's mmap holds a descriptor of its own until it is unmapped)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Unmap and close; a mapping a read in another thread still holds lives on until it
        lets it go."""
        close_mapped(self.map, self.fd)
        self.map, self.fd = None, -1
