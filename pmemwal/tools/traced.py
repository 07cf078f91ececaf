"""Power-loss runs on the traced core, and the mutations that show the simulator failing.

The traced core (``pmemwal._core_traced``: native/trace.h's hooks compiled in) tells the
simulator (pmemwal.tools.powerloss) of every streaming store, fence and sync, so that
pmem mode is checked with records streamed past the cache, as it runs on real pmem, and
the page-cache modes count only what the WAL's own syncs covered.  A process loads one
core or the other before anything imports it, and picks its CRC32C + copy path
(``PMEMWAL_CPU``) once: each run here is therefore a child process (``python -m
pmemwal.tools.traced``), one per CPU path.

A run puts a mutant (pmemwal.tools.mutants: a known persistence bug) back by name, or by
``PMEMWAL_MUTANT``, and must then fail: a checker that cannot fail proves nothing
(tests/test_traced_power_loss.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import fields
from typing import Callable

from pmemwal.tools import mutants
from pmemwal.tools.powerloss import PowerLossReport
from pmemwal.tools.shadow import cpu_flags

# PMEMWAL_CPU names of the CRC32C + copy paths that stream (the table path copies through
# the cache), and the CPU flags each needs
STREAMING_PATHS = {"sse42": {"sse4_2"}, "pclmul": {"sse4_2", "pclmulqdq"},
                   "avx2": {"sse4_2", "pclmulqdq", "avx2", "vpclmulqdq"},
                   "avx512": {"sse4_2", "pclmulqdq", "avx512f", "avx512bw", "vpclmulqdq"}}

# Mutations a traced run puts in by name: those of the registry (pmemwal.tools.mutants: the
# core's TRACE_* bits and patches of the library), and any here, name -> description, that
# _mutate puts in itself.
MUTATIONS: dict[str, str] = {}
_PROGRESS = "progress "  # a line of the child's stdout: images checked since the last one


def streaming_paths() -> list[str]:
    """The streaming paths this CPU has."""
    flags = cpu_flags()
    return [path for path, needs in STREAMING_PATHS.items() if needs <= flags]


def run_traced(mode: str, images: int, *, cpu: str | None = None, mutation: str | None = None,
               timeout: float = 900, progress: Callable[[int], None] | None = None,
               **options) -> PowerLossReport:
    """``run_power_loss(mode, images, **options)`` in a child on the traced core, on CPU
    path ``cpu`` (the best one when None), with ``mutation`` (a mutant's name) put in;
    ``progress`` is called with the images checked as the child checks them."""
    if mutation is not None and mutation not in MUTATIONS and mutation not in mutants.MUTANTS:
        raise ValueError(f"mutation={mutation!r}: one of {', '.join([*mutants.MUTANTS, *MUTATIONS])}")
    env = {**os.environ, "PMEMWAL_TRACED_CORE": "1"}
    if cpu is not None:
        env["PMEMWAL_CPU"] = cpu
    request = {"mode": mode, "images": images, "mutation": mutation, "options": options,
               "progress": progress is not None}
    with tempfile.TemporaryFile("w+") as stderr, subprocess.Popen(
            [sys.executable, "-m", "pmemwal.tools.traced", json.dumps(request)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            last = ""
            assert proc.stdout is not None, "started with stdout=PIPE"
            for line in proc.stdout:
                if line.startswith(_PROGRESS) and progress is not None:
                    progress(int(line[len(_PROGRESS):]))
                elif line.strip():
                    last = line
        finally:
            timer.cancel()
        if proc.wait():
            stderr.seek(0)
            raise RuntimeError(f"the traced run failed (exit {proc.returncode}):\n"
                               f"{stderr.read()[-3000:]}")
    return _report(json.loads(last))


def _report(data: dict) -> PowerLossReport:
    names = {f.name for f in fields(PowerLossReport)}
    report = PowerLossReport(**{k: v for k, v in data.items() if k in names})
    report.grains = {int(k): v for k, v in report.grains.items()}  # (JSON keys are strings)
    return report


def _mutate(mutation: str | None) -> int:
    """Put ``mutation`` in, and the mutant ``PMEMWAL_MUTANT`` names: the core's TRACE_* bits
    they set (patches of the library are in once this returns)."""
    mutants.apply_from_environment()
    if mutation in mutants.MUTANTS:
        mutants.apply(mutation)
    return mutants.core_mask()


def main(argv: list[str]) -> None:
    from pmemwal import _core
    from pmemwal.tools.powerloss import run_power_loss
    if not _core.TRACED:
        raise SystemExit("not the traced core: run with PMEMWAL_TRACED_CORE=1")
    request = json.loads(argv[0])
    warnings.simplefilter("ignore")  # the recoveries' RecoveryWarnings, thousands of them
    bits = _mutate(request["mutation"])  # (and PMEMWAL_MUTANT's: a checker's run against a mutant)

    def progress(n: int) -> None:
        print(f"{_PROGRESS}{n}", flush=True)

    report = run_power_loss(request["mode"], request["images"], mutations=bits,
                            progress=progress if request.get("progress") else None,
                            **request["options"])
    print(json.dumps(report.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1:])
