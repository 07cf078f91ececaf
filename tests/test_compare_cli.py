"""Tests for the comparison harness (pmemwal.tools.harness) and ``pmemwal compare``.

The CLI runs use pmemwal.tools.targets, with a target ``absent`` added that is
never available.  The library tests use fake
targets that return made-up results at once.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import child_env, cli_runner
from pmemwal import ConfigError, libpmem
from pmemwal.tools import harness, progress
from pmemwal.tools import targets as real
from pmemwal.tools.cli import main
from pmemwal.tools.targets import RunResult, Workload

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---- targets ---------------------------------------------------------------------


class Unavailable:
    name = "absent"

    def available(self) -> str:
        return "not installed here (stand-in)"

    def version(self) -> str:
        raise AssertionError("version() of an unavailable target")

    def run(self, w):
        raise AssertionError("run() of an unavailable target")


@pytest.fixture
def targets(monkeypatch) -> SimpleNamespace:
    """pmemwal.tools.targets plus the never-available target ``absent``."""
    monkeypatch.setenv("PMEM_IS_PMEM_FORCE", "1")  # direct mode on tmpfs

    def get_target(name):
        return Unavailable() if name == "absent" else real.get_target(name)

    module = SimpleNamespace(Workload=real.Workload, RunResult=real.RunResult,
                             TARGET_NAMES=tuple(real.TARGET_NAMES) + ("absent",),
                             get_target=get_target)
    monkeypatch.setattr(harness.config, "targets_module", lambda: module)
    return module


class Fake:
    """A target that returns made-up numbers at once and remembers its workloads."""

    def __init__(self, name: str, rate: float, reason: str | None = None, fail: bool = False):
        self.name, self.rate, self.reason, self.fail = name, rate, reason, fail
        self.workloads: list[Workload] = []
        self.params = {"insert_slots": 8} if name in harness.PMEMWAL_TARGETS else {"x": 1}

    def available(self):
        return self.reason

    def version(self):
        return f"{self.name} 1.0"

    def run(self, w: Workload) -> RunResult:
        assert os.path.isdir(w.path) and not os.listdir(w.path)  # a fresh directory
        self.workloads.append(w)
        if self.fail and len(self.workloads) > 2:
            raise RuntimeError("disk on fire")
        records = int(self.rate * w.clients * w.duration)
        return RunResult(self.name, records, records * w.size, w.duration,
                         {"p50": 1.0}, {"params_seen": w.params})


@pytest.fixture
def fakes(monkeypatch) -> dict[str, Fake]:
    targets = {"buffered": Fake("buffered", 1000), "direct": Fake("direct", 3000),
               "sqlite": Fake("sqlite", 500), "postgres": Fake("postgres", 1, "no pg_ctl")}
    module = SimpleNamespace(Workload=Workload, RunResult=RunResult, TARGET_NAMES=tuple(targets),
                             get_target=lambda name: targets[name])
    monkeypatch.setattr(harness.config, "targets_module", lambda: module)
    return targets


def invoke(*args):
    return cli_runner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory) -> Path:
    """One build cache for the --against tests: HEAD is exported and built once, not in
    each (a build is most of such a test's time)."""
    return tmp_path_factory.mktemp("builds")


# ---- the CLI, for real ------------------------------------------------------------


def test_compare_writes_db_tables_and_png(targets, shm_dir: Path) -> None:
    db, png = shm_dir / "results.db", shm_dir / "chart.png"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered,direct", "--clients", "1,2",
                    "--sizes", "64,8k", "--duration", "0.2", "--runs", "3", "--db", db,
                    "--plot", png)
    assert result.exit_code == 0, result.output + result.stderr
    out = result.output
    for text in ("cpu:", "governor:", "kernel:", "versions:", "probe verdict:",
                 "PMEM_IS_PMEM_FORCE=1", "buffered: records/s (trimmed mean of 3 runs, flush each)",
                 "direct: records/s", "direct: ratio to buffered", "24 runs stored in"):
        assert text in out
    assert "24 runs of 0.2 s each planned: about 0:" in out
    assert "compare: 24/24 runs (100%)" in result.stderr and "\r" not in result.stderr
    # the tables: rows 1 and 2 clients, columns 64 and 8k
    table = out[out.index("direct: ratio to buffered"):].splitlines()
    assert table[1].split() == ["clients", "64", "8k"]
    assert [row.split()[0] for row in table[3:5]] == ["1", "2"]
    assert all(float(cell) > 0 for row in table[3:5] for cell in row.split()[1:])

    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = conn.execute("SELECT * FROM runs ORDER BY id").fetchall()
    assert len(rows) == 2 * 2 * 2 * 3  # targets x clients x sizes x runs
    assert [r["run_index"] for r in rows[:8]] == [0] * 8  # interleaved: a round, then the next
    points = {(r["target"], r["clients"], r["size"]) for r in rows}
    assert len(points) == 8
    for r in rows:
        assert r["records"] > 0 and r["records_per_s"] > 0 and r["elapsed"] >= 0.2
        assert r["bytes"] == r["records"] * r["size"]
        assert json.loads(r["params"]) == {} and isinstance(json.loads(r["latency"]), dict)
        assert isinstance(json.loads(r["extra"]), dict) and r["target_version"]
        assert r["flush"] == "each" and r["duration"] == 0.2
    env = conn.execute("SELECT * FROM environment").fetchall()
    assert len(env) == 1 and env[0]["run_group"] == rows[0]["run_group"]
    assert json.loads(env[0]["probe"])["probed_dir"].startswith(str(shm_dir))
    assert json.loads(env[0]["env"])["PMEM_IS_PMEM_FORCE"] == "1"
    assert json.loads(env[0]["config"])["sizes"] == [64, 8192]
    assert env[0]["cpu_model"] and env[0]["kernel"] and env[0]["pmemwal"]
    assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 24
    conn.close()
    assert os.listdir(shm_dir / "cmp") == []  # every run's directory removed

    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and b"Matplotlib" in data[:200]


