"""The results database (SQLite): its schema (the tables ``environment``, a row per
run group, and ``runs``, a row per raw run, and the view ``results`` joining them),
opening it (refusing a file that is not one, adding the column an older one lacks),
inserting a row, listing its run groups, and reading a stored JSON object.

May touch: the database file it is given, and nothing else.  The queries that read
runs back into summaries are in ``results``.
"""

from __future__ import annotations

import json
import sqlite3

from pmemwal.errors import ConfigError


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


def _json_object(text: str | None) -> dict:
    """A stored JSON object, or {} for anything else (a peer's extra may be anything)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
