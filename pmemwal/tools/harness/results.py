"""Reading runs back from the results database: a run group's points as trimmed means
(``summarize``), each run's per-interval progress (``interval_runs``), several groups
joined as one (``join``), and a summary's points as CSV rows (``write_csv``).

May touch: the database, read only, and the CSV file it is asked to write.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import statistics
from typing import Iterable

from pmemwal.errors import ConfigError
from pmemwal.tools.harness.config import COUNTERS
from pmemwal.tools.harness.store import _JSON_COLUMNS, _json_object, open_db
from pmemwal.tools.harness.summary import PointSummary, Summary, trimmed_mean
from pmemwal.tools.harness.text import column_title, series_label


def summarize(db: str | sqlite3.Connection, group: str | None = None) -> Summary:
    """The trimmed means of run group ``group`` (None: the latest) in the database ``db``."""
    conn = db if isinstance(db, sqlite3.Connection) else open_db(os.fspath(db))
    try:
        conn.row_factory = sqlite3.Row
        if group is None:
            row = conn.execute("SELECT run_group FROM environment "
                               "ORDER BY timestamp DESC, rowid DESC LIMIT 1").fetchone()
            if row is None:
                raise ConfigError("the results database holds no run group")
            group = row["run_group"]
        env_row = conn.execute("SELECT * FROM environment WHERE run_group = ?",
                               (group,)).fetchone()
        if env_row is None:
            raise ConfigError(f"run group {group!r}: not in the results database, which "
                              f"holds {_groups_text(conn)}")
        environment = {k: env_row[k] for k in env_row.keys()}
        for column in _JSON_COLUMNS:
            environment[column] = json.loads(environment[column]) if environment[column] else None
        runs: dict[tuple, list] = {}
        terms: dict[tuple, set] = {}
        machine = []
        for r in conn.execute("SELECT target, params, clients, size, records_per_s, mb_per_s, "
                              "elapsed, extra FROM runs WHERE run_group = ? ORDER BY id", (group,)):
            key = (r["target"], r["params"], r["clients"], r["size"])
            extra = _json_object(r["extra"])
            runs.setdefault(key, []).append((r["records_per_s"], r["mb_per_s"],
                                             _per_second(extra.get("stats"), r["elapsed"])))
            if extra.get("terms"):
                terms.setdefault(key, set()).add(str(extra["terms"]))
            machine.append(extra.get("machine"))
    finally:
        if conn is not db:
            conn.close()
    points = [_point_summary(key, values, terms.get(key, ()), group)
              for key, values in runs.items()]
    # the environment's row keeps no machine state: the first run's start stands for it
    environment["machine"] = next((m["start"] for m in machine
                                   if isinstance(m, dict) and m.get("start")), None)
    return Summary(group=group, environment=environment, points=points, machine=machine)


def _groups_text(conn: sqlite3.Connection, most: int = 10) -> str:
    """The run groups in the database, oldest first: all, or the latest ``most`` of them."""
    groups = [row[0] for row in conn.execute(
        "SELECT run_group FROM environment ORDER BY timestamp, rowid")]
    if len(groups) <= most:
        return ", ".join(groups) or "none"
    return (f"{len(groups)} run groups, the latest {most}: {', '.join(groups[-most:])} "
            "(--list shows them all)")


def _point_summary(key: tuple, values: list, terms: Iterable[str], group: str) -> PointSummary:
    """One point's runs, ``(records/s, MB/s, counters per second)`` each, as its summary."""
    target, params, clients, size = key
    rates = [v[0] for v in values]
    counters = {name: trimmed_mean(v[2][name] for v in values) for name in COUNTERS
                if all(name in v[2] for v in values)}
    return PointSummary(
        target=target, params=json.loads(params), clients=clients, size=size,
        runs=len(rates), records_per_s=trimmed_mean(rates), min=min(rates), max=max(rates),
        stddev=statistics.stdev(rates) if len(rates) > 1 else 0.0,
        mb_per_s=trimmed_mean(v[1] for v in values), counters=counters, group=group,
        terms=tuple(sorted(terms)))