def test_unavailable_target_is_skipped_with_its_reason(targets, shm_dir: Path) -> None:
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered,absent", "--clients", "1",
                    "--sizes", "64", "--duration", "0.1", "--runs", "1", "--db", db)
    assert result.exit_code == 0, result.output + result.stderr
    assert "skipped absent: not installed here (stand-in)" in result.output
    assert "buffered: records/s (mean of 1 run," in result.output
    assert "no ratio tables" not in result.output
    targets_run = sqlite3.connect(db).execute("SELECT DISTINCT target FROM runs").fetchall()
    assert targets_run == [("buffered",)]


def test_only_unavailable_targets_is_an_error(targets, shm_dir: Path) -> None:
    result = invoke("compare", shm_dir / "cmp", "--targets", "absent", "--db", shm_dir / "r.db")
    assert result.exit_code == 1
    assert "skipped absent: not installed here" in result.output
    assert "none of the targets is available: absent: not installed here" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--sizes", "64,8q"], "size '8q'"),
    (["--sizes", "8k,,64k"], "comma-separated"),
    (["--sizes", "8k,8192"], "given twice"),
    (["--clients", "1,0"], "clients '0'"),
    (["--targets", "buffered,nosuch"], "unknown target 'nosuch': valid targets are buffered"),
    (["--param", "insert_slots"], "expected NAME=VALUE"),
    (["--param", "insert slots=8"], "expected NAME=VALUE"),
    (["--param", "insert_slots="], "expected NAME=VALUE"),
    (["--param", "insert_slots=8", "--param", "insert_slots=64"], "given twice"),
    (["--flush", "sometimes"], "each, end or group:K"),
])
def test_bad_options_are_usage_errors(targets, shm_dir: Path, args, message) -> None:
    result = invoke("compare", shm_dir / "cmp", "--db", shm_dir / "r.db", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert not (shm_dir / "r.db").exists()


def test_unusable_db_fails_before_any_run(targets, shm_dir: Path) -> None:
    db = shm_dir / "no" / "such" / "dir" / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--duration", "30",
                    "--db", db)
    assert result.exit_code == 1
    assert "db=" in result.stderr and "cannot use it as the results database" in result.stderr
    assert "compare:" not in result.stderr  # no bar started: nothing ran

    not_ours = shm_dir / "other.db"
    sqlite3.connect(not_ours).execute("CREATE TABLE runs (x)").connection.commit()
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--db", not_ours)
    assert result.exit_code == 1 and "not a pmemwal compare database" in result.stderr


def test_params_grid_from_the_cli(targets, shm_dir: Path) -> None:
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--clients", "1",
                    "--sizes", "64", "--duration", "0.1", "--runs", "1",
                    "--param", "insert_slots=2,16", "--db", db)
    assert result.exit_code == 0, result.output + result.stderr
    assert "buffered insert_slots=2: records/s" in result.output
    assert "buffered insert_slots=16: ratio to buffered insert_slots=2" in result.output
    params = sqlite3.connect(db).execute("SELECT params FROM runs ORDER BY id").fetchall()
    assert [json.loads(p) for (p,) in params] == [{"insert_slots": 2}, {"insert_slots": 16}]


def test_truncation_styles_are_grid_dimensions(targets, shm_dir: Path) -> None:
    """Retention (a size, or all: never truncated) and a checkpointer thread's period."""
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "direct", "--clients", "1",
                    "--sizes", "64k", "--duration", "0.1", "--runs", "1",
                    "--param", "keep_bytes=48m,all", "--param", "checkpoint=0,0.01", "--db", db)
    assert result.exit_code == 0, result.output + result.stderr
    rows = sqlite3.connect(db).execute("SELECT params, extra FROM runs ORDER BY id").fetchall()
    grid = [json.loads(p) for p, _ in rows]
    assert grid == [{"checkpoint": c, "keep_bytes": k} for k in (48 << 20, "all") for c in (0, 0.01)]
    moved = [json.loads(e)["segments_after_warm_up"] for _, e in rows]
    assert all(m["recycled"] == m["removed"] == 0 for m in moved[2:])   # all: never truncated


def test_persist_varies_direct_mode_alone(targets, shm_dir: Path) -> None:
    """Seed 003's grid: direct mode by cache flush and by msync beside buffered mode in
    one comparison; buffered runs once, and each run records the path it took."""
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered,direct", "--clients", "1",
                    "--sizes", "64", "--duration", "0.1", "--runs", "1",
                    "--param", "persist=auto,msync", "--db", db)
    assert result.exit_code == 0, result.output + result.stderr
    for title in ("buffered: records/s", "direct persist=auto: ratio to buffered",
                  "direct persist=msync: ratio to buffered"):
        assert title in result.output
    rows = sqlite3.connect(db).execute("SELECT target, params, extra FROM runs ORDER BY id")
    runs = [(t, json.loads(p), json.loads(e)["persist_method"]) for t, p, e in rows]
    assert runs[0] == ("buffered", {}, "fdatasync") and len(runs) == 3
    assert runs[2] == ("direct", {"persist": "msync"}, "msync")


def test_columns_table_and_draw_the_wal_counters(targets, shm_dir: Path) -> None:
    """Seed 001's table: a row per slot count, records/s and the two waits (ms/s)."""
    db, png = shm_dir / "r.db", shm_dir / "c.png"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--clients", "2",
                    "--sizes", "64", "--duration", "0.2", "--runs", "1", "--param",
                    "insert_slots=1,8", "--columns", "slot_wait,insert_wait", "--db", db,
                    "--plot", png)
    assert result.exit_code == 0, result.output + result.stderr
    table = result.output[result.output.index("2 clients, 64 records"):].splitlines()
    assert table[1].split() == ["series", "records/s", "slot_wait", "ms/s", "insert_wait", "ms/s"]
    for row, slots in zip(table[3:5], ("1", "8")):
        assert row.split()[:2] == ["buffered", f"insert_slots={slots}"]
        assert all(float(cell) >= 0 for cell in row.split()[2:])
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    (config,) = sqlite3.connect(db).execute("SELECT config FROM environment").fetchone()
    assert json.loads(config)["columns"] == ["slot_wait_ns", "insert_wait_ns"]


