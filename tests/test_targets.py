"""The benchmark targets (pmemwal.tools.targets): each one runs a short workload, counts what it
wrote, measures it, and leaves nothing but its empty directory behind.

A target whose peer is not installed here is skipped with the reason its
``available()`` gives.  Runs are 0.3 s with small pools and maps, so the file
takes about 15 s; PostgreSQL (initdb, a 1 s pgbench) is one test.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

import pmemwal
from pmemwal.tools.bench import Latency
from pmemwal.tools.targets import (EXTRA_TARGETS, MARKER, TARGET_NAMES, RunResult, TargetError,
                                   Workload, common, get_target, libpmemlog, pmemwal_modes)

# small storage, so that set-up is quick and wrapping happens within 0.3 s
SMALL = {"libpmemlog": {"pool_size": "16m"}, "fdatasync": {"file_size": "4m"},
         "lmdb": {"map_size": "64m"}, "buffered": {"segment_size": "1m"},
         "direct": {"segment_size": "1m"}}
TWO_CLIENTS = {"fdatasync", "sqlite", "lmdb", "libpmemlog", "buffered"}
THREAD_TARGETS = [n for n in TARGET_NAMES if n != "postgres"]


def available_or_skip(name: str):
    target = get_target(name)
    reason = target.available()
    if reason:
        pytest.skip(f"{name}: {reason}")
    return target


def check(result: RunResult, name: str, workload: Workload) -> None:
    assert result.target == name
    assert result.records > 0
    assert result.bytes == result.records * workload.size
    assert result.elapsed > 0
    assert result.records_per_s == pytest.approx(result.records / result.elapsed)
    assert result.mb_per_s == pytest.approx(result.bytes / result.elapsed / 1e6)
    assert isinstance(result.extra.get("version"), str) and result.extra["version"]
    if result.latency_us:
        assert set(result.latency_us) == {"p50", "p99", "p999", "mean"}
        lat = result.latency_us
        assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"]
        assert lat["mean"] > 0
    assert sorted(os.listdir(workload.path)) == [], "the target left files behind"


def no_process_mentions(path: str) -> bool:
    """True when no process's command line names ``path`` (nothing left running)."""
    needle = os.fsencode(path)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                return False
    return True


@contextlib.contextmanager
def time_limit(seconds: int):
    """Fail the test (raising in the main thread) if it runs past ``seconds``."""
    def expired(signum, frame):
        raise TimeoutError(f"the test ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- names and workloads ---------------------------------------------------------------------

def test_target_names():
    assert TARGET_NAMES == ("buffered", "direct", "libpmemlog", "fdatasync", "sqlite", "rocksdb",
                            "lmdb", "postgres")
    for name in TARGET_NAMES + EXTRA_TARGETS:
        target = get_target(name)
        assert target.name == name
        assert target.__doc__ and len(target.__doc__) > 100
        reason = target.available()
        assert reason is None or (isinstance(reason, str) and "\n" not in reason)
        assert isinstance(target.version(), str)


def test_unknown_target_lists_the_valid_names():
    with pytest.raises(pmemwal.ConfigError) as info:
        get_target("nope")
    for name in TARGET_NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [
    {"flush": "sometimes"}, {"flush": "group:0"}, {"flush": "group:"}, {"clients": 0},
    {"clients": 1.5}, {"size": 0}, {"size": "8q"}, {"duration": 0}, {"duration": float("nan")},
    {"params": [1]}, {"path": ""},
])
def test_bad_workload_raises_config_error(tmp_path, bad):
    fields = {"path": str(tmp_path / "w"), "clients": 1, "size": 64, "duration": 0.1, **bad}
    with pytest.raises(pmemwal.ConfigError):
        Workload(**fields)


def test_workload_normalizes():
    w = Workload(Path("/dev/shm/x"), 2, "8k", 1, " Group:4 ")
    assert (w.path, w.size, w.flush, w.flush_every, w.params) == ("/dev/shm/x", 8192, "group:4",
                                                                   4, {})


@pytest.mark.parametrize("name", THREAD_TARGETS)
def test_unknown_parameter_raises_config_error(shm_tmp, name):
    target = available_or_skip(name)
    with pytest.raises(pmemwal.ConfigError, match="bogus"):
        target.run(Workload(str(shm_tmp / "t"), 1, 64, 0.1, params={"bogus": 1}))
    assert not (shm_tmp / "t").exists()


def test_refuses_a_directory_it_did_not_make(shm_tmp):
    (shm_tmp / "precious").write_text("keep me")
    with pytest.raises(pmemwal.ConfigError, match="refusing"):
        get_target("fdatasync").run(Workload(str(shm_tmp), 1, 64, 0.1))
    assert (shm_tmp / "precious").read_text() == "keep me"


def test_reuses_a_directory_a_crashed_run_left(shm_tmp):
    path = shm_tmp / "t"
    path.mkdir()
    (path / MARKER).write_text("")
    (path / "client-0.dat").write_bytes(b"old")
    w = Workload(str(path), 1, 64, 0.1, params=SMALL["fdatasync"])
    check(get_target("fdatasync").run(w), "fdatasync", w)


# ---- every target runs ----------------------------------------------------------------------

@pytest.mark.parametrize("name", THREAD_TARGETS)
def test_target_runs(shm_tmp, name):
    target = available_or_skip(name)
    path = str(shm_tmp / name)
    params = SMALL.get(name, {})
    small_each = Workload(path, 1, 64, 0.3, "each", params)
    check(target.run(small_each), name, small_each)
    # the same directory again: it is reusable
    clients = 2 if name in TWO_CLIENTS else 1
    large_end = Workload(path, clients, 8192, 0.3, "end", params)
    result = target.run(large_end)
    check(result, name, large_end)
    if "per_client_records" in result.extra:
        assert len(result.extra["per_client_records"]) == clients
        assert sum(result.extra["per_client_records"]) == result.records
    assert no_process_mentions(path)


