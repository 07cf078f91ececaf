"""Coverage-guided fuzzing of recovery and ``verify`` over real WAL files (issue 5), with atheris.

Real WAL directories are written once at start-up (1 MiB segments, records of varied sizes, some
spanning pages and segments; one WAL has had segments truncated and recycled, so its spare
segments hold stale pages of an older cycle).  Each fuzz input is a program of mutations, read
with atheris.FuzzedDataProvider: bytes flipped or overwritten with the fuzzer's own bytes, ranges
zeroed or filled, a torn tail, a file truncated, pages duplicated, swapped or moved within and
between segments, a segment file deleted, copied or renamed (with its header rewritten so that it
passes the header check).  The mutated copy is then checked:

* ``pmemwal.tools.inspect.verify`` and ``pmemwal.open`` (``on_corruption="raise"``, then
  ``"truncate"``) raise nothing but ``pmemwal.WALError`` subclasses, and never hang
  (libFuzzer's -timeout);
* a ``CorruptionError`` carries an int ``lsn``, a ``segment`` (the one that LSN lies in, or a
  later one the record runs into) and a reason;
  every problem ``verify`` reports has a kind and a reason, and ``damage`` has LSN and segment;
* what open returns is exactly the records that were written, from the oldest record of the
  first segment present, in order, each at its LSN with its payload: a prefix of the log (for a
  WAL whose first segments were deleted, a prefix of what those segments held onward);
* ``verify`` agrees with open: it is not ``ok`` when open raises CorruptionError, and when it is
  ``ok`` open returns as many records as it counted.

pmemwal's Python modules are instrumented (atheris.instrument_imports), so coverage of recovery,
the segment checks and ``inspect`` guides the fuzzer; the C reader is exercised through them
(build it with PMEMWAL_SANITIZE=address,undefined, as .ci/sanitize does, to catch memory errors).
It lives in tests/fuzz/ rather than benchmarks/ because it is a correctness check; pytest does not
collect it (not test_*.py), CI runs a short smoke run of it from .ci/sanitize.

Smoke run (about 20 s; .ci/sanitize runs one under ASan):
    .venv/bin/python tests/fuzz/atheris_reader.py -runs=1500 -seed=1
Full run (15 minutes; the corpus is kept in /tmp/pmemwal-fuzz-corpus, crashes land in /tmp/fuzz/;
-fork=1 -ignore_crashes=1 goes on past a crash and counts them):
    mkdir -p /tmp/pmemwal-fuzz-corpus /tmp/fuzz && .venv/bin/python tests/fuzz/atheris_reader.py \
        -fork=1 -ignore_crashes=1 -max_total_time=900 -timeout=30 -print_final_stats=1 \
        -artifact_prefix=/tmp/fuzz/ /tmp/pmemwal-fuzz-corpus
Replay a crash:  .venv/bin/python tests/fuzz/atheris_reader.py /tmp/fuzz/crash-<sha1>
Refresh the saved corpus (the seeds every run starts from) after a long run:
    mkdir /tmp/min && .venv/bin/python tests/fuzz/atheris_reader.py -merge=1 /tmp/min \
        /tmp/pmemwal-fuzz-corpus && for f in /tmp/min/*; do base64 -w0 "$f"; echo; done \
        > tests/fuzz/corpus.txt
Any libFuzzer flag works (-jobs, -workers, -max_len...).  Without a corpus directory a run starts from the seeds in a scratch
one.  Needs atheris (in the ``test`` extra on x86-64 Linux).
"""

from __future__ import annotations

import base64
import os
import random
import shlex
import shutil
import sys
import tempfile

import atheris

# Import the heavy dependencies first, so that only pmemwal itself is instrumented.
import numpy  # noqa: F401

with atheris.instrument_imports(include=["pmemwal"]):
    import pmemwal
    from pmemwal.tools import inspect as wal_inspect
    from pmemwal.errors import CorruptionError, WALError
    from pmemwal.format import HEADER_SIZE, PAGE_SIZE, SegmentHeader, segment_name

SEG = 1 << 20
PAGES = SEG // PAGE_SIZE
SIZES = [0, 1, 7, 24, 100, 3000, 8144, 8168, 8200, 20000, 70000]
PROBLEM_KINDS = {"foreign", "io", "header", "size", "gap", "damage"}
OPS = 14
WORK_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


# ---- the pristine WALs ----------------------------------------------------------------

