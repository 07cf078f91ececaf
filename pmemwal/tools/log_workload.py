"""The log workload: a ``pmemwal.Log`` under crash torture and simulated power loss.

Threads share one Log (``Worker``, ``Shared``): they append self-describing
entries (``make_entry``: round, thread, sequence number, the index and term
they were appended with, then bytes those regenerate), one with
``sync=True``, one synced later (``sync()`` or ``sync(index)``) or a batch
(``append_many``); thread 0 now and then rewinds the tail (``truncate_after``,
as a new Raft leader), compacts, stores a hard state or, rarely, resets the
log (a follower installing a snapshot).  Every step is told as an event, a
tag and integers: a pipe line to the torture parent (``_torture_log_child``),
or straight to a ``LogModel`` (``pmemwal powerloss --workload log``):

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

``LogModel`` applies the events and checks a recovered Log against them:

- lost: an acknowledged entry (or one the round's first recovery returned)
  is not at its index, and no operation announced since could have removed it;
- resurrected: an entry is back that a finished rewind or reset removed (or,
  in crash torture, from an earlier round and not in the log that round began with);
- garbage: an entry whose bytes do not regenerate, or of a round never run here;
- order: an entry at an index or with a term other than it was appended with,
  or terms going back;
- state: ``first_index`` or the hard state other than after the finished
  operations, or after the one in flight too.

``LogLedger`` gives the crash torture (``pmemwal torture --workload log``) a
directory's model: each round starts from what the last recovery returned.
"""

from __future__ import annotations

import random
import struct
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from copy import copy
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

import pmemwal
from pmemwal.errors import LogIndexError
from pmemwal.log import HardState
from pmemwal.tools.torture import Check, PipeError, TortureDir, digested

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
    index: int
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


# ---- the model ----------------------------------------------------------------------------

@dataclass
class Recovered:
    """A log as a recovery returned it: where the next round starts from."""

    first: int = 1
    last: int = 0
    state: HardState = HardState()
    entries: dict[int, tuple[tuple[int, int, int], int]] = field(default_factory=dict)
    #        index -> (key: round, thread, seq), term) of the entries that regenerate


@dataclass
class LogCheck(Check):
    """A recovered Log held against a LogModel."""

    seq_ends: dict[tuple[int, int], int] = field(default_factory=dict)  # (round, thread) -> seq
    recovered: Recovered | None = None
    beyond: bool = False    # more came back than had to (allowed)

    def seen_end(self, key: tuple[int, int]) -> int:
        return self.seq_ends.get(key, 0)

    @classmethod
    def failed(cls, error: str) -> LogCheck:
        return cls(0.0, 0, 0, 0, 0, error, {}, [error])


