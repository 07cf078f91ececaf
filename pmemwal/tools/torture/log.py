"""The log workload of the crash torture: the child's workers on a ``pmemwal.Log``
(``log_entries``), and the parent's ledger of a directory (``pmemwal torture --workload log``).

The child opens the log as the spec says, writes ``R <persist_method> <first_index>
<last_index>`` (which must be what the parent's last recovery returned), then runs
``threads`` workers in the spec's term until it is killed; every event is a pipe line.
``LogLedger`` gives each round a ``log_model.LogModel`` that starts from what the
last recovery returned, in a term above every term used in the directory.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pmemwal
from pmemwal.tools.torture.childkit import Pipe, run_threads, wal_options
from pmemwal.tools.torture.log_entries import OPS, Shared, Worker
from pmemwal.tools.torture.log_model import LogCheck, LogModel, Recovered
from pmemwal.tools.torture.plugin import PipeError, TortureDir, TortureWorkload
from pmemwal.tools.torture.records import record_size


class LogWorkload(TortureWorkload):
    """Entries, rewinds, compactions, resets and hard states of a Log: ``threads`` workers
    in the child, a ``LogLedger`` in the parent."""

    name = "log"

    def open(self, spec: dict) -> pmemwal.Log:
        return pmemwal.open_log(spec["dir"], **wal_options(spec))

    def ready(self, log: pmemwal.Log) -> str:
        return f"{log.wal.persist_method} {log.first_index} {log.last_index}"

    def run(self, log: pmemwal.Log, pipe: Pipe, spec: dict) -> None:
        shared = Shared(log, spec["round"], spec["term"],
                        lambda *event: pipe.say(" ".join(map(str, event))),
                        lambda rng: record_size(rng, spec["segment_size"]))

        def work(thread: int) -> None:
            worker, rng = Worker(shared, thread), random.Random(f"{spec['seed']}/{thread}")
            while True:
                worker.step(rng)

        run_threads(spec["threads"], work)

    def ledger(self, path: str, segment_size: int) -> LogLedger:
        return LogLedger(path, segment_size)


WORKLOAD = LogWorkload()


@dataclass
class LogLedger(TortureDir[LogCheck]):
    """A log workload's torture directory: the log its last recovery returned (each round
    starts from it), the highest term used here, and the current round's model."""

    workload: str = "log"
    start: Recovered = field(default_factory=Recovered)
    term: int = 0
    model: LogModel | None = None

    def begin(self, rnd: int) -> dict:
        """A round's child leads in a new term, above every term used in this directory."""
        super().begin(rnd)
        self.term += 1
        self.model = LogModel(rnd, self.rounds, self.term, self.start)
        return {"term": self.term}

    @property
    def round_model(self) -> LogModel:
        """The current round's model (``begin`` makes it)."""
        assert self.model is not None, "no round began here"
        return self.model

    def reader(self, rnd: int) -> LogPipe:
        return LogPipe(self.round_model, self.start)

    def check(self, mode: str) -> LogCheck:
        return self.round_model.recover(self.path, mode=mode, segment_size=self.segment_size)

    def absorb(self, chk: LogCheck) -> None:
        """What the recovery returned is where the next round starts."""
        if chk.recovered is not None:
            self.start = chk.recovered
        self.term = max(self.term, self.round_model.term)

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
