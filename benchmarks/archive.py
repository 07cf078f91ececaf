"""Committed appends with archiving off and on, to a local S3 server, in one run.

    PMEM_IS_PMEM_FORCE=1 .venv/bin/python benchmarks/archive.py [--sizes 8k,1m] [--rounds 5]
        [--seconds 3] [--segment-size 16m] [--mode direct] [--cases off,on,load,off@,on@]
        [--pace 40] [--cost 8]

A moto S3 server (pmemwal.tools.s3_server.LocalS3) runs on 127.0.0.1 for the whole run.
For each record size, ``pmemwal bench``'s engine (pmemwal.tools.bench.run) runs one client
that commits every record (``flush="each"``) for ``--seconds``, with the bench's default
truncation (``keep_bytes``, 256 MiB behind the flushed position, truncated every 64 MiB
appended), in these cases, alternated round after round:

- ``off``: no archiving;
- ``on``: ``archive="s3://pmemwal-bench/<fresh prefix>"``: every complete segment is
  uploaded and read back by the archiver process.  The warm-up waits until its segments
  are archived, so that each run starts with nothing pending;
- ``load``: no archiving, but a process beside the run uploads and reads back 16 MiB files
  to the same server in a loop, as the archiver does: the same CPU load on the 2 vCPUs
  without the WAL waiting for the archive (truncation held back, segments made new);
- ``off@`` and ``on@``: ``off`` and ``on`` paced to ``--pace`` MB/s (``pmemwal bench
  --rate``), a load the archive can take: what archiving costs a WAL whose archive keeps
  up, in throughput and in append latency (p50, p99), against ``off@``.

Unpaced, a WAL on /dev/shm commits GB/s and the archive takes about a hundred MB/s: ``on``
measures the archive's ceiling, and the backlog's cost (truncation keeps what is not
archived, so segments are made, not recycled), not what archiving costs below it.

Per size it prints records/s and MB/s for each case (median of the rounds), the median of
the per-round ratios to ``off``, and for ``on`` the archive's throughput: the archiver's own
rate (bytes uploaded over ``archive_ns``, the time it spent uploading and checking), the
bytes archived over the run's elapsed time, the segments still pending at the end
(``archive_pending``: whether it kept up), the segments created during the run (truncation
keeps unarchived segments, so new ones are made instead of recycled; the rate this machine
makes fresh segments is printed at the end, to compare), and the CPU each
process used in the measured part (from the progress ticks: the bench process, the archiver
process, the moto server), in CPUs, and the WAL's background writer's CPU share (its CPU
time over the run, of one core: ``pmemwal bench``'s figure).

``--cost N`` first uploads N segment-sized files through the archive's own ``store`` (upload
and read-back), and N through a bare ``put_file``, timing the wall clock and the CPU of this
process and of the server: what archiving a MB costs on this machine, without a WAL.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
import uuid

from common import print_cpu, scratch_dir, share_text
from pmemwal.archive import FsspecArchive, file_crc
from pmemwal.errors import ArchiveError
from pmemwal.tools.bench import BenchConfig, fresh_segment_rate, parse_size, run
from pmemwal.tools.s3_server import LocalS3

BUCKET = "pmemwal-bench"
CASES = ("off", "on", "load", "off@", "on@")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def archiver_pid() -> int | None:
    """The archiver process this process started, if one runs."""
    me = str(os.getpid())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            if ppid == me:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"pmemwal._archiver_process" in f.read():
                        return int(name)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return None


class CpuTicks:
    """The bench's progress callback: CPU of this process, the archiver and the server at
    each progress tick, so that the first and last ticks bound the measured part."""

    def __init__(self, server_pid: int, load_pid: int | None = None) -> None:
        self.server_pid, self.load_pid = server_pid, load_pid
        self.samples: list[tuple[float, float, float, float, float]] = []

    def __call__(self, progress: dict) -> None:
        pid = archiver_pid()
        own = os.times()
        self.samples.append((time.perf_counter(), own.user + own.system,
                             cpu_of(pid) if pid else 0.0, cpu_of(self.server_pid),
                             cpu_of(self.load_pid) if self.load_pid else 0.0))

    def cpus(self) -> dict[str, float] | None:
        """CPUs used between the first and last tick: bench, archiver, server, load."""
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        wall = last[0] - first[0]
        return {k: (last[i] - first[i]) / wall
                for i, k in enumerate(("bench", "archiver", "server", "load"), start=1)}


def uploader(endpoint: str, size: int, ready, stop) -> None:
    """The ``load`` case's process: upload and read back ``size``-byte files in a loop."""
    from pmemwal.tools.s3_server import storage_options
    archive = FsspecArchive(f"s3://{BUCKET}/load-{uuid.uuid4().hex[:8]}", storage_options(endpoint))
    with scratch_dir("pmemwal-load-") as path:
        source = os.path.join(path, "segment")
        with open(source, "wb") as f:
            f.write(os.urandom(size))
        crc, n = file_crc(source)
        i = 0
        while not stop.is_set():
            archive.store(source, f"{i:016X}.wal", crc, n)
            archive.fs.rm(f"{archive.root}/{i:016X}.wal")  # the server keeps objects in memory
            ready.set()
            i += 1


