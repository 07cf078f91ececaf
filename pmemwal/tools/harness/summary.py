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
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import itertools
import json
import math
import os
import platform
import re
import secrets
import shutil
import socket
import sqlite3
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable

import pmemwal
from pmemwal.errors import ConfigError, WALError
from pmemwal.tools._extras import require
from pmemwal.tools.bench import parse_flush, parse_size

PMEMWAL_TARGETS = ("auto", "buffered", "direct", "direct-procs")  # the targets that take the params grid
AB_MODES = ("buffered", "direct")  # the targets --against runs at the other revision too
# The WAL's counters (pmemwal.WAL.stats), which the pmemwal targets store per run in
# extra["stats"] and ``--columns`` tables and draws per second of the run: a ``_ns``
# counter as milliseconds of it per second (summed over clients: 2 clients each waiting
# all the time is 2000 ms/s), the others as counts per second.
COUNTERS = ("slot_wait_ns", "insert_wait_ns", "background_wait_ns", "flushes", "flush_requests",
            "coalesced", "writes", "segments_created", "segments_recycled", "segments_removed",
            "segments_prefaulted", "segment_make_ns", "segment_waits")
DEFAULT_DB = "pmemwal-compare.db"
UNSTABLE = 0.10  # a point whose runs' stddev exceeds this fraction of the mean is flagged
_CPU_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/"
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Progress = Callable[[dict], None]


def targets_module():
    """pmemwal.tools.targets, imported on first use (it imports the peers' client libraries).

    Tests replace this function to run the harness against stand-in targets.
    """
    from pmemwal.tools import targets
    return targets


class CompareError(WALError):
    """A target failed during a run; the runs before it are in the database."""


# ---- parsing (the CLI's option values) ---------------------------------------------


def parse_list(text: str, item: Callable[[str], object], what: str) -> list:
    """``"1,2,4"`` -> ``[item("1"), item("2"), item("4")]``; empty items and duplicates rejected."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(parts):
        raise ValueError(f"{what} {text!r}: expected a comma-separated list, e.g. "
                         f"{'8k,64k' if what == 'sizes' else '1,2,4'}")
    values = [item(p) for p in parts]
    duplicates = sorted({p for p in parts if parts.count(p) > 1})
    if duplicates or len(set(map(repr, values))) != len(values):
        raise ValueError(f"{what} {text!r}: {', '.join(duplicates) or 'a value'} given twice")
    return values


def parse_clients(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``."""
    def one(part: str) -> int:
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"clients {part!r}: expected a whole number, 1 or more")
        return int(part)
    return parse_list(text, one, "clients")


def parse_sizes(text: str) -> list[int]:
    """``"64,8k,1m"`` -> ``[64, 8192, 1048576]`` (pmemwal.tools.bench.parse_size for each)."""
    return parse_list(text, parse_size, "sizes")


def parse_targets(text: str) -> list[str]:
    """``"buffered,direct"`` -> ``["buffered", "direct"]``, each one pmemwal.tools.targets knows."""
    module = targets_module()
    names = tuple(module.TARGET_NAMES) + tuple(getattr(module, "EXTRA_TARGETS", ()))

    def one(part: str) -> str:
        if part.lower() not in names:
            raise ValueError(f"unknown target {part!r}: valid targets are {', '.join(names)}")
        return part.lower()
    return parse_list(text, one, "targets")


def parse_flushes(text: str) -> list[str]:
    """``"each,end"`` -> ``["each", "end"]``: flush policies, each checked."""
    def one(part: str) -> str:
        parse_flush(part)
        return part.strip().lower()
    return parse_list(text, one, "flush")


def parse_columns(text: str) -> list[str]:
    """``"slot_wait,insert_wait"`` -> ``["slot_wait_ns", "insert_wait_ns"]`` (COUNTERS)."""
    return parse_list(text, counter_name, "columns")


def counter_name(name: str) -> str:
    """A counter of ``COUNTERS`` by its name, or by that name without ``_ns``."""
    name = str(name).strip().lower()
    for candidate in (name, name + "_ns"):
        if candidate in COUNTERS:
            return candidate
    raise ConfigError(f"column {name!r}: not a counter the pmemwal targets report (valid: "
                      f"{', '.join(c.removesuffix('_ns') for c in COUNTERS)})")


