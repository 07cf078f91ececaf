"""Where completed segments go, and how the WAL directory remembers that they went.

An *archive* keeps copies of completed segments under their own names
(``000000000000002A.wal``), as PostgreSQL's ``archive_command`` keeps its WAL
segments.  Two kinds:

- ``FsspecArchive``: any URL fsspec knows (``s3://bucket/prefix``, ``file:///…``).
  The segment is uploaded, then read back and its CRC-32C and size compared with
  the local file's.  Protocols whose writes are atomic (object stores) write the
  final name directly; others write ``<name>.partial`` and rename it, so that a
  crash mid-upload never leaves a short file under the final name.
- ``CommandArchive``: PostgreSQL's ``archive_command`` (``%p`` the segment's path,
  ``%f`` its file name, ``%%`` a percent sign; run by ``/bin/sh``; exit status 0
  means archived; substituted as they are, as PostgreSQL does: quote them in the
  command if paths may hold spaces), with a time limit, and an optional ``restore_command`` (``%f``
  to fetch, ``%p`` where to put it) through which each archived segment is read
  back and compared.

An archive never holds two versions of a segment: finding the name already
there with other bytes is an ArchiveError (a conflict: another WAL archiving to
the same place, or this one cut at damage and rewritten since), which the
archiver reports and retries, and never overwrites.  Finding it with the same
bytes (a crash after the upload, before the status file changed) counts as
archived.

Archive status, in the WAL directory's ``archive_status/`` (PostgreSQL's layout)::

    <segment>.ready   the segment is complete (every byte durable, the insert
                      position past its end) and waits to be archived
    <segment>.done    archived; truncation may now remove or recycle the segment
    <segment>.error   the last failed attempt: {"attempts": n, "error": text, "time": t}

``.ready`` becomes ``.done`` by rename, and the directory is synced before the
WAL relies on it, so a crash never turns an unarchived segment into an archived
one.  A lost ``.ready`` costs nothing: on open, every complete segment without
status gets one.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import tempfile
import time

from pmemwal import _core
from pmemwal.errors import ArchiveError, ConfigError
from pmemwal.format import parse_segment_name, segment_name
from pmemwal.segments import ARCHIVE_STATUS_NAME, make_directories

STATUS_DIR = ARCHIVE_STATUS_NAME
_CHUNK = 4 << 20
# object stores: a PUT lands whole or not at all
_ATOMIC_WRITES = {"s3", "s3a", "gs", "gcs", "abfs", "az", "adl", "memory"}
DEFAULT_COMMAND_TIMEOUT = 300.0
# the process groups of the commands running now (the archiver kills them as it exits)
running_commands: set[int] = set()


def file_crc(path: str) -> tuple[int, int]:
    """(CRC-32C, size) of the file at ``path``."""
    with open(path, "rb", buffering=0) as f:
        return _stream_crc(f)


def fsync_path(path: str) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stream_crc(f) -> tuple[int, int]:
    """(CRC-32C, size) of what is left to read in file object ``f``."""
    crc = size = 0
    while chunk := f.read(_CHUNK):
        crc = _core.crc32c(chunk, crc)
        size += len(chunk)
    return crc, size


def _failure(where: str, exc: Exception) -> ArchiveError:
    """An ArchiveError for what the file system library raised."""
    if isinstance(exc, OSError) and exc.strerror:
        return ArchiveError(exc.errno or errno.EIO, f"{where}: {exc.strerror}")
    return ArchiveError(errno.EIO, f"{where}: {type(exc).__name__}: {exc}")


class FsspecArchive:
    """Segments stored as ``<url>/<segment name>`` in any file system fsspec knows."""

    def __init__(self, url: str, storage_options: dict | None = None) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ConfigError(f"archive={url!r} needs fsspec (and s3fs for s3://): "
                              "pip install 'pmemwal[archive]'") from exc
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"archive={url!r}: {exc}") from exc
        self.root = root.rstrip("/")
        self.description = url
        protocols = (self.fs.protocol if isinstance(self.fs.protocol, (tuple, list))
                     else [self.fs.protocol])
        self._atomic = bool(_ATOMIC_WRITES.intersection(protocols))
        self._local = bool({"file", "local"}.intersection(protocols))  # synced here: the
        # segment is truncated once archived, so the copy must be durable first
        self._made_root = False

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def store(self, path: str, name: str, crc: int, size: int) -> bool:
        """Archive the file at ``path`` as ``name``; True when uploaded, False when the
        archive already held these bytes.  ArchiveError on a conflict or a failure."""
        target = self._path(name)
        try:
            held = self._crc_of(target)
            if held == (crc, size):
                return False
            if held is not None:
                raise ArchiveError(errno.EEXIST, f"{self.description}/{name} already holds "
                                   f"other bytes ({held[1]} bytes, CRC {held[0]:08x}; this "
                                   f"segment: {size} "
                                   f"bytes, CRC {crc:08x}): refusing to overwrite it")
            if not self._made_root:
                if self._local:     # (its entry durable before a segment is archived there)
                    make_directories(self.root)
                else:
                    self.fs.makedirs(self.root, exist_ok=True)
                self._made_root = True
            if self._atomic:
                self.fs.put_file(path, target)
            else:
                self.fs.put_file(path, target + ".partial")
                if self._local:
                    fsync_path(target + ".partial")
                self.fs.mv(target + ".partial", target)
                if self._local:
                    fsync_path(os.path.dirname(target))
            self.fs.invalidate_cache()
            held = self._crc_of(target)
        except ArchiveError:
            raise
        except Exception as exc:  # the network, the server, credentials: all retried
            self._made_root = False  # a server that lost its bucket gets it back
            raise _failure(f"{self.description}/{name}", exc) from exc
        if held != (crc, size):
            raise ArchiveError(errno.EIO, f"{self.description}/{name} read back as "
                               f"{held and held[1]} bytes, CRC {held and f'{held[0]:08x}'}; "
                               f"written: {size} bytes, CRC {crc:08x}")
        return True

    def _crc_of(self, target: str) -> tuple[int, int] | None:
        """(CRC-32C, size) of what the archive holds under ``target``, None when nothing."""
        try:
            with self.fs.open(target, "rb", block_size=_CHUNK) as f:
                return _stream_crc(f)
        except FileNotFoundError:
            return None

    def fetch(self, name: str, dest: str) -> bool:
        """Copy archived ``name`` to the local file ``dest``; False when there is none."""
        try:
            self.fs.get_file(self._path(name), dest)
            return True
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise _failure(f"{self.description}/{name}", exc) from exc

    def segments(self) -> list[int]:
        """The segment numbers the archive holds, in order."""
        try:
            names = self.fs.ls(self.root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise _failure(self.description, exc) from exc
        found = (parse_segment_name(os.path.basename(n.rstrip("/"))) for n in names)
        return sorted(s for s in found if s is not None)


def substitute(command: str, path: str, name: str) -> str:
    """PostgreSQL's archive_command / restore_command placeholders: ``%p``, ``%f``, ``%%``."""
    out, i = [], 0
    while i < len(command):
        pair = command[i:i + 2]
        if pair in ("%p", "%f", "%%"):
            out.append({"%p": path, "%f": name, "%%": "%"}[pair])
            i += 2
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


