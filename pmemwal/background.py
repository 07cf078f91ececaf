"""The background writer: asynchronous flushes and the segment pipeline.

One thread per WAL.  It wakes every ``flush_interval`` seconds, or at once
when the native core reports (through an eventfd) that an insertion entered
a new segment, and then

1. keeps ``prepare_segments`` segments ahead of the insert position created
   (or recycled), fully allocated, mapped and pre-faulted, and attached to
   the core, so that appenders never create a file or take a first-touch
   page fault (seed 003: on tmpfs the faults, not the copy, set the pace);
2. flushes what was appended without a flush, so that asynchronously
   committed records become durable within ``flush_interval``.

Everything it does runs with the GIL released in native code or system
calls, apart from a little bookkeeping per segment.
"""

from __future__ import annotations

import os
import select
import threading
from typing import Callable

from pmemwal.errors import ClosedError


class BackgroundWriter:
    """Runs ``prepare()`` and ``flush()`` in a daemon thread until ``stop()``."""

    def __init__(self, prepare: Callable[[], None], flush: Callable[[], None],
                 flush_interval: float, name: str) -> None:
        self._prepare = prepare
        self._flush = flush
        self._interval = flush_interval
        self.notify_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.notify_fd, select.POLLIN)
        while not self._stopping:
            if poller.poll(self._interval * 1000):
                try:
                    os.eventfd_read(self.notify_fd)
                except BlockingIOError:
                    pass
            if self._stopping:
                break
            try:
                self._prepare()
                self._flush()
            except ClosedError:
                return
            except Exception as exc:  # e.g. no space for a new segment: try again next round;
                self.error = exc      # an appender that needs the segment gets the error itself

    def stop(self) -> None:
        """Wake the thread, wait for it to finish its round, and release the eventfd."""
        self._stopping = True
        os.eventfd_write(self.notify_fd, 1)
        self._thread.join()
        os.close(self.notify_fd)
