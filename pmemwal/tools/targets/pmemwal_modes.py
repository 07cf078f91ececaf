"""pmemwal's own targets: ``buffered``, ``direct``, ``auto`` and ``direct-procs``, run by the
write benchmark."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

import pmemwal
from pmemwal.errors import ConfigError
from pmemwal.tools import bench
from pmemwal.tools.bench import BenchConfig, Latency
from pmemwal.tools.targets import RunResult, Workload
from pmemwal.tools.targets.common import _check_params, _empty_dir, _field_default, _prepare_dir

_LATENCY_GRID = 20_000  # quantile points when pmemwal's append and flush latencies are combined


class _PmemwalTarget:
    """pmemwal itself, through ``pmemwal.tools.bench.run`` (the ``pmemwal bench`` command's engine).

    The WAL lives in ``PATH/wal``, opened with ``mode`` = the target's name;
    clients are threads (``direct-procs``: processes) calling ``wal.append`` and
    ``wal.flush(lsn)`` per the flush policy, with a final ``wal.flush()`` inside
    the elapsed time.  The
    bench keeps the disk bounded (``keep_bytes`` of WAL behind the flushed
    LSN, truncated by a client each time a quarter of it has been appended,
    outside its latency), so that after the warm-up every record size runs on
    recycled segments: ``extra['segments_after_warm_up']`` counts those
    created, recycled and removed during the run (``extra['stats']``, the
    WAL's counters, count from the same point).  ``params`` are
    BenchConfig's other fields (``segment_size``, ``insert_slots``,
    ``keep_bytes``, ...).

    The bench times append and flush apart, so the per-record latency is
    combined from the two distributions: the mean exactly, the percentiles
    assuming a record's append and flush sit at the same rank of their own
    distributions (for ``end``: the append latency alone).  Both
    distributions are in ``extra``, and so is the run's progress:
    ``extra['intervals']``, records/s per interval of 1 s (a tenth of a shorter
    run), as pgbench's progress lines (``pmemwal report --intervals`` draws them).
    """

    name = mode = "auto"
    processes = False  # BenchConfig.processes: the clients are processes (direct-procs)
    _FIXED = ("path", "mode", "clients", "size", "duration", "flush", "fresh",
              "progress_interval", "keep_wal", "processes")
    # params of another mode only: a grid varies them for that mode alone
    _OTHER_MODES: tuple[str, ...] = ()

    @property
    def params(self) -> dict:
        return {f.name: _field_default(f) for f in dataclasses.fields(BenchConfig)
                if f.name not in self._FIXED}

    def check(self, params: dict) -> None:
        """ConfigError for params a run would refuse, before any run (the harness asks)."""
        try:
            BenchConfig(mode=self.mode, processes=self.processes, **params)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{self.name}: {error}") from None

    def applies(self, param: str) -> bool:
        """Whether ``param`` changes what this target does (``persist`` is direct mode's
        alone, ``buffer_size`` and ``sync_method`` buffered mode's): the harness runs a
        target once per value of the params that apply to it."""
        return param in self.params and param not in self._OTHER_MODES

    def available(self) -> str | None:
        return None

    def version(self) -> str:
        return f"pmemwal {pmemwal.__version__}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        _prepare_dir(workload.path)
        try:
            try:
                config = BenchConfig(path=os.path.join(workload.path, "wal"), mode=self.mode,
                                     clients=workload.clients, size=workload.size,
                                     duration=workload.duration, flush=workload.flush,
                                     fresh=True, processes=self.processes,
                                     progress_interval=interval_for(workload.duration), **params)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            intervals: list[list[float]] = []
            result = bench.run(config, progress=lambda p: intervals.append(
                [round(p["elapsed"], 3), round(p["records_per_s"], 1)]))
        finally:
            _empty_dir(workload.path)
        append, flush = result.append_latency, result.flush_latency
        return RunResult(
            target=self.name, records=result.records, bytes=result.bytes,
            elapsed=result.elapsed,
            latency_us=_combined_latency(result.append_histogram, result.flush_histogram,
                                         append, flush),
            extra={
                "version": self.version(),
                "mode": result.mode,
                "processes": self.processes,
                "persist_method": result.persist_method,
                "probe_mode": result.probe_mode,
                "probe_reason": result.probe_reason,
                "segment_size": result.segment_size,
                "insert_slots": config.insert_slots,
                "final_flush_us": result.final_flush_us,
                "background_flushes": result.background_flushes,
                "per_client_records": result.per_client_records,
                "append_latency_us": dataclasses.asdict(append) if append else None,
                "flush_latency_us": dataclasses.asdict(flush) if flush else None,
                "latency_method": "append and flush combined at equal ranks; mean exact",
                "segments_after_warm_up": result.segments_after_warm_up,
                "stats": result.stats,
                "pmem_is_pmem_force": os.environ.get("PMEM_IS_PMEM_FORCE"),
                "intervals": intervals,  # [seconds into the run, records/s in the interval]
            })


class BufferedTarget(_PmemwalTarget):
    """pmemwal in buffered mode: records copied into the WAL buffer ring, written with
    pwrite and made durable with fdatasync; run as ``_PmemwalTarget`` says."""

    name = mode = "buffered"
    _OTHER_MODES = ("persist",)


class DirectTarget(_PmemwalTarget):
    """pmemwal in direct mode: records copied into the mapped segment files, made durable
    by libpmem's cache flushes where libpmem takes the mapping for pmem (DAX, or tmpfs
    under ``PMEM_IS_PMEM_FORCE=1``), by msync otherwise (``extra['persist_method']``
    says which); run as ``_PmemwalTarget`` says."""

    name = mode = "direct"
    _OTHER_MODES = ("buffer_size", "sync_method")


class DirectProcsTarget(DirectTarget):
    """pmemwal in direct mode with one process per client: each opens the WAL with
    ``shared=True`` and appends to the one stream (BenchConfig ``processes``; the main
    process warms the WAL up and holds it open).  The processes start, and open the WAL,
    before the clock starts; ``elapsed`` ends with the last process's final flush.  Client
    0 alone truncates.  Not in TARGET_NAMES (an extra, as ``auto``); its params are
    ``direct``'s."""

    name = "direct-procs"
    processes = True


class AutoTarget(_PmemwalTarget):
    """pmemwal with ``mode="auto"``: ``PMEMWAL_MODE``, else the device probe picks
    buffered or direct (``extra['mode']``, ``extra['probe_reason']``); not in
    TARGET_NAMES, since it repeats one of the two."""

    name = mode = "auto"


def interval_for(duration: float) -> float:
    """Seconds between a run's progress points: 1, or a tenth of a shorter run."""
    return min(1.0, max(duration / 10, 0.01))


def _combined_latency(append_hist, flush_hist, append: Latency | None,
                      flush: Latency | None) -> dict:
    """Per-record latency (µs) from pmemwal's separate append and flush distributions.

    A flushed record's latency is taken as append + flush at the same quantile
    (exact when the two are ranked alike; for ``each`` it is the sum of the
    percentiles); records without a flush count their append alone.
    """
    if append is None:
        return {}
    flushes = flush.count if flush else 0
    mean = (append.mean * append.count + (flush.mean * flushes if flush else 0.0)) / append.count
    if not flushes:
        return {"p50": append.p50, "p99": append.p99, "p999": append.p999, "mean": mean}
    u = (np.arange(_LATENCY_GRID) + 0.5) / _LATENCY_GRID
    a, f = _quantiles(append_hist, u), _quantiles(flush_hist, u)
    values = np.concatenate([a, a + f])
    weights = np.concatenate([np.full(u.size, float(max(append.count - flushes, 0))),
                              np.full(u.size, float(flushes))])
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])

    def at(percent: float) -> float:
        i = int(np.searchsorted(cumulative, cumulative[-1] * percent / 100, side="left"))
        return float(values[min(i, values.size - 1)]) / 1000

    return {"p50": at(50), "p99": at(99), "p999": at(99.9), "mean": mean}


def _quantiles(hist, u: np.ndarray) -> np.ndarray:
    """The histogram's values (ns) at quantiles ``u`` (each bucket's highest value)."""
    steps = [(item.value_iterated_to, item.count_added_in_this_iter_step)
             for item in hist.get_recorded_iterator()]
    values = np.array([v for v, _ in steps], dtype=np.float64)
    cumulative = np.cumsum([c for _, c in steps], dtype=np.float64)
    index = np.searchsorted(cumulative, u * cumulative[-1], side="left")
    return values[np.minimum(index, values.size - 1)]