class Base:
    """A written WAL: its segment files' bytes and every record written to it (those in
    segments since truncated too: a recycled segment still holds some of them)."""

    def __init__(self, files: dict[int, bytes], expected: list[tuple[int, bytes]], wal_id: bytes):
        self.files = files
        self.expected = expected
        self.wal_id = wal_id
        self.index = {lsn: i for i, (lsn, _) in enumerate(expected)}


def _snapshot(path: str, written: dict[int, bytes]) -> Base:
    files = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".wal"):
            with open(os.path.join(path, name), "rb") as f:
                files[int(name[:-4], 16)] = f.read()
    with pmemwal.open(path, create=False, background=False) as wal:
        got = [(rec.lsn, bytes(rec.payload)) for rec in wal.records()]
        wal_id = wal.wal_id
    expected = [(lsn, written[lsn]) for lsn in sorted(written)]   # all of them, truncated too
    assert got == [r for r in expected if r[0] >= got[0][0]], "the WAL does not read back"
    return Base(files, expected, wal_id)


def build_bases(root: str) -> list[Base]:
    """Three WALs: two and a bit segments of mixed sizes (buffered and direct mode), and one
    that has been truncated and has recycled segments behind it."""
    bases = []
    for n, (mode, target, trunc) in enumerate([("buffered", 2 * SEG + 40 * PAGE_SIZE, False),
                                               ("direct", 2 * SEG + 5 * PAGE_SIZE, False),
                                               ("buffered", 5 * SEG + 70 * PAGE_SIZE, True)]):
        rng = random.Random(n)
        path = os.path.join(root, f"base{n}")
        written: dict[int, bytes] = {}
        with pmemwal.open(path, mode=mode, segment_size=SEG, background=False,
                          prepare_segments=0, recycle_segments=2) as wal:
            while wal.insert_lsn < target:
                data = rng.randbytes(rng.choice(SIZES))
                written[wal.append(data)] = data
                if trunc and wal.insert_lsn > 2 * SEG and rng.random() < 0.01:
                    wal.flush()
                    wal.truncate(max(written) - SEG)
            wal.flush()
        bases.append(_snapshot(path, written))
    return bases


# ---- mutations -------------------------------------------------------------------------

