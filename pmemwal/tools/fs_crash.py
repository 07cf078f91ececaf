"""File-system metadata crash states: what a power cut leaves of creates, renames and syncs.

Concern: a model of the file system's *metadata* persistence and the driver that
enumerates its crash states over live WAL workloads.  The
power-loss simulator (powerloss.py) takes every create, fallocate, rename, unlink,
``CONTROL``, ``archive_status/`` marker and restore step for atomic and in order;
this module does not.  It follows ALICE's abstract persistence model (Pillai et
al., "All File Systems Are Not Created Equal: On the Complexity of Crafting
Crash-Consistent Applications", OSDI 2014) and CrashMonkey's (Mohan et al.,
"Finding Crash-Consistency Bugs with Bounded Black-Box Crash Testing", OSDI 2018):
record the program's file-system calls, then build every state the file system
may leave at each point and run recovery on it.

- **Metadata model and recording**: pmemwal.tools.fs_model.
- **Content model.**  A file's durable data is what it held at its last fsync or
  fdatasync.  Segment data the native core writes (pwrite in buffered mode, stores
  through the mapping in direct mode) and syncs is not seen by the wrappers: as in
  shadow.DurableShadow, every segment's current bytes become durable when a
  workload step that flushed returns, and before a ``CHECKPOINT`` slot is synced
  (the WAL writes one only once what it names is durable: taken as given here).
  With the background writer on (``background``), its flushes are unseen too, and
  what the workload acknowledged counts for a crash state only once its step's
  segments were settled (a crash point in the writer's thread may fall in between).  Each crash state takes, for all its files, the
  durable data ("old") or the current data ("new"), cut or zero-extended to the size
  the metadata prefix gives; under xfs the old data comes twice, with appended ranges
  as written and as zeros.  Besides, where a file other than a segment was written since
  its last sync, a few states are drawn in which each such file takes its own outcome: old,
  new, a version between, or a mix of those per page or sector (fs_model).
- **Checks.**  Each distinct state (hash of names and contents) is materialised and
  recovered: ``pmemwal.open(..., create=False, mode="buffered", background=False)``
  with powerloss.check_image's checks (every acknowledged record back, by content and
  LSN order; nothing that was not written at its LSN); a shared WAL also through
  ``shared=True`` (CONTROL rebuilt); the archive's segments must hold every acknowledged
  record the WAL no longer has; a restore cut short must refuse to open
  (``RESTORING``), and a finished one hold exactly what a reference restore holds.  A
  typed refusal (a ``WALError``) where nothing was lost counts as a failure too: a
  power cut must never leave a WAL that does not open.  The ``log`` workload's states are
  opened with ``open_log`` (its stored index taken when it fits) and held against
  powerloss.LogWorkload's LogModel; the ``eventsourcing`` workload's with ``open_datastore``:
  every acknowledged event back by its aggregate and by its notification ID.

``run_fs_crash`` is the driver; ``pmemwal powerloss --fs-model ext4|xfs`` its command line.
The ``salvage`` workload (fs_salvage.py) has a driver of its own: crashes inside a recovery
that cuts and sets aside, each state recovered again and its lost+found checked.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import traceback
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import pmemwal
from pmemwal.tools.recovery_warnings import recovery_warnings
from pmemwal.archive import ArchiveStatus, FsspecArchive
from pmemwal.archiver import Archiver, archive_ready
from pmemwal.errors import FormatError, NotFoundError, WALError
from pmemwal.format import HEADER_SIZE, SegmentHeader, parse_segment_name, segment_name
from pmemwal.segments import RESTORING_NAME
from pmemwal.tools import restore as _restore
from pmemwal.tools.fs_model import CrashState, Killed, MetadataModel, Recorder
from pmemwal.tools.fs_report import FsCrashReport
from pmemwal.tools.powerloss import (LogWorkload, Workload, _default_dir, _write_image,
                                     check_image, payload)
from pmemwal.tools.shadow import Image

WORKLOADS = ("growth", "truncate", "recycle", "shared", "archive", "restore", "log",
             "eventsourcing", "background", "salvage")
METADATA_WORKLOADS = ("growth", "truncate", "recycle", "shared", "archive",
                      "background")  # and restore
SEGMENT_SIZE = 1 << 20            # the smallest allowed: many file operations per record
MAX_SEGMENTS = 4                  # truncate beyond this
ROUNDS_PER_WAL = 160              # workload steps before a fresh WAL (keeps states small)
KILL_RATE = 0.9                   # shared: chance that a truncation's writers are killed mid-way
PER_FILE_STATES = 4               # drawn at each crash point where a file has several versions
INDEX_CHECKPOINT_RATE = 0.15      # log, eventsourcing: chance of an index checkpoint after a step
ORIGINATORS = 24                  # eventsourcing: aggregates the events go to


# ---- checks ---------------------------------------------------------------------------------

def _verdict_of_error(exc: BaseException, acked: int) -> tuple[str, str]:
    if not isinstance(exc, WALError):
        return "untyped", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    if isinstance(exc, NotFoundError) and acked == 0:
        return "ok", ""  # no WAL yet, and nothing promised
    return "refused", f"{type(exc).__name__}: {exc}"


def _wal_image(state: CrashState, prefix: str, acked: int, where: str,
               others: bool = True) -> Image:
    """The files of ``prefix``/ as a power-loss Image (segments by number, the rest by name,
    unless not ``others``)."""
    segments, files = {}, {}
    for name, data in state.files.items():
        head, _, base = name.rpartition("/")
        if head != prefix:
            continue
        segno = parse_segment_name(base)
        if segno is not None:
            segments[segno] = data
        elif others:
            files[base] = data
    return Image(segments, acked, 0, where, files)


def _without_checkpointed(data: bytes, segno: int) -> bytes:
    """A segment's bytes with its header's CHECKPOINTED flag cleared (pmemwal/format.py)."""
    if len(data) < HEADER_SIZE:
        return data
    try:
        header = SegmentHeader.unpack(data[:HEADER_SIZE], segment_name(segno))
    except FormatError:
        return data  # (open judges it)
    cleared = SegmentHeader(header.segno, header.segment_size, header.wal_id)
    return cleared.pack()[:HEADER_SIZE] + data[HEADER_SIZE:]


def check_wal_state(state: CrashState, work: Workload, directory: Path, where: str,
                    shared: bool = False) -> tuple[str, str]:
    """powerloss.check_image on the state's WAL; a shared WAL is opened shared too."""
    acked = work.acked()
    image = _wal_image(state, "wal", acked, where)
    try:
        verdict, detail = check_image(image, work, directory)
    except BaseException as exc:  # (check_image catches WALError only)
        return _verdict_of_error(exc, acked)
    if verdict == "error":
        return ("ok", "") if acked == 0 and "create=False" in detail else ("refused", detail)
    if verdict == "bad":
        verdict = "stale"
    if verdict in ("ok", "beyond") and shared:
        return _check_shared_open(image, directory, acked)
    return ("ok" if verdict == "beyond" else verdict), detail


