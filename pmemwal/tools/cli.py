"""The ``pmemwal`` command: a thin layer over the library (pmemwal.tools.bench, pmemwal.probe).

    pmemwal probe /mnt/pmem/wal
    pmemwal bench /dev/shm/pmemwal-bench --mode direct --clients 4 --size 8k --flush group:16
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import sys
import time

import click

import pmemwal
from pmemwal import lostfound as _lostfound
from pmemwal import putback as _putback
from pmemwal.log_format import describe as _describe_log_record
from pmemwal.tools import bench as _bench
from pmemwal.tools import fs_crash as _fs_crash
from pmemwal.tools import mutants as _mutants
from pmemwal.tools import powerloss as _powerloss
from pmemwal.tools import progress as _progress
from pmemwal.tools import repair as _repair
from pmemwal.segments import writer_open as _writer_open
from pmemwal.tools import restore as _restore
from pmemwal.tools import traced as _traced
from pmemwal.tools.torture import driver as _torture
from pmemwal.tools.torture import shared as _shared_torture
from pmemwal.tools.torture import setups as _torture_setups
from pmemwal.tools.torture.workloads import WORKLOADS as _TORTURE_WORKLOADS
from pmemwal.wal import PERSIST


class _Parsed(click.ParamType):
    """A click type that runs one of the library's parsers; its ValueError becomes a usage error."""

    def __init__(self, name: str, parse, keep_text: bool = False) -> None:
        self.name, self._parse, self._keep_text = name, parse, keep_text

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            parsed = self._parse(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)
        return value.strip().lower() if self._keep_text else parsed


SIZE = _Parsed("size", _bench.parse_size)
FLUSH = _Parsed("flush", _bench.parse_flush, keep_text=True)  # checked, passed on as text


def _library_errors(command):
    """Turn pmemwal's errors (and bad values it rejects) into a clean message and exit code 1;
    a reader that closed the output (``pmemwal dump WAL | head``) ends the command quietly."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except BrokenPipeError as error:
            if not _stdout_closed():
                raise click.ClickException(f"{type(error).__name__}: {error}") from error
            _end_quietly()
        except (pmemwal.WALError, ValueError, OSError) as error:
            raise click.ClickException(f"{type(error).__name__}: {error}") from error

    return wrapper


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (not some other pipe, such as
    a bench client's, that broke)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _end_quietly() -> None:
    """Exit as a C tool killed by SIGPIPE would be seen to (status 141), with nothing on
    stderr: what is still buffered for stdout goes to /dev/null, not to a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(128 + signal.SIGPIPE)


def _dump(data: dict) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group(name="pmemwal")
@click.version_option(pmemwal.__version__, prog_name="pmemwal")
def main() -> None:
    """pmemwal: a write-ahead log for persistent memory.

    Example: pmemwal bench /dev/shm/pmemwal-bench --duration 10
    """


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the probe as JSON.")
@click.option("--measure", is_flag=True,
              help="Also run both modes briefly here (8k and 64k records, flush each) and "
                   "report the measured choice beside the rule's.")
@click.option("--seconds", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="With --measure: seconds per run (2 runs per mode and size).")
@click.option("--save/--no-save", default=True, show_default=True,
              help="With --measure: keep the choice for this file system, which mode='auto' "
                   "then follows (where the mapping is not persistent memory).")
@click.option("--forget", is_flag=True, help="Remove the stored choice for this file system.")
@_library_errors
def probe(path: str, as_json: bool, measure: bool, seconds: float, save: bool,
          forget: bool) -> None:
    """Say what PATH (a WAL directory, or where one would go) sits on and which mode suits it.

    The mode is the rule's (direct on DAX persistent memory, buffered elsewhere) unless a
    measurement of this file system is stored: --measure makes one.

    Example: pmemwal probe /mnt/pmem/wal --json

    Example: pmemwal probe /var/lib/app/wal --measure
    """
    from pmemwal.tools import measure as _measure

    if forget:
        key = _device.calibration_key(path)
        if _device.stored_calibration(path) is None:
            click.echo(f"no measured choice was stored for {key}: nothing to forget")
        else:
            click.echo(f"forgot the measured choice for {key} "
                       f"({_device.store_calibration(path, None)})")
    measured = _measure.measure_modes(path, seconds) if measure else None
    if measured and save:
        where = _measure.save(measured)
    result = pmemwal.probe(path)
    overridden = _device.chosen_mode("auto")   # (PMEMWAL_MODE, checked: a bad one is an error)
    if as_json:
        _dump({**result.as_dict(), "measured": measured.entry() if measured else None,
               "auto_opens_use": overridden if overridden != "auto" else
               result.recommended_mode})
        return
    click.echo(str(result))
    if overridden != "auto":
        click.echo(f"{_device.MODE_ENV_VAR}={overridden} is set: open(mode='auto') uses "
                   f"{overridden} here, whatever this probe recommends")
    if measured:
        click.echo("\n" + measured.text())
        if save:
            click.echo(f"kept for {_device.calibration_key(path)} in {where}: mode='auto' uses "
                       f"{measured.mode} here from now on (refresh: run --measure again; "
                       "undo: --forget)")


@main.command()
@click.argument("path", type=click.Path(), default=_bench.DEFAULT_PATH)
@click.option("--mode", type=click.Choice(_bench.MODES), default="auto", show_default=True,
              help="WAL mode; auto asks PMEMWAL_MODE, then the device probe.")
@click.option("--clients", type=click.IntRange(min=1), default=1, show_default=True,
              help="Appending threads (processes, with --processes).")
@click.option("--processes", is_flag=True,
              help="Run the clients as processes, each opening the WAL with shared=True "
                   "(--mode direct only); their start-up is not timed.")
@click.option("--size", type=SIZE, default="8k", show_default=True,
              help="Bytes per record (k, m, g: KiB, MiB, GiB).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds of appending.")
@click.option("--flush", type=FLUSH, default="each", show_default=True,
              help="Flush after each record, after every K (group:K), or only at the end.")
@click.option("--segment-size", type=SIZE, default=None,
              help="Segment file size, a power of two from 1m to 1g [default: 16m].")