def _offset(fdp: atheris.FuzzedDataProvider, length: int) -> int:
    """An offset in a file: mostly near a page boundary (headers), sometimes anywhere."""
    if length <= 0:
        return 0
    if fdp.ConsumeBool():
        page = fdp.ConsumeIntInRange(0, (length - 1) // PAGE_SIZE)
        return min(page * PAGE_SIZE + fdp.ConsumeIntInRange(0, 63), length - 1)
    return fdp.ConsumeIntInRange(0, length - 1)


def mutate(fdp: atheris.FuzzedDataProvider, base: Base, files: dict[int, bytearray]) -> list[str]:
    """Apply the mutations the input describes; returns their names (for the crash report)."""
    done = []
    for _ in range(fdp.ConsumeIntInRange(1, 6)):
        if not files:
            break
        segnos = sorted(files)
        seg = segnos[fdp.ConsumeIntInRange(0, len(segnos) - 1)]
        other = segnos[fdp.ConsumeIntInRange(0, len(segnos) - 1)]
        data = files[seg]
        op = fdp.ConsumeIntInRange(0, OPS - 1)
        at = _offset(fdp, len(data))
        if op == 0:                                          # flip bits of one byte
            if data:
                data[at] ^= fdp.ConsumeIntInRange(1, 255)
            done.append(f"flip {seg:X}@{at}")
        elif op == 1:                                        # zero a range
            n = fdp.ConsumeIntInRange(1, 3 * PAGE_SIZE)
            data[at:at + n] = bytes(len(data[at:at + n]))
            done.append(f"zero {seg:X}@{at}+{n}")
        elif op == 2:                                        # fill a range with one byte
            n = fdp.ConsumeIntInRange(1, 2 * PAGE_SIZE)
            data[at:at + n] = bytes([fdp.ConsumeIntInRange(0, 255)]) * len(data[at:at + n])
            done.append(f"fill {seg:X}@{at}+{n}")
        elif op == 3:                                        # the fuzzer's own bytes
            chunk = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 64))
            data[at:at + len(chunk)] = chunk[: len(data) - at]
            done.append(f"write {seg:X}@{at}+{len(chunk)}")
        elif op == 4:                                        # torn tail: zeros to the end
            data[at:] = bytes(len(data) - at)
            done.append(f"tear {seg:X}@{at}")
        elif op == 5:                                        # truncate the file
            del data[at:]
            done.append(f"truncate {seg:X}@{at}")
        elif op in (6, 7):                                   # copy a page (7: swap two pages)
            src = files[other]
            p, q = fdp.ConsumeIntInRange(0, PAGES - 1), fdp.ConsumeIntInRange(0, PAGES - 1)
            a, b = bytes(src[p * PAGE_SIZE:(p + 1) * PAGE_SIZE]), bytes(data[q * PAGE_SIZE:(q + 1) * PAGE_SIZE])
            data[q * PAGE_SIZE:q * PAGE_SIZE + len(a)] = a[: max(0, len(data) - q * PAGE_SIZE)]
            if op == 7:
                src[p * PAGE_SIZE:p * PAGE_SIZE + len(b)] = b[: max(0, len(src) - p * PAGE_SIZE)]
            done.append(f"{'swap' if op == 7 else 'copy'} page {other:X}:{p} -> {seg:X}:{q}")
        elif op == 8:                                        # move bytes (unaligned)
            src = files[other]
            frm, n = _offset(fdp, len(src)), fdp.ConsumeIntInRange(1, 2 * PAGE_SIZE)
            chunk = bytes(src[frm:frm + n])
            data[at:at + len(chunk)] = chunk[: len(data) - at]
            done.append(f"move {other:X}@{frm}+{n} -> {seg:X}@{at}")
        elif op == 9:                                        # delete a segment file
            del files[seg]
            done.append(f"delete {seg:X}")
        elif op in (10, 11):                                 # copy (10) or move (11) a segment
            new = fdp.ConsumeIntInRange(max(0, segnos[0] - 1), segnos[-1] + 2)
            files[new] = bytearray(data) if op == 10 else files.pop(seg)
            if fdp.ConsumeBool():                            # with a header that says so
                files[new][:HEADER_SIZE] = SegmentHeader(new, SEG, base.wal_id).pack()[:HEADER_SIZE]
            done.append(f"{'copy' if op == 10 else 'rename'} {seg:X} -> {new:X}")
        elif op == 12:                                       # a whole stale segment over another
            files[seg] = bytearray(files[other])
            files[seg][:HEADER_SIZE] = SegmentHeader(seg, SEG, base.wal_id).pack()[:HEADER_SIZE]
            done.append(f"stale {other:X} as {seg:X}")
        else:                                                # a valid page header, moved in LSN
            p = fdp.ConsumeIntInRange(1, PAGES - 1)
            hdr = data[p * PAGE_SIZE:p * PAGE_SIZE + 24]
            q = fdp.ConsumeIntInRange(1, PAGES - 1)
            data[q * PAGE_SIZE:q * PAGE_SIZE + len(hdr)] = hdr
            done.append(f"header {seg:X}:{p} -> {q}")
    return done


# ---- one run ---------------------------------------------------------------------------

class Lie(AssertionError):
    """A promise broken: the fuzzer reports it as a crash."""


def check_corruption(error: CorruptionError, segnos: list[int]) -> None:
    if not (isinstance(error.lsn, int) and isinstance(error.segment, int)
            and isinstance(error.reason, str) and error.reason):
        raise Lie(f"CorruptionError without lsn/segment/reason: {error!r}")
    # the segment the damage is in: the record's own, or one it runs into (a deleted one)
    if not error.lsn // SEG <= error.segment <= max(segnos, default=0) + 1:
        raise Lie(f"CorruptionError at {error.lsn} names segment {error.segment}")


def check_records(base: Base, wal, segnos: list[int]) -> int:
    """What open returned is the log from the first segment present onward, in order; the
    batch scan and the reads by LSN (in reverse) say the same."""
    got = [(rec.lsn, bytes(rec.payload)) for rec in wal.records()]
    batched = [(lsn, bytes(p)) for batch in wal.scan(max_records=5, max_bytes=10000)
               for lsn, p in zip(batch.lsns.tolist(), batch.payloads())]
    again = wal.read_many([lsn for lsn, _ in reversed(got)])
    if batched != got or [bytes(p) for p in again.payloads()] != [p for _, p in reversed(got)]:
        raise Lie("scan() or read_many() disagree with records()")
    start = next((i for i, (lsn, _) in enumerate(base.expected) if lsn >= segnos[0] * SEG),
                 len(base.expected))
    want = base.expected[start:start + len(got)]
    if got != want:
        for i, (g, w) in enumerate(zip(got, want + [(None, b"")] * len(got))):
            if g != w:
                raise Lie(f"record {i}: got LSN {g[0]} ({len(g[1])} bytes), "
                          f"expected LSN {w[0]} ({len(w[1])} bytes)")
    return len(got)


