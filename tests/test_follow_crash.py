"""Followers through crashes: writers and followers SIGKILLed, and simulated power loss.

Real processes (tests/_follow_child.py), real files under /dev/shm, SIGKILL:

- A writer (or a shared pair of writers) appends, flushes, appends unflushed and in batches,
  and says on its pipe what each flush acknowledged, while a follower process records
  everything pmemwal.follow yields.  The writers are killed; the follower, left to run until
  its timeout, must still deliver every acknowledged record (it was durable), and the WAL
  reopened afterwards must return everything the follower yielded: same payloads, same order,
  nothing twice: exactly the records below the last durable LSN published.  A follower
  reads no further while no writer is alive (what a dead writer had not flushed becomes
  durable, and readable, at the next writer's recovery).
- Power loss (the traced core's simulator, its follow workload: pmemwal powerloss --workload
  follow): at every crash point the durable LSN the writers had published for followers must
  name only records that survive; the mutations that publish an unsynced frontier must be
  caught, the one that publishes before its sync by the follow workload only (the wal
  workload, held to what the calls acknowledged, passes it).
- A named follower that confirms every K records is killed at random and restarted: it
  resumes at its last confirmed position, so each record is processed at least once, and
  exactly once but for those processed after the last confirm before a kill, which the next
  run processes again, first.  Truncation while it is down keeps what it has not confirmed,
  within max_follower_lag_bytes; one further behind is marked lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import pmemwal
from conftest import TESTS_DIR, child_env
from pmemwal.tools.powerloss import PowerLossReport, applies
from pmemwal.tools.traced import run_traced

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")

CHILD = str(TESTS_DIR / "_follow_child.py")
SEG = 1 << 20
IMAGES = 40

# name: (mode, environment, shared, the persist method it gets)
WRITER_CASES = {
    "buffered": ("buffered", {}, False, "fdatasync"),
    "direct-msync": ("direct", {}, False, "msync"),
    "direct-pmem": ("direct", {"PMEM_IS_PMEM_FORCE": "1"}, False, "pmem"),
    "direct-shared-pair": ("direct", {}, True, "msync"),
}


def digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(bytes(data), digest_size=8).hexdigest()


def payload(seed: int, index: int, length: int) -> bytes:  # (as the child makes them)
    return struct.pack("<Q", index) + hashlib.shake_128(
        struct.pack("<QQ", seed, index)).digest(length - 8)


@dataclass
class Child:
    """A tests/_follow_child.py process; its stdout lines collected as they come."""

    spec: dict
    env: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, CHILD, json.dumps(self.spec)],
                                     env=child_env(**self.env), stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self.lines: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    def wait_for(self, prefix: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(line.startswith(prefix) for line in list(self.lines)):
            assert self.proc.poll() is None, self.error()
            assert time.monotonic() < deadline, f"no {prefix!r} line from {self.spec['op']}"
            time.sleep(0.005)

    def kill(self) -> list[list[str]]:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL, self.error()
        return self._done()

    def finish(self, timeout: float = 30) -> list[list[str]]:
        assert self.proc.wait(timeout=timeout) == 0, self.error()
        return self._done()

    def _done(self) -> list[list[str]]:
        self._reader.join(timeout=30)
        self.proc.stdout.close()  # type: ignore[union-attr]
        assert b"Traceback" not in self._stderr(), self.error()
        return [line.decode().split() for line in self.lines if line.endswith(b"\n")]

    def _stderr(self) -> bytes:
        self.stderr.seek(0)
        return self.stderr.read()

    def error(self) -> str:
        return f"{self.spec['op']} exited {self.proc.poll()}:\n{self._stderr().decode()[-3000:]}"


def published_lsn(wal_dir: Path) -> int:
    """The durable LSN in the FOLLOW file: what followers may read up to."""
    with open(wal_dir / "FOLLOW", "rb") as f:
        return struct.unpack("<Q", f.read(72)[64:])[0]


def reopened(wal_dir: Path, mode: str, shared: bool) -> list[tuple[int, str]]:
    """(LSN, digest) of every record, as a writer's recovery finds them."""
    with pmemwal.open(wal_dir, mode=mode, shared=shared, segment_size=SEG,
                      background=False) as wal:
        return [(r.lsn, digest(r.payload)) for r in wal.records()]


# ---- 1. writers killed while a follower reads ----------------------------------------