@click.option("--insert-slots", type=click.IntRange(1, 256), default=8, show_default=True,
              help="Concurrent insertions in progress.")
@click.option("--prefault/--no-prefault", default=True, show_default=True,
              help="Map segments pre-faulted and prepare them ahead of the appenders.")
@click.option("--persist", type=click.Choice(PERSIST), default="auto", show_default=True,
              help="Direct mode: cache flush where the mapping is pmem, else msync (auto); msync "
                   "always; or pmem only (an error where the mapping is not pmem).")
@click.option("--keep", type=_Parsed("keep", _bench.parse_keep), default="256m", show_default=True,
              help="WAL kept on disk behind the flushed position; older segments are truncated "
                   "(recycled) each time a quarter of it has been appended.  'all': never "
                   "truncate (a log that keeps everything; the machine's own rate of making "
                   "segments is measured too, for comparison).")
@click.option("--checkpoint", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds between truncations by a separate checkpointer thread, to the previous "
                   "checkpoint's flushed position and --keep behind the flushed one, as "
                   "applications truncate (e.g. 0.02); 0: the clients truncate as they cross "
                   "each quarter of --keep.")
@click.option("--progress", "progress_interval", type=click.FloatRange(min=0), default=1.0,
              show_default=True, help="Seconds between progress lines on stderr (records/s, "
              "and the latency's mean, stddev and max over each; 0: none).")
@click.option("--cold", is_flag=True,
              help="No warm-up: start on a fresh WAL, so appends reach new segments (with "
                   "--no-prefault, their first-touch page faults too).")
@click.option("--rate", type=click.FloatRange(min=0), default=0.0,
              help="Records/s each client appends at most: a paced load, for latency and "
                   "for what archiving costs below the archive's speed [default: 0, no limit].")
@click.option("--keep-wal", is_flag=True,
              help="Leave the WAL at PATH after the run (by default it is removed, on Ctrl-C too).")
@click.option("--force", is_flag=True,
              help="Delete a WAL already at PATH even if it holds records that no bench run made "
                   "(by default bench deletes only the WALs it made, and empty ones).")
@click.option("--archive", "archive", metavar="URL", default=None,
              help="Archive every complete segment to this fsspec URL (s3://bucket/prefix, "
                   "file:///path) while the clients append; the warm-up waits until its "
                   "segments are archived, and the report adds the archive's counters.")
