"""The round driver of the crash torture: rounds of run a child, SIGKILL it, reopen, check.

Each round a workload's child (``crash.crash_round``) opens the WAL directory, says it
is ready and works until the parent kills it after a random delay; the parent then
reopens the WAL (timing recovery) and holds what it finds against the directory's
ledger (``plugin.TortureDir``), which then takes what that recovery returned as
durable.  The next round's child reopens the same WAL and goes on.  Rounds cycle
through the persist setups (``buffered``: pwrite + fdatasync, ``direct``: msync,
``pmem``: direct with ``PMEM_IS_PMEM_FORCE=1``) and insertion slots; each WAL
directory has one segment size (a WAL's size is fixed) and lives for
``rounds_per_dir`` rounds.  Some rounds' kills land in the child's open (its
recovery), the round before leaving its WAL as the kill left it.  A round with a
violation keeps the WAL as the kill left it and as recovery left it, with the child's
pipe output, and the next round starts a fresh directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from pmemwal import libpmem
from pmemwal.format import is_valid_segment_size
from pmemwal.tools.torture.crash import crash_round
from pmemwal.tools.torture.plugin import Check, TortureDir
from pmemwal.tools.torture.report import RoundResult, TortureReport
from pmemwal.tools.torture.setups import PERSIST, Setup, setup_cycle
from pmemwal.tools.torture.workloads import WORKLOADS, round_workload

_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


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


def run(config: TortureConfig, progress: Progress | None = None) -> TortureReport:
    """Run ``config.rounds`` rounds of append, SIGKILL, recover and check."""
    seed = config.seed if config.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(seed)
    report = TortureReport(seed=seed, workload=config.workload)
    workload = round_workload(config.workload, config.checkpoint)
    base = config.path or tempfile.mkdtemp(prefix="pmemwal-torture-", dir=_SHM)
    os.makedirs(base, exist_ok=True)
    crash_image = os.path.join(base, "crash-image")
    setups = setup_cycle(config.modes, config.slots, rng)
    ledger: TortureDir | None = None
    start = time.perf_counter()
    in_recovery = False  # (the first round's child opens a new WAL)
    try:
        for rnd in range(config.rounds):
            if ledger is None or len(ledger.rounds) >= config.rounds_per_dir \
                    or ledger.size() > config.max_dir_bytes:
                _discard(ledger)
                size = config.segment_sizes[report.wal_dirs % len(config.segment_sizes)]
                ledger = workload.ledger(tempfile.mkdtemp(prefix="wal-", dir=base), size)
                report.wal_dirs += 1
            persist, slots = next(setups)
            setup = Setup(persist, ledger.segment_size, slots)
            in_recovery = in_recovery and bool(ledger.rounds)  # (a new WAL: nothing to recover)
            # drawn a round ahead: a round before a kill in recovery leaves its WAL crashed
            next_in_recovery = rng.random() < config.recovery_kill_odds
            delay = rng.uniform(*(config.recovery_kill_ms if in_recovery else config.delay_ms)) / 1e3
            result = play_round(ledger, setup, rnd, f"{seed}/{rnd}", config.threads, delay,
                                crash_image, in_recovery, next_in_recovery)
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


def play_round(ledger: TortureDir, setup: Setup, rnd: int, seed: str, threads: int, delay_s: float,
               crash_image: str | None = None, in_recovery: bool = False,
               keep_crashed: bool = False) -> RoundResult:
    """One round: crash a child, copy the WAL as the kill left it, recover, check, absorb.
    With ``keep_crashed`` the check recovers a copy, and the WAL stays as the kill left
    it: the next child's open is then a crash recovery (a kill inside it interrupts the
    scan, the wipe, the checkpoint rewrite), not the quick open of a cleanly closed WAL."""
    child = crash_round(ledger, setup, rnd, seed, threads, delay_s, in_recovery=in_recovery)
    if child.failure and not any(n.endswith(".wal") for n in os.listdir(ledger.path)):
        return RoundResult(rnd, setup, child, None, 0)
    if crash_image:
        shutil.rmtree(crash_image, ignore_errors=True)
        shutil.copytree(ledger.path, crash_image)
    chk = _check_copy(ledger, setup.mode) if keep_crashed else ledger.check(setup.mode)
    ledger.absorb(chk)
    appended = sum(max(child.acked_seqs.get(t, 0), chk.seen_end((rnd, t))) for t in range(threads))
    return RoundResult(rnd, setup, child, chk, appended)


def _check_copy(ledger: TortureDir, mode: str) -> Check:
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

