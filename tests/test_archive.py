"""Archiving and restore (issue 12), with real parts: moto's S3 server on 127.0.0.1 and s3fs
as its client, a TCP gate in front of it to take it away and slow it down, real archive
commands run by /bin/sh, and a writer killed with SIGKILL mid-upload."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pmemwal
from conftest import SEG, TESTS_DIR, payload, seg_file
from pmemwal import _core
from pmemwal.checkpoint import CheckpointFile
from pmemwal.errors import ArchiveError, ConfigError, StorageError
from pmemwal.format import segment_name
from pmemwal.tools.cli import main as cli
from pmemwal.tools.restore import restore
from pmemwal.tools.s3_server import free_port, storage_options

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")


pytest.importorskip("s3fs")


class Gate:
    """A TCP forwarder to the S3 server that a test can shut (connections refused, those
    open cut: the archive is unreachable), open again, and slow to ``rate`` bytes/s."""

    def __init__(self, upstream: int, rate: float | None = None) -> None:
        self.upstream, self.rate = upstream, rate
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.forwarded = 0  # bytes sent on to the server
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> Gate:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def shut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(16384):
                if upstream and self.rate:
                    time.sleep(len(data) / self.rate)
                dst.sendall(data)
                if upstream:
                    self.forwarded += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def bucket(request) -> str:
    """A fresh S3 URL (bucket and prefix) for one test."""
    return f"s3://t-{abs(hash(request.node.nodeid)) % 10**12}-{time.time_ns() % 10**9}/wal"


def s3fs_of(server_endpoint: str):
    import s3fs
    return s3fs.S3FileSystem(skip_instance_cache=True, **storage_options(server_endpoint))


def append_segments(wal: pmemwal.WAL, segments: float, seed: str,
                    out: list[tuple[int, bytes]] | None = None) -> list[tuple[int, bytes]]:
    """Append and flush records of 1-31 KB until ``segments`` more segments are full;
    (LSN, payload) of each is added to ``out`` as it is appended, and ``out`` returned."""
    out = [] if out is None else out
    until = wal.insert_lsn + int(segments * SEG)
    while wal.insert_lsn < until:
        data = payload(f"{seed}/{len(out)}", 1000 + (len(out) * 7919) % 30000)
        out.append((wal.append(data, flush=True), data))
    return out


def records(path) -> list[tuple[int, bytes]]:
    with pmemwal.open(path, create=False) as wal:
        return [(r.lsn, bytes(r.payload)) for r in wal.records()]


def wait_for(condition, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def held_in_archive(expected: list[tuple[int, bytes]], archived_end: int,
                    restored: list[tuple[int, bytes]]) -> None:
    """``restored`` is exactly the records of ``expected`` that the archive holds whole."""
    assert restored == expected[:len(restored)]
    whole = sum(1 for i in range(len(expected) - 1) if expected[i + 1][0] <= archived_end)
    assert len(restored) >= whole, "records archived whole are missing from the restore"


# ---- S3: under load, SIGKILL, outage ------------------------------------------------

def test_archive_to_s3_under_load_then_restore(s3_server, bucket, shm_tmp):
    wal_dir = shm_tmp / "wal"
    expected = []
    with pmemwal.open(wal_dir, segment_size=SEG, archive=bucket,
                      archive_options=s3_server.options) as wal:
        for round_ in range(4):  # a checkpointer's pattern: append, then truncate what is archived
            append_segments(wal, 1.7, "load", expected)
            wal.truncate(wal.flushed_lsn)
        assert wal.wait_archived(30)
        complete = wal.flushed_lsn // SEG
        stats = wal.stats()
        status = wal.archive_status()
        local = {s: seg_file(wal_dir, s).read_bytes()
                 for s in range(wal.first_lsn // SEG, complete)}
    # each once: uploaded, or found uploaded after an attempt that timed out on a busy machine
    assert stats["archive_segments"] + stats["archive_found"] == complete
    assert stats["archive_found"] <= stats["archive_failures"]
    assert stats["archive_bytes"] == stats["archive_segments"] * SEG
    assert stats["archive_pending"] == 0
    assert status["ready"] == 0 and status["failed"] == 0 and status["archive"] == bucket
    fs = s3fs_of(s3_server.endpoint)
    names = sorted(os.path.basename(p) for p in fs.ls(bucket[5:], refresh=True))
    assert names == [segment_name(s) for s in range(complete)]  # each once, nothing else
    for segno, data in local.items():  # the ones still here: byte for byte
        assert fs.cat_file(f"{bucket[5:]}/{segment_name(segno)}") == data
    report = restore(shm_tmp / "restored", bucket, storage_options=s3_server.options)
    assert report.segments == list(range(complete)) and report.stopped == "end of archive"
    restored = records(shm_tmp / "restored")
    held_in_archive(expected, complete * SEG, restored)
    assert report.records == len(restored)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, waiting for a parent that may never reap
    it in a container, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _archiver_pids(wal_dir: Path) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"pmemwal._archiver_process" in cmd and os.fsencode(str(wal_dir)) in cmd:
            pids.append(int(pid))
    return pids


def test_sigkill_mid_upload_then_every_segment_archived_once(s3_server, bucket, shm_tmp):
    wal_dir = shm_tmp / "wal"
    gate = Gate(s3_server.port, rate=2 << 20).open()  # 2 MB/s: half a second a segment
    try:
        for kill in range(3):
            child = subprocess.Popen([sys.executable, str(TESTS_DIR / "_archive_child.py"),
                                      str(wal_dir), bucket, gate.endpoint, f"kill{kill}"],
                                     stdout=subprocess.PIPE, text=True)
            assert child.stdout.readline().strip() == "open"
            start = gate.forwarded
            wait_for(lambda: gate.forwarded > start + (256 << 10), what="an upload under way")
            child.send_signal(signal.SIGKILL)  # mid-upload: a quarter of a segment sent at most
            child.wait()
            child.stdout.close()
            wait_for(lambda: not _archiver_pids(wal_dir), 5, "the archiver to die with the writer")
        gate.rate = None
        with pmemwal.open(wal_dir, archive=bucket, archive_options=storage_options(gate.endpoint),
                          archive_backoff=0.2) as wal:
            assert wal.wait_archived(60)
            complete = wal.flushed_lsn // SEG
            local = {s: seg_file(wal_dir, s).read_bytes() for s in range(complete)}
    finally:
        gate.shut()
    assert complete >= 3
    fs = s3fs_of(s3_server.endpoint)
    names = sorted(os.path.basename(p) for p in fs.ls(bucket[5:], refresh=True))
    assert names == [segment_name(s) for s in range(complete)]
    for segno, data in local.items():
        assert fs.cat_file(f"{bucket[5:]}/{segment_name(segno)}") == data, segment_name(segno)
    report = restore(shm_tmp / "restored", bucket, storage_options=s3_server.options)
    restored, written = records(shm_tmp / "restored"), records(wal_dir)
    held_in_archive(written, complete * SEG, restored)


def test_archive_unreachable_keeps_segments_then_catches_up_then_limit(s3_server, bucket, shm_tmp):
    wal_dir = shm_tmp / "wal"
    gate = Gate(s3_server.port).open()
    try:
        wal = pmemwal.open(wal_dir, segment_size=SEG, archive=bucket,
                           archive_options=storage_options(gate.endpoint, timeout=1),
                           archive_backoff=0.3, archive_max_pending=5 * SEG)
        expected = append_segments(wal, 2.5, "outage")
        assert wal.wait_archived(20)
        gate.shut()
        append_segments(wal, 3, "outage", expected)  # appends go on
        wait_for(lambda: wal.stats()["archive_failures"] >= 2, what="failed, retried archiving")
        archived = wal.archive_status()["done"]
        removed = wal.truncate(wal.flushed_lsn)
        assert removed == archived  # only the archived ones went
        for segno in range(archived, wal.flushed_lsn // SEG):
            assert seg_file(wal_dir, segno).exists(), "an unarchived segment was truncated"
        stats, status = wal.stats(), wal.archive_status()
        assert stats["truncate_kept_unarchived"] >= 3 and stats["archive_pending"] >= 3
        assert status["failed"] == 1 and status["oldest_unarchived"] == segment_name(archived)
        assert status["last_error"] and bucket in status["last_error"]
        result = _cli("archive-status", str(wal_dir), "--json")
        assert result.exit_code == 1 and json.loads(result.output)["archive"]["failed"] == 1
        with pytest.raises(ArchiveError) as caught:  # the limit: no new segment
            for _ in range(10):
                append_segments(wal, 1, "outage", expected)
        err = caught.value
        assert isinstance(err, StorageError) and err.errno == errno.ENOSPC
        assert bucket in str(err) and "archive_max_pending" in str(err)
        assert (wal.flushed_lsn // SEG - archived) * SEG <= 5 * SEG + 3 * SEG  # the limit, and
        # the segments the background writer had made ready before it
        got = [(r.lsn, bytes(r.payload)) for r in wal.records()]
        assert got == [e for e in expected if e[0] >= wal.first_lsn]  # nothing lost
        gate.open()
        assert wal.wait_archived(30), wal.archive_status()
        append_segments(wal, 2, "outage", expected)  # room again
        assert wal.wait_archived(30)
        assert wal.truncate(wal.flushed_lsn) > 0
        complete = wal.flushed_lsn // SEG
        wal.close()
    finally:
        gate.shut()
    restore(shm_tmp / "restored", bucket, storage_options=s3_server.options)
    held_in_archive(expected, complete * SEG, records(shm_tmp / "restored"))


# ---- archive commands ----------------------------------------------------------------

@pytest.mark.parametrize("case", ["fails", "hangs", "writes a wrong file"])
def test_archive_command_failure_retried_reported_nothing_truncated(case, shm_tmp):
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    options = {
        "fails": dict(archive_command="cat %p > /dev/null; echo no room >&2; exit 3"),
        "hangs": dict(archive_command=f"test -f %p && echo $$ > {shm_tmp}/pid && exec sleep 60",
                      archive_timeout=0.3),
        "writes a wrong file": dict(archive_command=f"head -c 4096 %p > {arch}/%f",
                                    restore_command=f"cp {arch}/%f %p"),
    }[case]
    expected_error = {"fails": "exited with status 3 for 0000000000000000.wal: no room",
                      "hangs": "0.3 s limit", "writes a wrong file": "read back"}[case]
    with pmemwal.open(wal_dir, segment_size=SEG, archive_backoff=0.1, **options) as wal:
        expected = append_segments(wal, 3, case)
        wait_for(lambda: wal.stats()["archive_failures"] >= 2, what="two failed attempts")
        assert wal.truncate(wal.flushed_lsn) == 0
        assert all(seg_file(wal_dir, s).exists() for s in range(3))
        status = wal.archive_status()
        assert status["ready"] == 3 and status["failed"] == 1 and status["done"] == 0
        assert expected_error in status["last_error"] and status["attempts"] >= 2
        assert not wal.wait_archived(0.2)
    if case == "hangs":
        pid = int((shm_tmp / "pid").read_text())  # the last command, hanging at close:
        wait_for(lambda: not _alive(pid), 5, "the hanging command to be killed")
    result = _cli("archive-status", str(wal_dir))
    assert result.exit_code == 1 and expected_error in result.output
    good = shm_tmp / "good"
    good.mkdir()
    with pmemwal.open(wal_dir, archive_command=f"cp %p {good}/%f",
                      restore_command=f"cp {good}/%f %p") as wal:
        assert wal.wait_archived(20)
        assert wal.truncate(wal.flushed_lsn) == 3
    assert sorted(os.listdir(good)) == [segment_name(s) for s in range(3)]
    report = restore(shm_tmp / "restored", restore_command=f"cp {good}/%f %p")
    held_in_archive(expected, 3 * SEG, records(shm_tmp / "restored"))
    assert report.stopped.startswith("the archive has no 0000000000000003.wal")


def test_archive_refuses_to_overwrite_other_bytes(shm_tmp):
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    planted = b"another WAL's segment" * 100
    (arch / segment_name(0)).write_bytes(planted)
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}",
                      archive_backoff=0.1) as wal:
        append_segments(wal, 2, "conflict")
        wait_for(lambda: wal.stats()["archive_failures"] >= 2, what="refusals")
        status = wal.archive_status()
        assert "already holds other bytes" in status["last_error"] and status["done"] == 0
        assert wal.truncate(wal.flushed_lsn) == 0
    assert (arch / segment_name(0)).read_bytes() == planted
    assert sorted(os.listdir(arch)) == [segment_name(0)]


def test_file_archive_partial_upload_is_replaced_and_crash_lost_status_is_redone(shm_tmp):
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    (arch / (segment_name(0) + ".partial")).write_bytes(b"cut short by a crash")
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}") as wal:
        append_segments(wal, 2, "partial")
        assert wal.wait_archived(20)
    assert sorted(os.listdir(arch)) == [segment_name(0), segment_name(1)]
    assert (arch / segment_name(0)).read_bytes() == seg_file(wal_dir, 0).read_bytes()
    # a crash lost status: .done of segment 0 gone, segment 1 back to .ready, no status at all
    status_dir = wal_dir / "archive_status"
    (status_dir / f"{segment_name(0)}.done").unlink()
    (status_dir / f"{segment_name(1)}.done").rename(status_dir / f"{segment_name(1)}.ready")
    with pmemwal.open(wal_dir, archive=f"file://{arch}") as wal:
        assert wal.wait_archived(20)
        stats = wal.stats()
    assert stats["archive_found"] == 2 and stats["archive_segments"] == 0  # same bytes: archived


# ---- restore ------------------------------------------------------------------------

@pytest.fixture
def archived(shm_tmp) -> tuple[Path, list[tuple[int, bytes]]]:
    """A file:// archive of five complete segments, and the records appended."""
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}") as wal:
        expected = append_segments(wal, 5.2, "restore")
        assert wal.wait_archived(20)
    assert len(os.listdir(arch)) == 5
    return arch, expected


