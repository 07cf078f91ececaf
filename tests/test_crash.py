"""SIGKILL at a random moment: every acknowledged record survives, intact.

A child (tests/_child.py, op "writer") appends records of varying sizes
from several threads and prints a line for each only after flush() has
returned for it.  The parent reads those lines, kills the child with SIGKILL
after a random 0.3-0.8 s, reopens the WAL and checks that every acknowledged
record is there with exactly its bytes, that the chain is whole, and that
appending goes on after recovery.  A second round lets a new child recover
the crashed WAL itself and carry on, with group commits and a thread that
truncates (so segments are recycled and reused while it runs), before the
next kill.
"""

from __future__ import annotations

import random

import pytest

import pmemwal
from conftest import (CHILD, HIDDEN_LIBPMEM, assert_chain, expected_end,
                      first_lsn_of_segment, payload, read_all, run_and_kill)

# Writers killed at random moments, several threads appending: recovery may find valid records
# past a hole and set them aside, with a RecoveryWarning; a right outcome, which these tests
# judge by their own ledgers (the suite turns an unexpected RecoveryWarning into an error).
pytestmark = pytest.mark.filterwarnings("ignore::pmemwal.recovery.RecoveryWarning")

CASES = {
    "buffered": ("buffered", {}, "fdatasync"),
    "direct-pmem": ("direct", {"PMEM_IS_PMEM_FORCE": "1"}, "pmem"),
    "direct-nolibpmem": ("direct", {"PMEMWAL_LIBPMEM": HIDDEN_LIBPMEM}, "msync"),
}


def _crash_round(wal_dir, mode, env, seed, threads, flush_every, truncate, delay):
    spec = {"op": "writer", "dir": str(wal_dir), "mode": mode, "seed": seed,
            "threads": threads, "flush_every": flush_every, "truncate": truncate}
    lines, stderr = run_and_kill(CHILD, spec, env, delay)
    assert "Traceback" not in stderr, stderr
    head = lines[0].split()
    assert head[0] == b"READY", lines[0]
    acked, cut = [], 0
    for line in lines[1:]:
        if not line.endswith(b"\n"):     # cut off by the kill: not acknowledged
            continue
        if line.startswith(b"T "):
            cut = max(cut, int(line.split()[1]))
            continue
        tag, lsn, tid, i, n = line.split()
        assert tag == b"A"
        acked.append((int(lsn), f"{seed}/{int(tid)}/{int(i)}", int(n)))
    return head[1].decode(), int(head[2]), acked, cut


def _verify(wal_dir, mode, acked, cut):
    """Every acknowledged record at or after the segment of the truncation point ``cut``."""
    seg = 1 << 20
    keep_from = cut // seg * seg
    acked = [a for a in acked if a[0] >= keep_from]
    with pmemwal.open(wal_dir, mode=mode) as wal:
        assert wal.first_lsn <= first_lsn_of_segment(keep_from // seg)   # nothing more was cut
        recs = read_all(wal)
        by_lsn = {lsn: data for lsn, data, _ in recs}
        assert len(by_lsn) == len(recs)
        missing = [lsn for lsn, _, _ in acked if lsn not in by_lsn]
        assert not missing, f"{len(missing)} acknowledged records lost, first at {missing[0]}"
        for lsn, seed, n in acked:
            assert by_lsn[lsn] == payload(seed, n), f"record at {lsn} damaged"
        if not cut:
            assert recs[0][2] == 0
        assert_chain(recs)
        end = expected_end(recs)
        assert wal.insert_lsn == wal.flushed_lsn == end
        assert acked and max(lsn for lsn, _, _ in acked) < end
        after = wal.append(b"after recovery")
        assert after == end
    with pmemwal.open(wal_dir, mode=mode) as wal:
        recs2 = read_all(wal)
        assert recs2[:len(recs)] == recs
        assert recs2[len(recs)][:2] == (after, b"after recovery")
        assert recs2[len(recs)][2] == recs[-1][0]
    return after


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigkill(wal_dir, case):
    mode, env, method = CASES[case]
    rng = random.Random()
    acked_all, cut = [], 0
    for rnd, (threads, flush_every, truncate) in enumerate([(3, 1, False), (2, 4, True)]):
        delay = rng.uniform(0.5, 0.8) if truncate else rng.uniform(0.3, 0.8)
        seed = f"{case}/{rnd}/{rng.getrandbits(32)}"
        persist, start_lsn, acked, cut_now = _crash_round(wal_dir, mode, env, seed, threads,
                                                          flush_every, truncate, delay)
        cut = max(cut, cut_now)
        assert persist == method
        assert len(acked) >= 10, f"only {len(acked)} records acknowledged in {delay:.2f} s"
        if rnd:
            assert min(lsn for lsn, _, _ in acked) > last_after     # continued after recovery
        acked_all += acked
        last_after = _verify(wal_dir, mode, acked_all, cut)
        if truncate:
            assert cut > 0, "the truncating thread never ran"