def test_an_unknown_column_is_a_usage_error(targets, shm_dir: Path) -> None:
    result = invoke("compare", shm_dir / "cmp", "--columns", "slot_wait,lock_wait")
    assert result.exit_code == 2
    assert "column 'lock_wait': not a counter the pmemwal targets report (valid: slot_wait, " \
        in result.stderr


@pytest.mark.parametrize("preset, series, more", [
    ("nvwal", ["buffered", "direct persist=pmem", "direct persist=msync"],
     ["PMEM_IS_PMEM_FORCE=1 set", "direct persist=msync: ratio to buffered"]),
    ("insert-slots", [f"buffered insert_slots={n}" for n in (1, 2, 4, 8)],
     ["slot_wait ms/s", "insert_wait ms/s", "ratio to buffered insert_slots=8"]),
    ("buffer-mapping", ["buffered", "direct"], ["8k", "64k", "1m", "direct: ratio to buffered"]),
    ("governor", ["buffered", "direct"], ["governor:", "direct: ratio to buffered"]),
])
def test_each_preset_runs_in_one_command(shm_dir: Path, preset, series, more) -> None:
    """A fresh interpreter without PMEM_IS_PMEM_FORCE, as a user would start it: the preset
    sets the grid (here shortened: one client, one run, a short duration), and emulates
    persistent memory on tmpfs where it runs direct mode."""
    if preset == "nvwal" and libpmem.load() is None:
        pytest.skip("no libpmem: the next test runs this preset without it")
    out = _cli_in_subprocess(shm_dir, "--preset", preset, "--clients", "1", "--runs", "1",
                             "--duration", "0.05")
    assert out.startswith(f"preset {preset}: seed 00")
    for label in series:
        assert f"{label}: records/s (mean of 1 run, flush each)" in out
    assert all(text in out for text in more), out
    config = json.loads(sqlite3.connect(shm_dir / "r.db").execute(
        "SELECT config FROM environment").fetchone()[0])
    assert config["preset"] == preset and config["runs"] == 1 and config["clients"] == [1]


def test_nvwal_preset_without_libpmem_leaves_the_cache_flush_series_out(shm_dir: Path) -> None:
    out = _cli_in_subprocess(shm_dir, "--preset", "nvwal", "--clients", "1", "--runs", "1",
                             "--duration", "0.05", "--sizes", "64",
                             env={"PMEMWAL_LIBPMEM": "/nonexistent/libpmem.so.1"})
    assert "libpmem is not installed: the cache-flush (persist=pmem) series is left out" in out
    assert "direct persist=msync: ratio to buffered" in out and "direct persist=pmem" not in out


def test_full_needs_a_preset(targets, shm_dir: Path) -> None:
    result = invoke("compare", shm_dir / "cmp", "--full")
    assert result.exit_code == 2 and "--full needs --preset" in result.stderr


def _cli_in_subprocess(shm_dir: Path, *args: str, env: dict | None = None) -> str:
    """``pmemwal compare SHM/cmp --db SHM/r.db ARGS`` in a new interpreter; its stdout."""
    code = "import sys; from pmemwal.tools.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", code, "compare", str(shm_dir / "cmp"), "--db",
                           str(shm_dir / "r.db"), *args], env=child_env(**(env or {})),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_baseline_that_names_no_series_fails_before_any_run(targets, shm_dir: Path) -> None:
    """A label matching nothing is an error naming the valid ones, not a quiet fall-back
    to another series of its target; a target alone picks its first series."""
    db = shm_dir / "r.db"
    args = ["compare", shm_dir / "cmp", "--targets", "buffered", "--clients", "1", "--sizes",
            "64", "--duration", "0.1", "--runs", "1", "--param", "segment_size=1m,2m", "--db", db]
    result = invoke(*args, "--baseline", "buffered segment_size=4m")
    assert result.exit_code == 1
    assert ("baseline 'buffered segment_size=4m': no such series in this comparison (valid: "
            "buffered segment_size=1m, buffered segment_size=2m)") in result.stderr
    assert sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    result = invoke(*args, "--baseline", "buffered segment_size=2m", "--quiet")
    assert result.exit_code == 0, result.output + result.stderr
    assert "buffered segment_size=1m: ratio to buffered segment_size=2m" in result.output
    assert "compare:" not in result.stderr        # --quiet


def _in_git_checkout() -> bool:
    done = subprocess.run(["git", "-C", str(Path(harness.__file__).parents[3]), "rev-parse",
                           "HEAD"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="pmemwal is not run from a git checkout")
def test_against_a_revision_runs_both_builds_interleaved(targets, shm_dir: Path, build_cache,
                                                          monkeypatch) -> None:
    """A/B: the revision is exported and built once (cached by commit), its bench runs
    beside this build's in each round, and the ratios read this build / REV; every run
    group records the build it ran (commit, uncommitted changes, cflags, CRC path)."""
    monkeypatch.setenv("PMEMWAL_BUILD_CACHE", str(build_cache))
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "direct", "--against", "HEAD",
                    "--clients", "1", "--sizes", "64", "--duration", "0.1", "--runs", "2",
                    "--db", db)
    assert result.exit_code == 0, result.output + result.stderr
    commit = subprocess.run(["git", "-C", str(Path(harness.__file__).parents[3]), "rev-parse",
                             "HEAD"], capture_output=True, text=True).stdout.strip()
    assert f"against:       HEAD = {commit[:7]} (the @ series)" in result.output
    assert "direct: ratio to direct@HEAD" in result.output
    assert (build_cache / commit / ".pmemwal-built").exists()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT target, extra FROM runs ORDER BY id").fetchall()
    assert [t for t, _ in rows] == ["direct@HEAD", "direct"] * 2        # interleaved
    assert json.loads(rows[0][1])["commit"] == commit and json.loads(rows[0][1])["stats"]
    assert len(json.loads(rows[0][1])["intervals"]) >= 5      # its bench's progress lines
    build = json.loads(conn.execute("SELECT build FROM environment").fetchone()[0])
    assert build["commit"] == commit and isinstance(build["dirty"], bool)
    assert build["cflags"].startswith("-O") and build["crc32c_path"]
    bad = invoke("compare", shm_dir / "cmp", "--targets", "direct", "--against", "no-such-rev",
                 "--db", db)
    assert bad.exit_code == 1 and "--against 'no-such-rev': not a revision" in bad.stderr


