/*
 * wal_core_internal.h -- what the writer's units share and nothing outside them sees
 * (module.c includes wal_core.h only).  Each unit defines _GNU_SOURCE, then includes this.
 *
 * The writer is one wal_core (wal_core.h) split by concern:
 *   wal_core.c    the core's lifecycle: init, the position after recovery, the persist
 *                 method, the segment table (attach, detach), the sticky error (wal_stop)
 *                 and the test hooks' setter, forsake, close, stats
 *   wal_insert.c  insertion: slots, the reservation (stage one), header, CRC and copy
 *                 (stage two), the insertion's own persistence in pmem mode, void records,
 *                 the background writer's wake-up; serial mode
 *   wal_flush.c   flush and commit: waiting for insertions, writing out and syncing
 *                 (pwrite, fdatasync/fsync, msync), group commit, the flushed position
 *   wal_shared.c  shared WALs: joining the control file, liveness, reaping dead processes,
 *                 the agreed persist method, leaving
 *
 * Inlining.  The per-record path (wal_insert: a slot, reserve, place, release; wal_commit)
 * is hot, and gcc inlines nothing across units.  So the small helpers several units call
 * are defined here, in every unit that includes this: those that were `static inline`
 * when the writer was one file still are, and those that were plain `static` are
 * WAL_LOCAL, static and not inline, so that gcc decides for each call whether to inline
 * them as it did then (`inline` would raise its limits for them, and change that).  The
 * calls from one unit into another are all off the hot path -- a wait, a ring page not
 * written out yet, a failed insertion, a dead process, close, init -- and their targets,
 * declared below, have hidden visibility: direct calls, no PLT.  (After the split,
 * `objdump -d` of wal_insert, wal_commit, wal_flush, flush_below, wait_insertions and
 * frontier showed the same instructions as before it; place only calls write_upto where it
 * had it inlined, in its branch for a ring page still to be written out.)
 */
#ifndef PMEMWAL_CORE_INTERNAL_H
#define PMEMWAL_CORE_INTERNAL_H

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "wal_core.h"

#define WAL_LOCAL static __attribute__((unused))

#pragma GCC visibility push(hidden)

/* wal_flush.c: spin briefly, then yield, then sleep (every wait).  Defined there, not
 * here, since it must not be inlined into wal_insert's wait for a slot (that would change
 * the register allocation of the whole append path), and wal_flush.c inlines it where the
 * one file did (frontier, not wait_insertions). */
void backoff(const wal_env *env, unsigned *spins);

/* wal_wait -- one wait the caller may give up: its back-offs so far (its pace).  How long
 * it has waited without progress is the call's (wal_env.patience): it outlives the
 * caller's retries. */
typedef struct wal_wait {
    unsigned spins;
} wal_wait;

/* wal_flush.c: a wait's check, every few ms (check_due) of a wait for the work of `owner`
 * (a token, or a lock word; 0: not known), whose progress shows as `mark` changing (a
 * slot's position, the insert position): clean up after owner if it died (reap) and tell
 * whether to give up: 0 to wait on; -WAL_ECLOSED once this core is closed (so close never
 * waits for another process), -EINTR when env->interrupted says so (the caller lets go of
 * what it holds, and its caller runs the signal handlers), -ETIMEDOUT once owner made no
 * progress for env->wait_ns (owner's pid in *env->stalled_pid).  No lock of this
 * process may be held but write_lock: it takes no other, and never the GIL. */
int wait_check(wal_core *c, const wal_env *env, uint32_t owner, uint64_t mark);

/* wal_core.c: the shared state of a WAL with nothing appended yet (wal_share's too). */
void shared_init(wal_shared *sh, uint32_t nslots);

/* wal_insert.c: close the range a slot's insertion reserved and did not finish (void
 * records); a failed insertion's in a shared WAL, and a dead process's (close_slots). */
int void_slot(wal_core *c, const wal_env *env, struct wal_slot *slot);

/* wal_flush.c: buffered, hand everything below usable position u to the OS (an insertion
 * whose ring page still holds bytes not written out). */
int write_upto(wal_core *c, const wal_env *env, uint64_t u);

/* wal_shared.c: if the process with this token is dead, clean up after it (every wait). */
int reap(wal_core *c, const wal_env *env, uint32_t token);
/* wal_shared.c: a shared WAL's close (wal_close). */
void leave_shared(wal_core *c);

#pragma GCC visibility pop

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* will_wait -- tell the caller's environment that the core is about to wait. */
static inline void will_wait(const wal_env *env)
{
    if (env && env->will_wait)
        env->will_wait(env->ctx);
}

/* REAP_AFTER, REAP_EVERY -- a waiter that has backed off REAP_AFTER times
 * (a few ms: backoff then sleeps 50 us a time) checks whether the process it waits for is
 * dead (one system call), and again every REAP_EVERY back-offs (about 3 ms) after that. */
#define REAP_AFTER 2048u
#define REAP_EVERY 64u

static inline int check_due(unsigned spins)
{
    return spins >= REAP_AFTER && (spins - REAP_AFTER) % REAP_EVERY == 0;
}

