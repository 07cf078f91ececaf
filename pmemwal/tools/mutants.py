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
        patch = get(name).patch()
        patch.__enter__()
        _KEPT.append(patch)  # (a generator's patch dropped is closed: its undo would run)


_KEPT: list[ContextManager[None]] = []


# ---- mutants the checkers caught before (ported from their tests) -------------------------


# ---- blind spot 1: the background writer --------------------------------------------------


@mutant("background-checkpoint-before-msync",
        "a direct-mode WAL's background round writes its due checkpoint, at the insert "
        "position, before the flush that makes the records below it durable (the records "
        "are in the mapping, visible to any reader and to a killed writer's successor: "
        "taken for durable, an order swapped)",
        blind_spot="background writer",
        caught_by="pmemwal powerloss --setups msync-background --images 300")
def _background_checkpoint_before_msync() -> Iterator[None]:
    from pmemwal.wal.rounds import BackgroundRounds
    original = BackgroundRounds._flush_async

    def flush_async(self: BackgroundRounds) -> None:  # rounds.py's, the checkpoint moved up
        if not self._direct:
            return original(self)
        if self._closed or self._core.error:
            return
        if self._control is not None:
            self._core.reap_dead()
        if not self._truncating():
            self._check_segments()
        position = self._core.position()
        self._background_checkpoint(position, position[0])  # "in the mapping already"
        if position[0] != self._core.flushed_lsn:
            self._core.flush_ready()
        if self._archiver is not None:
            self._archiver.tick(self._oldest_segment(), self._core.flushed_lsn)

    BackgroundRounds._flush_async = flush_async  # type: ignore[method-assign]
    try:
        yield
    finally:
        BackgroundRounds._flush_async = original  # type: ignore[method-assign]


# ---- blind spot 2: concurrent writers in the page-cache modes -----------------------------


# ---- blind spot 3: files other than segments, older and partial versions ------------------


# ---- blind spot 4: a crash during recovery, then a second recovery ------------------------


# ---- blind spot 5: a second file system ---------------------------------------------------
