"""The shared-processes workload of the crash torture: several processes append to one WAL;
one is SIGKILLed at random moments and replaced; the survivors must go on; at the end
every acknowledged record is there.  (``pmemwal torture --processes N``;
tests/test_shared.py runs it short.)  Its round is not the round driver's (one child,
killed, checked): it has its own loop (``run``), with the same child entry point.

Each writer (the ``shared`` workload's child) opens the WAL with ``shared=True``, says
``R <processes>``, and appends self-describing records (``records.make_record``, its
incarnation as the round) with ``flush=True`` from several threads, forever.  Pipe
lines, one locked write each:

    A <thread> <seq> <lsn>   that record is durable: its append(flush=True) returned
    T <lsn>                  about to truncate before lsn (checkpoint_every > 0)

The driver:

1. keeps ``processes`` writers running for ``seconds``, killing a random one every
   ``kill_interval`` (jittered) and starting a new incarnation in its place.  Two kills
   in three first arm the core's "stall" ("stall_locked") test hook in the victim
   (SIGUSR1, SIGUSR2), which stops its next insertion once its space is reserved (inside
   the reservation lock), so that the kill certainly finds it mid-insert; the others
   land wherever the victim is;
2. after each kill, measures how long until every thread of every survivor acknowledges
   a record that it appended after the kill (its stall): a dead writer's unfinished
   insertion must not block the others' flushes (the first to wait for it closes its
   range).  A writer that exits on its own (a thread that fails ends its process), or
   a thread that stops acknowledging while its siblings go on, is reported, at a kill
   and at the end;
3. at the end kills them all, opens the WAL in one process (recovery), reads every
   record and checks: every acknowledged record is present at its LSN with every byte
   regenerating (none lost), LSNs increase, each thread's records come in sequence
   order, nothing else is there (no garbage: a closed range is never returned as a
   record).  Records below the oldest segment left by truncations (``checkpoint_every``)
   are not required; anything at or above it must be there.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pmemwal
from pmemwal.tools.recovery_warnings import recovery_warnings
from pmemwal.tools.torture.childkit import Pipe, run_threads
from pmemwal.tools.torture.plugin import CHILD, TortureWorkload
from pmemwal.tools.torture.records import make_record, parse_record

_CHILD = CHILD  # (a test starts a child of its own instead)


@dataclass
class SharedTortureConfig:
    """What to run: ``processes`` writers of ``threads`` threads each, records of
    ``min_size``..``max_size`` bytes, for ``seconds``, killing one every ``kill_interval``
    seconds on average; ``checkpoint_every``: each writer's thread 0 truncates every this
    many records (0: never); ``stall_bound``: the longest a survivor may go without an
    acknowledgement after a kill before it counts as blocked; ``min_kills``: go on past
    ``seconds`` until this many kills (where starting interpreters is slow, as under a
    sanitizer, ``seconds`` alone may leave room for one)."""

    path: str | None = None
    processes: int = 3
    threads: int = 2
    seconds: float = 10.0
    kill_interval: float = 0.5
    min_size: int = 20
    max_size: int = 64 << 10
    segment_size: int = 1 << 20
    checkpoint_every: int = 0
    stall_bound: float = 10.0
    min_kills: int = 0
    seed: int | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class SharedTortureReport:
    """What happened and what was found."""

    kills: int = 0
    incarnations: int = 0
    acknowledged: int = 0
    found: int = 0
    lost: list[str] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)  # seconds, one per survivor per kill
    blocked: list[str] = field(default_factory=list)
    voids: int = 0  # ranges closed after a writer died mid-insert (void records)
    seconds: float = 0.0
    path: str = ""
    seed: int = 0   # what reproduces the run (printed: also when chosen at random)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.garbage or self.order or self.blocked)

    def summary(self) -> str:
        worst = max(self.stalls, default=0.0)
        return (f"{self.incarnations} writer processes, {self.kills} SIGKILLed mid-run; "
                f"{self.acknowledged} records acknowledged, {self.found} found, "
                f"{self.voids} ranges closed after a death; "
                f"{len(self.lost)} lost, {len(self.garbage)} garbage, {len(self.order)} out of "
                f"order; survivors' longest wait after a kill {worst * 1000:.0f} ms "
                f"({len(self.blocked)} over the bound); {self.seconds:.1f} s; seed {self.seed}")

    def to_dict(self) -> dict:
        return {"ok": self.ok, "kills": self.kills, "incarnations": self.incarnations,
                "acknowledged": self.acknowledged, "found": self.found, "voids": self.voids, "lost": self.lost[:20],
                "garbage": self.garbage[:20], "order": self.order[:20], "blocked": self.blocked,
                "max_stall_s": max(self.stalls, default=0.0), "seconds": self.seconds,
                "path": self.path, "seed": self.seed}


class _Writer:
    """One writer process and the acknowledgements read from its pipe."""

    def __init__(self, config: SharedTortureConfig, incarnation: int, path: str, seed: int) -> None:
        spec = {"workload": "shared", "path": path, "incarnation": incarnation, "threads": config.threads,
                "seed": seed, "min_size": config.min_size, "max_size": config.max_size,
                "segment_size": config.segment_size,
                "checkpoint_every": config.checkpoint_every}
        env = {**os.environ, **config.env}
        self.incarnation = incarnation
        self.acks: dict[tuple[int, int], int] = {}  # (thread, seq) -> lsn
        self.truncations: list[int] = []
        self.threads = config.threads
        self.last_ack: dict[int, float] = {}  # per thread: when it last acknowledged
        self.exited: int | None = None        # its exit status, had it ended before its kill
        self.ready = threading.Event()
        self.proc = subprocess.Popen([sys.executable, "-m", _CHILD, json.dumps(spec)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None, "started with stdout=PIPE"
        for line in self.proc.stdout:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == b"A" and len(parts) == 4:
                self.acks[(int(parts[1]), int(parts[2]))] = int(parts[3])
                self.last_ack[int(parts[1])] = time.monotonic()
            elif parts[0] == b"T" and len(parts) == 2:
                self.truncations.append(int(parts[1]))
            elif parts[0] == b"R":
                self.ready.set()

    def acknowledged_since(self, moment: float) -> bool:
        """Whether every one of its threads acknowledged a record after ``moment``."""
        return all(self.last_ack.get(t, 0.0) > moment for t in range(self.threads))

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # (nothing, if it has exited)
        if self.proc.wait() != -signal.SIGKILL:
            self.exited = self.proc.returncode
        self._reader.join(timeout=10)

    def error(self) -> str:
        return self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""


def run(config: SharedTortureConfig,
        progress: Callable[[SharedTortureReport], None] | None = None) -> SharedTortureReport:
    """Run the torture; the WAL directory is removed afterwards unless something was found
    (or ``config.path`` names one to keep)."""
    seed = config.seed if config.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    own_dir = config.path is None
    path = config.path or tempfile.mkdtemp(prefix="pmemwal-shared-torture-",
                                           dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    wal_path = os.path.join(path, "wal")
    report = SharedTortureReport(path=wal_path, seed=seed)
    started = time.monotonic()
    writers: list[_Writer] = []
    finished: list[_Writer] = []
    incarnation = 0

    def spawn() -> _Writer:
        nonlocal incarnation
        incarnation += 1
        writer = _Writer(config, incarnation, wal_path, seed)
        if not writer.ready.wait(30):
            writer.kill()
            raise RuntimeError(f"a writer did not open the WAL: {writer.error()}")
        return writer

    try:
        writers = [spawn() for _ in range(config.processes)]
        deadline = time.monotonic() + config.seconds  # (once they write: interpreters start
        # slowly under a sanitizer, and a run that spent its seconds starting killed none)
        while time.monotonic() < deadline or report.kills < config.min_kills:
            time.sleep(rng.uniform(0.5, 1.5) * config.kill_interval)
            victim = writers.pop(rng.randrange(len(writers)))
            hook = rng.choice((None, signal.SIGUSR1, signal.SIGUSR2))
            if hook is not None:
                victim.proc.send_signal(hook)
                time.sleep(0.05)  # its next insertion reserves and stops
            killed_at = time.monotonic()
            victim.kill()
            _exited_on_its_own(victim, report)
            report.kills += 1
            finished.append(victim)
            _survivors_go_on(writers, killed_at, config.stall_bound, report)
            writers.append(spawn())
            if progress:
                progress(report)
        _survivors_go_on(writers, time.monotonic(), config.stall_bound, report)
        for writer in writers:
            writer.kill()
            _exited_on_its_own(writer, report)
        finished.extend(writers)
        writers = []
        report.incarnations = incarnation
        _check(wal_path, finished, report)
        report.seconds = time.monotonic() - started
    finally:
        for writer in writers:
            writer.kill()
        if own_dir and report.ok:
            shutil.rmtree(path, ignore_errors=True)
    return report


def _survivors_go_on(writers: list[_Writer], killed_at: float, bound: float,
                     report: SharedTortureReport) -> None:
    """Wait until every thread of every survivor has acknowledged a record after the kill
    (or, at the end, after ``killed_at`` = now); record how long each writer took (a
    blocked one, or one with a thread that stopped: over ``bound``)."""
    waiting = {id(w): w for w in writers}
    while waiting:
        now = time.monotonic()
        for key, writer in list(waiting.items()):
            if writer.acknowledged_since(killed_at):
                report.stalls.append(max(writer.last_ack.values()) - killed_at)
                del waiting[key]
            elif writer.proc.poll() is not None:
                del waiting[key]  # (reported when it is killed: _exited_on_its_own)
            elif now - killed_at > bound:
                silent = [t for t in range(writer.threads)
                          if writer.last_ack.get(t, 0.0) <= killed_at]
                report.blocked.append(f"writer {writer.incarnation}: thread(s) "
                                      f"{', '.join(map(str, silent))} acknowledged nothing for "
                                      f"{bound} s (after a peer was killed, or at the end)")
                del waiting[key]
        time.sleep(0.002)


def _exited_on_its_own(writer: _Writer, report: SharedTortureReport) -> None:
    if writer.exited is not None:
        report.blocked.append(f"writer {writer.incarnation} exited ({writer.exited}) before it "
                              f"was killed: {writer.error()}")


def _check(wal_path: str, writers: list[_Writer], report: SharedTortureReport) -> None:
    """Reopen the WAL (recovery in one process) and hold it against the acknowledgements."""
    expected = {(w.incarnation, thread, seq): lsn for w in writers for (thread, seq), lsn in w.acks.items()}
    report.acknowledged = len(expected)
    seen: dict[tuple[int, int, int], int] = {}
    last_seq: dict[tuple[int, int], int] = {}
    announced = max((lsn for w in writers for lsn in w.truncations), default=0)
    with recovery_warnings(), pmemwal.open(wal_path, shared=True) as wal:  # (the kills')
        first = wal.first_lsn
        # what the announced truncations may have removed: whole segments below the highest
        kept_from = announced - announced % wal.segment_size
        prev = -1
        for record in wal.records():
            if record.lsn <= prev:
                report.order.append(f"LSN {record.lsn} after {prev}")
            prev = record.lsn
            key = parse_record(bytes(record.payload))
            if key is None:
                report.garbage.append(f"LSN {record.lsn}: {len(record.payload)} bytes that do not "
                                      "regenerate")
                continue
            seen[key] = record.lsn
            thread_key = key[:2]
            if last_seq.get(thread_key, -1) >= key[2]:
                report.order.append(f"LSN {record.lsn}: {key} after seq {last_seq[thread_key]}")
            last_seq[thread_key] = key[2]
        report.found = len(seen)
        report.voids = _count_voids(wal)
        for key, lsn in expected.items():
            if lsn < min(first, kept_from):
                continue  # truncated away by a checkpoint that announced it
            if seen.get(key) != lsn:
                report.lost.append(f"{key} acknowledged at LSN {lsn}, found at {seen.get(key)}")


def _count_voids(wal: pmemwal.WAL) -> int:
    """Void records in the WAL: ranges a dead writer left, closed by a survivor."""
    status, lsn = wal._reader.first_record(wal._segnos[0])
    count, prev, end = 0, -1, wal.flushed_lsn
    while status == 0 and lsn < end:
        status, _, next_lsn, _, _, _, _, _, _, void = wal._reader.read(lsn, prev)
        count += bool(void) and status == 0
        prev, lsn = lsn, next_lsn
    return count


# ---- the child ------------------------------------------------------------------------

class SharedWorkload(TortureWorkload):
    """A writer process of a shared WAL: its threads append with flush=True, forever."""

    name = "shared"

    def open(self, spec: dict) -> pmemwal.WAL:
        faulthandler.dump_traceback_later(20)  # a writer that cannot open says where it waits
        wal = pmemwal.open(spec["path"], shared=True, segment_size=spec.get("segment_size"),
                           max_wal_size=spec.get("max_wal_size", 1 << 30))
        faulthandler.cancel_dump_traceback_later()
        for signum, hook in ((signal.SIGUSR1, "stall"), (signal.SIGUSR2, "stall_locked")):
            signal.signal(signum, lambda *_, hook=hook: wal._core.inject_fault(hook, 0))
        return wal   # (the hooks before the R line: the parent may signal at once)

    def ready(self, wal: pmemwal.WAL) -> str:
        return str(wal.stats()["processes"])

    def run(self, wal: pmemwal.WAL, pipe: Pipe, spec: dict) -> None:
        """A thread that fails ends the process (exit 70): its siblings must not go on
        acknowledging as if it were writing."""
        run_threads(spec["threads"], lambda thread: _append(wal, pipe, spec, thread))


def _append(wal: pmemwal.WAL, pipe: Pipe, spec: dict, thread: int) -> None:
    """Append and acknowledge records forever; thread 0 truncates every
    ``checkpoint_every`` records, announcing it first."""
    inc, every = spec["incarnation"], spec.get("checkpoint_every", 0)
    rng = random.Random(f"{spec['seed']}-{inc}-{thread}")
    for seq in range(1 << 62):
        record = make_record(inc, thread, seq, rng.randint(spec["min_size"], spec["max_size"]))
        lsn = wal.append(record, flush=True)
        pipe.say(f"A {thread} {seq} {lsn}")
        if every and thread == 0 and seq % every == every - 1:
            before = wal.flushed_lsn - 4 * wal.segment_size
            if before > 0:
                pipe.say(f"T {before}")
                wal.truncate(before)


WORKLOAD = SharedWorkload()
