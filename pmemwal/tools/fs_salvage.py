"""Crashes inside a recovery that cuts and sets aside, then a second (and third) recovery.

Concern: the ``salvage`` workload of the file-system crash states (fs_crash.py,
``pmemwal powerloss --fs-model ext4|xfs``).  Every other workload recovers each crash
state once.  Here the WAL is damaged past its checkpoint on purpose, so that its
recovery must cut there (a torn tail, or damage cut with ``on_corruption="truncate"``)
and set the valid records past the damage aside in ``lost+found/`` (lostfound.py);
that recovery runs under the recorder (fs_model.Recorder), each recorded call a crash
point, and every state a crash there may leave is recovered again and checked:

- every record wholly below the damage comes back, in order, at its LSN, as written;
- every intact record past the damage is held by exactly one lost+found entry (read
  through ``SetAside.records``, as ``pmemwal lost-found`` reads it), and by none if the
  WAL holds it; nothing an entry holds is other than what was written at its LSN;
- no entry is left pending (``CUTTING``) once the open returns;
- the open neither refuses (a ``WALError``) nor raises anything untyped;
- now and then, each entry is put back (putback.restore) and its records read back at
  the WAL's end, in order.  That put-back runs under a recorder too, each recorded call a
  crash point; each state a crash there leaves is (with chance ``PUT_BACK_STATE_RATE``)
  opened, put back again as a user repeats a put-back cut short (putback.restore of each
  entry still listed, in order: "safe to repeat"), and the WAL must then hold every
  set-aside record exactly once, in order, with no entry and no RESTORING note left.

Some of those second recoveries run under a recorder of their own, and every state a
crash in them leaves is recovered a third time and checked the same way.

Damage patterns (``PATTERNS``): half a page of garbage (a torn page), a zeroed range, a
zeroed range on each side of a segment boundary, a zeroed range and a damaged spare
segment (set aside whole: lostfound.set_aside_segment), and a torn tail (the records past
the damage prove no flush: the default ``on_corruption="raise"`` cuts it).

What it takes as given: the recovery writes its cut with ``os.pwrite`` and syncs it with
``os.fdatasync`` (recovery.py, ``_wipe_beyond``), and the set-aside with ``os`` calls
(lostfound.py), all of which the recorder sees; nothing in an open that appends nothing
writes a segment through the native core; a put-back's records are written by the core,
unseen, and durable only once a ``WAL.flush`` returned (the recorder settles the segments
there).  Files that exist before the recovery are taken
as durable as they are; the recorder does not settle the damaged WAL's segments at a
checkpoint's sync (other workloads do: there the core wrote them), so a zeroing is durable
only once an ``fdatasync`` of its file returned.  Unsynced writes to one file reach the disk
all or none (and, between two writes, as far as a crash point between them): the pages of
one ``pwrite`` are not torn apart.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pmemwal
from pmemwal import lostfound, putback
from pmemwal.errors import WALError
from pmemwal.format import (CHECKPOINTED, HEADER_SIZE, PAGE_SIZE, SPARE, SegmentHeader,
                            parse_segment_name, segment_name)
from pmemwal.tools import fs_model as _fs_model
from pmemwal.tools.fs_model import CrashState, MetadataModel, Recorder
from pmemwal.tools.fs_report import FsCrashReport
from pmemwal.tools.powerloss import _default_dir, payload
from pmemwal.wal import WAL

SEGMENT_SIZE = 1 << 20
# pattern -> the on_corruption every recovery of it is opened with
PATTERNS = {"torn-page": "truncate", "zeroed-range": "truncate", "across-segments": "truncate",
            "damaged-spare": "truncate", "torn-tail": "raise"}
THIRD_RATE = 0.03     # chance that a second recovery runs under a recorder, its states recovered a third time
THIRD_CRASH_RATE = 0.5  # ... each of its recorded calls a crash point with this chance
PUT_BACK_RATE = 0.1   # chance that a checked state's entries are put back and read back
PUT_BACK_STATE_RATE = 0.25  # ... under a recorder: each state a crash there leaves, checked


@dataclass
class SalvageReport(FsCrashReport):
    """FsCrashReport, and what only a recovery after a stopped cut can get wrong."""

    cases: int = 0                # damaged WALs made
    third_states: int = 0         # states of a crash in a second recovery, recovered a third time
    put_backs: int = 0            # entries put back and read back
    put_back_states: int = 0      # states of a crash in a put-back, recovered and put back again
    duplicated: int = 0           # a record held twice (two entries, or an entry and the WAL)
    pending: int = 0              # an entry still pending once the open returned
    orphans: int = 0              # states after whose recovery lost+found keeps a directory with
                                  # no manifest (a set-aside a crash stopped: unread, never removed)

    @property
    def ok(self) -> bool:
        return super().ok and not (self.duplicated or self.pending)


@dataclass
class Case:
    """One damaged WAL and what every recovery of it must give."""

    pattern: str
    on_corruption: str
    before: list[tuple[int, bytes]]              # records wholly below the damage, in order
    after: dict[int, bytes]                      # intact records past the damage, by LSN
    written: dict[int, bytes] = field(default_factory=dict)  # every record written, by LSN


def make_case(path: Path, pattern: str, seed: int) -> Case:
    """A WAL in ``path`` as a power cut after its last flush leaves it (its checkpoint the
    open's), then damaged past that checkpoint as ``pattern`` says."""
    rng = random.Random(seed)
    on_corruption = PATTERNS[pattern]
    source = path.parent / (path.name + ".source")
    wal = pmemwal.open(source, mode="buffered", segment_size=SEGMENT_SIZE, background=False,
                       prepare_segments=0, recycle_segments=0)
    # (every page past the damage is copied, a write and a crash point each: a few pages)
    size = SEGMENT_SIZE + 8 * PAGE_SIZE if pattern == "across-segments" else 14 * PAGE_SIZE
    lsns: list[int] = []
    payloads: list[bytes] = []
    while wal.insert_lsn < size:
        data = payload(seed, len(lsns), rng.randrange(16, 6000 if size > SEGMENT_SIZE else 2500))
        # a torn tail's records were written before any flush: their durable hints prove none
        lsns.append(wal.append(data, flush=on_corruption == "truncate" and rng.random() < 0.3))
        payloads.append(data)
    wal.flush()
    end = wal.insert_lsn
    path.mkdir(parents=True)
    for name in os.listdir(source):
        if name != "LOCK":
            shutil.copyfile(source / name, path / name)
    wal.close()
    shutil.rmtree(source)
    nexts = lsns[1:] + [end]
    n = len(lsns)
    damage: list[tuple[int, int]] = []   # LSN ranges
    if pattern == "across-segments":
        damage = [(SEGMENT_SIZE - rng.randrange(200, 3000), SEGMENT_SIZE),
                  (SEGMENT_SIZE + PAGE_SIZE, SEGMENT_SIZE + PAGE_SIZE + rng.randrange(100, 800))]
    else:
        k = rng.randrange(n // 3, n // 2)
        if pattern == "torn-page":
            page = lsns[k] - lsns[k] % PAGE_SIZE
            damage = [(page + PAGE_SIZE // 2, page + PAGE_SIZE)]
        else:
            start = lsns[k] + 8 * rng.randrange(0, max(1, (nexts[k] - lsns[k]) // 8))
            damage = [(start, start + rng.randrange(64, 700))]
    for lo, hi in damage:
        fill = rng.randbytes(hi - lo) if pattern == "torn-page" else bytes(hi - lo)
        _write_at(path, lo, fill)
    if pattern == "damaged-spare":
        spare = max(lsns) // SEGMENT_SIZE + 1
        header = SegmentHeader(spare, SEGMENT_SIZE, _wal_id(path), CHECKPOINTED | SPARE).pack()
        torn = bytearray(header)
        torn[20] ^= 0xFF
        with open(path / segment_name(spare), "wb") as f:
            f.write(bytes(torn) + bytes(SEGMENT_SIZE - len(torn)))
    lo, hi = min(d[0] for d in damage), max(d[1] for d in damage)
    records = list(zip(lsns, nexts, payloads))
    return Case(pattern, on_corruption,
                before=[(lsn, data) for lsn, nxt, data in records if nxt <= lo],
                after={lsn: data for lsn, nxt, data in records if lsn >= hi},
                written={lsn: data for lsn, _, data in records})


def _write_at(path: Path, lsn: int, data: bytes) -> None:
    fd = os.open(path / segment_name(lsn // SEGMENT_SIZE), os.O_WRONLY)
    try:
        os.pwrite(fd, data, lsn % SEGMENT_SIZE)
    finally:
        os.close(fd)


def _wal_id(path: Path) -> bytes:
    with open(path / segment_name(0), "rb") as f:
        return SegmentHeader.unpack(f.read(HEADER_SIZE), segment_name(0)).wal_id


# ---- one recovery, checked ---------------------------------------------------------------------

def _open(path: Path, case: Case) -> pmemwal.WAL:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (RecoveryWarning: records set aside, as meant)
        return pmemwal.open(path, create=False, mode="buffered", background=False,
                            on_corruption=case.on_corruption)


def check_recovery(path: Path, case: Case, put_back: bool = False) -> tuple[str, str, int]:
    """Recover the WAL in ``path`` and check it and its lost+found (the module docstring);
    (verdict, detail, entries put back)."""
    try:
        wal = _open(path, case)
    except WALError as exc:
        return "refused", f"{type(exc).__name__}: {exc}", 0
    except BaseException as exc:
        return "untyped", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}", 0
    try:
        got = [(r.lsn, bytes(r.payload)) for r in wal.records()]
        found = lostfound.entries(str(path))
        pending = [e.name for e in found if e.pending]
        held: dict[tuple[int, bytes], list[str]] = {}
        for entry in found:
            for lsn, data in entry.records():
                held.setdefault((lsn, data), []).append(entry.name)
    except WALError as exc:
        return "lost", f"reading the recovered WAL or its lost+found: {type(exc).__name__}: {exc}", 0
    except BaseException as exc:
        return "untyped", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}", 0
    finally:
        wal.close()
    verdict = _judge(case, got, held, pending)
    if verdict[0] != "ok" or not put_back:
        return (*verdict, 0)
    return _put_back(path, case, got, [e for e in found if e.manifest["records"]])


def _judge(case: Case, got: list[tuple[int, bytes]], held: dict[tuple[int, bytes], list[str]],
           pending: list[str]) -> tuple[str, str]:
    for k, (lsn, data) in enumerate(case.before):
        if k >= len(got) or got[k] != (lsn, data):
            return "lost", (f"the record at {lsn:#x} below the damage did not come back "
                            f"({len(got)} records read, {len(case.before)} lie below it)")
    for lsn, data in got:
        if case.written.get(lsn) != data:
            return "stale", f"the WAL returned a record at {lsn:#x} that was not written there"
    in_wal = set(got)
    for (lsn, data), names in held.items():
        if case.written.get(lsn) != data:
            return "stale", f"lost+found entry {names[0]} holds a record at {lsn:#x} not written there"
        if len(names) > 1:
            return "duplicated", f"the record at {lsn:#x} is held by entries {', '.join(names)}"
        if (lsn, data) in in_wal:
            return "duplicated", f"the record at {lsn:#x} is in the WAL and in entry {names[0]}"
    for lsn, data in case.after.items():
        if (lsn, data) not in held and (lsn, data) not in in_wal:
            return "lost", (f"the intact record at {lsn:#x} past the damage is neither in the WAL "
                            f"nor in lost+found ({len(held)} records held there)")
    if pending:
        return "pending", f"lost+found entries still pending once the open returned: {pending}"
    return "ok", ""


def _restoring_left(path: Path) -> list[str]:
    """The entries of lost+found in ``path`` that still hold a put-back's RESTORING note."""
    return [e.name for e in lostfound.entries(str(path))
            if os.path.exists(os.path.join(e.path, putback._RESTORING))]


def _put_back(path: Path, case: Case, got: list[tuple[int, bytes]],
              found: list[lostfound.SetAside]) -> tuple[str, str, int]:
    """Each entry put back, in order; the WAL must then end with their records."""
    expected = []
    try:
        for entry in found:
            expected += [data for _, data in entry.records()]
            putback.restore(str(path), entry.name, mode="buffered", background=False)
        with pmemwal.open(path, create=False, mode="buffered", background=False) as wal:
            now = [bytes(r.payload) for r in wal.records()]
        left = [e.name for e in lostfound.entries(str(path)) if e.manifest["records"]]
        left += [f"{name} (its RESTORING note)" for name in _restoring_left(path)]
    except BaseException as exc:
        kind = "refused" if isinstance(exc, WALError) else "untyped"
        return kind, f"putting lost+found back: {type(exc).__name__}: {exc}", 0
    return (*_judge_put_back([data for _, data in got] + expected, now, left), len(found))


def _judge_put_back(want: list[bytes], now: list[bytes], left: list[str]) -> tuple[str, str]:
    """The WAL after a put-back: ``want`` (what it held, then every entry's records, each
    once, in order), and no entry or RESTORING note ``left``."""
    if now == want and not left:
        return "ok", ""
    extra = [data for data in now if now.count(data) > want.count(data)]
    kind = "duplicated" if extra else "lost"
    return kind, (f"after the put-back the WAL holds {len(now)} records, {len(want)} expected"
                  f"{f' ({len(extra)} of them twice)' if extra else ''}; entries left: {left}")


def _put_back_recorded(run: _Run, root: Path, case: Case, where: str) -> int:
    """Put back every lost+found entry of the (recovered, checked) WAL in ``root``/wal under
    the recorder, each recorded call a crash point; each state a crash there leaves is, with
    chance ``run.put_back_state_rate``, recovered and put back again as after a crash (each
    entry still listed restored again, in order: putback.restore, "safe to repeat"), and
    the WAL must then hold what it held, then every entry's records, each once, in order,
    with no entry or RESTORING note left.  Returns the entries put back."""
    path = root / "wal"
    with pmemwal.open(path, create=False, mode="buffered", background=False) as wal:
        got = [bytes(r.payload) for r in wal.records()]
    found = [e for e in lostfound.entries(str(path)) if e.manifest["records"]]
    want = got + [data for e in found for _, data in e.records()]
    names = [e.name for e in found]
    model = MetadataModel(run.fs_model)
    recorder = Recorder(model, str(root))
    _adopt(recorder, root)
    for name in os.listdir(path):  # (the core writes them: read at each point, settled at a flush)
        if parse_segment_name(name) is not None:
            recorder.segment_inodes.add(recorder.inodes[os.lstat(path / name).st_ino])
    seen: set[bytes] = set()

    def again(state: CrashState, at: str) -> None:
        run.report.put_back_states += 1
        run.report.states_checked += 1
        image = run.base / "image-put-back"
        _materialize(state, image)
        try:
            _open(image / "wal", case).close()  # (the open after the crash: a recovery)
            there = {e.name for e in lostfound.entries(str(image / "wal"))}
            for name in names:
                if name in there:
                    putback.restore(str(image / "wal"), name, mode="buffered", background=False)
            with pmemwal.open(image / "wal", create=False, mode="buffered",
                              background=False) as wal:
                now = [bytes(r.payload) for r in wal.records()]
            left = [e.name for e in lostfound.entries(str(image / "wal")) if e.manifest["records"]]
            left += [f"{name} (its RESTORING note)" for name in _restoring_left(image / "wal")]
        except BaseException as exc:
            kind = "refused" if isinstance(exc, WALError) else "untyped"
            run.count(kind, f"putting lost+found back again: {type(exc).__name__}: {exc}",
                      f"in a put-back ({at}) after {where}", state)
            return
        verdict, detail = _judge_put_back(want, now, left)
        run.count(verdict, detail, f"in a put-back ({at}) after {where}", state)

    def crash(at: str) -> None:
        run.report.crash_points += 1
        for state in recorder.states():
            digest = state.digest()
            if digest not in seen:
                seen.add(digest)
                if run.rng.random() < run.put_back_state_rate:
                    again(state, at)

    real_flush = WAL.flush

    def flush(self: WAL, *args, **kwargs):  # the core made the segments' data durable
        result = real_flush(self, *args, **kwargs)
        recorder.settle_segments()
        return result

    recorder.on_point = crash
    saved = _installed()
    WAL.flush = flush  # type: ignore[method-assign]
    try:
        with recorder:
            try:
                for name in names:
                    putback.restore(str(path), name, mode="buffered", background=False)
            except BaseException:
                pass  # (judged at the state "after it returned": nothing written since)
            with recorder.pause():
                crash("after it returned")
            run.report.operations += model.recorded
    finally:
        WAL.flush = real_flush  # type: ignore[method-assign]
        _reinstall(saved)
    return len(names)


# ---- recording a recovery ------------------------------------------------------------------------

def _adopt(recorder: Recorder, root: Path) -> None:
    """The files and directories under ``root``, durable as they are, known to the model
    before the recovery writes any (a file it first meets at a write would be taken as
    durable with that write in it)."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        recorder.model.durable.dirs.add("" if rel == "." else rel)
        for name in filenames:
            path = os.path.join(dirpath, name)
            recorder._inode(os.lstat(path), os.path.relpath(path, root))


def _orphaned(path: Path) -> bool:
    """Whether lost+found in ``path`` keeps a directory that is no entry (no manifest)."""
    root = path / lostfound.LOST_FOUND_NAME
    names = {e.name for e in lostfound.entries(str(path))}
    return root.is_dir() and any(not n.startswith(".") and n not in names for n in os.listdir(root))


def _materialize(state: CrashState, directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for d in sorted(state.dirs):
        (directory / d).mkdir(parents=True, exist_ok=True)
    for name, data in state.files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


_WRAPPED = [name for name in vars(_fs_model._real) if name != "builtin_open"]


def _installed() -> dict:
    import builtins
    return {**{name: getattr(os, name) for name in _WRAPPED}, "builtin_open": builtins.open}


def _reinstall(saved: dict) -> None:
    """Put back the wrappers of an outer recorder (a nested one's exit puts the real calls)."""
    import builtins
    for name in _WRAPPED:
        setattr(os, name, saved[name])
    builtins.open = saved["builtin_open"]


@dataclass
class _Run:
    fs_model: str
    report: SalvageReport
    rng: random.Random
    base: Path
    crash_rate: float
    third_rate: float
    third_crash_rate: float
    put_back_rate: float
    put_back_state_rate: float
    progress: Callable[[int], None] | None
    seen: set[bytes] = field(default_factory=set)
    seen_third: set[bytes] = field(default_factory=set)

    def count(self, verdict: str, detail: str, where: str, state: CrashState | None) -> None:
        if verdict == "ok":
            return
        assert verdict in ("lost", "stale", "untyped", "refused", "duplicated", "pending"), verdict
        setattr(self.report, verdict, getattr(self.report, verdict) + 1)
        if len(self.report.failures) < 50:
            kept = "" if state is None else (f" ({state.prefix} of {state.pending} pending "
                                             f"operations kept, {state.data} data)")
            self.report.failures.append(f"{verdict} at a crash {where}{kept}; seed "
                                        f"{self.report.seed}: {detail}")

    def states(self, recorder: Recorder, seen: set[bytes]) -> Iterator[CrashState]:
        for state in recorder.states():
            digest = state.digest()
            if digest not in seen:
                seen.add(digest)
                yield state


def _recover_under_recorder(run: _Run, root: Path, case: Case, where: str,
                            on_state: Callable[[CrashState, str], None],
                            check: bool, crash_rate: float) -> None:
    """Recover ``root``/wal with every recorded call a crash point (each with chance
    ``crash_rate``); ``on_state`` gets each new state.  ``check``: this recovery is judged
    too (a second one: its own crash states are a third)."""
    model = MetadataModel(run.fs_model)
    recorder = Recorder(model, str(root))
    _adopt(recorder, root)
    seen = run.seen if not check else run.seen_third

    def crash(at: str) -> None:
        if run.rng.random() < crash_rate:
            run.report.crash_points += 1
            for state in run.states(recorder, seen):
                on_state(state, f"{at}, {where}" if where else at)

    recorder.on_point = crash
    saved = _installed()
    try:
        with recorder:
            if check:
                verdict, detail, _ = check_recovery(root / "wal", case)
                run.count(verdict, detail, where + " (the recovery itself)", None)
            else:
                try:
                    _open(root / "wal", case).close()
                except BaseException:
                    pass  # (judged on the reference copy, recovered without a crash)
            with recorder.pause():
                crash("after it returned")
            run.report.operations += model.recorded
    finally:
        _reinstall(saved)


def _case(run: _Run, case_no: int, pattern: str, seed: int) -> None:
    root = run.base / f"c{case_no}"
    case = make_case(root / "wal", pattern, seed)
    run.report.cases += 1
    run.report.records_written += len(case.written)
    reference = run.base / "reference"
    shutil.copytree(root, reference)
    verdict, detail, _ = check_recovery(reference / "wal", case)
    run.count(verdict, detail, f"nowhere ({pattern}: the recovery alone)", None)
    if verdict == "ok":
        run.report.put_backs += _put_back_recorded(run, reference, case,
                                                   f"the recovery alone ({pattern})")
    shutil.rmtree(reference)
    if not case.after:
        run.count("lost", "the damage left no intact record past it (a case that tests nothing)",
                  pattern, None)

    def second(state: CrashState, where: str) -> None:
        run.report.distinct_states += 1
        run.report.states_checked += 1
        if state.prefix < state.pending:
            run.report.metadata_states += 1
        if run.progress:
            run.progress(1)
        image = run.base / "image"
        _materialize(state, image)
        what = f"in the first recovery ({where}; {pattern})"
        if run.rng.random() < run.third_rate:
            _recover_under_recorder(run, image, case, what, third_of(what), check=True,
                                    crash_rate=run.third_crash_rate)
        else:
            put_back = run.rng.random() < run.put_back_rate
            verdict, detail, _ = check_recovery(image / "wal", case)
            run.count(verdict, detail, what, state)
            run.report.orphans += _orphaned(image / "wal")
            if put_back and verdict == "ok":
                run.report.put_backs += _put_back_recorded(run, image, case, f"a crash {what}")

    def third_of(what: str) -> Callable[[CrashState, str], None]:
        def third(state: CrashState, where: str) -> None:
            run.report.third_states += 1
            run.report.states_checked += 1
            image = run.base / "image3"
            _materialize(state, image)
            verdict, detail, _ = check_recovery(image / "wal", case)
            run.count(verdict, detail, f"in the second recovery ({where}) after one {what}", state)
        return third

    _recover_under_recorder(run, root, case, "", second, check=False, crash_rate=run.crash_rate)
    shutil.rmtree(root, ignore_errors=True)
    _fs_model._HASHES.clear()  # (it keeps the contents it hashed: segments, a MiB each)


def run_salvage(fs_model: str, states: int, seed: int = 0, *, directory: str | None = None,
                crash_rate: float = 1.0, third_rate: float = THIRD_RATE,
                third_crash_rate: float = THIRD_CRASH_RATE, put_back_rate: float = PUT_BACK_RATE,
                put_back_state_rate: float = PUT_BACK_STATE_RATE, patterns: tuple[str, ...] = tuple(PATTERNS),
                progress: Callable[[int], None] | None = None,
                max_seconds: float | None = None) -> SalvageReport:
    """Damaged WALs, one pattern after another, each recovered under the recorder with a
    crash point at each recorded call (with chance ``crash_rate``), until ``states``
    distinct states of a crash in a first recovery were recovered again and checked.  With
    chance ``third_rate`` such a second recovery runs under a recorder too (its crash points
    with chance ``third_crash_rate``), each state of a crash in it recovered a third time."""
    for pattern in patterns:
        if pattern not in PATTERNS:
            raise ValueError(f"pattern {pattern!r}: one of {', '.join(PATTERNS)}")
    MetadataModel(fs_model)  # (refuses an unknown one)
    report = SalvageReport(fs_model, "salvage", seed)
    base = Path(tempfile.mkdtemp(prefix="pmemwal-salvage-", dir=directory or _default_dir()))
    run = _Run(fs_model, report, random.Random(seed), base, crash_rate, third_rate,
               third_crash_rate, put_back_rate, put_back_state_rate, progress)
    t0 = time.perf_counter()
    try:
        case_no = 0
        while report.distinct_states < states:
            _case(run, case_no, patterns[case_no % len(patterns)], seed * 7919 + case_no)
            case_no += 1
            if max_seconds and time.perf_counter() - t0 > max_seconds:
                break
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report.seconds = time.perf_counter() - t0
    return report
