"""Shared fixtures and helpers for the WAL tests.

Everything runs on real files under /dev/shm with real mappings; nothing on
the storage path is mocked.  The helpers here know the on-disk format
(native/wal_format.h) well enough to find a record's bytes in a segment file
and to predict LSNs, so that tests can damage exactly the byte they mean to
and assert exact positions.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import pmemwal
from pmemwal import _core
from pmemwal.checkpoint import Checkpoint, CheckpointFile
from pmemwal.format import (HEADER_SIZE, PAGE_HEADER_SIZE, PAGE_SIZE, RECORD_HEADER_SIZE,
                            SegmentHeader, parse_segment_name, segment_name)
from pmemwal.segments import CHECKPOINT_NAME

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
CHILD = str(TESTS_DIR / "_child.py")

SEG = 1 << 20                       # the smallest segment size: boundaries come quickly
PAGE = PAGE_SIZE                    # 8192
PAGE_HDR = PAGE_HEADER_SIZE         # 24
USABLE = PAGE - PAGE_HDR            # 8168 stream bytes per data page
REC_HDR = RECORD_HEADER_SIZE        # 24
HIDDEN_LIBPMEM = "/nonexistent/libpmem.so.1"
_ENV_SWITCHES = ("PMEM_IS_PMEM_FORCE", "PMEMWAL_LIBPMEM", "PMEMWAL_MODE", "PMEMWAL_CPU",
                 "PMEMWAL_NO_CRC_HW", "PMEMWAL_STREAM_MIN", "PMEM_MOVNT_THRESHOLD", "PMEM_NO_CLWB")

# mode="auto" follows a stored measurement of the file system (pmemwal probe --measure):
# the suite, and the children it starts, never read or write the user's
# (tests that store one point it at their own tmp_path)
os.environ["PMEMWAL_CALIBRATION"] = "/nonexistent/pmemwal-test-calibration.json"


# ---- fixtures ------------------------------------------------------------------

@pytest.fixture
def shm_tmp() -> Iterator[Path]:
    """A fresh directory on tmpfs, removed afterwards."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="pmemwal-test-")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def wal_dir(shm_tmp: Path) -> Path:
    """Path of a WAL directory that does not exist yet (open() creates it)."""
    return shm_tmp / "wal"


