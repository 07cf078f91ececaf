"""pmemwal.integrations.pysyncobj: a pysyncobj Raft journal on pmemwal.Log.

- the journal against pysyncobj's own MemoryJournal, operation by operation, with
  close-and-reopen at random points (hypothesis);
- every ``add`` durable on return: a writer SIGKILLed at a random moment;
- a SyncObj on it, in process (state restored from the journal) and as a real
  three-process cluster on 127.0.0.1 whose nodes are SIGKILLed and restarted while
  they write: every acknowledged write is there afterwards, on every node.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conftest import TESTS_DIR, child_env, payload, run_and_kill
from pmemwal.errors import TermError

pytest.importorskip("pysyncobj")

from pysyncobj import SyncObj, SyncObjConf  # noqa: E402
from pysyncobj import syncobj as pysyncobj_syncobj  # noqa: E402
from pysyncobj.batteries import ReplCounter  # noqa: E402
from pysyncobj.journal import FileJournal, MemoryJournal  # noqa: E402

from pmemwal.integrations.pysyncobj import JournalPath, PmemwalJournal, create_journal  # noqa: E402

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")

NODE = str(TESTS_DIR / "_pysyncobj_node.py")
WAL_OPTIONS = {"segment_size": 1 << 20}
KEEP_RECENT = 3                     # so that items come from memory and from the log alike
# Mostly small commands, now and then one large enough to fill segments, so that
# compaction drops whole segments and reopening replays several.
COMMAND_SIZES = st.sampled_from([0, 1, 9, 100, 1000, 4000, 300_000])
VOTES = st.sampled_from([None, "127.0.0.1:4321", "127.0.0.1:4322", 7, b"node-3"])


def journal_items(journal) -> list[tuple[bytes, int, int]]:
    return [journal[i] for i in range(len(journal))]


# ---- the hook ---------------------------------------------------------------------

def test_create_journal_picks_by_journal_file(shm_dir: Path) -> None:
    assert pysyncobj_syncobj.createJournal is create_journal
    assert type(create_journal(None)) is MemoryJournal
    file_journal = create_journal(str(shm_dir / "file"))
    assert type(file_journal) is FileJournal
    file_journal._destroy()
    journal = create_journal(JournalPath(shm_dir / "wal", **WAL_OPTIONS))
    try:
        assert isinstance(journal, PmemwalJournal)
        assert journal.log.wal.segment_size == 1 << 20
    finally:
        journal._destroy()


# ---- against MemoryJournal ------------------------------------------------------------

class JournalMatchesMemoryJournal(RuleBasedStateMachine):
    """Each operation goes to both journals, as pysyncobj calls them (dense indexes,
    terms that never go down, any next index after clear); positions are drawn past
    both ends and negative too.  After each step they must answer alike."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(dir="/dev/shm", prefix="pmemwal-test-")
        self.path = os.path.join(self.dir, "journal")
        self.ours = PmemwalJournal(self.path, keep_recent=KEEP_RECENT, **WAL_OPTIONS)
        self.model = MemoryJournal()
        self.commit = 1                 # what pysyncobj's journals answer before a commit is set
        self.count = 0

    def teardown(self) -> None:
        self.ours._destroy()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _next(self) -> tuple[int, int]:
        """Index and lowest term the next add must have (the model's view)."""
        if len(self.model):
            _, idx, term = self.model[-1]
            return idx + 1, term
        return self.ours.log.last_index + 1, 0

    @initialize(term=st.integers(0, 3), vote=VOTES)
    def start(self, term: int, vote) -> None:
        for journal in (self.ours, self.model):
            journal.setCurrentTerm(term, vote)

    @rule(size=COMMAND_SIZES, term_step=st.integers(0, 2), jump=st.integers(0, 10**6),
          str_command=st.booleans())
    def add(self, size: int, term_step: int, jump: int, str_command: bool) -> None:
        idx, term = self._next()
        if not len(self.model):
            idx = jump or idx           # an empty journal takes any next index
        self.count += 1
        command = payload(self.count, size)
        if str_command:                 # FileJournal encodes a str and returns bytes; so does ours
            command = command.hex()
        self.ours.add(command, idx, term + term_step)
        self.model.add(command.encode() if str_command else command, idx, term + term_step)

    @precondition(lambda self: len(self.model) > 0)
    @rule(gap=st.integers(1, 5), before=st.booleans())
    def add_out_of_order(self, gap: int, before: bool) -> None:
        idx, _ = self._next()
        with pytest.raises(ValueError, match="no gaps"):
            self.ours.add(b"x", idx - 1 - gap if before else idx + gap, self.model[-1][2])

    @precondition(lambda self: len(self.model) > 0 and self.model[-1][2] > 0)
    @rule()
    def add_lower_term(self) -> None:
        idx, term = self._next()
        with pytest.raises(TermError):
            self.ours.add(b"x", idx, term - 1)

    @rule(data=st.data())
    def delete_entries_from(self, data: st.DataObject) -> None:
        n = len(self.model)
        position = data.draw(st.integers(-n - 2, n + 2))
        for journal in (self.ours, self.model):
            journal.deleteEntriesFrom(position)

    @rule(data=st.data())
    def delete_entries_to(self, data: st.DataObject) -> None:
        n = len(self.model)
        position = data.draw(st.integers(-n - 2, n + 2))
        for journal in (self.ours, self.model):
            journal.deleteEntriesTo(position)

    @rule()
    def clear(self) -> None:
        for journal in (self.ours, self.model):
            journal.clear()

    @rule(term_step=st.integers(0, 2), vote=VOTES)
    def set_current_term(self, term_step: int, vote) -> None:
        term = self.model.getCurrentTerm() + term_step
        for journal in (self.ours, self.model):
            journal.setCurrentTerm(term, vote)

    @rule(commit=st.integers(1, 10**6))
    def set_raft_commit_index(self, commit: int) -> None:
        self.ours.setRaftCommitIndex(commit)
        self.commit = commit            # MemoryJournal forgets it: FileJournal keeps it

    @rule()
    def one_second_timer(self) -> None:
        for journal in (self.ours, self.model):
            journal.onOneSecondTimer()

    @rule()
    def reopen(self) -> None:
        self.ours._destroy()
        self.ours = PmemwalJournal(self.path, keep_recent=KEEP_RECENT, **WAL_OPTIONS)

    @invariant()
    def same_answers(self) -> None:
        ours, model = self.ours, self.model
        n = len(model)
        assert len(ours) == n
        assert journal_items(ours) == journal_items(model)
        for s in (slice(None), slice(1, None), slice(-3, None), slice(None, None, 2),
                  slice(n + 5, None), slice(-n - 5, 2)):
            assert ours[s] == model[s]
        for position in (-1, 0, -n):
            if n:
                assert ours[position] == model[position]
        for position in (n, -n - 1):
            with pytest.raises(IndexError):
                ours[position]
        assert ours.getCurrentTerm() == model.getCurrentTerm()
        assert ours.getVotedForNodeId() == model.getVotedForNodeId()
        assert ours.getRaftCommitIndex() == self.commit


