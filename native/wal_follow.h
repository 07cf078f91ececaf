/*
 * wal_follow.h -- what a writer publishes for readers in other processes, and how a reader
 * waits for it: the progress lines of the FOLLOW file (pmemwal/follow_file.py documents the
 * whole file; these lines start at its byte 64).
 *
 * The writer moves durable_lsn forward (never back: several threads and processes publish)
 * after every flush that moved its flushed position, and wakes sleepers only when a reader
 * said it sleeps (sleepers): with no one following, a publish is a load and a
 * compare-and-swap on a line the writer keeps in its cache.  A reader spins on durable_lsn for
 * a while (its owner adapts how long), then sets its bit in sleepers and sleeps on the futex
 * word seq, which every wake bumps.  The two sides order their store and load as Dekker's
 * (seq_cst on both): either the writer sees the sleeper, or the sleeper sees the new position.
 * A bit per reader, not a count: a reader killed asleep leaves only its own bit, which the
 * next reader of its slot, or a writer that finds the slot's lock free, clears.
 */
#ifndef PMEMWAL_FOLLOW_H
#define PMEMWAL_FOLLOW_H

#include <stdatomic.h>
#include <stdint.h>

#define WAL_PROGRESS_OFFSET 64 /* the lines' offset in the FOLLOW file */

typedef struct wal_progress {
    /* what the writers publish */
    _Alignas(64) _Atomic uint64_t durable_lsn; /* every record below is durable; a record boundary */
    _Atomic uint64_t oldest_segno; /* segments below are truncated: raised before their files go */
    _Atomic uint64_t generation;   /* bumped by each writer that opens the WAL alone (recovery) */
    uint8_t boot_id[16];           /* the machine's boot when the last writer opened it */
    /* how readers sleep */
    _Alignas(64) _Atomic uint32_t seq; /* futex word: every wake bumps it */
    uint32_t unused;
    _Atomic uint64_t sleepers;         /* bit i: the reader of sleeper slot i sleeps, or is about to */
} wal_progress;

/* wal_publish -- durable_lsn raised to lsn (never lowered), sleepers woken if any. */
void wal_publish(wal_progress *p, uint64_t lsn);

/* wal_publish_reset -- durable_lsn set to lsn (an open's recovered end, which may lie below a
 * value an earlier writer left), sleepers woken. */
void wal_publish_reset(wal_progress *p, uint64_t lsn);

/* wal_wake -- wake every sleeper (oldest_segno raised, a writer gone). */
void wal_wake(wal_progress *p);

/* wal_await -- wait until durable_lsn > after or until_ns (CLOCK_MONOTONIC; UINT64_MAX: never)
 * passes: spin for *spin_ns first, then sleep on the futex with bit set in sleepers.  *durable:
 * the value last read.  nap_ns (0: none): the longest sleep, after which it returns -EINTR as
 * for a signal -- the thread that runs signal handlers naps, since a signal that came between
 * its last look and the futex wait would not interrupt the wait.  Returns 0 (it moved),
 * -ETIMEDOUT, -EINTR (a signal, or a nap's end: the caller runs its handlers and calls again) or -EAGAIN (woken, and it did not move: a truncation, or the
 * reader's close; the caller looks and calls again).  *spin_ns adapts: raised when a longer
 * spin would have caught the record, halved when records come further apart than spinning is
 * worth (WAL_SPIN_MAX). */
#define WAL_SPIN_MAX 50000u
int wal_await(wal_progress *p, uint64_t after, uint64_t until_ns, uint64_t nap_ns,
              uint32_t *spin_ns, uint64_t bit, uint64_t *durable);

uint64_t wal_now_ns(void);

#endif