@pytest.fixture(params=["buffered", "direct"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


# ---- payloads ------------------------------------------------------------------

from _child import as_input, payload, prefixed  # noqa: E402  (defined once, with the child)


# ---- format arithmetic (native/wal_format.h) -------------------------------------

def seg_usable(seg_size: int = SEG) -> int:
    return (seg_size // PAGE - 1) * USABLE


def rec_size(length: int) -> int:
    """Stream bytes a record with ``length`` payload bytes takes."""
    return (REC_HDR + length + 7) & ~7


def lsn_of(u: int, seg_size: int = SEG) -> int:
    """LSN of usable stream position ``u`` (wal_lsn)."""
    seg, r = divmod(u, seg_usable(seg_size))
    return seg * seg_size + (1 + r // USABLE) * PAGE + PAGE_HDR + r % USABLE


def usable_of(lsn: int, seg_size: int = SEG) -> int:
    """Usable stream position of an LSN (wal_usable); it must not lie in a header."""
    seg, off = divmod(lsn, seg_size)
    page, inpage = divmod(off, PAGE)
    assert page > 0 and inpage >= PAGE_HDR, f"LSN {lsn} lies in a header"
    return seg * seg_usable(seg_size) + (page - 1) * USABLE + inpage - PAGE_HDR


def next_lsn(lsn: int, length: int, seg_size: int = SEG) -> int:
    """LSN of the record after the one at ``lsn`` with ``length`` payload bytes."""
    return lsn_of(usable_of(lsn, seg_size) + rec_size(length), seg_size)


def first_lsn_of_segment(segno: int, seg_size: int = SEG) -> int:
    return segno * seg_size + PAGE + PAGE_HDR


# ---- raw access to the record stream in the segment files ----------------------

def seg_file(wal_path: os.PathLike | str, segno: int) -> Path:
    return Path(wal_path) / segment_name(segno)


def _stream_pieces(lsn: int, n: int, seg_size: int) -> Iterator[tuple[int, int, int, int]]:
    """(segno, file offset, length, index into the n bytes) for stream bytes [lsn, +n)."""
    u = usable_of(lsn, seg_size)
    done = 0
    while done < n:
        x = lsn_of(u + done, seg_size)
        room = USABLE - (u + done) % USABLE
        k = min(room, n - done)
        yield x // seg_size, x % seg_size, k, done
        done += k


def stream_read(wal_path, lsn: int, n: int, seg_size: int = SEG) -> bytes:
    """``n`` stream bytes from ``lsn``, page headers skipped."""
    out = bytearray(n)
    for segno, off, k, i in _stream_pieces(lsn, n, seg_size):
        with open(seg_file(wal_path, segno), "rb") as f:
            f.seek(off)
            out[i:i + k] = f.read(k)
    return bytes(out)


def stream_write(wal_path, lsn: int, data: bytes, seg_size: int = SEG) -> None:
    """Overwrite stream bytes from ``lsn`` (page headers skipped) in the files."""
    for segno, off, k, i in _stream_pieces(lsn, len(data), seg_size):
        with open(seg_file(wal_path, segno), "r+b") as f:
            f.seek(off)
            f.write(data[i:i + k])


def flip_byte(wal_path, lsn: int, seg_size: int = SEG) -> None:
    """Invert the stream byte at ``lsn``."""
    b = stream_read(wal_path, lsn, 1, seg_size)
    stream_write(wal_path, lsn, bytes([b[0] ^ 0xFF]), seg_size)


def file_bytes(wal_path, lsn: int, n: int, seg_size: int = SEG) -> bytes:
    """Raw file bytes at an LSN (headers included), in one segment."""
    with open(seg_file(wal_path, lsn // seg_size), "rb") as f:
        f.seek(lsn % seg_size)
        return f.read(n)


def file_write(wal_path, lsn: int, data: bytes, seg_size: int = SEG) -> None:
    """Overwrite raw file bytes at an LSN (headers included), in one segment."""
    with open(seg_file(wal_path, lsn // seg_size), "r+b") as f:
        f.seek(lsn % seg_size)
        f.write(data)


# ---- the checkpoint a crash would have left ------------------------------------

def rewind_checkpoint(wal_path, lsn: int | None = None) -> Checkpoint:
    """Rewrite CHECKPOINT as a crash would have left it: a new newest slot (the next seq)
    naming as its end ``lsn`` (a record's LSN; None: the first record of the oldest
    segment), as last_lsn that record's prev-link (read from its header), and the oldest
    segment on disk; not clean.

    Tests that simulate a crash by closing a WAL cleanly and then damaging its tail need
    this: the clean close wrote a checkpoint at the end of the WAL, past the damage, and
    recovery would take the damage for damage to durable records, never for a torn tail.
    Rewinding it makes everything from ``lsn`` on be read, and judged, as after a crash
    that no checkpoint had covered.  Returns the checkpoint written.
    """
    directory = os.fspath(wal_path)
    segnos = sorted(n for n in map(parse_segment_name, os.listdir(directory)) if n is not None)
    assert segnos, f"{directory} holds no segment"
    oldest = segnos[0]
    with open(seg_file(directory, oldest), "rb") as f:
        header = SegmentHeader.unpack(f.read(PAGE_SIZE), segment_name(oldest))
    size = header.segment_size
    maps: dict[int, mmap.mmap | None] = {}

    def segment(segno: int) -> mmap.mmap | None:
        if segno not in maps:
            try:
                with open(seg_file(directory, segno), "rb") as f:
                    maps[segno] = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
            except (OSError, ValueError):
                maps[segno] = None
        return maps[segno]

    reader = _core.Reader(size, int.from_bytes(header.wal_id[:4], "little"), segment)
    try:
        if lsn is None:
            status, lsn = reader.first_record(oldest)
            assert status == 0, f"no first record in segment {oldest:016X}: " \
                f"{_core.status_text(status)}"
        else:
            status = reader.read(lsn, -1)[0]
            assert status == 0, f"no valid record at {lsn}: {_core.status_text(status)}"
    finally:
        reader = None  # before the mappings it may hold are closed
        for m in maps.values():
            if m is not None:
                m.close()
    # u32 crc, u32 length, u64 prev_lsn (a header may cross a page: read it as stream bytes)
    prev_lsn = int.from_bytes(stream_read(directory, lsn, 16, size)[8:16], "little")
    checkpoints = CheckpointFile(directory, header.wal_id, size)
    written = checkpoints.write(lsn, prev_lsn, oldest, clean=False, current=checkpoints.read())
    assert checkpoints.read() == written, "the rewound checkpoint does not read back"
    return written


def as_made_before_checkpoints(wal_path) -> None:
    """Make a closed WAL what a pmemwal without checkpoints left: CHECKPOINT deleted and the
    CHECKPOINTED flag cleared from every segment header (pmemwal/format.py)."""
    directory = Path(wal_path)
    for name in sorted(os.listdir(directory)):
        if parse_segment_name(name) is not None:
            with open(directory / name, "r+b") as f:
                header = SegmentHeader.unpack(f.read(HEADER_SIZE), name)
                f.seek(0)
                f.write(SegmentHeader(header.segno, header.segment_size, header.wal_id).pack())
    (directory / CHECKPOINT_NAME).unlink(missing_ok=True)


# ---- reading back ----------------------------------------------------------------

def read_all(wal: pmemwal.WAL, start: int | None = None) -> list[tuple[int, bytes, int]]:
    """Every record as (lsn, payload bytes, prev_lsn); payload views are copied at once."""
    return [(r.lsn, bytes(r.payload), r.prev_lsn) for r in wal.records(start)]


def assert_chain(recs: list[tuple[int, bytes, int]], seg_size: int = SEG) -> None:
    """prev-links chain, and each LSN follows from the one before (exact stream arithmetic)."""
    for (lsn0, data0, _), (lsn1, _, prev1) in zip(recs, recs[1:]):
        assert prev1 == lsn0, f"record {lsn1}: prev_lsn {prev1} != {lsn0}"
        assert lsn1 == next_lsn(lsn0, len(data0), seg_size), f"gap or overlap after {lsn0}"


def expected_end(recs: list[tuple[int, bytes, int]], seg_size: int = SEG) -> int:
    lsn, data, _ = recs[-1]
    return next_lsn(lsn, len(data), seg_size)


# ---- child processes ---------------------------------------------------------------

def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child: this one, minus pmemwal's switches, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _ENV_SWITCHES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


# The three ways to persist that direct/buffered mode can end up with, as
# (mode, extra environment, expected persist_method).
PERSIST_CASES = {
    "buffered": ("buffered", {}, "fdatasync"),
    "buffered-nolibpmem": ("buffered", {"PMEMWAL_LIBPMEM": HIDDEN_LIBPMEM}, "fdatasync"),
    "direct-msync": ("direct", {}, "msync"),
    "direct-nolibpmem": ("direct", {"PMEMWAL_LIBPMEM": HIDDEN_LIBPMEM}, "msync"),
    "direct-pmem": ("direct", {"PMEM_IS_PMEM_FORCE": "1"}, "pmem"),
}


def killed_script(wal_dir, script: str, *args: str) -> list[int]:
    """Run ``script`` with ``python -c`` (it opens the WAL at argv[1], prints numbers, then
    SIGKILLs itself); the numbers it printed."""
    done = subprocess.run([sys.executable, "-c", script, str(wal_dir), *args],
                          env=child_env(), capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    return [int(n) for n in done.stdout.split()]


def payloads_recovered(wal_dir, **options) -> list[bytes]:
    """Every payload an open with ``options`` reads, whatever recovery warns of."""
    from pmemwal.recovery import RecoveryWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        with pmemwal.open(wal_dir, **options) as wal:
            return [bytes(r.payload) for r in wal.records()]


def run_child(spec: dict, env: dict[str, str] | None = None, timeout: float = 60) -> dict:
    """Run tests/_child.py with a JSON spec; return the JSON it prints last."""
    proc = subprocess.run([sys.executable, CHILD, json.dumps(spec)], env=child_env(**(env or {})),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def shm_dir(shm_tmp: Path) -> Path:
    """A fresh directory on tmpfs (/dev/shm), removed afterwards."""
    return shm_tmp


def run_and_kill(script: str, spec: dict, env: dict[str, str], delay: float) -> tuple[list[bytes], str]:
    """Start a writer script, SIGKILL it ``delay`` s after its first line; its lines and stderr.

    The writer prints a line only for what it has acknowledged, so the lines are
    what the WAL promised when the process died.
    """
    proc = subprocess.Popen([sys.executable, script, json.dumps(spec)], env=child_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[bytes] = []
    ready = threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        assert ready.wait(30), "the writer did not start"
        time.sleep(delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        t.join(timeout=30)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, stderr
    return lines, stderr


def cli_runner() -> CliRunner:
    """A CLI runner keeping stderr (progress bars) apart from stdout: click < 8.2
    needs mix_stderr=False, 8.2 and later always do."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: "3m") mounted at ``where``; skips without root."""
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)  # lazy: even if a file is open


# ---- an S3 server ------------------------------------------------------------------

@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (pmemwal.tools.s3_server.LocalS3), for the session."""
    from pmemwal.tools.s3_server import LocalS3
    with LocalS3() as server:
        yield server