def test_a_database_from_before_builds_were_recorded_is_upgraded(tmp_path: Path) -> None:
    db = str(tmp_path / "old.db")
    harness.open_db(db).close()
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE environment DROP COLUMN build")
    conn.commit()
    conn.close()
    harness.open_db(db).close()
    columns = [row[1] for row in sqlite3.connect(db).execute("PRAGMA table_info(environment)")]
    assert columns[-1] == "build"


def test_every_open_option_and_the_flush_policy_are_grid_dimensions(targets, shm_dir: Path):
    """buffer_size (buffered mode's alone: direct runs once) and a list of flush policies,
    which every target runs, each series labelled with what it ran."""
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered,direct", "--clients", "1",
                    "--sizes", "64", "--duration", "0.1", "--runs", "1", "--flush", "each,end",
                    "--param", "buffer_size=128k,16m", "--param", "flush_interval=0.01",
                    "--db", db)
    assert result.exit_code == 0, result.output + result.stderr
    rows = sqlite3.connect(db).execute("SELECT target, params, flush FROM runs ORDER BY id")
    runs = [(t, json.loads(p), f) for t, p, f in rows]
    assert len(runs) == 2 * 2 + 2
    assert ("buffered", {"buffer_size": 128 << 10, "flush": "end", "flush_interval": 0.01},
            "end") in runs
    assert ("direct", {"flush": "each", "flush_interval": 0.01}, "each") in runs
    assert "buffered buffer_size=128k flush=end flush_interval=0.01: records/s" in result.output
    bad = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--param",
                 "sync_method=fdatasync,nvme", "--db", db)
    assert bad.exit_code == 1
    assert "sync_method='nvme': valid values are fdatasync, fsync, open_datasync" in bad.stderr


def test_serial_insertion_is_a_param_of_the_grid(targets, shm_dir: Path) -> None:
    db = shm_dir / "r.db"
    result = invoke("compare", shm_dir / "cmp", "--targets", "direct", "--clients", "2",
                    "--sizes", "64k", "--duration", "0.1", "--runs", "1", "--param",
                    "insertion=parallel,serial", "--db", db, "--quiet")
    assert result.exit_code == 0, result.output + result.stderr
    assert "direct insertion=serial: ratio to direct insertion=parallel" in result.output
    bad = invoke("compare", shm_dir / "cmp", "--targets", "direct", "--param",
                 "insertion=batched", "--db", db)
    assert bad.exit_code == 1 and "insertion='batched': valid values are parallel, serial" \
        in bad.stderr


def test_a_flush_grid_reaches_the_peers(fakes, shm_dir: Path) -> None:
    config = harness.CompareConfig(shm_dir / "cmp", targets=["sqlite"], clients=[1], sizes=[64],
                                   duration=0.1, runs=1, params={"flush": ["each", "group:4"]},
                                   db=shm_dir / "r.db")
    harness.run_compare(config)
    assert [(w.flush, w.params) for w in fakes["sqlite"].workloads] == [("each", {}),
                                                                          ("group:4", {})]


def test_runs_keep_their_progress_and_report_draws_it(targets, shm_dir: Path) -> None:
    """Each pmemwal run stores records/s per interval (a tenth of a short run), and
    `report --intervals` draws a line per run."""
    db, png = shm_dir / "r.db", shm_dir / "i.png"
    result = invoke("compare", shm_dir / "cmp", "--targets", "direct", "--clients", "1",
                    "--sizes", "8k", "--duration", "0.5", "--runs", "2", "--db", db, "--quiet")
    assert result.exit_code == 0, result.output + result.stderr
    for (extra,) in sqlite3.connect(db).execute("SELECT extra FROM runs"):
        intervals = json.loads(extra)["intervals"]
        assert len(intervals) >= 8 and all(rate > 0 for _, rate in intervals)
        assert [t for t, _ in intervals] == sorted(t for t, _ in intervals)
    drawn = invoke("report", db, "--intervals", png)
    assert drawn.exit_code == 0 and f"intervals: {png}" in drawn.output
    assert png.read_bytes().startswith(PNG_SIGNATURE)


def test_unknown_param_fails_before_any_run(targets, shm_dir: Path) -> None:
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--duration", "30",
                    "--param", "no_such_knob=1,2", "--db", shm_dir / "r.db")
    assert result.exit_code == 1
    assert "param 'no_such_knob': buffered has no such option (valid: " in result.stderr
    assert "insert_slots" in result.stderr and "compare:" not in result.stderr


def test_baseline_must_be_a_target(targets, shm_dir: Path) -> None:
    result = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--baseline", "direct",
                    "--db", shm_dir / "r.db")
    assert result.exit_code == 1 and "not among the targets" in result.stderr


# ---- the library, with fake targets -----------------------------------------------