def parse_param_value(text: str) -> object:
    """A param value: an integer (units allowed: ``1m``), a float, true/false, else the text."""
    text = text.strip()
    try:
        return parse_size(text) if text[:1].isdigit() else int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    lowered = text.lower()
    if lowered in ("true", "yes", "on", "false", "no", "off"):
        return lowered in ("true", "yes", "on")
    return text


def parse_param(text: str) -> tuple[str, list]:
    """``"insert_slots=8,64"`` -> ``("insert_slots", [8, 64])``."""
    name, equals, values = str(text).partition("=")
    name = name.strip()
    if not equals or not _PARAM_NAME.fullmatch(name) or not values.strip():
        raise ValueError(f"param {text!r}: expected NAME=VALUE[,VALUE...], "
                         "e.g. insert_slots=8,64 or segment_size=1m,16m")
    return name, parse_list(values, parse_param_value, f"param {name}")


def merge_params(pairs: Iterable[tuple[str, list]]) -> dict[str, list]:
    """``[("a", [1]), ("b", [2, 3])]`` -> ``{"a": [1], "b": [2, 3]}``; a name twice is an error."""
    params: dict[str, list] = {}
    for name, values in pairs:
        if name in params:
            raise ValueError(f"param {name!r} given twice: list its values once, "
                             f"e.g. {name}=8,64")
        params[name] = list(values)
    return params


def params_grid(params: dict[str, list]) -> list[dict]:
    """The cartesian product of ``params``: ``{"a": [1, 2]}`` -> ``[{"a": 1}, {"a": 2}]``."""
    names = list(params)
    return [dict(zip(names, combo)) for combo in itertools.product(*(params[n] for n in names))]


# ---- configuration and plan ---------------------------------------------------------


@dataclass
class CompareConfig:
    """A comparison's grid and where its results go; sizes may be given as text (``"8k"``)."""

    path: str  # base directory; each run uses a fresh subdirectory of it
    targets: list[str]
    clients: list[int] = field(default_factory=lambda: [1])
    sizes: list[int] = field(default_factory=lambda: [8192])
    duration: float = 5.0  # seconds per run
    runs: int = 6  # per point; with 3 or more, the highest and lowest are dropped
    flush: str = "each"  # "each", "end" or "group:K"
    params: dict[str, list] = field(default_factory=dict)  # pmemwal targets only
    baseline: str | None = None  # target (or series label) of the ratio tables; None: the first
    db: str = DEFAULT_DB  # SQLite file the runs are appended to
    plot: str | None = None  # PNG path, or None
    columns: list[str] = field(default_factory=list)  # counters tabled and drawn (COUNTERS)
    against: str | None = None  # a git revision: its build runs beside this one (MODE@REV)
    preset: str | None = None  # the preset this grid came from (pmemwal.tools.presets), if any

    def __post_init__(self) -> None:
        self.path = os.fspath(self.path)
        self.db = os.fspath(self.db)
        self.plot = None if self.plot is None else os.fspath(self.plot)
        self.targets = [str(t).lower() for t in self.targets]
        self.sizes = [parse_size(s) for s in self.sizes]
        self.clients = list(self.clients)
        self.params = {str(k): list(v) for k, v in self.params.items()}
        self.flush = str(self.flush).strip().lower()
        parse_flush(self.flush)
        if "flush" in self.params:  # a grid dimension of every target, peers included
            self.params["flush"] = [parse_flushes(str(f))[0] for f in self.params["flush"]]
        for what, values in (("targets", self.targets), ("clients", self.clients),
                             ("sizes", self.sizes)):
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{what}={values!r}: one or more, each once")
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in self.clients):
            raise ConfigError(f"clients={self.clients!r}: whole numbers, 1 or more")
        if not all(s >= 1 for s in self.sizes):
            raise ConfigError(f"sizes={self.sizes!r}: 1 byte or more")
        for name, values in self.params.items():
            if not _PARAM_NAME.fullmatch(name) or not values:
                raise ConfigError(f"params[{name!r}]={values!r}: a name and one or more values")
        if not (isinstance(self.runs, int) and self.runs >= 1):
            raise ConfigError(f"runs={self.runs!r}: 1 or more")
        if not self.duration > 0:
            raise ConfigError(f"duration={self.duration!r}: more than 0 seconds")
        if self.baseline is None:  # A/B: the other build is the baseline ("master")
            first = self.targets[0]
            self.baseline = f"{first}@{self.against}" if self.against and first in AB_MODES \
                else first
        elif not self.baseline.split() or \
                self.baseline.split()[0].split("@")[0].lower() not in self.targets:
            raise ConfigError(f"baseline={self.baseline!r}: not among the targets "
                              f"({', '.join(self.targets)})")
        if self.plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(self.plot))):
            raise ConfigError(f"plot={self.plot!r}: its directory does not exist")
        self.columns = [counter_name(c) for c in self.columns]