def _check_shared_open(image: Image, directory: Path, acked: int) -> tuple[str, str]:
    """Opened shared (the first process rebuilds CONTROL from what it finds)."""
    _write_image(image, directory)
    try:
        with pmemwal.open(directory, create=False, shared=True, mode="direct",
                          background=False) as wal:
            end = wal.insert_lsn
    except BaseException as exc:
        return _verdict_of_error(exc, acked)
    if end < acked:
        return "lost", f"opened shared, it ends at {end:#x}; {acked:#x} had been acknowledged"
    return "ok", ""


@dataclass
class _Archived:
    """The ledger the archive's records are held to: the WAL's, none truncated."""

    seed: int
    lsn_of: dict[int, int]
    promise: str
    truncated_to: int
    wal: pmemwal.WAL


def check_archive_state(state: CrashState, work: Workload, directory: Path,
                        where: str) -> tuple[str, str]:
    """Every segment marked ``.done`` is in the archive's state, whole (a reopen would let
    truncation take it), and every acknowledged record the WAL's state no longer holds is
    in the archive's."""
    status = "wal/archive_status/"
    for name in state.files:
        if name.startswith(status) and name.endswith(".done"):
            segment = name[len(status):-len(".done")]
            copy = state.files.get("archive/" + segment)
            if copy is None or len(copy) != work.wal.segment_size or not _is_segment(copy, segment):
                return "lost", (f"{name[len(status):]} is durable, but the archive holds "
                                f"{'no copy' if copy is None else 'no whole copy'} of its segment")
    present = [s for name in state.files if name.startswith("wal/")
               and (s := parse_segment_name(name[4:])) is not None]
    below = min(present) * work.wal.segment_size if present else 0
    starts = [lsn for lsn in list(work.lsn_of.values()) if lsn < min(below, work.acked())]
    if len(starts) < 2:
        return "ok", ""
    # the last record below may run into the WAL's first segment: not the archive's to hold
    need = max(starts)
    image = _wal_image(state, "archive", need, where, others=False)  # (not .partial)
    # read every record from the oldest, as a restore does: archived segments come without
    # the WAL's CHECKPOINT, which their headers say it kept (a restore writes one), so they
    # are opened as a WAL made before checkpoints
    image.segments = {segno: _without_checkpointed(data, segno)
                      for segno, data in image.segments.items()}
    ledger = _Archived(work.seed, work.lsn_of, work.promise, 0, work.wal)
    verdict, detail = check_image(image, ledger, directory)
    if verdict in ("ok", "beyond"):
        return "ok", ""
    return ("stale" if verdict == "bad" else "lost"), f"the archive: {detail}"