def _per_second(stats: object, elapsed: float) -> dict[str, float]:
    """The COUNTERS in a run's WAL stats per second of it: ``_ns`` ones as ms/s."""
    if not isinstance(stats, dict) or not elapsed > 0:
        return {}
    return {name: stats[name] / elapsed / (1e6 if name.endswith("_ns") else 1)
            for name in COUNTERS if isinstance(stats.get(name), (int, float))}


def interval_runs(db: str, groups: list[str | None]) -> list[dict]:
    """The stored runs of ``groups`` (None: the latest) that carry per-interval progress:
    label, clients, size, run index, [(seconds, records/s)]."""
    runs = []
    for summary_group in groups:
        group = summarize(db, summary_group).group
        conn = open_db(db)
        try:
            rows = conn.execute("SELECT target, params, clients, size, run_index, extra FROM runs "
                                "WHERE run_group = ? ORDER BY id", (group,)).fetchall()
        finally:
            conn.close()
        for target, params, clients, size, run_index, extra in rows:
            intervals = _json_object(extra).get("intervals")
            if intervals:
                runs.append({"label": series_label(target, json.loads(params)),
                             "clients": clients, "size": size, "run": run_index,
                             "intervals": [tuple(i) for i in intervals]})
    return runs


def join(summaries: list[Summary]) -> Summary:
    """Several run groups as one: a series that is in more than one of them is named
    with its group (``direct@20261204T152839-8cd30b``), so that e.g. two runs made
    under different environments sit side by side; the first group's environment and
    settings lead, the columns of all are kept."""
    if len(summaries) == 1:
        return summaries[0]
    # Groups run under different flush policies: each point says its own (in its params,
    # so its label and the CSV do), and no title speaks for all from the first group's.
    flushes = {s.flush for s in summaries}
    mixed = len(flushes) > 1
    summaries = [_with_flush_param(s) for s in summaries] if mixed else summaries
    counts: dict[str, int] = {}
    for summary in summaries:
        for label in summary.series():
            counts[label] = counts.get(label, 0) + 1
    points, machine, columns = [], [], []
    for summary in summaries:
        for p in summary.points:
            points.append(dataclasses.replace(p, target=f"{p.target}@{summary.group}")
                          if counts[p.label] > 1 else p)
        machine += summary.machine
        columns += [c for c in summary.columns() if c not in columns]
    first = summaries[0].environment
    config = {**(first.get("config") or {}), "columns": columns}
    if mixed:
        config["params"] = {**(config.get("params") or {}), "flush": sorted(flushes)}
    environment = {**first, "config": config}
    return Summary(group=" + ".join(s.group for s in summaries), environment=environment,
                   points=points, machine=machine)


def _with_flush_param(summary: Summary) -> Summary:
    """``summary`` with its group's flush policy in every point's params."""
    if "flush" in (summary.config.get("params") or {}):
        return summary      # (a grid dimension there: its points carry it)
    flush = summary.flush
    return dataclasses.replace(summary, points=[
        dataclasses.replace(p, params={**p.params, "flush": flush}) for p in summary.points])


def write_csv(summary: Summary, path: str) -> str:
    """Every point of ``summary`` as a CSV row: its series and grid position, records/s
    (trimmed mean, lowest, highest, stddev), MB/s, and each counter per second."""
    import csv
    counters = [c for c in COUNTERS if any(c in p.counters for p in summary.points)]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run_group", "series", "target", "params", "flush", "clients", "size",
                      "runs", "records_per_s", "min", "max", "stddev", "mb_per_s"]
                     + [column_title(c).replace(" ", "_") for c in counters])
        for p in summary.points:
            out.writerow([p.group, p.label, p.target, json.dumps(p.params, sort_keys=True),
                          p.params.get("flush", summary.flush), p.clients, p.size, p.runs,
                          p.records_per_s, p.min, p.max, p.stddev, p.mb_per_s]
                         + [p.counters.get(c, "") for c in counters])
    return path
