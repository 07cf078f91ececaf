"""What a power cut would keep of a live WAL: the durable shadow, for the page cache and for pmem.

The power-loss simulator (pmemwal.tools.powerloss) takes its crash images from here:

- **Durable shadow** (``DurableShadow``).  Per segment, the bytes known to survive.  A
  segment's shadow starts as its file when the WAL opens, creates or recycles it (those
  steps sync the file and the directory themselves).

- **The WAL's other files** (``CHECKPOINT``, a Log's ``index/``, ``lost+found/``
  entries), while ``follow_files`` holds: each ``os.pwrite``/``os.write``, ``fsync``/
  ``fdatasync``, rename and unlink of one is followed.  Its durable content is what its
  last sync made durable; the versions it held since are kept, and an image takes each
  unit of it from any of them (a slot torn or stale, a chunk page never written back, a
  file renamed into place before its sync empty or partial).  A crash point falls in
  each such sync.  In the page-cache modes, an image of a step a crash is due in takes
  the files as the step began (the crash came before the step's flush landed, so before
  what the files name).  Their metadata (creates, renames, unlinks) counts as durable at
  once: that is pmemwal.tools.fs_model's.

- **Buffered mode and direct mode with msync.**  On the regular core, what a flush has
  returned for is durable (``settle``); in between, the page cache can have written
  back any part of the rest.  On the traced core, only what the WAL's own syncs covered
  is durable (an fdatasync its file, an msync its range), and a crash point falls
  inside each sync.

- **Direct mode, pmem persist** (``PmemTracer``).  A tracer takes libpmem's place: the
  core's ``pmem_flush(addr, len)`` and ``pmem_drain()`` calls land here (ctypes
  callbacks).  A flush snapshots the cache lines it covers; a fence makes that thread's
  snapshots durable, in write-back order.  ``pmem_drain`` is modelled as libpmem
  implements it for its flush instruction: an sfence with CLWB or CLFLUSHOPT; empty
  with CLFLUSH, whose flushes are durable as they return.  On the regular core
  non-temporal stores are turned off, so that every store passes through a flush.  On
  the traced core (pmemwal.tools.traced) records stream as on real pmem, and each run
  of streaming stores is pending until its thread's next sfence, the core's own or one
  ``pmem_drain`` stands for.  Crash points fall inside those calls, i.e. in the middle
  of insertions, not only between them.

A crash image (``Image``) is the shadow with each unit of not-yet-durable change (an
8-byte word, as pmreorder does for pmem; 8 B, 512 B or 4 KiB at random for the
page-cache modes) taken old or new at random; in the page-cache modes also as one of
the versions the segment held since its sync (``remember``), which the kernel may have
written back before the WAL overwrote it.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import stat
import threading
import traceback
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import pmemwal
from pmemwal import _core
from pmemwal.format import parse_segment_name
from pmemwal.segments import CONTROL_NAME, FOLLOW_NAME, LOCK_NAME

CACHE_LINE = 64
PMEM_GRAIN = 8                         # bytes a power cut leaves whole on pmem (8-byte atomicity)
PAGE_CACHE_GRAINS = (8, 512, 4096)     # torn word, torn sector, whole page written back or not
WRITTEN_BACK_VERSIONS = 3              # page cache: the versions of a segment since its sync kept
FLUSH_INSTRUCTIONS = ("clwb", "clflushopt", "clflush")
BACKGROUND_CRASH_BOOST = 4             # a background writer's crash point: this much likelier

_FLUSH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t)
_DRAIN_FN = ctypes.CFUNCTYPE(None)
# the traced core's hooks (native/trace.h): a run of streaming stores, a fence, a sync
_STREAM_FN = ctypes.CFUNCTYPE(None, ctypes.c_size_t, ctypes.c_size_t)
_FENCE_FN = ctypes.CFUNCTYPE(None)
_SYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t)
_SYNC_FILE, _SYNC_RANGE, _SYNC_WRITE = 0, 1, 2  # trace.h's trace_sync_kind


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def libpmem_flush_instruction() -> str:
    """The flush instruction libpmem takes here: the best the CPU has, less what its own
    switches (``PMEM_NO_CLWB=1``, ``PMEM_NO_CLFLUSHOPT=1``) turn off; the tracer models it."""
    flags = cpu_flags()
    if "clwb" in flags and os.environ.get("PMEM_NO_CLWB") != "1":
        return "clwb"
    if "clflushopt" in flags and os.environ.get("PMEM_NO_CLFLUSHOPT") != "1":
        return "clflushopt"
    return "clflush"


def _on_background_writer() -> bool:
    """Whether this thread is a WAL's background writer (pmemwal.background)."""
    return threading.current_thread().name.startswith("pmemwal-writer")