JournalMatchesMemoryJournal.TestCase.settings = settings(max_examples=100, stateful_step_count=30,
                                                         deadline=None)
TestJournalMatchesMemoryJournal = JournalMatchesMemoryJournal.TestCase


def test_commit_index_is_stored_on_the_timer_and_on_close(shm_dir: Path) -> None:
    path = shm_dir / "journal"
    journal = PmemwalJournal(path)
    journal.add(b"\x00", 1, 0)
    journal.setRaftCommitIndex(1)
    journal.setRaftCommitIndex(5)
    assert journal.log.state.commit == 0        # nothing written per call...
    journal.onOneSecondTimer()
    assert journal.log.state.commit == 5        # ...but once a second
    journal.setRaftCommitIndex(6)
    journal.setCurrentTerm(2, "127.0.0.1:1")
    assert journal.log.state == (2, "127.0.0.1:1", 6)   # with the term and vote
    journal.setRaftCommitIndex(7)
    journal._destroy()
    journal = PmemwalJournal(path)
    assert journal.getRaftCommitIndex() == 7     # and on close
    journal._destroy()


# ---- durability ------------------------------------------------------------------------

@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_every_added_entry_survives_sigkill(shm_dir: Path, delay: float) -> None:
    path = shm_dir / "journal"
    lines, stderr = run_and_kill(NODE, {"mode": "journal", "dir": str(path)}, {}, delay)
    added = [int(line.split()[1]) for line in lines
             if line.startswith(b"ADDED ") and line.endswith(b"\n")]  # a cut line: not acknowledged
    assert added == list(range(1, len(added) + 1)), stderr
    journal = PmemwalJournal(path)
    try:
        assert len(journal) >= len(added)       # an add may have returned after the last line
        for position, idx in enumerate(added):
            command, index, term = journal[position]
            assert (index, term) == (idx, 0)
            assert command[-8:] == idx.to_bytes(8, "little")
    finally:
        journal._destroy()


