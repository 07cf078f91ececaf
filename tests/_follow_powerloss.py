"""Power loss held to what followers could have seen (run on the traced core, by
tests/_follow_child.py).

The simulator (pmemwal.tools.powerloss, pmemwal.tools.shadow) keeps, per segment, what a power
cut would leave: on the traced core only what the WAL's own syncs covered (page-cache modes)
or what its flushes and fences persisted (pmem).  At each of its crash points it takes an
image, recovers it and holds it to a horizon.  Here the horizon is not what the calls
returned but the durable LSN the writers had published in the FOLLOW file at that moment,
read before the image is taken: a follower may have read and acted on every record below it,
so each of them must come back from the image, and recovery must end at or past it.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import pmemwal
from pmemwal import _core
from pmemwal.tools import mutants
from pmemwal.errors import WALError
from pmemwal.tools.powerloss import (ROUND_STEPS, SEGMENT_SIZE, Workload, _shadow_for,
                                     _write_image, held_against)


class PublishedWorkload(Workload):
    """The wal workload, its images held to the FOLLOW file's durable LSN."""

    ahead = 0  # images whose published LSN lay past what the calls had acknowledged

    def horizon(self, acked: int) -> int:
        assert self.wal._follow is not None  # (every writer maps it)
        published = self.wal._follow.durable_lsn
        self.ahead += published > self.acked_below
        return published

    def check(self, image, directory: Path) -> tuple[str, str]:
        """The image recovered with its damage cut off (on_corruption="truncate": a
        recovery that refuses an image is the other power-loss tests' concern), held
        against the published LSN: "lost" when a record below it did not come back."""
        _write_image(image, directory)
        try:
            with pmemwal.open(directory, mode="buffered", create=False, background=False,
                              on_corruption="truncate") as wal:
                recovered = [(r.lsn, bytes(r.payload)) for r in wal.records()]
                end = wal.insert_lsn
        except WALError as exc:
            return "error", f"recovery raised {type(exc).__name__}: {exc}"
        return held_against(recovered, end, image.acked, self)


def run_published(mode: str, images: int, threads: int = 4, seed: int = 1,
                  mutation: str | None = None, streaming: bool = False,
                  crash_rate: float = 0.2) -> dict:
    """``images`` crash images of ``threads`` writers in ``mode`` ("pmem" or "msync"), each
    checked against the published LSN; the verdicts, counted."""
    assert _core.TRACED, "run with PMEMWAL_TRACED_CORE=1"
    if mutation:
        mutants.apply(mutation)
    root = Path(tempfile.mkdtemp(prefix="pmemwal-follow-powerloss-", dir="/dev/shm"))
    verdicts: Counter[str] = Counter()
    failures: list[str] = []
    queue: list = []
    try:
        options: dict[str, Any] = {"mode": "direct", "segment_size": SEGMENT_SIZE,
                                   "background": False, "recycle_segments": 1,
                                   "prepare_segments": 0}
        work = PublishedWorkload(pmemwal.open(root / "wal", **options), seed)
        shadow = _shadow_for(mode, work.wal, np.random.default_rng(seed), crash_rate,
                             lambda where: queue.append(shadow.image(work.horizon(0), where)),
                             streaming=streaming, mutations=mutants.core_mask())
        shadow.follow_files()
        if mode != "pmem":
            shadow.crash_rate = crash_rate  # (a crash point per sync, see run_power_loss)
        rounds = 0
        while sum(verdicts.values()) < images:
            work.run_threads(threads, ROUND_STEPS, seed + rounds)
            if mode != "pmem":
                current = work.wal.insert_lsn // work.wal.segment_size
                shadow.remember((current - 1, current))
            if shadow.errors:
                raise RuntimeError(shadow.errors[0])
            if work.retain():
                shadow.settle()
            for image in queue[:images - sum(verdicts.values())]:
                verdict, detail = work.check(image, root / "image")
                verdicts[verdict] += 1
                if verdict not in ("ok", "beyond"):
                    failures.append(f"{image.where}: {verdict}: {detail}")
            queue.clear()
            rounds += 1
        shadow.stop_following()
        work.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"verdicts": dict(verdicts), "failures": failures[:5], "ahead": work.ahead,
            "written": work.written}


def follower_after_a_kill(images: int = 10, seed: int = 2) -> dict:
    """A direct-mode (msync) writer appends, flushed and not, and dies; before any writer
    opens the WAL again, a follower reads it; then the power goes.  Each of ``images``
    images must hold every record the follower yielded.

    The death is the kernel's part of a SIGKILL: the writer's lock on LOCK dropped, its
    pages left in the page cache as they are (the traced syncs made only what the flushes
    covered durable)."""
    assert _core.TRACED, "run with PMEMWAL_TRACED_CORE=1"
    root = Path(tempfile.mkdtemp(prefix="pmemwal-follow-powerloss-", dir="/dev/shm"))
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
