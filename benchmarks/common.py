"""Helpers shared by the benchmark scripts: scratch directories, timing, tables, the CPU
a run ran on and the share of it the WAL's background writer took."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from pmemwal.tools.harness.environment import cpu_model
from pmemwal.tools.shadow import cpu_flags

HERE = Path(__file__).resolve().parent
SCRATCH = os.environ.get("PMEMWAL_BENCH_DIR", "/dev/shm")
# the features that pick pmemwal's paths: CRC32C's (avx512f, vpclmulqdq), the flush's (clwb, ...)
CPU_FLAGS = ("avx512f", "vpclmulqdq", "clwb", "clflushopt")


@contextmanager
def scratch_dir(prefix: str = "pmemwal-bench-") -> Iterator[str]:
    """A fresh directory under /dev/shm (or PMEMWAL_BENCH_DIR), removed afterwards."""
    path = tempfile.mkdtemp(prefix=prefix, dir=SCRATCH)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def rate(step: Callable[[], int], seconds: float) -> float:
    """Calls of ``step`` (each returning how many operations it did) per second."""
    done, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        done += step()
    return done / (time.perf_counter() - start)


def rate_and_background(wal: Any, step: Callable[[], int], seconds: float) -> tuple[float, float]:
    """``rate(step, seconds)`` and ``wal``'s background writer's CPU share over it."""
    before, start = wal.stats(), time.perf_counter()
    value = rate(step, seconds)
    return value, background_share(before, wal.stats(), time.perf_counter() - start)


def background_share(before: dict[str, int], after: dict[str, int], seconds: float) -> float:
    """The background writer's CPU time between two ``stats()`` over ``seconds`` of wall
    time: the fraction of one core the WAL took beyond its callers' threads."""
    used = after.get("background_cpu_ns", 0) - before.get("background_cpu_ns", 0)
    return used / 1e9 / seconds if seconds > 0 else float("nan")


def share_text(*shares: float | None) -> str:
    """CPU shares as a table cell: '14 %', or '3 / 14 %' for several; '-' for an unknown
    one (None, or NaN: a failed measurement)."""
    cells = ["-" if s is None or s != s else f"{100 * s:.0f}" for s in shares]
    return "-" if all(c == "-" for c in cells) else " / ".join(cells) + " %"


def cpu_name() -> str:
    """The CPU's model and which of ``CPU_FLAGS`` it has, e.g.
    'Intel(R) Xeon(R) Processor (avx512f vpclmulqdq clwb)'."""
    flags = cpu_flags()
    present = " ".join(f for f in CPU_FLAGS if f in flags)
    return f"{cpu_model()} ({present})" if present else cpu_model()


def print_cpu() -> None:
    """The first line of a benchmark's output: the CPU it ran on."""
    print(f"CPU: {cpu_name()}", flush=True)


def build_pmem_loop() -> Path:
    """Compile benchmarks/pmem_loop.c into a temporary binary (cc must exist)."""
    out = Path(tempfile.gettempdir()) / "pmemwal-pmem-loop"
    subprocess.run(["cc", "-O2", "-o", str(out), str(HERE / "pmem_loop.c"), "-ldl"], check=True)
    return out


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def human(n: float) -> str:
    """1234567 -> '1.23 M'."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g}"