# ---- SyncObj on it ---------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    """``n`` TCP ports on 127.0.0.1 that nothing listened on a moment ago."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_syncobj_restores_its_state_from_the_journal(shm_dir: Path) -> None:
    """One node alone (its own majority): increments, destroy, a new SyncObj on the same
    journal replays them."""
    addr = f"127.0.0.1:{free_ports(1)[0]}"

    def node() -> tuple[SyncObj, ReplCounter]:
        counter = ReplCounter()
        conf = SyncObjConf(journalFile=JournalPath(shm_dir / "journal", **WAL_OPTIONS),
                           fullDumpFile=str(shm_dir / "dump"), autoTickPeriod=0.01,
                           appendEntriesPeriod=0.02, raftMinTimeout=0.1, raftMaxTimeout=0.2)
        return SyncObj(addr, [], conf, consumers=[counter]), counter

    obj, counter = node()
    try:
        for _ in range(20):
            counter.inc(sync=True, timeout=10)
        assert counter.get() == 20
    finally:
        obj.destroy_synchronous()
    obj, counter = node()
    try:
        deadline = time.monotonic() + 10
        while counter.get() != 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counter.get() == 20
        assert counter.inc(sync=True, timeout=10) == 21
    finally:
        obj.destroy_synchronous()


class NodeProcess:
    """One node of the cluster: restarted as often as the test likes, on the same address
    and directory; its ACK lines go to a list shared by all nodes."""

    def __init__(self, addr: str, others: list[str], workdir: Path,
                 acks: list[tuple[str, int]], env: dict[str, str]) -> None:
        self.addr, self.others, self.workdir, self.env = addr, others, workdir, env
        self.acks = acks
        self.state: dict | None = None
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.starts = 0
        workdir.mkdir()

    def start(self, writers: int = 0, report: bool = False) -> None:
        spec = {"mode": "node", "self": self.addr, "others": self.others,
                "dir": str(self.workdir), "writers": writers, "report": report,
                "compact_after": 150}   # compactions, and snapshots sent to restarted nodes
        self.starts += 1
        with open(self.workdir / f"stderr.{self.starts}", "wb") as err:
            self.proc = subprocess.Popen([sys.executable, NODE, json.dumps(spec)],
                                         env=child_env(**self.env), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=err)
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stdout: IO[bytes]) -> None:
        with stdout:
            for line in stdout:
                if not line.endswith(b"\n"):
                    break                           # cut by the kill: not a whole report
                kind, _, rest = line.decode().rstrip("\n").partition(" ")
                if kind == "ACK":
                    key, value = rest.split()
                    self.acks.append((key, int(value)))
                elif kind == "STATE":
                    self.state = json.loads(rest)

    def kill(self) -> None:
        """SIGKILL it, and wait until every line it printed has been read."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)    # EOF once any fork of it (pysyncobj's dumps) is gone too
        self.proc = self.reader = None
        self.state = None

    def stderr_tail(self) -> str:
        text = (self.workdir / f"stderr.{self.starts}").read_text(errors="replace")
        return f"--- {self.addr} (start {self.starts}) ---\n{text[-2000:]}"


CHAOS_SECONDS = 12
CONVERGE_SECONDS = 60


# One node per way to persist: buffered (fdatasync), direct with msync, direct with cache flushes.
NODE_PERSIST = [{"PMEMWAL_MODE": "buffered"}, {"PMEMWAL_MODE": "direct"},
                {"PMEMWAL_MODE": "direct", "PMEM_IS_PMEM_FORCE": "1"}]


def test_cluster_keeps_acknowledged_writes_through_sigkills(shm_dir: Path) -> None:
    """Three nodes write through the cluster while one or two at a time are SIGKILLed and
    restarted; then all are killed at once and restarted to read: every acknowledged
    write must be on every node, and the nodes must agree.  Each node persists its journal
    another way (NODE_PERSIST)."""
    rng = random.Random(os.environ.get("PMEMWAL_TEST_SEED", "pysyncobj-cluster"))
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    acks: list[tuple[str, int]] = []
    nodes = [NodeProcess(a, [o for o in addrs if o != a], shm_dir / f"node{i}", acks, env)
             for i, (a, env) in enumerate(zip(addrs, NODE_PERSIST))]
    try:
        for node in nodes:
            node.start(writers=3)
        deadline = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.5, 2.0))
            victims = rng.sample(nodes, 2 if rng.random() < 0.25 else 1)
            for node in victims:
                node.kill()
            time.sleep(rng.uniform(0, 0.5))
            for node in victims:
                node.start(writers=3)
        for node in nodes:
            node.kill()
        acked = dict(acks)
        for node in nodes:
            node.start(report=True)
        _wait_until_converged(nodes, acked)
        assert len(acked) >= 20, f"only {len(acked)} writes were acknowledged"
    finally:
        for node in nodes:
            node.kill()


def _wait_until_converged(nodes: list[NodeProcess], acked: dict[str, int]) -> None:
    deadline = time.monotonic() + CONVERGE_SECONDS
    while time.monotonic() < deadline:
        states = [node.state for node in nodes]
        if all(s is not None and s == states[0] for s in states) and \
                all(states[0].get(k) == v for k, v in acked.items()):
            return
        time.sleep(0.2)
    report = []
    for node in nodes:
        state = node.state or {}
        missing = [k for k, v in acked.items() if state.get(k) != v]
        report.append(f"{node.addr}: {len(state)} keys, {len(missing)} of {len(acked)} "
                      f"acknowledged writes missing or different (e.g. {missing[:3]})")
    tails = "\n".join(node.stderr_tail() for node in nodes)
    pytest.fail("the nodes did not converge on every acknowledged write:\n" + "\n".join(report)
                + "\n" + tails)


def test_slices_read_as_a_lists_do(shm_dir: Path) -> None:
    """Issue 27, item 11: with the last entries kept in memory, a slice whose stop lies
    before its start gave items (journal[7:5] two, journal[8:5] one) where a list gives []."""
    journal = PmemwalJournal(shm_dir / "j", keep_recent=3, segment_size=1 << 20)
    items = []
    for i in range(1, 11):
        journal.add(b"c%d" % i, i, 1)
        items.append((b"c%d" % i, i, 1))
    for start in range(-12, 13):
        for stop in [None, *range(-12, 13)]:
            for step in (None, 1, 2, -1, -3):
                assert journal[start:stop:step] == items[start:stop:step], (start, stop, step)
    journal._destroy()


def test_a_failed_compaction_leaves_no_stale_first_entry(shm_dir: Path, monkeypatch) -> None:
    """Issue 27, item 12: compact raised inside WAL.truncate after the log had moved its
    first entry; journal[0] then still gave the dropped entry (pysyncobj's index
    arithmetic starts from journal[0][1])."""
    journal = PmemwalJournal(shm_dir / "j", keep_recent=2, segment_size=1 << 20)
    for i in range(1, 11):
        journal.add(b"c%d" % i, i, 1)
    assert journal[0][1] == 1       # read once: kept
    from pmemwal.errors import StorageError

    def no_space(*args, **kwargs):
        raise StorageError(28, "No space left on device")

    monkeypatch.setattr(journal.log.wal, "truncate", no_space)
    with pytest.raises(StorageError):
        journal.deleteEntriesTo(4)
    first = journal.log.first_index
    assert journal[0][1] == first and len(journal) == 11 - first
    assert [item[1] for item in journal[0:len(journal)]] == list(range(first, 11))
    monkeypatch.undo()
    journal._destroy()