# ---- workloads -------------------------------------------------------------------------------

class FsWorkload:
    """A WAL workload under the recorder: ``step`` runs one operation (crash points fall
    inside it), ``check`` recovers one crash state."""

    options: dict = {}
    mounts: tuple[str, ...] = ()  # directories under the root that are file systems of their own

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        self.root, self.seed, self.recorder = root, seed, recorder
        self.kills = 0
        self.work = Workload(self._open(), seed)

    def _open(self) -> pmemwal.WAL:
        return pmemwal.open(self.root / "wal", mode="buffered", segment_size=SEGMENT_SIZE,
                            background=False, prepare_segments=0, **self.options)

    def step(self, rng: random.Random) -> None:
        flushed = self.work.step(rng)
        if flushed:
            self.recorder.settle_segments()
        self.retain(rng)

    def retain(self, rng: random.Random) -> None:
        """Truncate as a checkpointer would (subclasses)."""

    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]:
        return check_wal_state(state, self.work, directory, where)

    @property
    def written(self) -> int:
        return self.work.written

    def close(self) -> None:
        self.work.close()


class GrowthWorkload(FsWorkload):
    """Appends and flushes: new segments (zero-filled, renamed into place)."""

    options = {"recycle_segments": 0}


class TruncateWorkload(FsWorkload):
    """Truncation that removes segments: no spare is kept (max_wal_size leaves no room
    for any beside the retained ones, and recycle_segments asks for none)."""

    options = {"recycle_segments": 0, "max_wal_size": SEGMENT_SIZE}

    def retain(self, rng: random.Random) -> None:
        wal = self.work.wal
        if len(wal._segnos) > MAX_SEGMENTS or rng.random() < 0.05:
            self.work._truncate(wal, wal.flushed_lsn)


class RecycleWorkload(TruncateWorkload):
    """Truncation that recycles segments into future ones."""

    options = {"recycle_segments": 2, "max_wal_size": 1 << 30}


class SharedWorkload(TruncateWorkload):
    """A shared WAL (CONTROL) through two handles, in direct mode; now and then both
    writers are killed mid-truncation (a process crash: what they wrote stays in the page
    cache, their unsynced operations stay pending) and the WAL is opened again, the first
    handle rebuilding CONTROL from what it finds."""

    options = {"recycle_segments": 2}

    def _open(self) -> pmemwal.WAL:
        return self._open_shared()

    def _open_shared(self) -> pmemwal.WAL:
        return pmemwal.open(self.root / "wal", mode="direct", segment_size=SEGMENT_SIZE,
                            background=False, prepare_segments=0, prefault=False, shared=True,
                            **self.options)

    # Crash points seldom: the states come from many steps, so that many truncations run,
    # and writers killed amid them (the states a kill leaves are few and cheap).
    crash_rate = 0.01

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        super().__init__(root, seed, recorder)
        self.handles = [self.work.wal, self._open_shared()]

    def step(self, rng: random.Random) -> None:
        self.work.wal = self.handles[rng.random() < 0.5]
        super().step(rng)

    def retain(self, rng: random.Random) -> None:
        wal = self.work.wal
        if not (len(wal._dir.list_segments(tidy=False)) > MAX_SEGMENTS or rng.random() < 0.2):
            return
        if rng.random() < KILL_RATE:
            count = [rng.randrange(1, 4)]  # before the 1st, 2nd or 3rd directory sync

            def kill(where: str) -> bool:
                count[0] -= where.startswith("fsync in sync <")
                return count[0] == 0

            self.recorder.kill_at = kill
        try:
            self.work._truncate(wal, wal.flushed_lsn)
        except Killed:
            self._reopen()
        finally:
            self.recorder.kill_at = None

    def _reopen(self) -> None:
        """Both writers died: drop them as the kernel would, and open the WAL again."""
        self.kills += 1
        for wal in self.handles:
            wal._forsake()
            with wal._seg_lock:
                for seg in list(wal._segments.values()) + list(wal._read_cache.values()):
                    os.close(seg.fd) if seg.fd >= 0 else None
                    seg.fd = -1
            wal._dir.close()
        self.handles = [self._open_shared(), self._open_shared()]
        self.work.wal = self.handles[0]

    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]:
        return check_wal_state(state, self.work, directory, where, shared=True)

    def close(self) -> None:
        for wal in self.handles:
            wal.close()


