"""Mutants: known persistence bugs put back into pmemwal, for showing that a checker catches them.

A crash checker is only as good as the bugs it catches that it was not written for.  Each
mutant here is one plausible bug (a sync dropped, an order swapped, a guard lost), put into
the library by patching it in this process (``applied``), or, for the native core, by the
traced core's ``TRACE_*`` bits (pmemwal.tools.traced).  The suite holds each one against the
checker meant to catch it (tests/test_mutants.py and the checkers' own tests), and
``python -m pmemwal.tools.mutants`` runs the shipped checkers at their default sizes against
every mutant and says which caught it.

``PMEMWAL_MUTANT=NAME`` puts a mutant into a checker's run (``pmemwal powerloss``,
``pmemwal torture``) and into the children it starts: the torture child and the traced
power-loss child apply it as they start.  Never set it outside such a run.

Registering one::

    @mutant("checkpoint-before-sync", "a background checkpoint names what is not yet synced",
            blind_spot="background writer", caught_by="powerloss --setups msync-background")
    def _checkpoint_before_sync():
        ...patch, then yield, then undo (a generator, as contextlib.contextmanager takes)...
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

ENV = "PMEMWAL_MUTANT"


@dataclass(frozen=True)
class Mutant:
    """One bug put back: ``patch()`` is a context manager that puts it in and takes it out."""

    name: str
    description: str
    patch: Callable[[], ContextManager[None]]
    blind_spot: str = ""      # the checker's blind spot that hid it, if one did
    caught_by: str = ""       # the checker run (a command line) meant to catch it
    core_bits: str = ""       # traced-core TRACE_* bit names it sets (pmemwal.tools.traced)


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, description: str, *, blind_spot: str = "", caught_by: str = "",
           core_bits: str = "") -> Callable[[Callable[[], Iterator[None]]], Callable[[], Iterator[None]]]:
    """Register a generator function (patch, yield, undo) as the mutant ``name``."""
    def register(fn: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
        if name in MUTANTS:
            raise ValueError(f"mutant {name!r} registered twice")
        MUTANTS[name] = Mutant(name, description, contextlib.contextmanager(fn), blind_spot,
                               caught_by, core_bits)
        return fn
    return register


def get(name: str) -> Mutant:
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}: one of {', '.join(sorted(MUTANTS))}") from None


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Mutant ``name`` put in for the ``with`` body (nothing when None)."""
    if not name:
        yield
        return
    with get(name).patch():
        yield


def apply_from_environment() -> None:
    """Put in the mutant ``PMEMWAL_MUTANT`` names, for the rest of this process (a checker's
    child process calls this as it starts)."""
    name = os.environ.get(ENV)
    if name:
        get(name).patch().__enter__()


# ---- mutants the checkers caught before (ported from their tests) -------------------------


# ---- blind spot 1: the background writer --------------------------------------------------


# ---- blind spot 2: concurrent writers in the page-cache modes -----------------------------


# ---- blind spot 3: files other than segments, older and partial versions ------------------

@mutant("index-chunks-unsynced", "a Log's index checkpoint writes its chunk files without their "
        "fdatasync, then the LOG slot that names the entries in them: after a power cut the open "
        "through the index reads LSNs the kernel never wrote back",
        blind_spot="files other than segments",
        caught_by="pmemwal powerloss --setups buffered-log")
def _index_chunks_unsynced() -> Iterator[None]:
    import numpy as np

    from pmemwal import chunked

    def write(self: chunked.ChunkedColumn, start: int, items: Any) -> None:
        data = np.ascontiguousarray(items, self.dtype).view(np.uint8).data
        size, entered = self.dtype.itemsize, []
        with chunked.storage_errors(f"writing {self.path}"):
            chunked.make_directories(self.path)
            done = 0
            while done < len(items):
                chunk, off = divmod(start + done, chunked.CHUNK)
                n = min(len(items) - done, chunked.CHUNK - off)
                fd = os.open(self.file(chunk), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    if os.fstat(fd).st_size != self.file_size:
                        os.ftruncate(fd, self.file_size)
                    os.pwrite(fd, data[done * size:(done + n) * size], off * size)
                    # the bug: no os.fdatasync(fd) here
                finally:
                    os.close(fd)
                if chunk not in self._entered:
                    entered.append(chunk)
                done += n
            if entered:
                chunked.sync_directory(self.path)
                self._entered.update(entered)

    real, chunked.ChunkedColumn.write = chunked.ChunkedColumn.write, write  # type: ignore[method-assign]
    try:
        yield
    finally:
        chunked.ChunkedColumn.write = real  # type: ignore[method-assign]


# ---- blind spot 4: a crash during recovery, then a second recovery ------------------------


# ---- blind spot 5: a second file system ---------------------------------------------------