/* enter_call / leave_call -- around a call that reads the state outside a slot of its own
 * (a flush, a reap, the position): a shared WAL's close switches the core to its private
 * copy of the state only once none is inside (leave_shared).  seq_cst, both sides: either
 * the call sees closed, or close sees the call.  One process's WAL counts nothing: its
 * close switches nothing, and excludes the work in progress by holding every slot and
 * write_lock (wal_close).  shared does not change under a counted call: leave_shared
 * clears it only once the count is 0, and only a call that began shared counted. */
static inline int enter_call(wal_core *c)
{
    if (!c->shared)
        return atomic_load_explicit(&c->closed, memory_order_acquire) ? -WAL_ECLOSED : 0;
    atomic_fetch_add(&c->calls, 1);
    if (!atomic_load(&c->closed))
        return 0;
    atomic_fetch_sub(&c->calls, 1);
    return -WAL_ECLOSED;
}

static inline void leave_call(wal_core *c)
{
    if (c->shared)
        atomic_fetch_sub_explicit(&c->calls, 1, memory_order_release);
}

/* futex_wait / futex_wake -- sleep while *word == val (at most timeout_ns: then
 * -ETIMEDOUT; woken or the word changed: 0 or -EAGAIN; a signal: -EINTR), wake one
 * sleeper; shared: the word is in the control file's mapping, which other processes map. */
static inline int futex_wait(_Atomic uint32_t *word, uint32_t val, long timeout_ns, int shared)
{
    struct timespec ts = {0, timeout_ns};
    if (syscall(SYS_futex, word, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0))
        return -errno;
    return 0;
}

static inline void futex_wake(_Atomic uint32_t *word, int shared)
{
    syscall(SYS_futex, word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* release_reservation -- free the reservation lock, waking a sleeper if one said so.  A
 * plain store where the word has no WAITERS bit (no locked instruction on the append path):
 * a waiter that sets the bit between that load and the store sleeps out one nap
 * (LOCK_NAP_NS, wal_insert.c) at most, and then looks again (a window of a few ns, met
 * only by a waiter that had spun out already while the holder ran). */
static inline void release_reservation(wal_core *c)
{
    _Atomic uint32_t *lock = &c->sh->insert_lock;
    if (__builtin_expect(!(atomic_load_explicit(lock, memory_order_relaxed) & WAL_LOCK_WAITERS), 1)) {
        atomic_store_explicit(lock, 0, memory_order_release);
        return;
    }
    atomic_exchange_explicit(lock, 0, memory_order_release);
    futex_wake(lock, c->shared);
}

/* lock_holder -- the token holding the reservation lock, or 0. */
static inline uint32_t lock_holder(const wal_core *c)
{
    return atomic_load_explicit(&c->sh->insert_lock, memory_order_relaxed) & ~WAL_LOCK_WAITERS;
}

static inline uint64_t load_cur(const wal_core *c)
{
    return atomic_load_explicit(&c->sh->cur_u, memory_order_acquire);
}

WAL_LOCAL uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* stopped -- why no new work may start: closed, or an earlier error stopped the writer. */
static inline int stopped(wal_core *c)
{
    if (atomic_load_explicit(&c->closed, memory_order_acquire))
        return -WAL_ECLOSED;
    return atomic_load_explicit(&c->error, memory_order_acquire) ? -WAL_ESTOPPED : 0;
}

/* fail -- record the first error that stops the writer, and what failed; later
 * calls are refused with WAL_ESTOPPED.  Returns err, for the failing call. */
WAL_LOCAL int fail(wal_core *c, int err, const char *what)
{
    if (!atomic_exchange(&c->failing, 1)) {
        snprintf(c->error_what, sizeof(c->error_what), "%s", what);
        atomic_store_explicit(&c->error, err, memory_order_release);
    }
    return err;
}

static inline wal_seg_entry *seg_lookup(wal_core *c, uint64_t segno)
{
    wal_seg_entry *e = &c->segs[segno % WAL_SEG_TABLE];
    return atomic_load_explicit(&e->tag, memory_order_acquire) == segno + 1 ? e : NULL;
}

/* seg_get -- the attached segment, asking the environment for it when missing. */
WAL_LOCAL int seg_get(wal_core *c, const wal_env *env, uint64_t segno, wal_seg_entry **out)
{
    wal_seg_entry *e = seg_lookup(c, segno);
    if (!e) {
        int rc = env->need_segment(env->ctx, segno);
        if (rc)
            return rc;
        if (!(e = seg_lookup(c, segno)))
            return -ENOENT;
    }
    *out = e;
    return 0;
}

WAL_LOCAL void release_slot(wal_slot *s)
{
    atomic_store_explicit(&s->start, WAL_POS_FREE, memory_order_release);
    atomic_store_explicit(&s->progress, WAL_POS_FREE, memory_order_release);
    atomic_store_explicit(&s->owner, 0, memory_order_release);
}

/* phys_from -- first LSN of usable range starting at u: a page's header belongs to it. */
static inline uint64_t phys_from(const wal_geom *g, uint64_t u)
{
    uint64_t lsn = wal_lsn(g, u);
    return u % WAL_PAGE_USABLE ? lsn : lsn - WAL_PAGE_HDR;
}

#endif