class _SettledWorkload(Workload):
    """The wal workload whose acknowledgements count for the crash states once the segments
    were settled after them (``settled``): a crash point in another thread (the background
    writer's) may fall after a flush returned and before the step's settle."""

    settled = 0

    def acked(self) -> int:
        return self.settled


class BackgroundWorkload(RecycleWorkload):
    """The recycle workload with the WAL's background writer on: it makes (and arms)
    segments ahead, flushes what was appended without a flush, and writes a checkpoint
    every few milliseconds, so its creates, renames, header writes, CHECKPOINT slot writes
    and directory syncs are recorded and crashed at (marked "(background)"), between and
    amid the workload's own."""

    options = {"recycle_segments": 2, "max_wal_size": 1 << 30, "prepare_segments": 2,
               "background": True, "flush_interval": 0.005, "checkpoint_interval": 0.01}
    work: _SettledWorkload

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        self.root, self.seed, self.recorder = root, seed, recorder
        self.kills = 0
        self.work = _SettledWorkload(self._open(), seed)

    def _open(self) -> pmemwal.WAL:
        return pmemwal.open(self.root / "wal", mode="buffered", segment_size=SEGMENT_SIZE,
                            **self.options)

    def step(self, rng: random.Random) -> None:
        flushed = self.work.step(rng)
        with self.recorder.lock:  # (no crash point between the two)
            acked = self.work.acked_below
            if flushed:
                self.recorder.settle_segments()
            self.work.settled = acked
        self.retain(rng)


class ArchiveWorkload(TruncateWorkload):
    """Archiving to a local directory (file://, under the root: its files are modelled
    too), run in this process: the writer's status files (``.ready``) and the archiver's
    steps (upload, ``.partial`` renamed, ``.ready`` to ``.done``), then truncation, which
    keeps every segment not archived.  The archive is a file system of its own (a mount
    point): a sync in the WAL directory does not make its renames durable."""

    options = {"recycle_segments": 1}
    mounts = ("archive",)

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        super().__init__(root, seed, recorder)
        wal = self.work.wal
        self.archive = FsspecArchive(f"file://{root / 'archive'}")
        self.status = ArchiveStatus(str(root / "wal"))
        # the WAL's own Archiver decides what truncation may take; its process is not started
        self.archiver = wal._archiver = _Unstarted(
            str(root / "wal"), {"url": f"file://{root / 'archive'}"}, wal.segment_size,
            wal._segnos[0], 1 << 40, 1.0)

    def retain(self, rng: random.Random) -> None:
        wal = self.work.wal
        self.archiver.tick(wal._oldest_segment(), wal.flushed_lsn)
        if rng.random() < 0.5:
            archive_ready(self.status, self.archive, str(self.root / "wal"), {}, lambda e: None)
        super().retain(rng)

    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]:
        verdict = super().check(state, directory, where)
        if verdict[0] != "ok":
            return verdict
        return check_archive_state(state, self.work, directory, where)

    def close(self) -> None:
        self.work.wal._archiver = None
        super().close()


class _Unstarted(Archiver):
    """The WAL's Archiver, whose process never starts (the workload archives itself)."""

    def _wake(self) -> None:
        pass


