"""Crash torture: kill a writing child with SIGKILL at random moments, reopen, check.

Each round a child process (``pmemwal.tools._torture_child``) opens the WAL, says it
is ready, and runs threads that append self-describing records
(``make_record``) and flush them, acknowledging on its stdout every record a
returned flush made durable.  The parent kills it after a random delay,
reopens the WAL (timing recovery), reads every record and holds what it finds
against its ``Ledger`` of what the directory must contain:

- lost: a record that was acknowledged, or returned by an earlier recovery,
  is missing or at another LSN, and does not lie below a truncation point the
  child announced before truncating;
- garbage: a record whose bytes do not regenerate, or of a round never run here;
- order violations: LSNs not increasing, rounds going back, or a thread's
  records in a round not a contiguous run of sequence numbers.

The next round's child reopens the same WAL and appends more.  Rounds cycle
through the persist setups (``buffered``: pwrite + fdatasync, ``direct``:
msync, ``pmem``: direct with ``PMEM_IS_PMEM_FORCE=1``) and insertion slots;
each WAL directory has one segment size (a WAL's size is fixed) and lives for
``rounds_per_dir`` rounds.  A round with a violation keeps the WAL as the
kill left it and as recovery left it, with the child's pipe output, and the
next round starts a fresh directory.

The ``log`` workload (``pmemwal.tools.log_workload``, ``--workload log``) runs
the same rounds on a ``pmemwal.Log``, with its own child, ledger and checks.

Pipe lines of the WAL workload, child to parent (one locked write each):

    O                                   opening: recovery begins
    R <persist_method> <insert_lsn>     opened: recovery done, appending starts
    A <thread> <seq> <lsn> [<lsn> ...]  records seq, seq+1, ... of the thread are durable
    T <lsn>                             about to truncate before lsn
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

import pmemwal
from pmemwal import libpmem
from pmemwal.format import PAGE_SIZE, PAGE_USABLE, is_valid_segment_size

# ---- records ----------------------------------------------------------------------

MAGIC = b"PWTR"
HEADER = struct.Struct("<4sIIII")  # magic, round, thread, seq, length (of the whole record)
HDR = HEADER.size


def digested(head: bytes, length: int) -> bytes:
    """``head``, then bytes it regenerates, ``length`` (>= len(head)) in all: self-describing
    content whose every byte can be checked."""
    return head + hashlib.shake_128(head).digest(length - len(head))


def make_record(rnd: int, thread: int, seq: int, length: int) -> bytes:
    """Record ``seq`` of ``thread`` in round ``rnd``: ``length`` (>= HDR) bytes, header first."""
    return digested(HEADER.pack(MAGIC, rnd, thread, seq, length), length)


def parse_record(data: bytes) -> tuple[int, int, int] | None:
    """(round, thread, seq) of a record whose every byte regenerates; None otherwise."""
    if len(data) < HDR:
        return None
    magic, rnd, thread, seq, length = HEADER.unpack_from(data)
    if magic != MAGIC or length != len(data) or data != digested(data[:HDR], length):
        return None
    return rnd, thread, seq


def segment_usable(segment_size: int) -> int:
    """Record-stream bytes one segment holds (page 0 and page headers excluded)."""
    return (segment_size // PAGE_SIZE - 1) * PAGE_USABLE


def record_size(rng: random.Random, segment_size: int) -> int:
    """Mostly small, some of 1-20 KiB, a few over a page, rarely about a (small) segment."""
    x = rng.random()
    if x < 0.80:
        return rng.randint(HDR, 300)
    if x < 0.97:
        return rng.randint(1 << 10, 20 << 10)
    if x < 0.998:
        return rng.randint(PAGE_SIZE + 1, 64 << 10)
    usable = segment_usable(min(segment_size, 2 << 20))
    return rng.randint(usable - (16 << 10), usable + (64 << 10))


# ---- setups -----------------------------------------------------------------------

# persist setup -> (WAL mode, the persist method the child must end up with)
PERSIST = {"buffered": ("buffered", "fdatasync"), "direct": ("direct", "msync"),
           "pmem": ("direct", "pmem")}
_SWITCHES = ("PMEM_IS_PMEM_FORCE", "PMEMWAL_MODE")
_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


@dataclass(frozen=True)
class Setup:
    """One round's configuration."""

    persist: str       # a key of PERSIST
    segment_size: int
    slots: int

    @property
    def mode(self) -> str:
        return PERSIST[self.persist][0]

    @property
    def key(self) -> str:
        return f"{self.persist}/{self.segment_size >> 20}M/{self.slots}"


