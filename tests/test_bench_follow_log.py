"""A smoke run of the log follower's lag benchmark (benchmarks/follow_log.py) at tiny sizes:
it finishes, every payload reaches both followers once and in order, and it reports both
lags and their ratio.  No timing asserts: the figures are only checked to be there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT, child_env

FOLLOW_LOG = REPO_ROOT / "benchmarks" / "follow_log.py"


def test_follow_log_benchmark_tiny_run(shm_dir: Path) -> None:
    out = shm_dir / "follow_log.json"
    proc = subprocess.run([sys.executable, str(FOLLOW_LOG), "--rate", "2000", "--seconds", "0.2",
                           "--rounds", "2", "--dir", str(shm_dir), "--json", str(out)],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "median lag, Log follower / WAL follower:" in proc.stdout
    report = json.loads(out.read_text())
    assert report["in_order"] and report["cpu"]
    for kind in ("log", "wal"):
        assert len(report["runs"][kind]) == 2
        for run in report["runs"][kind]:
            assert run["follower"]["delivered"] == 400 and run["follower"]["misplaced"] == 0
        lag = report["summary"][kind]
        assert 0 < lag["p50"] <= lag["p99"] <= lag["p99.9"]
    assert report["ratio_p50"] > 0 and len(report["round_ratios_p50"]) == 2
    assert os.listdir(shm_dir) == ["follow_log.json"]  # its logs and WALs removed