def _address(callback) -> int:
    return ctypes.cast(callback, ctypes.c_void_p).value or 0


FILE_UNIT = 4096                       # the WAL's other files: versions compared in pages
FILE_SYNC_CRASH_RATE = 0.1             # chance of a crash in each sync of one (the first always)


@dataclass(frozen=True)
class FileVersion:
    """One version of a small file: its bytes up to its last data (the rest reads as
    zeros: chunk files are sparse), and its size."""

    data: bytes
    size: int


@dataclass
class FileHistory:
    """A followed file: what its last sync made durable, and the versions since (any of
    which the kernel may have written back, in part, before a later one replaced it)."""

    durable: FileVersion
    since: list[FileVersion] = field(default_factory=list)

    def written(self, version: FileVersion) -> None:
        if not self.since or self.since[-1] != version:
            self.since.append(version)
            del self.since[:-WRITTEN_BACK_VERSIONS]

    def with_current(self, version: FileVersion) -> FileHistory:
        """A copy whose last version is ``version`` (what the file holds now)."""
        since = [v for v in self.since if v != version] + [version]
        return FileHistory(self.durable, since)

    def versions(self) -> list[FileVersion]:
        """Durable first, current last."""
        return [self.durable, *self.since] if self.since else [self.durable, self.durable]


