"""``pmemwal probe --measure``: run both modes briefly on a file system and keep the choice.

The probe's rule (direct mode only on DAX persistent memory, buffered elsewhere) is a
rule, not a measurement: on tmpfs ``msync`` writes nothing back, and on a disk file system
which mode wins depends on the record size and the device.  ``measure_modes`` runs
``pmemwal bench`` in buffered and direct mode (one client, flush after each record) at a
few record sizes, alternating the modes, in a scratch WAL under the path, and chooses the
mode whose geometric mean of records/s is higher.  ``pmemwal.device.store_calibration``
keeps the choice per file system, and ``mode="auto"`` follows it from then on where the
mapping is not persistent memory (pmemwal.device.resolve_mode).
"""

from __future__ import annotations

import datetime
import math
import os
import tempfile
from dataclasses import dataclass

import pmemwal
from pmemwal import device
from pmemwal.tools import bench
from pmemwal.tools.harness import size_text

MODES = ("buffered", "direct")


@dataclass
class Measurement:
    """records/s per record size and mode; the choice and the rule's beside it."""

    path: str
    fs_type: str | None
    rates: dict[int, dict[str, float]]
    rule_mode: str
    seconds: float

    @property
    def ratio(self) -> float:
        """Geometric mean over the sizes of direct / buffered records/s."""
        logs = [math.log(r["direct"] / r["buffered"]) for r in self.rates.values()]
        return math.exp(sum(logs) / len(logs))

    @property
    def mode(self) -> str:
        return "direct" if self.ratio > 1 else "buffered"

    def entry(self) -> dict:
        """What ``store_calibration`` keeps."""
        return {"mode": self.mode, "direct_over_buffered": round(self.ratio, 3),
                "rates": {str(k): v for k, v in self.rates.items()}, "rule_mode": self.rule_mode,
                "fs_type": self.fs_type, "seconds": self.seconds, "pmemwal": pmemwal.__version__,
                "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}

    def text(self) -> str:
        lines = [f"measured on {self.path} ({self.fs_type}): 1 client, flush after each record, "
                 f"{self.seconds:g} s per run, 2 runs per point",
                 f"{'size':>8}  {'buffered rec/s':>15}  {'direct rec/s':>13}  direct/buffered"]
        for size, r in self.rates.items():
            lines.append(f"{size_text(size):>8}  {r['buffered']:>15,.0f}  "
                         f"{r['direct']:>13,.0f}  {r['direct'] / r['buffered']:>15.2f}")
        lines.append(f"measured choice: {self.mode} ({self.ratio:.2f}x, geometric mean); "
                     f"the rule's: {self.rule_mode}")
        return "\n".join(lines)


def measure_modes(path: str, seconds: float = 1.0, sizes: tuple[int, ...] = (8192, 65536),
                  rounds: int = 2) -> Measurement:
    """Run both modes at each size ``rounds`` times, alternating, in a scratch WAL under
    ``path`` (removed after); the mean records/s of each point."""
    path = os.path.abspath(path)
    made, missing = [], path  # the directories made here to measure in, deepest first
    while not os.path.exists(missing):
        made.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(path, exist_ok=True)
    try:
        probe = pmemwal.probe(path)
        runs: dict[int, dict[str, list[float]]] = {s: {m: [] for m in MODES} for s in sizes}
        with tempfile.TemporaryDirectory(prefix=".pmemwal-measure-", dir=path) as scratch:
            for _ in range(rounds):
                for size in sizes:
                    for mode in MODES:
                        config = bench.BenchConfig(os.path.join(scratch, "wal"), mode=mode,
                                                   size=size, duration=seconds,
                                                   segment_size=4 << 20, keep_bytes=16 << 20,
                                                   progress_interval=0)
                        runs[size][mode].append(bench.run(config).records_per_s)
    finally:
        for directory in made:  # probing a path makes nothing: neither does measuring there
            os.rmdir(directory)
    rates = {s: {m: sum(v) / len(v) for m, v in by_mode.items()} for s, by_mode in runs.items()}
    return Measurement(path=os.path.abspath(path), fs_type=probe.fs_type, rates=rates,
                       rule_mode=probe.recommended_mode, seconds=seconds)


def save(measurement: Measurement) -> str:
    """Keep the choice for the file system measured; the calibration file."""
    return device.store_calibration(measurement.path, measurement.entry())