@click.option("--archive-endpoint", metavar="URL", default=None,
              help="With --archive s3://...: the S3-compatible server to use (e.g. "
                   "http://127.0.0.1:5000, moto's dummy keys).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_library_errors
def bench(path: str, mode: str, clients: int, processes: bool, size: int, duration: float,
          flush: str, segment_size: int | None, insert_slots: int, prefault: bool, persist: str,
          keep: int | None, checkpoint: float, progress_interval: float, cold: bool,
          keep_wal: bool, force: bool, rate: float, archive: str | None,
          archive_endpoint: str | None, as_json: bool) -> None:
    """Append records to a fresh WAL at PATH for a while and report throughput and latency.

    PATH is a benchmark directory: a WAL an earlier run left there is deleted first (one
    holding records that no bench run made only with --force), and the run's WAL is removed
    after it unless --keep-wal.

    Ctrl-C stops the run early: the results measured until then are printed, marked as
    interrupted, and the exit status is 130 (a second Ctrl-C, or one before the clients
    start, ends it without results).

    Example: pmemwal bench /dev/shm/pmemwal-bench --mode direct --size 8k --flush group:16
    """
    config = _bench.BenchConfig(path=path, mode=mode, clients=clients, size=size,
                                duration=duration, flush=flush, segment_size=segment_size,
                                insert_slots=insert_slots, prefault=prefault, persist=persist,
                                keep_bytes=keep, checkpoint=checkpoint,
                                progress_interval=progress_interval, cold=cold,
                                keep_wal=keep_wal, force=force, rate=rate, processes=processes,
                                archive=archive,
                                archive_options=_archive_options(archive, archive_endpoint))
    try:
        result = _bench.run(config, progress=lambda p: click.echo(p["line"], err=True),
                            stop_on_ctrl_c=True)
    except KeyboardInterrupt:
        click.echo("interrupted before there were results to print", err=True)
        raise click.exceptions.Exit(_INTERRUPTED) from None
    if result.interrupted:
        click.echo(f"{result.interrupted_text}: the results cover that time", err=True)
    if as_json:
        _dump(result.as_dict())
    else:
        click.echo(result.report())
    if result.interrupted:
        raise click.exceptions.Exit(_INTERRUPTED)


_INTERRUPTED = 128 + signal.SIGINT  # the exit status after Ctrl-C, as fio's and a shell's


def _archive_options(archive: str | None, endpoint: str | None) -> dict | None:
    """``bench``'s archive storage options: an S3-compatible server at ``endpoint``, if any."""
    if endpoint is None:
        return None
    if archive is None:
        raise click.UsageError("--archive-endpoint goes with --archive")
    from pmemwal.tools.s3_server import storage_options
    return storage_options(endpoint)


# ---- dump, verify, stats (pmemwal.tools.inspect: read-only, no lock) ----------------

from pmemwal.tools import inspect as _inspect  # noqa: E402  (kept beside the commands that use it)

LSN = _Parsed("lsn", _inspect.parse_lsn)
_DUMP_BLOCK = 4096  # lines dump writes at once


@main.command()
@click.argument("path", type=click.Path())
@click.option("--start", type=LSN, default=None,
              help="LSN of the first record, X/X or decimal [default: the oldest record].")
@click.option("--end", "end_lsn", type=LSN, default=None,
              help="Stop before the first record at or past this LSN (X/X or decimal).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show at most N records.")
@click.option("--preview", type=click.IntRange(min=0), default=0,
              help="Show the first N payload bytes of each record, in hex and as text "
                   "(printable ASCII; '.' for other bytes), as hexdump -C does.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per record (JSON lines), then a summary object.")
@click.option("--follow", "-f", is_flag=True,
              help="After the last record, wait for new ones and show each as a writer makes "
                   "it durable, until --end or --limit, or Ctrl-C (exit 0).")
@_library_errors
def dump(path: str, start: int | None, end_lsn: int | None, limit: int | None, preview: int,
         as_json: bool, follow: bool) -> None:
    """List the records of the WAL at PATH, one line each (like pg_waldump), then a summary.

    When the WAL holds a log (pmemwal.Log), each line also says the log record's
    kind and index (entry, rewind, snapshot, state).

    Read-only: works while a writer has the WAL open.  Exits 1 when it stops at
    damage (an end before the checkpoint's end is damage too) or finds no valid
    record at --start.

    With --follow it goes on as tail -f does: each record a writer makes durable
    is shown as it comes (output is flushed as it is written, for a pipe), until
    a record at or past --end, --limit records, or Ctrl-C, which ends it with the
    summary and exit 0.  It makes the WAL's FOLLOW file (where followers wait for
    writers) if no writer has yet; it writes nothing else.

    \b
    Examples:
      pmemwal dump /dev/shm/wal --start 0/2018 --limit 10
      pmemwal dump /dev/shm/wal --start 0/2018 --end 0/9000
      pmemwal dump /dev/shm/wal --follow --preview 16
    """
    if follow:
        _dump_follow(path, start, end_lsn, limit, preview, as_json)
        return
    with _inspect.WalView(path) as view:
        records = view.records(start, limit, _inspect.END if end_lsn is None else end_lsn)
        holds_log = view.holds_log()
        lines: list[str] = []  # (written a block at a time: one echo per line costs more)
        for rec in records:
            lines.append(view.record_line(rec, preview, holds_log, as_json))
            if len(lines) == _DUMP_BLOCK:
                click.echo("\n".join(lines))
                lines.clear()
        if lines:
            click.echo("\n".join(lines))
        summary = records.summary()
        click.echo(json.dumps(summary) if as_json else _inspect.format_summary(summary))
        for problem in view.problems:
            click.echo(f"warning: {problem}", err=True)
    if records.ended.failed:
        raise click.exceptions.Exit(1)


def _dump_follow(path: str, start: int | None, end_lsn: int | None, limit: int | None,
                 preview: int, as_json: bool) -> None:
    """``dump --follow``: each block of lines is written (and flushed) as it comes."""
    with _inspect.WalView(path) as view:
        tail = _inspect.Tail(view, start, limit, end_lsn, preview, as_json)
        try:
            for block in tail.blocks():
                click.echo("\n".join(block))   # (click.echo flushes)
        except KeyboardInterrupt:
            tail.interrupt()
        summary = tail.summary()
        click.echo(json.dumps(summary) if as_json else _inspect.format_summary(summary))
        for problem in view.problems:
            click.echo(f"warning: {problem}", err=True)
    if tail.end is not None and tail.end.failed:
        raise click.exceptions.Exit(1)


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_library_errors
def verify(path: str, as_json: bool) -> None:
    """Check the WAL at PATH as open(verify="all") would, without changing it; exit 0 when
    it is sound.

    Every record is read.  A torn tail (what open would cut after a crash) is a note;
    bad or foreign files, missing segments (also those the checkpoint vouches for) and
    damaged durable records (an end before the checkpoint's end included) make it exit 1.
    The second line shows the checkpoint: its end, last record, oldest segment, and
    whether a clean close wrote it.

    Example: pmemwal verify /dev/shm/wal --json
    """
    report = _inspect.verify(path)
    if as_json:
        _dump(report.as_dict())
    else:
        for line in report.lines():
            click.echo(line)
    if not report.ok:
        raise click.exceptions.Exit(1)


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
@_library_errors
def stats(path: str, as_json: bool) -> None:
    """Count the segments and records of the WAL at PATH, with a record-size histogram.

    Example: pmemwal stats /dev/shm/wal
    """
    result = _inspect.wal_stats(path)
    if as_json:
        _dump(result)
    else:
        click.echo(_inspect.format_stats(result))


@main.command(name="archive-status")
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@_library_errors
def archive_status(path: str, as_json: bool) -> None:
    """Show how far archiving of the WAL at PATH has come: segments archived, waiting and
    failing, the oldest waiting, the last error.  Exits 1 when a segment is failing.

    Example: pmemwal archive-status /dev/shm/wal --json
    """
    status = _inspect.archive_status(path)
    if as_json:
        _dump({"path": os.path.abspath(path), "archive": status})
    else:
        click.echo("\n".join(_inspect.format_archive_status(status)))
    if status is not None and status["failed"]:
        raise click.exceptions.Exit(1)


@main.command()
@click.argument("source")
@click.argument("dest", type=click.Path())
@click.option("--until", type=LSN, default=None,
              help="Leave out every record at or past this LSN (X/X or decimal).")
@click.option("--command", "restore_command", is_flag=True,
              help="SOURCE is a restore_command (PostgreSQL's %f and %p), not a URL.")
@click.option("--start-segment", type=click.IntRange(min=0), default=None,
              help="The first segment to restore [default: the oldest archived; 0 with --command].")
@click.option("--endpoint", default=None,
              help="An S3-compatible server's URL, for s3:// sources [default: AWS, or "
                   "AWS_ENDPOINT_URL].")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_library_errors
def restore(source: str, dest: str, until: int | None, restore_command: bool,
            start_segment: int | None, endpoint: str | None, as_json: bool) -> None:
    """Rebuild a WAL directory DEST from the segments archived at SOURCE (an fsspec URL:
    s3://bucket/prefix, file:///path), verifying each, up to the first gap or --until.

    Example: pmemwal restore s3://backups/wal /dev/shm/wal-restored --until 0/3A00000
    """
    options = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else None
    report = _restore.restore(dest, None if restore_command else source,
                             restore_command=source if restore_command else None, until=until,
                             start_segment=start_segment, storage_options=options)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.summary_line())


@main.command(name="lost-found")
@click.argument("path", type=click.Path())
@click.option("--dump", "dump_name", metavar="NAME", default=None,
              help="List the records of entry NAME (LSN, length, first bytes).")
