"""The ``postgres`` target: PostgreSQL's own WAL under pgbench, in a throwaway cluster."""

from __future__ import annotations

import contextlib
import functools
import glob
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import time
from typing import Callable

from pmemwal.errors import ConfigError
from pmemwal.tools import bench
from pmemwal.tools.bench import Latency
from pmemwal.tools.targets import RunResult, Target, TargetError, Workload
from pmemwal.tools.targets.common import FRESH_START, _check_params, _empty_dir, _prepare_dir


_PG_PROGRAMS = ("initdb", "pg_ctl", "postgres", "pgbench", "psql")
_PG_TIMEOUT = {"initdb": 120, "start": 90, "stop": 60, "psql": 60, "version": 20}
_SUN_PATH_MAX = 107  # bytes of a unix socket path, NUL excluded


class PostgresTarget:
    """PostgreSQL's own WAL, under pgbench: a throwaway cluster in PATH.

    initdb (trust auth, C locale, ``--no-sync``) into ``PATH/data``, as the
    ``os_user`` (``postgres``) when run as root, since PostgreSQL refuses root;
    started listening only on a unix socket in PATH with ``fsync=on`` and
    ``synchronous_commit`` on (off for ``end``), plus ``settings``.  Then
    ``pgbench -n -c CLIENTS -j CLIENTS -T SECONDS`` runs a script whose
    transaction emits one transactional WAL message per record,
    ``SELECT pg_logical_emit_message(true, 'x', repeat('0', SIZE))``
    (``group:K``: K of them between BEGIN and COMMIT, K records per
    transaction).  pgbench's ``-T`` takes whole seconds, so the duration is
    rounded up; ``elapsed`` is pgbench's own (transactions / tps, initial
    connections excluded).  ``end``: commits are asynchronous (the WAL
    writer flushes every 200 ms); one synchronous commit after pgbench makes
    everything durable, timed as part of the run (its time also in
    ``extra['final_flush_s']``).
    ``latency_us`` is per transaction from pgbench's log (``-l``), so per
    record except for ``group``, where it is {} and the transaction
    latency is in ``extra``.  The cluster is stopped (``-m immediate``) and
    removed, whatever happens.
    """

    name = "postgres"
    params: dict = {"port": 5433, "os_user": "postgres", "settings": {}}

    def available(self) -> str | None:
        bins = _pg_bin_dir()
        if bins is None:
            return ("PostgreSQL server programs (initdb, pg_ctl, postgres, pgbench, psql) are "
                    "not on PATH nor in /usr/lib/postgresql/*/bin: install postgresql")
        if os.geteuid() == 0:
            return _runas_problem(self.params["os_user"])
        return None

    def version(self) -> str:
        bins = _pg_bin_dir()
        if bins is None:
            return ""
        return _pg_version(bins)

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        port = params["port"]
        if not (isinstance(port, int) and 1024 <= port <= 65535):
            raise ConfigError(f"port={port!r}: 1024..65535")
        settings = params["settings"]
        if not isinstance(settings, dict):
            raise ConfigError(f"settings={settings!r}: a dict of PostgreSQL settings")
        user = str(params["os_user"])
        socket_path = os.path.join(os.path.abspath(workload.path), f".s.PGSQL.{port}")
        if len(os.fsencode(socket_path)) > _SUN_PATH_MAX:
            raise ConfigError(f"path {workload.path!r} is too long for PostgreSQL's unix socket "
                              f"({socket_path}: over {_SUN_PATH_MAX} bytes): choose a shorter one")
        bins = _pg_bin_dir()
        if bins is None:
            raise TargetError(f"postgres cannot run here: {self.available()}")
        as_root = os.geteuid() == 0
        problem = _runas_problem(user) if as_root else None
        if problem:
            raise TargetError(f"postgres cannot run here: {problem}")
        as_user = _runas(user) if as_root else (lambda cmd: cmd)
        root = os.path.abspath(workload.path)
        _prepare_dir(root)
        owner = os.stat(root)
        data = os.path.join(root, "data")
        started = False
        try:
            if as_root:
                account = pwd.getpwnam(user)
                for name in [root] + [os.path.join(root, n) for n in os.listdir(root)]:
                    os.chown(name, account.pw_uid, account.pw_gid)
            os.chmod(root, 0o700)
            _call(self, "initdb", as_user([f"{bins}/initdb", "-D", data, "-A", "trust", "-U",
                                           "postgres", "--no-sync", "-E", "UTF8", "--locale=C"]),
                  _PG_TIMEOUT["initdb"],
                  hint=f" (the {user} user must be able to reach {root}: choose a directory "
                       "under /dev/shm or /tmp)" if as_root else "")
            each_sync = "off" if workload.flush == "end" else "on"
            conf = {"listen_addresses": "", "unix_socket_directories": root, "port": port,
                    "fsync": "on", "synchronous_commit": each_sync,
                    "max_connections": max(20, workload.clients + 10), **settings}
            with open(os.path.join(data, "postgresql.conf"), "a") as f:
                f.write("\n# pmemwal.tools.targets\n")
                for key, value in conf.items():
                    f.write(f"{key} = '{str(value).replace(chr(39), chr(39) * 2)}'\n")
            log = os.path.join(root, "postgres.log")
            started = True  # from here on, stop it whatever happens
            _call(self, "pg_ctl start", as_user([f"{bins}/pg_ctl", "-D", data, "-l", log, "-w",
                                                 "-t", "60", "start"]),
                  _PG_TIMEOUT["start"], log=log)
            every = workload.flush_every or 1
            message = f"SELECT pg_logical_emit_message(true, 'x', repeat('0', {workload.size}));"
            script = os.path.join(root, "records.sql")
            with open(script, "w") as f:
                f.write("\n".join(["BEGIN;", *[message] * every, "COMMIT;"]
                                  if workload.flush_every > 1 else [message]) + "\n")
            seconds = max(1, math.ceil(workload.duration))
            conn = ["-h", root, "-p", str(port), "-U", "postgres"]
            clients = str(workload.clients)
            out = _call(self, "pgbench",
                        [f"{bins}/pgbench", "-n", *conn, "-c", clients, "-j", clients,
                         "-T", str(seconds), "-f", script, "-l",
                         f"--log-prefix={os.path.join(root, 'pgbench_log')}", "postgres"],
                        seconds + 120, cwd=root)
            report = _parse_pgbench(out)
            final_flush = None
            if workload.flush == "end":
                t = time.perf_counter()
                _call(self, "psql", [f"{bins}/psql", *conn, "-X", "-q", "-d", "postgres", "-c",
                             "SET synchronous_commit = on; "
                             "SELECT pg_logical_emit_message(true, 'x', '')"],
                      _PG_TIMEOUT["psql"])
                final_flush = time.perf_counter() - t
            txn_latency = _pgbench_latencies(root)
        finally:
            if started:
                _pg_stop(bins, data, as_user)
            _empty_dir(root)
            with contextlib.suppress(OSError):
                os.chown(root, owner.st_uid, owner.st_gid)
                os.chmod(root, stat.S_IMODE(owner.st_mode))
        transactions, tps = report["transactions"], report["tps"]
        records = transactions * every
        lat = txn_latency
        lat_dict = {"p50": lat.p50, "p99": lat.p99, "p999": lat.p999, "mean": lat.mean} \
            if lat else {}
        return RunResult(
            target=self.name, records=records, bytes=records * workload.size,
            # (flush end: the final synchronous commit is part of the run, as every
            # other target times its final flush)
            elapsed=(transactions / tps if tps > 0 else float(seconds)) + (final_flush or 0.0),
            latency_us={} if workload.flush_every > 1 else lat_dict,
            extra={"version": self.version(), "transactions": transactions, "tps": tps,
                   "records_per_transaction": every, "pgbench_seconds": seconds,
                   "latency_average_ms": report.get("latency_ms"),
                   "failed_transactions": report.get("failed", 0),
                   "transaction_latency_us": lat_dict,
                   "synchronous_commit": each_sync, "final_flush_s": final_flush,
                   "terms": FRESH_START,
                   "settings": {k: str(v) for k, v in conf.items()}})


