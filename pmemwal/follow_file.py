"""The FOLLOW file: what a WAL's writers publish for readers in other processes, and the
stored positions of named followers.

Every writer maps ``FOLLOW`` in the WAL directory.  The native core raises its durable LSN
after each flush (native/wal_follow.h: the progress lines), so that a reader in another
process knows how far it may read without a lock or a system call, and wakes the readers
that sleep on its futex word.  Truncation raises the oldest segment here before it touches a
file, so that a reader takes a segment that went as truncated, not as damaged.  A follower
that registers a name keeps its confirmed position in a slot here, stored durably (msync);
truncation keeps what a registered follower has not confirmed, up to the writer's
``max_follower_lag_bytes``, past which the slot is marked lost.

Layout (little-endian, 12 KiB):

    0  8s   magic          b"PMWALFLW"
    8  u32  version        1
   12  u32  slots          64
   16  16s  WAL id
   32  u64  segment size
   40  u32  CRC-32C of bytes 0..39
   64  u64  durable LSN    every record below it is durable (a record boundary)
   72  u64  oldest segno   segments below it are truncated
   80  u64  generation     bumped by every writer that opens the WAL alone (after recovery)
   88  16s  boot id        the machine's boot (/proc/sys/kernel/random/boot_id) when the last
                           writer opened the WAL: the durable LSN is exact only in that boot
  128  u32  seq            futex word, bumped by every wake
  136  u64  sleepers       bit i: the follower of sleeper slot i sleeps on seq, or is about to
 4096  64 slots of 128 bytes:
           0 u32 state     0 free, 1 active, 2 lost (fell further behind than the bound)
           4 u32 name length
           8 u64 position  the LSN its next record is read from
          16 u64 last LSN  the last record it confirmed (0: none), where the chain resumes
          24 u64 time      when it last confirmed (ns since the epoch)
          32 u64 lost at   the flushed LSN when it was marked lost
          64 64s name      UTF-8

The file is never needed to read the WAL: the segments are the truth, and a writer that
opens the WAL alone sets the progress lines again from recovery.  It is made by whoever
needs it first (a writer or a named follower), as a temp file linked into place.

Locks, each dropped by the kernel when its holder dies (a writer's own is on ``LOCK``:
segments.py, ``writer_open``):

- byte ``2**20 + 1 + i`` (an OFD write lock): slot ``i``'s follower is alive; a second
  follower of the same name is refused.
- byte ``2**20 + 65 + i`` (an OFD write lock): sleeper slot ``i`` (a bit of ``sleepers``)
  belongs to a live follower.  One killed asleep leaves its bit set, and every flush would
  then pay a wake-up: the next follower to take the slot, and a writer's rounds, clear a bit
  whose lock is free.
- the whole file (flock): held while a slot is claimed or dropped.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from pmemwal import _core
from pmemwal.errors import ConfigError, FormatError, LockedError, StorageError
from pmemwal.segments import FOLLOW_NAME, close_mapped, ofd_held, ofd_lock, storage_errors

TEMP_PREFIX = FOLLOW_NAME + ".tmp."  # a file being made: FOLLOW.tmp.<pid>.<thread>
MAGIC = b"PMWALFLW"
VERSION = 1
SLOTS = 64
SIZE = 12288
_HEADER = struct.Struct("<8sII16sQ")
DURABLE, OLDEST, GENERATION, BOOT_ID, SLEEPERS = 64, 72, 80, 88, 136  # the progress lines
STORE, RAISE, AND, OR = range(4)  # _core.atomic_u64's operations
_SLOT_BASE, _SLOT_SIZE = 4096, 128
_SLOT = struct.Struct("<IIQQQQ")
_SLOT_STATES = struct.Struct("<" + f"I{_SLOT_SIZE - 4}x" * SLOTS)  # each slot's first word
_NAME_OFFSET, NAME_MAX = 64, 64
FREE, ACTIVE, LOST = 0, 1, 2
STATE_NAMES = {ACTIVE: "active", LOST: "lost"}
_LOCKS = 1 << 20  # slot i's follower: _LOCKS + 1 + i; sleeper slot i: _LOCKS + 1 + SLOTS + i
SLEEPER_SLOTS = 64


@dataclass(frozen=True)
class FollowerSlot:
    """A named follower's stored position, as the FOLLOW file holds it."""

    index: int
    name: str
    state: int
    position: int
    last_lsn: int
    confirmed_ns: int
    lost_at: int

    def as_dict(self, durable: int) -> dict[str, object]:
        return {"name": self.name, "state": STATE_NAMES.get(self.state, "?"),
                "position": self.position, "lag_bytes": max(durable - self.position, 0),
                "confirmed_at": self.confirmed_ns / 1e9 if self.confirmed_ns else None,
                **({"lost_at": self.lost_at} if self.state == LOST else {})}