class RestoreWorkload:
    """Restores from a file:// archive (made once, outside the root) into a new directory
    under the root, each to a random ``until``; crash points fall all through them."""

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        self.root, self.seed, self.recorder = root, seed, recorder
        self.kills = 0
        self.source = root.parent / "source"
        self.lsn_of = _make_archive(self.source, seed)
        self.n = 0
        self.dest: Path | None = None
        self.until: int | None = None
        self.expected: list[tuple[int, bytes]] = []
        archived = [s for name in os.listdir(self.source / "archive")
                    if (s := parse_segment_name(name)) is not None]
        # a record that starts below the last archived segment ends in the archive
        self.complete_below = max(archived) * SEGMENT_SIZE

    def step(self, rng: random.Random) -> None:
        lsns = sorted(self.lsn_of.values())
        until = rng.choice([None, None, rng.choice(lsns[1:]) + 8 * rng.randrange(0, 3)])
        with self.recorder.pause():
            ref = self.root.parent / "reference"
            shutil.rmtree(ref, ignore_errors=True)
            _restore.restore(ref, f"file://{self.source / 'archive'}", until=until)
            self.expected = _records(ref)
        self.n += 1
        self.until = until
        self.dest = self.root / f"r{self.n}"
        _restore.restore(self.dest, f"file://{self.source / 'archive'}", until=until)

    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]:
        if self.dest is None:
            return "ok", ""
        prefix = str(self.dest.relative_to(self.root))
        if prefix not in state.dirs:
            return "ok", ""   # nothing made yet, nothing promised
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for name, data in state.files.items():
            if name.startswith(prefix + "/"):
                target = directory / name[len(prefix) + 1:]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        for d in state.dirs:
            if d.startswith(prefix + "/"):
                (directory / d[len(prefix) + 1:]).mkdir(parents=True, exist_ok=True)
        cut_short = f"{prefix}/{RESTORING_NAME}" in state.files
        try:
            got = _records(directory)
        except BaseException as exc:
            if cut_short and isinstance(exc, WALError) and RESTORING_NAME in str(exc):
                return "expected", ""
            if isinstance(exc, NotFoundError) and not any(
                    n.startswith(prefix + "/") for n in state.files):
                return "expected", ""  # the restore had not begun: an empty directory
            return _verdict_of_error(exc, 1)
        if cut_short:
            return "refused", "a restore cut short opened (RESTORING is there)"
        problem = self._against_the_ledger(got)
        if problem:
            return problem
        if got != self.expected:
            missing = len(set(self.expected) - set(got))
            return ("lost" if missing else "stale"), (
                f"the restored WAL holds {len(got)} records, the restore {len(self.expected)}")
        return "ok", ""

    def _against_the_ledger(self, got: list[tuple[int, bytes]]) -> tuple[str, str] | None:
        """What a restore returns must be the archived WAL's records in order from its first,
        each as written at its LSN, none at or past ``until``, and all that start below it
        and below the last archived segment (a reference restore by the same code would
        share a bug of its own)."""
        ledger = sorted((lsn, index) for index, lsn in self.lsn_of.items())
        stop = min(self.until if self.until is not None else 1 << 63, self.complete_below)
        must = sum(1 for lsn, _ in ledger if lsn < stop)
        for k, (lsn, data) in enumerate(got):
            index = ledger[k][1] if k < len(ledger) else -1
            if k >= len(ledger) or ledger[k][0] != lsn or \
                    data != payload(self.seed, index, len(data)) or \
                    (self.until is not None and lsn >= self.until):
                wanted = f"{ledger[k][0]:#x}" if k < len(ledger) else "none"
                return "stale", (f"the restored record at LSN {lsn:#x} (its {k}th) is not the "
                                 f"archive's next ({wanted}; until {self.until})")
        if len(got) < must:
            return "lost", f"the restore returned {len(got)} records, {must} lie below its end"
        return None

    @property
    def written(self) -> int:
        return len(self.lsn_of)

    def close(self) -> None:
        pass


class LogFsWorkload:
    """A ``pmemwal.Log`` (buffered): entries appended and synced, rewinds, compactions,
    resets and hard states (powerloss.LogWorkload's events, held against its LogModel), and
    an index checkpoint (``Log.checkpoint``) now and then, so that its index files
    (``index/``: the LOG slots and the chunk files) are crashed at as the WAL is.  Each
    state is opened with ``open_log``, which takes the stored index when it fits."""

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        self.root, self.seed, self.recorder = root, seed, recorder
        self.kills = 0
        self.rebuilt = self.indexed = 0   # states opened without / with their stored index
        log = pmemwal.open_log(root / "wal", mode="buffered", segment_size=SEGMENT_SIZE,
                               background=False, prepare_segments=0, recycle_segments=1)
        self.work = LogWorkload(log, seed, 1)

    def step(self, rng: random.Random) -> None:
        if self.work.step(rng):
            self.recorder.settle_segments()
        if self.work.retain():
            self.recorder.settle_segments()
        if rng.random() < INDEX_CHECKPOINT_RATE:
            self.work.log.checkpoint()
            self.recorder.settle_segments()

    def acked_key(self) -> tuple:
        """What was acknowledged, as a key: a state is checked again only when it changed."""
        model = self.work.model
        return (model.announced, model.in_flight, tuple(sorted(model.acked_seqs.items())))

    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]:
        acked = self.work.acked()
        if not _materialise(state, "wal", directory):
            return "ok", ""   # nothing made yet, nothing promised
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # (an index not used is said so)
                with pmemwal.open_log(directory, create=False, mode="buffered",
                                      background=False) as log:
                    if log.replayed_from is None:
                        self.rebuilt += 1
                    else:
                        self.indexed += 1
                    chk = acked.check(log)
        except BaseException as exc:
            return _verdict_of_error(exc, 1 if acked.announced or acked.acked_seqs else 0)
        for verdict, failed in (("lost", chk.lost), ("lost", chk.state_errors),
                                ("stale", chk.resurrected), ("stale", chk.garbage or chk.order)):
            if failed:
                return verdict, "; ".join(chk.problems[:3])
        return "ok", ""

    @property
    def written(self) -> int:
        return self.work.written

    def close(self) -> None:
        self.work.close()


