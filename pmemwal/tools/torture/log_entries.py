"""The log workload's entries and workers: a ``pmemwal.Log`` driven as a Raft node drives
it, for the crash torture (``log``) and for simulated power loss (``powerloss``).

Threads share one Log (``Worker``, ``Shared``): they append self-describing
entries (``make_entry``: round, thread, sequence number, the index and term
they were appended with, then bytes those regenerate), one with
``sync=True``, one synced later (``sync()`` or ``sync(index)``) or a batch
(``append_many``); thread 0 now and then rewinds the tail (``truncate_after``,
as a new Raft leader), compacts, stores a hard state or, rarely, resets the
log (a follower installing a snapshot).  Every step is told as an event, a
tag and integers: a pipe line to the torture parent (``log``), or straight
to a ``log_model.LogModel`` (``pmemwal powerloss --workload log``):

    A <thread> <seq> <index> <term> [<index> <term> ...]
                          entries seq, seq+1, ... of the thread are durable
    W <k> <term>          about to truncate_after(k); the log goes on in this new term
    C <b> <term>          about to compact(b), in this term
    Z <k> <term>          about to reset(k, term), a new term
    S <term> <v> <commit> about to set_state(term, vote_of(v), commit)
    w|c|z|s <first field> that operation returned: it is durable

Terms are epochs.  Rewinds, resets and elections (some state changes) take
a new term under a lock that every append takes too, and announce and
finish inside it; so an entry of term t was appended before every rewind or
reset with a higher term and after every other one, and the model knows, for
each entry, which operations could have removed it.  A compaction removes
what lies below its point, whenever it was appended.
"""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable
from typing import NamedTuple

import pmemwal
from pmemwal.errors import LogIndexError
from pmemwal.tools.torture.records import digested

# ---- entries ------------------------------------------------------------------------

ENTRY_MAGIC = b"PWTL"
ENTRY = struct.Struct("<4sIIIIQQ")  # magic, round, thread, seq, length, index, term
OPS = {"W": "rewinds", "C": "compactions", "Z": "resets", "S": "state_changes"}
ARITY = {"W": 2, "C": 2, "Z": 2, "S": 3}
KEEP = 600                # a compaction keeps up to this many entries
CONTROL_ODDS = 1 / 25     # of thread 0's steps: a rewind, compaction, state or reset


class EntryId(NamedTuple):
    """What an entry's payload says of it."""

    round: int
    thread: int
    seq: int
    log_index: int      # (not ``index``: a tuple's method)
    term: int

    @property
    def key(self) -> tuple[int, int, int]:
        return self.round, self.thread, self.seq


def make_entry(rnd: int, thread: int, seq: int, index: int, term: int, length: int) -> bytes:
    """Entry ``seq`` of ``thread`` in round ``rnd``, to be appended at ``index`` with ``term``:
    ``length`` (>= ENTRY.size) bytes."""
    return digested(ENTRY.pack(ENTRY_MAGIC, rnd, thread, seq, length, index, term), length)


def parse_entry(data: bytes) -> EntryId | None:
    """What an entry says of itself, when its every byte regenerates; None otherwise."""
    if len(data) < ENTRY.size:
        return None
    magic, rnd, thread, seq, length, index, term = ENTRY.unpack_from(data)
    if magic != ENTRY_MAGIC or length != len(data) or data != digested(data[:ENTRY.size], length):
        return None
    return EntryId(rnd, thread, seq, index, term)


def vote_of(v: int) -> int | str | bytes | None:
    """The vote a state event's ``v`` stands for: each of the four encodings in turn."""
    return (None, v, f"node-{v}", b"node-%d" % v)[v % 4]


# ---- the workers ----------------------------------------------------------------------

class Shared:
    """What the workers of one Log share: the log, the round, the current term, where events
    go (``say(tag, *ints)``), entry sizes, and the lock of appends and operations."""

    def __init__(self, log: pmemwal.Log, rnd: int, term: int,
                 say: Callable[..., None], size: Callable[[random.Random], int]) -> None:
        self.log, self.rnd, self.term, self.say, self.size = log, rnd, term, say, size
        # Appends and the operations that change indexes or terms take it, so that an
        # entry's index is known before it is appended and terms mark epochs.
        self.lock = threading.Lock()