def test_restore_cli_until_and_reopen_with_the_same_archive(archived, shm_tmp):
    arch, expected = archived
    dest = shm_tmp / "r1"
    result = _cli("restore", f"file://{arch}", str(dest), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["segments"] == [segment_name(s) for s in range(5)]
    held_in_archive(expected, 5 * SEG, records(dest))
    with pmemwal.open(dest, archive=f"file://{arch}") as wal:  # restored whole: .done already
        assert wal.wait_archived(5)
        assert wal.stats()["archive_found"] == wal.stats()["archive_segments"] == 0
    until = expected[len(expected) // 2][0]
    dest2 = shm_tmp / "r2"
    result = _cli("restore", f"file://{arch}", str(dest2), "--until", pmemwal.format_lsn(until))
    assert result.exit_code == 0, result.output
    assert records(dest2) == expected[:len(expected) // 2]
    assert "cut at" in result.output
    with pytest.raises(ConfigError, match="not an empty directory"):
        restore(dest2, f"file://{arch}")
    # `until` inside a record that runs into the next segment: that segment is fetched too
    k = next(i for i in range(1, len(expected)) if expected[i][0] >= 2 * SEG)
    assert expected[k - 1][0] < 2 * SEG  # record k - 1 starts in segment 1 and ends in 2
    report = restore(shm_tmp / "r3", f"file://{arch}", until=expected[k - 1][0] + 8)
    assert report.segments == [0, 1, 2] and records(shm_tmp / "r3") == expected[:k]


def test_restore_until_where_a_record_fills_its_segment_exactly(shm_tmp):
    """The first record at or past ``until`` may start a segment the restore did not fetch
    (the record before it fills its own exactly): there is nothing to cut (an independent
    read of the fix below found the cut looking for that segment's file)."""
    arch = shm_tmp / "arch"
    arch.mkdir()
    page, header = _core.PAGE_SIZE, _core.PAGE_HEADER_SIZE
    usable = (SEG // page - 1) * (page - header)  # the record stream's bytes in a segment
    with pmemwal.open(shm_tmp / "wal", mode="buffered", segment_size=SEG,
                      archive=f"file://{arch}") as wal:
        while True:
            lsn = wal.insert_lsn
            used = (lsn // page - 1) * (page - header) + lsn % page - header
            if usable - used <= 40_000:
                break
            wal.append(bytes(20_000))
        wal.append(bytes(usable - used - _core.RECORD_HEADER_SIZE))  # to the segment's end
        assert wal.insert_lsn == SEG + page + header
        for _ in range(60):
            wal.append(b"x" * 20_000)
        wal.flush()
        assert wal.wait_archived(20)
    expected = records(shm_tmp / "wal")
    last = max(lsn for lsn, _ in expected if lsn < SEG)
    for n, until in enumerate((last + 8, SEG, SEG + 8, SEG + page + header)):
        report = restore(shm_tmp / f"r{n}", f"file://{arch}", until=until)
        assert records(shm_tmp / f"r{n}") == [r for r in expected if r[0] < until], (n, report)
        assert (report.cut_lsn is None) == (until <= SEG), (n, report)  # (segment 1 not fetched)


def test_restore_until_inside_a_record_leaves_out_the_later_records_of_its_segment(shm_tmp):
    """Issue 28 (found by the metadata crash states' check against the ledger): with
    ``until`` inside a record that ends in the last segment fetched, the scan's stop at
    ``until`` was taken for the end of the WAL (torn) unless valid pages lay beyond, so
    nothing was cut and the records after ``until`` in that segment came back."""
    arch = shm_tmp / "arch"
    arch.mkdir()
    rng = random.Random(3)
    with pmemwal.open(shm_tmp / "wal", mode="buffered", segment_size=SEG,
                      archive=f"file://{arch}") as wal:
        while wal.insert_lsn < 3.5 * SEG:  # sizes from bytes to a third of a segment
            size = rng.choice((rng.randrange(8, 300), rng.randrange(300, 20_000),
                               rng.randrange(20_000, 300_000)))
            wal.append(rng.randbytes(size), flush=rng.random() < 0.4)
        wal.flush()
        assert wal.wait_archived(20)
    expected = records(shm_tmp / "wal")
    inside = [i for i in range(len(expected) - 1)
              if SEG <= expected[i][0] and expected[i + 1][0] < 2 * SEG]
    for j in inside:
        until = expected[j][0] + 8
        report = restore(shm_tmp / f"r{j}", f"file://{arch}", until=until)
        assert report.cut_lsn == expected[j + 1][0], (j, report)
        assert records(shm_tmp / f"r{j}") == expected[:j + 1], j


def test_restore_stops_at_a_gap_and_at_damage(archived, shm_tmp):
    arch, expected = archived
    (arch / segment_name(3)).unlink()
    report = restore(shm_tmp / "gap", f"file://{arch}")
    assert report.segments == [0, 1, 2]
    assert "gap: the archive lacks 0000000000000003.wal" in report.stopped
    held_in_archive(expected, 3 * SEG, records(shm_tmp / "gap"))
    # a record's payload damaged in segment 1: the WAL is cut at that record
    victim = next(i for i, (lsn, data) in enumerate(expected) if lsn > SEG + 100_000)
    lsn, data = expected[victim]
    with open(arch / segment_name(1), "r+b") as f:
        f.seek(lsn % SEG + 64)
        byte = f.read(1)
        f.seek(lsn % SEG + 64)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = restore(shm_tmp / "damage", f"file://{arch}")
    assert report.cut_lsn == lsn and "damage" in report.stopped
    assert records(shm_tmp / "damage") == expected[:victim]
    # a segment whose header says another number: restore stops before it
    with open(arch / segment_name(2), "r+b") as f:
        f.seek(24)
        f.write((7).to_bytes(8, "little"))
    with pytest.raises(ArchiveError, match="no usable segment"):
        restore(shm_tmp / "none", f"file://{arch}", start_segment=2)


def test_shared_wal_one_archiver_at_a_time_the_next_takes_over(shm_tmp):
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    url = f"file://{arch}"
    a, b = (pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=url) for _ in range(2))
    expected = []
    for i in range(3):
        append_segments(a if i % 2 else b, 1, "shared", expected)
    assert a.wait_archived(20) and b.wait_archived(20)
    complete = a.flushed_lsn // SEG  # (a report reaches its writer just after the .done file)
    wait_for(lambda: sum(w.stats()["archive_segments"] for w in (a, b)) == complete, 10, "reports")
    counts = [w.stats()["archive_segments"] for w in (a, b)]
    assert sorted(counts) == [0, a.flushed_lsn // SEG]  # one archiver worked, the other waited
    working, other = (a, b) if counts[0] else (b, a)
    working.close()
    append_segments(other, 2, "shared", expected)
    assert other.wait_archived(20)
    assert other.stats()["archive_segments"] >= 2  # it took over
    assert other.truncate(other.flushed_lsn) == other.flushed_lsn // SEG
    complete = other.flushed_lsn // SEG
    other.close()
    assert sorted(os.listdir(arch)) == [segment_name(s) for s in range(complete)]
    restore(shm_tmp / "restored", url)
    held_in_archive(expected, complete * SEG, records(shm_tmp / "restored"))


def test_shared_wal_refuses_a_process_that_archives_otherwise(shm_tmp):
    """Every process of a shared WAL archives to the same place, or none does: one without
    the archive option would truncate (remove or recycle) segments not shipped yet, one
    with another archive would ship part of the WAL there."""
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    url = f"file://{arch}"
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=url) as first:
        first.append(b"kept", flush=True)
        with pytest.raises(ConfigError, match="no archive option"):
            pmemwal.open(wal_dir, shared=True, segment_size=SEG)
        with pytest.raises(ConfigError, match="another archive"):
            pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=f"file://{shm_tmp}")
        with pytest.raises(ConfigError, match="another archive"):
            pmemwal.open(wal_dir, shared=True, segment_size=SEG,
                         archive_command=f"cp %p {arch}/%f")
        with pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=url) as second:
            assert bytes(second.record(second.first_lsn).payload) == b"kept"
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG) as first:  # none: none archive
        with pytest.raises(ConfigError, match="do not archive"):
            pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=url)
        assert first.append(b"still writing", flush=True)


