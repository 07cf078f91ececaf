"""A follower of a dead writer, under power loss (the follow workload itself,
``FollowWorkload``, is powerloss.py's).

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
from pmemwal.tools.recovery_warnings import recovery_warnings


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
        failures: list[str] = []
        warned = 0
        for _ in range(images):
            with recovery_warnings() as said:
                verdict, detail = work.check(shadow.image(yielded[-1] + 1, "after the kill"),
                                             root / "image")
            warned += len(said)
            verdicts[verdict] += 1
            if verdict not in ("ok", "beyond"):
                failures.append(detail)
        shadow.stop_following()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"verdicts": dict(verdicts), "failures": failures[:3], "published": published,
            "written": written, "yielded_end": yielded[-1] + 1, "recovery_warnings": warned}


def _shm() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None
