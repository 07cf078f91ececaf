"""The comparison's grid as given: the CLI's option values parsed (targets, clients,
sizes, ``--param``, flush policies, counter columns) and ``CompareConfig``, which checks
them, with the constants the other modules share (which targets take params or run
``--against``, the WAL counters, the default database).

May touch: nothing but ``pmemwal.tools.targets``, and that only through
``targets_module``, the harness's one door to the targets: the other modules call it
as ``config.targets_module()``, so that a test replacing it here reaches them all.
No runs, no database, no files.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from pmemwal.errors import ConfigError
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
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def targets_module():
    """pmemwal.tools.targets, imported on first use (it imports the peers' client libraries).

    Tests replace this function to run the harness against stand-in targets.
    """
    from pmemwal.tools import targets
    return targets


# ---- parsing (the CLI's option values) ----------------------------------------------


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


# ---- configuration ------------------------------------------------------------------


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
