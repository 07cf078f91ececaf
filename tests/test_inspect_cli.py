"""The read-only inspection tools: ``pmemwal dump``, ``verify`` and ``stats``
(pmemwal.tools.inspect).

- on a healthy WAL (each mode, records of 0, 1, 8168, 20000 bytes and one that
  spans a segment boundary) dump lists exactly the appended records, verify
  says OK, stats counts them;
- while a writer holds the WAL open, all three work and change no file;
- each kind of damage gives the right verdict and exit code, never a traceback:
  a flipped byte mid-log (exit 1 at that record), a torn tail (exit 0, a note),
  a foreign file, a bad segment header, a truncated segment, garbage named like
  a segment;
- the checkpoint: verify shows it, reads every record as open(verify="all")
  does, and calls an end before the checkpoint's end damage (exit 1), never a
  torn tail; a segment it vouches for that is missing is a problem too.  Tests
  that simulate a crash by a clean close and damage rewind it first, as a crash
  would have left it (conftest.rewind_checkpoint);
- ``--start`` parsing; a path that is no WAL;
- 200 random byte flips and truncations: exit code 0 or 1, never an exception.

WALs are written with pmemwal.open on /dev/shm with 1 MiB segments; damage is
done with ordinary file writes at offsets computed from the format (conftest).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import pmemwal
from pmemwal import _core
from pmemwal.format import segment_name
from pmemwal.tools import inspect
from pmemwal.tools.cli import main
from conftest import (PAGE, PAGE_HDR, REC_HDR, SEG, as_made_before_checkpoints, cli_runner,
                      file_write, flip_byte, next_lsn, payload, read_all, rec_size,
                      rewind_checkpoint, seg_file, stream_write)

SPANNING = 1_200_000                         # longer than a 1 MiB segment: it crosses into the next
SIZES = [0, 1, 8168, 20000, SPANNING, 5]
LINE = re.compile(r"^lsn: (\S+) +len: +(\d+) prev: (\S+) +crc: 0x([0-9a-f]{8})$")
NO_TRACEBACK = "Traceback"


def invoke(*args):
    """Run the CLI; stdout and stderr kept apart."""
    result = cli_runner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {result.exception!r}\n{result.stdout}\n{result.stderr}"
    assert NO_TRACEBACK not in result.stdout + result.stderr
    return result


def make_wal(path: Path, mode: str = "buffered", sizes=SIZES, seed: str = "h", *,
             flush_each: bool = False, **opts) -> list[tuple[int, int]]:
    """A closed WAL holding ``sizes``; returns (lsn, length) of each record."""
    opts.setdefault("background", False)
    out = []
    with pmemwal.open(path, mode=mode, segment_size=SEG, **opts) as wal:
        for i, n in enumerate(sizes):
            lsn = wal.append(payload(f"{seed}/{i}", n))
            if flush_each:
                wal.flush(lsn)
            out.append((lsn, n))
    return out


def digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.iterdir()) if p.is_file()}


def dumped(output: str) -> list[tuple[int, int, int]]:
    """(lsn, length, prev) of each record line of a dump."""
    out = []
    for line in output.splitlines():
        match = LINE.match(line)
        if match:
            out.append((inspect.parse_lsn(match[1]), int(match[2]), inspect.parse_lsn(match[3])))
    return out


def end_of(recs: list[tuple[int, int]]) -> int:
    return next_lsn(*recs[-1])


# ---- a healthy WAL ------------------------------------------------------------------

def test_healthy_wal(wal_dir, mode):
    recs = make_wal(wal_dir, mode)
    lsns = [lsn for lsn, _ in recs]
    spanning = recs[SIZES.index(SPANNING)]
    assert spanning[0] < SEG < next_lsn(*spanning)     # it does cross into segment 1
    end = end_of(recs)
    before = digests(wal_dir)

    result = invoke("dump", wal_dir)
    assert result.exit_code == 0
    assert dumped(result.stdout) == [(lsn, n, prev) for (lsn, n), prev in zip(recs, [0] + lsns)]
    lines = result.stdout.splitlines()
    assert len({line.index("len:") for line in lines[:-1]}) == 1     # aligned columns
    assert len({line.index("crc:") for line in lines[:-1]}) == 1
    assert lines[-1] == (f"records: 6, payload bytes: {sum(SIZES)}, first: 0/2018, "
                         f"last: {pmemwal.format_lsn(lsns[-1])}, end: {pmemwal.format_lsn(end)}; "
                         f"stopped: end of WAL at {pmemwal.format_lsn(end)}")

    result = invoke("dump", wal_dir, "--json")
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(o["lsn"], o["length"]) for o in objects[:-1]] == recs
    assert all(o["type"] == "record" for o in objects[:-1])
    assert objects[-1]["type"] == "summary" and objects[-1]["stopped"] == "clean"
    assert objects[-1]["end_lsn"] == end and objects[-1]["records"] == 6

    result = invoke("verify", wal_dir)
    assert result.exit_code == 0
    assert result.stdout == (f"OK: 6 records, 2 segments, end {pmemwal.format_lsn(end)}\n"
                             f"checkpoint: end {pmemwal.format_lsn(end)}, last "
                             f"{pmemwal.format_lsn(lsns[-1])}, oldest segment 0000000000000000, "
                             "clean\n")
    report = json.loads(invoke("verify", wal_dir, "--json").stdout)
    assert report["ok"] and report["records"] == 6 and report["bytes"] == sum(SIZES)
    assert (report["first_lsn"], report["last_lsn"], report["end_lsn"]) == (lsns[0], lsns[-1], end)
    assert report["first_problem"] is None and report["torn_tail"] is None
    checkpoint = report["checkpoint"]
    assert (checkpoint["end_lsn"], checkpoint["last_lsn"], checkpoint["oldest_segno"],
            checkpoint["clean"]) == (end, lsns[-1], 0, True)

    result = invoke("stats", wal_dir, "--json")
    assert result.exit_code == 0
    stats = json.loads(result.stdout)
    assert stats["records"] == 6 and stats["payload_bytes"] == sum(SIZES)
    assert stats["stream_bytes"] == sum(rec_size(n) for n in SIZES)
    assert stats["segments"]["count"] == 2 and stats["segments"]["numbers"] == [0, 1]
    assert stats["segments"]["sizes"] == [SEG, SEG] and stats["segments"]["bytes_on_disk"] == 2 * SEG
    assert stats["spare_segments"]["count"] == 0
    assert (stats["first_lsn"], stats["last_lsn"], stats["end_lsn"]) == (lsns[0], lsns[-1], end)
    hist = {b["range"]: b["count"] for b in stats["record_sizes"]["histogram"]}
    assert hist == {"0": 1, "1-8": 2, "9-64": 0, "65-512": 0, "513-4096": 0, "4097-32768": 2,
                    "32769-262144": 0, "262145-2097152": 1}
    text = invoke("stats", wal_dir).stdout
    assert "records:         6" in text
    assert re.search(r"^\s+4097-32768\s+2$", text, re.M)

    assert digests(wal_dir) == before


def test_spare_segments(wal_dir):
    """With the background writer, segments made ahead of the end are spares."""
    recs = make_wal(wal_dir, "buffered", background=True, prepare_segments=2)
    end = end_of(recs)
    stats = inspect.wal_stats(wal_dir)
    numbers = stats["segments"]["numbers"]
    assert stats["spare_segments"]["numbers"] == [s for s in numbers if s > end // SEG]
    assert inspect.verify(wal_dir).ok


def test_library_api(wal_dir):
    recs = make_wal(wal_dir, "direct")
    with inspect.WalView(wal_dir) as view:
        assert view.segments == view.readable == [0, 1]
        assert view.segment_size == SEG and len(view.wal_id) == 16 and view.problems == []
        listed = view.records(start=recs[2][0], limit=2)
        got = list(listed)
        assert [(r.lsn, r.length, r.prev_lsn) for r in got] == [(recs[2][0], 8168, recs[1][0]),
                                                               (recs[3][0], 20000, recs[2][0])]
        assert got[0].next_lsn == recs[3][0]
        assert listed.end.kind == "limit" and listed.end.lsn == recs[4][0]
        assert view.payload(recs[4][0]) == payload("h/4", SPANNING)
    report = inspect.verify(wal_dir)
    assert report.ok and report.first_problem is None
    assert (report.records, report.segments, report.end_lsn) == (6, 2, end_of(recs))
    assert _core.status_text(inspect._NO_SEGMENT) == "segment missing"


def test_size_histogram():
    lengths = np.array([0, 1, 8, 9, 64, 65, 512, 513, 4096, 4097], dtype=np.uint64)
    assert [(b["range"], b["count"]) for b in inspect.size_histogram(lengths)] == [
        ("0", 1), ("1-8", 2), ("9-64", 2), ("65-512", 2), ("513-4096", 2), ("4097-32768", 1)]
    assert [b["count"] for b in inspect.size_histogram(np.zeros(0))] == [0, 0]


# ---- while a writer holds the WAL open ------------------------------------------------

def test_writer_holds_wal_open(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = [(wal.append(payload(f"w/{i}", n)), n) for i, n in enumerate(SIZES)]
        wal.flush()
        before = digests(wal_dir)
        assert invoke("verify", wal_dir).stdout.startswith("OK: 6 records, 2 segments")
        assert [(lsn, n) for lsn, n, _ in dumped(invoke("dump", wal_dir).stdout)] == recs
        assert json.loads(invoke("stats", wal_dir, "--json").stdout)["records"] == 6
        assert digests(wal_dir) == before, "an inspection changed a file"
        with pytest.raises(pmemwal.LockedError):        # the writer still holds its lock
            pmemwal.open(wal_dir)
        more = [(wal.append(payload(f"m/{i}", n)), n) for i, n in enumerate([7, 9000])]
        wal.flush()
        assert [(lsn, n) for lsn, n, _ in dumped(invoke("dump", wal_dir).stdout)] == recs + more
        assert inspect.verify(wal_dir).records == 8
    with pmemwal.open(wal_dir) as wal:                   # and the WAL is as the writer left it
        assert [(r.lsn, len(r.payload)) for r in wal.records()] == recs + more


# ---- damage ----------------------------------------------------------------------------

@pytest.mark.parametrize("after", ["crash", "clean_close"])
def test_flipped_byte_mid_log(wal_dir, mode, after):
    """``crash``: the checkpoint a crash would have left (the start): the valid records
    after the damage prove it.  ``clean_close``: the damage lies before the checkpoint's
    end, which says so by itself; open reads from the checkpoint and succeeds, but the
    record raises when read, and open with verify="all" refuses it."""
    recs = make_wal(wal_dir, mode, [3000] * 30, flush_each=True)
    end = end_of(recs)
    if after == "crash":
        rewind_checkpoint(wal_dir)
    bad = recs[12][0]
    flip_byte(wal_dir, bad + REC_HDR + 100)
    before = digests(wal_dir)

    result = invoke("verify", wal_dir)
    assert result.exit_code == 1
    prefix = f"FAIL at {pmemwal.format_lsn(bad)} (segment 0000000000000000): CRC mismatch"
    if after == "crash":
        assert result.stdout.startswith(f"{prefix}; the valid record at ")
        assert result.stdout.splitlines()[1] == (
            "checkpoint: end 0/2018, last 0/0, oldest segment 0000000000000000, not clean")
    else:
        assert result.stdout.startswith(f"{prefix}, before the checkpoint's end "
                                        f"{pmemwal.format_lsn(end)}: this record had been made "
                                        "durable")
        assert result.stdout.splitlines()[1].startswith(
            f"checkpoint: end {pmemwal.format_lsn(end)}, ")
    assert result.stdout.splitlines()[2] == f"to repair: `pmemwal repair {wal_dir}` shows " \
        "what a cut there keeps and sets aside, and makes it; or open with " \
        "on_corruption='truncate', verify='all'"
    assert len(result.stdout.splitlines()) == 3
    report = json.loads(invoke("verify", wal_dir, "--json").stdout)
    assert not report["ok"] and report["first_problem"]["lsn"] == bad
    assert report["first_problem"]["kind"] == "damage" and report["records"] == 12

    result = invoke("dump", wal_dir)
    assert result.exit_code == 1
    assert [lsn for lsn, _, _ in dumped(result.stdout)] == [lsn for lsn, _ in recs[:12]]
    assert f"stopped: damage at {pmemwal.format_lsn(bad)} (segment 0000000000000000): CRC mismatch" \
        in result.stdout
    stats = json.loads(invoke("stats", wal_dir, "--json").stdout)
    assert stats["records"] == 12 and stats["end"]["kind"] == "damage"
    assert stats["problems"][0]["lsn"] == bad
    assert digests(wal_dir) == before

    with pytest.raises(pmemwal.CorruptionError) as info:   # open agrees
        pmemwal.open(wal_dir, verify="all")
    assert info.value.lsn == bad
    if after == "crash":
        with pytest.raises(pmemwal.CorruptionError) as info:
            pmemwal.open(wal_dir)
        assert info.value.lsn == bad
    else:
        with pmemwal.open(wal_dir) as wal, pytest.raises(pmemwal.CorruptionError) as info:
            list(wal.records())
        assert info.value.lsn == bad


def test_torn_tail(wal_dir, mode):
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        for i, n in enumerate([100, 9000, 0, 3000]):
            wal.append(payload(f"f/{i}", n), flush=True)
        unflushed = [(wal.append(payload(f"u/{i}", n)), n) for i, n in enumerate([500, 64, 1200])]
    last_lsn, last_n = unflushed[-1]
    rewind_checkpoint(wal_dir)              # a crash, not a clean close: the checkpoint of open
    stream_write(wal_dir, last_lsn, payload("garbage", rec_size(last_n)))   # a torn last record
    before = digests(wal_dir)

    result = invoke("verify", wal_dir)
    assert result.exit_code == 0
    at = pmemwal.format_lsn(last_lsn)
    assert result.stdout.splitlines()[0] == f"OK: 6 records, 1 segments, end {at}"
    assert result.stdout.splitlines()[1] == ("checkpoint: end 0/2018, last 0/0, oldest segment "
                                             "0000000000000000, not clean")
    assert re.fullmatch(rf"note: torn tail at {re.escape(at)}: \d+ bytes after the last record "
                        r"would be cut on open", result.stdout.splitlines()[2])
    report = inspect.verify(wal_dir)
    assert report.ok and report.torn_tail.lsn == last_lsn and report.torn_tail.cut_bytes > 0
    result = invoke("dump", wal_dir)
    assert result.exit_code == 0 and len(dumped(result.stdout)) == 6
    assert f"stopped: torn tail at {at}" in result.stdout
    assert digests(wal_dir) == before

    with pmemwal.open(wal_dir) as wal:                   # open cuts it there, silently
        assert wal.insert_lsn == last_lsn
    assert invoke("verify", wal_dir).stdout == (
        f"OK: 6 records, 1 segments, end {at}\ncheckpoint: end {at}, last "
        f"{pmemwal.format_lsn(unflushed[-2][0])}, oldest segment 0000000000000000, clean\n")


def test_damage_before_the_checkpoint_is_damage_not_a_torn_tail(wal_dir, mode):
    """The last record, acknowledged and closed cleanly, then garbled (a media error): no
    record follows it to prove it was flushed, but the checkpoint's end lies past it, so
    verify calls it damage (exit 1), as open(verify="all") does; dump stops there with
    exit 1.  With the checkpoint rewound to where a crash would have left it, the same
    bytes are a torn tail again (exit 0, a note), as before checkpoints."""
    with pmemwal.open(wal_dir, mode=mode, segment_size=SEG, background=False) as wal:
        recs = [(wal.append(payload(f"d/{i}", n)), n) for i, n in enumerate([100, 9000, 0, 3000])]
        wal.flush()
    last_lsn, last_n = recs[-1]
    end = end_of(recs)
    at = pmemwal.format_lsn(last_lsn)
    stream_write(wal_dir, last_lsn, payload("garbage", rec_size(last_n)))
    before = digests(wal_dir)

    result = invoke("verify", wal_dir)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"FAIL at {at} (segment 0000000000000000): unknown record type, before the checkpoint's "
        f"end {pmemwal.format_lsn(end)}: this record had been made durable",
        f"checkpoint: end {pmemwal.format_lsn(end)}, last {at}, oldest segment 0000000000000000, "
        "clean", f"to repair: `pmemwal repair {wal_dir}` shows what a cut there keeps and sets "
        "aside, and makes it; or open with on_corruption='truncate', verify='all'"]
    report = inspect.verify(wal_dir)
    assert not report.ok and report.torn_tail is None and report.records == 3
    (problem,) = report.problems
    assert (problem.kind, problem.lsn, problem.segment) == ("damage", last_lsn, 0)
    assert report.checkpoint["end_lsn"] == end and report.checkpoint["clean"]
    result = invoke("dump", wal_dir)
    assert result.exit_code == 1 and len(dumped(result.stdout)) == 3
    assert f"stopped: damage at {at} (segment 0000000000000000): " in result.stdout
    summary = json.loads(invoke("dump", wal_dir, "--json").stdout.splitlines()[-1])
    assert summary["stopped"] == "damage" and summary["checkpoint"]["end_lsn"] == end
    stats = json.loads(invoke("stats", wal_dir, "--json").stdout)
    assert stats["end"]["kind"] == "damage" and stats["checkpoint"]["end_lsn"] == end
    assert digests(wal_dir) == before

    with pytest.raises(pmemwal.CorruptionError, match="before the checkpoint") as info:
        pmemwal.open(wal_dir, verify="all")                # open agrees
    assert info.value.lsn == last_lsn
    assert digests(wal_dir) == before

    rewind_checkpoint(wal_dir)                             # as a crash would have left it
    result = invoke("verify", wal_dir)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == f"OK: 3 records, 1 segments, end {at}"
    assert result.stdout.splitlines()[2].startswith(f"note: torn tail at {at}: ")
    report = inspect.verify(wal_dir)
    assert report.ok and report.torn_tail.lsn == last_lsn
    with pmemwal.open(wal_dir) as wal:                     # open cuts it, silently
        assert wal.insert_lsn == last_lsn


def test_foreign_file(wal_dir):
    recs = make_wal(wal_dir)
    (wal_dir / "notes.txt").write_text("hello")
    result = invoke("verify", wal_dir)            # open ignores it: a note
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].startswith("OK: ")
    assert result.stdout.splitlines()[1].startswith("checkpoint: end ")
    assert result.stdout.splitlines()[2] == ("note: 'notes.txt' is not part of a pmemwal WAL: "
                                             "open ignores it")
    result = invoke("dump", wal_dir)
    assert result.exit_code == 0 and len(dumped(result.stdout)) == len(recs)
    assert invoke("stats", wal_dir).exit_code == 0
    with pmemwal.open(wal_dir) as wal:
        assert len(read_all(wal)) == len(recs)


def test_temp_file_is_a_note(wal_dir):
    make_wal(wal_dir)
    (wal_dir / (segment_name(2) + ".tmp")).write_bytes(bytes(100))
    result = invoke("verify", wal_dir)
    assert result.exit_code == 0
    assert "note: temporary file 0000000000000002.wal.tmp" in result.stdout


@pytest.mark.parametrize("how", ["crc", "magic", "segno", "other_wal"])
def test_bad_segment_header(wal_dir, shm_tmp, how):
    recs = make_wal(wal_dir)
    if how == "crc":
        file_write(wal_dir, SEG + 20, b"\x01")            # segment 1's header, inside the CRC
        reason = "segment header checksum mismatch"
    elif how == "magic":
        file_write(wal_dir, SEG, b"X")
        reason = "not a pmemwal segment (bad magic)"
    elif how == "segno":                                  # segment 0's file named as segment 1
        seg_file(wal_dir, 1).write_bytes(seg_file(wal_dir, 0).read_bytes())
        reason = "header says segment 0000000000000000"
    else:                                                  # segment 1 of another WAL
        other = shm_tmp / "other"
        make_wal(other, sizes=[SPANNING, 5], seed="o")
        shutil.copy(seg_file(other, 1), seg_file(wal_dir, 1))
        reason = "belongs to another WAL"
    result = invoke("verify", wal_dir)
    assert result.exit_code == 1
    assert result.stdout.startswith(f"FAIL at 0/100000 (segment 0000000000000001): {reason}")
    result = invoke("dump", wal_dir)             # the chain runs into segment 1: it stops there
    assert result.exit_code == 1
    spanning = SIZES.index(SPANNING)
    assert [lsn for lsn, _, _ in dumped(result.stdout)] == [lsn for lsn, _ in recs[:spanning]]
    assert "runs into segment 0000000000000001, which cannot be read" in result.stdout
    assert invoke("stats", wal_dir).exit_code == 0
    with pytest.raises(pmemwal.FormatError):
        pmemwal.open(wal_dir)


@pytest.mark.parametrize("length", [0, 100, PAGE, SEG // 2])
def test_truncated_segment(wal_dir, length):
    make_wal(wal_dir)
    os.truncate(seg_file(wal_dir, 1), length)
    result = invoke("verify", wal_dir)
    assert result.exit_code == 1
    assert result.stdout.startswith("FAIL at 0/100000 (segment 0000000000000001): ")
    if length >= PAGE:
        assert f"truncated: {length} bytes, expected {SEG}" in result.stdout
    assert invoke("dump", wal_dir).exit_code == 1
    assert invoke("stats", wal_dir).exit_code == 0


@pytest.mark.parametrize("segno", [2, 9])
def test_garbage_named_like_a_segment(wal_dir, segno):
    make_wal(wal_dir)
    seg_file(wal_dir, segno).write_bytes(random.Random(1).randbytes(5000))
    result = invoke("verify", wal_dir)
    assert result.exit_code == 1
    report = inspect.verify(wal_dir)
    kinds = {(p.kind, p.segment) for p in report.problems}
    assert ("header", segno) in kinds
    if segno == 2:
        assert result.stdout.startswith("FAIL at 0/200000 (segment 0000000000000002): "
                                        "not a pmemwal segment (bad magic)")
    else:       # segments 2..8 are missing too: past the end, where nothing durable was
        assert any(n.startswith("segment 0000000000000002 to 0000000000000008 missing")
                   for n in report.notes), report.notes
    result = invoke("dump", wal_dir)
    assert result.exit_code == 0 and len(dumped(result.stdout)) == len(SIZES)
    assert invoke("stats", wal_dir).exit_code == 0


def test_missing_middle_segment(wal_dir):
    recs = make_wal(wal_dir, sizes=[SPANNING, SPANNING, 10])   # segments 0, 1, 2
    assert recs[-1][0] // SEG == 2
    seg_file(wal_dir, 1).unlink()
    result = invoke("verify", wal_dir)
    assert result.exit_code == 1
    assert result.stdout.startswith("FAIL at 0/100000 (segment 0000000000000001): segment "
                                    "0000000000000001 missing")
    assert invoke("dump", wal_dir).exit_code == 1


def test_a_spare_deleted_past_the_end_is_a_note_as_open_reads_every_record(wal_dir):
    """A segment missing past where the chain ends soundly held nothing durable: verify
    agrees with open, which reads every record (and makes the segment again later)."""
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        recs = [(wal.append(payload(f"s/{i}", 20000)), 20000) for i in range(8)]   # (growth)
        deadline = time.monotonic() + 30
        while len(list(wal_dir.glob("*.wal"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)        # (the background writer makes spares past the end)
    segs = sorted(int(p.stem, 16) for p in wal_dir.glob("*.wal"))
    assert len(segs) >= 3, segs
    seg_file(wal_dir, segs[1]).unlink()
    result = invoke("verify", wal_dir)
    assert result.exit_code == 0, result.stdout
    assert "past the end of the WAL" in result.stdout
    with pmemwal.open(wal_dir, create=False) as wal:
        assert [lsn for lsn, _, _ in read_all(wal)] == [lsn for lsn, _ in recs]


@pytest.mark.parametrize("after", ["crash", "clean_close"])
def test_missing_last_segment_looks_like_the_end(wal_dir, after):
    """A record that claims to run into a missing last segment can't be checked (its CRC
    covers bytes that are gone) and may be a torn header: after a crash (the checkpoint
    rewound), open cuts it as a torn tail, and verify agrees.  After a clean close, the
    checkpoint says the segment held durable records: open refuses, and so does verify."""
    recs = make_wal(wal_dir, sizes=[10, SPANNING])   # the second record runs into segment 1
    assert recs[-1][0] // SEG == 0 and (recs[-1][0] + SPANNING) // SEG == 1
    if after == "crash":
        rewind_checkpoint(wal_dir)
    seg_file(wal_dir, 1).unlink()
    result = invoke("verify", wal_dir)
    if after == "crash":
        assert result.exit_code == 0
        assert "torn tail" in result.stdout
        with pmemwal.open(wal_dir, create=False) as wal:
            assert [lsn for lsn, _, _ in read_all(wal)] == [recs[0][0]]
        return
    assert result.exit_code == 1    # the record that runs into it first: it was durable
    assert result.stdout.startswith(f"FAIL at {pmemwal.format_lsn(recs[-1][0])} (segment "
                                    "0000000000000000): segment missing, before the checkpoint's "
                                    "end ")
    report = inspect.verify(wal_dir)
    assert {(p.kind, p.segment, p.lsn) for p in report.problems} == {
        ("damage", 0, recs[-1][0]), ("gap", 1, SEG)}
    gap = next(p for p in report.problems if p.kind == "gap")
    assert gap.reason.startswith("segment 0000000000000001 is missing, but the checkpoint says")
    with pytest.raises(pmemwal.CorruptionError, match="0000000000000001 is missing") as info:
        pmemwal.open(wal_dir, create=False)
    assert info.value.segment == 1


# ---- arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("0/2018", 0x2018), ("8216", 8216), ("1/0", 1 << 32),
                                         ("ffffffff/FFFFFFFF", (1 << 64) - 1), (" 0/10 ", 16)])
def test_parse_lsn(text, value):
    assert inspect.parse_lsn(text) == value


@pytest.mark.parametrize("text", ["zz", "1/2/3", "-5", "100000000/0", "", "0x10", "1/",
                                  str(1 << 64)])
def test_parse_lsn_rejects(text):
    with pytest.raises(ValueError):
        inspect.parse_lsn(text)


def test_dump_start(wal_dir):
    recs = make_wal(wal_dir)
    third = recs[2][0]
    for text in (pmemwal.format_lsn(third), str(third)):
        result = invoke("dump", wal_dir, "--start", text, "--limit", 2)
        assert result.exit_code == 0
        assert [lsn for lsn, _, _ in dumped(result.stdout)] == [third, recs[3][0]]
        assert "stopped: record limit reached" in result.stdout
    result = invoke("dump", wal_dir, "--start", third + 8)      # not a record
    assert result.exit_code == 1 and dumped(result.stdout) == []
    assert f"no valid record at {pmemwal.format_lsn(third + 8)}" in result.stdout
    for bad in ("zz", "1/2/3", "-1"):
        result = invoke("dump", wal_dir, "--start", bad)
        assert result.exit_code == 2
        assert "Invalid value for '--start'" in result.stderr


@pytest.mark.parametrize("command", ["dump", "verify", "stats"])
def test_not_a_wal(shm_tmp, command):
    (shm_tmp / "empty").mkdir()
    (shm_tmp / "lock-only").mkdir()
    (shm_tmp / "lock-only" / "LOCK").touch()
    (shm_tmp / "file").write_text("x")
    for path, message in [(shm_tmp / "missing", "no such WAL directory"),
                          (shm_tmp / "file", "is not a directory"),
                          (shm_tmp / "empty", "holds no segment files"),
                          (shm_tmp / "lock-only", "holds no segment files")]:
        result = invoke(command, path)
        assert result.exit_code == 1, (path, result.stdout)
        assert message in result.stderr and result.stderr.startswith("Error: ")
    assert not (shm_tmp / "missing").exists() and not (shm_tmp / "empty" / "LOCK").exists()


# ---- fuzz ------------------------------------------------------------------------------------

def test_random_damage_never_raises(shm_tmp):
    """Random byte flips and truncations: verify and dump exit 0 or 1, never with an exception."""
    pristine = shm_tmp / "pristine"
    recs = make_wal(pristine, sizes=[0, 1, 100, 8168, 3000, 20000, 7, SEG - 20_000, 40, 9],
                    flush_each=True)
    end = end_of(recs)
    assert end // SEG == 1 and recs[-1][0] > SEG          # two segments, records in both
    rng = random.Random(20240611)
    work = shm_tmp / "work"
    seen = set()
    for i in range(200):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(pristine, work)
        for _ in range(rng.choice([1, 1, 2, 5])):
            segno = rng.choice([0, 1])
            path = seg_file(work, segno)
            kind = rng.random()
            if kind < 0.1:
                os.truncate(path, rng.choice([0, 10, 64, PAGE, rng.randrange(SEG)]))
                continue
            if kind < 0.3:                        # a segment or page header
                offset = rng.randrange(SEG // PAGE) * PAGE + rng.randrange(64)
            elif kind < 0.9:                      # the records
                offset = rng.randrange(PAGE, end if segno == 0 else end - SEG)
            else:
                offset = rng.randrange(SEG)
            size = path.stat().st_size
            if offset < size:
                with open(path, "r+b") as f:
                    f.seek(offset)
                    byte = f.read(1)[0]
                    f.seek(offset)
                    f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        before = digests(work)
        verdict = invoke("verify", work)
        listing = invoke("dump", work, "--limit", rng.choice([None, 3]) or 1000)
        assert verdict.exit_code in (0, 1) and listing.exit_code in (0, 1), i
        assert digests(work) == before
        seen.add((verdict.exit_code, listing.exit_code))
    assert (1, 1) in seen and (0, 0) in seen


def test_dump_names_log_records(wal_dir):
    """A WAL that holds a pmemwal.Log: each line says the log record's kind and index."""
    with pmemwal.open_log(wal_dir, segment_size=SEG) as log:
        log.append_many([b"a", b"b", b"c"], term=1)
        log.truncate_after(1)
        log.append(b"x", term=2)
        log.set_state(term=2, vote="n1", commit=2)
        log.compact(2)
        log.reset(10, 3)
    lines = invoke("dump", wal_dir).stdout.splitlines()
    assert [line.split(" log: ")[1] for line in lines[:-1]] == [
        "entry 1 term 1", "entry 2 term 1", "entry 3 term 1", "rewind 1", "entry 2 term 2",
        "state term 2 vote n1 commit 2", "snapshot 1 term 1", "snapshot 10 term 3 reset",
        "state term 2 vote n1 commit 2"]
    objects = [json.loads(line) for line in invoke("dump", wal_dir, "--json").stdout.splitlines()]
    assert objects[4]["log"] == {"kind": "entry", "index": 2, "term": 2}
    assert objects[5]["log"] == {"kind": "state", "term": 2, "vote": "n1", "commit": 2}


