"""What every torture child does besides its workload: whole pipe lines to the parent,
worker threads whose failure ends the process at once, and the WAL options of a spec.

A child's pipe is its stdout; the parent kills it with SIGKILL at a moment of its
choosing, so a line is one write (never half of one from two threads), and any error
exits with status 70 and a traceback on stderr: the parent must not mistake a dead
thread's silence, or a failed open, for the kill it meant.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Callable, NoReturn, TypeVar

T = TypeVar("T")


class Pipe:
    """Whole lines to a file descriptor, one thread at a time, unbuffered."""

    def __init__(self, fd: int) -> None:
        self._fd, self._lock = fd, threading.Lock()

    def say(self, line: str) -> None:
        data = (line + "\n").encode()
        with self._lock:
            while data:
                data = data[os.write(self._fd, data):]


def die() -> NoReturn:
    """The traceback to stderr, then exit 70 at once (other threads must not go on)."""
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(70)


def opened(open_target: Callable[[], T]) -> T:
    """What ``open_target`` opens; a failure to open ends the process like any error."""
    try:
        return open_target()
    except BaseException:
        die()


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """``work(thread)`` in ``count`` threads until the parent kills the process."""
    def guarded(thread: int) -> None:
        try:
            work(thread)
        except BaseException:
            die()

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wal_options(spec: dict) -> dict:
    """pmemwal.open's options for the spec's setup.  Checkpoints (the WAL's, and a Log's
    index with them) every 10 ms rather than every second: a round lasts a fraction of a
    second, and its kill should land in the middle of writing one as often as anywhere."""
    return {"mode": spec["mode"], "segment_size": spec["segment_size"],
            "insert_slots": spec["slots"], "background": True,
            "checkpoint_interval": spec.get("checkpoint_interval", 0.01)}