@dataclass(frozen=True)
class Point:
    """One point of the grid."""

    target: str
    params: tuple[tuple[str, object], ...]  # sorted (name, value) pairs; () for peers
    clients: int
    size: int

    @property
    def label(self) -> str:
        """The series name: the target, then its params (``direct insert_slots=64``)."""
        return series_label(self.target, dict(self.params))


def series_label(target: str, params: dict) -> str:
    """``direct insert_slots=64 segment_size=64m``: sizes as they are written."""
    return " ".join([target] + [f"{k}={_param_text(k, v)}" for k, v in sorted(params.items())])


# params that are sizes in bytes: labels print them as the CLI takes them (64m)
_SIZE_PARAMS = ("segment_size", "keep_bytes", "buffer_size", "max_wal_size", "preallocate",
                "max_record_size", "gil_release_size")


def _param_text(name: str, value: object) -> str:
    if name in _SIZE_PARAMS and isinstance(value, int) and not isinstance(value, bool) and value:
        return size_text(value)
    return _value_text(value)


@dataclass
class Plan:
    """What ``run_compare`` will do: the points to run, the targets skipped, the machine."""

    group: str  # the run group's id
    points: list[Point]  # in grid order
    skipped: dict[str, str]  # target -> why it is not available
    versions: dict[str, str]  # target -> its version
    environment: dict
    runs: int
    builds: dict = field(default_factory=dict)  # MODE@REV -> its target (other_build)

    @property
    def total_runs(self) -> int:
        return len(self.points) * self.runs

    def order(self) -> list[tuple[int, Point]]:
        """(run index, point) in run order: rounds outermost, each round the whole grid."""
        return [(r, p) for r in range(self.runs) for p in self.points]


def prepare(config: CompareConfig) -> Plan:
    """Resolve the targets, ask each whether it is available, and describe the machine.

    Also opens the database once, so that an unusable one fails before any run.
    """
    open_db(config.db).close()
    targets = targets_module()
    points, skipped, versions = [], {}, {}
    builds = _other_builds(config)
    for name in config.targets:
        if f"{name}@{config.against}" in builds:  # A/B: the other build's points first
            other = builds[f"{name}@{config.against}"]
            versions[other.name] = other.version()
            points += _points(other, config)
        target = targets.get_target(name)
        reason = target.available()
        if reason:
            skipped[name] = str(reason)
            continue
        versions[name] = str(target.version())
        if name in PMEMWAL_TARGETS:
            known = getattr(target, "params", None)  # its knobs and their defaults
            unknown = sorted(set(config.params) - set(known) - {"flush"}) if known is not None \
                else []
            if unknown:
                raise ConfigError(f"param {unknown[0]!r}: {name} has no such option "
                                  f"(valid: {', '.join(sorted(known)) or 'none'})")
        points += _points(target, config, name in PMEMWAL_TARGETS)
    labels = list(dict.fromkeys(p.label for p in points))
    if config.baseline and config.baseline.split()[0].lower() not in skipped:
        pick_baseline(config.baseline, labels, "this comparison")  # before any run
    os.makedirs(config.path, exist_ok=True)
    group = (datetime.datetime.now().strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3))
    environment = collect_environment(config.path)
    environment["config"] = dataclasses.asdict(config)
    if builds:
        commit = next(iter(builds.values())).commit
        environment["against"] = {"rev": config.against, "commit": commit}
    return Plan(group=group, points=points, skipped=skipped, versions=versions,
                environment=environment, runs=config.runs, builds=builds)