@functools.cache
def _pg_bin_dir() -> str | None:
    """A directory holding every PostgreSQL program used: PATH's, else the newest Debian one."""
    candidates = []
    found = shutil.which("initdb")
    if found:
        candidates.append(os.path.dirname(os.path.realpath(found)))

    def numeric(path: str) -> tuple:
        version = os.path.basename(os.path.dirname(path))
        return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=numeric, reverse=True)
    for directory in candidates:
        if all(os.access(os.path.join(directory, p), os.X_OK) for p in _PG_PROGRAMS):
            return directory
    return None


@functools.cache
def _pg_version(bins: str) -> str:
    try:
        out = subprocess.run([f"{bins}/postgres", "--version"], capture_output=True, text=True,
                             timeout=_PG_TIMEOUT["version"]).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"PostgreSQL\)?\s*(\S+)", out)
    return f"PostgreSQL {found.group(1)}" if found else out.strip()


def _runas_problem(user: str) -> str | None:
    """Why we (root) cannot run programs as ``user``, or None."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return (f"running as root, which PostgreSQL refuses, and there is no {user!r} user to "
                "run it as (install postgresql, which creates one, or run as a normal user)")
    if not (shutil.which("runuser") or shutil.which("su")):
        return f"running as root, and neither runuser nor su is here to run PostgreSQL as {user}"
    return None


def _runas(user: str) -> Callable[[list[str]], list[str]]:
    """What turns a command into one that runs it as ``user`` (we are root)."""
    runuser = shutil.which("runuser")
    if runuser:
        return lambda cmd: [runuser, "-u", user, "--", *cmd]
    su = shutil.which("su") or "su"
    return lambda cmd: [su, "-s", "/bin/sh", user, "-c", shlex.join(cmd)]


def _call(target: Target, what: str, cmd: list[str], timeout: float, *,
          cwd: str | None = None, log: str | None = None, hint: str = "") -> str:
    """Run ``cmd`` in its own process group; its stdout, or TargetError with its words.

    On a timeout the whole group is killed, so no child of it is left behind.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TargetError(f"{target.name}: {what} took more than "
                          f"{timeout:g} s and was killed") from None
    if proc.returncode != 0:
        words = (err.strip() or out.strip()).splitlines()[-6:]
        if log:
            with contextlib.suppress(OSError), open(log, errors="replace") as f:
                words += f.read().splitlines()[-6:]
        raise TargetError(f"{target.name}: {what} failed "
                          f"(exit {proc.returncode}){hint}: " + " | ".join(words))
    return out


