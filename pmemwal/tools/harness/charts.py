"""The charts (matplotlib's Agg canvas, no pyplot, no global backend change):
``plot`` draws a summary's records/s, and each counter it tables, against clients;
``plot_intervals`` draws every stored run's records/s per interval.

May touch: the PNG file it is asked to write, and the database read only (through
``results.interval_runs``).  matplotlib is imported on first use (pmemwal[bench]).
"""

from __future__ import annotations

import math

from pmemwal.errors import ConfigError
from pmemwal.tools._extras import require
from pmemwal.tools.harness.results import interval_runs
from pmemwal.tools.harness.summary import Summary
from pmemwal.tools.harness.text import column_title, size_text
from pmemwal.tools.progress import plural


def plot(summary: Summary, png: str) -> str:
    """Draw records/s against clients, one panel per record size, one line per series,
    and below it a row of the same panels for each counter the comparison tabled
    (``--columns``).

    Each records/s point is the trimmed mean, its error bar the lowest and highest run.
    The y axis is logarithmic where a panel's values span more than 10x.
    Uses the Agg canvas directly: no pyplot, no global backend change.
    """
    require("matplotlib", "bench", "pmemwal compare --plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sizes = summary.sizes()
    if not sizes:
        raise ConfigError("no results to plot")
    metrics = [None] + summary.columns()  # None: records/s
    columns = min(len(sizes), 3)
    rows_per_metric = math.ceil(len(sizes) / columns)
    rows = rows_per_metric * len(metrics)
    fig = Figure(figsize=(4.8 * columns, 3.8 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False)
    for m, metric in enumerate(metrics):
        panels = axes[m * rows_per_metric:(m + 1) * rows_per_metric].ravel()
        for ax, size in zip(panels, sizes):
            _draw_panel(ax, summary, size, metric)
        for ax in panels[len(sizes):]:
            ax.set_visible(False)
    axes[0][0].legend(fontsize="small")
    cpu = summary.environment.get("cpu_model") or "unknown CPU"
    preset = summary.config.get("preset")
    fig.suptitle(f"pmemwal compare{f' --preset {preset}' if preset else ''}: flush "
                 f"{summary.flush}, {cpu}\n"
                 f"{summary._runs_note(flush=False)} (bars: lowest to highest run), "
                 f"run group {summary.group}", fontsize="medium")
    fig.savefig(png, format="png")
    return png


def _draw_panel(ax, summary: Summary, size: int, metric: str | None) -> None:
    """One panel: ``metric`` (a counter, per second; None: records/s with the runs'
    spread) against clients for each series, at record size ``size``."""
    from matplotlib.ticker import FixedLocator, NullLocator

    clients = summary.clients()
    values, zeros = [], False
    for label in summary.series():
        pts = [p for p in (summary.point(label, c, size) for c in clients)
               if p and (metric is None or metric in p.counters)]
        if not pts:
            continue
        xs = [p.clients for p in pts]
        if metric is None:
            ys = [p.records_per_s for p in pts]
            err = [[y - p.min for y, p in zip(ys, pts)], [p.max - y for y, p in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", markersize=4, capsize=3, label=label)
            values += [p.min for p in pts if p.min > 0] + [p.max for p in pts if p.max > 0]
            zeros = zeros or any(p.min <= 0 for p in pts)
        else:
            ys = [p.counters[metric] for p in pts]
            ax.plot(xs, ys, marker="o", markersize=4, label=label)
            values += [y for y in ys if y > 0]
            zeros = zeros or any(y <= 0 for y in ys)
    if values and max(values) / min(values) > 10:
        # a wide range: logarithmic, but linear below the smallest value when some are 0
        # (a series of no waits stays drawn, along the bottom, not dropped by a log axis)
        if zeros:
            ax.set_yscale("symlog", linthresh=min(values))
        else:
            ax.set_yscale("log")
    if len(clients) > 1 and clients[-1] / clients[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(clients))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(c) for c in clients])
    ax.set_title(f"record size {size_text(size)}")
    ax.set_xlabel("clients")
    ax.set_ylabel("records/s" if metric is None else column_title(metric))
    ax.grid(True, which="both", alpha=0.3)


def plot_intervals(db: str, groups: list[str | None], png: str) -> str:
    """Draw each stored run's records/s per interval (pgbench's progress lines): a panel per
    client count and record size, a line per run, coloured by series.  PostgreSQL's
    buffer-mapping diagnosis (a run halving for seconds, then recovering) came from such
    lines, which averages hide."""
    require("matplotlib", "bench", "pmemwal report --intervals")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = interval_runs(db, groups)
    if not runs:
        raise ConfigError("no stored run has per-interval progress (runs of pmemwal's targets "
                          "record it)")
    panels = sorted({(r["clients"], r["size"]) for r in runs})
    series = list(dict.fromkeys(r["label"] for r in runs))
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(4.8 * columns, 3.4 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    colours = {label: f"C{i % 10}" for i, label in enumerate(series)}
    for ax, (clients, size) in zip(axes, panels):
        shown = set()
        for r in (r for r in runs if (r["clients"], r["size"]) == (clients, size)):
            xs, ys = zip(*r["intervals"])
            ax.plot(xs, ys, color=colours[r["label"]], alpha=0.7, linewidth=1,
                    label=None if r["label"] in shown else r["label"])
            shown.add(r["label"])
        ax.set_title(f"{plural(clients, 'client')}, {size_text(size)} records")
        ax.set_xlabel("seconds into the run")
        ax.set_ylabel("records/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    names = ", ".join(g or "the latest group" for g in groups)
    fig.suptitle(f"records/s per interval, a line per run: {names}", fontsize="medium")
    fig.savefig(png, format="png")
    return png