def test_grid_order_params_and_peers(fakes, shm_dir: Path) -> None:
    config = harness.CompareConfig(shm_dir / "cmp", targets=["sqlite", "buffered", "postgres"],
                                   clients=[1, 4], sizes=["8k"], duration=0.5, runs=3,
                                   params={"insert_slots": [8, 64]}, db=shm_dir / "r.db")
    seen = []
    result = harness.run_compare(config, progress=seen.append)
    assert result.skipped == {"postgres": "no pg_ctl"}
    assert config.baseline == "sqlite"
    # sqlite (a peer) once per point, without params; buffered once per params value
    assert [(w.clients, w.params) for w in fakes["sqlite"].workloads] == [(1, {}), (4, {})] * 3
    assert [(w.clients, w.params["insert_slots"]) for w in fakes["buffered"].workloads] == \
        [(1, 8), (4, 8), (1, 64), (4, 64)] * 3
    assert [p["done"] for p in seen] == list(range(1, 19)) and seen[-1]["total"] == 18
    assert [p["run"] for p in seen] == [0] * 6 + [1] * 6 + [2] * 6
    assert seen[2]["label"] == "buffered insert_slots=8"
    rows = sqlite3.connect(config.db).execute("SELECT target, params FROM runs").fetchall()
    assert rows[:6] == [("sqlite", "{}")] * 2 + [("buffered", '{"insert_slots": 8}')] * 2 + \
        [("buffered", '{"insert_slots": 64}')] * 2

    summary = harness.summarize(config.db)
    assert summary.group == result.group
    assert summary.series() == ["sqlite", "buffered insert_slots=8", "buffered insert_slots=64"]
    ratios = summary.ratio_tables()
    assert [t.title for t in ratios] == ["buffered insert_slots=8: ratio to sqlite",
                                         "buffered insert_slots=64: ratio to sqlite"]
    assert ratios[0].rows == [(1, [pytest.approx(2.0)]), (4, [pytest.approx(2.0)])]
    png = harness.plot(summary, shm_dir / "chart.png")
    assert Path(png).read_bytes().startswith(PNG_SIGNATURE)


def test_report_lists_reprints_and_joins_stored_groups(fakes, shm_dir: Path) -> None:
    """Two comparisons in one database (as if made under two environments): `report`
    lists them, re-prints the latest by default, and joins both, naming the series found
    in each with its group; CSV and chart from the joined set."""
    db = shm_dir / "r.db"
    groups = []
    for targets in (["buffered", "direct"], ["direct", "sqlite"]):
        config = harness.CompareConfig(shm_dir / "cmp", targets=targets, clients=[1, 2],
                                       sizes=[64], duration=0.1, runs=3, db=db)
        groups.append(harness.run_compare(config).group)
    listed = invoke("report", db, "--list")
    assert listed.exit_code == 0, listed.output + listed.stderr
    assert [line.split()[0] for line in listed.output.splitlines()] == groups
    assert "12 runs  buffered,direct" in listed.output.splitlines()[0]
    latest = invoke("report", db)
    assert latest.exit_code == 0 and f"run group:     {groups[1]}" in latest.output
    assert "sqlite: ratio to direct" in latest.output

    csv_path, png = shm_dir / "j.csv", shm_dir / "j.png"
    joined = invoke("report", db, "--group", groups[0], "--group", groups[1], "--baseline",
                    "buffered", "--csv", csv_path, "--plot", png)
    assert joined.exit_code == 0, joined.output + joined.stderr
    out = joined.output
    assert f"direct@{groups[0]}: ratio to buffered" in out
    assert f"direct@{groups[1]}: ratio to buffered" in out and "sqlite: ratio to buffered" in out
    row = [line.split()[1:] for line in out[out.index(f"direct@{groups[1]}: ratio"):]
           .splitlines()[3:5]]
    assert row == [["3.00"], ["3.00"]]                 # the fakes: direct 3000, buffered 1000
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("run_group,series,target,params,flush,clients,size,runs,"
                               "records_per_s")
    assert len(lines) == 1 + 4 * 2 and lines[1].startswith(f"{groups[0]},buffered,")
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert invoke("report", shm_dir / "none.db").exit_code == 2


def test_a_failing_run_keeps_the_runs_before_it(fakes, shm_dir: Path) -> None:
    fakes["direct"].fail = True
    config = harness.CompareConfig(shm_dir / "cmp", targets=["buffered", "direct"],
                                   clients=[1, 2], sizes=[64], duration=0.1, runs=3,
                                   db=shm_dir / "r.db")
    with pytest.raises(harness.CompareError, match=r"direct, clients 1, size 64, run 2: "
                                                   r"RuntimeError: disk on fire"):
        harness.run_compare(config)
    assert sqlite3.connect(config.db).execute("SELECT count(*) FROM runs").fetchone()[0] == 6
    assert os.listdir(shm_dir / "cmp") == [] or \
        all(not os.listdir(shm_dir / "cmp" / d) for d in os.listdir(shm_dir / "cmp"))


@pytest.mark.parametrize("values, expected", [
    ([5.0], 5.0),
    ([10.0, 20.0], 15.0),
    ([1.0, 2.0, 9.0], 2.0),
    ([100.0, 3.0, 4.0, 1.0, 5.0, 2.0], 3.5),  # 6 runs: the middle 4
    ([7.0, 7.0, 7.0, 1.0], 7.0),  # one of the equal highest dropped, not all
])
def test_trimmed_mean(values, expected) -> None:
    assert harness.trimmed_mean(values) == pytest.approx(expected)


def test_trimmed_mean_of_nothing() -> None:
    with pytest.raises(ValueError):
        harness.trimmed_mean([])


def _made_up_db(path: Path, rates: dict, extra=lambda target, run: {}, config=None) -> str:
    """A results database with one run group: rates[(target, clients, size)] = [records/s];
    ``extra(target, run)`` the JSON each run stores beside them."""
    db = harness.open_db(str(path))
    env = {c: None for c in harness.store._ENV_COLUMNS}
    env.update(run_group="g1", timestamp="2025-01-01T00:00:00+00:00", cpu_model="Test CPU",
               config=json.dumps(config or {"flush": "group:4", "baseline": "master"}))
    harness.store._insert(db, "environment", env, harness.store._ENV_COLUMNS)
    for run in range(max(len(v) for v in rates.values())):
        for (target, clients, size), values in rates.items():
            rate = values[run]
            harness.store._insert(db, "runs", {
                "run_group": "g1", "timestamp": "t", "run_index": run, "target": target,
                "target_version": "1", "params": "{}", "clients": clients, "size": size,
                "flush": "group:4", "duration": 1.0, "records": int(rate),
                "bytes": int(rate) * size,
                "elapsed": 1.0, "records_per_s": rate, "mb_per_s": rate * size / 1e6,
                "latency": "{}", "extra": json.dumps(extra(target, run))},
                harness.store._RUN_COLUMNS)
    db.commit()
    db.close()
    return str(path)