@pytest.mark.parametrize("case", WRITER_CASES)
def test_killed_writers_follower_delivers_every_acknowledged_record_and_nothing_recovery_drops(
        case, wal_dir, shm_tmp):
    mode, env, shared, persist = WRITER_CASES[case]
    rng = random.Random(case)
    stop = shm_tmp / "stop"
    spec = {"op": "writer", "dir": str(wal_dir), "mode": mode, "shared": shared}
    writers = [Child({**spec, "seed": 1}, env)]
    writers[0].wait_for(b"READY")
    if shared:
        writers.append(Child({**spec, "seed": 2}, env))
        writers[1].wait_for(b"READY")
    for writer in writers:
        assert writer.lines[0].split() == [b"READY", persist.encode()]
    follower = Child({"op": "follower", "dir": str(wal_dir), "timeout": 0.5,
                      "stop": str(stop)}, env)
    follower.wait_for(b"Y")
    time.sleep(rng.uniform(0.2, 0.5))
    written = []
    for writer in writers:  # (a shared pair: the second writes on alone a while)
        written += writer.kill()
        time.sleep(0.1)
    stop.touch()  # the follower's last pass starts after the kills, and ends at its timeout
    yielded_lines = follower.finish()
    assert yielded_lines[-1] == ["DONE"]

    appended = {int(w[1]): (int(w[2]), int(w[3])) for w in written if w[0] == "R"}
    acked = max(int(w[1]) for w in written if w[0] == "A")
    yielded = [(int(y[1]), int(y[2]), int(y[3]), y[4]) for y in yielded_lines if y[0] == "Y"]
    lsns = [y[0] for y in yielded]
    assert lsns == sorted(set(lsns)), "the follower yielded a record twice or out of order"
    for lsn, index, length, got in yielded:  # what the writers wrote, where they wrote it
        assert got == digest(payload(index >> 32, index, length)), f"record {lsn:#x} damaged"
        assert appended.get(lsn, (index, length)) == (index, length), f"{lsn:#x}: another's"
    # (a) every acknowledged record was delivered, though its writer died
    acknowledged = sorted(lsn for lsn in appended if lsn < acked)
    assert len(acknowledged) > 50
    missing = sorted(set(acknowledged) - set(lsns))
    assert not missing, f"{len(missing)} acknowledged records never yielded, first {missing[0]:#x}"
    # (b) everything yielded is what recovery keeps: same payloads, order, nothing twice;
    # exactly what lies below the last durable LSN published (the dead writers' unflushed
    # records wait for the next writer's recovery to make them durable)
    published = published_lsn(wal_dir)
    assert acked <= published
    recovered = reopened(wal_dir, mode, shared)
    assert [(lsn, d) for lsn, _, _, d in yielded] == [r for r in recovered if r[0] < published]
    if shared:  # both writers' records, interleaved
        assert {index >> 32 for _, index, _, _ in yielded} == {1, 2}


def test_a_dead_writers_unflushed_records_are_followed_once_the_next_writer_recovers(wal_dir):
    writer = Child({"op": "writer", "dir": str(wal_dir), "mode": "direct", "seed": 1,
                    "hold_after": 300})
    writer.wait_for(b"HOLD")
    written = writer.kill()
    appended = sorted(int(w[1]) for w in written if w[0] == "R")
    published = published_lsn(wal_dir)
    assert appended[-5] >= published  # (the last five: never flushed)
    with pmemwal.follow(wal_dir, timeout=0.2) as follower:
        before = [r.lsn for r in follower]  # no writer: up to the published LSN only
        assert before == [lsn for lsn in appended if lsn < published]
        with pmemwal.open(wal_dir, mode="direct", segment_size=SEG, background=False):
            after = [r.lsn for r in follower]  # recovery made them durable, and published
        assert before + after == appended


# ---- 2. power loss: what was published for followers survives -------------------------

def follow_power_loss(mode: str, mutation: str | None = None, workload: str = "follow",
                      **options) -> PowerLossReport:
    """``pmemwal powerloss --workload follow`` (one setup, IMAGES images; a child on the
    traced core)."""
    return run_traced(mode, IMAGES, seed=1, workload=workload, mutation=mutation, **options)


def lost_past_acknowledged(report: PowerLossReport) -> None:
    """The run failed, on records published for followers."""
    assert not report.ok and report.lost > 0, report.to_dict()
    assert any("published for followers" in f for f in report.failures), report.failures


@pytest.mark.parametrize("mode, options", [("msync", {}), ("buffered", {}),
                                           ("pmem", {"streaming": True})])
def test_power_loss_keeps_every_record_below_the_published_durable_lsn(mode, options):
    report = follow_power_loss(mode, threads=4, **options)
    assert report.ok and not report.failures, report.failures
    assert report.images == IMAGES and report.workload == "follow"
    # the published LSN ran ahead of what the calls had returned: a stronger horizon
    assert report.published_ahead > 0, report.to_dict()


