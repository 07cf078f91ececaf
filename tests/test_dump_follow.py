"""``pmemwal dump``'s --end, its payload text column, and --follow.

- --end LSN: the dump stops before the first record at or past LSN (an LSN inside a
  record, or a record's own), and the summary says so;
- --preview: beside the hex, the same bytes as text (printable ASCII as is, others as
  '.'), in lines and in JSON ("text" beside "data");
- --follow: records a writer process appends after the dump started are printed as they
  become durable, until --end (or --limit); Ctrl-C (SIGINT) ends it with the summary,
  exit 0.

The follow tests run the command as a process beside a writer process (real files,
real processes); they wait for lines, never for a time.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import textwrap

import pytest

import pmemwal
from pmemwal.tools.cli import main
from pmemwal.tools.inspect import parse_lsn
from conftest import SEG, child_env, cli_runner, next_lsn, payload

LINE = re.compile(r"^lsn: (\S+) +len: +(\d+) prev: (\S+) +crc: 0x[0-9a-f]{8}")


def invoke(*args):
    result = cli_runner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {result.exception!r}\n{result.stdout}\n{result.stderr}"
    return result


def listed(output: str) -> list[int]:
    """The LSN of each record line of a dump."""
    return [parse_lsn(m[1]) for m in map(LINE.match, output.splitlines()) if m]


def make_wal(path, payloads) -> list[int]:
    with pmemwal.open(path, segment_size=SEG, background=False) as wal:
        return [wal.append(p) for p in payloads]


# ---- --end --------------------------------------------------------------------------

def test_end_stops_before_the_first_record_at_or_past_it(wal_dir):
    lsns = make_wal(wal_dir, [payload(f"e/{i}", 300 + i) for i in range(10)])
    for end, shown in [(lsns[6], lsns[:6]),                 # a record's own LSN: not shown
                       (lsns[6] + 8, lsns[:7]),             # inside record 6: it is shown
                       (lsns[0], [])]:
        for text in (pmemwal.format_lsn(end), str(end)):
            result = invoke("dump", wal_dir, "--end", text)
            assert result.exit_code == 0, result.output
            assert listed(result.stdout) == shown
            stop = lsns[len(shown)]
            assert result.stdout.splitlines()[-1].endswith(
                f"stopped: --end {pmemwal.format_lsn(end)} reached; the next record is at "
                f"{pmemwal.format_lsn(stop)}")
    result = invoke("dump", wal_dir, "--start", lsns[2], "--end", lsns[5], "--json")
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["lsn"] for o in objects[:-1]] == lsns[2:5]
    assert objects[-1]["stopped"] == "end" and objects[-1]["end_lsn"] == lsns[5]
    # past the last record: the end of the WAL comes first
    result = invoke("dump", wal_dir, "--end", "ffff/0")
    assert listed(result.stdout) == lsns and "stopped: end of WAL" in result.stdout
    result = invoke("dump", wal_dir, "--end", "zz")
    assert result.exit_code == 2 and "Invalid value for '--end'" in result.stderr


# ---- the text column -----------------------------------------------------------------

MIXED = b"Ab\x00z \x7f\x80\xffq~\n\t|9"


def test_preview_shows_the_bytes_as_text(wal_dir):
    make_wal(wal_dir, [MIXED, b"", b"hi"])
    lines = invoke("dump", wal_dir, "--preview", 8).stdout.splitlines()
    assert lines[0].endswith(f" data: {MIXED[:8].hex()}... |Ab.z ...|")
    assert lines[1].endswith(" data: " + " " * 19 + " ||")              # aligned: 8 bytes + ...
    assert lines[2].endswith(" data: 6869" + " " * 15 + " |hi|")
    assert len({line.index("|") for line in lines[:3]}) == 1
    wide = invoke("dump", wal_dir, "--preview", 64).stdout.splitlines()[0]
    assert wide.endswith(f" data: {MIXED.hex()}{' ' * (2 * (64 - len(MIXED)) + 3)} "
                         "|Ab.z ...q~..|9|")
    objects = [json.loads(line) for line in
               invoke("dump", wal_dir, "--preview", 13, "--json").stdout.splitlines()]
    assert (objects[0]["data"], objects[0]["text"]) == (MIXED[:13].hex() + "...", "Ab.z ...q~..|")
    assert (objects[1]["data"], objects[1]["text"]) == ("", "")
    assert (objects[2]["data"], objects[2]["text"]) == ("6869", "hi")
    assert "text" not in json.loads(invoke("dump", wal_dir, "--json").stdout.splitlines()[0])


# ---- --follow ------------------------------------------------------------------------

SIZE = 500                  # every record's payload bytes (its LSNs are predictable)
WRITER = textwrap.dedent("""
    import sys, pmemwal
    with pmemwal.open(sys.argv[1], segment_size=int(sys.argv[2]), background=False) as wal:
        for line in sys.stdin:          # "N SIZE": append N records, flushed one by one
            count, size = map(int, line.split())
            for i in range(count):
                lsn = wal.append(b"x" * size if size < 1000 else bytes(range(256)) * (size // 256))
                wal.flush(lsn)
                print(lsn, flush=True)
""")


def _interactive_sigint() -> None:
    """In the child, before exec: SIGINT as a terminal's Ctrl-C gives it, whatever the test
    runner passed down (a shell that starts it in the background ignores SIGINT, and Python
    keeps an ignored SIGINT ignored: Ctrl-C would never reach dump)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


class Proc:
    """A process whose stdout lines are read by a thread: ``line()`` waits (30 s at most)."""

    def __init__(self, args, stdin=None) -> None:
        self.proc = subprocess.Popen([sys.executable, *map(str, args)], env=child_env(),
                                     stdin=stdin, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     preexec_fn=_interactive_sigint)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self) -> str:
        got = self.lines.get(timeout=30)
        assert got is not None, f"it ended: {self.proc.wait(30)} {self.proc.stderr.read()}"
        return got

    def rest(self) -> list[str]:
        """Its remaining lines, once it exits by itself."""
        out = []
        while (got := self.lines.get(timeout=60)) is not None:
            out.append(got)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def writer(wal_dir):
    """A writer process holding the WAL open: ``append(n)`` returns the n LSNs it flushed."""
    proc = Proc(["-c", WRITER, wal_dir, SEG], stdin=subprocess.PIPE)

    def append(n: int, size: int = SIZE) -> list[int]:
        proc.proc.stdin.write(f"{n} {size}\n")
        proc.proc.stdin.flush()
        return [int(proc.line()) for _ in range(n)]

    yield append
    if proc.proc.poll() is None:
        proc.proc.stdin.close()
    assert proc.proc.wait(30) == 0, proc.proc.stderr.read()


def dump_follow(wal_dir, *args) -> Proc:
    return Proc(["-m", "pmemwal.tools.cli", "dump", wal_dir, "--follow", *args])


def lsn_of_line(line: str) -> int:
    match = LINE.match(line)
    assert match, line
    return parse_lsn(match[1])


def test_follow_shows_records_appended_after_it_started_until_end(wal_dir, writer):
    first = writer(3)
    later = [next_lsn(first[-1], SIZE)]
    while len(later) < 6:
        later.append(next_lsn(later[-1], SIZE))
    end = later[4]                               # it shows later[:4], not the record at end
    dumps = [dump_follow(wal_dir, "--end", pmemwal.format_lsn(end)),
             dump_follow(wal_dir, "--limit", 5, "--preview", 4)]
    try:
        for proc in dumps:
            assert [lsn_of_line(proc.line()) for _ in first] == first   # the records on disk
        assert writer(6) == later               # now the writer goes on
        out = dumps[0].rest()
        assert [lsn_of_line(line) for line in out[:-1]] == later[:4]
        assert out[-1].endswith(f"stopped: --end {pmemwal.format_lsn(end)} reached; the next "
                                f"record is at {pmemwal.format_lsn(end)}")
        assert out[-1].startswith(f"records: 7, payload bytes: {7 * SIZE}, first: ")
        out = dumps[1].rest()
        assert [lsn_of_line(line) for line in out[:-1]] == later[:2]
        assert all(line.endswith(" data: 78787878... |xxxx|") for line in out[:-1])
        assert out[-1].endswith(f"stopped: record limit reached; the next record is at "
                                f"{pmemwal.format_lsn(later[2])}")
        assert [proc.proc.wait(30) for proc in dumps] == [0, 0]
    finally:
        for proc in dumps:
            proc.kill()


def test_follow_stops_among_the_records_on_disk(wal_dir):
    """--end or --limit reached before the end of the WAL: --follow waits for nothing."""
    lsns = make_wal(wal_dir, [payload(f"d/{i}", 100) for i in range(6)])
    result = invoke("dump", wal_dir, "--follow", "--end", lsns[4])
    assert result.exit_code == 0 and listed(result.stdout) == lsns[:4]
    assert "stopped: --end" in result.stdout
    result = invoke("dump", wal_dir, "--follow", "--limit", 2, "--start", lsns[1])
    assert result.exit_code == 0 and listed(result.stdout) == lsns[1:3]
    assert "stopped: record limit reached" in result.stdout


def test_follow_reads_on_into_segments_made_after_it_started(wal_dir, writer):
    """Records that fill new segments: each followed line is the line a plain dump gives."""
    big = 256 * 1500                              # three records to a 1 MiB segment
    first = writer(2)
    later = [next_lsn(first[-1], SIZE)]
    while len(later) < 8:
        later.append(next_lsn(later[-1], big))
    proc = dump_follow(wal_dir, "--json", "--preview", 300, "--end", later[-1])
    try:
        followed = [proc.line() for _ in first]
        assert writer(8, big) == later and later[-1] > 2 * SEG
        followed += proc.rest()
        assert proc.proc.wait(30) == 0
    finally:
        proc.kill()
    plain = invoke("dump", wal_dir, "--json", "--preview", 300, "--end", later[-1]).stdout
    assert followed[:-1] == plain.splitlines()[:-1] and len(followed) == 2 + 7 + 1
    assert json.loads(followed[-1])["records"] == 9


def test_follow_ends_quietly_on_ctrl_c(wal_dir, writer):
    first = writer(2)
    proc = dump_follow(wal_dir, "--json")
    try:
        assert [json.loads(proc.line())["lsn"] for _ in first] == first
        (third,) = writer(1)
        got = json.loads(proc.line())          # it is following now: it showed a new record
        assert (got["lsn"], got["prev_lsn"], got["length"]) == (third, first[-1], SIZE)
        proc.proc.send_signal(signal.SIGINT)
        out = proc.rest()
        assert proc.proc.wait(30) == 0
        assert proc.proc.stderr.read() == ""
        summary = json.loads(out[-1])
        assert (summary["stopped"], summary["records"], summary["last_lsn"]) == \
            ("interrupted", 3, third)
        assert summary["end_lsn"] == next_lsn(third, SIZE) == got["next_lsn"]
    finally:
        proc.kill()
