"""One crash: run a workload's child on a ledger's WAL, SIGKILL it at a chosen moment,
and read what it said on its pipe.

Every child's pipe begins with the framework's two lines; the rest are the workload's,
parsed by its ledger's ``reader``:

    O                   opening: recovery begins (a kill from here on may land in it)
    R <method> ...      opened: recovery done, the workload starts (its fields after the
                        persist method go to the reader's ``opened``)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from pmemwal.tools.torture.plugin import CHILD, PipeError, RoundPipe, TortureDir
from pmemwal.tools.torture.setups import PERSIST, Setup, child_env


@dataclass
class ChildRun:
    """What the parent saw of one child: its pipe, how it ended, what it acknowledged."""

    persist_method: str | None
    acknowledged: int
    acked_seqs: dict[int, int]      # thread -> records acknowledged
    ops: dict[str, int]             # operations announced, by kind (truncations, rewinds...)
    delay_s: float
    returncode: int
    failure: str | None             # did not get ready, died by itself, broke the protocol
    in_recovery: bool               # killed ``delay_s`` after it began to open, not once ready
    pipe: bytes
    stderr: bytes


def crash_round(ledger: TortureDir, setup: Setup, rnd: int, seed: str, threads: int,
                delay_s: float, timeout: float = 60.0, in_recovery: bool = False) -> ChildRun:
    """Run the ledger's workload's child on its WAL, SIGKILL it ``delay_s`` after it is
    ready (with ``in_recovery``, after it began to open: the kill may land inside its
    recovery, and the check's recovery is then a second one), and record what it
    acknowledged and announced in the ledger."""
    spec = {"workload": ledger.workload, "dir": ledger.path, "mode": setup.mode,
            "segment_size": setup.segment_size, "slots": setup.slots, "threads": threads,
            "round": rnd, "seed": seed, **ledger.begin(rnd)}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", CHILD, json.dumps(spec)],
                                stdout=subprocess.PIPE, stderr=err, env=child_env(setup.persist))
        pipe = _PipeReader(proc.stdout)
        if (pipe.opening if in_recovery else pipe.ready).wait(timeout) and not pipe.eof:
            time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)  # nothing happens if it has already exited
        proc.wait()
        pipe.join()
        err.seek(0)
        stderr = err.read()
    run = _read_pipe(ledger.reader(rnd), pipe.data(), proc.returncode, stderr, delay_s,
                     in_recovery)
    expected = PERSIST[setup.persist][1]
    if run.failure is None and run.persist_method not in (expected, None if in_recovery else expected):
        run.failure = f"persist method {run.persist_method}, expected {expected}"
    return run


class _PipeReader(threading.Thread):
    """Reads the child's stdout to the end, so it never blocks on a full pipe."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self._stream = stream
        self._chunks: list[bytes] = []
        self.opening, self.ready, self.eof = threading.Event(), threading.Event(), False
        self.start()

    def run(self) -> None:
        fd = self._stream.fileno()
        while chunk := os.read(fd, 1 << 16):
            self._chunks.append(chunk)
            self.opening.set()  # (its first line is "O")
            if not self.ready.is_set() and b"\nR " in b"\n" + self.data():
                self.ready.set()
        self.eof = True
        self.opening.set()
        self.ready.set()
        self._stream.close()

    def data(self) -> bytes:
        return b"".join(self._chunks)


def _read_pipe(reader: RoundPipe, data: bytes, returncode: int, stderr: bytes, delay_s: float,
               in_recovery: bool = False) -> ChildRun:
    """Parse a child's pipe: the O and R lines here, the workload's lines in its ``reader``."""
    persist, failure = None, None
    for line in data.split(b"\n")[:-1]:  # the last piece is empty, or cut off by the kill
        tag, *fields = line.split() or [b""]
        try:
            if tag == b"O" and persist is None:
                continue
            if tag == b"R" and persist is None:
                persist = fields[0].decode()
                reader.opened([int(f) for f in fields[1:]])
            elif persist is not None and tag in reader.TAGS:
                reader.line(tag, [int(f) for f in fields])
            else:
                raise PipeError(f"unexpected pipe line {line[:80]!r}")
        except PipeError as error:
            failure = str(error)
        except (ValueError, IndexError):
            failure = f"unexpected pipe line {line[:80]!r}"
        if failure:
            break
    if failure is None and (returncode != -signal.SIGKILL or b"Traceback" in stderr):
        # a writer that failed just before the kill has written its traceback
        failure = f"child exited with status {returncode}: {stderr.decode(errors='replace')[-2000:]}"
    elif failure is None and persist is None and not in_recovery:
        failure = "child never got ready"
    reader.finish()
    seqs = reader.acked_seqs
    return ChildRun(persist, sum(seqs.values()), seqs, reader.ops, delay_s, returncode, failure,
                    in_recovery, data, stderr)