def test_publishing_an_unsynced_frontier_is_caught():
    """commit-syncs-own-record: a commit syncs to its own record's end, yet publishes the
    frontier past other writers' unsynced records; images then lose records a follower
    could have read (the check can fail)."""
    report = follow_power_loss("msync", "commit-syncs-own-record", threads=4)
    assert not report.ok and report.lost + report.recovery_errors > 0, report.to_dict()


@pytest.mark.parametrize("mode", ["msync", "buffered"])
def test_publishing_before_the_sync_is_caught_by_the_follow_workload_alone(mode):
    """publish-before-sync: a flush tells followers its frontier is durable before its
    msync or fdatasync, and acknowledges after it.  The wal workload, holding images to what
    the calls returned, passes it (its blind spot); the follow workload loses records."""
    blind = follow_power_loss(mode, "publish-before-sync", workload="wal", threads=4)
    assert blind.ok and not blind.failures and blind.images == IMAGES, blind.failures
    lost_past_acknowledged(follow_power_loss(mode, "publish-before-sync", threads=4))


def test_the_follow_workload_takes_the_setups_of_one_wal_handle():
    assert all(applies(setup, "follow") for setup in ("msync", "buffered-threads", "msync-kill",
                                                      "pmem-checkpointer", "msync-background"))
    assert not applies("pmem-shared", "follow") and not applies("buffered-log", "follow")


def test_the_default_power_loss_run_holds_images_to_what_followers_were_shown():
    """``pmemwal powerloss`` with no --setups runs msync-threads-follow: the follow workload
    (4 writers' group commit), so the default run catches publish-before-sync too."""
    from pmemwal.tools import powerloss
    defaults = [s for s in powerloss.SETUPS if s not in powerloss.NOT_DEFAULT]
    assert "msync-threads-follow" in defaults
    assert powerloss.SETUPS["msync-threads-follow"]["workload"] == "follow"
    assert not applies("msync-threads-follow", "follow")  # (the wal run's: it names its own)


def test_a_follower_of_a_dead_writer_yields_only_what_survives_power_loss():
    """A writer dies with records in the page cache that no sync covered; a follower
    reads the WAL before any writer opens it again (and makes them durable); the power
    goes.  Whatever the follower yielded must be in every image."""
    report = traced("follower_of_a_dead_writer", images=10)
    assert report["written"] > report["published"]  # (records no sync covered)
    assert not report["failures"], report