def test_throughput_and_ratio_tables_from_made_up_numbers(tmp_path: Path) -> None:
    six = lambda m: [m * f for f in (0.5, 0.9, 1.0, 1.0, 1.1, 3.0)]  # trimmed mean: m  # noqa: E731
    rates = {("master", 1, 8192): six(1000), ("master", 1, 65536): six(500),
             ("master", 4, 8192): six(2000), ("master", 4, 65536): six(800),
             ("patched", 1, 8192): six(1100), ("patched", 1, 65536): six(500),
             ("patched", 4, 8192): six(3000)}  # (patched, 4, 64k) missing
    summary = harness.summarize(_made_up_db(tmp_path / "r.db", rates), "g1")
    point = summary.point("master", 1, 8192)
    assert point.runs == 6 and point.records_per_s == pytest.approx(1000)
    assert (point.min, point.max) == (500, 3000) and point.stddev > 0 and point.unstable
    assert point.mb_per_s == pytest.approx(1000 * 8192 / 1e6)

    master, patched = summary.throughput_tables()
    assert master.columns == ["8k", "64k"]
    assert master.rows == [(1, [pytest.approx(1000), pytest.approx(500)]),
                           (4, [pytest.approx(2000), pytest.approx(800)])]
    assert master.text() == (
        "master: records/s (trimmed mean of 6 runs, flush group:4)\n"
        "clients    8k  64k\n"
        "-------  ----  ---\n"
        "      1  1000  500\n"
        "      4  2000  800")
    (ratio,) = summary.ratio_tables()  # the baseline from the stored config: master
    assert ratio.title == "patched: ratio to master"
    assert ratio.rows == [(1, [pytest.approx(1.1), pytest.approx(1.0)]),
                          (4, [pytest.approx(1.5), None])]
    assert ratio.text().splitlines()[3:] == ["      1  1.10  1.00", "      4  1.50     -"]
    assert ratio.markdown().splitlines() == [
        "**patched: ratio to master**", "",
        "| clients | 8k | 64k |", "|---:|---:|---:|",
        "| 1 | 1.10 | 1.00 |", "| 4 | 1.50 | - |"]
    (other_way,) = summary.ratio_tables("patched")
    assert other_way.rows[1] == (4, [pytest.approx(2000 / 3000), None])
    with pytest.raises(ConfigError, match="baseline 'nosuch'"):
        summary.ratio_tables("nosuch")
    report = summary.report(markdown=True)
    assert "**master: records/s" in report and "unstable" in report


def test_counter_columns_and_machine_warnings_from_made_up_numbers(tmp_path: Path) -> None:
    """Counters per second of each run (waits in ms/s), trimmed like records/s, in a table
    per client count and size with a row per series (seed 001's layout); and warnings when
    the runs saw different governors or CPU frequencies (seed 002)."""
    waits = {"slots=8": (3.0e9, 0.5e9), "slots=64": (0.5e9, 2.0e9)}  # ns in 1 s runs

    def extra(target, run):
        slot, insert = waits[target]
        governor = "powersave" if target == "slots=64" and run == 2 else "performance"
        return {"stats": {"slot_wait_ns": slot * (1 + run), "insert_wait_ns": insert,
                          "flushes": 1000},
                "machine": {"start": {"governor": "performance", "mhz": 3000.0, "load": 1.0},
                            "end": {"governor": governor, "mhz": 2000.0 if run == 1 else 3000.0,
                                    "load": 2.0}}}

    rates = {("slots=8", 4, 256): [100.0, 200.0, 300.0], ("slots=64", 4, 256): [90.0] * 3}
    db = _made_up_db(tmp_path / "r.db", rates, extra,
                     {"flush": "each", "columns": ["slot_wait_ns", "insert_wait_ns"]})
    summary = harness.summarize(db)
    point = summary.point("slots=8", 4, 256)
    assert point.counters == {"slot_wait_ns": pytest.approx(6000.0),  # 3, 6, 9 s: trimmed 6
                              "insert_wait_ns": pytest.approx(500.0), "flushes": 1000.0}
    (table,) = summary.series_tables()
    assert table.text().splitlines() == [
        "4 clients, 256 records (trimmed mean of 3 runs)",
        "  series  records/s  slot_wait ms/s  insert_wait ms/s",
        "--------  ---------  --------------  ----------------",
        " slots=8        200            6000               500",
        "slots=64       90.0            1000              2000"]
    assert summary.series_tables(["flushes"])[0].columns == ["records/s", "flushes /s"]
    assert summary.machine_line() == ("machine over the 6 runs: governor performance, "
                                      "powersave, 2000-3000 MHz, load average 1.00-2.00")
    governors, frequency = summary.machine_warnings()   # load 1 to 2: no more than a CPU's
    assert "different CPU governors (performance, powersave)" in governors
    assert "CPU frequency moved from 2000 to 3000 MHz" in frequency
    summary.machine[0]["end"]["load"] = 3.5               # 2.5 more than at the start
    assert ("load average moved from 1.00 to 3.50 (1 CPU) across the runs of group g1: other "
            "work shared the machine") in summary.machine_warnings()[2]
    summary.machine[0]["end"]["load"] = 2.0
    report = summary.report()
    assert table.text() in report and governors in report and frequency in report
    assert harness.plot(summary, tmp_path / "c.png")  # a row of panels per column


def test_summarize_picks_the_latest_group_and_rejects_unknown(tmp_path: Path) -> None:
    db = _made_up_db(tmp_path / "r.db", {("a", 1, 64): [1.0, 2.0, 3.0]})
    assert harness.summarize(db).group == "g1"
    with pytest.raises(ConfigError, match="run group 'nope'"):
        harness.summarize(db, "nope")