def run_case(case: str, size: int, args, s3: LocalS3) -> dict:
    load = stop = None
    if case == "load":
        ctx = multiprocessing.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        load = ctx.Process(target=uploader, args=(s3.endpoint, args.segment_size, ready, stop),
                           daemon=True)
        load.start()
        if not ready.wait(60):
            raise RuntimeError("the load process did not start uploading")
    ticks = CpuTicks(s3._proc.pid, load.pid if load else None)
    archive = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}" if case.startswith("on") else None
    rate = args.pace * 1e6 / size if case.endswith("@") else 0.0
    try:
        with scratch_dir() as parent:
            config = BenchConfig(os.path.join(parent, "wal"), mode=args.mode, size=size,
                                 duration=args.seconds, flush="each",
                                 segment_size=args.segment_size, progress_interval=0.5, rate=rate,
                                 archive=archive, archive_options=s3.options if archive else None)
            try:
                r = run(config, progress=ticks)
            except ArchiveError as exc:  # archive_max_pending reached: the writer stopped
                return {"case": case, "error": str(exc)}
    finally:
        if load is not None:
            stop.set()
            load.join(30)
            if load.is_alive():
                load.terminate()
                load.join()
    out = {"case": case, "rate": r.records_per_s, "mb": r.mb_per_s, "persist": r.persist_method,
           "created": r.segments_after_warm_up["created"], "cpus": ticks.cpus(), "error": None,
           "p50": r.append_latency.p50, "p99": r.append_latency.p99,
           "bg_cpu": r.background_cpu_share}
    if r.archive:
        out.update(archive_rate=r.archive_rate, archived=r.archived_per_s,
                   pending=r.archive["archive_pending"], failures=r.archive["archive_failures"],
                   segments=r.archive["archive_segments"])
    return out


