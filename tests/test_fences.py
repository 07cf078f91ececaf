"""Streaming stores are fenced whatever libpmem's drain does (issue 27, item 1).

Where the CPU's flush instruction orders itself (CLFLUSH: neither CLWB nor CLFLUSHOPT, as on
pre-Skylake Xeons with NVDIMM-N, or ``PMEM_NO_CLWB=1 PMEM_NO_CLFLUSHOPT=1``), libpmem makes
``pmem_drain`` an empty function: it fences its own streaming copies itself.  pmemwal's fused
CRC+copy streams with movnt, so each insertion that streamed must be followed by an sfence of
its own before its slot is freed (a flush in another thread may then report it durable).
The core counts those fences (``stream_fences``).  Each configuration runs in a child process,
as libpmem reads its environment once.  The power-loss simulator does not trace streaming
stores yet (issue 28): this checks that the fence is issued, not what a missing one loses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pmemwal import libpmem

pytestmark = pytest.mark.skipif(libpmem.load() is None, reason="needs libpmem")

CHILD = r"""
import json, sys, pmemwal
wal = pmemwal.open(sys.argv[1], mode="direct", persist="pmem")
for size in (1000, 8000, 70000):            # streamed: past the 256 B threshold
    for _ in range(10):
        wal.append(bytes(size), True)
streamed = wal.stats()["stream_fences"]
for _ in range(10):                         # a few bytes: stored through the cache
    wal.append(b"x" * 16, True)
print(json.dumps({"stream_min": wal.stream_min, "streamed": streamed,
                  "after_small": wal.stats()["stream_fences"]}))
wal.close()
"""


@pytest.mark.parametrize("flush_instruction", ["default", "clflush"])
def test_every_streamed_insertion_is_fenced(shm_dir: Path, flush_instruction: str) -> None:
    env = dict(os.environ, PMEM_IS_PMEM_FORCE="1", PMEMWAL_STREAM_MIN="256")
    if flush_instruction == "clflush":
        env.update(PMEM_NO_CLWB="1", PMEM_NO_CLFLUSHOPT="1")
    out = subprocess.run([sys.executable, "-c", CHILD, str(shm_dir / "wal")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    if got["stream_min"] is None:
        pytest.skip("no streaming path on this CPU (crc32c_streaming)")
    assert got["stream_min"] == 256
    assert got["streamed"] == 30, got
    assert got["after_small"] == 30, got    # nothing streamed, nothing to fence