def run_command(command: str, timeout: float) -> tuple[int, str]:
    """Run a shell command in its own process group; (exit status, its stderr's tail).
    Past ``timeout`` seconds the whole group is killed and ArchiveError raised."""
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    running_commands.add(proc.pid)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ArchiveError(errno.ETIMEDOUT,
                           f"{command!r} ran past its {timeout:g} s limit and was killed")
    finally:
        running_commands.discard(proc.pid)
    return proc.returncode, err.decode(errors="replace").strip()[-300:]


class CommandArchive:
    """PostgreSQL's ``archive_command`` (and ``restore_command``, to read segments back)."""

    def __init__(self, command: str | None, restore_command: str | None = None,
                 timeout: float = DEFAULT_COMMAND_TIMEOUT) -> None:
        self.command = command
        self.restore_command = restore_command
        self.timeout = timeout
        self.description = f"archive_command {command!r}" if command else \
            f"restore_command {restore_command!r}"

    def store(self, path: str, name: str, crc: int, size: int) -> bool:
        if not self.command:
            raise ConfigError("archiving segments needs an archive_command")
        rc, err = run_command(substitute(self.command, path, name), self.timeout)
        if rc != 0:
            raise ArchiveError(errno.EIO, f"{self.description} exited with status {rc} for {name}"
                               + (f": {err}" if err else ""))
        if self.restore_command:
            with tempfile.TemporaryDirectory(prefix="pmemwal-check-") as tmp:
                back = os.path.join(tmp, name)
                held = file_crc(back) if self.fetch(name, back) else None
            if held != (crc, size):
                raise ArchiveError(errno.EIO, f"{name} read back through restore_command as "
                                   f"{held and held[1]} bytes, CRC {held and f'{held[0]:08x}'}; "
                                   f"written: {size} bytes, CRC {crc:08x}")
        return True

    def fetch(self, name: str, dest: str) -> bool:
        if not self.restore_command:
            raise ConfigError("reading segments back needs a restore_command")
        rc, _ = run_command(substitute(self.restore_command, dest, name), self.timeout)
        return rc == 0 and os.path.exists(dest)


