"""Running the grid: every point ``runs`` times, the repeats interleaved (round 1 runs
every point once, then round 2...), each run in a fresh subdirectory removed after
it, each raw run stored as it ends, with the machine's state at its start and end
(``run_compare``, ``CompareResult``).

May touch: the base directory, the results database (inserting its run group and its
runs, one transaction per run), and the targets, which run the workload.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass
from typing import Callable

from pmemwal.errors import ConfigError, WALError
from pmemwal.tools.harness import config as _config
from pmemwal.tools.harness.config import CompareConfig
from pmemwal.tools.harness.environment import _now, machine_state
from pmemwal.tools.harness.plan import Plan, Point, prepare
from pmemwal.tools.harness.store import (_ENV_COLUMNS, _JSON_COLUMNS, _RUN_COLUMNS, _insert,
                                         open_db)


Progress = Callable[[dict], None]


class CompareError(WALError):
    """A target failed during a run; the runs before it are in the database."""


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
    targets = _config.targets_module()
    db = open_db(config.db)
    try:
        _store_environment(db, config, plan)
        base = os.path.join(config.path, plan.group)
        order = plan.order()
        for done, (run_index, point) in enumerate(order, 1):
            start = machine_state()
            result = _run_one(plan.builds.get(point.target) or targets.get_target(point.target),
                              targets, config, base, done, run_index, point)
            result.extra = {**result.extra, "machine": {"start": start, "end": machine_state()}}
            params = dict(point.params)
            row = _run_row(plan, config, point, run_index, result)
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


def _store_environment(db: sqlite3.Connection, config: CompareConfig, plan: Plan) -> None:
    """The run group's row of ``environment``, before the first run."""
    env = dict(plan.environment, run_group=plan.group)
    for key in _JSON_COLUMNS:
        env[key] = json.dumps(env.get(key), sort_keys=True, default=str)
    try:
        with db:
            _insert(db, "environment", env, _ENV_COLUMNS)
    except sqlite3.Error as error:  # read-only, full: find out before the first run
        raise ConfigError(f"db={config.db!r}: cannot write to it: {error}") from None


def _run_row(plan: Plan, config: CompareConfig, point: Point, run_index: int, result) -> dict:
    """A finished run's row of ``runs``."""
    params = dict(point.params)
    return {
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