class LogModel:
    """What a log must be after the events so far: ``first`` and ``state`` once every
    finished operation is applied, ``live`` (index -> (key, term)) the entries that must
    be there unless the operation in flight removes them."""

    MAX_PROBLEMS = 20

    def __init__(self, rnd: int = 0, rounds: Sequence[int] = (0,), term: int = 1,
                 start: Recovered | None = None) -> None:
        start = start or Recovered()
        self.round, self.rounds, self.start_term, self.term = rnd, set(rounds), term, term
        self.began = start                      # never changed: shared with copies
        self.first, self.state, self.live = start.first, start.state, dict(start.entries)
        self.in_flight: tuple[str, tuple[int, ...]] | None = None
        self.last_op: tuple[str, tuple[int, ...]] | None = None
        self.announced = 0
        self.ops = {name: 0 for name in OPS.values()}
        self.acked_seqs: dict[int, int] = {}
        self._rewind_terms: list[int] = []     # finished rewinds since the last reset, in order
        self._rewind_min = np.zeros(0, np.int64)  # the lowest k of each one and those after it
        self._reset_term = 0                    # entries below this term went with a reset

    def copy(self) -> LogModel:
        """A snapshot that later events leave alone."""
        twin = copy(self)
        twin.live, twin.acked_seqs = dict(self.live), dict(self.acked_seqs)
        twin.ops, twin._rewind_terms = dict(self.ops), list(self._rewind_terms)
        return twin

    # ---- events ----

    def feed(self, tag: str, ints: Sequence[int]) -> None:
        """Apply one event; PipeError when it breaks the protocol."""
        if tag == "A":
            self._acknowledge(ints)
        elif tag in OPS:
            if self.in_flight or len(ints) != ARITY[tag]:
                raise PipeError(f"{tag} {list(ints)} while {self.in_flight} is in flight"
                                if self.in_flight else f"{tag} with {len(ints)} fields")
            self.in_flight = self.last_op = (tag, tuple(ints))
            self.announced += 1
            self.ops[OPS[tag]] += 1
            self.term = max(self.term, ints[0] if tag == "S" else ints[1])
        elif tag.upper() in OPS:
            op, args = self.in_flight or ("", (None,))
            if tag.upper() != op or list(ints) != [args[0]]:
                raise PipeError(f"{tag} {list(ints)} finishes nothing in flight ({self.in_flight})")
            self._apply(*self.in_flight)
            self.in_flight = None
        else:
            raise PipeError(f"unknown event {tag}")

    def _acknowledge(self, ints: Sequence[int]) -> None:
        thread, seq, pairs = ints[0], ints[1], ints[2:]
        if seq != self.acked_seqs.get(thread, 0) or not pairs or len(pairs) % 2:
            raise PipeError(f"thread {thread} acknowledged seq {seq} with {len(pairs)} fields "
                            f"after {self.acked_seqs.get(thread, 0)} entries")
        for j, (index, term) in enumerate(zip(pairs[::2], pairs[1::2])):
            if index >= self.first and not self.voided(index, term):
                self.live[index] = ((self.round, thread, seq + j), term)
        self.acked_seqs[thread] = seq + len(pairs) // 2

    def _apply(self, tag: str, args: tuple[int, ...]) -> None:
        """A finished operation: what it removed is no longer required, and never again."""
        if tag == "W":
            k, term = args
            self._rewind_terms.append(term)
            self._rewind_min = np.minimum(np.append(self._rewind_min, k), k)
            self.live = {i: v for i, v in self.live.items() if i <= k}
        elif tag == "C":
            self.first = max(self.first, args[0])
            self.live = {i: v for i, v in self.live.items() if i >= args[0]}
        elif tag == "Z":
            self.first, self._reset_term, self.live = args[0] + 1, args[1], {}
            self._rewind_terms, self._rewind_min = [], np.zeros(0, np.int64)  # all older now
        else:
            self.state = _state(args)

    def voided(self, index: int, term: int) -> bool:
        """Did a finished rewind or reset remove the entry of ``term`` appended at ``index``?"""
        if term < self._reset_term:
            return True
        later = bisect_right(self._rewind_terms, term)  # the rewinds after its append
        return later < len(self._rewind_terms) and int(self._rewind_min[later]) < index

    def _may_remove(self, index: int, term: int) -> bool:
        """May the operation in flight have removed this entry?"""
        tag, args = self.in_flight or ("", ())
        return ((tag == "W" and index > args[0] and term < args[1])
                or (tag == "C" and index < args[0]) or tag == "Z")

    # ---- the check ----

    def recover(self, path, **wal_options) -> LogCheck:
        """Open the log at ``path`` (timing recovery) and check it against this model."""
        start = time.perf_counter()
        try:
            with pmemwal.open_log(path, create=False, background=False, **wal_options) as log:
                recovery_s = time.perf_counter() - start
                chk = self.check(log)
        except Exception as e:  # a WALError is expected; anything else is reported, too
            return LogCheck.failed(f"recovery: {type(e).__name__}: {e}")
        chk.recovery_s = recovery_s
        return chk

    def check(self, log: pmemwal.Log) -> LogCheck:
        """Every entry of ``log`` judged, then the entries that must be there looked for."""
        chk = LogCheck(0.0, 0, 0, 0, 0, None, {}, [])
        self._check_first_and_state(log, chk)
        recovered = Recovered(log.first_index, log.last_index, log.state)
        previous_term = 0
        for entry in log.entries():
            ident = parse_entry(bytes(entry.payload))
            chk.scanned += 1
            self._judge(entry, ident, previous_term, chk)
            previous_term = entry.term
            if ident is not None:
                recovered.entries[entry.index] = (ident.key, ident.term)
                where = (ident.round, ident.thread)
                chk.seq_ends[where] = max(chk.seq_ends.get(where, 0), ident.seq + 1)
        for index, (key, term) in self.live.items():
            if not self._may_remove(index, term):
                chk.checked += 1
                if recovered.entries.get(index, (None,))[0] != key:
                    self._problem(chk, "lost", f"entry {index} (round {key[0]} thread {key[1]} "
                                  f"seq {key[2]}, term {term}) is lost: not back at its index")
        chk.beyond = chk.beyond or any(self.live.get(i, (None,))[0] != key
                                       for i, (key, _) in recovered.entries.items())
        chk.recovered = recovered
        return chk

    def _check_first_and_state(self, log: pmemwal.Log, chk: LogCheck) -> None:
        """As after the finished operations, or after the one in flight, too."""
        tag, args = self.in_flight or ("", ())
        firsts = {self.first, max(self.first, args[0]) if tag == "C" else
                  args[0] + 1 if tag == "Z" else self.first}
        states = {self.state, _state(args) if tag == "S" else self.state}
        if log.first_index not in firsts:
            self._problem(chk, "state_errors", f"wrong first index {log.first_index}, expected "
                          f"{' or '.join(map(str, sorted(firsts)))}")
        if log.state not in states:
            self._problem(chk, "state_errors", f"wrong hard state {tuple(log.state)}, expected "
                          f"{' or '.join(str(tuple(s)) for s in states)}")
        chk.beyond = log.first_index != self.first or log.state != self.state

    def _judge(self, entry: pmemwal.Entry, ident: EntryId | None, previous_term: int,
               chk: LogCheck) -> None:
        where = f"entry {entry.index} (term {entry.term})"
        if ident is None or ident.round not in self.rounds:
            self._problem(chk, "garbage", f"{where} is garbage: " + (
                "its bytes do not regenerate" if ident is None else f"of round {ident.round}, "
                "never run here"))
        elif (ident.index, ident.term) != (entry.index, entry.term):
            self._problem(chk, "order", f"{where} is out of place: appended as entry "
                          f"{ident.index}, term {ident.term}")
        elif (ident.round != self.round
              and self.began.entries.get(entry.index, (None,))[0] != ident.key):
            self._problem(chk, "resurrected", f"{where} of round {ident.round} is resurrected: "
                          "it was not in the log the round began with")
        elif self.voided(entry.index, entry.term):
            self._problem(chk, "resurrected", f"{where} is resurrected: a finished rewind or "
                          "reset removed it")
        if entry.term < previous_term:
            self._problem(chk, "order", f"{where} is out of order: after term {previous_term}")

    def _problem(self, chk: LogCheck, counter: str, text: str) -> None:
        setattr(chk, counter, getattr(chk, counter) + 1)
        if len(chk.problems) < self.MAX_PROBLEMS:
            chk.problems.append(text)