def test_report_refuses_a_baseline_that_names_no_series_as_compare_does(tmp_path: Path) -> None:
    """A --baseline that is no series is an error listing the valid ones, exit status 1 as
    compare's (not tables without ratios and status 0), before anything is printed."""
    db = _made_up_db(tmp_path / "r.db", {("master", 1, 64): [1.0], ("patched", 1, 64): [2.0]})
    result = invoke("report", db, "--baseline", "bogus")
    assert result.exit_code == 1 and result.stdout == ""
    assert ("baseline 'bogus': no such series in run group g1 (valid: master, patched)"
            in result.stderr)
    assert invoke("report", db, "--baseline", "patched").exit_code == 0


def test_report_of_an_unknown_group_lists_the_groups(tmp_path: Path) -> None:
    db = _made_up_db(tmp_path / "r.db", {("a", 1, 64): [1.0]})
    result = invoke("report", db, "--group", "nonexist")
    assert result.exit_code == 1 and result.stdout == ""
    assert "run group 'nonexist': not in the results database, which holds g1" in result.stderr
    conn = harness.open_db(db)
    for n in range(2, 14):  # many: the latest 10, and how many more
        env = {c: None for c in harness.store._ENV_COLUMNS}
        env.update(run_group=f"g{n}", timestamp=f"2025-01-{n:02d}T00:00:00+00:00")
        harness.store._insert(conn, "environment", env, harness.store._ENV_COLUMNS)
    conn.commit()
    conn.close()
    with pytest.raises(ConfigError, match=r"which holds 13 run groups, the latest 10: g4, g5, "
                                          r".*, g13 \(--list shows them all\)$"):
        harness.summarize(db, "nonexist")


def test_report_gives_the_load_the_runs_recorded_never_a_question_mark(fakes,
                                                                      shm_dir: Path) -> None:
    """The environment table keeps no machine state: the report's line is the first run's
    start (which compare's own line is also taken just before), and none where no run
    recorded one (a database made before they did)."""
    db = shm_dir / "r.db"
    harness.run_compare(harness.CompareConfig(shm_dir / "cmp", targets=["buffered"],
                                              clients=[1], sizes=[64], duration=0.1, runs=1,
                                              db=db))
    out = invoke("report", db).output
    assert re.search(r"^cpu at start: +(\d+ MHz|frequency not visible), load average "
                     r"\d+\.\d\d \(1 min\)$", out, re.M), out
    old = _made_up_db(shm_dir / "old.db", {("a", 1, 64): [1.0]})
    out = invoke("report", old).output
    assert "cpu at start" not in out and "?" not in out, out


def test_one_run_one_client_and_one_cpu_are_singular(tmp_path: Path) -> None:
    """1 run, 1 client, 1 CPU: no "1 runs" anywhere in the report (nor compare's progress)."""
    def extra(target, run):
        return {"machine": {"start": {"governor": None, "mhz": None, "load": 0.5},
                            "end": {"governor": None, "mhz": None, "load": 3.0}}}

    db = _made_up_db(tmp_path / "r.db", {("a", 1, 64): [1.0], ("b", 1, 64): [2.0]}, extra,
                     {"flush": "each", "columns": ["flushes"]})
    conn = sqlite3.connect(db)
    conn.execute("UPDATE environment SET nproc = 1")
    conn.commit()
    conn.close()
    result = invoke("report", db)
    assert result.exit_code == 0, result.output + result.stderr
    out = result.output
    assert "a: records/s (mean of 1 run, flush each)" in out
    assert "1 client, 64 records (mean of 1 run)" in out
    assert "machine over the 2 runs" in out and "(1 CPU) across the runs" in out
    assert re.search(r"^host: +1 CPU$", out, re.M)  # (a made-up group: no host name)
    assert not re.search(r"\b1 (runs|clients|CPUs)\b", out), out
    lines = io.StringIO()
    with progress.progress(1, "run", "compare", "pmemwal compare", stream=lines) as bar:
        bar.update()
    assert lines.getvalue().startswith("compare: 1/1 run (100%), 0:00 elapsed")


@pytest.mark.parametrize("files, expected", [
    ({}, "governor not visible"),
    ({"cpu0": "performance", "cpu1": "performance"}, None),
    ({"cpu0": "performance", "cpu1": "powersave"}, "governor is performance x1, powersave x1"),
    ({"cpu0": "powersave"}, "governor is powersave, not performance"),
])
def test_governor_warning(monkeypatch, tmp_path: Path, files, expected) -> None:
    for cpu, governor in files.items():
        (tmp_path / cpu / "cpufreq").mkdir(parents=True)
        (tmp_path / cpu / "cpufreq" / "scaling_governor").write_text(governor + "\n")
    monkeypatch.setattr(harness.environment, "_CPU_GLOB",
                        str(tmp_path / "cpu[0-9]*" / "cpufreq") + "/")
    warning = harness.governor_warning()
    assert warning is None if expected is None else expected in warning


@pytest.mark.parametrize("text, expected", [
    ("insert_slots=8,64", ("insert_slots", [8, 64])),
    ("segment_size=1m,16m", ("segment_size", [1 << 20, 16 << 20])),
    ("prefault=true,false", ("prefault", [True, False])),
    ("ratio=0.5", ("ratio", [0.5])),
    ("policy=fast", ("policy", ["fast"])),
])
def test_parse_param(text, expected) -> None:
    assert harness.parse_param(text) == expected


