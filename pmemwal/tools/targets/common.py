"""What the targets share: threads of clients timed per record, and the helpers
that check parameters and keep a target's directory (see pmemwal.tools.targets)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from pmemwal.errors import ConfigError
from pmemwal.tools import bench
from pmemwal.tools.bench import Latency, parse_size
from pmemwal.tools.targets import MARKER, RunResult, Target, TargetError, Workload


class _Client(Protocol):
    """One client thread's connection to a peer; made, used and closed in that thread."""

    def write(self) -> None:
        """Write the next record (for ``each`` targets that sync per write: durably)."""

    def sync(self) -> None:
        """Make this client's records durable (called every ``every`` records)."""

    def finish(self) -> None:
        """Make every record this client wrote durable (timed: inside elapsed)."""

    def close(self) -> None:
        """Release the connection (untimed)."""


@dataclass
class _Measured:
    records: int
    elapsed: float
    latency: Latency | None
    per_client: list[int]


class _Clients:
    """Runs ``workload.clients`` threads, each looping ``write`` (and ``sync`` every
    ``every`` records) until the deadline, then ``finish``; like pmemwal.tools.bench's loop."""

    def __init__(self, workload: Workload, every: int, open_client: Callable[[int], _Client]):
        self.workload, self.every, self.open_client = workload, every, open_client
        self.deadline = 1 << 62  # ns; set once every client is ready, 0 stops them
        self.start = 0
        # the last client to get ready starts the clock, then all are released at once
        self.barrier = threading.Barrier(workload.clients, action=self._start_clock)
        self.records = [0] * workload.clients
        self.ends = [0] * workload.clients
        self.timings = [bench._Timings() for _ in range(workload.clients)]
        self.errors: list[BaseException] = []

    def _start_clock(self) -> None:
        self.start = time.perf_counter_ns()
        self.deadline = self.start + int(self.workload.duration * 1e9)

    def measure(self) -> _Measured:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True,
                                    name=f"pmemwal-target-{i}")
                   for i in range(self.workload.clients)]
        try:
            for thread in threads:
                thread.start()
        except BaseException:
            self.deadline = 0
            self.barrier.abort()
            raise
        finally:
            for thread in threads:
                if thread.ident is not None:
                    thread.join()
        if self.errors:
            raise self.errors[0]
        timings = bench._Timings()
        for t in self.timings:
            timings.add(t)
        return _Measured(records=sum(self.records),
                         elapsed=(max(self.ends) - self.start) / 1e9,
                         latency=Latency.of(timings), per_client=list(self.records))

    def _client(self, index: int) -> None:
        client = None
        try:
            client = self.open_client(index)
            self.barrier.wait()
            self.records[index] = self._loop(client, self.timings[index])
            client.finish()
            self.ends[index] = time.perf_counter_ns()
        except threading.BrokenBarrierError:
            pass  # another client failed to get ready; its error is raised
        except BaseException as error:  # stop everyone; measure() re-raises it
            self.errors.append(error)
            self.deadline = 0
            self.barrier.abort()
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()

    def _loop(self, client: _Client, timings: bench._Timings) -> int:
        write, sync, every, now = client.write, client.sync, self.every, time.perf_counter_ns
        samples = timings.samples
        add = samples.append
        n = 0
        countdown = every
        while True:
            t0 = now()
            if t0 >= self.deadline:
                break
            write()
            if every:
                countdown -= 1
                if not countdown:
                    countdown = every
                    sync()
            add(now() - t0)
            n += 1
            if len(samples) >= bench._DRAIN_EVERY:
                timings.drain()
        timings.drain()
        return n


FRESH_START = ("starts on a fresh database, whose files grow during the run (pmemwal's bench "
               "makes its segments in a warm-up first)")


def _thread_result(target: Target, workload: Workload, measured: _Measured, **extra) -> RunResult:
    lat = measured.latency
    return RunResult(
        target=target.name, records=measured.records, bytes=measured.records * workload.size,
        elapsed=measured.elapsed,
        latency_us={"p50": lat.p50, "p99": lat.p99, "p999": lat.p999, "mean": lat.mean}
        if lat else {},
        extra={"version": target.version(), "per_client_records": measured.per_client,
               "latency_stddev_us": lat.stddev if lat else None,
               "latency_max_us": lat.max if lat else None, **extra})


class _Nothing:
    """Default no-op client steps."""

    def sync(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass

def _prepare_dir(path: str) -> None:
    """Make ``path`` an empty directory holding only our marker.

    An existing directory must be empty or hold our marker (a run of ours
    made it): anything else is refused, never deleted.
    """
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            raise ConfigError(f"{path} exists and is not a directory")
        names = os.listdir(path)
        if names and MARKER not in names:
            raise ConfigError(f"{path} holds {sorted(names)[0]!r} and was not made by a "
                              "pmemwal target: refusing to delete it (choose an empty or "
                              "new directory)")
        _empty_dir(path)
    else:
        os.makedirs(path)
    with open(os.path.join(path, MARKER), "w") as f:
        f.write("made by pmemwal.tools.targets: emptied by the next run\n")


def _empty_dir(path: str) -> None:
    """Remove everything in ``path`` (the marker last), leaving the empty directory."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path):
            if entry.name == MARKER:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, MARKER))


def _check_params(target, workload: Workload) -> dict:
    """The target's params with the workload's applied; ConfigError for unknown names."""
    known = target.params
    unknown = sorted(set(workload.params) - set(known))
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"{target.name}: unknown parameter {unknown[0]!r} (valid: {valid})")
    return {**known, **workload.params}


def _size_param(params: dict, name: str) -> int:
    try:
        value = parse_size(params[name])
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None
    if value < 1:
        raise ConfigError(f"{name}={params[name]!r}: 1 or more")
    return value


def _count_param(params: dict, name: str) -> int:
    value = params[name]
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{name}={value!r}: a whole number, 1 or more")
    return value


def _field_default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _policy_text(workload: Workload, sync: str) -> str:
    every = workload.flush_every
    if every == 1:
        return f"{sync} after every record"
    if every:
        return f"{sync} after every {every} records of a client"
    return f"{sync} once per client, when it stops"


@functools.cache
def _missing(module: str, distribution: str) -> str | None:
    """Why ``module`` cannot be imported (one line), or None."""
    try:
        __import__(module)
    except ImportError as error:
        return (f"{distribution} is not installed ({error}): "
                "pip install -e '.[peers]' (or ./setup.sh --peers)")
    return None


def _available_or_raise(target, loader: Callable[[], object] | None = None):
    reason = target.available()
    if reason:
        raise TargetError(f"{target.name} cannot run here: {reason}")
    return loader() if loader else None


def _dist_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"