def _points(target, config: CompareConfig, takes_params: bool = True) -> list[Point]:
    """``target``'s points: its params grid (peers: the flush policies alone) x clients x
    sizes."""
    flushes = {"flush": config.params["flush"]} if "flush" in config.params else {}
    grid = _grid_for(target, config.params) if takes_params else params_grid(flushes)
    points = []
    for params in grid:
        if hasattr(target, "check"):  # a bad value fails here, not after the runs before it
            target.check({k: v for k, v in params.items() if k != "flush"})
        key = tuple(sorted(params.items()))
        points += [Point(target.name, key, c, s) for c in config.clients for s in config.sizes]
    return points


def _other_builds(config: CompareConfig) -> dict:
    """For ``against``: MODE@REV targets of the buffered/direct targets, REV built (cached)."""
    if not config.against:
        return {}
    from pmemwal.tools.targets import other_build
    commit = other_build.resolve(config.against)
    tree = other_build.build(commit)
    return {f"{m}@{config.against}": other_build.OtherBuildTarget(m, config.against, commit, tree)
            for m in config.targets if m in AB_MODES}


def pick_baseline(baseline: str, series: list[str], where: str) -> str:
    """The series ``baseline`` names: a whole label (``direct insert_slots=8``), or a
    target alone for its first series; a label that matches none is an error naming the
    valid ones, never a quiet fall-back to another series."""
    wanted = " ".join(baseline.split())
    if wanted in series:
        return wanted
    if len(wanted.split()) == 1:  # a target alone: its first series (of the first group joined)
        for name in (lambda label: label.split()[0], lambda label: label.split()[0].lower()):
            for label in series:     # (never another build's or group's: "direct@..." differs)
                if name(label) in (wanted, wanted.lower()):
                    return label
    raise ConfigError(f"baseline {baseline!r}: no such series in {where} (valid: "
                      f"{', '.join(series)})")


def _grid_for(target, params: dict[str, list]) -> list[dict]:
    """The params grid ``target`` runs: over the params that apply to it (a target
    without ``applies`` takes them all), so that ``persist=pmem,msync`` beside buffered
    mode runs buffered once."""
    applies = getattr(target, "applies", lambda name: True)
    return params_grid({k: v for k, v in params.items() if k == "flush" or applies(k)})


# ---- the environment ----------------------------------------------------------------


def collect_environment(path: str) -> dict:
    """What every result row carries: probe, CPU, governor, kernel, versions, env vars."""
    import numpy
    uname = platform.uname()
    probe = pmemwal.probe(path).as_dict()
    return {
        "timestamp": _now(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "nproc": os.cpu_count(),
        "governor": cpu_governor(),
        "energy_perf": _cpu_setting("energy_performance_preference"),
        "kernel": f"{uname.system} {uname.release} {uname.version} {uname.machine}",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pmemwal": pmemwal.__version__,
        "probe": {k: list(v) if isinstance(v, tuple) else v for k, v in probe.items()},
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("PMEM_", "PMEMWAL_"))},
        "machine": machine_state(),  # shown before the runs; each run stores its own
        "build": build_info(),
    }


def build_info() -> dict:
    """Which pmemwal ran: its version, the git commit of its source tree and whether that
    had uncommitted changes (None outside a git checkout), the C core's compiler flags and
    its CRC32C + copy path; so that two builds compared (A/B) say what each side was."""
    from pmemwal import _core
    from pmemwal.tools.targets.other_build import git, package_root

    root = package_root()
    commit = git(root, "rev-parse", "HEAD")
    status = git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {"pmemwal": pmemwal.__version__, "commit": commit,
            "dirty": None if status is None else bool(status), "source": root,
            "cflags": getattr(_core, "BUILD_FLAGS", None), "crc32c_path": _core.CRC32C_IMPL}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model"):
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _cpu_setting(name: str) -> str | None:
    """A cpufreq setting of all CPUs: ``performance``, ``performance x2, powersave x4``, or None."""
    values = []
    for directory in glob.glob(_CPU_GLOB):
        try:
            with open(os.path.join(directory, name)) as f:
                values.append(f.read().strip())
        except OSError:
            continue
    if not values:
        return None
    counts = {v: values.count(v) for v in sorted(set(values))}
    if len(counts) == 1:
        return values[0]
    return ", ".join(f"{v} x{n}" for v, n in counts.items())