@click.option("--restore", "restore_name", metavar="NAME", default=None,
              help="Append entry NAME's records to the WAL (new LSNs, in order), then remove it.")
@click.option("--remove", "remove_name", metavar="NAME", default=None,
              help="Delete entry NAME and the records it holds.")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@_library_errors
def lost_found(path: str, dump_name: str | None, restore_name: str | None,
               remove_name: str | None, as_json: bool) -> None:
    """What recovery set aside in the WAL at PATH before a cut (lost+found/): list it, read
    an entry, put its records back or remove it.  Every entry holds valid records that lay
    past where recovery ended the WAL (docs/FORMAT.md, "lost+found").

    Example: pmemwal lost-found /dev/shm/wal --restore 0000000000A12018-1733400000000000000
    """
    _inspect.checks.require_wal_directory(path)  # (as dump, verify and stats: exit 1)
    if restore_name is not None:
        n = _putback.restore(path, restore_name)
        click.echo(f"{restore_name}: {n} record(s) appended to {path} and the entry removed")
        return
    if remove_name is not None:
        _lostfound.remove(path, remove_name)
        click.echo(f"{remove_name}: removed")
        return
    if dump_name is not None:
        entry = _lostfound.find(path, dump_name)
        for lsn, payload in entry.records():
            log = _describe_log_record(bytes(payload)) or {}  # a pmemwal.Log's: what it says
            said = "".join(f" {v}" if k == "kind" else f" {k}={v}" for k, v in log.items())
            click.echo(f"lsn {pmemwal.format_lsn(lsn)} len {len(payload)} "
                       f"data {bytes(payload[:16]).hex()}{said}")
        return
    listing = [{"name": e.name, "cut": e.manifest["cut"], "reason": e.manifest["reason"],
                "records": len(e.manifest["records"]),
                "payload_bytes": sum(r[2] for r in e.manifest["records"]), "pending": e.pending}
               for e in _lostfound.entries(path)]
    if as_json:
        _dump({"path": os.path.abspath(path), "entries": listing})
    elif not listing:
        click.echo("lost+found is empty")
    for e in [] if as_json else listing:
        click.echo(f"{e['name']}: cut at {e['cut']} ({e['reason']}); {e['records']} record(s), "
                   f"{e['payload_bytes']} payload bytes"
                   + ("; pending: the cut was stopped before it was made" if e["pending"] else ""))


@main.command()
@click.argument("path", type=click.Path())
@click.option("--yes", "-y", is_flag=True, help="Repair without asking.")
@click.option("--dry-run", "-n", is_flag=True,
              help="Show what the repair would do, and change nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan and the result as JSON (needs --yes or --dry-run).")
@_library_errors
def repair(path: str, yes: bool, dry_run: bool, as_json: bool) -> None:
    """Cut the damaged WAL at PATH at its first damage, keeping what lies past it.

    Shows what the repair keeps, where it cuts, which valid records past the cut it sets
    aside in lost+found (LSN ranges, records, bytes) and which bytes hold none, then asks.
    The repair is what pmemwal.open(PATH, on_corruption='truncate', verify='all') does: it
    takes the WAL's lock (a writer must close it first).  Afterwards it verifies the WAL and
    prints the command that appends the set-aside records again.  Exits 0 when the WAL is
    sound (repaired, or nothing to repair), 1 when it was not repaired; with --dry-run, 0
    when a plan could be made, 1 when the damage is of a kind a cut does not mend.  A WAL
    that changed while it asked (a writer came and went) is shown again, and asked again.

    Example: pmemwal repair /dev/shm/wal --dry-run
    """
    if as_json and not (yes or dry_run):
        raise click.UsageError("--json cannot ask: add --yes (repair) or --dry-run (plan only)")
    _inspect.checks.require_wal_directory(path)
    if not dry_run and _writer_open(path):
        raise pmemwal.LockedError(f"{path} is open in a writer: close it first (the repair "
                                  "takes the WAL's lock; --dry-run shows the plan meanwhile)")
    plan = _repair.plan(path)
    while True:
        if not as_json:
            click.echo("\n".join(plan.lines()))
        if not plan.needed or plan.blockers or dry_run:
            if as_json:
                _dump({"plan": plan.as_dict(), "result": None})
            raise click.exceptions.Exit(1 if plan.blockers or (plan.needed and not dry_run)
                                        else 0)
        if not yes and not _confirm("Repair the WAL?"):
            click.echo("nothing was changed (--yes repairs without asking)", err=True)
            raise click.exceptions.Exit(1)
        again = _repair.plan(path)      # (a writer may have come and gone while it asked)
        if again.same_cut(plan):
            break
        click.echo("the WAL changed since this plan was made; the plan now:", err=True)
        plan = again
        if yes:
            raise click.exceptions.Exit(1)
    result = _repair.repair(path)
    if as_json:
        _dump({"plan": plan.as_dict(), "result": result.as_dict()})
    else:
        click.echo("\n".join(result.lines()))
    if not result.after.ok:
        raise click.exceptions.Exit(1)


def _confirm(question: str) -> bool:
    """A yes/no answer, no on end of input (no terminal: a script must say --yes)."""
    try:
        return click.confirm(question, default=False)
    except click.exceptions.Abort:
        click.echo()
        return False


# ---- compare (pmemwal.tools.harness) ----------------------------------------------

from pmemwal import device as _device, libpmem as _libpmem  # noqa: E402
from pmemwal.tools import harness as _harness  # noqa: E402  (kept beside the command that uses it)
from pmemwal.tools import presets as _presets  # noqa: E402
from pmemwal.tools.fs_model import FS_MODELS