def child_env(persist: str) -> dict[str, str]:
    """This environment without pmemwal's switches; libpmem forced to pmem for ``pmem``."""
    env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    root = os.path.dirname(os.path.dirname(os.path.abspath(pmemwal.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if persist == "pmem":
        env["PMEM_IS_PMEM_FORCE"] = "1"
    return env


# ---- what a WAL directory must hold ---------------------------------------------------

Key = tuple[int, int]  # (round, thread)


class PipeError(ValueError):
    """A child broke the pipe protocol: a line out of place, a sequence number skipped."""


@dataclass
class TortureDir:
    """A torture WAL directory: where it is, its segment size, the rounds run in it.

    Each workload's ledger adds what the directory must hold, and what the round
    machinery (``crash_round``, ``play_round``, ``run``) asks of it: ``CHILD``
    (the child's module), ``begin`` (a round starts), ``reader`` (the round's pipe
    lines), ``check`` (recover and check), ``absorb`` (what that recovery returned
    is durable from now on) and ``kept_info`` (for a kept failing round).
    """

    path: str
    segment_size: int
    rounds: set[int] = field(default_factory=set)

    def begin(self, rnd: int) -> dict:
        """Round ``rnd`` starts here; returns what its child's spec needs besides the setup."""
        self.rounds.add(rnd)
        return {}

    def size(self) -> int:
        """Bytes of the files in the directory."""
        return sum(e.stat().st_size for e in os.scandir(self.path) if e.is_file())


@dataclass
class Ledger(TortureDir):
    """A WAL workload's directory and what it must hold.

    ``known[(round, thread)][seq]`` is the LSN of every record known durable
    (acknowledged, or returned by a recovery; 0 where unknown), ``cut`` the
    highest truncation point announced.
    """

    CHILD = "pmemwal.tools._torture_child"

    known: dict[Key, np.ndarray] = field(default_factory=dict)
    cut: int = 0
    # (round, thread) -> one past the last seq the first recovery after that round returned:
    # anything past it was discarded then, and must never come back (resurrection)
    ended: dict[Key, int] = field(default_factory=dict)

    def reader(self, rnd: int) -> WalPipe:
        return WalPipe(self, rnd)

    def check(self, mode: str) -> Check:
        return check(self, mode)

    def kept_info(self) -> dict:
        return {"truncation_point": self.cut}

    @property
    def keep_from(self) -> int:
        """Records below this LSN may have been truncated (whole segments go)."""
        return self.cut // self.segment_size * self.segment_size

    def acknowledge(self, key: Key, lsns: list[int]) -> None:
        """The child acknowledged records 0..len(lsns)-1 of ``key`` at these LSNs."""
        self._merge(key, 0, np.asarray(lsns, np.uint64))

    def absorb(self, check: Check) -> None:
        """What a recovery returned is durable from now on; forget what truncation took.
        A round's runs end where this first recovery after it ended them."""
        for key, (first, lsns) in check.runs.items():
            self._merge(key, first, np.asarray(lsns, np.uint64))
        newest = max(self.rounds, default=None)
        for key in set(self.known) | set(check.runs):
            if key[0] == newest and key not in self.ended:
                self.ended[key] = check.seen_end(key)
        gone = [k for k, v in self.known.items()
                if k not in check.runs and not (v >= self.keep_from).any()]
        for key in gone:
            del self.known[key]

    def _merge(self, key: Key, first: int, lsns: np.ndarray) -> None:
        old = self.known.get(key, np.zeros(0, np.uint64))
        new = np.zeros(max(len(old), first + len(lsns)), np.uint64)
        new[:len(old)] = old
        new[first:first + len(lsns)] = lsns
        self.known[key] = new

    def missing(self, runs: dict[Key, tuple[int, list[int]]], problems: list[str]) -> int:
        """Known records above the truncation point absent from ``runs`` (or elsewhere)."""
        lost = 0
        for key, lsns in self.known.items():
            need = (lsns >= self.keep_from) & (lsns != 0)  # LSN 0 is never a record: unknown
            if not need.any():
                continue
            present = np.zeros(len(lsns), bool)
            if key in runs:
                first, got = runs[key]
                hi = min(len(lsns), first + len(got))
                if hi > first:
                    present[first:hi] = lsns[first:hi] == np.asarray(got[:hi - first], np.uint64)
            gone = np.flatnonzero(need & ~present)
            if len(gone):
                lost += len(gone)
                seq = int(gone[0])
                problems.append(f"lost: round {key[0]} thread {key[1]}: {len(gone)} records, "
                                f"first seq {seq} at {pmemwal.format_lsn(int(lsns[seq]))}")
        return lost


class WalPipe:
    """A WAL child's pipe lines of one round: acknowledgements (A) and truncations (T);
    the acknowledgements go into the ledger at ``finish``."""

    TAGS = (b"A", b"T")

    def __init__(self, ledger: Ledger, rnd: int) -> None:
        self._ledger, self._rnd = ledger, rnd
        self.acks: dict[int, list[int]] = {}
        self.ops = {"truncations": 0}

    def opened(self, fields: list[int]) -> None:
        """The R line's insert LSN: nothing to hold it against."""

    def line(self, tag: bytes, fields: list[int]) -> None:
        if tag == b"A":
            thread, seq, lsns = fields[0], fields[1], fields[2:]
            mine = self.acks.setdefault(thread, [])
            if seq != len(mine):
                raise PipeError(f"thread {thread} acknowledged seq {seq} after {len(mine)} records")
            mine.extend(lsns)
        else:
            self._ledger.cut = max(self._ledger.cut, fields[0])
            self.ops["truncations"] += 1

    def finish(self) -> None:
        for thread, lsns in self.acks.items():
            self._ledger.acknowledge((self._rnd, thread), lsns)

    @property
    def acked_seqs(self) -> dict[int, int]:
        return {t: len(v) for t, v in self.acks.items()}


# ---- one crash --------------------------------------------------------------------

@dataclass
class ChildRun:
    """What the parent saw of one child: its pipe, how it ended, what it acknowledged."""

    persist_method: str | None
    acknowledged: int
    acked_seqs: dict[int, int]      # thread -> records acknowledged
    ops: dict[str, int]             # operations announced, by kind (truncations, rewinds...)
    delay_s: float
    returncode: int
    failure: str | None             # did not get ready, died by itself, broke the protocol
    in_recovery: bool               # killed ``delay_s`` after it began to open, not once ready
    pipe: bytes
    stderr: bytes


def crash_round(ledger: TortureDir, setup: Setup, rnd: int, seed: str, threads: int,
                delay_s: float, timeout: float = 60.0, checkpoint: float = 0.0,
                in_recovery: bool = False) -> ChildRun:
    """Run a child on the ledger's WAL, SIGKILL it ``delay_s`` after it is ready (with
    ``in_recovery``, after it began to open: the kill may land inside its recovery, and
    the check's recovery is then a second one), and record what it acknowledged and
    announced in the ledger; with ``checkpoint``, a thread of the child truncates every
    that many seconds besides the writers."""
    spec = {"dir": ledger.path, "mode": setup.mode, "segment_size": setup.segment_size,
            "slots": setup.slots, "threads": threads, "round": rnd, "seed": seed,
            "checkpoint": checkpoint, **ledger.begin(rnd)}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", ledger.CHILD, json.dumps(spec)],
                                stdout=subprocess.PIPE, stderr=err, env=child_env(setup.persist))
        pipe = _PipeReader(proc.stdout)
        if (pipe.opening if in_recovery else pipe.ready).wait(timeout) and not pipe.eof:
            time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)  # nothing happens if it has already exited
        proc.wait()
        pipe.join()
        err.seek(0)
        stderr = err.read()
    run = _read_pipe(ledger.reader(rnd), pipe.data(), proc.returncode, stderr, delay_s,
                     in_recovery)
    expected = PERSIST[setup.persist][1]
    if run.failure is None and run.persist_method not in (expected, None if in_recovery else expected):
        run.failure = f"persist method {run.persist_method}, expected {expected}"
    return run


class _PipeReader(threading.Thread):
    """Reads the child's stdout to the end, so it never blocks on a full pipe."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self._stream, self._chunks = stream, []
        self.opening, self.ready, self.eof = threading.Event(), threading.Event(), False
        self.start()

    def run(self) -> None:
        fd = self._stream.fileno()
        while chunk := os.read(fd, 1 << 16):
            self._chunks.append(chunk)
            self.opening.set()  # (its first line is "O")
            if not self.ready.is_set() and b"\nR " in b"\n" + self.data():
                self.ready.set()
        self.eof = True
        self.opening.set()
        self.ready.set()
        self._stream.close()

    def data(self) -> bytes:
        return b"".join(self._chunks)


def _read_pipe(reader, data: bytes, returncode: int, stderr: bytes, delay_s: float,
               in_recovery: bool = False) -> ChildRun:
    """Parse a child's pipe: the O and R lines here, the workload's lines in its ``reader``."""
    persist, failure = None, None
    for line in data.split(b"\n")[:-1]:  # the last piece is empty, or cut off by the kill
        tag, *fields = line.split() or [b""]
        try:
            if tag == b"O" and persist is None:
                continue
            if tag == b"R" and persist is None:
                persist = fields[0].decode()
                reader.opened([int(f) for f in fields[1:]])
            elif persist is not None and tag in reader.TAGS:
                reader.line(tag, [int(f) for f in fields])
            else:
                raise PipeError(f"unexpected pipe line {line[:80]!r}")
        except PipeError as error:
            failure = str(error)
        except (ValueError, IndexError):
            failure = f"unexpected pipe line {line[:80]!r}"
        if failure:
            break
    if failure is None and (returncode != -signal.SIGKILL or b"Traceback" in stderr):
        # a writer that failed just before the kill has written its traceback
        failure = f"child exited with status {returncode}: {stderr.decode(errors='replace')[-2000:]}"
    elif failure is None and persist is None and not in_recovery:
        failure = "child never got ready"
    reader.finish()
    seqs = reader.acked_seqs
    return ChildRun(persist, sum(seqs.values()), seqs, reader.ops, delay_s, returncode, failure,
                    in_recovery, data, stderr)


# ---- the check --------------------------------------------------------------------

@dataclass
class Check:
    """What one recovery returned, held against the ledger."""

    recovery_s: float
    scanned: int
    lost: int
    garbage: int
    order: int
    error: str | None                           # open or reading raised
    runs: dict[Key, tuple[int, list[int]]]      # (round, thread) -> (first seq, LSNs)
    problems: list[str]
    resurrected: int = 0    # back from the dead: a record an earlier recovery discarded, or
    #                         (the log workload) an entry a done rewind or reset voided
    state_errors: int = 0   # the log workload: first index or hard state not as acknowledged
    checked: int = 0        # the log workload: entries that had to be back, looked for

    @property
    def ok(self) -> bool:
        return not (self.lost or self.garbage or self.order or self.error or self.resurrected
                    or self.state_errors)

    def seen_end(self, key: Key) -> int:
        """One past the last sequence number of ``key`` that recovery returned (0: none)."""
        return _run_end(self.runs.get(key))


def check(ledger: Ledger, mode: str) -> Check:
    """Reopen the ledger's WAL (timing recovery), read every record and check it."""
    reading = _Reading(ledger)
    recovery_s, error = 0.0, None
    start = time.perf_counter()
    try:
        wal = pmemwal.open(ledger.path, mode=mode, create=False, background=False,
                           segment_size=ledger.segment_size)
    except Exception as e:  # WALError expected; anything else is a bug to report, too
        error = f"open: {type(e).__name__}: {e}"
    else:
        recovery_s = time.perf_counter() - start
        with wal:
            try:
                for rec in wal.records():
                    reading.add(rec.lsn, bytes(rec.payload), rec.prev_lsn)
            except Exception as e:
                error = f"read: {type(e).__name__}: {e}"
    problems = reading.problems + ([error] if error else [])
    lost = ledger.missing(reading.runs, problems)
    return Check(recovery_s, reading.scanned, lost, reading.garbage, reading.order, error,
                 reading.runs, problems, resurrected=reading.resurrected)


class _Reading:
    """The records of one recovery, in LSN order: garbage and order checks as they come."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.runs: dict[Key, tuple[int, list[int]]] = {}
        self.scanned = self.garbage = self.order = self.resurrected = 0
        self.problems: list[str] = []
        self._last_lsn, self._last_round = -1, -1

    def add(self, lsn: int, data: bytes, prev_lsn: int | None = None) -> None:
        self.scanned += 1
        where = pmemwal.format_lsn(lsn)
        if lsn <= self._last_lsn:
            self._violation(f"LSN {where} after {pmemwal.format_lsn(self._last_lsn)}")
        elif self._last_lsn >= 0 and prev_lsn is not None and prev_lsn != self._last_lsn:
            self._violation(f"the record at {where} follows {pmemwal.format_lsn(prev_lsn)}, "
                            f"but the record read before is at "
                            f"{pmemwal.format_lsn(self._last_lsn)}: a record was skipped")
        self._last_lsn = lsn
        ident = parse_record(data)
        if ident is None or ident[0] not in self._ledger.rounds:
            self.garbage += 1
            self.problems.append(f"garbage: {len(data)} bytes at {where} "
                                 f"({'round ' + str(ident[0]) if ident else 'bad content'})")
            return
        rnd, thread, seq = ident
        ended = self._ledger.ended.get((rnd, thread))
        if ended is not None and seq >= ended:
            self.resurrected += 1
            self.problems.append(f"resurrected: round {rnd} thread {thread} seq {seq} at "
                                 f"{where}, which the recovery after round {rnd} had "
                                 f"discarded (it ended the run at {ended})")
        if rnd < self._last_round:
            self._violation(f"round {rnd} at {where} after round {self._last_round}")
        self._last_round = max(self._last_round, rnd)
        run = self.runs.get((rnd, thread))
        if run is None:
            if seq and not self._ledger.keep_from:  # only a truncation may cut a run's start
                self._violation(f"round {rnd} thread {thread} starts at seq {seq} ({where})")
            self.runs[(rnd, thread)] = (seq, [lsn])
        elif seq != run[0] + len(run[1]):
            self._violation(f"round {rnd} thread {thread}: seq {seq} at {where}, "
                            f"expected {run[0] + len(run[1])}")
        else:
            run[1].append(lsn)

    def _violation(self, text: str) -> None:
        self.order += 1
        self.problems.append(f"order: {text}")


# ---- the report -------------------------------------------------------------------

@dataclass
class RoundResult:
    """One round: its setup, the child, the check, records appended as far as seen."""

    rnd: int
    setup: Setup
    child: ChildRun
    check: Check | None   # None when the child failed before anything could be checked
    appended: int

    @property
    def ok(self) -> bool:
        return self.child.failure is None and self.check is not None and self.check.ok


def _stats(values: list[float], *names: str) -> dict[str, float]:
    if not values:
        return {n: 0.0 for n in names}
    funcs = {"p50": lambda a: np.percentile(a, 50), "p99": lambda a: np.percentile(a, 99),
             "max": np.max, "min": np.min, "mean": np.mean}
    return {n: round(float(funcs[n](np.asarray(values))), 3) for n in names}


@dataclass
class TortureReport:
    """Totals of a torture run; ``ok`` when nothing was lost, garbled, misordered, resurrected
    or failed, and every recovered hard state was as acknowledged."""

    seed: int
    workload: str = "wal"
    rounds: int = 0
    appended: int = 0
    acknowledged: int = 0
    checked: int = 0              # the log workload: entries held against recoveries
    lost: int = 0
    garbage: int = 0
    order_violations: int = 0
    resurrected: int = 0
    state_errors: int = 0
    recovery_errors: int = 0
    child_failures: int = 0
    ops: dict[str, int] = field(default_factory=dict)   # announced, by kind
    silent_rounds: int = 0        # the child acknowledged nothing: a hang shows up here
    recovery_kills: int = 0       # rounds killed before the child's open returned (in its recovery)
    wal_dirs: int = 0
    elapsed_s: float = 0.0
    recovery_ms: list[float] = field(default_factory=list)
    scanned: list[int] = field(default_factory=list)
    delays_ms: list[float] = field(default_factory=list)
    per_config: dict[str, dict] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    path: str | None = None       # the base directory, when it is left behind

    MAX_PROBLEMS = 50

    @property
    def ok(self) -> bool:
        return not (self.lost or self.garbage or self.order_violations or self.resurrected
                    or self.state_errors or self.recovery_errors or self.child_failures)

    @property
    def truncations(self) -> int:
        return self.ops.get("truncations", 0)

    def add(self, result: RoundResult) -> None:
        """Count one round in."""
        child, chk = result.child, result.check
        self.rounds += 1
        self.appended += result.appended
        self.acknowledged += child.acknowledged
        for kind, n in child.ops.items():
            self.ops[kind] = self.ops.get(kind, 0) + n
        self.silent_rounds += child.acknowledged == 0 and not child.in_recovery
        self.recovery_kills += child.in_recovery and child.persist_method is None
        if not child.in_recovery:
            self.delays_ms.append(child.delay_s * 1e3)
        self.child_failures += child.failure is not None
        problems = [f"child: {child.failure}"] if child.failure else []
        cfg = self.per_config.setdefault(result.setup.key, {
            "rounds": 0, "acknowledged": 0, "lost": 0, "garbage": 0, "persist_methods": []})
        cfg["rounds"] += 1
        cfg["acknowledged"] += child.acknowledged
        if child.persist_method and child.persist_method not in cfg["persist_methods"]:
            cfg["persist_methods"].append(child.persist_method)
        if chk is not None:
            self._add_check(chk, cfg)
            problems += chk.problems
        room = self.MAX_PROBLEMS - len(self.problems)
        self.problems += [f"round {result.rnd} ({result.setup.key}): {p}" for p in problems][:room]

    def _add_check(self, chk: Check, cfg: dict) -> None:
        self.checked += chk.checked
        self.lost += chk.lost
        self.garbage += chk.garbage
        self.order_violations += chk.order
        self.resurrected += chk.resurrected
        self.state_errors += chk.state_errors
        self.recovery_errors += chk.error is not None
        cfg["lost"] += chk.lost
        cfg["garbage"] += chk.garbage
        if chk.error is None:
            self.recovery_ms.append(chk.recovery_s * 1e3)
            self.scanned.append(chk.scanned)

    def to_dict(self) -> dict:
        """Everything, JSON-ready."""
        return {
            "ok": self.ok, "seed": self.seed, "workload": self.workload, "rounds": self.rounds,
            "appended": self.appended, "acknowledged": self.acknowledged, "checked": self.checked,
            "lost": self.lost, "garbage": self.garbage,
            "order_violations": self.order_violations, "resurrected": self.resurrected,
            "state_errors": self.state_errors, "recovery_errors": self.recovery_errors,
            "child_failures": self.child_failures, **self.ops,
            "silent_rounds": self.silent_rounds, "recovery_kills": self.recovery_kills,
            "wal_dirs": self.wal_dirs, "elapsed_s": round(self.elapsed_s, 1),
            "recovery_ms": _stats(self.recovery_ms, "p50", "p99", "max"),
            "records_per_recovery": _stats(self.scanned, "p50", "mean", "max"),
            "kill_delay_ms": _stats(self.delays_ms, "min", "mean", "max"),
            "per_config": self.per_config, "kept": self.kept, "problems": self.problems,
            "path": self.path,
        }

    def table(self) -> str:
        """A human summary: totals, recovery times, then one line per configuration."""
        d = self.to_dict()
        rec, scan, delay = d["recovery_ms"], d["records_per_recovery"], d["kill_delay_ms"]
        log = self.workload == "log"
        noun = "entries" if log else "records"   # as long as each other: the columns stay
        lines = [
            f"rounds:               {self.rounds} in {self.elapsed_s:.0f} s "
            f"({self.wal_dirs} WAL directories, seed {self.seed})",
            f"{noun} appended:     {self.appended}",
            f"{noun} acknowledged: {self.acknowledged}",
            *([f"entries checked:      {self.checked} (acknowledged or recovered before: "
               "each must be back at its index)"] if log else []),
            f"{noun} lost:         {self.lost}",
            f"{noun} resurrected:  {self.resurrected}",
            f"garbage {noun}:      {self.garbage}",
            f"order violations:     {self.order_violations}",
            *([f"state errors:         {self.state_errors} (first index, hard state)"]
              if log else []),
            f"recovery errors:      {self.recovery_errors}",
            f"child failures:       {self.child_failures}",
            *(f"{kind.replace('_', ' ') + ':':<22}{n}" for kind, n in self.ops.items()),
            f"silent rounds:        {self.silent_rounds} (nothing acknowledged before the kill)",
            f"kills in recovery:    {self.recovery_kills} (before the child's open returned)",
            f"recovery time:        p50 {rec['p50']:.2f} ms, p99 {rec['p99']:.2f} ms, "
            f"max {rec['max']:.2f} ms",
            f"{noun} per recovery: p50 {scan['p50']:.0f}, mean {scan['mean']:.0f}, "
            f"max {scan['max']:.0f}",
            f"kill delay:           {delay['min']:.0f}..{delay['max']:.0f} ms, "
            f"mean {delay['mean']:.0f} ms",
            "",
            f"{'config':<18} {'rounds':>6} {'acked':>9} {'lost':>5} {'garbage':>7}  persist",
        ]
        for key, c in sorted(self.per_config.items()):
            lines.append(f"{key:<18} {c['rounds']:>6} {c['acknowledged']:>9} {c['lost']:>5} "
                         f"{c['garbage']:>7}  {','.join(c['persist_methods'])}")
        lines += [f"kept: {k}" for k in self.kept] + [f"problem: {p}" for p in self.problems]
        lines += [f"path: {self.path}"] if self.path else []
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


# ---- the run ----------------------------------------------------------------------

@dataclass
class TortureConfig:
    """A torture run.

    ``path`` is the base directory for the WAL directories and the kept ones;
    None: a fresh one under /dev/shm, removed at the end unless ``keep`` or a
    round failed.
    """

    path: str | None = None
    rounds: int = 200
    threads: int = 4
    seed: int | None = None                 # None: a random one, in the report
    modes: tuple[str, ...] = tuple(PERSIST)
    segment_sizes: tuple[int, ...] = (1 << 20, 2 << 20, 4 << 20)
    slots: tuple[int, ...] = (1, 8, 256)
    rounds_per_dir: int = 50
    max_dir_bytes: int = 256 << 20
    delay_ms: tuple[float, float] = (5.0, 300.0)
    recovery_kill_odds: float = 0.15        # a round's kill lands after the child began to open ...
    recovery_kill_ms: tuple[float, float] = (0.0, 10.0)  # ... this long after, often in recovery
    keep: bool = False                      # leave the last WAL directory behind
    workload: str = "wal"                   # one of WORKLOADS
    checkpoint: float = 0.0                 # s between a checkpointer thread's truncations; 0: none

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload {self.workload!r}: choose from {', '.join(WORKLOADS)}")
        if self.checkpoint < 0 or (self.checkpoint and self.workload != "wal"):
            raise ValueError(f"checkpoint {self.checkpoint}: 0 or more seconds, wal workload only")
        bad = [m for m in self.modes if m not in PERSIST]
        if bad or not self.modes:
            raise ValueError(f"modes {bad or '(none)'}: choose from {', '.join(PERSIST)}")
        if "pmem" in self.modes and libpmem.load() is None:
            raise ValueError("mode pmem needs libpmem, which is not installed (or disabled)")
        if not self.segment_sizes or not self.slots or self.rounds < 1 or self.threads < 1:
            raise ValueError("segment sizes, slots, rounds and threads must not be empty or 0")
        if not all(map(is_valid_segment_size, self.segment_sizes)):
            raise ValueError(f"segment sizes {self.segment_sizes}: powers of two, 1 MiB to 1 GiB")
        if not all(1 <= s <= 256 for s in self.slots):
            raise ValueError(f"slots {self.slots}: from 1 to 256")


Progress = Callable[[TortureReport, RoundResult], None]
WORKLOADS = ("wal", "log")  # records of a WAL; entries of a pmemwal.Log (log_workload)


def ledger_type(workload: str) -> type[TortureDir]:
    """The ledger class of a workload (the log's module builds on this one: imported late)."""
    if workload == "log":
        from pmemwal.tools.log_workload import LogLedger
        return LogLedger
    return Ledger


def parse_modes(text: str) -> tuple[str, ...]:
    """``"buffered,direct,pmem"`` -> a tuple of persist setups."""
    modes = tuple(m.strip().lower() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in PERSIST]
    if bad or not modes:
        raise ValueError(f"modes {text!r}: a comma-separated list of {', '.join(PERSIST)}")
    return modes


def parse_ints(text: str, parse: Callable[[str], int] = int) -> tuple[int, ...]:
    """``"1,8,256"`` (or sizes with a parser) -> a tuple of integers."""
    values = tuple(parse(v.strip()) for v in text.split(",") if v.strip())
    if not values:
        raise ValueError(f"{text!r}: expected a comma-separated list")
    return values


def run(config: TortureConfig, progress: Progress | None = None) -> TortureReport:
    """Run ``config.rounds`` rounds of append, SIGKILL, recover and check."""
    seed = config.seed if config.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(seed)
    report = TortureReport(seed=seed, workload=config.workload)
    new_ledger = ledger_type(config.workload)
    base = config.path or tempfile.mkdtemp(prefix="pmemwal-torture-", dir=_SHM)
    os.makedirs(base, exist_ok=True)
    crash_image = os.path.join(base, "crash-image")
    setups = _setups(config, rng)
    ledger: TortureDir | None = None
    start = time.perf_counter()
    in_recovery = False  # (the first round's child opens a new WAL)
    try:
        for rnd in range(config.rounds):
            if ledger is None or len(ledger.rounds) >= config.rounds_per_dir \
                    or ledger.size() > config.max_dir_bytes:
                _discard(ledger)
                size = config.segment_sizes[report.wal_dirs % len(config.segment_sizes)]
                ledger = new_ledger(tempfile.mkdtemp(prefix="wal-", dir=base), size)
                report.wal_dirs += 1
            persist, slots = next(setups)
            setup = Setup(persist, ledger.segment_size, slots)
            in_recovery = in_recovery and bool(ledger.rounds)  # (a new WAL: nothing to recover)
            # drawn a round ahead: a round before a kill in recovery leaves its WAL crashed
            next_in_recovery = rng.random() < config.recovery_kill_odds
            delay = rng.uniform(*(config.recovery_kill_ms if in_recovery else config.delay_ms)) / 1e3
            result = play_round(ledger, setup, rnd, f"{seed}/{rnd}", config.threads, delay,
                                crash_image, config.checkpoint, in_recovery, next_in_recovery)
            in_recovery = next_in_recovery
            report.add(result)
            if not result.ok:
                report.kept.append(_keep(ledger, result, crash_image, base))
                _discard(ledger)
                ledger = None
            report.elapsed_s = time.perf_counter() - start
            if progress:
                progress(report, result)
    finally:
        if not config.keep:
            _discard(ledger)
        shutil.rmtree(crash_image, ignore_errors=True)
        if config.path is None and not config.keep and not report.kept:
            shutil.rmtree(base, ignore_errors=True)
    report.path = base if os.path.isdir(base) else None
    return report


def _setups(config: TortureConfig, rng: random.Random) -> Iterator[tuple[str, int]]:
    """(persist setup, slots) pairs: every pair once in each shuffled cycle."""
    pairs = list(itertools.product(config.modes, config.slots))
    while True:
        rng.shuffle(pairs)
        yield from pairs


def play_round(ledger: TortureDir, setup: Setup, rnd: int, seed: str, threads: int, delay_s: float,
               crash_image: str | None = None, checkpoint: float = 0.0,
               in_recovery: bool = False, keep_crashed: bool = False) -> RoundResult:
    """One round: crash a child, copy the WAL as the kill left it, recover, check, absorb.
    With ``keep_crashed`` the check recovers a copy, and the WAL stays as the kill left
    it: the next child's open is then a crash recovery (a kill inside it interrupts the
    scan, the wipe, the checkpoint rewrite), not the quick open of a cleanly closed WAL."""
    child = crash_round(ledger, setup, rnd, seed, threads, delay_s, checkpoint=checkpoint,
                        in_recovery=in_recovery)
    if child.failure and not any(n.endswith(".wal") for n in os.listdir(ledger.path)):
        return RoundResult(rnd, setup, child, None, 0)
    if crash_image:
        shutil.rmtree(crash_image, ignore_errors=True)
        shutil.copytree(ledger.path, crash_image)
    chk = _check_copy(ledger, setup.mode) if keep_crashed else ledger.check(setup.mode)
    ledger.absorb(chk)
    appended = sum(max(child.acked_seqs.get(t, 0), chk.seen_end((rnd, t))) for t in range(threads))
    return RoundResult(rnd, setup, child, chk, appended)


def _check_copy(ledger: TortureDir, mode: str):
    """The ledger's check, of a copy of its WAL directory."""
    real, copy = ledger.path, ledger.path + ".check"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(real, copy)
    ledger.path = copy
    try:
        return ledger.check(mode)
    finally:
        ledger.path = real
        shutil.rmtree(copy, ignore_errors=True)


def _run_end(run: tuple[int, list[int]] | None) -> int:
    return run[0] + len(run[1]) if run else 0


def _keep(ledger: TortureDir, result: RoundResult, crash_image: str, base: str) -> str:
    """Keep a failed round for investigation: the WAL before and after recovery, the pipe."""
    kept = tempfile.mkdtemp(prefix=f"kept-round{result.rnd:05d}-", dir=base)
    if os.path.isdir(crash_image):
        shutil.copytree(crash_image, os.path.join(kept, "wal-at-kill"))
    shutil.copytree(ledger.path, os.path.join(kept, "wal-after-recovery"))
    with open(os.path.join(kept, "pipe.txt"), "wb") as f:
        f.write(result.child.pipe)
    chk = result.check
    info = {"round": result.rnd, "setup": result.setup.key, "mode": result.setup.mode,
            "segment_size": result.setup.segment_size, "slots": result.setup.slots,
            "delay_ms": result.child.delay_s * 1e3, "rounds_in_dir": sorted(ledger.rounds),
            **ledger.kept_info(), "failure": result.child.failure,
            "stderr": result.child.stderr.decode(errors="replace")[-4000:],
            "problems": chk.problems if chk else []}
    with open(os.path.join(kept, "round.json"), "w") as f:
        json.dump(info, f, indent=2)
    return kept


def _discard(ledger: TortureDir | None) -> None:
    if ledger is not None:
        shutil.rmtree(ledger.path, ignore_errors=True)