@pytest.mark.parametrize("name", ["sqlite", "rocksdb", "lmdb", "direct"])
def test_group_commit(shm_tmp, name):
    target = available_or_skip(name)
    w = Workload(str(shm_tmp / name), 2, 512, 0.3, "group:3", SMALL.get(name, {}))
    check(target.run(w), name, w)


def test_pmemwal_target_reports_the_wal(shm_tmp):
    w = Workload(str(shm_tmp / "b"), 1, 64, 0.2, "each", {"insert_slots": 4})
    result = get_target("buffered").run(w)
    check(result, "buffered", w)
    assert result.extra["mode"] == "buffered"
    assert result.extra["persist_method"] == "fdatasync"
    assert result.extra["insert_slots"] == 4
    assert result.extra["stats"]["records"] == result.records


def test_pmemwal_target_recycles_after_warm_up(shm_tmp):
    w = Workload(str(shm_tmp / "d"), 1, 1 << 20, 0.3, "each",
                 {"segment_size": "1m", "keep_bytes": "4m"})
    result = get_target("direct").run(w)
    check(result, "direct", w)
    segments = result.extra["segments_after_warm_up"]
    assert segments["created"] == segments["removed"] == 0 < segments["recycled"], segments


def test_libpmemlog_missing_is_reported_not_raised(monkeypatch, shm_tmp):
    monkeypatch.setattr(libpmemlog, "_PMEMLOG_SONAME", "/nonexistent/libpmemlog.so.1")
    libpmemlog._pmemlog.cache_clear()
    try:
        target = get_target("libpmemlog")
        reason = target.available()
        assert reason and "libpmemlog" in reason
        assert target.version() == ""
        with pytest.raises(TargetError, match="cannot run here"):
            target.run(Workload(str(shm_tmp / "t"), 1, 64, 0.1))
    finally:
        libpmemlog._pmemlog.cache_clear()


def test_missing_module_is_a_one_line_reason():
    reason = common._missing("no_such_module_for_pmemwal", "no-such-dist")
    assert reason and "not installed" in reason and "\n" not in reason


def test_postgres(shm_tmp):
    target = available_or_skip("postgres")
    os.chmod(shm_tmp, 0o711)  # as root the cluster runs as postgres, which must reach it
    path = str(shm_tmp / "pg")
    w = Workload(path, 2, 64, 0.3, "each")
    with time_limit(120):
        result = target.run(w)
    check(result, "postgres", w)
    assert result.extra["synchronous_commit"] == "on"
    assert result.extra["transactions"] == result.records
    assert result.latency_us
    assert no_process_mentions(path)


# ---- helpers ----------------------------------------------------------------------------------

def test_combined_latency_adds_flush_to_flushed_records():
    append, flush = HdrHistogram(1, 60_000_000_000, 3), HdrHistogram(1, 60_000_000_000, 3)
    append.record_value(1000, 900)
    flush.record_value(5000, 100)  # group:9 shape: one record in ten is flushed
    a = Latency(count=900, mean=1.0, stddev=0, min=1, p50=1, p99=1, p999=1, max=1)
    f = Latency(count=100, mean=5.0, stddev=0, min=5, p50=5, p99=5, p999=5, max=5)
    lat = pmemwal_modes._combined_latency(append, flush, a, f)
    assert lat["mean"] == pytest.approx(1.0 + 5.0 * 100 / 900)
    assert lat["p50"] == pytest.approx(1.0, rel=0.01)  # an append alone
    assert lat["p99"] == pytest.approx(6.0, rel=0.01)  # append + flush
    assert pmemwal_modes._combined_latency(append, HdrHistogram(1, 10, 1), a, None)["p99"] == 1


def test_run_result_rates():
    r = RunResult("x", records=10, bytes=10_000_000, elapsed=2.0, latency_us={}, extra={})
    assert (r.records_per_s, r.mb_per_s) == (5.0, 5.0)
    assert RunResult("x", 0, 0, 0.0, {}, {}).records_per_s == 0.0
    assert r.as_dict()["records_per_s"] == 5.0
    assert np.isfinite(r.as_dict()["mb_per_s"])


def test_direct_procs_target(shm_tmp, monkeypatch):
    monkeypatch.setenv("PMEM_IS_PMEM_FORCE", "1")
    target = get_target("direct-procs")
    assert "direct-procs" in EXTRA_TARGETS and "direct-procs" not in TARGET_NAMES
    assert target.params == get_target("direct").params and "processes" not in target.params
    # keep 16m: with 4m, a client process stalled ~10 ms may find a segment truncated
    # and recycled by the other before it opens it (ENOENT; see the shared WAL)
    w = Workload(str(shm_tmp / "dp"), 2, 8192, 0.5, "each",
                 {"segment_size": "1m", "keep_bytes": "16m"})
    result = target.run(w)
    check(result, "direct-procs", w)
    assert result.extra["processes"] is True and result.extra["mode"] == "direct"
    per_client = result.extra["per_client_records"]
    assert len(per_client) == 2 and all(n > 0 for n in per_client), per_client
    assert result.extra["stats"]["processes"] == 3
    assert result.extra["intervals"]
    assert get_target("direct").run(Workload(str(shm_tmp / "d"), 1, 64, 0.1)).extra[
        "processes"] is False