def test_shared_wal_compares_the_archive_a_url_names_not_its_spelling(shm_tmp, monkeypatch):
    """The processes of a shared WAL agree on the archive, not on how its URL is written: a
    local path with or without a trailing slash or file:// is the same archive, and a
    relative path names the archive under the process's working directory (the same
    relative path from another directory is another archive)."""
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    (shm_tmp / "elsewhere" / "arch").mkdir(parents=True)
    arch.mkdir()
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=str(arch)) as first:
        first.append(b"kept", flush=True)
        for url in (f"{arch}/", f"file://{arch}", f"file://{arch}/", f"{shm_tmp}/./arch"):
            with pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=url) as other:
                assert bytes(other.record(other.first_lsn).payload) == b"kept"
    monkeypatch.chdir(shm_tmp)
    with pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive="arch"):
        with pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive=f"file://{arch}"):
            pass
        monkeypatch.chdir(shm_tmp / "elsewhere")
        with pytest.raises(ConfigError, match="another archive"):
            pmemwal.open(wal_dir, shared=True, segment_size=SEG, archive="arch")


# ---- the log, options, stats ------------------------------------------------------------

def test_log_compact_keeps_unarchived_segments(shm_tmp):
    path = shm_tmp / "log"
    with pmemwal.open_log(path, segment_size=SEG, archive_command="exit 1 # %p",
                          archive_backoff=0.1) as log:
        for i in range(300):
            log.append(payload(f"log/{i}", 10_000), 1)
        log.sync()
        segments = sorted(n for n in os.listdir(path) if n.endswith(".wal"))
        assert log.compact(250) == 0
        after = {n for n in os.listdir(path) if n.endswith(".wal")}
        assert set(segments) <= after  # none went (the background may have made one ahead)
        assert log.wal.stats()["truncate_kept_unarchived"] >= 2
        assert bytes(log.entry(250).payload) == payload("log/249", 10_000)


