"""The bench's parameters: ``BenchConfig``, its checks, and the text forms of sizes and flush policies.

``parse_size``, ``parse_keep`` (``--keep``) and ``parse_flush`` (``each``, ``end``,
``group:K``) read what the command line gives; ``BenchConfig`` checks every option once,
passes the WAL's own on as they are (``wal_options``) and sizes from them the truncation
step and the pool of recycled segments (``truncate_step``, ``recycle_segments``).

MB is 10**6 bytes; sizes given as text (``8k``, ``16MiB``) are powers of 1024.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from pmemwal.errors import ConfigError
from pmemwal.wal import (DEFAULT_BUFFER_SIZE, DEFAULT_FLUSH_INTERVAL, DEFAULT_GIL_RELEASE_SIZE,
                         DEFAULT_MAX_WAL_SIZE, MODES, check_wal_options)

FLUSH_POLICIES = ("each", "end", "group:K")
DEFAULT_PATH = "/dev/shm/pmemwal-bench"
DEFAULT_KEEP = 256 << 20
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE_RE = re.compile(r"(\d+)\s*(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from ``8192``, ``"8k"``, ``"8KiB"``, ``"16m"``, ``"1G"`` (k/m/g are powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text}: must not be negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size {text!r}: expected an integer or text such as 8k, 16m, 1g")
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"size {text!r}: expected a whole number of bytes with an optional "
                         "unit k, m or g (KiB, MiB, GiB), e.g. 8192, 8k, 16MiB, 1g")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def parse_keep(text: str | int | None) -> int | None:
    """``--keep``: a size, or ``"all"`` (None: nothing is ever truncated)."""
    if text is None or (isinstance(text, str) and text.strip().lower() == "all"):
        return None
    return parse_size(text)


def parse_flush(text: str) -> int:
    """Records per client flush: ``"each"`` -> 1, ``"group:K"`` -> K, ``"end"`` -> 0."""
    policy = str(text).strip().lower()
    if policy == "each":
        return 1
    if policy == "end":
        return 0
    kind, colon, count = policy.partition(":")
    if kind == "group" and colon and count.isdigit() and int(count) >= 1:
        return int(count)
    raise ValueError(f"flush policy {text!r}: expected each, end or group:K "
                     "(K a whole number of records, 1 or more), e.g. group:16")


@dataclass
class BenchConfig:
    """One benchmark run's parameters; sizes may be given as text (``"8k"``)."""

    path: str = DEFAULT_PATH
    mode: str = "auto"  # "auto", "buffered" or "direct"
    clients: int = 1  # threads appending (processes, with ``processes``)
    size: int = 8192  # bytes per record
    duration: float = 5.0  # seconds of appending
    flush: str = "each"  # "each", "end" or "group:K"
    segment_size: int | None = None  # None: the WAL's default
    insert_slots: int = 8
    prefault: bool = True  # segments mapped pre-faulted and prepared ahead (WAL option)
    persist: str = "auto"  # direct mode's persistence: "auto", "pmem" or "msync" (WAL option)
    cold: bool = False  # no warm-up: the run starts on a fresh WAL, its segments new
    # the other pmemwal.open options, passed on as they are (see pmemwal.WAL)
    buffer_size: int = DEFAULT_BUFFER_SIZE  # buffered mode's ring
    sync_method: str = "fdatasync"  # buffered mode's
    background: bool = True
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    prepare_segments: int = 2
    gil_release_size: int = DEFAULT_GIL_RELEASE_SIZE
    max_wal_size: int = DEFAULT_MAX_WAL_SIZE
    preallocate: int = 0
    insertion: str = "parallel"  # or "serial": one insertion at a time (seed 004's before)
    keep_bytes: int | None = DEFAULT_KEEP  # WAL kept behind the flushed LSN, truncated
                                           # every truncate_step appended; None: all
    checkpoint: float = 0.0  # s between truncations by a checkpointer thread; 0: by the clients
                             # (with keep_bytes None: nothing is truncated either way)
    fresh: bool = True  # delete the WAL directory first (it must hold only a WAL)
    force: bool = False  # delete it even when it holds records a bench run did not make
    keep_wal: bool = False  # leave the WAL behind after the run (else removed, on Ctrl-C too)
    progress_interval: float = 1.0  # seconds between progress lines; 0: none
    rate: float = 0.0  # records/s each client appends at most (paced: a given load); 0: no limit
    processes: bool = False  # the clients are processes, each opening the WAL with shared=True
                             # (mode "direct" only); False: threads of this process
    archive: str | None = None  # an fsspec URL complete segments are archived to (WAL option)
    archive_options: dict | None = None  # its storage options (WAL option)

    def __post_init__(self) -> None:
        self._parse()
        self._check_wal_options()
        self._check_run()

    def _parse(self) -> None:
        """Sizes and the flush policy from their text forms (and the first checks on them)."""
        self.path = os.fspath(self.path)
        self.size = parse_size(self.size)
        if self.segment_size is not None:
            self.segment_size = parse_size(self.segment_size)
        self.keep_bytes = parse_keep(self.keep_bytes)
        if not self.checkpoint >= 0:
            raise ConfigError(f"checkpoint={self.checkpoint!r}: 0 or more seconds")
        if self.keep_bytes is None:
            self.checkpoint = 0.0  # nothing to truncate (a grid may pair keep=all with any)
        self.flush = str(self.flush).strip().lower()
        parse_flush(self.flush)
        if self.mode not in MODES:
            raise ConfigError(f"mode={self.mode!r}: valid values are {', '.join(MODES)}")
        for name in ("buffer_size", "max_wal_size", "preallocate", "gil_release_size"):
            setattr(self, name, parse_size(getattr(self, name)))

    def _check_wal_options(self) -> None:
        """The WAL's own options, as pmemwal.open would check them."""
        options = self.wal_options()
        # booleans: nothing to check; the archive's options pmemwal.open checks itself
        for name in ("prefault", "background", "archive", "archive_options"):
            del options[name]
        check_wal_options(mode=self.mode, segment_size=self.segment_size,
                          insert_slots=self.insert_slots, **options)

    def _check_run(self) -> None:
        """The run's own options, and those that do not go together."""
        if not (isinstance(self.clients, int) and self.clients >= 1):
            raise ConfigError(f"clients={self.clients!r}: 1 or more")
        if not self.duration > 0:
            raise ConfigError(f"duration={self.duration!r}: more than 0 seconds")
        if not self.rate >= 0:
            raise ConfigError(f"rate={self.rate!r}: records/s, 0 (no limit) or more")
        if not self.progress_interval >= 0:
            raise ConfigError(f"progress_interval={self.progress_interval!r}: 0 or more seconds")
        if self.processes and self.mode != "direct":
            raise ConfigError(f"processes=True: mode='direct' only (a WAL shared by processes "
                              f"runs in direct mode), not {self.mode!r}")
        if self.archive_options is not None and self.archive is None:
            raise ConfigError("archive_options go with archive (a URL)")
        if self.archive is not None and self.processes:
            raise ConfigError("archive: the bench archives from its own process only, not with "
                              "processes=True (the main process there runs no background writer)")

    def wal_options(self) -> dict:
        """The pmemwal.open options this config passes on as they are."""
        return {name: getattr(self, name) for name in (
            "prefault", "persist", "buffer_size", "sync_method", "background", "flush_interval",
            "prepare_segments", "gil_release_size", "max_wal_size", "preallocate",
            "insertion", "archive", "archive_options")}

    @property
    def flush_every(self) -> int:
        """Records per client flush; 0 for ``end``."""
        return parse_flush(self.flush)

    def truncate_step(self, segment_size: int) -> int | None:
        """Bytes appended between the clients' truncations (None: no truncation, or a
        checkpointer's): a quarter of ``keep_bytes``, so the disk holds little beyond
        it, but at least a segment, the least a truncation removes."""
        if self.keep_bytes is None or self.checkpoint:
            return None
        return max(segment_size, self.keep_bytes // 4)

    def recycle_segments(self, segment_size: int) -> int:
        """The WAL's ``recycle_segments``: spares enough that appending between two
        truncations never needs a new segment, and each truncation recycles every
        segment it drops.  The live window swings by up to two steps (one of
        appending, one the flushed LSN may lag behind it) plus the records the
        clients have in flight when the step is crossed."""
        step = self.truncate_step(segment_size)
        if step is None:
            return 2  # the WAL's default (a checkpointer's pool follows its distance)
        swing = 2 * step + self.clients * self.size
        return -(-swing // segment_size) + 1
