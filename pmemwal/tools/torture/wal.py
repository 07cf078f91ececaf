"""The WAL workload of the crash torture: records appended and flushed by several threads,
and its ledger of what a WAL directory must hold.

The child's writers append self-describing records (``records.make_record``), mixing
append(flush=True), plain appends flushed later (flush() or flush(lsn)), and
append_many + flush(), and after every flush that returns tell the records they
appended since their last acknowledgement; writer 0 now and then truncates the WAL,
announcing it first.  Pipe lines, child to parent (one locked write each):

    R <persist_method> <insert_lsn>     opened: recovery done, appending starts
    A <thread> <seq> <lsn> [<lsn> ...]  records seq, seq+1, ... of the thread are durable
    T <lsn>                             about to truncate before lsn

The parent's ``Ledger`` holds what the directory must contain, and ``check`` reopens
the WAL and finds:

- lost: a record that was acknowledged, or returned by an earlier recovery,
  is missing or at another LSN, and does not lie below a truncation point the
  child announced before truncating;
- garbage: a record whose bytes do not regenerate, or of a round never run here;
- resurrected: a record past where the first recovery after its round ended its run;
- order violations: LSNs not increasing or a record skipped, rounds going back, or a
  thread's records in a round not a contiguous run of sequence numbers.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np

import pmemwal
from pmemwal.tools.recovery_warnings import recovery_warnings
from pmemwal.tools.torture.childkit import Pipe, run_threads, wal_options
from pmemwal.tools.torture.plugin import Check, Key, PipeError, TortureDir, TortureWorkload
from pmemwal.tools.torture.records import make_record, parse_record, record_size

TRUNCATE_ODDS = 1 / 50   # of writer 0's operations
KEEP_SEGMENTS = 2        # a truncation keeps this much WAL behind the flushed position


# ---- the child ----------------------------------------------------------------------

def writer(wal: pmemwal.WAL, pipe: Pipe, spec: dict, thread: int) -> None:
    """Append and flush forever, acknowledging what each flush made durable."""
    rnd, segment_size = spec["round"], spec["segment_size"]
    rng = random.Random(f"{spec['seed']}/{thread}")
    seq = 0            # the next record's number
    pending = []       # LSNs of records appended since the last acknowledgement

    def record() -> bytes:
        nonlocal seq
        seq += 1
        return make_record(rnd, thread, seq - 1, record_size(rng, segment_size))

    while True:
        if thread == 0 and rng.random() < TRUNCATE_ODDS:
            truncate(wal, pipe, segment_size)
        op = rng.random()
        if op < 0.4:                               # a commit: durable when it returns
            pending.append(wal.append(record(), flush=True))
        elif op < 0.75:                            # appended now, flushed some time later
            pending.append(wal.append(record()))
            if rng.random() < 0.7:
                continue
            flushed = wal.flush() if rng.random() < 0.5 else wal.flush(pending[-1])
            assert flushed > pending[-1], (flushed, pending[-1])
        else:                                      # a batch, then a flush
            pending += wal.append_many([record() for _ in range(rng.randint(1, 16))]).tolist()
            flushed = wal.flush()
            assert flushed > pending[-1], (flushed, pending[-1])
        pipe.say(f"A {thread} {seq - len(pending)} {' '.join(map(str, pending))}")
        pending.clear()


def truncate(wal: pmemwal.WAL, pipe: Pipe, segment_size: int, redo: int | None = None) -> None:
    """Drop old segments (below ``redo`` too, when given), telling the parent first:
    records below may go from then on."""
    before = wal.flushed_lsn - KEEP_SEGMENTS * segment_size
    if redo is not None:
        before = min(before, redo)
    if before > 0:
        pipe.say(f"T {before}")
        wal.truncate(before)


class WalWorkload(TortureWorkload):
    """Records of a WAL: ``threads`` writers in the child, a ``Ledger`` in the parent."""

    name = "wal"

    def open(self, spec: dict) -> pmemwal.WAL:
        return pmemwal.open(spec["dir"], **wal_options(spec))

    def ready(self, wal: pmemwal.WAL) -> str:
        return f"{wal.persist_method} {wal.insert_lsn}"

    def run(self, wal: pmemwal.WAL, pipe: Pipe, spec: dict) -> None:
        run_threads(spec["threads"], lambda t: writer(wal, pipe, spec, t))

    def ledger(self, path: str, segment_size: int) -> Ledger:
        return Ledger(path, segment_size, workload=self.name)


WORKLOAD = WalWorkload()


# ---- the parent: what a WAL directory must hold ------------------------------------------

@dataclass
class Ledger(TortureDir[Check]):
    """A WAL workload's directory and what it must hold.

    ``known[(round, thread)][seq]`` is the LSN of every record known durable
    (acknowledged, or returned by a recovery; 0 where unknown), ``cut`` the
    highest truncation point announced.
    """

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

    TAGS: tuple[bytes, ...] = (b"A", b"T")

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



# ---- the check --------------------------------------------------------------------

def check(ledger: Ledger, mode: str) -> Check:
    """Reopen the ledger's WAL (timing recovery), read every record and check it."""
    reading = _Reading(ledger)
    recovery_s, error = 0.0, None
    start = time.perf_counter()
    try:
        with recovery_warnings():   # (a crash's, which the check judges: not the user's)
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

