"""An S3-compatible server on 127.0.0.1 for the archiving tests and benchmark: moto's
server mode (``pip install 'moto[s3]' flask flask-cors``), in a process of its own.

    with LocalS3() as s3:
        wal = pmemwal.open(path, archive="s3://bucket/wal", archive_options=s3.options)

Its objects live in the server process's memory, and go when it stops.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


# moto's server, sent SIGTERM when the process that started it dies (a test run killed
# by a timeout leaves no server behind)
_SERVE = """
import ctypes, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
from moto.server import main
sys.argv[0] = "moto_server"
main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalS3:
    """moto's S3 server on 127.0.0.1:``port`` (a free one by default)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    @property
    def options(self) -> dict:
        """fsspec/s3fs storage options that reach this server (``archive_options``)."""
        return storage_options(self.endpoint)

    def start(self, timeout: float = 30.0) -> LocalS3:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on {self.endpoint} "
                                       "(pip install 'moto[s3]' flask flask-cors)") from None
                time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def storage_options(endpoint: str, timeout: float = 30.0) -> dict:
    """s3fs options for an S3-compatible server at ``endpoint`` with moto's dummy keys, and
    ``timeout`` seconds to connect and to read, and no retries inside botocore (pmemwal's
    archiver retries)."""
    return {"key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint},
            "config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout,
                              "retries": {"max_attempts": 1}}}
