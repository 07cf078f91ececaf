"""Mutants: known persistence bugs put back into pmemwal, for showing that a checker catches them.

A crash checker is only as good as the bugs it catches that it was not written for.  Each
mutant here is one plausible bug (a sync dropped, an order swapped, a guard lost), put into
the library by patching it in this process (``applied``), or, for the native core, by the
traced core's ``TRACE_*`` bits (pmemwal.tools.traced).  The suite holds each one against the
checker meant to catch it (tests/test_mutants.py and the checkers' own tests), and
``python -m pmemwal.tools.mutant_runner`` runs the shipped checkers at their default sizes against
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


_kept: list[ContextManager[None]] = []  # mutants in for good (a generator's patch, once
                                        # collected, would be closed: undone)


def apply(name: str) -> None:
    """Put mutant ``name`` in for the rest of this process."""
    patch = get(name).patch()
    patch.__enter__()
    _kept.append(patch)


def apply_from_environment() -> None:
    """Put in the mutant ``PMEMWAL_MUTANT`` names, for the rest of this process (a checker's
    child process calls this as it starts)."""
    name = os.environ.get(ENV)
    if name:
        apply(name)


# ---- mutants the checkers caught before (ported from their tests) -------------------------

# What the default runs catch each with is the runner's to say (python -m pmemwal.tools.mutant_runner);
# caught_by names the smallest run of a shipped checker that catches it, as its test runs it.

_active_core_bits: list[str] = []   # TRACE_* names of the core mutants in (see core_mask)


def core_mask() -> int:
    """The traced core's ``TRACE_*`` bits of the core mutants in now (0 when none)."""
    if not _active_core_bits:
        return 0
    from pmemwal import _core
    mask = 0
    for bit in _active_core_bits:
        mask |= getattr(_core, bit)
    return mask


def _core_mutant(name: str, description: str, bit: str, caught_by: str,
                 blind_spot: str = "") -> None:
    """A bug of the native core, put in by its traced build's ``bit`` (no patch of Python
    can reach it).  On the regular core it goes into the traced children this process
    starts (``PMEMWAL_MUTANT``: the checker runs them), and nowhere else."""
    def patch() -> Iterator[None]:
        from pmemwal import _core
        if _core.TRACED:
            _active_core_bits.append(bit)
            try:
                yield
            finally:
                _active_core_bits.remove(bit)
            return
        before = os.environ.get(ENV)
        os.environ[ENV] = name
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = before
    mutant(name, description, caught_by=caught_by, core_bits=bit, blind_spot=blind_spot)(patch)


@contextlib.contextmanager
def _replaced(owner: object, attr: str, new: object) -> Iterator[None]:
    """``owner.attr`` replaced by ``new``, and so is every copy a loaded pmemwal module took
    by ``from ... import`` (a checker may call the library through one)."""
    import sys
    old = getattr(owner, attr)
    own = attr in vars(owner)  # (else inherited: the base's stays, the override goes)
    copies = [m for name, m in list(sys.modules.items())
              if name.startswith("pmemwal") and m is not owner and getattr(m, attr, None) is old]
    for target in (owner, *copies):
        setattr(target, attr, new)
    try:
        yield
    finally:
        for target in copies:
            setattr(target, attr, old)
        if own:
            setattr(owner, attr, old)
        else:
            delattr(owner, attr)


_core_mutant("skip-stream-fence", "no sfence after the core's streaming stores (caught where "
             "pmem_drain is empty: libpmem's CLFLUSH configuration)", "TRACE_SKIP_STREAM_FENCE",
             "pmemwal powerloss --setups pmem-clflush --images 60 --seed 1")
_core_mutant("skip-drain", "neither pmem_drain nor the sfence after an insertion", "TRACE_SKIP_DRAIN",
             "pmemwal powerloss --setups pmem --images 60 --seed 1")
_core_mutant("skip-sync", "no fdatasync or msync of a segment", "TRACE_SKIP_SYNC",
             "pmemwal powerloss --setups buffered --images 40 --seed 1")
_core_mutant("short-msync", "each msync leaves out its range's last page", "TRACE_SHORT_MSYNC",
             "pmemwal powerloss --setups msync --images 80 --seed 1")


@mutant("no-recovery-sync", "an open does not sync the records it recovered (a reopen after a "
        "kill takes page-cache records for durable)",
        caught_by="pmemwal powerloss --setups msync-kill --images 200 --seed 1")
def _no_recovery_sync() -> Iterator[None]:
    from pmemwal import wal
    with _replaced(wal.WAL, "_persist_recovered", lambda self, start, end: None):
        yield


