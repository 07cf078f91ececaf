"""Property-based fuzzing of the reader, and of pmemwal.Log, over real WAL files (issue 5, item 3).

A small WAL (two 1 MiB segments, records of mixed sizes, some spanning pages
and the segment boundary) is written once; each example copies it, applies a
few random mutations (bytes flipped, ranges zeroed, a file truncated, a page
copied over another, bytes moved between segments) and then checks the
promises: opening never crashes (a typed WALError or a WAL), every record it
returns is one that was written, at the LSN it was written at, in order and
with no gap (a prefix of the log); ``verify`` never raises either.  The WAL was
closed cleanly, so its checkpoint vouches for every record: damage before it is
not read by open, and reading the damaged record must raise CorruptionError
(after exactly the records before it), never return something else; verify then
reports it, and open with verify="all" cuts the WAL exactly there.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import pmemwal
from pmemwal.tools import inspect

from conftest import rewind_checkpoint

SEG = 1 << 20
PAGE = 8192
# random damage: an open may cut the WAL, set records aside, read every record or not use a
# Log's index, and say so (RecoveryWarning); these tests hold it to what it returns instead
RECOVERY_MAY_WARN = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A WAL and the records written to it: {lsn: payload}."""
    path = tmp_path_factory.mktemp("fuzz") / "wal"
    rng = random.Random(7)
    written = {}
    with pmemwal.open(path, mode="buffered", segment_size=SEG, background=False) as wal:
        while wal.insert_lsn < SEG + 40 * PAGE:
            size = rng.choice([0, 1, 7, 100, 3000, 8168, 8200, 20000, 70000])
            data = rng.randbytes(size)
            written[wal.append(data)] = data
        wal.flush()
    return path, written


@pytest.fixture(scope="module")
def pristine_crashed(pristine, tmp_path_factory):
    """The same WAL with the checkpoint a crash would have left (the start, not the clean
    close's end): open reads, and judges, every record again."""
    source, written = pristine
    path = tmp_path_factory.mktemp("fuzz-crashed") / "wal"
    shutil.copytree(source, path)
    rewind_checkpoint(path)
    return path, written


MUTATION = st.tuples(
    st.sampled_from(["flip", "zero", "truncate", "copy_page", "move"]),
    st.integers(0, 1),                     # which segment file
    st.integers(0, SEG - 1),               # where
    st.integers(1, 3 * PAGE),              # how much
    st.integers(0, 255),                   # a byte value / another offset seed
)


def mutate(path, mutation) -> None:
    kind, segno, where, size, seed = mutation
    files = sorted(p for p in os.listdir(path) if p.endswith(".wal"))
    target = os.path.join(path, files[segno % len(files)])
    with open(target, "r+b") as f:
        f.seek(0, os.SEEK_END)
        length = f.tell()
        where %= max(length, 1)
        if kind == "flip":
            f.seek(where)
            byte = f.read(1) or b"\0"
            f.seek(where)
            f.write(bytes([byte[0] ^ (seed | 1)]))
        elif kind == "zero":
            f.seek(where)
            f.write(bytes(min(size, length - where)))
        elif kind == "truncate":
            f.truncate(where)
        else:  # copy a page (or bytes of the other segment) over this place
            other = os.path.join(path, files[(segno + (kind == "move")) % len(files)])
            with open(other, "rb") as g:
                g.seek((seed * PAGE) % SEG)
                chunk = g.read(size)
            f.seek(where)
            f.write(chunk[: max(0, length - where)])


# PMEMWAL_FUZZ_EXAMPLES: examples per run (a long run: PMEMWAL_FUZZ_EXAMPLES=20000; .ci/sanitize
# uses fewer, as every example is slower under AddressSanitizer).
EXAMPLES = int(os.environ.get("PMEMWAL_FUZZ_EXAMPLES", "120"))


@RECOVERY_MAY_WARN
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
@pytest.mark.parametrize("after", ["clean_close", "crash"])
def test_mutated_wal_never_crashes_or_lies(request, tmp_path_factory, after, mutations):
    source, written = request.getfixturevalue("pristine" if after == "clean_close"
                                              else "pristine_crashed")
    path = tmp_path_factory.mktemp("case") / "wal"
    shutil.copytree(source, path)
    for mutation in mutations:
        mutate(path, mutation)

    report = inspect.verify(path)  # must not raise, whatever the files hold
    assert isinstance(report.ok, bool)
    try:
        wal = pmemwal.open(path, mode="buffered", on_corruption="truncate", background=False)
    except pmemwal.WALError as error:
        event(f"refused: {type(error).__name__}")
        return  # a typed refusal (foreign or damaged header, short segment file) is a right answer
    with wal:
        kept, error = read_checked(wal, written)
    if error is None:
        event("opened: all records kept" if kept == len(written) else "opened: cut short")
        return
    assert after == "clean_close", f"open read every record, yet reading raised {error}"
    # Damage before the checkpoint (the clean close's, at the end): open reads from there and
    # cuts nothing; the damaged record raises when read, after the records before it, and
    # verify (which reads them all, as open with verify="all") calls it damage.
    event("opened: damage before the checkpoint raised when read")
    assert not report.ok, f"verify found nothing wrong, reading raised {error}"
    try:
        wal = pmemwal.open(path, mode="buffered", on_corruption="truncate", background=False,
                           verify="all")
    except pmemwal.WALError as refusal:
        event(f"verify='all' refused: {type(refusal).__name__}")
        return
    with wal:
        assert read_checked(wal, written) == (kept, None), "the cut is not where reading stopped"


