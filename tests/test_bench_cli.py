"""Tests for the write benchmark (pmemwal.tools.bench) and the click CLI, on real WALs in
/dev/shm."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, child_env, cli_runner

import pmemwal
from pmemwal.tools import bench
from pmemwal.tools.cli import main

PROGRESS_LINE = re.compile(r"^progress: \d+\.\d s, \d+\.\d rec/s, \d+\.\d MB/s, "
                           r"lat \d+\.\d{3} ms stddev \d+\.\d{3} max \d+\.\d{3}$", re.M)
PARAMETERS = ("mode:", "persist method:", "clients:", "record size:", "flush policy:",
              "duration:", "path:")


def invoke(*args: str):
    return cli_runner().invoke(main, [str(a) for a in args])


def segment_files(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".wal"))


def max_segment_files(keep: str, segment: str, size: str = "8k") -> int:
    """Segment files a bench run may leave: the kept window, the segment in progress and
    one more where a record spans two, the recycled spares and the 2 prepared ahead."""
    config = bench.BenchConfig("/dev/shm/unused", keep_bytes=keep, size=size)
    segment_size = bench.parse_size(segment)
    return config.keep_bytes // segment_size + 2 + config.recycle_segments(segment_size) + 2


# ---- parsing ---------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("8192", 8192), (8192, 8192), ("0", 0), ("8k", 8192), ("8K", 8192), ("8kb", 8192),
    ("8KiB", 8192), ("16m", 16 << 20), ("16MiB", 16 << 20), ("1g", 1 << 30), ("1GB", 1 << 30),
    (" 4 k ", 4096), ("100b", 100), ("100B", 100),
])
def test_parse_size(text, expected) -> None:
    assert bench.parse_size(text) == expected


@pytest.mark.parametrize("text", ["8q", "", "k", "-1", -1, "1.5m", "8 kk", "8kib2", "8ib", None, True])
def test_parse_size_rejects(text) -> None:
    with pytest.raises(ValueError, match="size"):
        bench.parse_size(text)


@pytest.mark.parametrize("text, expected", [
    ("each", 1), ("EACH", 1), ("end", 0), ("group:1", 1), ("group:16", 16), (" Group:4 ", 4),
])
def test_parse_flush(text, expected) -> None:
    assert bench.parse_flush(text) == expected


@pytest.mark.parametrize("text", ["", "always", "group", "group:", "group:0", "group:-2",
                                  "group:x", "group:1.5", "each:2"])
def test_parse_flush_rejects(text) -> None:
    with pytest.raises(ValueError, match="each, end or group:K"):
        bench.parse_flush(text)


@pytest.mark.parametrize("kwargs", [
    {"mode": "fast"}, {"clients": 0}, {"duration": 0}, {"flush": "sometimes"}, {"size": "8q"},
    {"progress_interval": -1},
])
def test_config_rejects(kwargs) -> None:
    with pytest.raises(ValueError):
        bench.BenchConfig("/dev/shm/unused", **kwargs)


def test_config_takes_sizes_as_text() -> None:
    config = bench.BenchConfig("/dev/shm/unused", size="4k", segment_size="1m", keep_bytes="8m",
                               flush="Group:8")
    assert (config.size, config.segment_size, config.keep_bytes) == (4096, 1 << 20, 8 << 20)
    assert (config.flush, config.flush_every) == ("group:8", 8)


# ---- the library -----------------------------------------------------------------


def assert_no_latency_escapes_the_lines(lines: list[dict], result: bench.BenchResult) -> None:
    """Each progress line's max is its interval's highest per-record latency (append, and
    the flush where one followed): no record's is missed, so the highest of the lines is at
    least the run's highest append latency (the histogram's, rounded up by < 0.1 %)."""
    assert all(p["max_ms"] >= p["lat_ms"] for p in lines)
    assert max(p["max_ms"] for p in lines) * 1e3 >= result.append_latency.max * 0.999


def test_run_reports_progress_and_result(shm_dir: Path) -> None:
    lines = []
    config = bench.BenchConfig(shm_dir / "wal", mode="buffered", clients=2, size=512,
                               duration=0.5, flush="group:4", keep_bytes=None,
                               progress_interval=0.2, keep_wal=True)
    result = bench.run(config, progress=lines.append)
    assert len(lines) >= 2 and all(PROGRESS_LINE.match(p["line"]) for p in lines)
    assert lines[-1]["elapsed"] >= 0.5 and lines[0]["records_per_s"] > 0
    assert_no_latency_escapes_the_lines(lines, result)
    assert result.mode == "buffered" and result.persist_method == "fdatasync"
    assert result.probe is not None  # probed for the report although the mode was given
    assert result.records == sum(result.per_client_records) == result.stats["records"] > 0
    assert result.bytes == result.records * 512
    assert result.elapsed >= 0.5
    assert result.append_latency.count == result.records
    assert result.flush_latency.count == sum(n // 4 for n in result.per_client_records)
    assert result.append_latency.p50 <= result.append_latency.p99 <= result.append_latency.max
    data = json.loads(json.dumps(result.as_dict()))
    assert data["records"] == result.records and data["config"]["flush"] == "group:4"
    assert data["flush_latency_us"]["p999"] >= data["flush_latency_us"]["p50"]
    # the background writer's CPU over the run: its counter since the warm-up, over elapsed
    assert result.stats["background_cpu_ns"] > 0
    assert result.background_cpu_share == result.stats["background_cpu_ns"] / 1e9 / result.elapsed
    assert data["background_cpu_share"] == result.background_cpu_share
    report = result.report()
    assert report.startswith("mode:")
    assert re.search(r"^throughput: .*\n^background CPU: +\d+ % of a core$", report, re.M)
    assert report.index("flush policy:") < report.index("throughput:") < report.index(
        "append latency") < report.index("wal counters:")
    with pmemwal.open(shm_dir / "wal") as wal:  # what was measured is a valid WAL
        sizes = [len(rec.payload) for rec in wal.records()]  # after the warm-up's (kept: --keep all)
        assert sizes.count(512) == result.records and set(sizes) == {512, 1 << 20}


def test_fresh_refuses_a_directory_that_is_not_a_wal(shm_dir: Path) -> None:
    (shm_dir / "precious.txt").write_text("keep me")
    with pytest.raises(pmemwal.ConfigError, match="precious.txt"):
        bench.run(bench.BenchConfig(shm_dir, duration=0.1))
    assert (shm_dir / "precious.txt").exists()


def test_fresh_refuses_a_wal_in_use(shm_dir: Path) -> None:
    with pmemwal.open(shm_dir / "wal", mode="buffered"):
        with pytest.raises(pmemwal.LockedError):
            bench.run(bench.BenchConfig(shm_dir / "wal", duration=0.1))


# ---- the CLI ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["buffered", "direct"])
@pytest.mark.parametrize("flush", ["each", "end", "group:4"])
def test_bench(shm_dir: Path, mode: str, flush: str) -> None:
    result = invoke("bench", shm_dir / "wal", "--mode", mode, "--flush", flush,
                    "--duration", "0.5", "--size", "4k", "--clients", "2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for parameter in PARAMETERS:
        assert re.search(f"^{parameter}", out, re.M), parameter
    assert re.search(rf"^mode: +{mode}$", out, re.M)
    assert re.search(rf"^flush policy: +{flush}$", out, re.M)
    assert re.search(r"^record size: +4096 bytes$", out, re.M)
    assert re.search(r"^throughput: +\d+\.\d rec/s, \d+\.\d MB/s$", out, re.M)
    assert re.search(r"^background CPU: +\d+ % of a core$", out, re.M)
    label = "commit" if flush == "each" else "append"  # each: append(data, flush=True)
    assert f"{label} latency (usec): p50" in out
    assert ("no client flushes" in out) == (flush == "end")
    assert ("in the commit" in out) == (flush == "each")
    assert PROGRESS_LINE.search(result.stderr)
    assert "progress:" not in out


def test_bench_json(shm_dir: Path) -> None:
    result = invoke("bench", shm_dir / "wal", "--mode", "buffered", "--duration", "0.3", "--json",
                    "--progress", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["mode"] == "buffered" and data["records"] > 0 and data["records_per_s"] > 0
    assert data["config"]["size"] == 8192 and data["stats"]["records"] == data["records"]
    assert result.stderr == ""


def test_bench_paced_and_archiving(shm_dir: Path) -> None:
    """--rate paces each client (never above it), and --archive ships the run's complete
    segments (file://, so no server is needed), which the result counts."""
    arch = shm_dir / "arch"
    result = invoke("bench", shm_dir / "wal", "--mode", "direct", "--duration", "1",
                    "--size", "64k", "--segment-size", "1m", "--keep", "4m", "--rate", "400",
                    "--archive", f"file://{arch}", "--json", "--progress", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert 0 < data["records"] <= 400 * 1 + 1
    archive = data["archive"]
    assert archive["archive_failures"] == 0 and archive["archive_segments"] >= 1
    assert archive["archive_bytes"] == archive["archive_segments"] * (1 << 20)
    assert len(os.listdir(arch)) >= archive["archive_segments"]


def test_bench_bad_size() -> None:
    result = invoke("bench", "--size", "8q")
    assert result.exit_code == 2
    assert "Invalid value for '--size'" in result.stderr and "'8q'" in result.stderr


def test_bench_bad_flush() -> None:
    result = invoke("bench", "--flush", "group:zero")
    assert result.exit_code == 2 and "each, end or group:K" in result.stderr


def test_bench_insert_slots_range_is_in_the_cli_type() -> None:
    result = invoke("bench", "--insert-slots", "300")
    assert result.exit_code == 2 and "1<=x<=256" in result.stderr


def test_bench_unknown_mode() -> None:
    result = invoke("bench", "--mode", "fast")
    assert result.exit_code == 2
    assert "Invalid value for '--mode'" in result.stderr and "buffered" in result.stderr


def test_bench_library_error_is_a_clean_message(shm_dir: Path) -> None:
    result = invoke("bench", shm_dir / "wal", "--segment-size", "3m", "--duration", "0.1")
    assert result.exit_code == 1
    assert "segment_size" in result.stderr and "power of two" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_bench_without_its_extra_says_which(shm_dir: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "hdrh.histogram", None)  # as if hdrhistogram were missing
    result = invoke("bench", shm_dir / "wal", "--duration", "0.1")
    assert result.exit_code == 1
    assert "pmemwal bench needs the 'bench' extra: pip install 'pmemwal[bench]'" in result.stderr
    assert not (shm_dir / "wal").exists()  # refused before touching anything


def test_keep_bounds_disk_use(shm_dir: Path) -> None:
    wal = shm_dir / "wal"
    result = invoke("bench", wal, "--mode", "buffered", "--duration", "1.5", "--segment-size", "1m",
                    "--keep", "4m", "--flush", "end", "--json", "--progress", "0", "--keep-wal")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["bytes"] > 16 << 20  # far more written than kept
    assert data["stats"]["segments_removed"] + data["stats"]["segments_recycled"] > 0
    assert data["background_flushes"] > 0  # flush=end: flushed behind the clients to truncate
    files = segment_files(wal)
    assert len(files) <= max_segment_files("4m", "1m"), files


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_large_records_run_on_recycled_segments(shm_dir: Path, mode: str) -> None:
    """Truncation paced by position keeps up with 1 MiB records (a clock did not): after
    the warm-up no segment is created or removed, and the directory stays bounded."""
    wal = shm_dir / "wal"
    result = invoke("bench", wal, "--mode", mode, "--size", "1m", "--segment-size", "1m",
                    "--keep", "4m", "--duration", "0.5", "--json", "--progress", "0", "--keep-wal")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    stats = data["stats"]
    assert (stats["segments_created"], stats["segments_removed"]) == (0, 0), stats
    assert data["segments_after_warm_up"] == {
        "created": 0, "recycled": stats["segments_recycled"], "removed": 0}
    assert stats["segments_recycled"] >= data["bytes"] // (2 << 20)  # around the window, reusing
    assert len(segment_files(wal)) <= max_segment_files("4m", "1m", "1m")


def test_probe_cli(shm_dir: Path) -> None:
    result = invoke("probe", shm_dir, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["fs_type"] == "tmpfs" and data["recommended_mode"] in ("buffered", "direct")
    text = invoke("probe", shm_dir)
    assert text.exit_code == 0 and re.search(r"^recommended_mode: +\w+", text.stdout, re.M)


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and pmemwal.__version__ in result.stdout


def test_no_prefault(shm_dir: Path) -> None:
    result = invoke("bench", shm_dir / "wal", "--mode", "direct", "--duration", "0.3",
                    "--no-prefault", "--progress", "0", "--segment-size", "1m", "--keep", "4m")
    assert result.exit_code == 0, result.output
    assert re.search(r"^prefault: +no$", result.stdout, re.M)
    assert re.search(r"^  segments_prefaulted: +0$", result.stdout, re.M)


@pytest.mark.parametrize("mode", ["buffered", "direct"])
@pytest.mark.parametrize("flush", ["each", "end"])
def test_a_single_client_never_waits_for_an_insertion(shm_dir: Path, mode, flush) -> None:
    """insert_wait_ns counts the appenders' flushes waiting for insertions in progress, and
    slot_wait_ns insertions waiting for a slot: with one client both stay 0, though the
    background writer flushes beside it every ms; its own waits (for the client's slot
    while it reserves) are background_wait_ns.  Counted together, this failed now and then."""
    config = bench.BenchConfig(shm_dir / "wal", mode=mode, flush=flush, duration=0.2,
                               progress_interval=0, flush_interval=0.001)
    stats = bench.run(config).stats
    assert stats["insert_wait_ns"] == stats["slot_wait_ns"] == 0, stats


def test_cold_starts_on_a_fresh_wal_and_makes_its_segments(shm_dir: Path) -> None:
    """--cold: no warm-up, so the run itself creates the segments it reaches (with
    --no-prefault, their pages are first touched by the appends); warm runs create none."""
    args = ["bench", shm_dir / "wal", "--mode", "direct", "--size", "64k", "--segment-size",
            "1m", "--keep", "4m", "--duration", "0.3", "--json", "--progress", "0"]
    cold = json.loads(invoke(*args, "--cold", "--no-prefault").stdout)
    warm = json.loads(invoke(*args).stdout)
    assert cold["config"]["cold"] and cold["segments_after_warm_up"]["created"] > 0
    assert warm["segments_after_warm_up"]["created"] == 0
    text = invoke("bench", shm_dir / "wal", "--cold", "--duration", "0.1", "--progress", "0")
    assert re.search(r"^warm-up: +none \(cold", text.stdout, re.M)


def test_a_checkpointer_thread_truncates_instead_of_the_clients(shm_dir: Path) -> None:
    wal = shm_dir / "wal"
    result = invoke("bench", wal, "--mode", "direct", "--size", "64k", "--segment-size", "1m",
                    "--keep", "4m", "--checkpoint", "0.005", "--duration", "0.5", "--json",
                    "--progress", "0", "--keep-wal")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["config"]["checkpoint"] == 0.005
    moved = data["segments_after_warm_up"]
    assert moved["recycled"] + moved["removed"] > 0     # the checkpointer truncated
    assert data["bytes"] > 16 << 20 and len(segment_files(wal)) < data["bytes"] // (1 << 20)
    text = invoke("bench", wal, "--size", "64k", "--keep", "4m", "--checkpoint", "0.005",
                  "--duration", "0.2", "--progress", "0")
    assert "a checkpointer thread truncates every 5 ms" in text.output


def test_keep_all_never_truncates_and_sets_growth_against_fresh_segments(shm_dir: Path) -> None:
    wal = shm_dir / "wal"
    result = invoke("bench", wal, "--mode", "direct", "--size", "64k", "--segment-size", "1m",
                    "--keep", "all", "--duration", "0.3", "--json", "--progress", "0",
                    "--keep-wal")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["config"]["keep_bytes"] is None
    assert data["segments_after_warm_up"]["recycled"] == data["segments_after_warm_up"]["removed"] == 0
    assert data["fresh_segment_bytes_per_s"] > 0
    assert data["stats"]["segment_make_ns"] > 0 and data["segment_making_bytes_per_s"] > 0
    assert len(segment_files(wal)) * (1 << 20) >= data["bytes"]          # everything kept
    text = invoke("bench", wal, "--size", "64k", "--keep", "all", "--duration", "0.2", "--progress", "0")
    assert "all (never truncated)" in text.output and "fresh segments:" in text.output
    assert "segments made:" in text.output


def test_the_wal_is_removed_after_the_run_unless_kept(shm_dir: Path) -> None:
    """A run's WAL can be GiBs of RAM on /dev/shm: gone after the run, and after a run
    that fails or is interrupted part-way (here: Ctrl-C in the warm-up)."""
    wal = shm_dir / "wal"
    result = invoke("bench", wal, "--duration", "0.1", "--progress", "0")
    assert result.exit_code == 0 and not wal.exists() and os.listdir(shm_dir) == []
    kept = invoke("bench", wal, "--duration", "0.1", "--progress", "0", "--keep-wal")
    assert kept.exit_code == 0 and segment_files(wal)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    config = bench.BenchConfig(wal, duration=0.1, progress_interval=0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pmemwal.tools.bench.engine._warm_up", interrupted)
        with pytest.raises(KeyboardInterrupt):
            bench.run(config)
        assert not wal.exists()
        result = invoke("bench", wal, "--duration", "0.1", "--progress", "0")
    assert result.exit_code == 130 and result.stdout == ""  # nothing measured yet
    assert result.stderr == "interrupted before there were results to print\n"
    assert not wal.exists()


def test_keep_all_leaves_a_checkpointer_nothing_and_a_bad_keep_is_refused(shm_dir: Path) -> None:
    assert bench.BenchConfig(keep_bytes="all", checkpoint=0.02).checkpoint == 0
    with pytest.raises(pmemwal.ConfigError, match="checkpoint"):
        bench.BenchConfig(checkpoint=-1)
    result = invoke("bench", shm_dir / "wal", "--keep", "lots")
    assert result.exit_code == 2 and "keep" in result.output


def interrupted_bench(wal: Path, *args: str, group: bool = False) -> subprocess.CompletedProcess:
    """``pmemwal bench`` as a child sent SIGINT once it has printed a progress line: to it
    alone (``kill -INT``), or with ``group`` to its whole process group, as Ctrl-C in a
    terminal is."""
    proc = subprocess.Popen([sys.executable, "-m", "pmemwal.tools.cli", "bench", str(wal),
                             "--duration", "120", "--progress", "0.1", "--size", "512",
                             "--keep", "4m", "--segment-size", "1m", *args],
                            env=child_env(PMEM_IS_PMEM_FORCE="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=group)
    try:
        first = proc.stderr.readline()
        assert first.startswith("progress: "), first
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, first + err)


def test_ctrl_c_stops_a_run_only_where_asked(shm_dir: Path) -> None:
    """SIGINT in the measurement (here raised by the progress callback, in the main thread):
    a library caller gets KeyboardInterrupt, as before; with ``stop_on_ctrl_c`` (the CLI's)
    the run stops early and returns what it measured, marked."""
    config = bench.BenchConfig(shm_dir / "wal", mode="buffered", size=512, duration=120,
                               keep_bytes="4m", segment_size="1m", progress_interval=0.05)
    with pytest.raises(KeyboardInterrupt):
        bench.run(config, progress=lambda p: signal.raise_signal(signal.SIGINT))
    assert os.listdir(shm_dir) == []
    lines = []

    def interrupt_once(line: dict) -> None:
        lines.append(line)
        if len(lines) == 1:
            signal.raise_signal(signal.SIGINT)

    result = bench.run(config, progress=interrupt_once, stop_on_ctrl_c=True)
    assert result.interrupted and 0 < result.elapsed < 60 and result.records > 0
    assert result.as_dict()["interrupted"] is True
    assert len(lines) == 2  # the one that interrupted, and the rest of the run's
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert os.listdir(shm_dir) == []


def test_ctrl_c_prints_the_results_so_far_and_exits_130(shm_dir: Path) -> None:
    """Ctrl-C stops the clients as the deadline would: the summary covers the time until
    then, says so, and the exit status is 130 (fio's); the WAL is removed as after a run."""
    wal = shm_dir / "wal"
    run = interrupted_bench(wal, "--mode", "buffered", "--clients", "2")
    assert run.returncode == 130, run.stdout + run.stderr
    assert "Aborted!" not in run.stderr and "Traceback" not in run.stderr
    elapsed = float(re.search(r"^elapsed: +([\d.]+) s", run.stdout, re.M).group(1))
    assert 0.1 <= elapsed < 60
    after = re.search(r"^duration: +120 s, (interrupted after ([\d.]+) s) \(Ctrl-C\)",
                      run.stdout, re.M)
    assert after and abs(float(after.group(2)) - elapsed) <= 0.051, run.stdout  # (rounded)
    assert int(re.search(r"^records: +(\d+)$", run.stdout, re.M).group(1)) > 0
    assert re.search(r"^commit latency \(usec\): +p50 ", run.stdout, re.M)
    assert after.group(1) in run.stderr  # said at once, on stderr too
    assert not wal.exists()


# ---- clients as processes (a shared WAL) -------------------------------------------


def test_bench_processes(shm_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PMEM_IS_PMEM_FORCE", "1")
    wal = shm_dir / "wal"
    result = invoke("bench", wal, "--processes", "--mode", "direct", "--clients", "2",
                    "--size", "8k", "--duration", "0.5", "--keep", "16m", "--segment-size", "1m",
                    "--progress", "0.1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["config"]["processes"] is True and data["mode"] == "direct"
    per_client = data["per_client_records"]
    assert len(per_client) == 2 and all(n > 0 for n in per_client), per_client
    assert data["records"] == sum(per_client) == data["stats"]["records"]
    assert data["append_latency_us"]["count"] == data["records"]  # both clients' histograms
    assert data["stats"]["processes"] == 3  # the two clients and the main process
    # the clients' background writers (the main process runs none), over their windows
    assert data["stats"]["background_cpu_ns"] > 0
    assert data["background_cpu_share"] == data["stats"]["background_cpu_ns"] / 1e9 / data["elapsed"]
    assert data["elapsed"] >= 0.5
    assert PROGRESS_LINE.search(result.stderr)
    assert not wal.exists()


def test_bench_processes_group_and_report(shm_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PMEM_IS_PMEM_FORCE", "1")
    lines = []
    config = bench.BenchConfig(shm_dir / "wal", mode="direct", processes=True, clients=2,
                               size=512, duration=0.3, flush="group:4", keep_bytes="16m",
                               segment_size="1m", progress_interval=0.1)
    result = bench.run(config, progress=lines.append)
    assert lines and lines[0]["records_per_s"] > 0
    assert_no_latency_escapes_the_lines(lines, result)
    assert result.flush_latency.count == sum(n // 4 for n in result.per_client_records)
    assert re.search(r"^clients: +2 processes$", result.report(), re.M)
    assert re.search(r"^background CPU: +\d+ % of a core, summed over the 2 client processes$",
                     result.report(), re.M)


def test_ctrl_c_stops_client_processes_and_combines_what_they_measured(shm_dir: Path) -> None:
    """Ctrl-C in a terminal reaches every process of the group: the client processes
    ignore it and stop when the main process tells them, each sending what it measured,
    combined into one result (as JSON here) before the exit status 130."""
    wal = shm_dir / "wal"
    run = interrupted_bench(wal, "--mode", "direct", "--processes", "--clients", "2", "--json",
                            group=True)
    assert run.returncode == 130, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "KeyboardInterrupt" not in run.stderr
    data = json.loads(run.stdout)
    assert data["interrupted"] is True and 0.1 <= data["elapsed"] < 60
    per_client = data["per_client_records"]
    assert len(per_client) == 2 and all(n > 0 for n in per_client), per_client
    assert data["records"] == sum(per_client) == data["append_latency_us"]["count"]
    assert not wal.exists()


def test_one_client_process_and_one_byte_are_singular(shm_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PMEM_IS_PMEM_FORCE", "1")
    result = invoke("bench", shm_dir / "wal", "--processes", "--mode", "direct", "--clients", "1",
                    "--size", "1", "--duration", "0.1", "--progress", "0", "--segment-size", "1m",
                    "--keep", "4m")
    assert result.exit_code == 0, result.output + result.stderr
    assert re.search(r"^clients: +1 process$", result.stdout, re.M)
    assert re.search(r"^record size: +1 byte$", result.stdout, re.M)
    assert re.search(r"^background CPU: .*summed over the 1 client process$", result.stdout, re.M)


@pytest.mark.parametrize("mode", ["buffered", "auto"])
def test_bench_processes_need_direct_mode(shm_dir: Path, mode: str) -> None:
    with pytest.raises(pmemwal.ConfigError, match="processes"):
        bench.BenchConfig(shm_dir / "wal", mode=mode, processes=True)
    result = invoke("bench", shm_dir / "wal", "--processes", "--mode", mode, "--duration", "0.1")
    assert result.exit_code == 1
    assert "processes" in result.stderr and "direct" in result.stderr
    assert "Traceback" not in result.output
    assert os.listdir(shm_dir) == []


# ---- the read benchmark (benchmarks/read_speed.py) ----------------------------------

READ_SPEED = REPO_ROOT / "benchmarks" / "read_speed.py"
# (pmemwal's reading, its peer), one table row each, for every payload size
READ_ROWS = [
    ("WAL.records()", "lmdb cursor"), ("WAL.records()", "sqlite select"),
    ("WAL.record(lsn) random", "lmdb get random"), ("WAL.scan()", "lmdb cursor"),
    ("WAL.scan()", "segment copy (ceiling)"), ("WAL.read_many(4096 random)", "lmdb get random"),
    ("Log.entries()", "lmdb cursor"), ("Log.entry(i) random", "lmdb get random"),
    ("Log.entry_batches()", "lmdb cursor"), ("Log.entries_at(4096 random)", "lmdb get random"),
]
# the readings of an API that may not be there yet: "n/a" without it
READ_NEEDS = {"WAL.scan()": (pmemwal.WAL, "scan"),
              "WAL.read_many(4096 random)": (pmemwal.WAL, "read_many"),
              "Log.entry_batches()": (pmemwal.Log, "entry_batches"),
              "Log.entries_at(4096 random)": (pmemwal.Log, "entries_at")}
RATE = re.compile(r"^\d+(\.\d+)?( [kM])?$")


def table_rows(text: str) -> list[list[str]]:
    """The cells of a markdown table's body rows."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| pmemwal |")]


def test_read_speed_quick_names_every_reading(shm_dir: Path) -> None:
    """--quick runs every reading at each size, names each beside its peer with rates and a
    ratio (n/a where the API is missing), and leaves nothing in --dir but its JSON."""
    pytest.importorskip("lmdb")
    out = shm_dir / "reads.json"
    proc = subprocess.run([sys.executable, str(READ_SPEED), "--quick", "--dir", str(shm_dir),
                           "--json", str(out)], env=child_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^CPU: .+; load average [\d.]+ [\d.]+ [\d.]+;", proc.stdout, re.M)
    sections = re.split(r"^(\d+ (?:B|KiB|MiB)) payloads, [\d,]+ records$", proc.stdout, flags=re.M)
    assert sections[1::2] == ["64 B", "8 KiB", "1 MiB"]
    for body in sections[2::2]:
        rows = table_rows(body)
        # LMDB's rows name the faster of its two ways, views or copies
        assert [(r[0], re.sub(r" \((views|bytes)\)$", "", r[3])) for r in rows] == READ_ROWS
        assert all(r[3].endswith(("(views)", "(bytes)")) for r in rows if "lmdb" in r[3])
        for reading, ours, _, peer, peer_rate, _, ratio, _ in rows:
            owner, attr = READ_NEEDS.get(reading, (pmemwal.WAL, "records"))
            if hasattr(owner, attr):
                assert RATE.match(ours) and float(ratio) > 0, (reading, ours, ratio)
            else:
                assert ours == ratio == "n/a", reading
            assert RATE.match(peer_rate), (peer, peer_rate)
    report = json.loads(out.read_text())
    assert [s["size"] for s in report["sizes"]] == [64, 8192, 1 << 20]
    for size in report["sizes"]:
        readings = size["readings"]
        assert readings["WAL.records()"]["records"] == size["records"] > 0
        assert readings["segment copy (ceiling)"]["bytes"] > size["records"] * size["size"]
        for reading, (owner, attr) in READ_NEEDS.items():
            assert (readings[reading] is None) != hasattr(owner, attr), reading
    assert os.listdir(shm_dir) == ["reads.json"]  # its stores removed


def test_fresh_refuses_a_wal_holding_records_it_did_not_make(shm_dir: Path) -> None:
    """A WAL someone else wrote is not the bench's to delete: refused, with the flag that
    overrides it named, and left whole; --force deletes it; a WAL an earlier run kept (its
    own, marked) and an empty one go without it."""
    path = shm_dir / "precious"
    with pmemwal.open(path, mode="buffered") as wal:
        wal.append(b"keep me", flush=True)
    result = invoke("bench", path, "--mode", "buffered", "--duration", "0.1")
    assert result.exit_code == 1 and "--force" in result.stderr and "holds records" in result.stderr
    with pmemwal.open(path, mode="buffered") as wal:
        assert [r.payload for r in wal.records()] == [b"keep me"]
    result = invoke("bench", path, "--mode", "buffered", "--duration", "0.1", "--force",
                    "--keep-wal")
    assert result.exit_code == 0, result.output + result.stderr
    with pmemwal.open(path, mode="buffered") as wal:
        assert b"keep me" not in {r.payload for r in wal.records()}
    result = invoke("bench", path, "--mode", "buffered", "--duration", "0.1")  # the bench's own
    assert result.exit_code == 0, result.output + result.stderr
    assert not path.exists()
    pmemwal.open(path, mode="buffered").close()  # a WAL with no record
    assert invoke("bench", path, "--mode", "buffered", "--duration", "0.1").exit_code == 0