def open_archive(spec: dict) -> FsspecArchive | CommandArchive:
    """The archive a WAL's options describe: {"url", "storage_options"} or
    {"command", "restore_command", "timeout"}."""
    if spec.get("url"):
        return FsspecArchive(spec["url"], spec.get("storage_options"))
    return CommandArchive(spec.get("command"), spec.get("restore_command"),
                          spec.get("timeout", DEFAULT_COMMAND_TIMEOUT))


class ArchiveStatus:
    """The ``archive_status/`` directory of one WAL directory (see the module docstring)."""

    def __init__(self, wal_dir: str, create: bool = True) -> None:
        self.path = os.path.join(wal_dir, STATUS_DIR)
        if create:
            make_directories(self.path)

    def _file(self, segno: int, kind: str) -> str:
        return os.path.join(self.path, f"{segment_name(segno)}.{kind}")

    def is_done(self, segno: int) -> bool:
        return os.path.exists(self._file(segno, "done"))

    def mark_ready(self, segno: int) -> bool:
        """Note that ``segno`` is complete, unless it has status already; True if new."""
        if os.path.exists(self._file(segno, "ready")) or self.is_done(segno):
            return False
        with open(self._file(segno, "ready"), "wb"):
            pass
        return True

    def set_done(self, segno: int) -> None:
        """``segno`` is archived: .ready becomes .done, durably."""
        os.replace(self._file(segno, "ready"), self._file(segno, "done"))
        self._remove(segno, "error")
        self.sync()

    def drop_ready(self, segno: int) -> None:
        """``segno`` is gone unarchived (a truncation removed it): its status goes, durably."""
        self._remove(segno, "ready")
        self._remove(segno, "error")
        self.sync()

    def mark_done(self, segno: int) -> None:
        """``segno`` came from the archive (restore); call ``sync`` after the last."""
        with open(self._file(segno, "done"), "wb"):
            pass

    def sync(self) -> None:
        fsync_path(self.path)

    def set_failed(self, segno: int, attempts: int, error: str) -> None:
        """Replaced whole (a temp file renamed over it): the archiver is stopped at close,
        and a file it was writing then would read as failing with no error."""
        path = self._file(segno, "error")
        with open(path + ".tmp", "w") as f:
            json.dump({"attempts": attempts, "error": error, "time": time.time()}, f)
        os.replace(path + ".tmp", path)

    def forget(self, segno: int) -> None:
        """``segno`` left the WAL (truncated): its status goes with it."""
        for kind in ("done", "ready", "error"):
            self._remove(segno, kind)

    def _remove(self, segno: int, kind: str) -> None:
        try:
            os.unlink(self._file(segno, kind))
        except FileNotFoundError:
            pass

    def entries(self) -> dict[str, list[int]]:
        """The segment numbers with each kind of status file, in order."""
        out: dict[str, list[int]] = {"ready": [], "done": [], "error": []}
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return out
        for name in names:
            base, _, kind = name.rpartition(".")
            segno = parse_segment_name(base)
            if segno is not None and kind in out:
                out[kind].append(segno)
        return {kind: sorted(v) for kind, v in out.items()}

    def failure(self, segno: int) -> dict | None:
        try:
            with open(self._file(segno, "error")) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    def summary(self, segment_size: int) -> dict:
        """Counts of ready, done and failed segments, the oldest unarchived one and the
        last error: what ``pmemwal archive-status`` shows."""
        e = self.entries()
        oldest = e["ready"][0] if e["ready"] else None
        ready = set(e["ready"])
        failed = [s for s in e["error"] if s in ready]
        last = max((f for f in (self.failure(s) for s in failed) if f),
                   key=lambda f: f.get("time", 0), default=None)
        return {"ready": len(e["ready"]), "done": len(e["done"]), "failed": len(failed),
                "oldest_unarchived": segment_name(oldest) if oldest is not None else None,
                "pending_bytes": len(e["ready"]) * segment_size,
                "last_error": last["error"] if last else None,
                "attempts": last["attempts"] if last else 0}