def read_version(path: str) -> FileVersion | None:
    """What the file at ``path`` holds now (None: no such file), read up to the end of its
    last data extent (SEEK_DATA/SEEK_HOLE, where the file system has them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    try:
        size = os.fstat(fd).st_size
        end = 0
        try:
            pos = 0
            while pos < size:
                pos = os.lseek(fd, os.lseek(fd, pos, os.SEEK_DATA), os.SEEK_HOLE)
                end = pos
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # (no data past pos: ENXIO; else not supported)
                end = size
        end = min(end, size)
        chunks, pos = [], 0
        while pos < end:
            chunk = os.pread(fd, end - pos, pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
        return FileVersion(b"".join(chunks), size)
    finally:
        os.close(fd)


# the directory's lock; a shared WAL's control file; the FOLLOW file (written through its
# mapping, and never read by recovery)
_UNFOLLOWED = {LOCK_NAME, CONTROL_NAME, FOLLOW_NAME}


def _not_followed(name: str) -> bool:
    """Segment files (and their ``.tmp`` while made or recycled) are the shadow's own;
    the lock, the control file and FOLLOW are no part of what recovery reads from a crash
    (the follow workload holds images to FOLLOW's published LSN as the writer saw it)."""
    if os.sep in name:
        return False
    base = name[:-4] if name.endswith(".tmp") else name
    return name in _UNFOLLOWED or parse_segment_name(base) is not None


def _other_files(root: str) -> list[str]:
    """The WAL's files in ``root`` other than segments, by path in it."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(directory, name), root)
            if not _not_followed(rel):
                found.append(rel)
    return sorted(found)


# os.* while shadows follow files: each call on a followed file is reported to its shadow
_followers: list[DurableShadow] = []
_real_calls: dict[str, Callable[..., Any]] = {}
_following_lock = threading.Lock()


def _owner_of_fd(fd: int) -> tuple[DurableShadow, str] | None:
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    for shadow in list(_followers):
        name = shadow._name_in(path)
        if name is not None:
            try:
                regular = stat.S_ISREG(os.fstat(fd).st_mode)
            except OSError:
                return None
            return (shadow, name) if regular else None
    return None


def _owner_of_path(path: Any) -> tuple[DurableShadow, str] | None:
    try:
        text = os.path.abspath(os.fsdecode(os.fspath(path)))
    except TypeError:  # a descriptor: not followed
        return None
    real = os.path.join(os.path.realpath(os.path.dirname(text)), os.path.basename(text))
    for shadow in list(_followers):
        name = shadow._name_in(real)
        if name is not None:
            return shadow, name
    return None


def _written_through(real: Callable[..., Any]) -> Callable[..., Any]:
    def call(fd: int, *args: Any) -> Any:
        owner = _owner_of_fd(fd)
        if owner is None:
            return real(fd, *args)
        return owner[0]._file_written(owner[1], lambda: real(fd, *args))
    return call


# per thread, while a segment file operation runs (DurableShadow._follow): the paths of the
# files it synced (a background writer may sync others at the same time)
_syncs_seen = threading.local()


def _sync_seen(fd: int) -> None:
    seen = getattr(_syncs_seen, "paths", None)
    if seen is not None:
        try:
            seen.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass


def _synced_through(real: Callable[..., Any]) -> Callable[..., Any]:
    def call(fd: int) -> Any:
        _sync_seen(fd)
        owner = _owner_of_fd(fd)
        if owner is None:
            return real(fd)
        return owner[0]._file_synced(owner[1], lambda: real(fd))
    return call


def _renamed_through(real: Callable[..., Any]) -> Callable[..., Any]:
    def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # (dir_fd: never the WAL's)
            return real(src, dst, *args, **kwargs)
        source, target = _owner_of_path(src), _owner_of_path(dst)
        shadow = (source or target or (None,))[0]
        if shadow is None or (target is not None and target[0] is not shadow):
            return real(src, dst)
        return shadow._file_renamed(source and source[1], target and target[1],
                                    lambda: real(src, dst))
    return call


def _removed_through(real: Callable[..., Any]) -> Callable[..., Any]:
    def call(path: Any, *args: Any, **kwargs: Any) -> Any:
        owner = None if args or kwargs else _owner_of_path(path)
        if owner is None:
            return real(path, *args, **kwargs)
        return owner[0]._file_removed(owner[1], lambda: real(path))
    return call


_THROUGH = {"pwrite": _written_through, "write": _written_through, "fsync": _synced_through,
            "fdatasync": _synced_through, "rename": _renamed_through,
            "replace": _renamed_through, "unlink": _removed_through, "remove": _removed_through}


def _start_following(shadow: DurableShadow) -> None:
    with _following_lock:
        if not _followers:
            for name, through in _THROUGH.items():
                _real_calls[name] = getattr(os, name)
                setattr(os, name, through(_real_calls[name]))
        if shadow not in _followers:
            _followers.append(shadow)


def _stop_following(shadow: DurableShadow) -> None:
    with _following_lock:
        if shadow in _followers:
            _followers.remove(shadow)
        if not _followers and _real_calls:
            for name, real in _real_calls.items():
                setattr(os, name, real)
            _real_calls.clear()


@dataclass
class Image:
    """One crash outcome: segment contents, and what had been promised when the power went
    (the workload's ``horizon``: an LSN, or a LogModel for the log workload)."""

    segments: dict[int, bytes]
    acked: Any
    grain: int
    where: str
    files: dict[str, bytes] = field(default_factory=dict)  # other files of the WAL, by path in it
    sizes: dict[str, int] = field(default_factory=dict)  # ... where longer than their bytes (sparse)


class DurableShadow:
    """Per segment, the bytes that would survive a power cut now.

    On the traced core (``trace_syncs``), the page-cache model takes a write for durable
    only when the WAL's own sync covered it: an fdatasync of its file, an msync of its
    range, a write to an O_DSYNC file; a crash point falls in each sync, before it.
    Otherwise everything counts as durable once a flush returned (``settle``).
    """

    def __init__(self, wal: pmemwal.WAL, rng: np.random.Generator, grains: tuple[int, ...],
                 crash_rate: float = 0.0, on_crash: Callable[[str], None] | None = None,
                 persist: int | None = None) -> None:
        self.wal = wal
        self.rng = rng
        self.grains = grains
        self.crash_rate = crash_rate
        self.on_crash = on_crash
        self.crashed_at: set[str] = set()  # the kinds of crash point taken so far
        self.persist = persist  # the core's persist method, set on every handle (None: as opened)
        self.handles: list[pmemwal.WAL] = []
        self.syncs_traced = False
        self.segments: dict[int, np.ndarray] = {
            segno: self.current(segno).copy() for segno in wal._segnos}
        # One power cut at a time, and none in the middle of a write-back: the
        # callbacks run in the writers' threads, and reading files yields the GIL.
        self.lock = threading.RLock()
        self.errors: list[str] = []  # what failed in a callback (ctypes can only print it)
        self._armed: Callable[[], Image] | None = None  # a crash due before a segment goes
        self._taken: Image | None = None
        # the WAL's other files (CHECKPOINT, index/...), by path in its directory
        self.files: dict[str, FileHistory] = {}
        self._files_at_arm: dict[str, FileHistory] | None = None  # as a crash due in a step finds them
        self._in_file_sync = False
        # page cache: per segment, versions it held since its last sync (any may have been
        # written back, then overwritten in the cache: an image may hold each unit of any)
        self.versions_since_sync: dict[int, list[np.ndarray]] = {}
        # what the WAL's background writer did under the model: "create", "checkpoint", ...
        self.background_ops: dict[str, int] = {}
        self.attach(wal)

    def attach(self, wal: pmemwal.WAL) -> None:
        """A handle writing the WAL (another of a shared WAL's writers, or the one that
        reopened it): its persists are traced and its file operations followed too."""
        self.handles.append(wal)
        if self.persist is not None:
            self._persist_through(wal, self.persist)
        self._follow(wal._dir)
        self._follow_checkpoints(wal)

    def _persist_through(self, wal: pmemwal.WAL, persist: int) -> None:
        wal._core.set_persist(persist)

    def _follow_checkpoints(self, wal: pmemwal.WAL) -> None:
        """The WAL's other files (``CHECKPOINT``, ``index/``, ...) not followed yet are durable
        as they are (its open synced what it wrote); ``follow_files`` follows their writes."""
        self.root = os.path.realpath(wal._dir.path)
        with self.lock:
            for name in _other_files(self.root):
                if name not in self.files:
                    version = read_version(os.path.join(self.root, name))
                    if version is not None:
                        self.files[name] = FileHistory(version)

    def follow_files(self) -> None:
        """From now on (until ``stop_following``), each write, sync, rename and unlink of the
        WAL's other files is followed: a file's durable content is what its last sync made
        durable, and the versions it held since are kept for the images, as for segments.
        A sync of such a file is a crash point (``"file sync"``), before the sync."""
        _start_following(self)

    def stop_following(self) -> None:
        _stop_following(self)

    def _name_in(self, path: str) -> str | None:
        """``path`` (real) as a followed file's name in the WAL directory, else None."""
        root = getattr(self, "root", None)
        if root is None or not path.startswith(root + os.sep):
            return None
        name = path[len(root) + 1:]
        return None if _not_followed(name) else name

    def _file_written(self, name: str, write: Callable[[], Any]) -> Any:
        """A write (``write()``) to a followed file: the version it leaves is one more the
        kernel may write back before the next sync.  A file first seen now is new or
        untouched since the start: what it holds before the write is durable."""
        if name == "CHECKPOINT":
            self._background_point("checkpoint")  # (the background writer's slot writes only)
        path = os.path.join(self.root, name)
        with self.lock:
            self._left_step()
            history = self.files.get(name)
            if history is None:
                history = self.files[name] = FileHistory(read_version(path) or FileVersion(b"", 0))
            result = write()
            now = read_version(path)
            if now is not None:
                history.written(now)
            return result

    def _file_synced(self, name: str, sync: Callable[[], Any]) -> Any:
        """An fsync or fdatasync of a followed file: a crash point before it, while the
        versions written since the last sync may each have been written back in part;
        then what it holds is durable.  A file first seen here was never synced: its
        durable content is none."""
        path = os.path.join(self.root, name)
        with self.lock:
            self._left_step()
            history = self.files.setdefault(name, FileHistory(FileVersion(b"", 0)))
            now = read_version(path)
            pending = now is not None and (history.since or now != history.durable)
        if pending and self.on_crash is not None and (
                "file sync" not in self.crashed_at or self.rng.random() < FILE_SYNC_CRASH_RATE):
            with self.lock:
                self.crashed_at.add("file sync")
                self._settle_flushed()
                self._in_file_sync = True
                try:
                    self.on_crash("file sync")
                finally:
                    self._in_file_sync = False
        result = sync()
        with self.lock:
            now = read_version(path)
            if now is not None and name in self.files:
                self.files[name] = FileHistory(now)
        return result

    def _file_renamed(self, source: str | None, target: str | None, rename: Callable[[], Any]) -> Any:
        """A rename: a followed file brings its durable content and the versions since
        along (renamed into place before its sync, it may be empty or partial there); any
        other file renamed into the WAL's files is taken as it is.  The rename itself is
        durable at once (the metadata's crash states are the file-system model's)."""
        with self.lock:
            self._left_step()
            result = rename()
            moved = self.files.pop(source, None) if source is not None else None
            if target is not None:
                if moved is None:
                    moved = FileHistory(read_version(os.path.join(self.root, target))
                                        or FileVersion(b"", 0))
                self.files[target] = moved
            return result

    def _file_removed(self, name: str, unlink: Callable[[], Any]) -> Any:
        with self.lock:
            self._left_step()
            result = unlink()
            self.files.pop(name, None)
            return result

    def _left_step(self) -> None:
        """A file changes outside a step that a crash is due in: images no longer take the
        files as that step began."""
        if self._armed is None:
            self._files_at_arm = None

    def _settle_flushed(self) -> None:
        """Untraced page cache: what the flushes so far returned for is durable (a crash
        point in a file's sync, amid a step that flushed before it, finds it so)."""
        if self.syncs_traced:
            return
        flushed, size = self.wal.flushed_lsn, self.wal.segment_size
        for segno, durable in self.segments.items():
            n = min(size, flushed - segno * size)
            if n > 0:
                now = self.current(segno)
                for version in (durable, *self.versions_since_sync.get(segno, ())):
                    version[:n] = now[:n]  # (no older version of those bytes comes back)

    def _files_now(self) -> dict[str, FileHistory]:
        """Each followed file's history, with what it holds now as its last version; a
        crash due in the step under way finds the files as the step began (the step's
        flush may not have landed, so what the files name may not have: the crash came
        before)."""
        if self._files_at_arm is not None and not self._in_file_sync:
            return self._files_at_arm
        now = {}
        for name, history in self.files.items():
            version = read_version(os.path.join(self.root, name))
            if version is not None:
                now[name] = history.with_current(version)
        return now

    def _follow(self, directory) -> None:
        """Track segment files as the WAL makes, recycles, arms and removes them: a made,
        recycled or armed file is durable as it is, before the core can store into it (it
        attaches it afterwards), where the operation synced it (an fsync or fdatasync of
        it, or of its ``.tmp`` name, seen while ``follow_files`` holds).  Where it did not,
        the file's durable bytes stay as they were (a new file's: zeros), and what it
        holds now is one more version the kernel may have written back.  Each file
        operation and its tracking are one step for the images: a checkpointer thread
        recycles while writers run, and an image must not look for a file renamed under it."""
        create, recycle, remove = directory.create, directory.recycle, directory.remove
        arm = directory.arm

        def created(segno: int, *args, **kwargs) -> None:
            self._background_point("create")
            with self.lock:
                synced = self._watching_syncs(directory, lambda: create(segno, *args, **kwargs))
                self._made(segno, synced(segno), None)

        def recycled(old: int, new: int, *args, **kwargs) -> None:
            self._before_removal()
            self._background_point("recycle")
            with self.lock:
                synced = self._watching_syncs(directory, lambda: recycle(old, new, *args, **kwargs))
                self._made(new, synced(new), old)

        def removed(segno: int) -> None:
            self._before_removal()
            self._background_point("remove")
            with self.lock:
                remove(segno)
                self.forget(segno)

        def armed(segno: int, *args, **kwargs) -> None:  # a spare's header rewritten
            self._background_point("arm")
            with self.lock:
                synced = self._watching_syncs(directory, lambda: arm(segno, *args, **kwargs))
                self._made(segno, synced(segno), segno)

        directory.create, directory.recycle, directory.remove = created, recycled, removed
        directory.arm = armed

    def _watching_syncs(self, directory, operation: Callable[[], Any]) -> Callable[[int], bool]:
        """Runs ``operation``; returns whether it synced segment ``segno``'s file (by its
        name or its ``.tmp`` name).  Only while ``follow_files`` holds are syncs seen:
        otherwise every operation counts as synced, as it should be."""
        if self not in _followers:
            operation()
            return lambda segno: True
        outer = getattr(_syncs_seen, "paths", None)
        seen = _syncs_seen.paths = set()
        try:
            operation()
        finally:
            _syncs_seen.paths = outer
            if outer is not None:
                outer |= seen
        where = os.path.realpath(directory.path)

        def synced(segno: int) -> bool:
            path = os.path.join(where, os.path.basename(directory.file(segno)))
            return path in seen or path + ".tmp" in seen
        return synced

    def _made(self, segno: int, synced: bool, was: int | None) -> None:
        """Segment ``segno`` made, recycled from ``was`` or armed (``was`` itself): durable
        as it is if ``synced``; else its durable bytes are the file's before (``was``'s;
        a new file's, zeros) and what it holds now may have been written back."""
        if synced:
            self.track(segno)
            if was is not None and was != segno:
                self.forget(was)
            return
        with self.lock:
            if was is None or was not in self.segments:
                durable, kept = np.zeros(self.wal.segment_size, np.uint8), []
            else:
                durable, kept = self.segments[was], self.versions_since_sync.get(was, [])
            if was != segno:
                self.forget(segno)
                if was is not None:
                    self.forget(was)
            self.segments[segno] = durable
            self.versions_since_sync[segno] = kept
            self.remember([segno])

    def _background_point(self, what: str) -> None:
        """The background writer is about to do ``what`` (a file operation, a CHECKPOINT
        slot write): counted, and a crash point just before it, while the writers may be
        mid-insertion (its flushes make few: in pmem mode each insertion persists itself)."""
        if _on_background_writer():
            with self.lock:
                self.background_ops[what] = self.background_ops.get(what, 0) + 1
            self._maybe_crash(what)

    def _guarded(self, callback: Callable) -> Callable:
        def call(*args) -> None:
            try:
                callback(*args)
            except BaseException:
                self.errors.append(traceback.format_exc())
        return call

    def _maybe_crash(self, where: str) -> None:
        """A crash here at ``crash_rate``, and at the first point of each kind: a kind the
        workload reaches seldom (a fence after streaming stores, among many flushes) is then
        taken in every run, not in most."""
        if self.on_crash is None:
            return
        rate = self.crash_rate
        if _on_background_writer():  # a kind of its own (its first point is always taken),
            where += " (background)"  # and taken more often: its rounds are few
            rate = min(1.0, BACKGROUND_CRASH_BOOST * rate)
        if where not in self.crashed_at or self.rng.random() < rate:
            self.crashed_at.add(where)
            self.on_crash(where)

    def _locate(self, addr: int) -> tuple[int, int]:
        """(segno, offset) of a mapped address, in any handle's mappings."""
        segments = [item for wal in list(self.handles) if not wal.closed
                    for item in list(wal._segments.items())]  # one step: writers may add one
        bases = sorted((pmemwal.libpmem.buffer_address(seg.map), segno)
                       for segno, seg in segments if seg.map is not None)
        i = bisect_right(bases, (addr, float("inf"))) - 1
        base, segno = bases[i]
        if not 0 <= addr - base < self.wal.segment_size:
            raise AssertionError(f"an address {addr:#x} outside every segment")
        return segno, addr - base

    def trace_syncs(self, mutations: int = 0) -> None:
        """Durable only what the WAL's syncs cover (the traced core reports each one; every
        run sets the hooks, so none of an earlier run's stays)."""
        self.syncs_traced = True
        self._sync = _SYNC_FN(self._guarded(self._on_sync))  # alive as long as the core uses it
        _core._trace(0, 0, _address(self._sync), mutations)

    def _on_sync(self, kind: int, fd: int, where: int, length: int) -> None:
        self._maybe_crash("in sync")  # before it: none, some or all of its pages are written
        with self.lock:
            if kind == _SYNC_RANGE:
                segno, off = self._locate(where)
            else:
                named = parse_segment_name(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
                assert named is not None, "the core reports the syncs of its segment files"
                segno = named
                off, length = (0, self.wal.segment_size) if kind == _SYNC_FILE else (where, length)
            self.segments[segno][off:off + length] = self.current(segno)[off:off + length]
            self.versions_since_sync.pop(segno, None)  # (older versions: none may come back)

    def remember(self, segnos) -> None:
        """Page cache, between operations: each of ``segnos`` as it is now is one more
        version the kernel may have written back before the next sync."""
        with self.lock:
            for segno in segnos:
                if segno not in self.segments:
                    continue
                now, kept = self.current(segno), self.versions_since_sync.setdefault(segno, [])
                if not kept or not np.array_equal(kept[-1], now):
                    kept.append(now.copy())
                    del kept[:-WRITTEN_BACK_VERSIONS]

    def arm(self, take: Callable[[], Image]) -> None:
        """A crash is due in the operation about to run: should a segment go in it, the
        image is taken (``take()``) just before.  Segments go after a flush has returned
        (a Log's compaction and reset), and a crash in that flush still finds them."""
        self._armed, self._taken = take, None
        with self.lock:
            self._files_at_arm = self._files_now()

    def disarm(self) -> Image | None:
        """The image taken before a segment went in the operation, if one went."""
        taken, self._armed, self._taken = self._taken, None, None
        return taken

    def _before_removal(self) -> None:
        if self._armed is not None:
            self._taken, self._armed = self._armed(), None

    def track(self, segno: int) -> None:
        with self.lock:
            self.segments[segno] = self.current(segno).copy()
            self.versions_since_sync.pop(segno, None)

    def forget(self, segno: int) -> None:
        with self.lock:
            self.segments.pop(segno, None)
            self.versions_since_sync.pop(segno, None)

    def current(self, segno: int) -> np.ndarray:
        """What the segment holds now (page cache or mapping: the same shared pages)."""
        data = Path(self.wal._dir.file(segno)).read_bytes()
        return np.frombuffer(data, dtype=np.uint8)

    def settle(self) -> None:
        """Everything written so far is durable (a flush returned); with traced syncs,
        nothing (the syncs made it durable).  Images take the files as they are again."""
        for segno in self.segments if not self.syncs_traced else ():
            self.segments[segno] = self.current(segno).copy()
            self.versions_since_sync.pop(segno, None)
        self._files_at_arm = None

    def image(self, acked: Any, where: str) -> Image:
        """A crash now, held to ``acked`` (the workload's horizon): each changed unit of each
        segment old, new, or (page cache) as one of the versions written since its sync held
        it, at random."""
        with self.lock:
            grain = int(self.rng.choice(self.grains))
            image = Image({segno: self._mix(old, self.current(segno), grain,
                                            self.versions_since_sync.get(segno, []))
                           for segno, old in self.segments.items()}, acked, grain, where)
            for name, history in self._files_now().items():
                data, size = self._mix_file(history.versions(), grain)
                image.files[name] = data
                if size > len(data):
                    image.sizes[name] = size
            return image

    def _mix_file(self, versions: list[FileVersion], grain: int) -> tuple[bytes, int]:
        """A file as a power cut may leave it: its size one of the versions' (the first its
        durable one), each unit of its bytes from any version as ``_mix`` takes them."""
        size = versions[int(self.rng.integers(len(versions)))].size
        length = -(-max(len(v.data) for v in versions) // FILE_UNIT) * FILE_UNIT
        if length == 0:
            return b"", size
        arrays = [np.frombuffer(v.data.ljust(length, b"\0"), np.uint8) for v in versions]
        data = self._mix(arrays[0], arrays[-1], grain, arrays[1:-1])
        return data[:size], size

    def _mix(self, old: np.ndarray, new: np.ndarray, grain: int,
             between: Sequence[np.ndarray] = ()) -> bytes:
        candidates = [old.reshape(-1, grain), *(v.reshape(-1, grain) for v in between),
                      new.reshape(-1, grain)]
        changed = (candidates[0] != candidates[-1]).any(axis=1)
        for v in candidates[1:-1]:
            changed |= (candidates[0] != v).any(axis=1)
        pick = self.rng.integers(0, len(candidates), len(changed))
        mixed = candidates[0].copy()
        for k, version in enumerate(candidates[1:], start=1):
            take = changed & (pick == k)
            mixed[take] = version[take]
        return mixed.tobytes()


class PmemTracer(DurableShadow):
    """Stands in for libpmem: records each thread's flushes, makes them durable at its drain.

    ``flush_instruction`` is the one libpmem would use (``libpmem_flush_instruction``):
    with CLWB or CLFLUSHOPT a flush is pending until a fence, and ``pmem_drain`` is that
    fence (an sfence); with CLFLUSH, which orders itself, a flush is durable as it returns
    and libpmem's ``pmem_drain`` is empty.  ``streaming`` (the traced core only) lets the
    core stream records from ``_core.STREAM_MIN`` bytes on: each run of streaming stores is
    pending until that thread's next sfence, the core's own (``fence``) or an sfence
    ``pmem_drain`` stands for, as pmemcheck holds them.  ``mutations`` (trace.h's
    ``TRACE_*`` bits) put persistence bugs back into the traced core.
    """

    def __init__(self, wal: pmemwal.WAL, rng: np.random.Generator, crash_rate: float,
                 on_crash: Callable[[str], None], *, flush_instruction: str | None = None,
                 streaming: bool = False, mutations: int = 0) -> None:
        self.stream_min = _core.STREAM_MIN if streaming else _core.STREAM_NEVER
        self._flush = _FLUSH_FN(self._guarded(self._on_flush))  # alive as long as the core uses them
        self._drain = _DRAIN_FN(self._guarded(self._on_drain))
        super().__init__(wal, rng, (PMEM_GRAIN,), crash_rate, on_crash, _core.PERSIST_PMEM)
        instruction = flush_instruction or libpmem_flush_instruction()
        if instruction not in FLUSH_INSTRUCTIONS:
            raise ValueError(f"flush_instruction={instruction!r}: one of {FLUSH_INSTRUCTIONS}")
        self.ordered_flush = instruction == "clflush"
        self.pending: dict[int, list[tuple[int, int, bytes, int]]] = {}  # per thread: a fence is per CPU
        self.versions: dict[int, np.ndarray] = {}  # per segment and word: the write-back it holds
        self._order = itertools.count(1)
        if (streaming or mutations) and not _core.TRACED:
            raise ValueError("streaming stores and mutations are traced by the traced core "
                             "only: run with PMEMWAL_TRACED_CORE=1")
        if _core.TRACED:  # (every run sets the hooks: none of an earlier run's stays)
            self._stream = _STREAM_FN(self._guarded(self._on_stream))
            self._fence = _FENCE_FN(self._guarded(self._on_fence))
            _core._trace(_address(self._stream), _address(self._fence), 0, mutations)

    def _persist_through(self, wal: pmemwal.WAL, persist: int) -> None:
        wal._core.set_persist(_core.PERSIST_PMEM, _address(self._flush), _address(self._drain),
                              self.stream_min)

    def forget_thread(self) -> None:
        """This thread's process died: its unfenced flushes and stores stay unfenced (a
        later fence by the thread, long after, must not apply them)."""
        with self.lock:
            self.pending.pop(threading.get_ident(), None)
        if _core.TRACED:
            _core._trace_forget()

    def _on_flush(self, addr: int, length: int) -> None:
        lo = addr - addr % CACHE_LINE
        hi = -(-(addr + length) // CACHE_LINE) * CACHE_LINE
        segno, off = self._locate(lo)
        if segno not in self.segments:  # made by another handle as it opened: a fresh file
            self.track(segno)
        # What write-back takes (whole lines, as they are now) and its place in the write-back
        # order, in one step: a thread descheduled between the two would give an older
        # snapshot a later order, and its drain would overwrite newer durable bytes with it.
        with self.lock:
            lines = self._read(lo, hi - lo)
            order = next(self._order)
            if self.ordered_flush:  # CLFLUSH: written back as it returns
                self._write_back_cached(segno, off, lines, order)
        if not self.ordered_flush:
            self.pending.setdefault(threading.get_ident(), []).append((segno, off, lines, order))
        self._maybe_crash("flush")

    _read = staticmethod(ctypes.string_at)  # a test slows it down to widen the window above

    def _on_drain(self) -> None:
        self._maybe_crash("before drain")
        if not self.ordered_flush:  # an sfence; with CLFLUSH libpmem's drain is empty
            self._fenced()

    def _on_stream(self, addr: int, length: int) -> None:
        """A run of streaming stores (the traced core): pending until this thread's fence."""
        segno, off = self._locate(addr)
        with self.lock:
            data = self._read(addr, length)
            order = next(self._order)
        self.pending.setdefault(threading.get_ident(), []).append((segno, off, data, order))
        self._maybe_crash("streamed")

    def _on_fence(self) -> None:
        """The core's own sfence after streaming stores (the traced core)."""
        self._maybe_crash("before fence")
        self._fenced()

    def _fenced(self) -> None:
        with self.lock:
            for segno, off, data, order in self.pending.pop(threading.get_ident(), []):
                self._write_back(segno, off, data, order)

    def _write_back_cached(self, segno: int, off: int, data: bytes, order: int) -> None:
        """A flush's write-back, less the words this thread streamed and has not fenced:
        streaming stores bypass the cache, so a flush of their line does not carry them."""
        end = off + len(data)
        durable, versions = self.segments[segno], self.versions.get(segno)
        held = [(max(o, off), min(o + len(d), end))
                for s, o, d, _ in self.pending.get(threading.get_ident(), [])
                if s == segno and o < end and off < o + len(d)]
        saved = [(a, b, durable[a:b].copy(),
                  None if versions is None else versions[a // PMEM_GRAIN:b // PMEM_GRAIN].copy())
                 for a, b in held]
        self._write_back(segno, off, data, order)
        versions = self.versions[segno]
        for a, b, bytes_, words in saved:
            durable[a:b] = bytes_
            versions[a // PMEM_GRAIN:b // PMEM_GRAIN] = 0 if words is None else words

    def _write_back(self, segno: int, off: int, data: bytes, order: int) -> None:
        """Words reach the media in the order they were written back (or streamed): a
        word that another thread wrote back later, with newer bytes, and fenced first
        keeps them.  By 8-byte word, the unit a power cut leaves whole: flushes take
        whole lines, and a run of streaming stores may start or end inside one."""
        if off % PMEM_GRAIN or len(data) % PMEM_GRAIN:
            raise AssertionError(f"a write-back of {len(data)} bytes at {off:#x}: not in words")
        first, count = off // PMEM_GRAIN, len(data) // PMEM_GRAIN
        versions = self.versions.setdefault(
            segno, np.zeros(self.wal.segment_size // PMEM_GRAIN, dtype=np.int64))[first:first + count]
        newer = versions < order
        durable = self.segments[segno].view(np.uint64)[first:first + count]
        durable[newer] = np.frombuffer(data, dtype=np.uint64)[newer]
        versions[newer] = order

    def forget(self, segno: int) -> None:
        with self.lock:
            super().forget(segno)
            self.versions.pop(segno, None)

    def track(self, segno: int) -> None:
        with self.lock:
            super().track(segno)
            self.versions.pop(segno, None)

    def settle(self) -> None:
        """Nothing to do: durability is exactly what the drains made durable."""

    def _settle_flushed(self) -> None:
        """Nothing to do: durability is exactly what the drains made durable."""
