"""Helpers shared by the benchmark scripts: scratch directories, timing, tables."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

HERE = Path(__file__).resolve().parent
SCRATCH = os.environ.get("PMEMWAL_BENCH_DIR", "/dev/shm")


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
