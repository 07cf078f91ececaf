"""A run group's results as tables: ``PointSummary`` (one point's runs: the trimmed
mean of records/s, and its spread), ``Summary`` (throughput, ratio and counter tables,
the machine's state over the runs and its warnings, the terms a peer's runs differ on,
and the report of them all as text or markdown), and ``trimmed_mean``.

May touch: nothing; it works on what ``results.summarize`` read from the database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from pmemwal.errors import ConfigError
from pmemwal.tools.harness.config import COUNTERS
from pmemwal.tools.harness.text import (Table, _rate_text, column_title, pick_baseline,
                                        series_label, size_text)
from pmemwal.tools.progress import plural


UNSTABLE = 0.10  # a point whose runs' stddev exceeds this fraction of the mean is flagged


def trimmed_mean(values: Iterable[float]) -> float:
    """The mean without the highest and the lowest value, where there are 3 or more."""
    values = sorted(values)
    if not values:
        raise ValueError("trimmed_mean of no values")
    if len(values) >= 3:
        values = values[1:-1]
    return math.fsum(values) / len(values)


@dataclass(frozen=True)
class PointSummary:
    """One point's runs: records/s as a trimmed mean, with the raw spread."""

    target: str
    params: dict
    clients: int
    size: int
    runs: int
    records_per_s: float  # trimmed mean
    min: float
    max: float
    stddev: float  # of all runs; 0 for one run
    mb_per_s: float  # trimmed mean
    counters: dict = field(default_factory=dict)  # COUNTERS per second of the run, trimmed means
    group: str = ""  # the run group it comes from
    terms: tuple[str, ...] = ()  # how its runs' terms differ from pmemwal's (target's "terms")

    @property
    def label(self) -> str:
        return series_label(self.target, self.params)

    @property
    def unstable(self) -> bool:
        return self.records_per_s > 0 and self.stddev / self.records_per_s > UNSTABLE


