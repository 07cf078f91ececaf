"""Mutants: known persistence bugs put back into pmemwal, for showing that a checker catches them.

A crash checker is only as good as the bugs it catches that it was not written for.  Each
mutant here is one plausible bug (a sync dropped, an order swapped, a guard lost), put into
the library by patching it in this process (``applied``), or, for the native core, by the
traced core's ``TRACE_*`` bits (pmemwal.tools.traced).  The suite holds each one against the
checker meant to catch it (tests/test_mutants.py and the checkers' own tests), and
``python -m pmemwal.tools.mutants`` runs the shipped checkers at their default sizes against
every mutant and says which caught it.

``PMEMWAL_MUTANT=NAME`` puts a mutant into a checker's run (``pmemwal powerloss``,
``pmemwal torture``) and into the children it starts: the torture child and the traced
power-loss child apply it as they start.  Never set it outside such a run.

Registering one::

    @mutant("checkpoint-before-sync", "a background checkpoint names what is not yet synced",
            blind_spot="background writer", caught_by="powerloss --setups msync-background")
    def _checkpoint_before_sync():
        ...patch, then yield, then undo (a generator, as contextlib.contextmanager takes)...
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

ENV = "PMEMWAL_MUTANT"


@dataclass(frozen=True)
class Mutant:
    """One bug put back: ``patch()`` is a context manager that puts it in and takes it out."""

    name: str
    description: str
    patch: Callable[[], ContextManager[None]]
    blind_spot: str = ""      # the checker's blind spot that hid it, if one did
    caught_by: str = ""       # the checker run (a command line) meant to catch it
    core_bits: str = ""       # traced-core TRACE_* bit names it sets (pmemwal.tools.traced)


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, description: str, *, blind_spot: str = "", caught_by: str = "",
           core_bits: str = "") -> Callable[[Callable[[], Iterator[None]]], Callable[[], Iterator[None]]]:
    """Register a generator function (patch, yield, undo) as the mutant ``name``."""
    def register(fn: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
        if name in MUTANTS:
            raise ValueError(f"mutant {name!r} registered twice")
        MUTANTS[name] = Mutant(name, description, contextlib.contextmanager(fn), blind_spot,
                               caught_by, core_bits)
        return fn
    return register


def get(name: str) -> Mutant:
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}: one of {', '.join(sorted(MUTANTS))}") from None


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Mutant ``name`` put in for the ``with`` body (nothing when None)."""
    if not name:
        yield
        return
    with get(name).patch():
        yield


def apply_from_environment() -> None:
    """Put in the mutant ``PMEMWAL_MUTANT`` names, for the rest of this process (a checker's
    child process calls this as it starts)."""
    name = os.environ.get(ENV)
    if name:
        patch = get(name).patch()
        patch.__enter__()
        _APPLIED.append(patch)  # (dropped, its generator would be closed: the patch undone)


_APPLIED: list[ContextManager[None]] = []


# ---- mutants the checkers caught before (ported from their tests) -------------------------


# ---- blind spot 1: the background writer --------------------------------------------------


@mutant("background-checkpoint-before-msync",
        "a direct-mode WAL's background round writes its due checkpoint, at the insert "
        "position, before the flush that makes the records below it durable (the records "
        "are in the mapping, visible to any reader and to a killed writer's successor: "
        "taken for durable, an order swapped)",
        blind_spot="background writer",
        caught_by="pmemwal powerloss --setups msync-background --images 300")
def _background_checkpoint_before_msync() -> Iterator[None]:
    from pmemwal.wal.rounds import BackgroundRounds
    original = BackgroundRounds._flush_async

    def flush_async(self: BackgroundRounds) -> None:  # rounds.py's, the checkpoint moved up
        if not self._direct:
            return original(self)
        if self._closed or self._core.error:
            return
        if self._control is not None:
            self._core.reap_dead()
        if not self._truncating():
            self._check_segments()
        position = self._core.position()
        self._background_checkpoint(position, position[0])  # "in the mapping already"
        if position[0] != self._core.flushed_lsn:
            self._core.flush_ready()
        if self._archiver is not None:
            self._archiver.tick(self._oldest_segment(), self._core.flushed_lsn)

    BackgroundRounds._flush_async = flush_async  # type: ignore[method-assign]
    try:
        yield
    finally:
        BackgroundRounds._flush_async = original  # type: ignore[method-assign]


# ---- blind spot 2: concurrent writers in the page-cache modes -----------------------------


