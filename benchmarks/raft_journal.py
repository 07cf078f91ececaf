"""pysyncobj's Raft journal on pmemwal against its own FileJournal: appends/s and committed ops/s.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/raft_journal.py [--dir /dev/shm]
        [--seconds 1] [--rounds 3] [--size 64] [--cluster-seconds 2.5] [--cluster-rounds 2]
        [--window 3000]

(a) ``Journal.add`` of ``--size``-byte commands, one thread, for each journal:

- ``pmemwal``: ``PmemwalJournal`` (pmemwal.integrations.pysyncobj), each entry durable
  when ``add`` returns;
- ``FileJournal``: pysyncobj's own, an mmap'ed file it syncs only on close (entries are
  durable whenever the kernel writes the pages back: not the same durability, a ceiling);
- ``FileJournal+msync``: the same with its own ``flush()`` (msync MS_SYNC of the mapping)
  after every add: the durability of ``pmemwal``;
- ``MemoryJournal``: a Python list, for scale.

(b) A 3-node cluster (3 processes on 127.0.0.1, pysyncobj's default configuration) with a
ReplCounter, on each journal: every node keeps ``--window`` ``inc`` calls in flight through
the cluster, enough that the nodes are busy rather than waiting for pysyncobj's append
period (0.1 s); committed ops/s is the sum of the successful callbacks of the three nodes
over ``--cluster-seconds``, counted once all three have seen one succeed.

Rounds alternate between the journals (the machine is shared and noisy); the median round is
reported, with the ratio of pmemwal to each, and for pmemwal the background writer's CPU
share (its CPU time over the measured window, of one core; in the cluster, the mean over the
three nodes).  Scratch directories go under ``--dir``.

On tmpfs an msync has no device to write to, so there FileJournal+msync costs little more
than FileJournal.  To measure a disk, point ``--dir`` at it and leave PMEM_IS_PMEM_FORCE
unset (it would make pmemwal treat the page cache as persistent memory): both durable
journals then pay the device's flush.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.batteries import ReplCounter
from pysyncobj.journal import FileJournal, Journal, MemoryJournal

import common
from common import (background_share, human, markdown_table, print_cpu, rate,
                    rate_and_background, scratch_dir, share_text)
from pmemwal.integrations.pysyncobj import PmemwalJournal

BATCH = 1000
READY_TIMEOUT = 60


class SyncedFileJournal(FileJournal):
    """FileJournal made as durable as PmemwalJournal: its own flush after every add."""

    def add(self, command, idx, term) -> None:
        super().add(command, idx, term)
        self.flush()


JOURNALS: dict[str, Callable[[str], Journal]] = {
    "pmemwal": PmemwalJournal,
    "FileJournal": FileJournal,
    "FileJournal+msync": SyncedFileJournal,
    "MemoryJournal": lambda path: MemoryJournal(),
}
DURABLE = {"pmemwal": "each add", "FileJournal": "no (synced on close)",
           "FileJournal+msync": "each add", "MemoryJournal": "no (memory)"}
CLUSTER_JOURNALS = ["pmemwal", "FileJournal", "FileJournal+msync"]


# ---- (a) Journal.add -----------------------------------------------------------------

def add_rate(kind: str, size: int, seconds: float) -> tuple[float, str, float | None]:
    """Journal.add/s of ``kind``; how it persists (pmemwal: its persist method); pmemwal's
    background writer's CPU share (None for the others)."""
    command = os.urandom(size)
    with scratch_dir() as path:
        journal = JOURNALS[kind](os.path.join(path, "journal"))
        idx = 0

        def step() -> int:
            nonlocal idx
            for _ in range(BATCH):
                idx += 1
                journal.add(command, idx, 1)
            return BATCH

        try:
            rate(step, 0.2)  # warm-up: files grown, segments prepared
            if kind != "pmemwal":
                return rate(step, seconds), "", None
            value, share = rate_and_background(journal.log.wal, step, seconds)
            return value, journal.log.wal.persist_method, share
        finally:
            journal._destroy()


