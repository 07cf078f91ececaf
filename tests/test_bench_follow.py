"""A smoke run of the follow benchmark (benchmarks/follow.py) at tiny sizes: it finishes, every
record reaches the follower once and in order, and the JSON holds every figure it names.
No timing asserts: the figures are only checked to be there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, child_env

FOLLOW = REPO_ROOT / "benchmarks" / "follow.py"
LAG_KEYS = {"p50", "p99", "p99.9", "max", "mean", "within_20us"}


def assert_followed(run: dict, records: int) -> None:
    """A run with a follower: every record delivered once, in order, and its lags given."""
    assert run["records"] == run["delivered"] == records
    assert run["misplaced"] == 0 and run["ended"] and run["in_order"]
    assert set(run["lag_us"]) == LAG_KEYS
    assert run["lag_us"]["p50"] <= run["lag_us"]["p99"] <= run["lag_us"]["max"]
    assert run["writer_rate"] > 0 and run["follower_rate"] > 0
    assert 0 <= run["follower_over_writer"] <= 1
    assert run["writer_background_cpu"] >= 0  # the writer's background writer, over its window
    for role in ("writer", "follower"):
        assert set(run[f"{role}_usage"]) == {"cpu_s", "wall_s", "slept", "preempted"}


def test_follow_benchmark_tiny_run(shm_dir: Path) -> None:
    """Record by record (Follower.batches() is the follower's API, tested with it)."""
    reads = "records"
    pytest.importorskip("matplotlib")
    out, png = shm_dir / "follow.json", shm_dir / "lag.png"
    proc = subprocess.run([sys.executable, str(FOLLOW), "--seconds", "0.2", "--records", "2000",
                           "--rounds", "1", "--dir", str(shm_dir), "--json", str(out),
                           "--chart", str(png)],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^CPU: .+; load average [\d.]+ [\d.]+ [\d.]+;", proc.stdout, re.M)
    report = json.loads(out.read_text())
    assert report["cpu"] and len(report["load_before"]) == len(report["load_after"]) == 3
    assert report["follower_reads"] == reads

    paced = report["paced"]
    assert_followed(paced, 20_000)  # the default 100,000/s for 0.2 s

    full = report["full_speed"]
    assert full["records"] == 2000 and len(full["rounds"]) == 1
    (pair,) = full["rounds"]
    assert_followed(pair["follower"], 2000)
    assert pair["alone"]["records"] == 2000 and "delivered" not in pair["alone"]
    assert pair["alone"]["writer_background_cpu"] >= 0
    assert pair["after"]["delivered"] == 2000 and pair["after"]["in_order"]
    assert full["in_order"]
    for key in ("writer_rate_alone", "writer_rate_followed", "follower_rate",
                "follower_rate_alone", "writer_cost"):
        assert full[key] > 0, key
    for key in ("writer_background_cpu_alone", "writer_background_cpu_followed"):
        assert full[key] >= 0, key
    # (2,000 records at full speed may all come after the writer's last append: 0)
    assert 0 <= full["follower_over_writer"] <= 1
    assert png.read_bytes().startswith(b"\x89PNG")
    assert sorted(os.listdir(shm_dir)) == ["follow.json", "lag.png"]  # its WALs removed