@mutant("commit-syncs-own-record",
        "a commit (append(flush=True)) in msync or buffered mode syncs from the flushed "
        "position to its own record's end, yet publishes as flushed everything complete below "
        "the frontier: other writers' records past it are acknowledged unsynced (a lone "
        "writer's record always ends at the frontier)",
        blind_spot="concurrent writers in the page-cache modes",
        caught_by="pmemwal powerloss --setups msync-threads --images 200",
        core_bits="TRACE_SYNC_OWN_RECORD")
def _commit_syncs_own_record() -> Iterator[None]:
    # A native mutant: only the traced core carries it, in the checker's children
    # (pmemwal.tools.traced reads the variable as each child starts).
    before = os.environ.get(ENV)
    os.environ[ENV] = "commit-syncs-own-record"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


# ---- blind spot 3: files other than segments, older and partial versions ------------------

@mutant("index-chunk-unsynced", "an index checkpoint writes its chunk slots (the Log's "
        "index/*.lidx, eventsourcing's rows) without their fdatasync: the LOG slot written "
        "after it names entries whose LSNs a power cut may leave as zeros",
        blind_spot="files other than segments",
        caught_by="pmemwal powerloss --setups buffered-log; pmemwal powerloss --fs-model ext4")
def _index_chunk_unsynced() -> Iterator[None]:
    from pmemwal import chunked
    real = chunked.ChunkedColumn.write

    def write(self, start, items):  # ChunkedColumn.write, its fdatasync left out
        data = chunked.np.ascontiguousarray(items, self.dtype).view(chunked.np.uint8).data
        size, entered = self.dtype.itemsize, []
        with chunked.storage_errors(f"writing {self.path}"):
            chunked.make_directories(self.path)
            done = 0
            while done < len(items):
                chunk, off = divmod(start + done, chunked.CHUNK)
                n = min(len(items) - done, chunked.CHUNK - off)
                fd = os.open(self.file(chunk), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    if os.fstat(fd).st_size != self.file_size:
                        os.ftruncate(fd, self.file_size)
                    os.pwrite(fd, data[done * size:(done + n) * size], off * size)
                finally:
                    os.close(fd)
                if chunk not in self._entered:
                    entered.append(chunk)
                done += n
            if entered:
                chunked.sync_directory(self.path)
                self._entered.update(entered)

    chunked.ChunkedColumn.write = write  # type: ignore[method-assign]
    try:
        yield
    finally:
        chunked.ChunkedColumn.write = real  # type: ignore[method-assign]


@mutant("es-run-unsynced", "an eventsourcing index checkpoint writes its run files (key "
        "pairs, found by hash) without their fdatasync, taking the directory sync after them "
        "for enough: the manifest then names a run a power cut may leave its size with pages "
        "of zeros, and select_events misses the events they held",
        blind_spot="files other than segments",
        caught_by="pmemwal powerloss --fs-model ext4")
def _es_run_unsynced() -> Iterator[None]:
    from pmemwal.integrations import es_index
    real = es_index.write_run

    def write_run(path, hashes, a, b):  # es_index.write_run, _write_file's fdatasync left out
        parts = [es_index._RUN_HEADER.pack(es_index.RUN_MAGIC, len(hashes))] + [
            es_index.np.ascontiguousarray(column, dtype).view(es_index.np.uint8)
            for column, dtype in ((hashes, "<u8"), (a, "<i8"), (b, "<i8"))]
        with es_index.storage_errors(f"writing {path}"):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for part in parts:
                    data = memoryview(part).cast("B")  # type: ignore[arg-type]
                    while data:
                        data = data[os.write(fd, data):]
            finally:
                os.close(fd)

    es_index.write_run = write_run
    try:
        yield
    finally:
        es_index.write_run = real


# ---- blind spot 4: a crash during recovery, then a second recovery ------------------------


# ---- blind spot 5: a second file system ---------------------------------------------------


@mutant("archive-rename-unsynced",
        "FsspecArchive.store renames its .partial copy into place in a file:// archive without "
        "syncing the archive's directory: the rename waits on the next sync there, while the "
        "WAL directory's .done (synced on its own file system) lets truncation take the segment",
        blind_spot="a second file system",
        caught_by="pmemwal powerloss --fs-model ext4")
def _archive_rename_unsynced() -> Iterator[None]:
    import sys

    from pmemwal import archive

    fsync_path = archive.fsync_path

    def fsync_unless_the_archive_directory(path: str) -> None:
        # (the store's sync of its own directory: the one after the rename into place)
        if sys._getframe(1).f_code.co_name == "store" and os.path.isdir(path):
            return
        fsync_path(path)

    archive.fsync_path = fsync_unless_the_archive_directory
    try:
        yield
    finally:
        archive.fsync_path = fsync_path
