"""The mutants' runner: every registered mutant against the shipped crash checkers.

``python -m pmemwal.tools.mutant_runner`` runs, for each mutant of
pmemwal.tools.mutants, the three checkers at their default sizes (``pmemwal powerloss``,
``pmemwal powerloss --fs-model ext4``, ``pmemwal torture --rounds 20``) as child processes
with ``PMEMWAL_MUTANT`` set, the one its ``caught_by`` names first, until one fails on it: a
mutant is caught by the default runs, caught only by the run it names, or missed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from pmemwal.tools.mutants import ENV, MUTANTS, Mutant

# The shipped checkers at their default sizes, in the order a mutant run tries them (cheapest
# first is not the point: the first that fails on a mutant has caught it).
DEFAULT_CHECKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("powerloss", ("powerloss",)),
    ("powerloss --fs-model ext4", ("powerloss", "--fs-model", "ext4")),
    ("torture --rounds 20", ("torture", "--rounds", "20")),
)


@dataclass
class Run:
    """One checker run with a mutant in: ``verdict`` is caught (it failed), missed (it
    passed), error (it ended some other way: a crash, a timeout) or n/a (it cannot carry
    the mutant)."""

    checker: str
    command: str
    verdict: str
    seconds: float = 0.0
    detail: str = ""


def _first_failure(data: object) -> str:
    """The first failure a checker's JSON report names."""
    if isinstance(data, dict):
        for key in ("failures", "problems", "lost", "garbage", "order"):
            value = data.get(key)
            if isinstance(value, list) and value and isinstance(value[0], str):
                return value[0]
        values = list(data.values())
    elif isinstance(data, list):
        values = data
    else:
        return ""
    for value in values:
        found = _first_failure(value)
        if found:
            return found
    return ""


def run_checker(name: str, argv: list[str], mutant_name: str, timeout: float,
                env: dict[str, str] | None = None) -> Run:
    """``pmemwal ARGV --json --quiet`` in a child with ``PMEMWAL_MUTANT=mutant_name``."""
    import json
    import shlex
    import subprocess
    import sys
    import time
    command = [sys.executable, "-m", "pmemwal.tools.cli", *argv, "--json", "--quiet"]
    shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    shown = f"{shown} {ENV}={mutant_name} pmemwal {shlex.join(argv)}".strip()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {}), ENV: mutant_name})
    except subprocess.TimeoutExpired:
        return Run(name, shown, "error", time.perf_counter() - t0, f"timed out after {timeout:.0f} s")
    seconds = time.perf_counter() - t0
    if proc.returncode == 0:
        return Run(name, shown, "missed", seconds)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return Run(name, shown, "error", seconds, tail)
    return Run(name, shown, "caught", seconds, _first_failure(report))


def _command_of(caught_by: str) -> tuple[dict[str, str], list[str]] | None:
    """``caught_by`` as (environment, pmemwal's arguments), or None when it is no command
    line of pmemwal."""
    import shlex
    words = shlex.split(caught_by)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words or words[0] != "pmemwal":
        return None
    return env, words[1:]


def _likeliest_first(m: Mutant) -> list[tuple[str, tuple[str, ...]]]:
    """The default checkers, the one ``m.caught_by`` names first (the first that fails on a
    mutant has caught it: the others need not run)."""
    named = ("powerloss --fs-model" if "--fs-model" in m.caught_by else
             "torture" if "torture" in m.caught_by else "powerloss")
    return sorted(DEFAULT_CHECKERS, key=lambda checker: not checker[0].startswith(named))


def check(m: Mutant, timeout: float, say: Callable[[str], None] = lambda line: None) -> list[Run]:
    """The default checkers against ``m`` until one fails on it; when none does (or none can
    carry it: a core mutant needs the traced core), the run it names in ``caught_by``."""
    runs: list[Run] = []
    for name, argv in _likeliest_first(m):
        if m.core_bits and name != "powerloss":
            runs.append(Run(name, "", "n/a", detail="the traced core's bug: powerloss only"))
            continue
        say(f"{m.name}: pmemwal {' '.join(argv)}")
        runs.append(run_checker(name, list(argv), m.name, timeout))
        if runs[-1].verdict == "caught":
            return runs
    command = _command_of(m.caught_by)
    if command is not None and tuple(command[1]) not in {argv for _, argv in DEFAULT_CHECKERS}:
        say(f"{m.name}: {m.caught_by}")
        runs.append(run_checker(m.caught_by, command[1], m.name, timeout, command[0]))
    return runs


def caught_by_default(runs: list[Run]) -> str | None:
    return next((r.checker for r in runs[:len(DEFAULT_CHECKERS)] if r.verdict == "caught"), None)


def verdict(runs: list[Run]) -> str:
    """What the runs say of a mutant, in a word or a line."""
    default = caught_by_default(runs)
    if default:
        return default
    extra = runs[len(DEFAULT_CHECKERS):]
    if extra and extra[0].verdict == "caught":
        return f"ONLY a non-default run: {extra[0].checker}"
    errors = [r for r in runs if r.verdict == "error"]
    return "MISSED" + (f" ({errors[0].checker}: {errors[0].detail})" if errors else "")


def main(argv: list[str] | None = None) -> int:
    """Every mutant (or --only NAME...) against the shipped checkers at their default sizes:
    a table, mutant by mutant; status 1 when a mutant is missed by every run."""
    import argparse
    import json
    import sys
    import time
    parser = argparse.ArgumentParser(
        prog="python -m pmemwal.tools.mutant_runner",
        description="Run the shipped crash checkers at their default sizes against each "
                    "registered mutant (a known persistence bug put back): which catches it.")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(MUTANTS),
                        help="these mutants only")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds each checker run may take (default 900)")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    chosen = [MUTANTS[n] for n in (args.only or MUTANTS)]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.description} [{m.blind_spot or 'caught before'}; "
                  f"{m.caught_by}]")
        return 0
    results = []
    for i, m in enumerate(chosen, 1):
        t0 = time.perf_counter()
        runs = check(m, args.timeout, lambda line: print(
            f"[{i}/{len(chosen)}] {line}", file=sys.stderr, flush=True))
        seconds = time.perf_counter() - t0
        results.append((m, runs, seconds))
        print(f"[{i}/{len(chosen)}] {m.name}: {verdict(runs)} ({seconds:.0f} s)", file=sys.stderr,
              flush=True)
    missed = [m.name for m, runs, _ in results if verdict(runs).startswith("MISSED")]
    if args.json:
        print(json.dumps([{"mutant": m.name, "description": m.description,
                           "blind_spot": m.blind_spot, "caught_by": m.caught_by,
                           "caught_by_default": caught_by_default(runs), "verdict": verdict(runs),
                           "seconds": round(seconds, 1),
                           "runs": [r.__dict__ for r in runs]} for m, runs, seconds in results],
                         indent=2))
    else:
        print("| mutant | blind spot | caught by | seconds |\n|---|---|---|---|")
        for m, runs, seconds in results:
            print(f"| {m.name} | {m.blind_spot or '-'} | {verdict(runs)} | {seconds:.0f} |")
        default = sum(1 for _, runs, _ in results if caught_by_default(runs))
        print(f"\n{default} of {len(results)} caught by the default runs; "
              f"{len(missed)} missed by every run")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