def cpu_governor() -> str | None:
    """The CPU frequency governor (all CPUs), or None where /sys does not show it."""
    return _cpu_setting("scaling_governor")


def cpu_mhz() -> float | None:
    """The CPUs' mean current frequency (MHz): cpufreq's scaling_cur_freq, else
    /proc/cpuinfo's "cpu MHz" (which a VM may report as a constant), else None."""
    values = []
    for directory in glob.glob(_CPU_GLOB):
        try:
            with open(os.path.join(directory, "scaling_cur_freq")) as f:
                values.append(int(f.read()) / 1000)
        except (OSError, ValueError):
            continue
    if not values:
        try:
            with open("/proc/cpuinfo") as f:
                values = [float(line.partition(":")[2]) for line in f
                          if line.partition(":")[0].strip() == "cpu MHz"]
        except (OSError, ValueError):
            values = []
    return round(statistics.fmean(values), 1) if values else None


def machine_state() -> dict:
    """What may change between two runs and change their results: the governor, the CPU
    frequency, the load average (1 min).  Recorded at the start and end of each run."""
    return {"governor": cpu_governor(), "mhz": cpu_mhz(), "load": round(os.getloadavg()[0], 2)}


def governor_warning(environment: dict | None = None) -> str | None:
    """A warning unless every CPU runs the ``performance`` governor (and EPP, where shown)."""
    env = environment if environment is not None else {
        "governor": cpu_governor(), "energy_perf": _cpu_setting("energy_performance_preference")}
    governor, epp = env.get("governor"), env.get("energy_perf")
    if governor is None:
        return ("warning: CPU frequency governor not visible (no "
                "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor); results may vary "
                "with CPU frequency scaling")
    if governor != "performance":
        return (f"warning: CPU frequency governor is {governor}, not performance: contended "
                "runs can come out much slower than they should (cpupower frequency-set "
                "-g performance)")
    if epp is not None and epp != "performance":
        return (f"warning: energy_performance_preference is {epp}, not performance: "
                "results may vary with CPU frequency scaling")
    return None


def environment_text(environment: dict, group: str | None = None) -> str:
    """The environment as "key: value" lines, for the terminal."""
    env = environment
    probe = env.get("probe") or {}
    where = env.get("config", {}).get("path") or probe.get("path") or "?"
    fs = f" ({probe['fs_type']})" if probe.get("fs_type") else ""
    verdict = (f"{probe.get('recommended_mode')}/{probe.get('persist_method')}: "
               f"{probe.get('reason')}" if probe else "-")
    governor = env.get("governor") or "not visible"
    if env.get("energy_perf"):
        governor += f" (energy_performance_preference {env['energy_perf']})"
    machine = env.get("machine") or {}
    mhz = f"{machine['mhz']:.0f} MHz" if machine.get("mhz") else "frequency not visible"
    lines = [
        ("run group", group or env.get("run_group") or "-"),
        ("host", f"{env.get('hostname')}, {env.get('nproc')} CPUs"),
        ("cpu", env.get("cpu_model")),
        ("governor", governor),
        ("cpu now", f"{mhz}, load average {machine.get('load', '?')} (1 min)"),
        ("kernel", env.get("kernel")),
        ("versions", f"python {env.get('python')}, numpy {env.get('numpy')}, "
                     f"pmemwal {env.get('pmemwal')}"),
        ("build", build_text(env.get("build"))),
        ("against", (f"{env['against']['rev']} = {env['against']['commit'][:7]} (the @ series)"
                     if env.get("against") else "-")),
        ("path", where + fs),
        ("probe verdict", verdict),
        ("environment", " ".join(f"{k}={v}" for k, v in (env.get("env") or {}).items()) or "-"),
    ]
    width = max(len(k) for k, _ in lines) + 1
    return "\n".join(f"{k + ':':<{width}} {v}" for k, v in lines)


