"""The ``rocksdb`` target: RocksDB through rocksdict (the ``peers`` extra)."""

from __future__ import annotations

import contextlib
import os
import re

from pmemwal.tools.targets import _KEY, RunResult, Workload
from pmemwal.tools.targets.common import (FRESH_START, _available_or_raise, _check_params,
                                          _Clients, _dist_version, _empty_dir, _missing, _Nothing,
                                          _policy_text, _prepare_dir, _thread_result)


class RocksdbTarget:
    """RocksDB through rocksdict: one ``Rdict`` in raw mode, shared by the client threads.

    Every record is a put of key (client id: 4 bytes, counter: 8 bytes,
    big-endian, so each client's keys ascend) and the record as value, into
    RocksDB's default options otherwise.  ``each``: ``put`` with
    ``WriteOptions.sync=True``; ``group:K``: K puts in a ``WriteBatch``
    written with ``sync=True``; ``end``: puts with ``sync=False`` (the WAL is
    written, not synced), then ``flush_wal(sync=True)`` when a client stops.
    """

    name = "rocksdb"
    params: dict = {}

    def available(self) -> str | None:
        return _missing("rocksdict", "rocksdict")

    def version(self) -> str:
        return f"rocksdict {_dist_version('rocksdict')}"

    def run(self, workload: Workload) -> RunResult:
        _check_params(self, workload)
        _available_or_raise(self)
        from rocksdict import Options, Rdict, WriteBatch, WriteOptions
        _prepare_dir(workload.path)
        path = os.path.join(workload.path, "db")
        payload, every = os.urandom(workload.size), workload.flush_every
        synced, unsynced = WriteOptions(), WriteOptions()
        synced.sync, unsynced.sync = True, False
        db = engine = None
        try:
            db = store = Rdict(path, Options(raw_mode=True))   # (the clients': never None)

            class Client(_Nothing):
                def __init__(self, index: int) -> None:
                    self.index, self.n = index, 0
                    self.batch = WriteBatch(raw_mode=True)

                def write(self) -> None:
                    key = _KEY.pack(self.index, self.n)
                    self.n += 1
                    if every == 1:
                        store.put(key, payload, synced)
                    elif every:
                        self.batch.put(key, payload)
                    else:
                        store.put(key, payload, unsynced)

                def sync(self) -> None:
                    store.write(self.batch, synced)  # consumes the batch
                    self.batch = WriteBatch(raw_mode=True)

                def finish(self) -> None:
                    if every > 1 and not self.batch.is_empty():
                        self.sync()
                    elif every == 0:
                        store.flush_wal(True)

            measured = _Clients(workload, every if every > 1 else 0, Client).measure()
        finally:
            if db is not None:
                db.close()
                engine = _rocksdb_engine_version(path)
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, rocksdb_version=engine,
                              durability=_policy_text(workload, "a synced write"),
                              terms=FRESH_START)


def _rocksdb_engine_version(path: str) -> str | None:
    """RocksDB's own version, from the first lines of its LOG file."""
    with contextlib.suppress(OSError), open(os.path.join(path, "LOG"), errors="replace") as log:
        for _ in range(20):
            found = re.search(r"RocksDB version: (\S+)", log.readline())
            if found:
                return found.group(1)
    return None