class EsFsWorkload:
    """An eventsourcing datastore (pmemwal.integrations.eventsourcing, buffered): batches of
    events inserted, each durable when ``insert`` returns, and an index checkpoint now and
    then, so that its index (``index/es/``: STATE, manifests, rows, runs of key pairs) is
    crashed at.  Each state is opened with ``open_datastore``, which takes the stored index
    when it fits; every acknowledged event must come back, by its aggregate
    (``select_events``, through the runs) and by its notification ID, and no event that was
    not inserted."""

    def __init__(self, root: Path, seed: int, recorder: Recorder) -> None:
        from pmemwal.integrations import eventsourcing as es
        self.es, self.root, self.seed, self.recorder = es, root, seed, recorder
        self.kills = 0
        self.store = es.open_datastore(root / "es", mode="buffered", segment_size=SEGMENT_SIZE,
                                       background=False, prepare_segments=0)
        self.ids = [uuid.UUID(int=(seed << 32) + k) for k in range(ORIGINATORS)]
        self.versions = [0] * ORIGINATORS
        self.inserted: dict[tuple[uuid.UUID, int], bytes] = {}  # acknowledged or not
        # (originator, version, notification ID) of the events acknowledged
        self.acked: list[tuple[uuid.UUID | str, int, int]] = []

    def step(self, rng: random.Random) -> None:
        from eventsourcing.persistence import StoredEvent
        events = []
        for _ in range(rng.randint(1, 8)):
            k = rng.randrange(ORIGINATORS)
            self.versions[k] += 1
            state = payload(self.seed, k << 32 | self.versions[k], rng.randrange(8, 200))
            events.append(StoredEvent(self.ids[k], self.versions[k], f"t{k % 5}", state))
            self.inserted[(self.ids[k], self.versions[k])] = state
        ids = self.store.insert(events)
        self.recorder.settle_segments()
        self.acked += [(e.originator_id, e.originator_version, i) for e, i in zip(events, ids)]
        if rng.random() < INDEX_CHECKPOINT_RATE:
            self.store.checkpoint()

    def acked_key(self) -> int:
        return len(self.acked)

    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]:
        from eventsourcing.persistence import PersistenceError
        acked = list(self.acked)
        if not _materialise(state, "es", directory):
            return "ok", ""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # (an index not used is said so)
                store = self.es.open_datastore(directory, create=False, mode="buffered",
                                               background=False)
                try:
                    return self._held_against(store, acked)
                finally:
                    store.close()
        except PersistenceError as exc:
            if not acked and isinstance(exc.__cause__, NotFoundError):
                return "ok", ""
            return "refused", f"{type(exc).__name__}: {exc}"
        except BaseException as exc:
            return _verdict_of_error(exc, len(acked))

    def _held_against(self, store, acked: list[tuple[uuid.UUID | str, int, int]]
                      ) -> tuple[str, str]:
        by_id: dict[tuple[uuid.UUID | str, int], bool] = {}
        for originator in self.ids:
            for event in store.select_events(originator):
                key = (event.originator_id, event.originator_version)
                if self.inserted.get(key) != event.state:
                    return "stale", f"{originator} v{event.originator_version} was not inserted"
                by_id[key] = True
        notified = {(n.originator_id, n.originator_version): n.id
                    for n in store.select_notifications(1, 1 << 30)}
        for who, version, nid in acked:
            if (who, version) not in by_id:
                return "lost", (f"{who} v{version} (notification {nid}) was acknowledged; "
                                "select_events does not return it")
            if notified.get((who, version)) != nid:
                return "lost", f"notification {nid} ({who} v{version}) is not back"
        return "ok", ""

    @property
    def written(self) -> int:
        return len(self.inserted)

    def close(self) -> None:
        self.store.close()