def test_params_grid_is_the_cartesian_product() -> None:
    assert harness.params_grid({}) == [{}]
    assert harness.params_grid({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]


@pytest.mark.skipif(not _in_git_checkout(), reason="pmemwal is not run from a git checkout")
def test_against_refuses_an_option_the_other_build_is_not_given(targets, shm_dir: Path,
                                                                  build_cache, monkeypatch) -> None:
    """Issue 27, item 20: REV's side kept only five flags and dropped the rest without a
    word: buffered sync_method=fsync ran against REV's fdatasync, labelled an A/B."""
    monkeypatch.setenv("PMEMWAL_BUILD_CACHE", str(build_cache))
    db = shm_dir / "r.db"
    bad = invoke("compare", shm_dir / "cmp", "--targets", "buffered", "--param",
                 "sync_method=fsync", "--against", "HEAD", "--clients", "1", "--sizes", "64",
                 "--duration", "0.1", "--runs", "1", "--db", db)
    assert bad.exit_code == 1, bad.output
    assert "buffered@HEAD: sync_method cannot be passed to the build at HEAD" in bad.stderr
    assert not db.exists() or not sqlite3.connect(db).execute("SELECT * FROM runs").fetchall()


@pytest.mark.skipif(not _in_git_checkout(), reason="pmemwal is not run from a git checkout")
def test_a_presets_baseline_is_its_series_at_the_other_build(targets, shm_dir: Path, build_cache,
                                                              monkeypatch) -> None:
    """Issue 27, item 21: the presets' baseline ("buffered") kept the A/B default from
    applying, so --against's ratios read REV over this build, the inverse of its promise."""
    monkeypatch.setenv("PMEMWAL_BUILD_CACHE", str(build_cache))
    result = invoke("compare", shm_dir / "cmp", "--preset", "nvwal", "--against", "HEAD",
                    "--targets", "buffered", "--clients", "1", "--sizes", "64",
                    "--duration", "0.05", "--runs", "1", "--db", shm_dir / "r.db")
    assert result.exit_code == 0, result.output + result.stderr
    assert "buffered: ratio to buffered@HEAD" in result.output, result.output


def test_a_join_of_groups_with_other_flush_policies_says_each(fakes, shm_dir: Path) -> None:
    """Issue 27, item 22: the joined report took the flush note from the first group (an
    'each' group joined with an 'end' one titled both 'flush each'), the CSV had no flush
    column, and a ratio across groups did not say so."""
    db = shm_dir / "r.db"
    groups = [harness.run_compare(harness.CompareConfig(
        shm_dir / "cmp", targets=["buffered", "direct"], clients=[1], sizes=[64],
        duration=0.1, runs=1, db=db, flush=flush)).group for flush in ("each", "end")]
    csv_path = shm_dir / "j.csv"
    joined = invoke("report", db, "--group", groups[0], "--group", groups[1], "--baseline",
                    "buffered flush=each", "--csv", csv_path)
    assert joined.exit_code == 0, joined.output + joined.stderr
    out = joined.output
    assert "direct flush=end: ratio to buffered flush=each (across run groups" in out
    assert "direct flush=each: ratio to buffered flush=each:" in out or \
        "direct flush=each: ratio to buffered flush=each\n" in out
    rows = list(csv.DictReader(csv_path.open()))
    assert {(r["series"], r["flush"]) for r in rows} == {
        ("buffered flush=each", "each"), ("direct flush=each", "each"),
        ("buffered flush=end", "end"), ("direct flush=end", "end")}


def test_a_baseline_named_by_its_target_is_never_another_builds() -> None:
    """Issue 27, item 22: '--baseline direct' in a joined A/B report resolved to the other
    build's series, the second matching pass stripping the '@...' suffix."""
    assert harness.pick_baseline("direct", ["direct@HEAD", "direct"], "r") == "direct"
    assert harness.pick_baseline("DIRECT", ["direct@HEAD", "direct x=1"], "r") == "direct x=1"
    with pytest.raises(harness.ConfigError, match="no such series"):
        harness.pick_baseline("direct", ["direct@HEAD", "buffered"], "r")


def test_peers_measured_on_other_terms_are_marked(targets, shm_dir: Path) -> None:
    """Issue 27, item 23: cells measured on other terms than pmemwal's were unmarked: the
    fdatasync loop's N clients write N files, libpmemlog persists every record whatever the
    policy, SQLite starts on a fresh database.  The report marks each such series and says
    how, and where (the points it holds for)."""
    from pmemwal.tools.targets import get_target
    peers = ["fdatasync", "sqlite"] + (["libpmemlog"] if get_target("libpmemlog").available()
                                       is None else [])
    result = invoke("compare", shm_dir / "cmp", "--targets", ",".join(["buffered", *peers]),
                    "--clients", "1,2", "--sizes", "64", "--duration", "0.1", "--runs", "1",
                    "--flush", "end", "--db", shm_dir / "r.db")
    assert result.exit_code == 0, result.output + result.stderr
    out = result.output
    assert "buffered: records/s" in out and "fdatasync [other terms, see below]: records/s" in out
    notes = out[out.index("measured on other terms than pmemwal:"):]
    assert "fdatasync: 2 clients write 2 files: no shared log, no order among them " \
           "(at 2 clients, 64 B)" in notes
    assert "sqlite: starts on a fresh database" in notes
    if "libpmemlog" in peers:
        assert "libpmemlog: persists every record (libpmemlog cannot batch): stronger than " \
               "flush end" in notes


def test_a_wide_wait_axis_keeps_the_series_of_no_waits(tmp_path: Path) -> None:
    """Waits from 0 to thousands of ms/s: the axis is symlog (a log axis drops the zeros, and
    with them the insert-slots preset's series that never waited), and every line is drawn."""
    from matplotlib.figure import Figure

    waits = {"slots=8": 3.0e9, "slots=16": 1.0e7, "slots=64": 0.0}
    rates = {(target, c, 256): [100.0] * 3 for target in waits for c in (1, 4)}
    db = _made_up_db(tmp_path / "r.db", rates,
                     lambda target, run: {"stats": {"slot_wait_ns": waits[target] * (1 + run)}},
                     {"flush": "each", "columns": ["slot_wait_ns"]})
    summary = harness.summarize(db)
    ax = Figure().subplots()
    harness.charts._draw_panel(ax, summary, 256, "slot_wait_ns")
    assert ax.get_yscale() == "symlog"
    assert sorted(line.get_label() for line in ax.get_lines()) == ["slots=16", "slots=64", "slots=8"]
    ax = Figure().subplots()
    harness.charts._draw_panel(ax, summary, 256, None)  # records/s: all alike, a linear axis
    assert ax.get_yscale() == "linear"