class Worker:
    """One thread of the workload; thread 0 also rewinds, compacts, resets, stores states."""

    def __init__(self, shared: Shared, thread: int) -> None:
        self.shared, self.thread = shared, thread
        self.seq = 0                    # the next entry's number
        self.pending: list[int] = []    # index, term, ... of entries appended, not acknowledged

    def step(self, rng: random.Random) -> bool:
        """One operation; True when it ended with something made durable."""
        if self.thread == 0 and rng.random() < CONTROL_ODDS:
            self.control(rng)
            return True
        roll = rng.random()
        if roll < 0.4:                             # a commit: durable when it returns
            self.append(rng, 1, sync=True)
        elif roll < 0.75:                          # appended now, synced some time later
            self.append(rng, 1, sync=False)
            if rng.random() < 0.7:
                return False
            self.sync(rng)
        else:                                      # a batch
            sync = rng.random() < 0.5
            self.append(rng, rng.randint(2, 16), sync=sync)
            if not sync:
                self.sync(rng)
        self.acknowledge()
        return True

    def acknowledge(self) -> None:
        """Tell the entries appended since the last time: a sync has made them durable."""
        self.shared.say("A", self.thread, self.seq - len(self.pending) // 2, *self.pending)
        self.pending.clear()

    def append(self, rng: random.Random, n: int, sync: bool) -> None:
        s = self.shared
        sizes = [max(ENTRY.size, s.size(rng)) for _ in range(n)]
        with s.lock:
            term, index = s.term, s.log.last_index + 1
            payloads = [make_entry(s.rnd, self.thread, self.seq + j, index + j, term, size)
                        for j, size in enumerate(sizes)]
            if n == 1:
                got = [s.log.append(payloads[0], term, sync=sync)]
            else:
                got = s.log.append_many(payloads, term, sync=sync).tolist()
        if got != list(range(index, index + n)):
            raise AssertionError(f"appended at {got}, expected {index}..{index + n - 1}")
        self.seq += n
        for i in got:
            self.pending += (i, term)

    def sync(self, rng: random.Random) -> None:
        log = self.shared.log
        if rng.random() < 0.5:
            log.sync()
            return
        try:
            log.sync(self.pending[-2])
        except LogIndexError:  # a rewind took the end below it since, and flushed it too
            log.sync()

    def control(self, rng: random.Random) -> None:
        roll = rng.random()
        if roll < 0.35:
            self.rewind(rng.randint(0, 30))
        elif roll < 0.6:
            self.compact(rng.randint(0, KEEP))
        elif roll < 0.97:
            self.set_state(rng)
        else:
            self.reset(rng.randint(-20, 200))

    def rewind(self, back: int) -> None:
        """A new leader: void up to ``back`` entries at the end, in a new term."""
        s = self.shared
        with s.lock:
            k = max(s.log.first_index - 1, s.log.last_index - back)
            s.term += 1
            self._durable(("W", k, s.term), lambda: s.log.truncate_after(k))

    def compact(self, keep: int) -> None:
        """Drop all but the last ``keep`` entries (or fewer, when a reset left fewer)."""
        s = self.shared
        with s.lock:
            b = max(s.log.first_index, s.log.last_index + 1 - keep)
            self._durable(("C", b, s.term), lambda: s.log.compact(b))

    def set_state(self, rng: random.Random) -> None:
        s = self.shared
        with s.lock:
            if rng.random() < 0.3:  # an election: a new term
                s.term += 1
            v, commit = rng.randrange(1 << 16), rng.randint(0, max(s.log.last_index, 0))
            self._durable(("S", s.term, v, commit),
                          lambda: s.log.set_state(term=s.term, vote=vote_of(v), commit=commit))

    def reset(self, ahead: int) -> None:
        """A follower installs a snapshot ``ahead`` of its last entry (or behind it)."""
        s = self.shared
        with s.lock:
            k = max(0, s.log.last_index + ahead)
            s.term += 1
            self._durable(("Z", k, s.term), lambda: s.log.reset(k, s.term))

    def _durable(self, event: tuple, operation: Callable[[], object]) -> None:
        """Announce, run, say it returned: under the lock, so no later entry is told first."""
        self.shared.say(*event)
        operation()
        self.shared.say(event[0].lower(), event[1])
