"""How long WAL.open takes against how much the WAL retains: after a clean close, after SIGKILL,
and with verify="all" (every record read, as every open did before checkpoints); and how long
pmemwal.Log takes to open, and how much memory, through its stored index and without it.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/open_time.py [--sizes 64m,1g,4g]
        [--log-sizes 64m,2g]

For each retained size a WAL of 8 KiB records is written once (direct mode, 16 MiB segments,
never truncated), closed, and opened ``--rounds`` times (the median is reported).  Then a
child process opens it, appends ``--tail`` bytes more with a flush every MiB under the default
checkpoint settings, and is killed with SIGKILL; the next open is timed, and so is
verify="all".  Each open's ``wal.recovery`` says how many bytes it read.  The ratios compare
each size with the smallest, measured in the same run.  The Log part fills a log of 64 B
entries to each ``--log-sizes``, closes it, and opens it in a fresh process, once through the
index and once with ``index/`` removed (every record replayed, as before the index was
kept): the median time, and how much more the process's peak RSS grows over the open than
over the open of a log of one batch (the WAL's own mappings, pre-faulted segments among them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import pmemwal
from common import markdown_table, scratch_dir

SEGMENT = 16 << 20
RECORD = 8 << 10
_CHILD = """
import sys, pmemwal
wal = pmemwal.open(sys.argv[1], mode="direct")
batch = [bytes(%d)] * 128
end = wal.insert_lsn + int(sys.argv[2])
while wal.insert_lsn < end:
    wal.append_many(batch)
    wal.flush()
print("ready", flush=True)
sys.stdin.read()
""" % RECORD


def binary(n: int) -> str:
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.3g} MiB"


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * units[text[-1].lower()] if text[-1].lower() in units else int(text)


def fill(path: str, total: int) -> None:
    batch = [bytes(RECORD)] * 128
    with pmemwal.open(path, mode="direct", segment_size=SEGMENT, max_wal_size=total * 2) as wal:
        while wal.insert_lsn < total:
            wal.append_many(batch)


def timed_open(path: str, **options) -> tuple[float, dict]:
    start = time.perf_counter()
    wal = pmemwal.open(path, mode="direct", **options)
    elapsed = time.perf_counter() - start
    recovery = wal.recovery
    wal.close()
    return elapsed, recovery


def kill_after_tail(path: str, tail: int) -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, path, str(tail)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "ready":
        raise RuntimeError("the appending child failed")
    child.send_signal(signal.SIGKILL)
    child.wait()


def measure(total: int, rounds: int, tail: int) -> dict:
    with scratch_dir("pmemwal-open-") as path:
        fill(path, total)
        clean = [timed_open(path) for _ in range(rounds)]
        kill_after_tail(path, tail)
        killed, killed_recovery = timed_open(path)
        full, _ = timed_open(path, verify="all")
    return {"retained": total, "clean_s": statistics.median(t for t, _ in clean),
            "clean_read": clean[-1][1]["scanned_bytes"], "killed_s": killed,
            "killed_read": killed_recovery["scanned_bytes"], "full_s": full}


_LOG_OPEN = """
import sys, time, pmemwal
def peak_kib():  # this process's (ru_maxrss starts at the parent's peak)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
before = peak_kib()
start = time.perf_counter()
log = pmemwal.open_log(sys.argv[1], mode="direct")
elapsed = time.perf_counter() - start
print(elapsed, peak_kib() - before, len(log), log.replayed_from is not None)
log.close()
"""


def fill_log(path: str, total: int) -> int:
    batch = [bytes(64)] * 10_000
    with pmemwal.open_log(path, mode="direct", segment_size=SEGMENT,
                          max_wal_size=total * 2) as log:
        while log.wal.insert_lsn < total:
            log.append_many(batch, term=1)
        return len(log)


def log_open(path: str, rounds: int) -> tuple[float, int, int, bool]:
    """Median open seconds, the peak-RSS growth (KiB) of the last, entries, index used."""
    runs = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", _LOG_OPEN, path], check=True,
                             capture_output=True, text=True).stdout.split()
        runs.append((float(out[0]), int(out[1]), int(out[2]), out[3] == "True"))
    return statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2], runs[-1][3]


def measure_log(total: int, rounds: int) -> dict:
    with scratch_dir("pmemwal-logopen-") as path:
        entries = fill_log(path, total)
        indexed = log_open(path, rounds)
        shutil.rmtree(os.path.join(path, "index"))
        replayed = log_open(path, 1)
    with scratch_dir("pmemwal-logopen-") as path:
        fill_log(path, 1)
        empty = log_open(path, rounds)
    assert indexed[3] and not replayed[3] and indexed[2] == replayed[2] == entries
    return {"retained": total, "entries": entries, "index_s": indexed[0],
            "index_rss": indexed[1] - empty[1], "replay_s": replayed[0],
            "replay_rss": replayed[1] - empty[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64m,1g,4g", help="retained sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tail", type=parse_size, default=256 << 20,
                    help="bytes the killed writer appends after the reopen (default 256m)")
    ap.add_argument("--log-sizes", default="64m,2g", help="Log sizes (64 B entries); '' skips")
    args = ap.parse_args()
    results = []
    for text in args.sizes.split(","):
        results.append(measure(parse_size(text), args.rounds, args.tail))
        print(f"{binary(results[-1]['retained'])}: done", file=sys.stderr, flush=True)
    base = results[0]
    rows = [[binary(r["retained"]), f"{r['clean_s'] * 1e3:.1f}", f"{r['clean_s'] / base['clean_s']:.2f}x",
             f"{r['killed_s'] * 1e3:.1f}", binary(r["killed_read"]),
             f"{r['killed_s'] / base['killed_s']:.2f}x", f"{r['full_s'] * 1e3:.0f}"]
            for r in results]
    print(markdown_table(["retained", "clean close: open ms", "vs smallest", "after SIGKILL: open ms",
                          "read after kill", "vs smallest", "verify='all': open ms"], rows))
    logs = [measure_log(parse_size(t), args.rounds) for t in args.log_sizes.split(",") if t]
    if logs:
        print()
        print(markdown_table(
            ["Log retained", "entries", "open through the index: ms", "vs smallest",
             "its peak RSS over an empty log's", "replaying every record: ms", "its peak RSS over an empty log's"],
            [[binary(r["retained"]), f"{r['entries']:,}", f"{r['index_s'] * 1e3:.1f}",
              f"{r['index_s'] / logs[0]['index_s']:.2f}x", f"{r['index_rss'] / 1024:.1f} MiB",
              f"{r['replay_s'] * 1e3:.0f}", f"{r['replay_rss'] / 1024:.1f} MiB"] for r in logs]))


if __name__ == "__main__":
    main()