def build_text(build: dict | None) -> str:
    """``9a540f9 (uncommitted changes), -O2 ..., CRC32C avx512-vpclmulqdq``."""
    if not build:
        return "not recorded"
    commit = (build["commit"][:7] + (" (uncommitted changes)" if build.get("dirty") else "")
              if build.get("commit") else "not a git checkout")
    return f"{commit}, cflags {build.get('cflags')}, CRC32C {build.get('crc32c_path')}"


# ---- the database -------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS environment (
    run_group TEXT PRIMARY KEY,
    timestamp TEXT NOT NULL,            -- UTC, ISO 8601
    hostname TEXT, cpu_model TEXT, nproc INTEGER,
    governor TEXT,                      -- NULL: not visible
    energy_perf TEXT,
    kernel TEXT, python TEXT, numpy TEXT, pmemwal TEXT,
    probe TEXT,                         -- JSON: pmemwal.probe(path).as_dict()
    env TEXT,                           -- JSON: PMEM_* and PMEMWAL_* variables
    config TEXT,                        -- JSON: the CompareConfig
    build TEXT                          -- JSON: build_info() (commit, dirty, cflags, CRC path)
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    run_group TEXT NOT NULL REFERENCES environment (run_group),
    timestamp TEXT NOT NULL,            -- UTC, ISO 8601, when the run ended
    run_index INTEGER NOT NULL,         -- 0 .. runs-1
    target TEXT NOT NULL, target_version TEXT,
    params TEXT NOT NULL,               -- JSON object, sorted keys; {} for peers
    clients INTEGER NOT NULL, size INTEGER NOT NULL, flush TEXT NOT NULL,
    duration REAL NOT NULL,
    records INTEGER NOT NULL, bytes INTEGER NOT NULL, elapsed REAL NOT NULL,
    records_per_s REAL NOT NULL, mb_per_s REAL NOT NULL,
    latency TEXT,                       -- JSON: microseconds
    extra TEXT                          -- JSON: what the target adds
);
CREATE INDEX IF NOT EXISTS runs_group ON runs (run_group);
CREATE VIEW IF NOT EXISTS results AS
    SELECT runs.*, environment.hostname, environment.cpu_model, environment.governor,
           environment.kernel, environment.pmemwal AS pmemwal_version
    FROM runs JOIN environment USING (run_group);
