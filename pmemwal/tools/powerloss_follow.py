"""The follow workload of the power-loss tool: crash images held to what followers were shown.

Followers in other processes (pmemwal.follow, pmemwal.open(readonly=True)) read every record
below the durable LSN the writers publish in the FOLLOW file, and may act on it at once: a
record they were shown must survive a power cut as an acknowledged one does.  The wal
workload holds each image to what the calls had acknowledged, which a writer that publishes
too early (before its sync) still keeps; the follow workload (``FollowWorkload``, ``pmemwal
powerloss --workload follow``) runs the same writers and holds each image to the durable LSN
published when it was taken, read through the writer's mapping of the FOLLOW file before the
image: every record below it must come back, and recovery must end at or past it.

``follower_of_a_dead_writer``: a writer dies with records no sync covered, a follower reads
the WAL before any writer opens it again, then the power goes; each image must hold what the
follower yielded (on the traced core).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

import pmemwal
from pmemwal import _core
from pmemwal.tools.powerloss import SEGMENT_SIZE, Workload, _shadow_for
from pmemwal.tools.shadow import Image


class FollowWorkload(Workload):
    """The wal workload, each image's horizon the durable LSN published for followers."""

    promise = "published for followers"

    def __init__(self, wal: pmemwal.WAL, seed: int) -> None:
        super().__init__(wal, seed)
        self.published = 0  # the FOLLOW file's durable LSN, as last read
        self.ahead = 0      # images checked whose horizon lay past what the calls acknowledged
        self._acked_at: dict[int, int] = {}  # horizon -> what was acknowledged when it was read

    def horizon(self, acked: int) -> int:
        """The published durable LSN now: a follower may have read everything below it.
        (Between a writer's kill and its successor's open no writer maps the file: what the
        dead one published last holds.)"""
        follow = self.wal._follow
        if follow is not None:
            self.published = follow.durable_lsn
        self._acked_at.setdefault(self.published, self.acked_below)
        return self.published

    def check(self, image: Image, directory: Path) -> tuple[str, str]:
        self.ahead += image.acked > self._acked_at.get(image.acked, image.acked)
        return super().check(image, directory)


def follower_of_a_dead_writer(images: int = 10, seed: int = 2) -> dict:
    """A direct-mode (msync) writer appends, flushed and not, and dies; before any writer
    opens the WAL again, a follower reads it; then the power goes.  Each of ``images``
    images must hold every record the follower yielded (the verdicts, counted).

    The death is the kernel's part of a SIGKILL: the writer's lock on LOCK dropped, its
    pages left in the page cache as they are (the traced syncs made only what the flushes
    covered durable)."""
    if not _core.TRACED:
        raise RuntimeError("not the traced core: run with PMEMWAL_TRACED_CORE=1")
    root = Path(tempfile.mkdtemp(prefix="pmemwal-follow-powerloss-", dir=_shm()))
    try:
        wal = pmemwal.open(root / "wal", mode="direct", segment_size=SEGMENT_SIZE,
                           background=False, prepare_segments=0)
        work = Workload(wal, seed)
        shadow = _shadow_for("msync", wal, np.random.default_rng(seed), 0.0, lambda where: None)
        shadow.follow_files()
        steps = random.Random(seed)
        for _ in range(120):
            work.step(steps)
        work._append(wal, steps, 5, flush=False)  # (the last records: unflushed)
        assert wal._follow is not None
        published, written = wal._follow.durable_lsn, wal.insert_lsn
        wal._forsake()  # the writer dies: its descriptors close, its liveness lock on LOCK
        wal._dir.close()  # goes with them
        with pmemwal.follow(root / "wal", timeout=0) as follower:
            yielded = [record.lsn for record in follower]
        verdicts: Counter[str] = Counter()
        failures = []
        for _ in range(images):
            verdict, detail = work.check(shadow.image(yielded[-1] + 1, "after the kill"),
                                         root / "image")
            verdicts[verdict] += 1
            if verdict not in ("ok", "beyond"):
                failures.append(detail)
        shadow.stop_following()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"verdicts": dict(verdicts), "failures": failures[:3], "published": published,
            "written": written, "yielded_end": yielded[-1] + 1}


def _shm() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None