@mutant("reopen-loses-last-record", "an open after a kill destroys the last record it recovered "
        "(its header zeroed)",
        caught_by="pmemwal powerloss --setups msync-kill --images 150 --seed 16")
def _reopen_loses_last_record() -> Iterator[None]:
    from pmemwal import wal
    persist_recovered = wal.WAL._persist_recovered

    def losing(self, start: int, end: int) -> None:
        _, last = self._core.position()
        if os.path.basename(self._dir.path) == "wal" and last:  # (the workload's: not an image's)
            fd = os.open(self._dir.file(last // self.segment_size), os.O_RDWR)
            try:
                os.pwrite(fd, bytes(8), last % self.segment_size)
            finally:
                os.close(fd)
        persist_recovered(self, start, end)
    with _replaced(wal.WAL, "_persist_recovered", losing):
        yield


@mutant("recycle-keeps-header", "a recycled segment keeps its old header",
        caught_by="pmemwal powerloss --setups pmem --images 100 --seed 1")
def _recycle_keeps_header() -> Iterator[None]:
    from pmemwal import segments

    def recycle(self, old, new, segment_size, wal_id, fd=-1, spare=False):
        os.rename(self.file(old), self.file(new))
        self.sync()
    with _replaced(segments.WalDirectory, "recycle", recycle):
        yield


@mutant("recycle-without-first-sync", "a recycle leaves out the directory sync after its first "
        "rename (old name to .tmp): the old name can outlive the new header",
        caught_by="pmemwal powerloss --fs-model ext4 --images 150 --seed 1")
def _recycle_without_first_sync() -> Iterator[None]:
    from pmemwal import segments
    from pmemwal.format import SegmentHeader

    def recycle(self, old, new, segment_size, wal_id, fd=-1, spare=False):
        path = self.file(new)
        tmp = path + ".tmp"
        with segments.storage_errors(f"recycling {self.file(old)}"):
            os.rename(self.file(old), tmp)
            own = fd < 0
            if own:
                fd = os.open(tmp, os.O_RDWR)
            try:
                header = SegmentHeader(new, segment_size, wal_id, spare, old if spare else None)
                os.pwrite(fd, header.pack(), 0)
                os.fdatasync(fd)
            finally:
                if own:
                    os.close(fd)
            os.rename(tmp, path)
            self.sync()
    with _replaced(segments.WalDirectory, "recycle", recycle):
        yield


@mutant("recycle-header-first", "a recycle writes (and syncs) the new header before its renames "
        "are durable", caught_by="pmemwal powerloss --fs-model xfs --images 150 --seed 1")
def _recycle_header_first() -> Iterator[None]:
    from pmemwal import segments
    from pmemwal.format import SegmentHeader

    def recycle(self, old, new, segment_size, wal_id, fd=-1, spare=False):
        own = fd < 0
        if own:
            fd = os.open(self.file(old), os.O_RDWR)
        try:
            header = SegmentHeader(new, segment_size, wal_id, spare, old if spare else None)
            os.pwrite(fd, header.pack(), 0)
            os.fdatasync(fd)
        finally:
            if own:
                os.close(fd)
        os.rename(self.file(old), self.file(new) + ".tmp")
        self.sync()
        os.rename(self.file(new) + ".tmp", self.file(new))
        self.sync()
    with _replaced(segments.WalDirectory, "recycle", recycle):
        yield


@mutant("control-from-unsynced-segments", "the first opener of a shared WAL rebuilds CONTROL "
        "from segments whose renames it never synced (the directory syncs of WAL._open and "
        "_make_segments left out)",
        # (a CLI run's shared workload kills too few writers: 0 at seed 0, 1 at seed 2)
        caught_by="pmemwal powerloss --fs-model ext4")
def _control_from_unsynced_segments() -> Iterator[None]:
    import sys
    from pmemwal import segments
    sync = segments.WalDirectory.sync

    def sync_unless_opening(self):
        if sys._getframe(1).f_code.co_name not in ("_open", "_make_segments"):
            sync(self)
    with _replaced(segments.WalDirectory, "sync", sync_unless_opening):
        yield


@mutant("archive-partial-unsynced", "an archive copy renamed into place without the fsync of "
        "its .partial file", caught_by="pmemwal powerloss --fs-model ext4 --images 120 --seed 1")
def _archive_partial_unsynced() -> Iterator[None]:
    from pmemwal import archive
    fsync_path = archive.fsync_path
    with _replaced(archive, "fsync_path",
                   lambda path: None if path.endswith(".partial") else fsync_path(path)):
        yield


@mutant("done-before-upload", "the archiver marks a segment .done before it uploads it",
        caught_by="pmemwal powerloss --fs-model ext4 --images 150 --seed 1")
def _done_before_upload() -> Iterator[None]:
    from pmemwal import archive, archiver
    from pmemwal.format import segment_name

    def done_before_upload(status, store, wal_dir, attempts, report):
        for segno in status.entries()["ready"]:
            name = segment_name(segno)
            status.set_done(segno)
            crc, size = archive.file_crc(os.path.join(wal_dir, name))
            store.store(os.path.join(wal_dir, name), name, crc, size)
        return True
    with _replaced(archiver, "archive_ready", done_before_upload):
        yield


@mutant("drop-every-fifth-record", "recovery (WAL.records) leaves out every fifth record",
        caught_by="pmemwal powerloss --setups buffered --images 30 --seed 3")
def _drop_every_fifth_record() -> Iterator[None]:
    from pmemwal import wal
    real = wal.WAL.records

    def dropping(self, start=None):
        for i, record in enumerate(real(self, start)):
            if i % 5 != 4:
                yield record
    with _replaced(wal.WAL, "records", dropping):
        yield


@mutant("recovery-skips-records", "recovery (WAL.records) skips the last record of each writer "
        "thread's run that another record follows: a gap no LSN order shows",
        caught_by="pmemwal torture --rounds 2 --threads 2 --rounds-per-dir 2")
def _recovery_skips_records() -> Iterator[None]:
    from pmemwal import wal
    from pmemwal.tools.torture.records import parse_record
    real = wal.WAL.records

    def skipping(self, start=None):
        records = list(real(self, start))
        last_of = {}
        for i, record in enumerate(records):
            ident = parse_record(bytes(record.payload))
            if ident:
                last_of[ident[:2]] = i
        dropped = {i for i in last_of.values() if i < len(records) - 1}
        return (r for i, r in enumerate(records) if i not in dropped)
    with _replaced(wal.WAL, "records", skipping):
        yield



# ---- the background writer: its checkpoints, flushes and segments made ahead ----------------


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


# ---- concurrent writers in the page-cache modes: group commit -----------------------------


_core_mutant("commit-syncs-own-record",
             "a commit (append(flush=True)) in msync or buffered mode syncs from the flushed "
             "position to its own record's end, yet publishes as flushed everything complete "
             "below the frontier: other writers' records past it are acknowledged unsynced (a "
             "lone writer's record always ends at the frontier)", "TRACE_SYNC_OWN_RECORD",
             "pmemwal powerloss --setups msync-threads --images 200",
             blind_spot="concurrent writers in the page-cache modes")


# ---- followers in other processes: what the writers publish -------------------------------


_core_mutant("publish-before-sync",
             "a flush in msync or buffered mode publishes its frontier to followers (the "
             "FOLLOW file's durable LSN) before its msync or fdatasync; the caller is still "
             "acknowledged after it, so every acknowledged record survives, but a power cut in "
             "the sync takes records a follower may have read", "TRACE_PUBLISH_EARLY",
             "pmemwal powerloss --setups msync-threads-follow --images 40 --seed 1",
             blind_spot="what followers were shown (the checkers hold images to what the "
             "calls acknowledged)")


# ---- files other than segments: older and partial versions --------------------------------

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
    from pmemwal.integrations.eventsourcing import stored_index
    real = stored_index.sync_run
    stored_index.sync_run = lambda fd: None     # (every run file: a checkpoint's, a merge's)
    try:
        yield
    finally:
        stored_index.sync_run = real


# ---- a crash during the recovery that cuts, then a second recovery ------------------------

@mutant("aside-synced-after-cut",
        "a cut's lost+found entry: its manifest written without fsync and its directories not "
        "synced, left to the entry's finish, which runs after the cut's zeroing is synced",
        blind_spot="a crash during recovery, then a second recovery",
        caught_by="pmemwal powerloss --fs-model ext4 (workload salvage)")
def _aside_synced_after_cut() -> Iterator[None]:
    from typing import Any

    from pmemwal import lostfound
    real_set_aside, real_write, real_sync = (lostfound.set_aside, lostfound.write_synced,
                                             lostfound.sync_directory)
    inside = [0]

    def write_synced(path: str, data: bytes, flags: int = os.O_EXCL) -> None:
        if not (inside[0] and path.endswith(lostfound.MANIFEST)):
            return real_write(path, data, flags)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def sync_directory(path: str) -> None:
        if not inside[0]:
            real_sync(path)

    def set_aside(*args: Any, **kwargs: Any) -> Any:
        inside[0] += 1
        try:
            return real_set_aside(*args, **kwargs)
        finally:
            inside[0] -= 1

    lostfound.set_aside, lostfound.write_synced, lostfound.sync_directory = (
        set_aside, write_synced, sync_directory)
    try:
        yield
    finally:
        lostfound.set_aside, lostfound.write_synced, lostfound.sync_directory = (
            real_set_aside, real_write, real_sync)


@mutant("unpend-before-cut",
        "a cut's lost+found entry stops being pending (CUTTING removed) before the cut's "
        "zeroing is written and synced, not after",
        blind_spot="a crash during recovery, then a second recovery",
        caught_by="pmemwal powerloss --fs-model ext4 (workload salvage)")
def _unpend_before_cut() -> Iterator[None]:
    from pmemwal import lostfound
    from pmemwal.recovery import Recovery
    real_wipe = Recovery._wipe_beyond

    def wipe(self: Recovery, end: int, pages: list[int]) -> None:
        for entry in lostfound._pending(self._dir.path, self._wal_id, end, end):
            lostfound._unpend(entry.path)
        real_wipe(self, end, pages)

    Recovery._wipe_beyond = wipe  # type: ignore[method-assign]
    try:
        yield
    finally:
        Recovery._wipe_beyond = real_wipe  # type: ignore[method-assign]



# ---- segment files' own writes ----------------------------------------------------------


@mutant("arm-without-sync",
        "a spare segment armed (its header rewritten without SPARE) with no fdatasync "
        "(segments.py:356 left out): records stored into it and synced by msync of their "
        "own range can be durable under a header that still says spare, which recovery "
        "passes by",
        blind_spot="segment headers written by Python taken as durable: the power-loss "
        "shadow tracked an armed (created, recycled) file as synced without looking "
        "(shadow.py _follow); now it counts only a sync it saw.  In the page-cache modes "
        "the first msync (or fdatasync) of the segment covers its header page too: pmem only",
        caught_by="pmemwal powerloss --setups pmem")
def _arm_without_sync() -> Iterator[None]:
    from pmemwal import segments
    from pmemwal.format import HEADER_SIZE, SegmentHeader

    def arm(self: Any, segno: int, segment_size: int, wal_id: bytes, fd: int) -> None:
        with segments.storage_errors(f"writing the header of {self.file(segno)}"):
            header = SegmentHeader(segno, segment_size, wal_id, self.header_flags(),
                                   cuts=self.cuts)
            os.pwrite(fd, header.pack()[:HEADER_SIZE], 0)
    with _replaced(segments.WalDirectory, "arm", arm):
        yield


@mutant("create-header-unsynced",
        "a new segment renamed into place without the fdatasync of its .tmp file "
        "(segments.py:310 left out): its header, and with fallocate its size, wait on the "
        "page cache while records are acknowledged in it by msync of their own range",
        blind_spot="segment headers written by Python taken as durable (as arm-without-sync)",
        caught_by="pmemwal powerloss --setups msync")
def _create_header_unsynced() -> Iterator[None]:
    from pmemwal import segments

    def create(self: Any, segno: int, segment_size: int, wal_id: bytes, zero_fill: bool = False,
               flags: int | None = None, spare: bool = False) -> None:  # its fdatasync left out
        flags = self.header_flags() if flags is None else flags
        path = self.file(segno)
        tmp = path + ".tmp"
        with segments.storage_errors(f"creating {path}"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if zero_fill:
                    offset = 0
                    while offset < segment_size:
                        offset += os.pwrite(fd, segments._ZEROS[:segment_size - offset], offset)
                else:
                    os.posix_fallocate(fd, 0, segment_size)
                header = segments.SegmentHeader(
                    segno, segment_size, wal_id,
                    flags | (segments.SPARE if spare else 0), cuts=self.cuts)
                os.pwrite(fd, header.pack(), 0)
            except OSError:
                os.unlink(tmp)
                raise
            finally:
                os.close(fd)
            os.rename(tmp, path)
            self.sync()
    with _replaced(segments.WalDirectory, "create", create):
        yield


# ---- a crash during a put-back ------------------------------------------------------------

@mutant("putback-marker-unsynced",
        "a put-back's RESTORING marker renamed into place without the sync of the entry's "
        "directory (putback.py:194 left out): a crash after the records are appended and "
        "flushed, before the entry goes, can lose the marker, and the repeat appends them all "
        "again",
        blind_spot="a crash during a put-back: the salvage workload put entries back "
        "with no crash point inside (it now records them), power-loss images take metadata "
        "for durable in order, the torture makes no put-back",
        caught_by="pmemwal powerloss --fs-model ext4")
def _putback_marker_unsynced() -> Iterator[None]:
    from pmemwal import lostfound, putback

    def write_synced_over(path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        lostfound.write_synced(tmp, data, os.O_TRUNC)
        os.rename(tmp, path)
    with _replaced(putback, "_write_synced_over", write_synced_over):
        yield


# ---- a second file system ---------------------------------------------------------------


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

