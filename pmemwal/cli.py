"""The ``pmemwal`` command: a thin layer over the library (pmemwal.bench, pmemwal.probe).

    pmemwal probe /mnt/pmem/wal
    pmemwal bench /dev/shm/pmemwal-bench --mode direct --clients 4 --size 8k --flush group:16
"""

from __future__ import annotations

import functools
import json

import click

import pmemwal
from pmemwal import bench as _bench


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
    """Turn pmemwal's errors (and bad values it rejects) into a clean message and exit code 1."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (pmemwal.WALError, ValueError, OSError) as error:
            raise click.ClickException(f"{type(error).__name__}: {error}") from error

    return wrapper


def _dump(data: dict) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group(name="pmemwal")
@click.version_option(pmemwal.__version__, prog_name="pmemwal")
def main() -> None:
    """pmemwal: a write-ahead log for persistent memory."""


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the probe as JSON.")
@_library_errors
def probe(path: str, as_json: bool) -> None:
    """Say what PATH (a WAL directory, or where one would go) sits on and which mode suits it.

    Example: pmemwal probe /mnt/pmem/wal --json
    """
    result = pmemwal.probe(path)
    if as_json:
        _dump(result.as_dict())
    else:
        click.echo(str(result))


@main.command()
@click.argument("path", type=click.Path(), default=_bench.DEFAULT_PATH)
@click.option("--mode", type=click.Choice(_bench.MODES), default="auto", show_default=True,
              help="WAL mode; auto asks PMEMWAL_MODE, then the device probe.")
@click.option("--clients", type=click.IntRange(min=1), default=1, show_default=True,
              help="Appending threads.")
@click.option("--size", type=SIZE, default="8k", show_default=True,
              help="Bytes per record (k, m, g: KiB, MiB, GiB).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds of appending.")
@click.option("--flush", type=FLUSH, default="each", show_default=True,
              help="Flush after each record, after every K (group:K), or only at the end.")
@click.option("--segment-size", type=SIZE, default=None,
              help="Segment file size, a power of two from 1m to 1g [default: 16m].")
@click.option("--insert-slots", type=click.IntRange(min=1), default=8, show_default=True,
              help="Concurrent insertions in progress.")
@click.option("--keep", type=SIZE, default="256m", show_default=True,
              help="WAL kept on disk behind the flushed position; older segments are truncated.")
@click.option("--progress", "progress_interval", type=click.FloatRange(min=0), default=1.0,
              show_default=True, help="Seconds between progress lines on stderr (0: none).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_library_errors
def bench(path: str, mode: str, clients: int, size: int, duration: float, flush: str,
          segment_size: int | None, insert_slots: int, keep: int, progress_interval: float,
          as_json: bool) -> None:
    """Append records to a fresh WAL at PATH for a while and report throughput and latency.

    PATH is a benchmark directory: a WAL already there is deleted first.

    Example: pmemwal bench /dev/shm/pmemwal-bench --mode direct --size 8k --flush group:16
    """
    config = _bench.BenchConfig(path=path, mode=mode, clients=clients, size=size,
                                duration=duration, flush=flush, segment_size=segment_size,
                                insert_slots=insert_slots, keep_bytes=keep,
                                progress_interval=progress_interval)
    result = _bench.run(config, progress=lambda p: click.echo(p["line"], err=True))
    if as_json:
        _dump(result.as_dict())
    else:
        click.echo(result.report())


if __name__ == "__main__":
    main()