@pytest.mark.parametrize("options, message", [
    (dict(archive="file:///tmp/x", archive_command="cp %p /tmp/x/%f"), "not both"),
    (dict(archive_command="cp /tmp/x"), "names no %p"),
    (dict(archive="file:///tmp/x", background=False), "background writer"),
    (dict(restore_command="cp /x/%f %p"), "go with archive"),
    (dict(archive="file:///tmp/x", archive_backoff=0), "archive_backoff"),
    (dict(archive="nosuchprotocol://x"), "nosuchprotocol"),
])
def test_archive_options_are_checked(shm_tmp, options, message):
    with pytest.raises(ConfigError, match=message):
        pmemwal.open(shm_tmp / "wal", **options)


def test_stats_command_shows_archive_status(archived, shm_tmp):
    result = _cli("stats", str(shm_tmp / "wal"))
    assert result.exit_code == 0
    assert "archive:         5 segments archived, 0 waiting (0 bytes), 0 failing" in result.output
    data = json.loads(_cli("stats", str(shm_tmp / "wal"), "--json").output)
    assert data["archive"]["done"] == 5 and data["archive"]["oldest_unarchived"] is None
    result = _cli("archive-status", str(shm_tmp / "arch-less"))
    assert "not archived" in result.output


def _cli(*args: str):
    from click.testing import CliRunner
    return CliRunner().invoke(cli, list(args))


