"""The checkpointer workload of the crash torture: the WAL workload's writers, and a thread
beside them that truncates every ``checkpoint`` seconds, as a database's checkpointer
does, so that kills land amid segment recycling (``pmemwal torture --checkpoint S``).

Each truncation goes to the flushed LSN of the checkpoint before it (a checkpointer's
redo point), announced on the pipe like writer 0's (``T <lsn>``); the parent's ledger
is the WAL workload's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pmemwal
from pmemwal.tools.torture.childkit import Pipe, run_threads
from pmemwal.tools.torture.wal import Ledger, WalWorkload, truncate, writer


def checkpointer(wal: pmemwal.WAL, pipe: Pipe, spec: dict) -> None:
    """Truncate every ``spec['checkpoint']`` seconds to the previous checkpoint's flushed LSN."""
    redo = wal.flushed_lsn
    while True:
        time.sleep(spec["checkpoint"])
        truncate(wal, pipe, spec["segment_size"], redo)
        redo = wal.flushed_lsn


@dataclass
class CheckpointerLedger(Ledger):
    """The WAL workload's ledger, whose rounds' children run a checkpointer too."""

    workload: str = "checkpointer"
    checkpoint: float = 0.005   # seconds between its truncations

    def begin(self, rnd: int) -> dict:
        return {**super().begin(rnd), "checkpoint": self.checkpoint}


class CheckpointerWorkload(WalWorkload):
    """The WAL workload with a checkpointer thread beside the writers."""

    name = "checkpointer"

    def __init__(self, checkpoint: float = 0.005) -> None:
        self.checkpoint = checkpoint

    def run(self, wal: pmemwal.WAL, pipe: Pipe, spec: dict) -> None:
        writers = spec["threads"]
        run_threads(writers + 1, lambda t: writer(wal, pipe, spec, t) if t < writers
                    else checkpointer(wal, pipe, spec))

    def ledger(self, path: str, segment_size: int) -> CheckpointerLedger:
        return CheckpointerLedger(path, segment_size, checkpoint=self.checkpoint)


WORKLOAD = CheckpointerWorkload()