def read_checked(wal, written) -> tuple[int, pmemwal.CorruptionError | None]:
    """Read every record, checking each against what was written: how many were read,
    and the CorruptionError reading stopped at (None: it reached the end).  The batch
    scan and the reads by LSN say the same of every record."""
    kept, error = read_one_by_one(wal, written)
    batched, batch_error = read_batched(wal, written)
    assert batched == sorted(written)[:kept] and repr(batch_error) == repr(error)
    order = np.random.default_rng(kept).permutation(np.array(batched, dtype=np.uint64))
    again = wal.read_many(order)
    assert [bytes(p) for p in again.payloads()] == [written[int(lsn)] for lsn in order]
    if error is not None:
        with pytest.raises((pmemwal.CorruptionError, ValueError)):
            wal.read_many([error.lsn])
    return kept, error


def read_batched(wal, written) -> tuple[list[int], pmemwal.CorruptionError | None]:
    """The LSNs scan() read, in small batches, each payload checked; and its error."""
    lsns: list[int] = []
    try:
        for batch in wal.scan(max_records=7, max_bytes=3000):
            for lsn, payload in zip(batch.lsns.tolist(), batch.payloads()):
                assert bytes(payload) == written[lsn]
                lsns.append(lsn)
    except pmemwal.CorruptionError as error:
        return lsns, error
    return lsns, None


def read_one_by_one(wal, written) -> tuple[int, pmemwal.CorruptionError | None]:
    order = sorted(written)
    previous = kept = 0
    try:
        for rec in wal.records():
            kept += 1
            assert rec.lsn in written, f"record at {rec.lsn} was never written"
            assert bytes(rec.payload) == written[rec.lsn]
            assert rec.lsn > previous
            previous = rec.lsn
    except pmemwal.CorruptionError as error:
        # the chain stops at the next record written, not somewhere else
        assert kept < len(order) and error.lsn == order[kept], (error, kept)
        return kept, error
    # the chain admits no gaps: what survives is the oldest records, in full
    assert previous == 0 or order[kept - 1] == previous
    return kept, None


@pytest.fixture(scope="module")
def pristine_log(tmp_path_factory):
    """A log (entries of mixed sizes, terms rising, a hard state) and its entries in order."""
    path = tmp_path_factory.mktemp("fuzz-log") / "log"
    rng = random.Random(11)
    entries = []
    with pmemwal.open_log(path, mode="buffered", segment_size=SEG, background=False) as log:
        while log.wal.insert_lsn < SEG + 40 * PAGE:
            term = 1 + len(entries) // 50
            data = rng.randbytes(rng.choice([0, 1, 100, 3000, 8168, 20000, 70000]))
            log.append(data, term)
            entries.append((term, data))
            if len(entries) == 30:
                log.set_state(term=1, vote="a", commit=30)
    return path, entries


@RECOVERY_MAY_WARN
@settings(max_examples=EXAMPLES // 2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
# the last record, below the checkpoint (so not read at open), damaged: close stored the
# index after it and raised the reader's ValueError (issue 30's sanitizer run found it)
@example(mutations=[("flip", 0, 64, 1, 1), ("flip", 0, 64, 1, 1), ("flip", 1, 293688, 1, 1),
                    ("zero", 0, 64, 8129, 1)])
def test_mutated_log_never_crashes_or_lies(pristine_log, tmp_path_factory, mutations):
    """pmemwal.Log over damaged files: a typed refusal, or a prefix of the entries written
    (its index rebuilt by the native batch scan, Reader.heads, over whatever bytes are there)."""
    source, entries = pristine_log
    path = tmp_path_factory.mktemp("case") / "log"
    shutil.copytree(source, path)
    for mutation in mutations:
        mutate(path, mutation)
    try:
        log = pmemwal.open_log(path, mode="buffered", on_corruption="truncate", background=False)
    except pmemwal.WALError as error:
        event(f"refused: {type(error).__name__}")
        return
    with log:
        got = []
        try:  # damage under the stored index is found when read (CorruptionError)
            for e in log:
                got.append((e.term, bytes(e.payload)))
        except pmemwal.CorruptionError:
            event("opened: damage found when read")
        assert log.first_index == 1 and got == entries[:len(got)]
        assert log.state in (pmemwal.HardState(), pmemwal.HardState(1, "a", 30))
        event("opened: all entries kept" if len(got) == len(entries) else "opened: cut short")
