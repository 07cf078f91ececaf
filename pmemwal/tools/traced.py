"""Power-loss runs on the traced core, and the mutations that show the simulator failing.

The traced core (``pmemwal._core_traced``: native/trace.h's hooks compiled in) tells the
simulator (pmemwal.tools.powerloss) of every streaming store, fence and sync, so that
pmem mode is checked with records streamed past the cache, as it runs on real pmem, and
the page-cache modes count only what the WAL's own syncs covered.  A process loads one
core or the other before anything imports it, and picks its CRC32C + copy path
(``PMEMWAL_CPU``) once: each run here is therefore a child process (``python -m
pmemwal.tools.traced``), one per CPU path.

``MUTATIONS`` put known persistence bugs back, each caught by a run that should fail:
a checker that cannot fail proves nothing (tests/test_traced_power_loss.py).
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

from pmemwal.tools.powerloss import PowerLossReport
from pmemwal.tools.shadow import cpu_flags

# PMEMWAL_CPU names of the CRC32C + copy paths that stream (the table path copies through
# the cache), and the CPU flags each needs
STREAMING_PATHS = {"sse42": {"sse4_2"}, "pclmul": {"sse4_2", "pclmulqdq"},
                   "avx2": {"sse4_2", "pclmulqdq", "avx2", "vpclmulqdq"},
                   "avx512": {"sse4_2", "pclmulqdq", "avx512f", "avx512bw", "vpclmulqdq"}}

MUTATIONS = {
    "skip-stream-fence": "no sfence after streaming stores (issue 27's first hole: caught "
                         "where pmem_drain is empty, flush_instruction='clflush')",
    "skip-drain": "neither pmem_drain nor the sfence after an insertion",
    "skip-sync": "no fdatasync or msync of a segment",
    "short-msync": "each msync leaves out its range's last page",
    "no-recovery-sync": "an open does not sync the records it recovered (issue 27's second "
                        "hole: caught with kills in msync mode)",
    "recycle-keeps-header": "a recycled segment keeps its old header",
    "reopen-loses-last-record": "an open after a kill destroys the last record it recovered "
                                "(its header zeroed): caught by the check of each reopen",
    "commit-syncs-own-record": "a commit's sync ends at its own record, yet it publishes as "
                               "flushed every record complete below the frontier (other "
                               "writers' records, never synced): caught with concurrent "
                               "writers in msync mode",
}
_CORE_BITS = {"skip-stream-fence": "TRACE_SKIP_STREAM_FENCE", "skip-drain": "TRACE_SKIP_DRAIN",
              "skip-sync": "TRACE_SKIP_SYNC", "short-msync": "TRACE_SHORT_MSYNC",
              "commit-syncs-own-record": "TRACE_SYNC_OWN_RECORD"}
_PROGRESS = "progress "  # a line of the child's stdout: images checked since the last one


def streaming_paths() -> list[str]:
    """The streaming paths this CPU has."""
    flags = cpu_flags()
    return [path for path, needs in STREAMING_PATHS.items() if needs <= flags]


def run_traced(mode: str, images: int, *, cpu: str | None = None, mutation: str | None = None,
               timeout: float = 900, progress: Callable[[int], None] | None = None,
               **options) -> PowerLossReport:
    """``run_power_loss(mode, images, **options)`` in a child on the traced core, on CPU
    path ``cpu`` (the best one when None), with ``mutation`` (one of MUTATIONS) put in;
    ``progress`` is called with the images checked as the child checks them."""
    if mutation is not None and mutation not in MUTATIONS:
        raise ValueError(f"mutation={mutation!r}: one of {', '.join(MUTATIONS)}")
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
            for line in proc.stdout:  # type: ignore[union-attr]
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
    """Put ``mutation`` in: the core's TRACE_* bits, or a patch of the library."""
    from pmemwal import _core, segments, wal
    if mutation in _CORE_BITS:
        return getattr(_core, _CORE_BITS[mutation])
    if mutation == "no-recovery-sync":
        wal.WAL._persist_recovered = lambda self, start, end: None
    elif mutation == "reopen-loses-last-record":
        persist_recovered = wal.WAL._persist_recovered

        def losing(self, start: int, end: int) -> None:
            _, last = self._core.position()
            if os.path.basename(self._dir.path) == "wal" and last:  # (the workload's: not an image's)
                fd = os.open(self._dir.file(last // self.segment_size), os.O_RDWR)
                try:
                    os.pwrite(fd, bytes(8), last % self.segment_size)
                finally:
                    os.close(fd)
            persist_recovered(self, start, end)
        wal.WAL._persist_recovered = losing
    elif mutation == "recycle-keeps-header":
        def recycle(self, old, new, segment_size, wal_id, fd=-1, spare=False):
            os.rename(self.file(old), self.file(new))
            self.sync()
        segments.WalDirectory.recycle = recycle
    return 0


def _mutant_from_environment() -> str | None:
    """The mutation of the registry's mutant ``PMEMWAL_MUTANT`` names, if it is one of the
    core's (its ``core_bits``)."""
    from pmemwal.tools import mutants
    name = os.environ.get(mutants.ENV)
    if name and name in MUTATIONS and mutants.get(name).core_bits:
        return name
    return None


def main(argv: list[str]) -> None:
    from pmemwal import _core
    from pmemwal.tools.powerloss import run_power_loss
    if not _core.TRACED:
        raise SystemExit("not the traced core: run with PMEMWAL_TRACED_CORE=1")
    request = json.loads(argv[0])
    from pmemwal.tools import mutants
    mutants.apply_from_environment()  # (PMEMWAL_MUTANT: a checker's run against a mutant)
    warnings.simplefilter("ignore")  # the recoveries' RecoveryWarnings, thousands of them
    # (a mutant the registry puts into a checker's children: pmemwal.tools.mutants)
    bits = _mutate(request["mutation"] or _mutant_from_environment())

    def progress(n: int) -> None:
        print(f"{_PROGRESS}{n}", flush=True)

    report = run_power_loss(request["mode"], request["images"], mutations=bits,
                            progress=progress if request.get("progress") else None,
                            **request["options"])
    print(json.dumps(report.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1:])
