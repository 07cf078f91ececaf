"""What a comparison will run, decided before any run: the grid's points (targets x
params x clients x sizes; for ``--against``, the buffered/direct targets as built at
the other revision too), the targets skipped as unavailable and why, their versions,
and the machine's description (``Plan``, ``prepare``).

May touch: the results database (opened once, so that an unusable one fails first),
the base directory (created), the targets (asked whether available, their version,
and to check the params), and, for ``--against``, git and a build of the other
revision (``pmemwal.tools.targets.other_build``).  Runs nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import secrets
from dataclasses import dataclass, field

from pmemwal.errors import ConfigError
from pmemwal.tools.harness import config as _config
from pmemwal.tools.harness.config import AB_MODES, PMEMWAL_TARGETS, CompareConfig, params_grid
from pmemwal.tools.harness.environment import collect_environment
from pmemwal.tools.harness.store import open_db
from pmemwal.tools.harness.text import pick_baseline, series_label


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
    targets = _config.targets_module()
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
            unknown = sorted(set(config.params) - set(known or ()) - {"flush"})
            if known is not None and unknown:
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


def _grid_for(target, params: dict[str, list]) -> list[dict]:
    """The params grid ``target`` runs: over the params that apply to it (a target
    without ``applies`` takes them all), so that ``persist=pmem,msync`` beside buffered
    mode runs buffered once."""
    applies = getattr(target, "applies", lambda name: True)
    return params_grid({k: v for k, v in params.items() if k == "flush" or applies(k)})
