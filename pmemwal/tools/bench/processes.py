"""The clients as processes (``processes``), on one WAL shared by them.

In direct mode, the WAL opened with ``shared=True`` in each and in the main process:
started with multiprocessing's "spawn", each opens the WAL and reports ready, and the
clock starts once all have, so that their start-up is not timed.  Each runs the same
loop as a thread does, then its own final flush; ``elapsed`` runs from the common
start to the last of those flushes' ends.  Client 0 alone truncates (the others
do not wait for it); a checkpointer thread runs in the main process.  Each
process sends back its counts, its HdrHistograms (encoded) and its background
writer's CPU time over its run, merged into one result, and copies its progress into
shared memory every 10 ms for the progress lines.  The main process holds the WAL
open (warm-up, truncation after the run, counters) without a background writer.  A
script that runs them needs the ``if __name__ == "__main__":`` guard: "spawn" imports
the main module again.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
import traceback
from array import array

from pmemwal.tools.bench.clients import _Client
from pmemwal.tools.bench.config import BenchConfig
from pmemwal.tools.bench.latency import _Timings
from pmemwal.tools.bench.session import _Run
from pmemwal.tools.bench.wal_dir import _open_wal

_PUBLISH = 0.01  # s: how often a client process copies its progress into shared memory
_SETTLE = 1.0  # s a progress line waits at most for every client process to publish
_SLOTS = 7  # shared doubles per client: its snapshot (6), and the interval it last published in
_DONE = float(1 << 52)  # that interval, once its last snapshot is published


class _Processes:
    """The clients as processes (``processes``), started with multiprocessing's "spawn".

    Each (``_client_process``) sends "ready" once its WAL is open, waits for ``go``,
    then runs ``_Client.loop`` and its final flush and sends its result; an error
    anywhere is sent instead and raised here, the other processes terminated.
    """

    def __init__(self, run: _Run) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.run_, n = run, run.config.clients
        self.counts = ctx.RawArray("d", _SLOTS * n)  # each client's snapshot, every _PUBLISH
        # the deadline (perf_counter_ns, one clock for all; 0 stops them) and the interval
        self.clock = ctx.RawArray("q", 2)
        run.ticks = _ticks(self.clock)  # the progress interval, as the client processes read it
        self.go_event = ctx.Event()
        pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
        self.conns = [receive for receive, _ in pipes]
        self.sends = [send for _, send in pipes]  # closed here once started: EOF if one dies
        self.procs = [ctx.Process(target=_client_process, name=f"pmemwal-bench-{i}", daemon=True,
                                  args=(run.config, i, self.counts, self.clock, self.go_event,
                                        send))
                      for i, (_, send) in enumerate(pipes)]
        self.results: dict[int, dict] = {}
        self.errors: list[BaseException] = []  # raised as they come
        self.attached = 0

    def start(self) -> None:
        # SIGINT blocked in the processes from their start: Ctrl-C in a terminal reaches
        # the whole group, and this process stops them (``halt``), or terminates them
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for proc, send in zip(self.procs, self.sends):
                proc.start()
                send.close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for i, conn in enumerate(self.conns):
            if self._receive(i, conn) != "ready":
                raise ChildProcessError(f"bench client process {i}: expected 'ready'")

    def go(self, start: int) -> None:
        self.clock[0] = self.run_.deadline
        self.go_event.set()
        self.attached = self.run_.wal.stats().get("processes", 0)

    def halt(self) -> None:
        """Stop early (Ctrl-C): each process sees the deadline 0 within ``_PUBLISH``."""
        self.clock[0] = 0

    def settle(self, tick: int) -> None:
        """Wait (up to ``_SETTLE``) until every client process has published a snapshot
        since the progress interval became ``tick``, holding all its records before."""
        give_up = time.monotonic() + _SETTLE
        while any(self.counts[_SLOTS * i + _SLOTS - 1] < tick for i in range(len(self.procs))):
            if time.monotonic() > give_up:
                return
            time.sleep(_PUBLISH / 10)

    def sleep(self, seconds: float | None) -> None:
        """Wait up to ``seconds`` for results, taking those that came (raising an error)."""
        pending = [c for i, c in enumerate(self.conns) if i not in self.results]
        ready = multiprocessing.connection.wait(pending, seconds)
        for i, conn in enumerate(self.conns):
            if conn in ready:
                self._receive(i, conn)

    def finish(self) -> None:
        while len(self.results) < len(self.conns):
            self.sleep(None)

    def stop(self) -> None:
        done = len(self.results) == len(self.procs)
        for proc in self.procs:
            if proc.pid is None:
                continue
            proc.join(None if done else 0)  # on failure, no waiting for the others
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self.conns + self.sends:
            conn.close()

    def _receive(self, i: int, conn) -> str:
        try:
            kind, value = conn.recv()
        except EOFError:
            self.procs[i].join(1)
            raise ChildProcessError(f"bench client process {i} exited (code "
                                    f"{self.procs[i].exitcode}) without a result") from None
        if kind == "error":
            raise value
        if kind == "done":
            self.results[i] = value
        return kind

    def snapshots(self) -> list[tuple]:
        c = self.counts
        return [tuple(c[_SLOTS * i:_SLOTS * i + _SLOTS - 1]) for i in range(len(self.procs))]

    def records(self) -> list[int]:
        return [self.results[i]["records"] for i in range(len(self.procs))]

    @property
    def background_flushes(self) -> int:
        return sum(r["background_flushes"] for r in self.results.values())

    @property
    def background_cpu_ns(self) -> int:
        """The CPU time the clients' background writers used while they ran, summed."""
        return sum(r["background_cpu_ns"] for r in self.results.values())

    def process_stats(self) -> dict[str, int]:
        # "processes", a gauge: those attached during the run, this one included; this
        # process runs no background writer: the clients' writers, each over its run
        return {"processes": self.attached, "background_cpu_ns": self.background_cpu_ns}

    def end(self) -> tuple[int, int]:
        """When the last client's final flush ended (ns) and how long that flush took."""
        last = max(self.results.values(), key=lambda r: r["end_ns"])
        return last["end_ns"], last["flush_ns"]

    def timings(self) -> tuple[_Timings, _Timings]:
        appends, flushes = _Timings(), _Timings()
        for result in self.results.values():
            appends.add_state(result["appends"])
            flushes.add_state(result["flushes"])
        return appends, flushes