def test_dump_of_a_plain_wal_says_nothing_of_logs(wal_dir):
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        wal.append(bytes(100))
    result = invoke("dump", wal_dir, "--json")
    assert "log" not in json.loads(result.stdout.splitlines()[0])
    assert " log: " not in invoke("dump", wal_dir).stdout


@pytest.mark.parametrize("args", [["dump"], ["dump", "--json"]])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(wal_dir, args):
    """``pmemwal dump WAL | head``: status 141 (as SIGPIPE gives a C tool), nothing on stderr."""
    import subprocess
    import sys
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        for i in range(5000):
            wal.append(payload(f"r/{i}", 200))
    proc = subprocess.Popen([sys.executable, "-m", "pmemwal.tools.cli", *args, str(wal_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()
    proc.stdout.close()                          # the reader goes, as head does
    stderr = proc.stderr.read()
    assert proc.wait(60) == 141 and stderr == b""


def test_verify_reads_the_wal_from_the_checkpoints_oldest_segment(wal_dir):
    """Segments a crash left below the checkpoint's oldest (a truncation cut short) are no
    part of the WAL: damage in them is no problem, as open does not read them either."""
    with pmemwal.open(wal_dir, segment_size=SEG, background=False, recycle_segments=0) as wal:
        lsns = []
        while wal.insert_lsn < 3 * SEG + 5 * PAGE:
            lsns.append(wal.append(payload(f"v/{len(lsns)}", 10_000)))
        wal.flush()
        left = {n: seg_file(wal_dir, n).read_bytes() for n in (0, 1)}
        wal.truncate(2 * SEG)
    for n, data in left.items():
        seg_file(wal_dir, n).write_bytes(data)
    flip_byte(wal_dir, lsns[3] + REC_HDR + 5)
    report = inspect.verify(wal_dir)
    assert report.ok, report.summary_line()
    assert report.first_lsn >= 2 * SEG and report.records == sum(1 for n in lsns
                                                                 if n >= report.first_lsn)
    assert any("below the checkpoint's oldest" in note for note in report.notes)


def test_verify_reports_a_deleted_checkpoint(wal_dir):
    """The segment headers say the WAL kept a CHECKPOINT: without it open refuses, and
    verify says why; a WAL made before checkpoints verifies as before."""
    with pmemwal.open(wal_dir, segment_size=SEG) as wal:
        for i in range(50):
            wal.append(payload(f"c/{i}", 3000))
    (wal_dir / "CHECKPOINT").unlink()
    report = inspect.verify(wal_dir)
    assert not report.ok and "CHECKPOINT is missing" in report.first_problem.reason
    # damage is always placed (the fuzzer's rule): the first segment, where the open names it
    assert (report.first_problem.segment, report.first_problem.lsn) == (0, PAGE + PAGE_HDR)
    as_made_before_checkpoints(wal_dir)
    assert inspect.verify(wal_dir).ok


@pytest.mark.parametrize("command", ["dump", "verify", "stats", "lost-found"])
def test_every_tool_says_the_same_of_a_path_that_is_no_wal(tmp_path: Path, command: str) -> None:
    """Nothing there: NotFoundError; a file: FormatError; each exit status 1, as a library
    error (not 2, a usage error)."""
    missing = invoke(command, tmp_path / "nothing")
    assert missing.exit_code == 1 and "NotFoundError" in missing.stderr
    (tmp_path / "file").write_text("x")
    file = invoke(command, tmp_path / "file")
    assert file.exit_code == 1 and "FormatError" in file.stderr and "not a directory" in file.stderr