def test_a_ready_status_for_a_segment_gone_is_dropped_and_later_ones_archived(shm_tmp):
    """Issue 27, item 9: a .ready survives for a segment a truncation removed (its .done
    lost in a crash, or marked ready as the truncation removed it).  Shipped oldest first,
    it used to fail forever with ENOENT, and nothing after it was archived."""
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}") as wal:
        append_segments(wal, 2.2, "before")
        assert wal.wait_archived(20)
        wal.truncate(wal.flushed_lsn)
    assert not seg_file(wal_dir, 0).exists()
    status_dir = wal_dir / "archive_status"
    (status_dir / f"{segment_name(0)}.ready").write_bytes(b"")   # what the crash left
    with pytest.warns(RuntimeWarning, match="is gone"):
        with pmemwal.open(wal_dir, archive=f"file://{arch}") as wal:
            append_segments(wal, 2, "after")
            assert wal.wait_archived(20), wal.archive_status()
            stats = wal.stats()
    assert stats["archive_gone"] == 1 and stats["archive_failures"] == 0
    assert not (status_dir / f"{segment_name(0)}.ready").exists()


def test_the_writer_syncs_a_done_before_truncating_on_it(shm_tmp, monkeypatch):
    """The archiver renames .ready to .done and then syncs; the writer may see the rename
    first, so it syncs archive_status/ itself before a truncation removes the segment."""
    from pmemwal.archive import ArchiveStatus
    events = []
    real_sync = ArchiveStatus.sync
    monkeypatch.setattr(ArchiveStatus, "sync", lambda self: (events.append("sync"),
                                                             real_sync(self))[1])
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}") as wal:
        append_segments(wal, 2.2, "sync")
        assert wal.wait_archived(20)
        real_forget = wal._archiver.forget
        monkeypatch.setattr(wal._archiver, "forget",
                            lambda segno: (events.append(f"removed {segno}"), real_forget(segno)))
        events.clear()
        wal._archiver._archived_below = 0       # as if the .done were new to this process
        wal.truncate(wal.flushed_lsn)
    removed = [i for i, e in enumerate(events) if e.startswith("removed")]
    assert removed and "sync" in events[:removed[0]], events


