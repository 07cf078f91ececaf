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
from typing import Callable, ContextManager, Iterator

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


# ---- blind spot 4: a crash during recovery, then a second recovery ------------------------

@mutant("aside-synced-after-cut",
        "a cut's lost+found entry: its manifest written without fsync and its directories not "
        "synced, left to the entry's finish, which runs after the cut's zeroing is synced",
        blind_spot="a crash during recovery, then a second recovery",
        caught_by="pmemwal powerloss --fs-model ext4 (workload salvage)")
def _aside_synced_after_cut() -> Iterator[None]:
    from typing import Any

    from pmemwal import lostfound
    real_set_aside, real_write, real_sync = (lostfound.set_aside, lostfound.write_synced,
                                             lostfound.sync_directory)
    inside = [0]

    def write_synced(path: str, data: bytes, flags: int = os.O_EXCL) -> None:
        if not (inside[0] and path.endswith(lostfound.MANIFEST)):
            return real_write(path, data, flags)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def sync_directory(path: str) -> None:
        if not inside[0]:
            real_sync(path)

    def set_aside(*args: Any, **kwargs: Any) -> Any:
        inside[0] += 1
        try:
            return real_set_aside(*args, **kwargs)
        finally:
            inside[0] -= 1

    lostfound.set_aside, lostfound.write_synced, lostfound.sync_directory = (
        set_aside, write_synced, sync_directory)
    try:
        yield
    finally:
        lostfound.set_aside, lostfound.write_synced, lostfound.sync_directory = (
            real_set_aside, real_write, real_sync)


@mutant("unpend-before-cut",
        "a cut's lost+found entry stops being pending (CUTTING removed) before the cut's "
        "zeroing is written and synced, not after",
        blind_spot="a crash during recovery, then a second recovery",
        caught_by="pmemwal powerloss --fs-model ext4 (workload salvage)")
def _unpend_before_cut() -> Iterator[None]:
    from pmemwal import lostfound
    from pmemwal.recovery import Recovery
    real_wipe = Recovery._wipe_beyond

    def wipe(self: Recovery, end: int, pages: list[int]) -> None:
        for entry in lostfound._pending(self._dir.path, self._wal_id, end, end):
            lostfound._unpend(entry.path)
        real_wipe(self, end, pages)

    Recovery._wipe_beyond = wipe  # type: ignore[method-assign]
    try:
        yield
    finally:
        Recovery._wipe_beyond = real_wipe  # type: ignore[method-assign]



# ---- blind spot 5: a second file system ---------------------------------------------------