def cost(s3: LocalS3, segment_size: int, count: int) -> None:
    """What archiving costs without a WAL: ``store`` (upload + read-back) and a bare put."""
    archive = FsspecArchive(f"s3://{BUCKET}/cost-{uuid.uuid4().hex[:8]}", s3.options)
    with scratch_dir("pmemwal-cost-") as path:
        source = os.path.join(path, "segment")
        with open(source, "wb") as f:
            f.write(os.urandom(segment_size))
        crc, n = file_crc(source)
        archive.store(source, "warm.wal", crc, n)  # the connection, the bucket
        print(f"archiving {count} x {segment_size >> 20} MiB without a WAL (this process "
              "uploads; CPU in seconds per GB):")
        print("| what | MB/s | this process CPU s/GB | server CPU s/GB | total CPU s/GB |")
        print("|---|---|---|---|---|")
        for what in ("store (upload + read-back)", "put_file only"):
            t0, c0, s0 = time.perf_counter(), time.process_time(), cpu_of(s3._proc.pid)
            for i in range(count):
                name = f"{what[:3]}{i:013X}.wal"
                if what.startswith("store"):
                    archive.store(source, name, crc, n)
                else:
                    archive.fs.put_file(source, f"{archive.root}/{name}")
            wall, own = time.perf_counter() - t0, time.process_time() - c0
            server = cpu_of(s3._proc.pid) - s0
            gb = count * n / 1e9
            print(f"| {what} | {count * n / wall / 1e6:.0f} | {own / gb:.2f} | {server / gb:.2f} | "
                  f"{(own + server) / gb:.2f} |")
        archive.fs.rm(archive.root, recursive=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8k,1m", help="record sizes (k, m: KiB, MiB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--segment-size", type=parse_size, default=16 << 20)
    parser.add_argument("--mode", default="direct")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--pace", type=float, default=40.0,
                        help="MB/s the paced cases (off@, on@) commit at")
    parser.add_argument("--cost", type=int, default=8, help="segments uploaded in the cost part (0: none)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print_cpu()
    with LocalS3() as s3:
        if args.cost:
            cost(s3, args.segment_size, args.cost)
        results: dict[int, dict[str, list[dict]]] = {s: {c: [] for c in cases} for s in sizes}
        for rnd in range(args.rounds):
            for size in sizes:
                order = cases if rnd % 2 == 0 else cases[::-1]  # off first, then last
                for case in order:
                    r = run_case(case, size, args, s3)
                    results[size][case].append(r)
                    print(f"round {rnd + 1} {size} B {case}: " + (
                        f"FAILED {r['error']}" if r["error"] else
                        f"{r['rate']:,.0f} rec/s, {r['mb']:,.0f} MB/s, created {r['created']}, "
                        f"bg CPU {share_text(r['bg_cpu'])}"
                        + (f", archived {r['archived'] / 1e6:.0f} MB/s (archiver "
                           f"{(r['archive_rate'] or 0) / 1e6:.0f} MB/s), pending {r['pending']}"
                           if "archived" in r else "")
                        + (", CPUs " + " ".join(f"{k} {v:.2f}" for k, v in r["cpus"].items())
                           if r["cpus"] else "")), flush=True)
    with scratch_dir() as path:  # what "on" falls back to when the archive holds truncation back
        fresh = fresh_segment_rate(path, args.segment_size, args.mode)
    report(results, cases, args)
    print(f"\nfresh segments (created, allocated, mapped, pre-faulted) at {fresh / 1e6:,.0f} MB/s "
          "on this machine now")


def med(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def report(results: dict, cases: list[str], args) -> None:
    print(f"\n{args.mode}, flush each, 1 client, segment {args.segment_size >> 20} MiB, "
          f"{args.seconds:g} s a run, median of {args.rounds} rounds")
    print("| size | case | records/s | MB/s | / off | append p50 / p99 µs | archiver MB/s | "
          "archived MB/s over the run | pending at end | segments created | "
          "CPUs: bench / archiver / server / load | bg CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, by_case in results.items():
        for case in cases:
            runs = [r for r in by_case[case] if not r["error"]]
            failed = len(by_case[case]) - len(runs)
            if not runs:
                print(f"| {size} | {case} | failed ({by_case[case][0]['error']}) |")
                continue
            offs = by_case.get("off@" if case.endswith("@") else "off", [])
            ratios = [r["rate"] / o["rate"] for r, o in zip(by_case[case], offs)
                      if not r["error"] and not o["error"]]
            cpus = [r["cpus"] for r in runs if r["cpus"]]
            cpu = " / ".join(f"{med(c[k] for c in cpus):.2f}"
                             for k in ("bench", "archiver", "server", "load")) if cpus else "-"
            arch = [r for r in runs if "archived" in r]
            print(f"| {size} | {case}{f' ({failed} failed)' if failed else ''} | "
                  f"{med(r['rate'] for r in runs):,.0f} | {med(r['mb'] for r in runs):,.0f} | "
                  f"{med(ratios):.2f} | {med(r['p50'] for r in runs):.1f} / "
                  f"{med(r['p99'] for r in runs):.1f} | "
                  + (f"{med(r['archive_rate'] for r in arch) / 1e6:.0f} | "
                     f"{med(r['archived'] for r in arch) / 1e6:.0f} | "
                     f"{med(r['pending'] for r in arch):.0f} | " if arch else "- | - | - | ")
                  + f"{med(r['created'] for r in runs):.0f} | {cpu} | "
                  f"{share_text(med(r['bg_cpu'] for r in runs))} |")


if __name__ == "__main__":
    main()
