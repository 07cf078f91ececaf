"""The one interface of torture workloads: what a workload's child does, and what its
parent holds the directory to.

A workload (``TortureWorkload``) has two sides.  In the child (``python -m
pmemwal.tools.torture.child SPEC_JSON``, the one entry point; the spec names the
workload) it opens its target (``open``: the child's recovery), says what it opened
(``ready``: the R line) and works on it until it is killed (``run``), telling the
parent on its pipe.  In the parent, a round workload gives each WAL directory a
ledger (``ledger``: a ``TortureDir``) that the round driver (``driver``) asks for the
spec, a reader of the round's pipe lines, the check after the kill and what to keep
of a failing round.  The shared-processes workload runs its own loop instead
(``shared.run``: several long-lived writers, killed and replaced), with the same child.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pmemwal.tools.torture.childkit import Pipe

CHILD = "pmemwal.tools.torture.child"  # the module every torture child runs
Key = tuple[int, int]                  # (round, thread)


class PipeError(ValueError):
    """A child broke the pipe protocol: a line out of place, a sequence number skipped."""


class TortureWorkload(ABC):
    """A torture workload: ``name`` (in the spec), a child side and a parent side."""

    name: str

    @abstractmethod
    def open(self, spec: dict) -> Any:
        """The child opens the spec's WAL (or Log): its recovery."""

    @abstractmethod
    def ready(self, target: Any) -> str:
        """The R line's fields once ``target`` is open (a round workload: persist method first)."""

    @abstractmethod
    def run(self, target: Any, pipe: Pipe, spec: dict) -> None:
        """Work on ``target`` until the parent kills the child, telling it on ``pipe``."""

    def ledger(self, path: str, segment_size: int) -> TortureDir:
        """The parent's ledger of a fresh WAL directory (round workloads only)."""
        raise TypeError(f"the {self.name} workload runs its own loop, not rounds")


class RoundPipe(Protocol):
    """A round's pipe lines as its ledger reads them (``TortureDir.reader``): the tags it
    takes besides O and R, the R line's fields, each of its lines, the end, and then the
    operations announced and the sequence numbers acknowledged per thread."""

    TAGS: tuple[bytes, ...]
    ops: dict[str, int]

    def opened(self, fields: list[int]) -> None: ...
    def line(self, tag: bytes, fields: list[int]) -> None: ...
    def finish(self) -> None: ...
    @property
    def acked_seqs(self) -> dict[int, int]: ...


C = TypeVar("C", bound="Check")        # what a ledger's check returns


@dataclass
class TortureDir(Generic[C]):
    """A torture WAL directory: where it is, its segment size, the rounds run in it, and
    the workload whose child runs there.

    Each workload's ledger adds what the directory must hold, and what the round
    machinery (``crash.crash_round``, ``driver.play_round``, ``driver.run``) asks of it:
    ``begin`` (a round starts), ``reader`` (the round's pipe lines: ``opened``, ``line``
    for its ``TAGS``, ``finish``, ``ops``, ``acked_seqs``), ``check`` (recover and check),
    ``absorb`` (what that recovery returned is durable from now on) and ``kept_info``
    (for a kept failing round).
    """

    path: str
    segment_size: int
    rounds: set[int] = field(default_factory=set)
    workload: str = "wal"

    def begin(self, rnd: int) -> dict:
        """Round ``rnd`` starts here; returns what its child's spec needs besides the setup."""
        self.rounds.add(rnd)
        return {}

    def size(self) -> int:
        """Bytes of the files in the directory."""
        return sum(e.stat().st_size for e in os.scandir(self.path) if e.is_file())

    def reader(self, rnd: int) -> RoundPipe:
        raise NotImplementedError       # (each workload's ledger)

    def check(self, mode: str) -> C:
        raise NotImplementedError

    def absorb(self, check: C) -> None:
        raise NotImplementedError

    def kept_info(self) -> dict:
        raise NotImplementedError


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
        run = self.runs.get(key)
        return run[0] + len(run[1]) if run else 0
