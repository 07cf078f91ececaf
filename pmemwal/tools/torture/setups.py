"""A torture round's configuration: persist setup, segment size, insertion slots; the
child's environment for a persist setup; and the command line's lists of them."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pmemwal

# persist setup -> (WAL mode, the persist method the child must end up with)
PERSIST = {"buffered": ("buffered", "fdatasync"), "direct": ("direct", "msync"),
           "pmem": ("direct", "pmem")}
_SWITCHES = ("PMEM_IS_PMEM_FORCE", "PMEMWAL_MODE")


@dataclass(frozen=True)
class Setup:
    """One round's configuration."""

    persist: str       # a key of PERSIST
    segment_size: int
    slots: int

    @property
    def mode(self) -> str:
        return PERSIST[self.persist][0]

    @property
    def key(self) -> str:
        return f"{self.persist}/{self.segment_size >> 20}M/{self.slots}"


def child_env(persist: str) -> dict[str, str]:
    """This environment without pmemwal's switches; libpmem forced to pmem for ``pmem``.
    (PMEMWAL_MUTANT stays: a mutant run's children put the mutant in too.)"""
    env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    root = os.path.dirname(os.path.dirname(os.path.abspath(pmemwal.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if persist == "pmem":
        env["PMEM_IS_PMEM_FORCE"] = "1"
    return env


def setup_cycle(modes: tuple[str, ...], slots: tuple[int, ...],
                rng: random.Random) -> Iterator[tuple[str, int]]:
    """(persist setup, slots) pairs: every pair once in each shuffled cycle."""
    pairs = list(itertools.product(modes, slots))
    while True:
        rng.shuffle(pairs)
        yield from pairs


def parse_modes(text: str) -> tuple[str, ...]:
    """``"buffered,direct,pmem"`` -> a tuple of persist setups."""
    modes = tuple(m.strip().lower() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in PERSIST]
    if bad or not modes:
        raise ValueError(f"modes {text!r}: a comma-separated list of {', '.join(PERSIST)}")
    return modes


def parse_ints(text: str, parse: Callable[[str], int] = int) -> tuple[int, ...]:
    """``"1,8,256"`` (or sizes with a parser) -> a tuple of integers."""
    values = tuple(parse(v.strip()) for v in text.split(",") if v.strip())
    if not values:
        raise ValueError(f"{text!r}: expected a comma-separated list")
    return values
