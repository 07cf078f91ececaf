"""The log workload's model: what a ``pmemwal.Log`` must be after the events its workers
told (``log_entries``), and the check of a recovered Log against it.

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
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from copy import copy
from dataclasses import dataclass, field

import numpy as np

import pmemwal
from pmemwal.tools.recovery_warnings import recovery_warnings
from pmemwal.log import HardState
from pmemwal.tools.torture.log_entries import ARITY, OPS, EntryId, parse_entry, vote_of
from pmemwal.tools.torture.plugin import Check, PipeError


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

    def __init__(self, rnd: int = 0, rounds: Iterable[int] = (0,), term: int = 1,
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
            in_flight = self.in_flight
            if in_flight is None or tag.upper() != in_flight[0] or list(ints) != [in_flight[1][0]]:
                raise PipeError(f"{tag} {list(ints)} finishes nothing in flight ({self.in_flight})")
            self._apply(*in_flight)
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
            with recovery_warnings(), \
                    pmemwal.open_log(path, create=False, background=False, **wal_options) as log:
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
        elif (ident.log_index, ident.term) != (entry.index, entry.term):
            self._problem(chk, "order", f"{where} is out of place: appended as entry "
                          f"{ident.log_index}, term {ident.term}")
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
