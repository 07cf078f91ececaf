"""The comparison harness: run a grid of targets x params x clients x sizes, keep every run.

    from pmemwal.tools.harness import CompareConfig, run_compare, summarize, plot
    config = CompareConfig("/dev/shm/cmp", targets=["buffered", "direct"], clients=[1, 2, 4],
                           sizes=["8k", "64k"], duration=5, runs=6, db="results.db")
    result = run_compare(config, progress=lambda p: print(p["done"], "/", p["total"]))
    summary = summarize(config.db, result.group)
    for table in summary.throughput_tables() + summary.ratio_tables():
        print(table.text(), end="\n\n")
    plot(summary, "chart.png")

The grid.  Each point is a target (a WAL mode or a peer: see pmemwal.tools.targets),
a point of the params grid (the cartesian product of ``params``, e.g.
``{"insert_slots": [8, 64]}``), a client count and a record size.  The params
are pmemwal's own options, so they apply to the pmemwal targets only
(``PMEMWAL_TARGETS``), and of those to the ones they concern (``persist`` to
direct mode: buffered runs once); a peer runs once per (clients, size), with
params ``{}`` stored.  A target whose ``available()`` gives a reason is skipped, the reason
reported once.

Runs.  Every point runs ``runs`` times, and the repeats are interleaved: round
1 runs every point once, then round 2, and so on, so slow drift and noise of
a shared machine fall on all points alike rather than on whichever ran during
it.  Each run gets a fresh subdirectory of ``path``, removed after the run.

Results.  Every raw run is a row of the SQLite table ``runs``; the
``environment`` table has one row per run group (one ``run_compare``) with
the probe output, CPU, governor, kernel, versions and the PMEM_*/PMEMWAL_*
variables, and the view ``results`` joins the two.  A point's result is the
trimmed mean of its runs: with 3 or more runs the highest and the lowest are
dropped and the rest averaged (6 runs: the mean of the middle 4).

Each run also stores the machine's state at its start and end (``machine_state``:
governor, CPU frequency, load) in its ``extra``; ``Summary.machine_warnings`` says
when the runs of a group did not all run alike.

Tables.  ``throughput_tables`` has one table per series (target, with its
params): rows are client counts, columns record sizes, cells records/s.
``ratio_tables`` has the same layout with each cell divided by the baseline's
cell: compare ratios measured in one run group, not absolute numbers from
different days.  ``series_tables`` has one table per (clients, size), a row per
series, records/s and the ``columns`` counters (``COUNTERS``) per second.

The CPU frequency governor matters: with ``powersave`` (or an
energy_performance_preference other than ``performance``) contended runs can
come out 2x slower than they should; ``governor_warning`` says so.

The modules, one concern each, in the order they import one another:

- ``text``: how sizes, series labels, counter columns and tables are written;
- ``config``: the CLI's option values parsed, ``CompareConfig``, the shared constants,
  and ``targets_module``, the one door to pmemwal.tools.targets;
- ``environment``: the machine (probe, CPU, governor, build) and its warnings;
- ``store``: the SQLite database, its schema, inserts and run groups;
- ``plan``: the grid's points and the machine, before any run (``prepare``);
- ``run``: running the grid and storing each run (``run_compare``);
- ``summary``: a run group's tables and report (``Summary``, ``trimmed_mean``);
- ``results``: reading runs back (``summarize``), joining groups, CSV;
- ``charts``: the matplotlib charts (``plot``, ``plot_intervals``).

This file only gathers their names: ``from pmemwal.tools.harness import X`` works for
each name the single module ``harness.py`` had.  A test that replaces a function
replaces it in the module that calls it (``config.targets_module``,
``environment._CPU_GLOB``).
"""

from pmemwal.errors import ConfigError
from pmemwal.tools.harness.charts import plot, plot_intervals
from pmemwal.tools.harness.config import (
    AB_MODES, COUNTERS, DEFAULT_DB, PMEMWAL_TARGETS, CompareConfig, counter_name, merge_params,
    params_grid, parse_clients, parse_columns, parse_flushes, parse_list, parse_param,
    parse_param_value, parse_sizes, parse_targets, targets_module)
from pmemwal.tools.harness.environment import (
    build_info, build_text, collect_environment, cpu_governor, cpu_mhz, cpu_model,
    environment_text, governor_warning, machine_state)
from pmemwal.tools.harness.plan import Plan, Point, prepare
from pmemwal.tools.harness.results import interval_runs, join, summarize, write_csv
from pmemwal.tools.harness.run import CompareError, CompareResult, Progress, run_compare
from pmemwal.tools.harness.store import list_groups, open_db
from pmemwal.tools.harness.summary import UNSTABLE, PointSummary, Summary, trimmed_mean
from pmemwal.tools.harness.text import Table, column_title, pick_baseline, series_label, size_text

__all__ = ["ConfigError", "AB_MODES", "COUNTERS", "CompareConfig", "CompareError", "CompareResult",
           "DEFAULT_DB", "PMEMWAL_TARGETS", "Plan", "Point", "PointSummary", "Progress",
           "Summary", "Table", "UNSTABLE", "build_info", "build_text",
           "collect_environment", "column_title", "counter_name", "cpu_governor",
           "cpu_mhz", "cpu_model", "environment_text", "governor_warning",
           "interval_runs", "join", "list_groups", "machine_state", "merge_params",
           "open_db", "params_grid", "parse_clients", "parse_columns", "parse_flushes",
           "parse_list", "parse_param", "parse_param_value", "parse_sizes",
           "parse_targets", "pick_baseline", "plot", "plot_intervals", "prepare",
           "run_compare", "series_label", "size_text", "summarize", "targets_module",
           "trimmed_mean", "write_csv"]