def _client_process(config: BenchConfig, index: int, counts, clock, go, conn) -> None:
    """A client process (``_Processes``): open the shared WAL, say "ready", wait for
    ``go``, run the client loop until the deadline in ``clock``, flush, send the result."""
    try:
        with _open_wal(config, client=True) as wal:
            run = _Run(config, wal, None, {})
            run.ticks = _ticks(clock)
            if index:
                run.next_cut = 1 << 62  # client 0 alone truncates
            client = _Client(run, index)
            mine = memoryview(counts).cast("B").cast("d")[_SLOTS * index:_SLOTS * (index + 1)]
            stop = threading.Event()

            def publish(tick: float) -> None:
                mine[:_SLOTS - 1] = array("d", client.snapshot)
                mine[_SLOTS - 1] = tick  # after the snapshot it covers

            def publisher() -> None:
                while not stop.wait(_PUBLISH):
                    tick = run.ticks[0]  # before the snapshot: it holds the records before
                    publish(tick)
                    run.deadline = min(run.deadline, clock[0])  # 0: stopped early (halt)

            conn.send(("ready", None))
            go.wait()
            run.deadline = clock[0]
            background = wal.stats()["background_cpu_ns"]  # this process's own writer
            thread = threading.Thread(target=publisher, name="bench-publisher", daemon=True)
            thread.start()
            try:
                client.loop()
                t = time.perf_counter_ns()
                wal.flush()
                end = time.perf_counter_ns()
            finally:
                stop.set()
                thread.join()
            publish(_DONE)
            conn.send(("done", {
                "records": client.snapshot[0], "end_ns": end, "flush_ns": end - t,
                "background_flushes": run.background_flushes,
                "background_cpu_ns": wal.stats()["background_cpu_ns"] - background,
                "appends": client.appends.state(), "flushes": client.flushes.state()}))
    except BaseException as error:
        error.add_note(f"in bench client process {index}:\n{traceback.format_exc()}")
        try:
            conn.send(("error", error))
        except Exception:  # an exception that does not pickle
            conn.send(("error", ChildProcessError(f"bench client process {index}: {error!r}")))
    finally:
        conn.close()


def _ticks(clock) -> memoryview:
    """The progress interval in the shared ``clock``, as one item to read and set."""
    return memoryview(clock).cast("B").cast("q")[1:2]
