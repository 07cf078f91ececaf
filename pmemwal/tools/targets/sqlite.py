"""The ``sqlite`` target: SQLite in WAL mode with ``synchronous=FULL``."""

from __future__ import annotations

import os

from pmemwal.tools.targets import END_COMMIT_EVERY, RunResult, Workload
from pmemwal.tools.targets.common import (FRESH_START, _check_params, _Clients, _count_param,
                                          _empty_dir, _Nothing, _prepare_dir, _thread_result)


class SqliteTarget:
    """SQLite (the stdlib sqlite3 module), WAL journal mode, ``synchronous=FULL``.

    One database ``PATH/log.db`` with ``log(id INTEGER PRIMARY KEY, data
    BLOB)``; one connection per client thread; every record is one row,
    ``INSERT INTO log(data) VALUES (?)``.  ``each``: autocommit, one durable
    transaction per insert; ``group:K``: ``BEGIN IMMEDIATE``, K inserts,
    ``COMMIT``; ``end``: the same with K = ``end_commit_every`` (10000), so
    that one transaction's WAL stays bounded, and the last one committed
    when the client stops.  Writers wait for each other through
    ``busy_timeout`` (ms).  The table grows for the whole run.
    """

    name = "sqlite"
    params = {"busy_timeout": 30_000, "end_commit_every": END_COMMIT_EVERY}

    def available(self) -> str | None:
        try:
            import sqlite3  # noqa: F401
        except ImportError as error:
            return f"the sqlite3 module is missing ({error})"
        return None

    def version(self) -> str:
        import sqlite3
        return f"SQLite {sqlite3.sqlite_version}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        every = workload.flush_every if workload.flush != "end" else _count_param(
            params, "end_commit_every")
        busy = _count_param(params, "busy_timeout")
        import sqlite3
        _prepare_dir(workload.path)
        db = os.path.join(workload.path, "log.db")
        payload = os.urandom(workload.size)
        try:
            setup = sqlite3.connect(db, isolation_level=None)
            try:
                mode = setup.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                setup.execute("CREATE TABLE log(id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
            finally:
                setup.close()

            class Client(_Nothing):
                def __init__(self, index: int) -> None:
                    self.conn = sqlite3.connect(db, isolation_level=None, timeout=busy / 1000)
                    self.conn.execute("PRAGMA synchronous=FULL")
                    self.conn.execute(f"PRAGMA busy_timeout={busy}")
                    self.cursor = self.conn.cursor()
                    self.open = False

                def write(self) -> None:
                    if every == 1:
                        self.cursor.execute("INSERT INTO log(data) VALUES (?)", (payload,))
                        return
                    if not self.open:
                        self.cursor.execute("BEGIN IMMEDIATE")
                        self.open = True
                    self.cursor.execute("INSERT INTO log(data) VALUES (?)", (payload,))

                def sync(self) -> None:
                    if self.open:
                        self.cursor.execute("COMMIT")
                        self.open = False

                def finish(self) -> None:
                    self.sync()

                def close(self) -> None:
                    self.conn.close()

            measured = _Clients(workload, every if every > 1 else 0, Client).measure()
        finally:
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, journal_mode=mode, synchronous="FULL",
                              records_per_transaction=every,
                              durability=f"a transaction of {every} insert(s), committed "
                                         "with synchronous=FULL", terms=FRESH_START)