"""
_RUN_COLUMNS = ("run_group", "timestamp", "run_index", "target", "target_version", "params",
                "clients", "size", "flush", "duration", "records", "bytes", "elapsed",
                "records_per_s", "mb_per_s", "latency", "extra")
_ENV_COLUMNS = ("run_group", "timestamp", "hostname", "cpu_model", "nproc", "governor",
                "energy_perf", "kernel", "python", "numpy", "pmemwal", "probe", "env", "config",
                "build")
_JSON_COLUMNS = ("probe", "env", "config", "build")


def open_db(path: str) -> sqlite3.Connection:
    """Open (creating) the results database; ConfigError where it cannot be used."""
    db = None
    try:
        db = sqlite3.connect(path)
        have = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
        missing = set(_RUN_COLUMNS) - have if have else set()
        if not missing:
            db.executescript(_SCHEMA)
            env_have = {row[1] for row in db.execute("PRAGMA table_info(environment)")}
            if "build" not in env_have:  # a database from before builds were recorded
                db.execute("ALTER TABLE environment ADD COLUMN build TEXT")
                db.commit()
    except sqlite3.Error as error:
        if db is not None:
            db.close()
        raise ConfigError(f"db={path!r}: cannot use it as the results database: {error}") from None
    if missing:
        db.close()
        raise ConfigError(f"db={path!r}: its runs table lacks {', '.join(sorted(missing))}: "
                          "not a pmemwal compare database (choose another file)")
    return db


def _insert(db: sqlite3.Connection, table: str, row: dict, columns: tuple[str, ...]) -> None:
    db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
               f"({', '.join('?' * len(columns))})", [row[c] for c in columns])


# ---- running ------------------------------------------------------------------------


@dataclass
class CompareResult:
    """What ``run_compare`` did: its run group in ``db``, and the plan it followed."""

    group: str
    db: str
    plan: Plan

    @property
    def skipped(self) -> dict[str, str]:
        return self.plan.skipped


def run_compare(config: CompareConfig, progress: Progress | None = None,
                plan: Plan | None = None) -> CompareResult:
    """Run every point of the grid ``config.runs`` times, each raw run stored in ``config.db``.

    ``progress(dict)`` is called after each run with ``done``, ``total``,
    ``run`` (its index), ``target``, ``params``, ``label``, ``clients``,
    ``size``, ``records_per_s``, ``mb_per_s`` and ``result`` (the RunResult).
    ``plan`` is ``prepare(config)``, when the caller already has it.
    A failing run raises CompareError; the runs before it stay in the database.
    """
    plan = plan or prepare(config)
    if not plan.points:
        raise ConfigError("none of the targets is available: " + "; ".join(
            f"{name}: {reason}" for name, reason in plan.skipped.items()))
    targets = targets_module()
    db = open_db(config.db)
    try:
        env = dict(plan.environment, run_group=plan.group)
        for key in _JSON_COLUMNS:
            env[key] = json.dumps(env.get(key), sort_keys=True, default=str)
        try:
            with db:
                _insert(db, "environment", env, _ENV_COLUMNS)
        except sqlite3.Error as error:  # read-only, full: find out before the first run
            raise ConfigError(f"db={config.db!r}: cannot write to it: {error}") from None
        base = os.path.join(config.path, plan.group)
        order = plan.order()
        for done, (run_index, point) in enumerate(order, 1):
            start = machine_state()
            result = _run_one(plan.builds.get(point.target) or targets.get_target(point.target),
                              targets, config, base, done, run_index, point)
            result.extra = {**result.extra, "machine": {"start": start, "end": machine_state()}}
            params = dict(point.params)
            row = {
                "run_group": plan.group, "timestamp": _now(), "run_index": run_index,
                "target": point.target, "target_version": plan.versions.get(point.target),
                "params": json.dumps(params, sort_keys=True), "clients": point.clients,
                "size": point.size, "flush": params.get("flush", config.flush),
                "duration": config.duration,
                "records": int(result.records), "bytes": int(result.bytes),
                "elapsed": float(result.elapsed), "records_per_s": float(result.records_per_s),
                "mb_per_s": float(result.mb_per_s),
                "latency": json.dumps(result.latency_us, sort_keys=True, default=str),
                "extra": json.dumps(result.extra, sort_keys=True, default=str),
            }
            with db:  # one transaction per run: an interrupted comparison keeps what it ran
                _insert(db, "runs", row, _RUN_COLUMNS)
            if progress:
                progress({"done": done, "total": len(order), "run": run_index,
                          "target": point.target, "params": params, "label": point.label,
                          "clients": point.clients, "size": point.size,
                          "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"],
                          "result": result})
        _remove_if_empty(base)
    finally:
        db.close()
    return CompareResult(group=plan.group, db=config.db, plan=plan)


def _run_one(target, targets, config: CompareConfig, base: str, seq: int, run_index: int,
             point: Point):
    """One run of ``target`` at one point in a fresh directory, removed afterwards."""
    where = os.path.join(base, f"{seq:05d}-{point.target.replace(os.sep, '_')}")
    os.makedirs(where)
    params = dict(point.params)
    workload = targets.Workload(path=where, clients=point.clients, size=point.size,
                                duration=config.duration, flush=params.pop("flush", config.flush),
                                params=params)
    try:
        return target.run(workload)
    except Exception as error:
        raise CompareError(f"{point.label}, clients {point.clients}, size {point.size}, "
                           f"run {run_index + 1}: {type(error).__name__}: {error}") from error
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


# ---- summaries ----------------------------------------------------------------------


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
class Table:
    """A grid of numbers: rows (client counts) by columns (record sizes)."""

    title: str
    row_name: str
    columns: list[str]
    rows: list[tuple[object, list[float | None]]]
    number_format: Callable[[float], str]

    def cells(self) -> list[list[str]]:
        header = [self.row_name] + self.columns
        body = [[str(key)] + ["-" if v is None else self.number_format(v) for v in values]
                for key, values in self.rows]
        return [header] + body

    def text(self) -> str:
        """Plain text, right-aligned columns, the title above."""
        cells = self.cells()
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        lines = [self.title]
        for n, row in enumerate(cells):
            lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def markdown(self) -> str:
        """A GitHub-flavoured markdown table, the title in bold above."""
        cells = self.cells()
        lines = [f"**{self.title}**", "", "| " + " | ".join(cells[0]) + " |",
                 "|" + "|".join("---:" for _ in cells[0]) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines)


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
        counts = sorted({p.runs for p in self.points})
        n = counts[-1] if counts else 0
        how = "trimmed mean of" if n >= 3 else "mean of"
        note = f"{how} {'/'.join(map(str, counts))} runs"
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
                    f"{p.clients} clients, {size_text(p.size)} B")
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
        (per second of the run), as seed 001 tabled insertion slots against their waits."""
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
                    tables.append(Table(f"{c} clients, {size_text(size)} records "
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
        return f"machine over the {len(self.machine)} runs: {', '.join(parts)}"

    def machine_warnings(self) -> list[str]:
        """Warnings when the runs of this group did not all run alike: under different
        CPU governors, at CPU frequencies more than 10 % apart (seed 002: an unset
        governor made one side of a comparison 2x slower), or with the load average
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
                            f"{max(load):.2f} ({cpus} CPUs) across the runs of group "
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
            raise ConfigError(f"run group {group!r}: not in the results database")
        environment = {k: env_row[k] for k in env_row.keys()}
        for key in _JSON_COLUMNS:
            environment[key] = json.loads(environment[key]) if environment[key] else None
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
    points = []
    for (target, params, clients, size), values in runs.items():
        rates = [v[0] for v in values]
        counters = {name: trimmed_mean(v[2][name] for v in values) for name in COUNTERS
                    if all(name in v[2] for v in values)}
        points.append(PointSummary(
            target=target, params=json.loads(params), clients=clients, size=size,
            runs=len(rates), records_per_s=trimmed_mean(rates), min=min(rates), max=max(rates),
            stddev=statistics.stdev(rates) if len(rates) > 1 else 0.0,
            mb_per_s=trimmed_mean(v[1] for v in values), counters=counters, group=group,
            terms=tuple(sorted(terms.get((target, params, clients, size), ())))))
    return Summary(group=group, environment=environment, points=points, machine=machine)


def list_groups(db: str) -> list[dict]:
    """The run groups in ``db``, oldest first: group, timestamp, preset, targets, runs."""
    conn = open_db(db)
    try:
        rows = conn.execute(
            "SELECT e.run_group, e.timestamp, e.config, count(r.id), "
            "group_concat(DISTINCT r.target) FROM environment e LEFT JOIN runs r "
            "USING (run_group) GROUP BY e.run_group ORDER BY e.timestamp, e.rowid").fetchall()
    finally:
        conn.close()
    return [{"group": group, "timestamp": timestamp, "runs": runs,
             "preset": _json_object(config).get("preset"), "targets": targets or ""}
            for group, timestamp, config, runs, targets in rows]


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


def _json_object(text: str | None) -> dict:
    """A stored JSON object, or {} for anything else (a peer's extra may be anything)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _per_second(stats: object, elapsed: float) -> dict[str, float]:
    """The COUNTERS in a run's WAL stats per second of it: ``_ns`` ones as ms/s."""
    if not isinstance(stats, dict) or not elapsed > 0:
        return {}
    return {name: stats[name] / elapsed / (1e6 if name.endswith("_ns") else 1)
            for name in COUNTERS if isinstance(stats.get(name), (int, float))}


def column_title(name: str) -> str:
    """``slot_wait_ns`` -> ``slot_wait ms/s``, ``flushes`` -> ``flushes /s``."""
    return f"{name.removesuffix('_ns')} ms/s" if name.endswith("_ns") else f"{name} /s"


# ---- the chart ----------------------------------------------------------------------


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
    client count and record size, a line per run, coloured by series.  Seed 000's diagnosis
    (a run halving for seconds, then recovering) came from such lines, which averages hide."""
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
        ax.set_title(f"{clients} clients, {size_text(size)} records")
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


# ---- helpers ------------------------------------------------------------------------


def size_text(n: int) -> str:
    """``8192`` -> ``8k``, ``1048576`` -> ``1m``, ``100`` -> ``100`` (as the CLI takes them)."""
    for unit, scale in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _rate_text(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _value_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