def _pg_stop(bins: str, data: str, as_user: Callable[[list[str]], list[str]]) -> None:
    """Stop the cluster (immediate); kill the postmaster from its pid file if that fails."""
    pid_file = os.path.join(data, "postmaster.pid")
    try:
        subprocess.run(as_user([f"{bins}/pg_ctl", "-D", data, "-m", "immediate", "-w", "-t",
                                "30", "stop"]), capture_output=True,
                       timeout=_PG_TIMEOUT["stop"], stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass
    pid = None
    with contextlib.suppress(OSError, ValueError, IndexError), open(pid_file) as f:
        pid = int(f.readline())
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)  # the postmaster we started; its children then exit
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def _parse_pgbench(out: str) -> dict:
    patterns = {"transactions": r"number of transactions actually processed: (\d+)",
                "tps": r"tps = ([\d.]+)", "latency_ms": r"latency average = ([\d.]+) ms",
                "failed": r"number of failed transactions: (\d+)"}
    report: dict = {}
    for key, pattern in patterns.items():
        found = re.search(pattern, out)
        if found:
            report[key] = float(found.group(1)) if "." in found.group(1) or key == "tps" \
                else int(found.group(1))
    if "transactions" not in report or "tps" not in report:
        raise TargetError("postgres: pgbench printed no transaction count or tps: "
                          + " | ".join(out.strip().splitlines()[-6:]))
    if report["transactions"] == 0:
        raise TargetError("postgres: pgbench ran no transaction")
    return report


def _pgbench_latencies(root: str) -> Latency | None:
    """Per-transaction latency from pgbench's -l logs (third column, µs)."""
    timings = bench._Timings()
    for name in sorted(glob.glob(os.path.join(root, "pgbench_log.*"))):
        with open(name) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2].isdigit():
                    timings.samples.append(int(fields[2]) * 1000)
                    if len(timings.samples) >= bench._DRAIN_EVERY:
                        timings.drain()
    timings.drain()
    return Latency.of(timings)
