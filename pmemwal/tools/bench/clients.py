"""The clients as threads: ``_Client``, the loop that appends and times (a client
process runs it too, in its main thread), and ``_Threads``, the threads of this
process that ``_Run.measure`` starts, joins and gathers.

Every client appends the same preallocated payload in a tight loop and times each
append and each flush (latency.py).  The flush policy is ``each`` (every record
committed with ``append(data, flush=True)``, one native call, timed as the append
latency), ``group:K`` (a flush after every K records of that client) or ``end`` (once,
after the clients stop; that final flush is part of the elapsed time).  With ``rate``
each client appends at most that many records a second.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from pmemwal.tools.bench.latency import _DRAIN_EVERY, _Timings

if TYPE_CHECKING:
    from pmemwal.tools.bench.session import _Run


class _Client(threading.Thread):
    """One appending thread; ``snapshot`` is (records, latency sum, latency sum of squares,
    interval, its highest latency, the previous interval's highest).  A client process
    runs ``loop`` in its main thread (the object is never started)."""

    def __init__(self, run: _Run, index: int) -> None:
        super().__init__(name=f"pmemwal-bench-{index}", daemon=True)
        self.run_ = run
        self.snapshot = (0, 0, 0, 0, 0, 0)
        self.appends, self.flushes = _Timings(), _Timings()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.run_.barrier.wait()
            self.loop()
        except BaseException as error:  # stop everyone; the main thread re-raises it
            self.error = error
            self.run_.deadline = 0

    def loop(self) -> None:
        """Append until ``run_.deadline`` (ns), timing each append and flush."""
        r = self.run_
        append, flush, now = r.wal.append, r.wal.flush, time.perf_counter_ns
        payload, every = r.payload, r.config.flush_every
        appends, flushes = self.appends, self.flushes
        append_ns = appends.samples
        add_append, add_flush = append_ns.append, flushes.samples.append
        n = total = squares = 0
        # the highest latency of the progress interval ``ticks[0]`` (the main thread moves
        # it on at each line): read after the record, so that a stall counts where it ends
        ticks, seen, peak, before = r.ticks, 0, 0, 0
        countdown = every
        commit = every == 1  # flush each: append(data, flush=True), one call timed as one
        interval = int(1e9 / r.config.rate) if r.config.rate else 0
        due = now()
        while True:
            t0 = now()
            if interval:  # paced: wait for this record's turn (one running late goes at once)
                due += interval
                if due > t0:
                    time.sleep((due - t0) / 1e9)
                    t0 = now()
            if t0 >= r.deadline:
                break
            lsn = append(payload, commit)
            t1 = now()
            lat = t1 - t0
            add_append(lat)
            if every and not commit:
                countdown -= 1
                if not countdown:
                    countdown = every
                    flush(lsn)
                    t2 = now()
                    add_flush(t2 - t1)
                    lat = t2 - t0
            n += 1
            total += lat
            squares += lat * lat
            tick = ticks[0]
            if tick != seen:  # a progress line took the interval before: start this one's
                before, seen, peak = peak if tick == seen + 1 else 0, tick, lat
            elif lat > peak:
                peak = lat
            self.snapshot = (n, total, squares, seen, peak, before)
            if lsn >= r.next_cut:  # a step appended since the last truncation
                r.cut(lsn)
            if len(append_ns) >= _DRAIN_EVERY:
                appends.drain()
                flushes.drain()
        appends.drain()
        flushes.drain()


class _Threads:
    """The clients as threads of this process (``measure`` drives them, as ``_Processes``)."""

    background_flushes = 0  # those of the truncating client are the run's own

    def __init__(self, run: _Run) -> None:
        self.run_ = run
        self.clients = [_Client(run, i) for i in range(run.config.clients)]
        self.sleep = time.sleep

    def start(self) -> None:
        for client in self.clients:
            client.start()

    def go(self, start: int) -> None:
        self.run_.barrier.wait()

    def halt(self) -> None:
        """Stop early (Ctrl-C): the threads read ``_Run.deadline`` itself, already 0."""

    def settle(self, tick: int) -> None:
        """The threads' snapshots are current: nothing to wait for."""

    def finish(self) -> None:
        for client in self.clients:
            client.join()

    def stop(self) -> None:
        self.run_.barrier.abort()  # frees clients still waiting if the start itself failed
        for client in self.clients:
            if client.ident is not None:
                client.join()

    @property
    def errors(self) -> list[BaseException]:
        return [client.error for client in self.clients if client.error is not None]

    def snapshots(self) -> list[tuple]:
        return [client.snapshot for client in self.clients]

    def records(self) -> list[int]:
        return [client.snapshot[0] for client in self.clients]

    def end(self) -> tuple[int, int]:
        """The final flush, once the clients stopped: when it ended (ns), how long it took."""
        t = time.perf_counter_ns()
        self.run_.wal.flush()
        end = time.perf_counter_ns()
        return end, end - t

    def process_stats(self) -> dict[str, int]:
        return {}                   # (only clients that are processes have some)

    def timings(self) -> tuple[_Timings, _Timings]:
        appends, flushes = _Timings(), _Timings()
        for client in self.clients:
            appends.add(client.appends)
            flushes.add(client.flushes)
        return appends, flushes
