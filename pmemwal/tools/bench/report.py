"""The result: ``BenchResult``, its summary for people (``report``) and for machines
(``as_dict``, JSON-safe), and the pgbench-style progress line (``format_progress``).

With ``archive``, ``BenchResult.archive`` has the archive counters at the end of the run
(``archive_segments``, ``archive_bytes``, ``archive_ns``, ``archive_failures`` since the
warm-up; ``archive_pending``, the complete segments still waiting, as it is then); an
archive slower than the appenders shows as ``archive_pending`` and as segments created
instead of recycled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pmemwal import _core
from pmemwal.device import ProbeResult
from pmemwal.tools.bench.config import BenchConfig
from pmemwal.tools.bench.latency import Latency, _encode
from pmemwal.tools.progress import plural

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram


@dataclass
class BenchResult:
    """What ``run`` measured; ``report()`` for people, ``as_dict()`` for machines."""

    config: BenchConfig
    mode: str  # the mode the WAL ran in
    persist_method: str
    probe: ProbeResult | None
    segment_size: int
    records: int
    bytes: int
    elapsed: float  # seconds, from the clients' start to the end of the final flush
    final_flush_us: float
    background_flushes: int
    per_client_records: list[int]
    append_latency: Latency | None
    flush_latency: Latency | None  # None when no client flushed
    stats: dict[str, int]  # the WAL's counters since the end of the warm-up
    append_histogram: HdrHistogram = field(repr=False, compare=False)
    flush_histogram: HdrHistogram = field(repr=False, compare=False)
    fresh_segment_rate: float | None = None  # bytes/s this machine makes segments (keep=all)
    archive: dict[str, int] | None = None  # the archive counters at the run's end (archive only)
    interrupted: bool = False  # Ctrl-C stopped it before its duration: it covers ``elapsed``

    @property
    def archive_rate(self) -> float | None:
        """Bytes/s the archiver moved while it worked: the bytes it uploaded in the run over
        the time it spent on them (``archive_ns``: upload and read-back check)."""
        a = self.archive
        return a["archive_bytes"] / a["archive_ns"] * 1e9 if a and a["archive_ns"] else None

    @property
    def archived_per_s(self) -> float | None:
        """Bytes/s archived over the run's elapsed time."""
        return self.archive["archive_bytes"] / self.elapsed if self.archive else None

    @property
    def background_cpu_share(self) -> float:
        """The WAL's background writer's CPU time in the run over its elapsed time: the share
        of one core the WAL took beyond the clients' own (with processes, summed over the
        clients' writers)."""
        return self.stats.get("background_cpu_ns", 0) / 1e9 / self.elapsed

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed / 1e6

    @property
    def segments_after_warm_up(self) -> dict[str, int]:
        """Segments ``created``, ``recycled`` and ``removed`` during the run; a steady
        state creates and removes none."""
        return {k: self.stats.get(f"segments_{k}", 0) for k in ("created", "recycled", "removed")}

    @property
    def making_rate(self) -> float | None:
        """Bytes/s at which this run's WAL made its new segments (their bytes over the
        time spent making them, ``segment_make_ns``), or None when it made none."""
        made_ns = self.stats.get("segment_make_ns", 0)
        return self.segments_after_warm_up["created"] * self.segment_size / made_ns * 1e9 \
            if made_ns else None

    @property
    def probe_mode(self) -> str | None:
        return self.probe.recommended_mode if self.probe else None

    @property
    def probe_reason(self) -> str | None:
        return self.probe.reason if self.probe else None

    def as_dict(self) -> dict:
        """Everything, JSON-safe; the histograms HdrHistogram-encoded (base64)."""
        probe = self.probe.as_dict() if self.probe else None
        if probe:
            probe = {k: list(v) if isinstance(v, tuple) else v for k, v in probe.items()}
        return {
            "config": dataclasses.asdict(self.config),
            "mode": self.mode,
            "persist_method": self.persist_method,
            "probe": probe,
            "segment_size": self.segment_size,
            "records": self.records,
            "bytes": self.bytes,
            "elapsed": self.elapsed,
            "interrupted": self.interrupted,
            "records_per_s": self.records_per_s,
            "mb_per_s": self.mb_per_s,
            "background_cpu_share": self.background_cpu_share,
            "final_flush_us": self.final_flush_us,
            "background_flushes": self.background_flushes,
            "per_client_records": list(self.per_client_records),
            "append_latency_us": _asdict(self.append_latency),
            "flush_latency_us": _asdict(self.flush_latency),
            "segments_after_warm_up": self.segments_after_warm_up,
            "fresh_segment_bytes_per_s": self.fresh_segment_rate,
            "segment_making_bytes_per_s": self.making_rate,
            "stats": dict(self.stats),
            "archive": dict(self.archive) if self.archive else None,
            "archive_bytes_per_s": self.archive_rate,
            "archived_bytes_per_s": self.archived_per_s,
            "append_histogram": _encode(self.append_histogram),
            "flush_histogram": _encode(self.flush_histogram),
        }

    def report(self) -> str:
        """The summary: parameters, then throughput, then latency, then counters."""
        lines = (self._parameter_lines() + self._throughput_lines() + self._latency_lines()
                 + self._counter_lines())
        width = max(len(k) for k, _ in lines) + 1
        return "\n".join(f"{k + ':':<{width}} {v}".rstrip() for k, v in lines)

    def _parameter_lines(self) -> list[tuple[str, object]]:
        c = self.config
        fs = f" ({self.probe.fs_type})" if self.probe and self.probe.fs_type else ""
        lines: list[tuple[str, object]] = [
            ("mode", self.mode if c.mode == self.mode else f"{self.mode} (asked: {c.mode})"),
            ("persist method", self.persist_method),
            ("crc32c path", _core.CRC32C_IMPL),
            ("clients", plural(c.clients, "process", "processes") if c.processes else c.clients),
            ("record size", plural(c.size, "byte")),
            ("flush policy", c.flush),
            ("duration", f"{c.duration:g} s" + (f", {self.interrupted_text}: the figures below "
                                                 "cover that time" if self.interrupted else "")),
            ("path", c.path + fs),
            ("segment size", _size_text(self.segment_size)),
            ("insert slots", c.insert_slots),
            ("prefault", "yes" if c.prefault else "no"),
            ("warm-up", "none (cold: a fresh WAL, its segments made as it goes)" if c.cold
             else "the WAL filled once and truncated: the run starts on recycled segments"),
            ("keep", self._keep_text()),
        ]
        if self.probe:
            lines.append(("probe verdict", f"{self.probe.recommended_mode}/"
                                           f"{self.probe.persist_method}: {self.probe.reason}"))
        return lines

    @property
    def interrupted_text(self) -> str:
        return f"interrupted after {self.elapsed:.1f} s (Ctrl-C)"

    def _keep_text(self) -> str:
        c = self.config
        if c.keep_bytes is None:
            return "all (never truncated)"
        if c.checkpoint:
            return (f"{_size_text(c.keep_bytes)}, and from the previous redo point (a "
                    f"checkpointer thread truncates every {c.checkpoint * 1e3:g} ms)")
        step = c.truncate_step(self.segment_size)
        assert step is not None, "the clients truncate what is kept"
        return f"{_size_text(c.keep_bytes)} (truncated every {_size_text(step)} appended)"

    def _throughput_lines(self) -> list[tuple[str, object]]:
        lines: list[tuple[str, object]] = [
            ("records", self.records),
            ("bytes", f"{self.bytes} ({self.bytes / 1e6:.1f} MB)"),
            ("elapsed", f"{self.elapsed:.3f} s (final flush {self.final_flush_us:.1f} usec)"),
            ("throughput", f"{self.records_per_s:.1f} rec/s, {self.mb_per_s:.1f} MB/s"),
            ("background CPU", f"{100 * self.background_cpu_share:.0f} % of a core" + (
                ", summed over the " + plural(self.config.clients, "client process",
                                              "client processes")
                if self.config.processes else "")),
        ]
        if len(self.per_client_records) > 1:
            lines.append(("records per client", " ".join(map(str, self.per_client_records))))
        return lines

    def _latency_lines(self) -> list[tuple[str, object]]:
        commit = self.config.flush_every == 1
        return [
            ("commit latency (usec)" if commit else "append latency (usec)",
             self.append_latency.line() if self.append_latency else "-"),
            ("flush latency (usec)", self.flush_latency.line() if self.flush_latency
             else "- (in the commit)" if commit else "- (no client flushes)"),
        ]

    def _counter_lines(self) -> list[tuple[str, object]]:
        lines: list[tuple[str, object]] = [("background flushes", self.background_flushes)]
        appended = self.bytes / self.elapsed
        if self.fresh_segment_rate:
            lines.append(("fresh segments", f"{self.fresh_segment_rate / 1e6:.0f} MB/s made here "
                          f"(this run appended {appended / self.fresh_segment_rate:.2f}x that)"))
        if self.making_rate and self.config.keep_bytes is None:
            lines.append(("segments made", f"at {self.making_rate / 1e6:.0f} MB/s in this run "
                          f"(appended {appended / self.making_rate:.2f}x that)"))
        if self.archive:
            lines.append(("archive", self._archive_text(self.archive)))
        lines.append(("segments", ", ".join(f"{n} {k}" for k, n in
                                            self.segments_after_warm_up.items())
                      + " after warm-up"))
        lines.append(("wal counters", "(after warm-up)"))
        lines += [(f"  {k}", v) for k, v in self.stats.items()]
        return lines

    def _archive_text(self, a: dict[str, int]) -> str:
        rate, per_s = self.archive_rate, a["archive_bytes"] / self.elapsed  # (archived_per_s)
        return (f"{plural(a['archive_segments'], 'segment')}, "
                f"{a['archive_bytes'] / 1e6:.1f} MB archived ("
                + (f"{rate / 1e6:.1f} MB/s while archiving, " if rate else "")
                + f"{per_s / 1e6:.1f} MB/s over the run); "
                f"{plural(a['archive_failures'], 'failure')}, "
                f"{plural(a['archive_pending'], 'segment')} pending at the end")


def format_progress(elapsed: float, records_per_s: float, mb_per_s: float,
                    lat_ms: float, stddev_ms: float, max_ms: float) -> str:
    """A pgbench-style progress line, with the interval's highest latency."""
    return (f"progress: {elapsed:.1f} s, {records_per_s:.1f} rec/s, {mb_per_s:.1f} MB/s, "
            f"lat {lat_ms:.3f} ms stddev {stddev_ms:.3f} max {max_ms:.3f}")


def _asdict(latency: Latency | None) -> dict | None:
    return dataclasses.asdict(latency) if latency else None


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return plural(n, "byte")
