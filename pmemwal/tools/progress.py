"""Progress of the long-running commands (compare, torture, powerloss) on stderr, and two
helpers the commands' text shares: ``clock`` (``1:15``) and ``plural`` (``1 run``, ``2 runs``).

A terminal gets tqdm's bar.  A file or a pipe would get the bar's carriage
returns as one endless line, so it gets plain lines instead, one every
``interval`` seconds and one at the end::

    compare: 12/54 runs (22%), 0:17 elapsed, about 0:59 left; direct x2 8k: 571234 rec/s

``quiet`` shows nothing.  Either way the object is used like a tqdm bar:
``with progress(...) as bar: bar.set_postfix_str(text); bar.update()``.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from pmemwal.tools import _extras


def progress(total: int, unit: str, desc: str, command: str, quiet: bool = False,
             stream: TextIO | None = None, interval: float = 10.0):
    """A tqdm bar on a terminal, plain periodic lines elsewhere, nothing when ``quiet``."""
    stream = stream or sys.stderr
    if quiet:
        return _Silent()
    if stream.isatty():
        tqdm = _extras.require("tqdm", "bench", command).tqdm
        return tqdm(total=total, file=stream, unit=unit, desc=desc)
    return _Lines(total, unit, desc, stream, interval)


class _Silent:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


class _Lines(_Silent):
    """A line every ``interval`` seconds and at the end: done/total, elapsed, time left."""

    def __init__(self, total: int, unit: str, desc: str, stream: TextIO, interval: float) -> None:
        self.total, self.unit, self.desc, self.stream = total, unit, desc, stream
        self.interval, self.done, self.postfix = interval, 0, ""
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.interval or self.done >= self.total:
            self.last = now
            self._line(now)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def _line(self, now: float) -> None:
        elapsed = now - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        eta = f", about {clock(left)} left" if self.done < self.total else ""
        tail = f"; {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.done}/{plural(self.total, self.unit)}{share}, "
              f"{clock(elapsed)} elapsed{eta}{tail}", file=self.stream, flush=True)


def clock(seconds: float) -> str:
    """``75.2`` -> ``1:15``; ``3725`` -> ``1:02:05``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 run``, ``3 runs``; ``many`` where adding an s is wrong (``process``, ``processes``)."""
    return f"{n} {word if n == 1 else many or word + 's'}"
