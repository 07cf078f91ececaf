"""What a torture run found: each round's result, the run's totals, and their forms for a
person (``table``) and for a program (``to_dict``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pmemwal.tools.torture.crash import ChildRun
from pmemwal.tools.torture.plugin import Check
from pmemwal.tools.torture.setups import Setup


@dataclass
class RoundResult:
    """One round: its setup, the child, the check, records appended as far as seen."""

    rnd: int
    setup: Setup
    child: ChildRun
    check: Check | None   # None when the child failed before anything could be checked
    appended: int

    @property
    def ok(self) -> bool:
        return self.child.failure is None and self.check is not None and self.check.ok


def _stats(values: Sequence[float], *names: str) -> dict[str, float]:
    if not values:
        return {n: 0.0 for n in names}
    funcs: dict[str, Callable[[np.ndarray], Any]] = {
        "p50": lambda a: np.percentile(a, 50), "p99": lambda a: np.percentile(a, 99),
        "max": np.max, "min": np.min, "mean": np.mean}
    return {n: round(float(funcs[n](np.asarray(values))), 3) for n in names}


@dataclass
class TortureReport:
    """Totals of a torture run; ``ok`` when nothing was lost, garbled, misordered, resurrected
    or failed, and every recovered hard state was as acknowledged."""

    seed: int
    workload: str = "wal"
    rounds: int = 0
    appended: int = 0
    acknowledged: int = 0
    checked: int = 0              # the log workload: entries held against recoveries
    lost: int = 0
    garbage: int = 0
    order_violations: int = 0
    resurrected: int = 0
    state_errors: int = 0
    recovery_errors: int = 0
    child_failures: int = 0
    ops: dict[str, int] = field(default_factory=dict)   # announced, by kind
    silent_rounds: int = 0        # the child acknowledged nothing: a hang shows up here
    recovery_kills: int = 0       # rounds killed before the child's open returned (in its recovery)
    wal_dirs: int = 0
    elapsed_s: float = 0.0
    recovery_ms: list[float] = field(default_factory=list)
    scanned: list[int] = field(default_factory=list)
    delays_ms: list[float] = field(default_factory=list)
    per_config: dict[str, dict] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    path: str | None = None       # the base directory, when it is left behind

    MAX_PROBLEMS = 50

    @property
    def ok(self) -> bool:
        return not (self.lost or self.garbage or self.order_violations or self.resurrected
                    or self.state_errors or self.recovery_errors or self.child_failures)

    @property
    def truncations(self) -> int:
        return self.ops.get("truncations", 0)

    def add(self, result: RoundResult) -> None:
        """Count one round in."""
        child, chk = result.child, result.check
        self.rounds += 1
        self.appended += result.appended
        self.acknowledged += child.acknowledged
        for kind, n in child.ops.items():
            self.ops[kind] = self.ops.get(kind, 0) + n
        self.silent_rounds += child.acknowledged == 0 and not child.in_recovery
        self.recovery_kills += child.in_recovery and child.persist_method is None
        if not child.in_recovery:
            self.delays_ms.append(child.delay_s * 1e3)
        self.child_failures += child.failure is not None
        problems = [f"child: {child.failure}"] if child.failure else []
        cfg = self.per_config.setdefault(result.setup.key, {
            "rounds": 0, "acknowledged": 0, "lost": 0, "garbage": 0, "persist_methods": []})
        cfg["rounds"] += 1
        cfg["acknowledged"] += child.acknowledged
        if child.persist_method and child.persist_method not in cfg["persist_methods"]:
            cfg["persist_methods"].append(child.persist_method)
        if chk is not None:
            self._add_check(chk, cfg)
            problems += chk.problems
        room = self.MAX_PROBLEMS - len(self.problems)
        self.problems += [f"round {result.rnd} ({result.setup.key}): {p}" for p in problems][:room]

    def _add_check(self, chk: Check, cfg: dict) -> None:
        self.checked += chk.checked
        self.lost += chk.lost
        self.garbage += chk.garbage
        self.order_violations += chk.order
        self.resurrected += chk.resurrected
        self.state_errors += chk.state_errors
        self.recovery_errors += chk.error is not None
        cfg["lost"] += chk.lost
        cfg["garbage"] += chk.garbage
        if chk.error is None:
            self.recovery_ms.append(chk.recovery_s * 1e3)
            self.scanned.append(chk.scanned)

    def to_dict(self) -> dict:
        """Everything, JSON-ready."""
        return {
            "ok": self.ok, "seed": self.seed, "workload": self.workload, "rounds": self.rounds,
            "appended": self.appended, "acknowledged": self.acknowledged, "checked": self.checked,
            "lost": self.lost, "garbage": self.garbage,
            "order_violations": self.order_violations, "resurrected": self.resurrected,
            "state_errors": self.state_errors, "recovery_errors": self.recovery_errors,
            "child_failures": self.child_failures, **self.ops,
            "silent_rounds": self.silent_rounds, "recovery_kills": self.recovery_kills,
            "wal_dirs": self.wal_dirs, "elapsed_s": round(self.elapsed_s, 1),
            "recovery_ms": _stats(self.recovery_ms, "p50", "p99", "max"),
            "records_per_recovery": _stats(self.scanned, "p50", "mean", "max"),
            "kill_delay_ms": _stats(self.delays_ms, "min", "mean", "max"),
            "per_config": self.per_config, "kept": self.kept, "problems": self.problems,
            "path": self.path,
        }

    def table(self) -> str:
        """A human summary: totals, recovery times, then one line per configuration."""
        d = self.to_dict()
        rec, scan, delay = d["recovery_ms"], d["records_per_recovery"], d["kill_delay_ms"]
        log = self.workload == "log"
        noun = "entries" if log else "records"   # as long as each other: the columns stay
        lines = [
            f"rounds:               {self.rounds} in {self.elapsed_s:.0f} s "
            f"({self.wal_dirs} WAL directories, seed {self.seed})",
            f"{noun} appended:     {self.appended}",
            f"{noun} acknowledged: {self.acknowledged}",
            *([f"entries checked:      {self.checked} (acknowledged or recovered before: "
               "each must be back at its index)"] if log else []),
            f"{noun} lost:         {self.lost}",
            f"{noun} resurrected:  {self.resurrected}",
            f"garbage {noun}:      {self.garbage}",
            f"order violations:     {self.order_violations}",
            *([f"state errors:         {self.state_errors} (first index, hard state)"]
              if log else []),
            f"recovery errors:      {self.recovery_errors}",
            f"child failures:       {self.child_failures}",
            *(f"{kind.replace('_', ' ') + ':':<22}{n}" for kind, n in self.ops.items()),
            f"silent rounds:        {self.silent_rounds} (nothing acknowledged before the kill)",
            f"kills in recovery:    {self.recovery_kills} (before the child's open returned)",
            f"recovery time:        p50 {rec['p50']:.2f} ms, p99 {rec['p99']:.2f} ms, "
            f"max {rec['max']:.2f} ms",
            f"{noun} per recovery: p50 {scan['p50']:.0f}, mean {scan['mean']:.0f}, "
            f"max {scan['max']:.0f}",
            f"kill delay:           {delay['min']:.0f}..{delay['max']:.0f} ms, "
            f"mean {delay['mean']:.0f} ms",
            "",
            f"{'config':<18} {'rounds':>6} {'acked':>9} {'lost':>5} {'garbage':>7}  persist",
        ]
        for key, c in sorted(self.per_config.items()):
            lines.append(f"{key:<18} {c['rounds']:>6} {c['acknowledged']:>9} {c['lost']:>5} "
                         f"{c['garbage']:>7}  {','.join(c['persist_methods'])}")
        lines += [f"kept: {k}" for k in self.kept] + [f"problem: {p}" for p in self.problems]
        lines += [f"path: {self.path}"] if self.path else []
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)