def _header(wal_id: bytes, segment_size: int) -> bytes:
    body = _HEADER.pack(MAGIC, VERSION, SLOTS, wal_id, segment_size)
    return body + struct.pack("<I", _core.crc32c(body))


class FollowFile:
    """``FOLLOW`` in a WAL directory, mapped: by a writer (``for_writer``) or a reader
    (``open``, read-only unless it registers a follower)."""

    def __init__(self, directory: str, fd: int, writable: bool) -> None:
        self.path = os.path.join(directory, FOLLOW_NAME)
        self.fd = fd
        self.writable = writable
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        with storage_errors(f"mapping {self.path}"):
            self.map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, prot)

    # -- opening --

    @classmethod
    def for_writer(cls, directory: str, wal_id: bytes, segment_size: int,
                   alone: bool) -> FollowFile:
        """The writer's: made if missing, remade if it is another WAL's or damaged when the
        writer opens the WAL ``alone`` (its followers' positions mean nothing to this WAL)."""
        fd = _open_or_make(directory, wal_id, segment_size, os.O_RDWR)
        try:
            if _check(fd, wal_id, segment_size) is not None:
                if not alone:  # (others have it open: the first of them made it right)
                    raise FormatError(f"{os.path.join(directory, FOLLOW_NAME)} does not match "
                                      "the WAL's segments")
                old, fd = fd, -1
                try:
                    fd = _open_or_make(directory, wal_id, segment_size, os.O_RDWR, replace=True)
                    _wake_stranded(old)
                finally:
                    os.close(old)
            return cls(directory, fd, writable=True)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    @classmethod
    def open(cls, directory: str, wal_id: bytes, segment_size: int, *,
             writable: bool = False) -> FollowFile | None:
        """A reader's: None when there is none (a WAL no writer of this version opened);
        FormatError when it is another WAL's or damaged."""
        path = os.path.join(directory, FOLLOW_NAME)
        try:
            with storage_errors(f"opening {path}"):
                fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except StorageError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return cls._checked(directory, fd, wal_id, segment_size, writable)

    @classmethod
    def for_follower(cls, directory: str, wal_id: bytes, segment_size: int) -> FollowFile:
        """A follower's: it waits on the futex and may keep a position here, so it makes the
        file when no writer of this version has yet."""
        fd = _open_or_make(directory, wal_id, segment_size, os.O_RDWR)
        return cls._checked(directory, fd, wal_id, segment_size, True)

    @classmethod
    def _checked(cls, directory: str, fd: int, wal_id: bytes, segment_size: int,
                 writable: bool) -> FollowFile:
        why = _check(fd, wal_id, segment_size)
        if why is not None:
            os.close(fd)
            raise FormatError(f"{os.path.join(directory, FOLLOW_NAME)}: {why}")
        return cls(directory, fd, writable=writable)

    # -- the progress lines --

    @property
    def durable_lsn(self) -> int:
        return _core.atomic_u64(self.map, DURABLE)

    @property
    def oldest_segno(self) -> int:
        return _core.atomic_u64(self.map, OLDEST)

    @property
    def generation(self) -> int:
        return _core.atomic_u64(self.map, GENERATION)

    @property
    def this_boot(self) -> bool:
        """Whether the last writer opened the WAL in this boot of the machine: the durable
        LSN it left is then exact (after a reboot, the file may hold an older value)."""
        return bytes(self.map[BOOT_ID:BOOT_ID + 16]) == boot_id()

    def opened_alone(self, durable_lsn: int, oldest_segno: int) -> None:
        """A writer that recovered the WAL alone: the progress it starts from, which may lie
        below what an earlier writer left (a recovery that cut records)."""
        self.map[BOOT_ID:BOOT_ID + 16] = boot_id()
        _core.atomic_u64(self.map, OLDEST, oldest_segno)
        _core.atomic_u64(self.map, GENERATION, self.generation + 1)
        _core.progress_publish(self.map, durable_lsn, True)
        self.clear_dead_sleepers()

    def raise_oldest(self, segno: int) -> None:
        """Before a truncation touches a file: segments below ``segno`` are gone."""
        _core.atomic_u64(self.map, OLDEST, segno, RAISE)
        _core.progress_wake(self.map)  # (a sleeping follower may be the one it leaves behind)

    # -- sleeper slots --

    def claim_sleeper(self) -> int:
        """A sleeper slot for this follower (its bit in ``sleepers``), its lock taken and a
        dead owner's bit cleared; LockedError when 64 live followers hold them all."""
        for i in range(SLEEPER_SLOTS):
            if ofd_lock(self.fd, _LOCKS + 1 + SLOTS + i, fcntl.F_WRLCK):
                _core.atomic_u64(self.map, SLEEPERS, ~(1 << i) & (2**64 - 1), AND)
                return i
        raise LockedError(f"{self.path}: {SLEEPER_SLOTS} followers wait on this WAL already")

    def release_sleeper(self, i: int) -> None:
        ofd_lock(self.fd, _LOCKS + 1 + SLOTS + i, fcntl.F_UNLCK)

    def clear_dead_sleepers(self) -> None:
        """Clear the bits of sleepers that died asleep (their slot's lock is free): a set bit
        makes every flush pay a wake-up.  One load when none is set."""
        bits = _core.atomic_u64(self.map, SLEEPERS)
        for i in range(SLEEPER_SLOTS) if bits else ():
            if bits >> i & 1 and not ofd_held(self.fd, _LOCKS + 1 + SLOTS + i):
                if ofd_lock(self.fd, _LOCKS + 1 + SLOTS + i, fcntl.F_WRLCK):  # (none took it)
                    _core.atomic_u64(self.map, SLEEPERS, ~(1 << i) & (2**64 - 1), AND)
                    ofd_lock(self.fd, _LOCKS + 1 + SLOTS + i, fcntl.F_UNLCK)

    # -- follower slots --

    def slots(self) -> Iterator[FollowerSlot]:
        """The slots in use."""
        for i in self._used_slots():
            slot = self._slot(i)
            if slot is not None:
                yield slot

    def _used_slots(self) -> list[int]:
        """The indexes of the slots whose state is not FREE, from one look at all the state
        words (every truncation asks, and most WALs have no named follower)."""
        states = _SLOT_STATES.unpack_from(self.map, _SLOT_BASE)
        return [i for i in range(SLOTS) if states[i] != FREE] if any(states) else []  # (FREE: 0)

    def _slot(self, i: int) -> FollowerSlot | None:
        base = _SLOT_BASE + i * _SLOT_SIZE
        state, name_len, position, last, when, lost_at = _SLOT.unpack_from(self.map, base)
        if state == FREE or name_len > NAME_MAX:
            return None
        name = bytes(self.map[base + _NAME_OFFSET:base + _NAME_OFFSET + name_len])
        return FollowerSlot(i, name.decode("utf-8", "replace"), state, position, last, when,
                            lost_at)

    def find(self, name: str) -> FollowerSlot | None:
        return next((s for s in self.slots() if s.name == name), None)

    def claim(self, name: str, position: int, last_lsn: int) -> FollowerSlot:
        """The slot of follower ``name``, made at ``position`` if it has none, its liveness
        lock taken: LockedError while another live follower has it."""
        raw = _name_bytes(name)
        with self._files_lock():
            slot = self.find(name)
            if slot is None:
                free = next((i for i in range(SLOTS) if self._slot(i) is None), None)
                if free is None:
                    raise LockedError(f"{self.path}: every one of the {SLOTS} follower slots is "
                                      "taken (drop_follower frees one)")
                self._write_slot(free, ACTIVE, position, last_lsn, raw)
                slot = self._slot(free)
                assert slot is not None
            if not ofd_lock(self.fd, _LOCKS + 1 + slot.index, fcntl.F_WRLCK):
                raise LockedError(f"follower {name!r} is in use by another live process")
            return slot

    def release(self, slot: FollowerSlot) -> None:
        ofd_lock(self.fd, _LOCKS + 1 + slot.index, fcntl.F_UNLCK)

    def confirm(self, slot: FollowerSlot, position: int, last_lsn: int) -> int:
        """Store the slot's position durably; returns its state (LOST: it was marked lost
        meanwhile, and stays so)."""
        base = _SLOT_BASE + slot.index * _SLOT_SIZE
        # the position in one 8-byte store, as the writer's truncation reads it without a
        # lock; the last LSN beside it is for people (a kill between the two stores may pair
        # them wrongly, so a resumed read checks no prev-link)
        struct.pack_into("<QQ", self.map, base + 16, last_lsn, time.time_ns())
        _core.atomic_u64(self.map, base + 8, position, STORE)
        self._sync_slot(slot.index)
        return struct.unpack_from("<I", self.map, base)[0]

    def drop(self, name: str) -> bool:
        """Free follower ``name``'s slot: False when there is none; LockedError while a live
        follower uses it."""
        with self._files_lock():
            slot = self.find(name)
            if slot is None:
                return False
            if not ofd_lock(self.fd, _LOCKS + 1 + slot.index, fcntl.F_WRLCK):
                raise LockedError(f"follower {name!r} is in use by a live process")
            try:
                self._write_slot(slot.index, FREE, 0, 0, b"")
            finally:
                ofd_lock(self.fd, _LOCKS + 1 + slot.index, fcntl.F_UNLCK)
            return True

    def hold_back(self, cut_segno: int, flushed_lsn: int, max_lag: int) -> int:
        """A truncation's cut, lowered to keep what every active follower has not confirmed;
        a follower whose records the cut would take and that is further than ``max_lag``
        bytes behind ``flushed_lsn`` is marked lost instead (and told so at its next read or
        confirm), as PostgreSQL invalidates a slot when the WAL it needs goes."""
        segment_size = _HEADER.unpack_from(self.map)[4]
        kept = cut_segno
        for slot in self.slots():
            if slot.state != ACTIVE or slot.position // segment_size >= cut_segno:
                continue  # (the cut leaves its records: nothing to hold back, nothing lost)
            if flushed_lsn - slot.position > max_lag:
                self._mark_lost(slot, flushed_lsn)
            else:
                kept = min(kept, slot.position // segment_size)
        return kept

    def _mark_lost(self, slot: FollowerSlot, flushed_lsn: int) -> None:
        base = _SLOT_BASE + slot.index * _SLOT_SIZE
        struct.pack_into("<Q", self.map, base + 32, flushed_lsn)
        struct.pack_into("<I", self.map, base, LOST)
        self._sync_slot(slot.index)

    def _write_slot(self, i: int, state: int, position: int, last_lsn: int, name: bytes) -> None:
        base = _SLOT_BASE + i * _SLOT_SIZE
        self.map[base:base + _SLOT_SIZE] = bytes(_SLOT_SIZE)
        self.map[base + _NAME_OFFSET:base + _NAME_OFFSET + len(name)] = name
        _SLOT.pack_into(self.map, base, FREE, len(name), position, last_lsn, time.time_ns(), 0)
        struct.pack_into("<I", self.map, base, state)  # (last: a writer reads it unlocked)
        self._sync_slot(i)

    def _sync_slot(self, i: int) -> None:
        """msync of the page that holds slot ``i``: its position survives a power loss."""
        page = (_SLOT_BASE + i * _SLOT_SIZE) // mmap.PAGESIZE * mmap.PAGESIZE
        with storage_errors(f"syncing {self.path}"):
            self.map.flush(page, mmap.PAGESIZE)

    @contextmanager
    def _files_lock(self) -> Iterator[None]:
        """The whole file's flock: one process claims or drops a slot at a time."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def replaced(self) -> bool:
        """Whether FOLLOW at the path is no longer this file: a writer of another WAL made
        there replaced it (for_writer), or it is gone."""
        try:
            return os.stat(self.path).st_ino != os.fstat(self.fd).st_ino
        except FileNotFoundError:
            return True

    def close(self) -> None:
        """Unmap (a mapping a call in another thread holds goes when it lets go) and
        close."""
        if self.fd >= 0:
            close_mapped(self.map, self.fd)
            self.fd = -1


def _name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8") if isinstance(name, str) else b""
    if not raw or len(raw) > NAME_MAX or "\0" in name:
        raise ConfigError(f"a follower's name is 1 to {NAME_MAX} bytes of UTF-8 without NUL, "
                          f"not {name!r}")
    return raw


def _wake_stranded(fd: int) -> None:
    """Wake the followers asleep on a FOLLOW file just replaced (another WAL's, by a writer
    of a WAL made there since): no writer publishes to it again, and each, woken with
    nothing new, finds it replaced (pmemwal/follow.py) instead of waiting for ever."""
    try:
        with mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as old:
            _core.progress_wake(old)
    except (OSError, ValueError):
        pass    # (too short to be one a follower maps: none asleep on it)


def _check(fd: int, wal_id: bytes, segment_size: int) -> str | None:
    """Why the open file is not this WAL's FOLLOW file (None: it is)."""
    data = os.pread(fd, _HEADER.size + 4, 0)
    if len(data) < _HEADER.size + 4 or os.fstat(fd).st_size < SIZE:
        return "too short"
    if data != _header(wal_id, segment_size):
        if data[:8] != MAGIC:
            return "not a pmemwal FOLLOW file"
        if struct.unpack_from("<I", data, _HEADER.size)[0] != _core.crc32c(data[:_HEADER.size]):
            return "its header is damaged (CRC mismatch)"
        return "another WAL's, or another version's"
    return None


def _open_or_make(directory: str, wal_id: bytes, segment_size: int, flags: int,
                  replace: bool = False) -> int:
    """The file's descriptor; made first (a temp file linked into place, so that a reader
    never sees it half made) when it is missing, or ``replace``d (renamed over it)."""
    path = os.path.join(directory, FOLLOW_NAME)
    with storage_errors(f"opening {path}"):
        if not replace:
            try:
                return os.open(path, flags | os.O_CLOEXEC)
            except FileNotFoundError:
                pass
        temp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}.{threading.get_ident()}")
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            os.pwrite(fd, _header(wal_id, segment_size), 0)
            os.fsync(fd)
            if replace:
                os.rename(temp, path)
            else:
                try:
                    os.link(temp, path)
                except FileExistsError:  # another process made it first: use theirs
                    os.close(fd)
                    fd = -1
                    fd = os.open(path, flags | os.O_CLOEXEC)
                finally:
                    os.unlink(temp)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        return fd


def boot_id() -> bytes:
    """This boot of the machine: 16 bytes (zeros where the kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return bytes.fromhex(f.read().decode().strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)
