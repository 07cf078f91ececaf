"""Simulated power loss (pmemwal.tools.powerloss): crash images recovered without loss or garbage.

The short version of ``pmemwal powerloss``; each mode crashes a live workload
a hundred times.  The last tests break the persist model on purpose and
check that the images then do lose acknowledged records: the check can fail.
"""

from __future__ import annotations

import json

import pytest

from conftest import cli_runner
from pmemwal.tools import powerloss
from pmemwal.tools.cli import main
from pmemwal.tools.powerloss import DurableShadow, PmemTracer, run_power_loss

IMAGES = 100


@pytest.mark.parametrize("mode, threads", [("pmem", 1), ("pmem", 4), ("msync", 1), ("buffered", 1)])
def test_crash_images_keep_every_acknowledged_record(mode: str, threads: int, shm_tmp) -> None:
    report = run_power_loss(mode, IMAGES, threads=threads, seed=7, directory=str(shm_tmp))
    assert report.failures == []
    assert report.ok
    assert report.images == IMAGES
    assert report.records_written > 100 and report.flushed_bytes > 0
    assert report.segments_recycled > 0  # images met stale pages of an earlier cycle
    if mode == "pmem":
        assert set(report.crash_points) == {"flush", "before drain"}
    else:
        assert set(report.crash_points) == {"mid-flush", "between"}
        assert set(report.grains) == set(powerloss.PAGE_CACHE_GRAINS)
    assert report.recovered_beyond_ack > 0  # unacknowledged records can survive, intact


def test_a_core_that_skips_flushes_loses_records(shm_tmp, monkeypatch) -> None:
    """Drop one pmem_flush in three: acknowledged records go missing (or recovery,
    finding valid records past the damage, refuses with CorruptionError)."""
    calls = iter(range(1 << 30))
    flush = PmemTracer._on_flush

    def forgetful(self, addr, length):
        if next(calls) % 3:
            flush(self, addr, length)

    monkeypatch.setattr(PmemTracer, "_on_flush", forgetful)
    report = run_power_loss("pmem", 60, seed=3, directory=str(shm_tmp))
    assert not report.ok
    assert report.lost + report.recovery_errors > 0
    assert any("acknowledged" in f or "CorruptionError" in f for f in report.failures)


@pytest.mark.parametrize("mode", ["msync", "buffered"])
def test_a_flush_that_syncs_nothing_loses_records(mode: str, shm_tmp, monkeypatch) -> None:
    """A flush that returns without making anything durable: acknowledgements are lies."""
    monkeypatch.setattr(DurableShadow, "settle", lambda self: None)
    report = run_power_loss(mode, 60, seed=3, directory=str(shm_tmp))
    assert report.lost + report.recovery_errors > 0


def test_unknown_mode_and_threads_outside_pmem_are_refused() -> None:
    with pytest.raises(ValueError, match="mode="):
        run_power_loss("dax", 1)
    with pytest.raises(ValueError, match="threads="):
        run_power_loss("buffered", 1, threads=2)


def test_cli_reports_every_setup_as_json() -> None:
    result = cli_runner().invoke(main, ["powerloss", "--images", "5", "--setups", "pmem-threads,buffered",
                                       "--json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)["reports"]
    assert [(r["mode"], r["threads"], r["images"], r["ok"]) for r in reports] == [
        ("pmem", 4, 5, True), ("buffered", 1, 5, True)]


def test_cli_refuses_an_unknown_setup() -> None:
    result = cli_runner().invoke(main, ["powerloss", "--setups", "dax"])
    assert result.exit_code == 2
    assert "unknown setup" in result.output
