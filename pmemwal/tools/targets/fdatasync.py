"""The ``fdatasync`` target: a plain loop of pwrite and fdatasync."""

from __future__ import annotations

import os

from pmemwal.errors import ConfigError
from pmemwal.tools.targets import RunResult, Workload
from pmemwal.tools.targets.common import (_check_params, _Clients, _empty_dir, _Nothing,
                                          _policy_text, _prepare_dir, _size_param,
                                          _thread_result)


class FdatasyncTarget:
    """A plain loop: ``os.pwrite`` of each record, ``os.fdatasync`` per the flush policy.

    Each client has its own file in PATH, pre-zeroed to ``file_size`` (64 MiB)
    and synced before the clock starts, so the loop never extends a file or
    allocates blocks; records are written back to back and wrap to offset 0
    at the end of the file.  ``each``: fdatasync after every pwrite;
    ``group:K``: after every K; ``end``: once per client when it stops.
    """

    name = "fdatasync"
    params = {"file_size": 64 << 20}

    def available(self) -> str | None:
        return None if hasattr(os, "fdatasync") else "os.fdatasync is missing on this platform"

    def version(self) -> str:
        return f"{os.uname().sysname} {os.uname().release}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        file_size = _size_param(params, "file_size")
        if workload.size > file_size:
            raise ConfigError(f"size={workload.size}: larger than file_size={file_size}")
        _prepare_dir(workload.path)
        payload, size = os.urandom(workload.size), workload.size
        every = workload.flush_every

        class Client(_Nothing):
            def __init__(self, index: int) -> None:
                path = os.path.join(workload.path, f"client-{index}.dat")
                self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    zeros = bytes(1 << 20)
                    for offset in range(0, file_size, len(zeros)):
                        os.pwrite(self.fd, zeros[:file_size - offset], offset)
                    os.fsync(self.fd)
                except BaseException:
                    os.close(self.fd)
                    raise
                self.offset, self.unsynced = 0, False

            def write(self) -> None:
                os.pwrite(self.fd, payload, self.offset)
                self.offset += size
                if self.offset + size > file_size:
                    self.offset = 0
                self.unsynced = True

            def sync(self) -> None:
                os.fdatasync(self.fd)
                self.unsynced = False

            def finish(self) -> None:
                if self.unsynced:
                    self.sync()

            def close(self) -> None:
                os.close(self.fd)

        try:
            measured = _Clients(workload, every, Client).measure()
        finally:
            _empty_dir(workload.path)
        return _thread_result(self, workload, measured, file_size=file_size,
                              durability=_policy_text(workload, "fdatasync"),
                              terms=None if workload.clients == 1 else
                              f"{workload.clients} clients write {workload.clients} files: "
                              "no shared log, no order among them")