def _merge_params(ctx, param, value):
    try:
        return _harness.merge_params(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None


@main.command()
@click.argument("path", type=click.Path())
@click.option("--targets", type=_Parsed("targets", _harness.parse_targets),
              default="buffered,direct", show_default=True,
              help="Comma-separated targets: WAL modes and peers (see pmemwal.tools.targets).")
@click.option("--clients", type=_Parsed("clients", _harness.parse_clients), default="1,2,4",
              show_default=True, help="Comma-separated client counts.")
@click.option("--sizes", type=_Parsed("sizes", _harness.parse_sizes), default="8k,64k,1m",
              show_default=True, help="Comma-separated record sizes (k, m, g: KiB, MiB, GiB).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds per run.")
@click.option("--runs", type=click.IntRange(min=1), default=6, show_default=True,
              help="Runs per point; with 3 or more the highest and lowest are dropped.")
@click.option("--param", "params", type=_Parsed("param", _harness.parse_param), multiple=True,
              callback=_merge_params, metavar="NAME=V1,V2",
              help="A pmemwal option to vary (repeatable), e.g. insert_slots=8,64.")
@click.option("--flush", type=_Parsed("flush", _harness.parse_flushes), default="each",
              show_default=True, help="Flush after each record, after every K (group:K), or "
              "only at the end; several (each,end) are a grid dimension of every target.")
@click.option("--baseline", default=None,
              help="Target the ratio tables divide by [default: the first].")
@click.option("--db", type=click.Path(dir_okay=False), default=_harness.DEFAULT_DB,
              show_default=True, help="SQLite file every raw run is appended to.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the results as a PNG chart here.")
@click.option("--markdown", is_flag=True, help="Print the tables as markdown.")
@click.option("--columns", type=_Parsed("columns", _harness.parse_columns), default=None,
              help="WAL counters to table and draw beside records/s, per second of each run "
                   "(waits in ms/s), e.g. slot_wait,insert_wait.")
@click.option("--preset", type=click.Choice(list(_presets.PRESETS)), default=None,
              help="A seed's experiment: sets every option not given (docs/EXPERIMENTS.md).")
@click.option("--full", is_flag=True,
              help="With --preset: the seed's own scale (its clients and run lengths).")
@click.option("--against", metavar="REV", default=None,
              help="A/B: also run the buffered/direct targets as built at git revision REV "
                   "(built once, cached by commit), interleaved, as the baseline: ratios read "
                   "this build / REV.")
@click.option("--quiet", is_flag=True, help="No progress on stderr (a terminal gets a bar, a "
              "file or pipe a line every 10 s).")
@click.pass_context
@_library_errors
def compare(ctx: click.Context, path: str, targets: list[str], clients: list[int],
            sizes: list[int], duration: float, runs: int, params: dict, flush: list[str],
            baseline: str | None, db: str, plot_path: str | None, markdown: bool,
            columns: list[str], preset: str | None, full: bool, against: str | None,
            quiet: bool) -> None:
    """Run targets x params x clients x sizes, RUNS times each, and print tables of the results.

    PATH is a base directory: each run uses a fresh subdirectory of it.

    Example: pmemwal compare /dev/shm/cmp --targets buffered,direct --clients 1,2,4
    --sizes 8k,64k,1m --param insert_slots=8,64 --db results.db --plot chart.png

    Example: pmemwal compare /dev/shm/cmp --preset insert-slots --plot slots.png

    Example: pmemwal compare /dev/shm/cmp --targets direct --against HEAD~3 --sizes 64,8k
    """
    if len(flush) > 1:
        params = {**params, "flush": flush}
    options: dict = dict(targets=targets, clients=clients, sizes=sizes, duration=duration,
                         runs=runs, flush=flush[0], params=params, baseline=baseline,
                         columns=columns or [])
    if full and not preset:
        raise click.UsageError("--full needs --preset")
    if preset:
        options = _with_preset(ctx, _presets.get_preset(preset), full, path, options, against)
    config = _harness.CompareConfig(path=path, db=db, plot=plot_path, against=against, **options)
    if against:
        click.echo(f"building pmemwal at {against} (once per commit; cached)", err=True)
    plan = _harness.prepare(config)
    click.echo(_harness.environment_text(plan.environment, plan.group))
    warning = _harness.governor_warning(plan.environment)
    if warning:
        click.echo(warning, err=True)
    for name, reason in plan.skipped.items():
        click.echo(f"skipped {name}: {reason}")
    seconds = plan.total_runs * (config.duration + _RUN_OVERHEAD_S)
    click.echo(f"{_progress.plural(plan.total_runs, 'run')} of {config.duration:g} s each "
               f"planned: about {_progress.clock(seconds)} (longer with peers that start a "
               "server)")
    click.echo()
    with _progress.progress(plan.total_runs, "run", "compare", "pmemwal compare", quiet) as bar:
        def progress(p: dict) -> None:
            bar.set_postfix_str(f"{p['label']} x{p['clients']} {_harness.size_text(p['size'])}: "
                                f"{p['records_per_s']:.0f} rec/s")
            bar.update()
        result = _harness.run_compare(config, progress=progress, plan=plan)
    summary = _harness.summarize(db, result.group)
    click.echo(summary.report(markdown=markdown, baseline=config.baseline))
    click.echo(f"\n{_progress.plural(plan.total_runs, 'run')} stored in {db} "
               f"(run group {result.group})")
    if plot_path:
        _harness.plot(summary, plot_path)
        click.echo(f"chart: {plot_path}")


_RUN_OVERHEAD_S = 0.45  # a pmemwal target's run beyond its duration: WAL, warm-up, clean-up


@main.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@click.option("--group", "groups", multiple=True,
              help="A run group to report (repeatable: several are joined into one set of "
                   "tables; one not in DB is an error naming those that are) [default: the "
                   "latest].")
@click.option("--list", "list_groups", is_flag=True, help="List the run groups in DB and stop.")
@click.option("--baseline", default=None,
              help="Series (or target) the ratio tables divide by; one that names no series is "
                   "an error listing them [default: as stored].")
@click.option("--markdown", is_flag=True, help="Print the tables as markdown.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every point as a CSV row here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the results as a PNG chart here.")
@click.option("--intervals", "intervals_path", type=click.Path(dir_okay=False), default=None,
              help="Draw every run's records/s per second (pgbench's progress lines) as a PNG "
                   "here.")
@_library_errors
def report(db: str, groups: tuple[str, ...], list_groups: bool, baseline: str | None,
           markdown: bool, csv_path: str | None, plot_path: str | None,
           intervals_path: str | None) -> None:
    """Print the tables, ratios, counters and chart of runs stored by `pmemwal compare`.

    Several --group options join their run groups: a series found in more than one is
    named with its group (e.g. two runs of one target under different environments).

    Example: pmemwal report results.db --group 20261204T152839-8cd30b --group
    20261204T153126-d1086b --baseline buffered --csv joined.csv --plot joined.png
    """
    if list_groups:
        for g in _harness.list_groups(db):
            preset = f", preset {g['preset']}" if g["preset"] else ""
            click.echo(f"{g['group']}  {g['timestamp']}  {_progress.plural(g['runs'], 'run')}  "
                       f"{g['targets']}{preset}")
        return
    summaries = [_harness.summarize(db, group) for group in (groups or [None])]
    summary = _harness.join(summaries)
    if baseline:  # one that names no series is refused, as compare refuses it, before output
        summary.baseline_series(baseline)
    for each in summaries:
        click.echo(_harness.environment_text(each.environment, each.group) + "\n")
    click.echo(summary.report(markdown=markdown, baseline=baseline))
    if csv_path:
        click.echo(f"\ncsv: {_harness.write_csv(summary, csv_path)}")
    if plot_path:
        click.echo(f"chart: {_harness.plot(summary, plot_path)}")
    if intervals_path:
        click.echo("intervals: " + _harness.plot_intervals(db, list(groups or [None]),
                                                           intervals_path))


def _with_preset(ctx: click.Context, preset: _presets.Preset, full: bool, path: str,
                 options: dict, against: str | None = None) -> dict:
    """``options`` with the preset's values where the command line left the default
    (its --param values merged under those given); on tmpfs, a preset with direct mode
    emulates persistent memory unless PMEM_IS_PMEM_FORCE says otherwise.  With
    ``--against``, the preset's baseline is its series at the other build, so that ratios
    read this build over REV, as --against promises."""
    import os

    given = {name for name in options
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    values = preset.config(full)
    merged = {**options, **{k: v for k, v in values.items() if k not in given and k != "params"}}
    merged["params"] = {**values.get("params", {}), **options["params"]}
    if against and "baseline" not in given and merged.get("baseline"):
        target, *rest = merged["baseline"].split()
        if target in _harness.AB_MODES:
            merged["baseline"] = " ".join([f"{target}@{against}", *rest])
    click.echo(f"preset {preset.name}{' (full scale)' if full else ''}: seed {preset.seed}: "
               f"{preset.measures}")
    if preset.emulate_pmem and not os.environ.get("PMEM_IS_PMEM_FORCE") \
            and _device.fs_type(path) == "tmpfs":
        os.environ["PMEM_IS_PMEM_FORCE"] = "1"  # before libpmem is first asked (prepare)
        click.echo("preset: PMEM_IS_PMEM_FORCE=1 set: direct mode on tmpfs persists by cache "
                   "flush, as on DAX persistent memory (tmpfs itself is volatile: durability "
                   "here is a benchmark setting)")
    persist = merged["params"].get("persist", [])
    if "pmem" in persist and "persist" not in options["params"] and _libpmem.load() is None:
        merged["params"]["persist"] = [p for p in persist if p != "pmem"] or ["auto"]
        click.echo("preset: libpmem is not installed: the cache-flush (persist=pmem) series is "
                   "left out (apt install libpmem1)")
    return merged


# ---- torture (pmemwal.tools.torture.driver, .shared) and powerloss (pmemwal.tools.powerloss) ------


@main.command()
@click.argument("path", type=click.Path(file_okay=False), required=False)
@click.option("--rounds", type=click.IntRange(min=1), default=200, show_default=True,
              help="Rounds of append, SIGKILL, recover and check.")
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True,
              help="Writer threads in the child.")
@click.option("--seed", type=int, default=None, help="Seed of configurations, delays and record "
              "sizes [default: random, printed].")
@click.option("--modes", type=_Parsed("modes", _torture_setups.parse_modes), default="buffered,direct,pmem",
              show_default=True, help="Persist setups: buffered (fdatasync), direct (msync), "
              "pmem (direct with PMEM_IS_PMEM_FORCE=1).")
@click.option("--segment-sizes", type=_Parsed("sizes", lambda t: _torture_setups.parse_ints(
              t, _bench.parse_size)), default="1M,2M,4M", show_default=True,
              help="Segment sizes, one per WAL directory in turn.")
@click.option("--slots", type=_Parsed("slots", _torture_setups.parse_ints), default="1,8,256",
              show_default=True, help="Insertion slot counts.")
@click.option("--rounds-per-dir", type=click.IntRange(min=1), default=50, show_default=True,
              help="Rounds on one WAL directory before a fresh one.")
@click.option("--max-delay", type=click.FloatRange(min=5), default=300.0, show_default=True,
              help="Longest kill delay after the child is ready, in ms (the shortest is 5).")
@click.option("--keep", is_flag=True, help="Leave the directory (and its last WAL) behind.")
@click.option("--workload", type=click.Choice(_TORTURE_WORKLOADS), default="wal",
              show_default=True, help="wal: records appended, flushed, truncated; log: a "
              "pmemwal.Log's entries appended and synced, rewinds, compactions, resets, states.")
@click.option("--checkpoint", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds between truncations by a checkpointer thread beside the writers, so "
                   "kills land amid recycling (wal workload; e.g. 0.005); 0: none.")
@click.option("--processes", type=click.IntRange(min=0), default=0, show_default=True,
              help="A shared WAL instead: this many writer processes of --threads threads "
                   "append at once, one SIGKILLed (mostly mid-insert) about every "
                   "--kill-interval and replaced, for --seconds (docs/SHARED.md); 0: the rounds.")
@click.option("--seconds", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="With --processes: how long.")
@click.option("--kill-interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
              help="With --processes: mean seconds between kills.")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --processes: each writer truncates every this many records; 0: never.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--quiet", is_flag=True, help="No progress on stderr (a terminal gets a bar, a "
              "file or pipe a line every 10 s).")
@_library_errors
def torture(path: str | None, rounds: int, threads: int, seed: int | None, modes: tuple[str, ...],
            segment_sizes: tuple[int, ...], slots: tuple[int, ...], rounds_per_dir: int,
            max_delay: float, keep: bool, workload: str, checkpoint: float, processes: int,
            seconds: float, kill_interval: float, checkpoint_every: int, as_json: bool,
            quiet: bool) -> None:
    """Crash torture: a child appends and flushes from several threads, is SIGKILLed at a
    random moment, and the WAL is reopened and checked; repeated ROUNDS times.

    Every acknowledged record must come back intact, and nothing else may be
    garbage.  With --workload log the child drives a pmemwal.Log, and every
    acknowledged entry must be back at its index, no removed entry may come
    back, and first index and hard state must be as acknowledged.  Exits 1
    when anything is lost, garbled, out of order, resurrected or failed; the
    WALs of such rounds are kept (named in the report).  PATH defaults to a
    fresh directory under /dev/shm, removed at the end unless --keep.

    With --processes N, N writer processes share one WAL (shared=True, direct mode
    persisting by cache flush under PMEM_IS_PMEM_FORCE=1); one is SIGKILLed at random,
    mostly mid-insert, and replaced; every survivor must acknowledge again within 10 s;
    at the end all are killed and every acknowledged record must be back.

    Example: pmemwal torture --rounds 600 --modes buffered,direct,pmem --slots 1,8,256
    """
    _mutants.apply_from_environment()  # PMEMWAL_MUTANT (the children put it in too)
    if processes:
        _torture_processes(path, processes, threads, seconds, kill_interval, checkpoint_every,
                           seed, as_json, quiet)
        return
    config = _torture.TortureConfig(path=path, rounds=rounds, threads=threads, seed=seed,
                                    modes=modes, segment_sizes=segment_sizes, slots=slots,
                                    rounds_per_dir=rounds_per_dir, delay_ms=(5.0, max_delay),
                                    keep=keep, workload=workload, checkpoint=checkpoint)
    with _progress.progress(rounds, "round", "torture", "pmemwal torture", quiet) as bar:
        def progress(report: _torture.TortureReport, result: _torture.RoundResult) -> None:
            bar.set_postfix_str(f"{result.setup.key} acked {report.acknowledged} "
                                f"lost {report.lost} garbage {report.garbage}")
            bar.update()
        report = _torture.run(config, progress=progress)
    if as_json:
        _dump(report.to_dict())
    else:
        click.echo(report.table())
    if not report.ok:
        raise click.exceptions.Exit(1)


def _torture_processes(path: str | None, processes: int, threads: int, seconds: float,
                       kill_interval: float, checkpoint_every: int, seed: int | None,
                       as_json: bool, quiet: bool) -> None:
    """torture --processes: pmemwal.tools.torture.shared."""
    config = _shared_torture.SharedTortureConfig(
        path=path, processes=processes, threads=threads, seconds=seconds,
        kill_interval=kill_interval, checkpoint_every=checkpoint_every, seed=seed,
        env={"PMEM_IS_PMEM_FORCE": os.environ.get("PMEM_IS_PMEM_FORCE", "1")})
    started, shown = time.monotonic(), [0]
    with _progress.progress(int(seconds), "second", "torture", "pmemwal torture --processes",
                            quiet) as bar:
        def progress(report: _shared_torture.SharedTortureReport) -> None:
            bar.set_postfix_str(f"{report.kills} kills, longest stall "
                                f"{max(report.stalls, default=0) * 1000:.0f} ms")
            now = min(int(time.monotonic() - started), int(seconds))
            bar.update(now - shown[0])
            shown[0] = now
        report = _shared_torture.run(config, progress=progress)
        bar.update(int(seconds) - shown[0])
    if as_json:
        _dump(report.to_dict())
    else:
        click.echo(report.summary())
        for problem in (report.lost + report.garbage + report.order + report.blocked)[:10]:
            click.echo(f"FAILED {problem}")
    if not report.ok:
        raise click.exceptions.Exit(1)


@main.command()
@click.option("--images", type=click.IntRange(min=1), default=300, show_default=True,
              help="Crash images to recover and check, per setup (with --fs-model: distinct "
              "crash states per workload).")
@click.option("--setups", type=_Parsed("setups", _powerloss.parse_setups), default=None,
              help="pmem (flush/drain traced, records streamed from 256 bytes on; 1 writer), "
              "pmem-threads (4 writers), pmem-checkpointer (4 writers and a thread truncating "
              "every 2 ms), pmem-shared (4 writers through 3 handles of a shared WAL, one dying "
              "mid-insert now and then), pmem-clflush (libpmem's CLFLUSH setting: pmem_drain "
              "empty); msync, buffered (durable only what the WAL's syncs covered); "
              "msync-threads, buffered-threads (4 writers: one's flush while another's sync "
              "runs); msync-kill, buffered-kill (the writer killed now and then and the WAL "
              "reopened, crashes inside its recovery too); pmem-background, msync-background, "
              "buffered-background (the WAL's background writer on: flushes, segments made "
              "ahead, a checkpoint every 5 ms); buffered-log (the log workload, in the wal run "
              "too).  Each runs on the traced core, in a child process.  [default: all but "
              "buffered-background]")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of workload and crashes.")
@click.option("--keep-failures", type=click.Path(file_okay=False), default=None,
              help="Copy every image that fails its check into this directory.")
@click.option("--workload", type=click.Choice(_powerloss.WORKLOADS), default="wal",
              show_default=True, help="wal: records appended and flushed; log: a pmemwal.Log's "
              "entries appended and synced, rewinds, compactions, resets, states; follow: the "
              "wal workload's records, each image held to the durable LSN the writers had "
              "published for followers when it was taken (not to what the calls returned).")
@click.option("--fs-model", type=click.Choice(FS_MODELS), default=None,
              help="Instead of the data setups: file-system metadata crash states (creates, "
              "renames, unlinks, syncs) of this file system's model, IMAGES distinct "
              "states for each metadata workload (growth, truncate, recycle, shared, archive, "
              "restore, log, eventsourcing, background: the WAL's background writer on), and "
              "IMAGES/4 for salvage (crashes inside a recovery that cuts damage and sets records "
              "aside in lost+found, each state recovered again); files other than segments also "
              "come back one by one, as an older or partly written-back version.")
@click.option("--traced", is_flag=True,
              help="Run each pmem setup once per streaming CPU path this machine has (without "
              "it: the best one only); pmem_drain as libpmem's flush instruction has it "
              "(PMEM_NO_CLWB=1 PMEM_NO_CLFLUSHOPT=1: CLFLUSH, where it is empty).")
@click.option("--max-failures", type=click.IntRange(min=0), default=20, show_default=True,
              help="Stop after the setup (or workload) that brings the failing images to this "
              "many; 0: run them all.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@click.option("--quiet", is_flag=True, help="No progress on stderr (a terminal gets a bar, a "
              "file or pipe a line every 10 s).")
@_library_errors
def powerloss(images: int, setups: tuple[str, ...], seed: int, keep_failures: str | None,
              workload: str, fs_model: str | None, traced: bool, max_failures: int,
              as_json: bool, quiet: bool) -> None:
    """Simulated power loss: crash a live WAL IMAGES times per setup, keeping only what
    was persisted (and a random part of the rest), and check each recovery.

    Every acknowledged record must come back, and nothing that was not written
    there.  With --workload log, every acknowledged entry, rewind, compaction
    and state must survive, and no removed entry come back.  With --workload
    follow, every record a follower in another process could have read (below
    the durable LSN published when the power went) must come back.  Exits 1
    when any image fails.

    With --fs-model ext4|xfs, the crashes are of the file system's metadata
    instead (docs/RELIABILITY.md, "File-system metadata crash states"): each
    state a crash may leave of the pending creates, renames, unlinks and size
    changes is recovered; nothing acknowledged may be lost, nothing stale
    returned, and no WAL refuse to open.  --setups and --workload do not apply.

    Example: pmemwal powerloss --images 5000 --setups pmem,pmem-threads,msync,buffered

    Example: pmemwal powerloss --fs-model ext4 --images 2000 --seed 1

    Example: pmemwal powerloss --traced --images 500 --setups pmem-checkpointer,msync-kill

    Example: pmemwal powerloss --workload follow --images 500 --setups msync,msync-threads,pmem
    """
    if fs_model is not None:
        _mutants.apply_from_environment()  # PMEMWAL_MUTANT (the data setups: each child's)
        _fs_powerloss(fs_model, images, seed, as_json, quiet, max_failures)
        return
    reports = []
    # the log workload compacts from its own workers (no checkpointer setup for it), and a
    # Log has one writer process (no shared setup)
    if setups is None:
        setups = tuple(s for s in _powerloss.SETUPS if s not in _powerloss.NOT_DEFAULT)
    setups = tuple(s for s in setups if _powerloss.applies(s, workload))
    runs = [(setup, cpu) for setup in setups for cpu in
            (_traced.streaming_paths() if traced and _powerloss.SETUPS[setup]["mode"] == "pmem"
             else [None])]
    with _progress.progress(images * len(runs), "image", "powerloss", "pmemwal powerloss",
                            quiet) as bar:
        for setup, cpu in runs:
            options = {"workload": workload, **_powerloss.SETUPS[setup], "seed": seed,
                       "keep_failures": keep_failures}  # (a setup may name its workload)
            bar.set_postfix_str(setup + (f" ({cpu})" if cpu else ""))
            # on the traced core, always: the regular core's page-cache model counts
            # everything durable once a flush returns (blind to a sync missing or short),
            # and its pmem runs never stream (blind to a fence missing after streaming)
            report = _traced.run_traced(images=images, cpu=cpu, progress=bar.update,
                                        streaming=options["mode"] == "pmem", **options)
            reports.append(report)
            if _stop(reports, max_failures):
                break
        setups = tuple(setup for setup, _ in runs)[:len(reports)]
    if as_json:
        _dump({"reports": [r.to_dict() for r in reports]})
    else:
        click.echo(_powerloss.table(reports))
        for setup, report in zip(setups, reports):
            for failure in report.failures[:5]:
                click.echo(f"FAILED {failure} (reproduce: pmemwal powerloss --images {images} "
                           f"--setups {setup} --workload {workload} --seed {seed}"
                           f"{' --traced' if traced else ''})")
    if not all(r.ok for r in reports):
        raise click.exceptions.Exit(1)


def _stop(reports: list, max_failures: int) -> bool:
    """Whether the failing images of ``reports`` reach ``max_failures`` (0: never), said on
    stderr when they do."""
    failing = sum(len(r.failures) for r in reports)
    if max_failures and failing >= max_failures:
        click.echo(f"powerloss: stopped after {failing} failing images (--max-failures "
                   f"{max_failures})", err=True)
        return True
    return False


def _fs_powerloss(fs_model: str, states: int, seed: int, as_json: bool, quiet: bool,
                  max_failures: int = 0) -> None:
    """``powerloss --fs-model``: the metadata crash-state driver over its workloads."""
    reports = []
    workloads = _fs_crash.WORKLOADS
    # (salvage: a state costs a little more than the others', and it finds its bugs early)
    sizes = {name: max(1, states // 4) if name == "salvage" else states for name in workloads}
    with _progress.progress(sum(sizes.values()), "state", "powerloss", "pmemwal powerloss",
                            quiet) as bar:
        for name in workloads:
            bar.set_postfix_str(f"{fs_model} {name}")
            reports.append(_fs_crash.run_fs_crash(fs_model, sizes[name], seed, workload=name,
                                                  progress=bar.update))
            if _stop(reports, max_failures):
                break
    if as_json:
        _dump({"reports": [r.to_dict() for r in reports]})
    else:
        click.echo(_fs_crash.table(reports))
        for report in reports:
            for failure in report.failures[:5]:
                click.echo(f"FAILED {failure} (reproduce: pmemwal powerloss --fs-model "
                           f"{fs_model} --images {states} --seed {seed})")
    if not all(r.ok for r in reports):
        raise click.exceptions.Exit(1)


if __name__ == "__main__":
    main()
