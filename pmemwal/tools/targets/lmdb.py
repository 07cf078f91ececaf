"""The ``lmdb`` target: LMDB through py-lmdb (the ``peers`` extra)."""

from __future__ import annotations

import os

from pmemwal.errors import ConfigError
from pmemwal.tools.targets import _KEY, END_COMMIT_EVERY, RunResult, TargetError, Workload
from pmemwal.tools.targets.common import (FRESH_START, _available_or_raise, _check_params,
                                          _Clients, _count_param, _empty_dir, _missing, _Nothing,
                                          _prepare_dir, _size_param, _thread_result)


class LmdbTarget:
    """LMDB through py-lmdb: one ``Environment`` (``map_size`` 1 GiB), shared by the clients.

    Every record is a put of key (client id, counter, big-endian) and the
    record.  ``each``: one write transaction per put, committed with the
    environment's ``sync=True`` (an fdatasync per commit); ``group:K``: a
    transaction per K puts; ``end``: the environment opened ``sync=False``,
    a transaction per ``end_commit_every`` (10000) puts (fewer where that
    many would take over an eighth of the map), and
    ``env.sync(True)`` when a client stops.  LMDB lets one write transaction
    run at a time; the others wait.  To wrap, after a commit that leaves the
    database's pages above a third of the map, the committing client empties
    the database (``drop``, in its own transaction, inside that record's
    latency), and the freed pages are reused.
    """

    name = "lmdb"
    params = {"map_size": 1 << 30, "end_commit_every": END_COMMIT_EVERY}

    def available(self) -> str | None:
        return _missing("lmdb", "lmdb")

    def version(self) -> str:
        try:
            import lmdb
        except ImportError:
            return "not installed"
        return f"LMDB {'.'.join(map(str, lmdb.version()))} (py-lmdb {lmdb.__version__})"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        map_size = _size_param(params, "map_size")
        if workload.size > map_size // 16:
            raise ConfigError(f"size={workload.size}: at most map_size/16 ({map_size // 16})")
        # pages a record takes: its own overflow pages when large, part of a leaf page if not
        footprint = -(-(workload.size + 16) // 4096) * 4096 if workload.size > 2000 \
            else 2 * (workload.size + 32)
        if workload.flush == "end":  # a transaction must fit in the map with room to spare
            every = max(1, min(_count_param(params, "end_commit_every"),
                               map_size // 8 // footprint))
        else:
            every = workload.flush_every
            if every * footprint > map_size // 4:
                raise ConfigError(f"lmdb: a transaction of {every} records of {workload.size} "
                                  f"bytes needs about {every * footprint} bytes of map: give a "
                                  f"map_size of at least {every * footprint * 4}")
        _available_or_raise(self)
        import lmdb
        _prepare_dir(workload.path)
        try:
            env = lmdb.Environment(os.path.join(workload.path, "env"), map_size=map_size,
                                   sync=workload.flush != "end", metasync=True, lock=True,
                                   max_dbs=0)
        except BaseException:
            _empty_dir(workload.path)
            raise
        payload = os.urandom(workload.size)
        limit = map_size // 3
        # check the database's size about every map_size/64 bytes of records
        check_every = max(1, map_size // 64 // (workload.size + 64))
        drops = [0]

        def wrap_if_full() -> None:
            with env.begin(write=True) as txn:
                st = txn.stat()
                if (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) \
                        * st["psize"] > limit:
                    txn.drop(env.open_db(), delete=False)
                    drops[0] += 1

        try:
            class Client(_Nothing):
                def __init__(self, index: int) -> None:
                    self.index, self.n, self.since_check = index, 0, 0
                    self.txn: lmdb.Transaction | None = None

                def write(self) -> None:
                    key = _KEY.pack(self.index, self.n)
                    self.n += 1
                    if every == 1:
                        with env.begin(write=True) as txn:
                            txn.put(key, payload)
                        self._committed(1)
                        return
                    if self.txn is None:
                        self.txn = env.begin(write=True)
                    self.txn.put(key, payload)

                def sync(self) -> None:
                    if self.txn is not None:
                        self.txn.commit()
                        self.txn = None
                        self._committed(every)

                def _committed(self, records: int) -> None:
                    self.since_check += records
                    if self.since_check >= check_every:
                        self.since_check = 0
                        wrap_if_full()

                def finish(self) -> None:
                    self.sync()
                    if workload.flush == "end":
                        env.sync(True)

                def close(self) -> None:
                    if self.txn is not None:
                        self.txn.abort()

            try:
                measured = _Clients(workload, every if every > 1 else 0, Client).measure()
            except lmdb.MapFullError as error:
                raise TargetError(f"lmdb: {error} (map_size={map_size}: give a larger one, "
                                  "e.g. params={'map_size': '4g'})") from None
        finally:
            env.close()
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, map_size=map_size, drops=drops[0],
                              records_per_transaction=every,
                              durability=f"a write transaction of {every} put(s), "
                                         + ("sync=False, env.sync(True) at the end"
                                            if workload.flush == "end" else "sync=True"),
                              terms=FRESH_START)
