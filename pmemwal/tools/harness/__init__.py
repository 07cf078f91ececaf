"""The comparison harness (``pmemwal compare``), one module per concern.

This step only moves the old single module here (as ``summary.py``); the modules
split out of it follow.
"""

from pmemwal.tools.harness.summary import (  # noqa: F401  (the package's names)
    AB_MODES, COUNTERS, DEFAULT_DB, PMEMWAL_TARGETS, UNSTABLE, CompareConfig, CompareError,
    CompareResult, ConfigError, Plan, Point, PointSummary, Progress, Summary, Table,
    build_info, build_text, collect_environment, column_title, counter_name, cpu_governor,
    cpu_mhz, cpu_model, environment_text, governor_warning, interval_runs, join,
    list_groups, machine_state, merge_params, open_db, params_grid, parse_clients,
    parse_columns, parse_flushes, parse_list, parse_param, parse_param_value, parse_sizes,
    parse_targets, pick_baseline, plot, plot_intervals, prepare, run_compare, series_label,
    size_text, summarize, targets_module, trimmed_mean, write_csv)