def traced(run: str, **options) -> dict:
    """A function of pmemwal.tools.powerloss_follow in a child on the traced core (a process
    chooses its core at import)."""
    spec = {"op": "powerloss", "run": run, "options": options}
    proc = subprocess.run([sys.executable, "-W", "ignore", CHILD, json.dumps(spec)],
                          env=child_env(PMEMWAL_TRACED_CORE="1"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- 3. a named follower killed and restarted --------------------------------------------

K = 7


@dataclass
class Run:
    """One life of a named follower: where it started, what it processed (LSN, digest) in
    order, and after how many of them each confirm was attempted / had returned."""

    start: int
    processed: list[tuple[int, str]]
    attempted: list[tuple[int, int]]  # (position, records processed before it)
    confirmed: list[tuple[int, int]]


def parse_run(lines: list[list[str]]) -> Run:
    assert lines and lines[0][0] == "S", lines[:3]
    run = Run(int(lines[0][1]), [], [], [])
    for line in lines[1:]:
        if line[0] == "P":
            run.processed.append((int(line[1]), line[2]))
        elif line[0] in "cC":
            (run.attempted if line[0] == "c" else run.confirmed).append(
                (int(line[1]), len(run.processed)))
    return run


def named(wal_dir: Path, stop: Path, name: str = "p1", **extra) -> Child:
    return Child({"op": "named", "dir": str(wal_dir), "name": name, "k": K, "timeout": 0.3,
                  "stop": str(stop), **extra})


def check_exactly_once_but_after_the_last_confirm(runs: list[Run],
                                                  records: list[tuple[int, str]]) -> int:
    """Each run resumes where the one before last confirmed (or, killed between storing a
    confirm and saying so, where it was confirming); what a run processed after that point
    is processed again, first thing, by the next run (at-least-once), at most K records;
    everything else exactly once, in order, none skipped."""
    stream: list[tuple[int, str]] = []
    repeated = 0
    for before, run in zip(runs, runs[1:]):
        stored = before.confirmed[-1][0] if before.confirmed else before.start
        pending = before.attempted[-1][0] if before.attempted else before.start
        assert run.start in (stored, pending), (run.start, stored, pending)
        again = [p for p in before.processed if p[0] >= run.start]
        if run.start == stored and before.confirmed:  # what it processed after confirming
            assert again == before.processed[before.confirmed[-1][1]:]
        assert len(again) <= K
        assert run.processed[:len(again)] == again[:len(run.processed)]  # done again, first
        repeated += len(again)
        stream += [p for p in before.processed if p[0] < run.start]
    stream += runs[-1].processed
    assert stream == records, "a record skipped, doubled or out of order across restarts"
    return repeated


def test_named_follower_killed_at_random_resumes_at_its_last_confirm(wal_dir, shm_tmp):
    rng = random.Random(3)
    stop = shm_tmp / "stop"
    records: list[tuple[int, str]] = []
    truncated = []
    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False,
                      max_follower_lag_bytes=16 * SEG) as wal:
        records.append((wal.append(b"first record", flush=True), digest(b"first record")))

        def write() -> None:
            for i in range(3000):
                data = rng.randbytes(rng.randrange(16, 4000))
                records.append((wal.append(data, flush=i % 3 == 0), digest(data)))
                if i % 10 == 9:
                    wal.flush()
                    time.sleep(0.004)
                if i % 500 == 499:  # the follower may be down: it holds the cut back
                    truncated.append(wal.truncate(wal.flushed_lsn))
            wal.flush()

        child, runs = named(wal_dir, stop), list[Run]()
        child.wait_for(b"S")  # named (at the first record) before anything is truncated
        writer = threading.Thread(target=write)
        writer.start()
        while writer.is_alive() or len(runs) < 4:
            time.sleep(rng.uniform(0.02, 0.3))
            runs.append(parse_run(child.kill()))
            child = named(wal_dir, stop)
            child.wait_for(b"S")
        writer.join()
        stop.touch()
        lines = child.finish()
        assert lines[-1] == ["DONE"]
        runs.append(parse_run(lines[:-1]))
        (state,) = pmemwal.followers(wal_dir)
        assert state["name"] == "p1" and state["state"] == "active"
        assert state["position"] == wal.flushed_lsn and state["lag_bytes"] == 0
        assert sum(truncated) > 0 and wal.first_lsn > 0  # truncation ran, below the follower
    assert runs[0].start == records[0][0]
    assert len(runs) >= 5
    check_exactly_once_but_after_the_last_confirm(runs, records)


def test_truncation_keeps_a_down_follower_within_the_bound_and_loses_one_beyond(wal_dir, shm_tmp):
    stop = shm_tmp / "stop"
    records: list[tuple[int, str]] = []

    def append(wal: pmemwal.WAL, nbytes: int) -> None:
        for _ in range(nbytes // 2000):
            data = os.urandom(2000)
            records.append((wal.append(data), digest(data)))
        wal.flush()

    with pmemwal.open(wal_dir, mode="buffered", segment_size=SEG, background=False,
                      max_follower_lag_bytes=2 * SEG) as wal:
        append(wal, SEG // 2)
        far, near = (named(wal_dir, stop, name, hold_after=2 * K) for name in ("far", "near"))
        for child in (far, near):
            child.wait_for(b"C")
        far_at, near_at = (parse_run(c.kill()).confirmed[-1][0] for c in (far, near))
        assert far_at == near_at == records[2 * K][0]
        # both down, 1.5 segments behind: within the bound, their segment stays
        append(wal, SEG)
        assert wal.truncate(wal.flushed_lsn) == 0 and wal.first_lsn <= far_at
        stop.touch()
        near_lines = named(wal_dir, stop, "near").finish()  # catches up, confirms, exits
        near_run = parse_run(near_lines[:-1])
        assert near_run.start == near_at and near_run.processed == records[2 * K:]
        # far falls 3 segments behind: marked lost, near holds the cut at its segment
        append(wal, 3 * SEG // 2)
        assert wal.truncate(wal.flushed_lsn) > 0
        assert far_at < wal.first_lsn <= near_run.confirmed[-1][0]
        state = {f["name"]: f for f in pmemwal.followers(wal_dir)}
        assert state["far"]["state"] == "lost" and state["far"]["lost_at"] == wal.flushed_lsn
        assert state["near"]["state"] == "active"
        assert state["near"]["lag_bytes"] == wal.flushed_lsn - near_run.confirmed[-1][0] > 0
        assert named(wal_dir, stop, "far").finish() == [["LOST", "FollowerLostError"]]
        near_lines = named(wal_dir, stop, "near").finish()
        assert parse_run(near_lines[:-1]).processed == [
            r for r in records if r[0] >= near_run.confirmed[-1][0]]