def _materialise(state: CrashState, prefix: str, directory: Path) -> bool:
    """The state's files and directories under ``prefix``/, alone in ``directory`` (runs of
    zeros left as holes: the index's chunk files are sparse); False when it has none."""
    shutil.rmtree(directory, ignore_errors=True)
    if prefix not in state.dirs:
        return False
    directory.mkdir(parents=True)
    for d in sorted(state.dirs):
        if d.startswith(prefix + "/"):
            (directory / d[len(prefix) + 1:]).mkdir(parents=True, exist_ok=True)
    for name, data in state.files.items():
        if not name.startswith(prefix + "/"):
            continue
        target = directory / name[len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            if len(data) < 1 << 20:
                f.write(data)
                continue
            block = 1 << 16
            zeros = bytes(block)
            for at in range(0, len(data), block):
                part = data[at:at + block]
                if part != zeros[:len(part)]:
                    f.seek(at)
                    f.write(part)
            f.truncate(len(data))
    return True


def _is_segment(data: bytes, name: str) -> bool:
    """Whether ``data`` starts with the valid header of segment file ``name``."""
    try:
        return SegmentHeader.unpack(data[:HEADER_SIZE], name).segno == parse_segment_name(name)
    except FormatError:
        return False


def _records(path: Path) -> list[tuple[int, bytes]]:
    with pmemwal.open(path, create=False, mode="buffered", background=False) as wal:
        return [(r.lsn, bytes(r.payload)) for r in wal.records()]


def _make_archive(source: Path, seed: int) -> dict[int, int]:
    """A file:// archive of a few complete segments; the records' LSNs by index."""
    shutil.rmtree(source, ignore_errors=True)
    wal = pmemwal.open(source / "wal", mode="buffered", segment_size=SEGMENT_SIZE,
                       archive=f"file://{source / 'archive'}")
    work = Workload(wal, seed)
    rng = random.Random(seed)
    while wal.insert_lsn < 3.5 * SEGMENT_SIZE:
        work.step(rng)
    wal.flush()
    wal.wait_archived(60)
    wal.close()
    return dict(work.lsn_of)


class CrashWorkload(Protocol):
    """What ``run_fs_crash`` drives: each of the workload classes below."""

    kills: int

    def step(self, rng: random.Random) -> None: ...
    def check(self, state: CrashState, directory: Path, where: str) -> tuple[str, str]: ...
    @property
    def written(self) -> int: ...
    def close(self) -> None: ...


_WORKLOAD_CLASSES: dict[str, Callable[[Path, int, Recorder], CrashWorkload]] = {
    "growth": GrowthWorkload, "truncate": TruncateWorkload, "recycle": RecycleWorkload,
    "shared": SharedWorkload, "archive": ArchiveWorkload, "restore": RestoreWorkload,
    "log": LogFsWorkload, "eventsourcing": EsFsWorkload, "background": BackgroundWorkload}


# ---- the driver ---------------------------------------------------------------------------------

def run_fs_crash(fs_model: str, states: int, seed: int = 0, *, workload: str = "growth",
                 directory: str | None = None, crash_rate: float | None = None,
                 progress: Callable[[int], None] | None = None,
                 max_seconds: float | None = None,
                 per_file: int = PER_FILE_STATES) -> FsCrashReport:
    """Run ``workload`` under the recorder, crashing at random recorded operations (each with
    chance ``crash_rate``: the workload's own, else 0.5) and after steps, until ``states`` distinct crash states of the
    ``fs_model`` file system have been recovered and checked (or ``max_seconds`` passed);
    ``per_file``: the states drawn at a crash point where files take data outcomes of their
    own (fs_model.MetadataModel.states)."""
    if crash_rate is None:
        crash_rate = getattr(_WORKLOAD_CLASSES.get(workload), "crash_rate", 0.5)
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r}: one of {', '.join(WORKLOADS)}")
    if workload == "salvage":  # crashes inside a recovery that cuts, then a second one
        from pmemwal.tools.fs_salvage import run_salvage
        return run_salvage(fs_model, states, seed, directory=directory, crash_rate=crash_rate,
                           progress=progress, max_seconds=max_seconds)
    model = MetadataModel(fs_model)
    report = FsCrashReport(fs_model, workload, seed)
    base = Path(tempfile.mkdtemp(prefix="pmemwal-fscrash-", dir=directory or _default_dir()))
    rng, crash_rng = random.Random(seed), random.Random(seed ^ 0x5EED)
    per_file_rng = random.Random(seed ^ 0xF11E)
    seen: set[bytes] = set()
    checked: set[tuple] = set()
    t0 = time.perf_counter()
    try:
        generation = 0
        while report.distinct_states < states:
            root = base / f"g{generation}"
            root.mkdir()
            model = MetadataModel(fs_model)
            recorder = Recorder(model, str(root),
                                mounts=getattr(_WORKLOAD_CLASSES[workload], "mounts", ()))
            recorder.mixed, recorder.rng = per_file, per_file_rng
            holder: dict = {}

            def crash(where: str, force: bool = False) -> None:
                with recorder.lock:  # (the background writer's points come from its thread)
                    if "work" in holder and (force or crash_rng.random() < crash_rate):
                        _crash_point(holder["work"], recorder, where, base / "image", report,
                                     seen, checked, progress)

            recorder.on_point = crash
            with recorder:
                work = _WORKLOAD_CLASSES[workload](root, seed + generation, recorder)
                holder["work"] = work
                for _ in range(ROUNDS_PER_WAL if workload != "restore" else 4):
                    work.step(rng)
                    crash("after a step", force=crash_rng.random() < crash_rate)
                    if report.distinct_states >= states or (
                            max_seconds and time.perf_counter() - t0 > max_seconds):
                        break
                report.records_written += work.written
                report.kills += work.kills
                report.operations += model.recorded
                with recorder.lock:
                    del holder["work"]  # no crash point in close (not recorded)
                with recorder.pause():
                    work.close()
            shutil.rmtree(root, ignore_errors=True)
            generation += 1
            if max_seconds and time.perf_counter() - t0 > max_seconds:
                break
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report.seconds = time.perf_counter() - t0
    return report


