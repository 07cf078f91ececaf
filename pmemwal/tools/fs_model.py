"""The file-system metadata model of the crash states (pmemwal.tools.fs_crash), and its recorder.

Concern: what a power cut may leave of a program's creates, renames, unlinks, size
changes and syncs, after ALICE's abstract persistence model (Pillai et al., "All File
Systems Are Not Created Equal: On the Complexity of Crafting Crash-Consistent
Applications", OSDI 2014) and CrashMonkey's (Mohan et al., "Finding Crash-Consistency
Bugs with Bounded Black-Box Crash Testing", OSDI 2018); docs/RELIABILITY.md, "File-system
metadata crash states", states the rules.

- **Recording.**  While a workload runs, ``Recorder`` wraps ``os.open`` (O_CREAT,
  O_TRUNC), ``os.rename``, ``os.replace``, ``os.unlink``/``remove``, ``os.mkdir``,
  ``os.rmdir``, ``os.posix_fallocate``, ``os.ftruncate``, ``os.pwrite``/``write``,
  ``os.sendfile``, ``os.fsync``, ``os.fdatasync`` and ``builtins.open`` (archive status
  files, fsspec's copies) for paths under one root.  Files are tracked by inode.  A
  size change made where no wrapper sees it (a file object's write) is noticed at the
  file's next sync, rename or unlink, and recorded there.
- **Metadata model** (``MetadataModel``; docs/RELIABILITY.md, "File-system metadata
  crash states").  Creates, mkdirs, renames, unlinks and size changes are *pending*
  until a sync commits them; a rename is one step.  Both file systems journal metadata
  in program order, so a crash keeps a *prefix* of the pending operations.  A commit
  (an fsync of any file, an fdatasync of a file with a pending create or size change,
  an fsync of a directory) makes every earlier operation durable, as ext4's journal
  commit and xfs's log force do.  ``ext4`` (data=ordered): a size change persists with
  the data written below it.  ``xfs``: a size increase may persist without that data:
  the appended range then reads as zeros.
- **Several file systems.**  Directories given as mount roots (``Recorder(mounts=...)``)
  are file systems of their own: each has its own journal, a sync commits only its own
  file system's pending operations, a crash keeps a prefix of each independently, and a
  rename across them fails with EXDEV.
- **Per-file data outcomes** (``MetadataModel.states``'s ``mixed``).  Files other than
  segments also come out one by one: each takes its durable data, its current data, a
  version written since its last sync (the recorder keeps each write it sees: pwrite,
  write, ftruncate, and a file object's writes at the next sync, rename or unlink), or a
  mix of those per 4 KiB page or 512-byte sector, as a kernel that wrote some pages back on
  its own leaves them; cut or zero-extended to the size the metadata prefix gives.  A
  seeded sample of such states is drawn at each crash point where some file has writes
  since its last sync (``CONTROL``, which the first opener rebuilds, keeps to the
  whole-state outcomes).
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import itertools
import os
import random
import stat
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import FrameType, SimpleNamespace
from typing import Any, Callable, Iterator, TypeGuard

import numpy as np

from pmemwal.format import parse_segment_name
from pmemwal.segments import CHECKPOINT_NAME, CONTROL_NAME

FS_MODELS = ("ext4", "xfs")
MAX_WRITES = 32         # writes kept per file since its last sync (older ones fold into its base)
LARGE = 1 << 20         # files read once until a wrapper sees them written (the index's chunks)
MIXED_VERSIONS = 2      # versions written since the last sync that one per-file state draws from

_real = SimpleNamespace(**{name: getattr(os, name) for name in (
    "open", "rename", "replace", "unlink", "remove", "mkdir", "rmdir", "posix_fallocate",
    "ftruncate", "pwrite", "write", "sendfile", "fsync", "fdatasync")}, builtin_open=builtins.open)


# ---- the model ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MetaOp:
    """One metadata operation: ``create`` (``path`` names new inode ``ino``), ``mkdir``,
    ``rmdir``, ``rename`` (``path`` to ``dst``, one step), ``unlink``, or ``size`` (inode
    ``ino`` becomes ``size`` bytes; ``data``: its bytes then, what ext4 writes first)."""

    kind: str
    path: str = ""
    dst: str = ""
    ino: int = 0
    size: int = 0
    data: bytes = b""
    where: str = ""
    written: bool = False  # a size change by writing past the end (delayed allocation's kind)
    mount: int = 0         # the file system it is on (MetadataModel.mounts; 0: the root's)


@dataclass
class FsImage:
    """What a disk holds: names (relative paths) to inodes, directories, and each inode's
    bytes (their length is its size)."""

    names: dict[str, int] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    data: dict[int, bytes] = field(default_factory=dict)

    def copy(self) -> FsImage:
        return FsImage(dict(self.names), set(self.dirs), dict(self.data))

    def apply(self, op: MetaOp, ordered: bool, unsized: frozenset[int] = frozenset()) -> None:
        """Apply one operation; ``ordered``: a size increase brings the data written below
        it (ext4 data=ordered), else zeros (xfs); a size change by writing, of an inode in
        ``unsized``, does not persist at all (delayed allocation: no writeback yet)."""
        if op.kind == "size" and op.written and op.ino in unsized:
            return
        if op.kind == "create":
            self.names[op.path] = op.ino
            self.data[op.ino] = b""
        elif op.kind == "mkdir":
            self.dirs.add(op.path)
        elif op.kind == "rmdir":
            self.dirs.discard(op.path)
        elif op.kind == "rename":
            ino = self.names.pop(op.path, None)
            if ino is not None:
                self.names[op.dst] = ino  # the old target, if any, goes in the same step
        elif op.kind == "unlink":
            self.names.pop(op.path, None)
        elif op.kind == "size":
            old = self.data.get(op.ino, b"")
            grown = op.data[len(old):op.size] if ordered else b""
            self.data[op.ino] = fit(old + grown, op.size)


def fit(data: bytes, size: int) -> bytes:
    """``data`` cut or zero-extended to ``size`` bytes."""
    return data[:size] if len(data) >= size else data + bytes(size - len(data))


def _applied(base: bytes, writes: list[tuple]) -> bytes:
    """``base`` with ``writes`` (``MetadataModel.writes``'s) applied in order."""
    for k in range(len(writes) - 1, -1, -1):  # (from the last whole-file one)
        if writes[k][0] == "s":
            base, writes = writes[k][1], writes[k + 1:]
            break
    if not writes:
        return base
    data = bytearray(base)
    for _, offset, chunk in writes:
        if len(data) < offset:
            data.extend(bytes(offset - len(data)))
        data[offset:offset + len(chunk)] = chunk
    return bytes(data)


def _mix(versions: list[bytes], size: int, unit: int, rng: random.Random) -> bytes:
    """Each ``unit`` bytes (a page, a sector) of ``size`` from one of ``versions``, drawn."""
    n = -(-size // unit)
    if not n:
        return b""
    pick = np.random.default_rng(rng.getrandbits(64)).integers(len(versions), size=n)
    out = np.frombuffer(fit(versions[0], n * unit), np.uint8).reshape(n, unit).copy()
    for j in range(1, len(versions)):
        rows = pick == j
        if rows.any():
            out[rows] = np.frombuffer(fit(versions[j], n * unit), np.uint8).reshape(n, unit)[rows]
    return out.tobytes()[:size]


def _once(current: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """``current``, read once per inode."""
    seen: dict[int, bytes] = {}

    def once(ino: int) -> bytes:
        if ino not in seen:
            seen[ino] = current(ino)
        return seen[ino]
    return once


@dataclass
class CrashState:
    """One state a crash may leave: names to contents, and directories."""

    files: dict[str, bytes]
    dirs: set[str]
    prefix: int          # pending operations it kept
    pending: int         # of how many
    data: str            # old | new | old+zeros

    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + _content_hash(self.files[name]))
        for d in sorted(self.dirs):
            h.update(b"d:" + d.encode() + b"\0")
        return h.digest()


_HASHES: dict[int, tuple[bytes, bytes]] = {}  # id(content) -> (content, its hash): one per object
_HASHED_BYTES = 0  # the contents _HASHES holds, in bytes


def _content_hash(data: bytes) -> bytes:
    global _HASHED_BYTES
    cached = _HASHES.get(id(data))
    if cached is None or cached[0] is not data:
        # (it holds what it hashed: the index's 16 MiB chunk files would fill memory)
        _HASHED_BYTES += len(data)
        if len(_HASHES) > 4096 or _HASHED_BYTES > 256 << 20:
            _HASHES.clear()
            _HASHED_BYTES = len(data)
        cached = (data, hashlib.blake2b(data, digest_size=16).digest())
        _HASHES[id(data)] = cached
    return cached[1]


class MetadataModel:
    """The durable image, the operations pending since the last commit, and the rules of
    one file system (``ext4`` or ``xfs``) for what a crash keeps of them."""

    def __init__(self, fs: str, mounts: tuple[str, ...] = ()) -> None:
        if fs not in FS_MODELS:
            raise ValueError(f"fs model {fs!r}: one of {', '.join(FS_MODELS)}")
        self.fs = fs
        # the roots (relative paths) of file systems of their own, each with its own journal:
        # mount i + 1; everything else is on file system 0
        self.mounts = tuple(mounts)
        self.inode_mounts: dict[int, int] = {}
        self.durable = FsImage()
        self.pending: list[MetaOp] = []
        self._next_ino = 1
        self.recorded = 0  # operations recorded, in all
        # per inode: its data at its own last fsync/fdatasync (the size writeback may leave
        # it), for the inodes whose size grew by writing since (delayed allocation)
        self.synced: dict[int, bytes] = {}
        # per inode other than a segment: its bytes at its last sync (or when first seen), and
        # the writes seen since, in order: ("w", offset, bytes) or ("s", the whole file then)
        self.base: dict[int, bytes] = {}
        self.writes: dict[int, list[tuple]] = {}

    @property
    def ordered(self) -> bool:
        return self.fs == "ext4"

    def new_inode(self) -> int:
        self._next_ino += 1
        return self._next_ino

    def mount_of(self, path: str) -> int:
        """The file system that relative ``path`` lies on (the deepest mount root above it)."""
        best, depth = 0, -1
        for i, root in enumerate(self.mounts, 1):
            if (path == root or path.startswith(root + "/")) and len(root) > depth:
                best, depth = i, len(root)
        return best

    def record(self, op: MetaOp) -> None:
        if self.mounts:
            mount = self.inode_mounts.get(op.ino, 0) if op.kind == "size" else \
                self.mount_of(op.path)
            if op.kind == "create":
                self.inode_mounts[op.ino] = mount
            op = replace(op, mount=mount)
        if op.kind == "size" and op.written and op.ino not in self.synced:
            self.synced[op.ino] = self.durable.data.get(op.ino, b"")
        self.pending.append(op)
        self.recorded += 1

    def wrote(self, ino: int, write: tuple) -> None:
        """A write to inode ``ino`` since its last sync: each prefix of them is a version of
        its data the kernel may have written back."""
        writes = self.writes.setdefault(ino, [])
        writes.append(write)
        if len(writes) > MAX_WRITES:  # (the versions kept are still real ones)
            self.base[ino] = _applied(self.base.get(ino, b""), writes[:1])
            del writes[0]

    def version(self, ino: int, n: int) -> bytes:
        """Inode ``ino``'s data after the first ``n`` writes since its last sync."""
        return _applied(self.base.get(ino, b""), self.writes.get(ino, [])[:n])

    def _synced(self, ino: int, current: bytes) -> None:
        self.base[ino] = current
        self.writes.pop(ino, None)

    def commit(self, mount: int | None = None) -> None:
        """A journal commit / log force: every pending operation is durable, in order; only
        those of file system ``mount`` when given (each file system has its own journal)."""
        kept = []
        for op in self.pending:
            if mount is None or op.mount == mount:
                self.durable.apply(op, self.ordered)
            else:
                kept.append(op)
        self.pending[:] = kept

    def has_pending(self, ino: int) -> bool:
        """Whether inode ``ino`` has a pending create or size change (an fdatasync of it then
        commits: the size is data-sync metadata on both file systems)."""
        return any(op.ino == ino and op.kind in ("create", "size") for op in self.pending)

    def fsync(self, ino: int, current: bytes) -> None:
        """fsync of a file: commit (its file system's journal), then its data as it is now."""
        self.commit(self.inode_mounts.get(ino, 0) if self.mounts else None)
        self.durable.data[ino] = current
        self.synced.pop(ino, None)
        self._synced(ino, current)

    def fdatasync(self, ino: int, current: bytes) -> None:
        """fdatasync: its data; a commit first only when its size or creation is pending."""
        if self.has_pending(ino):
            self.commit(self.inode_mounts.get(ino, 0) if self.mounts else None)
        self.durable.data[ino] = fit(current, len(self.durable.data.get(ino, b"")))
        self.synced.pop(ino, None)
        self._synced(ino, current)

    def settle(self, ino: int, current: bytes) -> None:
        """Data made durable where no wrapper saw it (the core's flush): data only."""
        if ino in self.durable.data:
            self.durable.data[ino] = fit(current, len(self.durable.data[ino]))

    def states(self, current: Callable[[int], bytes], mixed: int = 0,
               rng: random.Random | None = None,
               segments: frozenset[int] = frozenset()) -> Iterator[CrashState]:
        """Every state a crash now may leave: each prefix of the pending operations, with
        each data outcome (``current(ino)``: the inode's bytes now).  "old+unsized" (both
        file systems: delayed allocation, and xfs's size update at I/O completion): the
        sizes that writes grew since the file's own last sync do not persist, though the
        operations after them (a rename into place, a commit) do.  Then ``mixed`` states
        drawn with ``rng`` where each file but the ``segments`` takes a data outcome of its
        own (``_per_file``)."""
        current = _once(current)
        variants = [("old", True), ("new", True), ("old+unsized", True)] + (
            [("old+zeros", False)] if self.fs == "xfs" else [])
        news: dict[tuple[int, int], bytes] = {}
        main, cuts = self._journals()
        for (data, ordered), cut in itertools.product(variants, cuts):
            image = self.durable.copy()
            unsized = frozenset(self.synced) if data == "old+unsized" else frozenset()
            for ino in unsized:
                if ino in image.data:
                    image.data[ino] = self.synced[ino]
            for op in cut:
                image.apply(op, ordered, unsized)
            for k in range(len(main) + 1):
                if k:
                    image.apply(main[k - 1], ordered, unsized)
                files = {}
                for name, ino in image.names.items():
                    old = image.data.get(ino, b"")
                    if data == "new":
                        key = (ino, len(old))
                        if key not in news:
                            news[key] = fit(current(ino), len(old))
                        files[name] = news[key]
                    else:
                        files[name] = old
                yield CrashState(files, set(image.dirs), k + len(cut), len(self.pending), data)
        if mixed and rng is not None:
            yield from self._per_file(current, mixed, rng, segments)

    def _per_file(self, current: Callable[[int], bytes], count: int, rng: random.Random,
                  segments: frozenset[int]) -> Iterator[CrashState]:
        """``count`` states at random prefixes where each file written since its last sync
        takes its durable data, its current data, a version written between, or a mix of
        those per page or sector; segments take their current data (their loss is the whole-state outcomes'
        to show: the model settles them only when a flush returns)."""
        several = {ino for ino, writes in self.writes.items() if writes and ino not in segments}
        if not several:
            return
        for _ in range(count):
            k = len(self.pending) if rng.random() < 0.5 else rng.randrange(len(self.pending) + 1)
            ordered = self.ordered or rng.random() < 0.5
            image = self.durable.copy()
            for op in self.pending[:k]:
                image.apply(op, ordered)
            files, told = {}, []
            for name, ino in sorted(image.names.items()):
                old = image.data.get(ino, b"")
                if ino in segments:
                    files[name] = fit(current(ino), len(old))
                elif ino in several:
                    files[name], how = self._outcome(ino, old, current(ino), rng)
                    told.append(f"{name} {how}")
                else:
                    files[name] = old
            yield CrashState(files, set(image.dirs), k, len(self.pending),
                             "per file (" + ", ".join(told) + ")")

    def _outcome(self, ino: int, old: bytes, now: bytes, rng: random.Random) -> tuple[bytes, str]:
        """One file's data in a per-file state, and what it is."""
        size = len(old)
        writes = len(self.writes.get(ino, []))
        between = sorted(rng.sample(range(writes), min(MIXED_VERSIONS, writes)))
        versions, names = [old], ["old"]
        for data, name in [(self.version(ino, n), f"after {n} of {writes} writes")
                           for n in between] + [(now, "new")]:
            data = fit(data, size)
            if all(data != v for v in versions):
                versions.append(data)
                names.append(name)
        if len(versions) == 1:
            return old, "old"
        if rng.random() < 0.5:
            j = rng.randrange(len(versions))
            return versions[j], names[j]
        unit = 4096 if rng.random() < 0.7 else 512
        return _mix(versions, size, unit, rng), (
            f"{'pages' if unit == 4096 else 'sectors'} of {' / '.join(names)}")

    def _journals(self) -> tuple[list[MetaOp], list[list[MetaOp]]]:
        """The pending operations of the file system with the most of them, and what a crash
        may keep of the others': a prefix of each, independently (every combination).  Their
        operations touch disjoint names and inodes, so the order they are applied in is moot."""
        journals: dict[int, list[MetaOp]] = {}
        for op in self.pending:
            journals.setdefault(op.mount, []).append(op)
        if len(journals) < 2:
            return self.pending, [[]]
        main = max(journals.values(), key=len)
        others = [ops for ops in journals.values() if ops is not main]
        cuts = [[op for ops, n in zip(others, lengths) for op in ops[:n]]
                for lengths in itertools.product(*(range(len(ops) + 1) for ops in others))]
        return main, cuts


# ---- recording -----------------------------------------------------------------------------

class Killed(BaseException):
    """A simulated process kill at a chosen operation (shared workload)."""


class Recorder:
    """Wraps the ``os`` calls (and ``builtins.open``) that change files under ``root`` while
    active, feeding ``model``; ``on_point(where)`` runs before each, a crash point.
    ``mounts``: directories under ``root`` (made if absent) that are each the root of a file
    system of its own: its own journal, and a rename across file systems fails (EXDEV).

    Calls from several threads (a WAL's background writer beside the workload's) are
    recorded one at a time: each wrapped call, with its crash point, its recording and the
    states a crash there enumerates, holds ``lock``, so a thread's operation never lands
    amid another's or amid a crash's states.  Pausing is per thread."""

    def __init__(self, model: MetadataModel, root: str,
                 on_point: Callable[[str], None] | None = None,
                 mounts: tuple[str, ...] = ()) -> None:
        self.model = model
        self.root = os.path.abspath(root)
        if mounts:
            model.mounts = tuple(os.path.relpath(os.path.join(self.root, m), self.root)
                                 for m in mounts)
            for m in model.mounts:
                os.makedirs(os.path.join(self.root, m), exist_ok=True)
                model.durable.dirs.add(m)  # a mount point: there before anything ran
        self.on_point = on_point
        self.lock = threading.RLock()
        self._local = threading.local()
        self.inodes: dict[int, int] = {}   # st_ino -> model inode
        self.paths: dict[int, str] = {}    # model inode -> its name now
        self.gone: dict[int, bytes] = {}   # model inode -> its bytes when its last name went
        self.sizes: dict[int, int] = {}    # model inode -> the size the model knows
        self.segment_inodes: set[int] = set()
        self.kill_at: Callable[[str], bool] | None = None  # raise Killed at the op it accepts
        self.mixed = 0                     # per-file states drawn at each crash point ...
        self.rng: random.Random | None = None  # ... with this (MetadataModel.states)
        self._large: dict[int, bytes] = {}    # model inode -> its bytes, read (LARGE files)
        self._objects: set[int] = set()       # inodes a file object wrote: never kept so
        self.model.durable.dirs.add("")

    # -- plumbing ------------------------------------------------------------------------
    @property
    def paused(self) -> int:
        return getattr(self._local, "paused", 0)

    @paused.setter
    def paused(self, value: int) -> None:
        self._local.paused = value

    def _locked(self, fn: Callable) -> Callable:
        def _locked_call(*args, **kwargs):  # (in _SKIP: crash points name the library's callers)
            with self.lock:
                return fn(*args, **kwargs)
        return _locked_call

    @contextmanager
    def pause(self) -> Iterator[None]:
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def __enter__(self) -> Recorder:
        wrapped: dict[str, Callable[..., Any]] = {
            "open": self._open, "rename": self._rename, "replace": self._replace,
            "unlink": self._unlink, "remove": self._unlink, "mkdir": self._mkdir,
            "rmdir": self._rmdir, "posix_fallocate": self._fallocate,
            "ftruncate": self._ftruncate, "pwrite": self._pwrite, "write": self._write,
            "sendfile": self._sendfile, "fsync": self._fsync, "fdatasync": self._fdatasync}
        for name, fn in wrapped.items():
            setattr(os, name, self._locked(fn))
        builtins.open = self._locked(self._builtin_open)
        return self

    def __exit__(self, *exc) -> None:
        for name in vars(_real):
            if name != "builtin_open":
                setattr(os, name, getattr(_real, name))
        builtins.open = _real.builtin_open

    def _rel(self, path, dir_fd: int | None = None) -> str | None:
        if isinstance(path, int):
            return None
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        path = os.path.normpath(os.path.abspath(path))
        if path == self.root:
            return ""
        return os.path.relpath(path, self.root) if path.startswith(self.root + os.sep) else None

    def _fd_rel(self, fd: int) -> str | None:
        try:
            return self._rel(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return None

    def _point(self, what: str) -> None:
        where = f"{what} in {_caller()}"
        if threading.current_thread().name.startswith("pmemwal-writer"):
            where += " (background)"
        if self.kill_at is not None and self.kill_at(where):
            self.kill_at = None
            raise Killed(where)
        if self.on_point is not None:
            with self.pause():
                self.on_point(where)

    def _active(self, rel: str | None) -> TypeGuard[str]:
        return rel is not None and not self.paused

    def _inode(self, st: os.stat_result, rel: str) -> int:
        """The model inode of a file found under ``rel`` (one made before recording began
        is taken as durable as it is)."""
        ino = self.inodes.get(st.st_ino)
        if ino is None:
            ino = self.model.new_inode()
            self.inodes[st.st_ino] = ino
            self.paths[ino] = rel
            data = _read_path(os.path.join(self.root, rel))
            self.model.durable.names[rel] = ino
            self.model.durable.data[ino] = data
            self.model.inode_mounts[ino] = self.model.mount_of(rel)
            self.model.base[ino] = data
            self.sizes[ino] = len(data)
        return ino

    def _fd_inode(self, fd: int) -> int | None:
        rel = self._fd_rel(fd)
        if rel is None:
            return None
        st = os.fstat(fd)
        return None if stat.S_ISDIR(st.st_mode) else self._inode(st, rel)

    def _created(self, rel: str, st: os.stat_result) -> int:
        ino = self.model.new_inode()
        self.inodes[st.st_ino] = ino
        self.paths[ino] = rel
        self.sizes[ino] = 0
        if parse_segment_name(os.path.basename(rel.removesuffix(".tmp"))) is not None:
            self.segment_inodes.add(ino)
        self.model.record(MetaOp("create", rel, ino=ino, where=_caller()))
        return ino

    def current(self, ino: int) -> bytes:
        """An inode's bytes now: its file, or what it held when its last name went."""
        rel = self.paths.get(ino)
        if rel is not None:
            if ino in self._large:  # (the same object each time: its hash is kept)
                return self._large[ino]
            try:
                data = _read_path(os.path.join(self.root, rel))
            except FileNotFoundError:
                pass
            else:
                if len(data) >= LARGE and ino not in self.segment_inodes | self._objects:
                    self._large[ino] = data
                return data
        return self.gone.get(ino, self.model.durable.data.get(ino, b""))

    def _written(self, fd: int) -> None:
        """A wrapper is about to write through ``fd``: its file's bytes are read again."""
        ino = self.inodes.get(os.fstat(fd).st_ino)
        if ino is not None:
            self._large.pop(ino, None)

    def _observe(self, ino: int) -> None:
        """Record a size change the wrappers did not see (a file object's writes)."""
        rel = self.paths.get(ino)
        if rel is None:
            return
        try:
            size = os.stat(os.path.join(self.root, rel)).st_size
        except FileNotFoundError:
            return
        if size != self.sizes.get(ino, 0):
            grew = size > self.sizes.get(ino, 0)  # (by a file object's writes)
            self.sizes[ino] = size
            data = self.current(ino)
            self.model.record(MetaOp("size", ino=ino, size=size, data=data,
                                     where=_caller(), written=grew))
            self._wrote(ino, ("s", data))

    def _observe_fd(self, fd: int, written: bool = False) -> int | None:
        ino = self._fd_inode(fd)
        if ino is not None:
            size = os.fstat(fd).st_size
            if size != self.sizes.get(ino, 0):
                grew = size > self.sizes.get(ino, 0)
                self.sizes[ino] = size
                data = self.current(ino)
                self.model.record(MetaOp("size", ino=ino, size=size, data=data,
                                         where=_caller(), written=written and grew))
                self._wrote(ino, ("s", data))
        return ino

    def _wrote(self, ino: int, write: tuple) -> None:
        # segments keep to the whole-state outcomes, and so does CONTROL: written through its
        # mapping, never synced, and rebuilt from the segments by the first opener after a
        # crash (per-file states of it would come at every crash point, and show nothing)
        if ino not in self.segment_inodes and \
                os.path.basename(self.paths.get(ino, "")) != CONTROL_NAME:
            self.model.wrote(ino, write)

    def _name_goes(self, rel: str) -> None:
        """``rel`` is about to be unlinked or renamed over: keep its inode's bytes."""
        st = _lstat(os.path.join(self.root, rel))
        if st is None or stat.S_ISDIR(st.st_mode):
            return
        ino = self._inode(st, rel)
        self._observe(ino)
        self.gone[ino] = self.current(ino)
        if self.paths.get(ino) == rel:
            del self.paths[ino]

    def settle_segments(self) -> None:
        """The core made its segments' data durable (a flush returned)."""
        with self.lock, self.pause():
            for ino in self.segment_inodes:
                if ino in self.paths:
                    self.model.settle(ino, self.current(ino))

    # -- the wrappers ------------------------------------------------------------------------
    def _open(self, path, flags, mode=0o777, *, dir_fd=None):
        rel = self._rel(path, dir_fd)
        writes = flags & (os.O_CREAT | os.O_TRUNC)
        if not self._active(rel) or not writes:
            return _real.open(path, flags, mode, dir_fd=dir_fd)
        self._point("open")
        before = _lstat(os.path.join(self.root, rel))
        fd = _real.open(path, flags, mode, dir_fd=dir_fd)
        self._opened(rel, before, fd, bool(flags & os.O_TRUNC))
        return fd

    def _opened(self, rel: str, before: os.stat_result | None, fd: int, trunc: bool) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return
        if before is None:
            self._created(rel, st)
        elif trunc and before.st_size:
            ino = self._inode(before, rel)
            self._large.pop(ino, None)
            self.sizes[ino] = 0
            self.model.record(MetaOp("size", ino=ino, size=0, where=_caller()))
            self._wrote(ino, ("s", b""))

    def _builtin_open(self, file, mode="r", *args, **kwargs):
        rel = self._rel(file) if isinstance(file, (str, bytes, os.PathLike)) else None
        if not self._active(rel) or not set(mode) & set("wax+"):
            return _real.builtin_open(file, mode, *args, **kwargs)
        self._point("open")
        before = _lstat(os.path.join(self.root, rel))
        f = _real.builtin_open(file, mode, *args, **kwargs)
        self._opened(rel, before, f.fileno(), "w" in mode)
        ino = self.inodes.get(os.fstat(f.fileno()).st_ino)
        if ino is not None:  # (its writes go where no wrapper sees them)
            self._objects.add(ino)
            self._large.pop(ino, None)
        return f

    def _rename_like(self, real, src, dst, src_dir_fd=None, dst_dir_fd=None):
        rel_src, rel_dst = self._rel(src, src_dir_fd), self._rel(dst, dst_dir_fd)
        if not (self._active(rel_src) and rel_dst is not None):
            return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if self.model.mount_of(rel_src or "") != self.model.mount_of(rel_dst):
            # as the kernel says: a rename cannot cross file systems (shutil.move then copies)
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src, None, dst)
        self._point(real.__name__)
        st = _lstat(os.path.join(self.root, rel_src))
        ino = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            ino = self._inode(st, rel_src)
            self._observe(ino)
        target = _lstat(os.path.join(self.root, rel_dst))
        if target is not None and (st is None or target.st_ino != st.st_ino):
            self._name_goes(rel_dst)
        real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if ino is not None:
            self.paths[ino] = rel_dst
        self.model.record(MetaOp("rename", rel_src, rel_dst, where=_caller()))

    def _rename(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        return self._rename_like(_real.rename, src, dst, src_dir_fd, dst_dir_fd)

    def _replace(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        return self._rename_like(_real.replace, src, dst, src_dir_fd, dst_dir_fd)

    def _unlink(self, path, *, dir_fd=None):
        rel = self._rel(path, dir_fd)
        if not self._active(rel):
            return _real.unlink(path, dir_fd=dir_fd)
        self._point("unlink")
        if _lstat(os.path.join(self.root, rel)) is not None:
            self._name_goes(rel)
        _real.unlink(path, dir_fd=dir_fd)  # (raises before anything is recorded if absent)
        self.model.record(MetaOp("unlink", rel, where=_caller()))

    def _mkdir(self, path, mode=0o777, *, dir_fd=None):
        rel = self._rel(path, dir_fd)
        if not self._active(rel):
            return _real.mkdir(path, mode, dir_fd=dir_fd)
        self._point("mkdir")
        _real.mkdir(path, mode, dir_fd=dir_fd)
        self.model.record(MetaOp("mkdir", rel, where=_caller()))

    def _rmdir(self, path, *, dir_fd=None):
        rel = self._rel(path, dir_fd)
        if not self._active(rel):
            return _real.rmdir(path, dir_fd=dir_fd)
        self._point("rmdir")
        _real.rmdir(path, dir_fd=dir_fd)
        self.model.record(MetaOp("rmdir", rel, where=_caller()))

    def _fd_op(self, what: str, real, fd: int, *args):
        if self.paused or self._fd_rel(fd) is None:
            return real(fd, *args)
        self._point(what)
        self._written(fd)
        result = real(fd, *args)
        recorded = self.model.recorded
        ino = self._observe_fd(fd, written=what in ("pwrite", "write"))
        if ino is not None and what in ("pwrite", "write") and self.model.recorded == recorded:
            # (a write that grew the file was kept whole with its size, above)
            offset = args[1] if what == "pwrite" else os.lseek(fd, 0, os.SEEK_CUR) - result
            self._wrote(ino, ("w", offset, bytes(memoryview(args[0]).cast("B")[:result])))
        return result

    def _fallocate(self, fd, offset, length):
        return self._fd_op("posix_fallocate", _real.posix_fallocate, fd, offset, length)

    def _ftruncate(self, fd, length):
        return self._fd_op("ftruncate", _real.ftruncate, fd, length)

    def _pwrite(self, fd, data, offset):
        return self._fd_op("pwrite", _real.pwrite, fd, data, offset)

    def _write(self, fd, data):
        return self._fd_op("write", _real.write, fd, data)

    def _sendfile(self, out_fd, in_fd, offset, count, *args, **kwargs):
        if self.paused or self._fd_rel(out_fd) is None:
            return _real.sendfile(out_fd, in_fd, offset, count, *args, **kwargs)
        self._point("sendfile")
        self._written(out_fd)
        result = _real.sendfile(out_fd, in_fd, offset, count, *args, **kwargs)
        self._observe_fd(out_fd, written=True)
        return result

    def _sync(self, what: str, real, fd: int) -> None:
        rel = self._fd_rel(fd)
        if self.paused or rel is None:
            return real(fd)
        self._point(what)
        real(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            # a directory's fsync: every earlier operation (journal/log) of its file system
            self.model.commit(self.model.mount_of(rel) if self.model.mounts else None)
            return
        ino = self._observe_fd(fd, written=True)  # (a file object's writes, if it grew)
        assert ino is not None, "a file under the root (no directory) has a model inode"
        if os.path.basename(rel) == CHECKPOINT_NAME:
            self.settle_segments()  # a slot names only what the core had made durable
        with self.pause():
            current = self.current(ino)
        (self.model.fsync if what == "fsync" else self.model.fdatasync)(ino, current)

    def _fsync(self, fd):
        return self._sync("fsync", _real.fsync, fd)

    def _fdatasync(self, fd):
        return self._sync("fdatasync", _real.fdatasync, fd)

    def states(self) -> Iterator[CrashState]:
        with self.lock, self.pause():
            yield from self.model.states(self.current, self.mixed, self.rng,
                                         frozenset(self.segment_inodes))


def _read_path(path: str) -> bytes:
    fd = _real.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0) if size else b""
    finally:
        os.close(fd)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


_SKIP = {"_point", "_open", "_opened", "_builtin_open", "_rename_like", "_rename", "_replace",
         "_unlink", "_mkdir", "_rmdir", "_fd_op", "_fallocate", "_ftruncate", "_pwrite",
         "_write", "_sendfile", "_sync", "_fsync", "_fdatasync", "_created", "_observe",
         "_observe_fd", "_name_goes", "_caller", "_locked_call"}


def _caller() -> str:
    """The library functions making the call: ``recycle < _recycle_or_remove``."""
    frame: FrameType | None = sys._getframe(1)
    names: list[str] = []
    while frame is not None and len(names) < 2:
        name = frame.f_code.co_name
        if name not in _SKIP and "shutil" not in frame.f_code.co_filename:
            names.append(name)
        frame = frame.f_back
    return " < ".join(names)