def run_one(data: bytes, bases: list[Base], work: str) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    base = bases[fdp.ConsumeIntInRange(0, len(bases) - 1)]
    mode = "direct" if fdp.ConsumeBool() else "buffered"
    files = {segno: bytearray(b) for segno, b in base.files.items()}
    applied = mutate(fdp, base, files)

    path = os.path.join(work, "wal")
    shutil.rmtree(path, ignore_errors=True)
    os.mkdir(path)
    for segno, content in files.items():
        with open(os.path.join(path, segment_name(segno)), "wb") as f:
            f.write(content)
    segnos = sorted(files)
    try:
        try:
            report = wal_inspect.verify(path)
        except WALError:
            report = None
        if report is not None:
            for problem in report.problems:
                if problem.kind not in PROBLEM_KINDS or not problem.reason:
                    raise Lie(f"verify: problem without kind/reason: {problem!r}")
                if problem.kind == "damage" and (problem.lsn is None or problem.segment is None):
                    raise Lie(f"verify: damage without LSN/segment: {problem!r}")

        corrupt = None
        for on_corruption in ("raise", "truncate"):
            try:
                wal = pmemwal.open(path, mode=mode, create=False, on_corruption=on_corruption,
                                   background=False, prepare_segments=0)
            except CorruptionError as error:
                check_corruption(error, segnos)
                if on_corruption == "truncate":
                    return          # a damaged segment header found while cutting, say
                corrupt = error
                continue
            except WALError:
                return              # a typed refusal: foreign/short/missing segments
            with wal:
                kept = check_records(base, wal, segnos)
            if report is not None and corrupt is not None and report.ok:
                raise Lie(f"verify says ok, open raised {corrupt!r}")
            if report is not None and report.ok and on_corruption == "raise" and kept != report.records:
                raise Lie(f"verify counted {report.records} records, open returned {kept}")
            return
    except Exception:
        # name what was done, for the report; the traceback follows
        sys.stderr.write(f"\nbase {bases.index(base)}, open mode {mode}, mutations: {applied}\n")
        raise


def seeds() -> list[bytes]:
    """A few random programs, and the saved corpus (tests/fuzz/corpus.txt, base64 lines)."""
    rng = random.Random(5)
    found = [rng.randbytes(n) for n in (8, 16, 24, 40, 64, 100, 160, 256)]
    saved = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")
    if os.path.exists(saved):
        with open(saved) as f:
            found += [base64.b64decode(line) for line in f if line.strip() and line[0] != "#"]
    return found


def fuzz(work: str) -> None:
    bases = build_bases(work)
    # libFuzzer's -fork/-jobs modes rerun argv[0] through the shell: make that this Python
    argv = [f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))}", *sys.argv[1:]]
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    if not corpus:                   # no corpus: start from the seeds, in a scratch one
        corpus = [os.path.join(work, "corpus")]
        os.mkdir(corpus[0])
        argv.append(corpus[0])
    if len(corpus) == 1 and os.path.isdir(corpus[0]) and not os.listdir(corpus[0]):
        for i, seed in enumerate(seeds()):
            with open(os.path.join(corpus[0], f"seed-{i}"), "wb") as f:
                f.write(seed)
    print(f"atheris_reader: pmemwal._core from {pmemwal._core.__file__}", file=sys.stderr)
    atheris.Setup(argv, lambda data: run_one(data, bases, work))
    atheris.Fuzz()


def main() -> None:
    """Fuzz in a child process: libFuzzer leaves with exit(), and the parent then removes
    the scratch directory (on /dev/shm) whatever the end."""
    work = tempfile.mkdtemp(dir=WORK_ROOT, prefix="pmemwal-atheris-")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            fuzz(work)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    try:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except KeyboardInterrupt:
                continue            # the child got it too; wait for its stats
    finally:
        shutil.rmtree(work, ignore_errors=True)
    code = os.waitstatus_to_exitcode(status)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