@dataclass
class Summary:
    """A run group's points, in grid order, its environment, and the machine's state at
    the start and end of each run (``machine_state``; None where not recorded)."""

    group: str
    environment: dict
    points: list[PointSummary]
    machine: list[dict | None] = field(default_factory=list)

    @property
    def config(self) -> dict:
        return self.environment.get("config") or {}

    @property
    def flush(self) -> str:
        if "flush" in (self.config.get("params") or {}):
            return "as each series says"
        return self.config.get("flush") or "?"

    def series(self) -> list[str]:
        """The series labels (target + params), in grid order."""
        return list(dict.fromkeys(p.label for p in self.points))

    def clients(self) -> list[int]:
        return sorted({p.clients for p in self.points})

    def sizes(self) -> list[int]:
        return sorted({p.size for p in self.points})

    def point(self, label: str, clients: int, size: int) -> PointSummary | None:
        for p in self.points:
            if p.label == label and p.clients == clients and p.size == size:
                return p
        return None

    def _table(self, title: str, value: Callable[[int, int], float | None],
               number_format: Callable[[float], str]) -> Table:
        rows = [(c, [value(c, s) for s in self.sizes()]) for c in self.clients()]
        return Table(title, "clients", [size_text(s) for s in self.sizes()], rows, number_format)

    def _runs_note(self, flush: bool = True) -> str:
        counts = sorted({p.runs for p in self.points}) or [0]  # "3/6 runs", "1 run"
        how = "trimmed mean of" if counts[-1] >= 3 else "mean of"
        note = f"{how} {''.join(f'{n}/' for n in counts[:-1])}{plural(counts[-1], 'run')}"
        return f"{note}, flush {self.flush}" if flush else note

    def throughput_tables(self) -> list[Table]:
        """Per series: records/s (trimmed mean), rows clients, columns record sizes."""
        tables = []
        for label in self.series():
            def value(c, s, label=label):
                p = self.point(label, c, s)
                return p.records_per_s if p else None
            tables.append(self._table(f"{label}{self._mark(label)}: records/s "
                                      f"({self._runs_note()})", value, _rate_text))
        return tables

    def terms(self) -> dict[str, list[str]]:
        """Per series whose runs were measured on other terms than pmemwal's (a peer that
        persists every record whatever the policy, one that starts on fresh files...):
        the notes its target gave, with the points they hold for."""
        notes: dict[str, dict[str, list[str]]] = {}
        for p in self.points:
            for note in p.terms:
                notes.setdefault(p.label, {}).setdefault(note, []).append(
                    f"{plural(p.clients, 'client')}, {size_text(p.size)} B")
        every = len(self.clients()) * len(self.sizes())
        return {label: [note if len(where) == every else f"{note} (at {', '.join(where)})"
                        for note, where in found.items()] for label, found in notes.items()}

    def _mark(self, label: str) -> str:
        """A mark after a series' title when its terms differ (the report says how)."""
        return " [other terms, see below]" if any(p.terms for p in self.points
                                                  if p.label == label) else ""

    def baseline_series(self, baseline: str | None = None) -> str:
        """The series the ratios divide by: ``baseline`` as a series label, else the first
        series of the target it names (the first params point), else the first series."""
        baseline = baseline or self.config.get("baseline")
        series = self.series()
        if not series:
            raise ConfigError("no results to compare")
        if baseline is None:
            return series[0]
        return pick_baseline(baseline, series, f"run group {self.group}")

    def ratio_tables(self, baseline: str | None = None) -> list[Table]:
        """Per series other than the baseline: its records/s divided by the baseline's."""
        base = self.baseline_series(baseline)
        tables = []
        for label in self.series():
            if label == base:
                continue
            def value(c, s, label=label):
                p, b = self.point(label, c, s), self.point(base, c, s)
                return p.records_per_s / b.records_per_s if p and b and b.records_per_s else None
            title = f"{label}{self._mark(label)}: ratio to {base}{self._mark(base)}"
            groups = {p.group for p in self.points if p.label in (label, base)}
            if len(groups) > 1:         # a join: say that the ratio crosses run groups
                title += f" (across run groups {' and '.join(sorted(groups))})"
            tables.append(self._table(title, value, lambda r: f"{r:.2f}"))
        return tables

    def columns(self) -> list[str]:
        """The counters the comparison asked to table (``--columns``)."""
        return [c for c in self.config.get("columns") or [] if c in COUNTERS]

    def series_tables(self, columns: list[str] | None = None) -> list[Table]:
        """Per client count and record size: a row per series, records/s and each counter
        (per second of the run), as PostgreSQL's insertion-locks thread tabled slots against
        their waits."""
        columns = self.columns() if columns is None else columns
        tables = []
        for c in self.clients():
            for size in self.sizes():
                rows = []
                for label in self.series():
                    p = self.point(label, c, size)
                    if p:
                        counters = [p.counters.get(k) for k in columns]
                        rows.append((label, [p.records_per_s] + counters))
                if rows:
                    tables.append(Table(f"{plural(c, 'client')}, {size_text(size)} records "
                                        f"({self._runs_note(flush=False)})", "series",
                                        ["records/s"] + [column_title(k) for k in columns],
                                        rows, _rate_text))
        return tables

    def machine_line(self) -> str | None:
        """The machine's state over the runs, one line: governors, frequency and load
        ranges (None where the runs did not record it)."""
        states = [s for run in self.machine if run for s in (run.get("start"), run.get("end")) if s]
        if not states:
            return None
        governors = sorted({str(s["governor"]) for s in states if s.get("governor")})
        mhz = [s["mhz"] for s in states if s.get("mhz")]
        load = [s["load"] for s in states if s.get("load") is not None]
        parts = [f"governor {', '.join(governors)}" if governors else "governor not visible",
                 f"{min(mhz):.0f}-{max(mhz):.0f} MHz" if mhz else "frequency not visible"]
        if load:
            parts.append(f"load average {min(load):.2f}-{max(load):.2f}")
        return f"machine over the {plural(len(self.machine), 'run')}: {', '.join(parts)}"

    def machine_warnings(self) -> list[str]:
        """Warnings when the runs of this group did not all run alike: under different
        CPU governors, at CPU frequencies more than 10 % apart (an unset governor once made
        one side of a PostgreSQL comparison 2x slower), or with the load average
        moving by more than the CPU count."""
        states = [s for run in self.machine if run for s in (run.get("start"), run.get("end")) if s]
        warnings = []
        governors = sorted({str(s.get("governor")) for s in states if s.get("governor")})
        if len(governors) > 1:
            warnings.append(f"warning: the runs of group {self.group} ran under different CPU "
                            f"governors ({', '.join(governors)}): compare them with care")
        mhz = [s["mhz"] for s in states if s.get("mhz")]
        if mhz and max(mhz) > 1.10 * min(mhz):
            warnings.append(f"warning: the CPU frequency moved from {min(mhz):.0f} to "
                            f"{max(mhz):.0f} MHz across the runs of group {self.group}: a "
                            "governor or thermal limit at work; ratios may mix speeds")
        load = [s["load"] for s in states if s.get("load") is not None]
        cpus = self.environment.get("nproc") or 1
        if load and max(load) - min(load) > cpus:  # more than the runs' own clients explain
            warnings.append(f"warning: the load average moved from {min(load):.2f} to "
                            f"{max(load):.2f} ({plural(cpus, 'CPU')}) across the runs of group "
                            f"{self.group}: other work shared the machine for some of them")
        return warnings

    def unstable_points(self) -> list[PointSummary]:
        """Points whose runs' standard deviation is over 10% of their trimmed mean."""
        return [p for p in self.points if p.unstable]

    def report(self, markdown: bool = False, baseline: str | None = None) -> str:
        """The throughput tables, then the ratio tables, then any unstable points."""
        render = Table.markdown if markdown else Table.text
        parts = [render(t) for t in self.throughput_tables()]
        try:
            parts += [render(t) for t in self.ratio_tables(baseline)]
        except ConfigError as error:  # the baseline was skipped, or failed
            parts.append(f"no ratio tables: {error}")
        if self.columns():
            parts += [render(t) for t in self.series_tables()]
        parts += [line for line in [self.machine_line()] if line] + self.machine_warnings()
        terms = self.terms()
        if terms:
            parts.append("measured on other terms than pmemwal:\n" + "\n".join(
                f"  {label}: {'; '.join(notes)}" for label, notes in terms.items()))
        unstable = self.unstable_points()
        if unstable:
            parts.append("unstable (stddev over {:.0%} of the mean): ".format(UNSTABLE) + "; ".join(
                f"{p.label} clients {p.clients} size {size_text(p.size)} "
                f"({p.stddev / p.records_per_s:.0%})" for p in unstable))
        return "\n\n".join(parts)