def _crash_point(work, recorder: Recorder, where: str, image_dir: Path, report: FsCrashReport,
                 seen: set[bytes], checked: set[tuple],
                 progress: Callable[[int], None] | None) -> None:
    """Enumerate the states a crash here may leave; recover and check the new ones."""
    report.crash_points += 1
    report.background_points += where.endswith("(background)")
    acked = work.acked_key() if hasattr(work, "acked_key") else \
        work.work.acked() if hasattr(work, "work") else len(getattr(work, "expected", ()))
    truncated = getattr(getattr(work, "work", None), "truncated_to", 0)
    for state in recorder.states():
        digest = state.digest()
        if digest not in seen:
            seen.add(digest)
            report.distinct_states += 1
            if state.prefix < state.pending:
                report.metadata_states += 1
            if state.data.startswith("per file"):
                report.per_file_states += 1
            if progress:
                progress(1)
        key = (digest, acked, truncated)
        if key in checked:
            continue
        checked.add(key)
        report.states_checked += 1
        with recovery_warnings():    # (a crash state's, which the check judges)
            verdict, detail = work.check(state, image_dir, where)
        _count(report, verdict, detail, where, state)


_COUNTERS = {"lost": "lost", "stale": "stale", "untyped": "untyped", "refused": "refused"}


def _count(report: FsCrashReport, verdict: str, detail: str, where: str,
           state: CrashState) -> None:
    if verdict == "expected":
        report.expected_refusals += 1
    elif verdict in _COUNTERS:
        setattr(report, _COUNTERS[verdict], getattr(report, _COUNTERS[verdict]) + 1)
        if len(report.failures) < 50:
            report.failures.append(
                f"{verdict} at a crash {where} ({state.prefix} of {state.pending} pending "
                f"operations kept, {state.data} data; seed {report.seed}): {detail}")


def table(reports: list[FsCrashReport]) -> str:
    """The reports as a Markdown table, one row per file system and workload."""
    columns = [("fs model", lambda r: r.fs_model), ("workload", lambda r: r.workload),
               ("crash points", lambda r: f"{r.crash_points:,}"),
               ("distinct states", lambda r: f"{r.distinct_states:,}"),
               ("missing a pending metadata op", lambda r: f"{r.metadata_states:,}"),
               ("recoveries", lambda r: f"{r.states_checked:,}"),
               ("lost", lambda r: r.lost), ("stale", lambda r: r.stale),
               ("untyped errors", lambda r: r.untyped), ("refused", lambda r: r.refused),
               ("restores cut short, refused as designed", lambda r: r.expected_refusals),
               ("kills", lambda r: r.kills),
               ("records written", lambda r: f"{r.records_written:,}"),
               ("seconds", lambda r: f"{r.seconds:.0f}")]
    rows = ["| " + " | ".join(name for name, _ in columns) + " |", "|" + "---|" * len(columns)]
    rows += ["| " + " | ".join(str(cell(r)) for _, cell in columns) + " |" for r in reports]
    return "\n".join(rows)