# ---- (b) a cluster -----------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_rate(kind: str, seconds: float, window: int) -> tuple[float, float | None]:
    """Committed ops/s of a 3-process cluster on journals of ``kind``; the mean of the
    nodes' background writers' CPU shares (pmemwal; None for the others)."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    with scratch_dir() as path:
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--node", json.dumps({
                "kind": kind, "self": a, "others": [o for o in addrs if o != a],
                "dir": os.path.join(path, f"node{i}"), "window": window})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i, a in enumerate(addrs)]
        try:
            for p in procs:
                if p.stdout.readline().strip() != "READY":
                    raise RuntimeError(f"a {kind} node did not get ready")
            for p in procs:
                p.stdin.write(f"GO {seconds}\n")
                p.stdin.flush()
            done = [p.stdout.readline().split() for p in procs]  # DONE <ops> <seconds> <share>
            shares = [float(d[3]) for d in done if d[3] != "-"]
            return (sum(int(d[1]) / float(d[2]) for d in done),
                    statistics.fmean(shares) if shares else None)
        finally:
            for p in procs:
                p.kill()
                p.wait()


def node_main(spec: dict) -> None:
    """A cluster node: ``window`` inc calls in flight; READY after its first success, then
    on ``GO s`` it counts successes for s seconds and prints ``DONE ops seconds share``
    (its background writer's CPU share, ``-`` without a pmemwal journal)."""
    os.makedirs(spec["dir"])
    make = JOURNALS[spec["kind"]]
    journals: list[Journal] = []

    def create(path: str) -> Journal:  # the hook JournalPath uses: any journal, kept here
        journals.append(make(path))
        return journals[-1]

    pysyncobj_syncobj.createJournal = create
    counter = ReplCounter()
    conf = SyncObjConf(journalFile=os.path.join(spec["dir"], "journal"),
                       fullDumpFile=os.path.join(spec["dir"], "dump"))
    SyncObj(spec["self"], spec["others"], conf, consumers=[counter])
    slots = threading.Semaphore(spec["window"])
    first = threading.Event()
    ok = 0

    def done(result, error) -> None:  # on pysyncobj's tick thread
        nonlocal ok
        if error == FAIL_REASON.SUCCESS:
            ok += 1
            first.set()
        slots.release()

    def load() -> None:
        while True:
            slots.acquire()
            counter.inc(callback=done)

    threading.Thread(target=load, daemon=True).start()
    if not first.wait(READY_TIMEOUT):
        os._exit(1)
    print("READY", flush=True)
    seconds = float(sys.stdin.readline().split()[1])
    wal = journals[0].log.wal if isinstance(journals[0], PmemwalJournal) else None
    before = wal.stats() if wal else {}
    start_ok, start = ok, time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - start
    share = background_share(before, wal.stats(), elapsed) if wal else "-"
    print("DONE", ok - start_ok, elapsed, share, flush=True)
    os._exit(0)  # no orderly destroy: the parent kills the cluster


# ---- the run ---------------------------------------------------------------------------

Measured = tuple[float, float | None]  # a rate, and the background writer's CPU share


def medians(kinds: list[str], rounds: int, measure: Callable[[str], Measured],
            what: str) -> tuple[dict[str, float], dict[str, float | None]]:
    """The medians of ``rounds`` rounds of ``measure(kind)``, each round running every kind:
    of the rates, and of the background writers' CPU shares (None: no WAL)."""
    runs: dict[str, list[Measured]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds:
            runs[kind].append(measure(kind))
            print(f"round {r + 1}/{rounds} {what} {kind}: {human(runs[kind][-1][0])}/s",
                  file=sys.stderr, flush=True)
    shares = {k: [s for _, s in v if s is not None] for k, v in runs.items()}
    return ({k: statistics.median(r for r, _ in v) for k, v in runs.items()},
            {k: statistics.median(v) if v else None for k, v in shares.items()})


def table(name: str, kinds: list[str], got: dict[str, float], notes: dict[str, str],
          background: dict[str, float | None]) -> str:
    """A markdown table of ``got`` with each journal's durability, pmemwal's ratio to it and
    its background writer's CPU share."""
    rows = [[f"{k} {notes.get(k, '')}".strip(), DURABLE[k], human(got[k]),
             f"{got['pmemwal'] / got[k]:.2f}", share_text(background[k])] for k in kinds]
    return markdown_table(["journal", "durable", name, "pmemwal / this", "bg CPU"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=common.SCRATCH, help="scratch directories go here (/dev/shm)")
    ap.add_argument("--seconds", type=float, default=1.0, help="per journal and round, (a)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=64, help="command bytes, (a)")
    ap.add_argument("--cluster-seconds", type=float, default=2.5, help="per journal and round, (b)")
    ap.add_argument("--cluster-rounds", type=int, default=2)
    ap.add_argument("--window", type=int, default=3000, help="inc calls in flight per node, (b)")
    ap.add_argument("--node", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.node:
        return node_main(json.loads(args.node))
    common.SCRATCH = args.dir
    print_cpu()
    print(f"dir {args.dir}, PMEM_IS_PMEM_FORCE={os.environ.get('PMEM_IS_PMEM_FORCE', '-')}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs")

    notes: dict[str, str] = {}

    def measure_add(kind: str) -> Measured:
        value, how, share = add_rate(kind, args.size, args.seconds)
        if how:
            notes[kind] = f"({how})"
        return value, share

    adds, add_bg = medians(list(JOURNALS), args.rounds, measure_add, "add")
    print(f"\n(a) Journal.add, {args.size}-byte commands, one thread, "
          f"median of {args.rounds} rounds of {args.seconds} s\n")
    print(table("adds/s", list(JOURNALS), adds, notes, add_bg))

    ops, ops_bg = medians(CLUSTER_JOURNALS, args.cluster_rounds,
                  lambda kind: cluster_rate(kind, args.cluster_seconds, args.window), "cluster")
    print(f"\n(b) 3-node cluster on 127.0.0.1, ReplCounter.inc, {args.window} in flight per node, "
          f"median of {args.cluster_rounds} rounds of {args.cluster_seconds} s\n")
    print(table("committed ops/s", CLUSTER_JOURNALS, ops, notes, ops_bg))


if __name__ == "__main__":
    main()