def _state(args: tuple[int, ...]) -> HardState:
    term, v, commit = args
    return HardState(term, vote_of(v), commit)


# ---- crash torture: a directory's ledger -------------------------------------------------------

@dataclass
class LogLedger(TortureDir):
    """A log workload's torture directory: the log its last recovery returned (each round
    starts from it), the highest term used here, and the current round's model."""

    CHILD = "pmemwal.tools._torture_log_child"

    start: Recovered = field(default_factory=Recovered)
    term: int = 0
    model: LogModel | None = None

    def begin(self, rnd: int) -> dict:
        """A round's child leads in a new term, above every term used in this directory."""
        super().begin(rnd)
        self.term += 1
        self.model = LogModel(rnd, self.rounds, self.term, self.start)
        return {"term": self.term}

    def reader(self, rnd: int) -> LogPipe:
        return LogPipe(self.model, self.start)

    def check(self, mode: str) -> LogCheck:
        return self.model.recover(self.path, mode=mode, segment_size=self.segment_size)

    def absorb(self, chk: LogCheck) -> None:
        """What the recovery returned is where the next round starts."""
        if chk.recovered is not None:
            self.start = chk.recovered
        self.term = max(self.term, self.model.term)

    def kept_info(self) -> dict:
        """The log the round began with ([index, round, thread, seq, term] per entry), its term."""
        if self.model is None:
            return {}
        s = self.model.began
        return {"round_began_with": {"first": s.first, "last": s.last, "state": repr(s.state),
                                     "entries": [[i, *key, term]
                                                 for i, (key, term) in sorted(s.entries.items())]},
                "round_term": self.model.start_term}


class LogPipe:
    """A log child's pipe lines of one round, fed to the round's model."""

    TAGS = tuple(t.encode() for tag in OPS for t in (tag, tag.lower())) + (b"A",)

    def __init__(self, model: LogModel, start: Recovered) -> None:
        self.model, self._start = model, start
        self.ops = model.ops

    def opened(self, fields: list[int]) -> None:
        """The child's own recovery must agree with the parent's last one."""
        if fields != [self._start.first, self._start.last]:
            raise PipeError(f"the child opened entries {fields[0]}..{fields[1]}, the last "
                            f"recovery returned {self._start.first}..{self._start.last}")

    def line(self, tag: bytes, fields: list[int]) -> None:
        self.model.feed(tag.decode(), fields)

    def finish(self) -> None:
        """The model took every line as it came."""

    @property
    def acked_seqs(self) -> dict[int, int]:
        return self.model.acked_seqs
