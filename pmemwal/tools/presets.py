"""Presets: the experiments of the seeds (the PostgreSQL threads pmemwal grew from) as
``pmemwal compare`` grids, so that one command reruns each on any machine.

    pmemwal compare /dev/shm/cmp --preset insert-slots --plot slots.png
    pmemwal compare /dev/shm/cmp --preset buffer-mapping --full

A preset fills every option of ``compare`` that the command line leaves out: targets,
params, clients, record sizes, runs, duration, baseline and counter columns.  The
default scale finishes in a few minutes on 2 cores; ``--full`` is the seed's own
scale (its client counts and run lengths), for a machine that has the cores.

docs/EXPERIMENTS.md puts each preset's results on this project's machine beside the
seed's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pmemwal.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    """A seed's experiment: the grid at the default scale, and what ``--full`` changes."""

    name: str
    seed: str  # the thread it reruns
    measures: str  # one line, in the user's terms
    grid: dict  # CompareConfig fields
    full: dict = field(default_factory=dict)  # CompareConfig fields at the seed's scale
    emulate_pmem: bool = False  # direct mode persists by cache flush: on tmpfs, emulate pmem

    def config(self, full: bool = False) -> dict:
        """The CompareConfig fields this preset sets (``full``: at the seed's scale)."""
        return {**self.grid, **(self.full if full else {}), "preset": self.name}


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        name="nvwal",
        seed="003, \"[PoC] Non-volatile WAL buffer\" (2020)",
        measures="segments mapped as the WAL buffer, persisted by cache flush (pmem) or by msync "
                 "(as without DAX), against the WAL buffer ring written with pwrite + fdatasync",
        grid={"targets": ["buffered", "direct"], "params": {"persist": ["pmem", "msync"]},
              "clients": [1, 2, 4], "sizes": [256, 8192], "runs": 3, "duration": 1.0,
              "baseline": "buffered"},
        full={"clients": [1, 16, 32, 64, 96], "duration": 300.0},  # 5-minute pgbench runs
        emulate_pmem=True),
    Preset(
        name="insert-slots",
        seed="001, \"Make NUM_XLOGINSERT_LOCKS configurable\" (2024)",
        measures="insertion slots: time spent waiting for a slot against time flushes spend "
                 "waiting for insertions in progress",
        # Slots from fewer than the clients to as many: the trade-off needs clients that
        # outnumber the slots (the seed: 32 and 64 clients on 8 to 128 locks).  Records of
        # 8 KiB and more, whose appends give the GIL up and so overlap.
        grid={"targets": ["buffered"], "params": {"insert_slots": [1, 2, 4, 8]},
              "clients": [4, 8], "sizes": [8192, 65536], "runs": 3, "duration": 1.0,
              "columns": ["slot_wait_ns", "insert_wait_ns"],
              "baseline": "buffered insert_slots=8"},
        full={"params": {"insert_slots": [8, 16, 32, 64, 128]}, "clients": [32, 64],
              "duration": 30.0}),  # pgbench -c 32 / 64 -T 30
    Preset(
        name="buffer-mapping",
        seed="000, \"Get rid of WALBufMappingLock\" (2025)",
        measures="the WAL buffer ring (buffered) against no WAL buffers at all (direct) by "
                 "clients x record size, 6 runs without the highest and lowest, as ratios",
        grid={"targets": ["buffered", "direct"], "clients": [1, 2, 4],
              "sizes": [8192, 65536, 1 << 20], "runs": 6, "duration": 1.0,
              "baseline": "buffered"},
        full={"clients": [1, 4, 8, 16, 32, 48, 64, 96, 128, 160, 196], "duration": 30.0},
        emulate_pmem=True),
    Preset(
        name="governor",
        seed="002, \"refactoring relation extension ... faster COPY\" (2023)",
        measures="the environment check: the CPU governor and frequency before a short "
                 "comparison, and a warning where its runs ran under different ones",
        grid={"targets": ["buffered", "direct"], "clients": [1, 2], "sizes": [8192],
              "runs": 6, "duration": 0.5, "baseline": "buffered"},
        full={"clients": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "duration": 10.0},
        emulate_pmem=True),
)}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ConfigError naming the valid ones otherwise."""
    preset = PRESETS.get(str(name).strip().lower())
    if preset is None:
        raise ConfigError(f"preset {name!r}: valid presets are {', '.join(PRESETS)}")
    return preset