def test_a_failed_sync_of_the_status_keeps_the_archived_mark(shm_tmp, monkeypatch):
    """From a read of the fix above: the mark moved first and the sync came after, so a
    failed sync left the mark moved and the next truncation acted on unsynced .done files."""
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}") as wal:
        append_segments(wal, 2.2, "mark")
        assert wal.wait_archived(20)
        archiver = wal._archiver
        with archiver._lock:
            archiver._archived_below = 0        # as if the .done were new to this process
        calls = []

        def failing_sync():
            calls.append("sync")
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(archiver.status, "sync", failing_sync)
        with pytest.raises(OSError):
            archiver.archived_below(0)
        assert archiver._archived_below == 0
        monkeypatch.undo()
        assert archiver.archived_below(0) == 2


def test_a_restore_cut_short_leaves_no_wal_and_a_rerun_starts_over(archived, shm_tmp):
    """Issue 27, item 10 (a suspect, found real by reading): restore renamed segments into
    the destination as it fetched them and synced at the end, so a crash left a WAL there
    that opened (with records past --until, or a part of the archive), a rerun was refused
    (not empty), and nothing said the restore was unfinished."""
    arch, expected = archived
    dest = shm_tmp / "restored"
    dest.mkdir(mode=0o750)              # an empty directory given: kept, mode and all
    slow = (f"if [ %f = {segment_name(2)} ]; then sleep 60; fi; cp {arch}/%f %p")
    code = ("import sys; from pmemwal.tools.restore import restore; "
            "restore(sys.argv[1], restore_command=sys.argv[2])")
    child = subprocess.Popen([sys.executable, "-c", code, str(dest), slow],
                             start_new_session=True)
    try:
        wait_for(lambda: (dest / segment_name(1)).exists(), what="two segments fetched")
    finally:
        os.killpg(child.pid, signal.SIGKILL)    # the restore and its sleeping command
        child.wait()
    with pytest.raises(pmemwal.FormatError, match="a restore cut short"):
        pmemwal.open(dest)
    report = restore(dest, restore_command=f"cp {arch}/%f %p")
    assert report.segments == [0, 1, 2, 3, 4] and not (dest / "RESTORING").exists()
    assert oct(dest.stat().st_mode & 0o777) == oct(0o750)
    with pmemwal.open(dest) as wal:
        got = [(r.lsn, bytes(r.payload)) for r in wal.records()]
    assert got and got == expected[:len(got)]


def test_segments_a_truncation_left_behind_go_with_their_status(shm_tmp):
    """A crash between a truncation's checkpoint and its removals leaves archived segments
    below the oldest: the open removes them, and their status files with them (a .done left
    behind would stay forever)."""
    wal_dir, arch = shm_tmp / "wal", shm_tmp / "arch"
    arch.mkdir()
    with pmemwal.open(wal_dir, segment_size=SEG, archive=f"file://{arch}",
                      recycle_segments=0) as wal:
        append_segments(wal, 2.2, "left")
        assert wal.wait_archived(20)
        end, last = wal.position()
    status_dir = wal_dir / "archive_status"
    assert (status_dir / f"{segment_name(1)}.done").exists()
    CheckpointFile(str(wal_dir), wal.wal_id, SEG).write(end, last, 2)  # a truncation's; a crash
    with pmemwal.open(wal_dir) as wal:      # (archiving or not)
        assert wal.first_lsn > 2 * SEG
    assert not seg_file(wal_dir, 0).exists() and not seg_file(wal_dir, 1).exists()
    left = [name for name in os.listdir(status_dir) if name.startswith((segment_name(0),
                                                                          segment_name(1)))]
    assert left == []
