/*
 * wal_follow.c -- publishing the durable position, and waiting for it (wal_follow.h).
 *
 * The futex is not FUTEX_PRIVATE: writer and readers are different processes sharing the
 * FOLLOW file's mapping.
 */
#define _GNU_SOURCE
#include "wal_follow.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

uint64_t wal_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void wal_wake(wal_progress *p)
{
    atomic_fetch_add(&p->seq, 1);
    syscall(SYS_futex, &p->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void wal_publish(wal_progress *p, uint64_t lsn)
{
    uint64_t was = atomic_load_explicit(&p->durable_lsn, memory_order_relaxed);
    while (was < lsn && !atomic_compare_exchange_weak(&p->durable_lsn, &was, lsn))
        ;
    if (was < lsn && atomic_load(&p->sleepers)) /* (seq_cst: after the CAS) */
        wal_wake(p);
}

void wal_publish_reset(wal_progress *p, uint64_t lsn)
{
    atomic_store(&p->durable_lsn, lsn);
    wal_wake(p);
}

/* SPIN_PAUSES -- pauses between two looks at durable_lsn (about 1 us): each look after a
 * publish pulls its line from the writer's cache, and the writer's next publish must take
 * it back, which a look every few ns would make it do at every flush. */
#define SPIN_PAUSES 16

/* spin -- read durable_lsn until it passes after or spin_ns pass: 1 if it did. */
static int spin(wal_progress *p, uint64_t after, uint64_t start, uint64_t spin_ns,
                uint64_t *durable)
{
    for (uint64_t now = start; now - start < spin_ns; now = wal_now_ns()) {
        for (int i = 0; i < 4; i++) {
            if ((*durable = atomic_load_explicit(&p->durable_lsn, memory_order_acquire)) > after)
                return 1;
            for (int k = 0; k < SPIN_PAUSES; k++)
                relax();
        }
    }
    return 0;
}

/* sleep_once -- set bit in sleepers, and sleep on seq unless durable_lsn passed after meanwhile:
 * 0 (woken, or it moved), -ETIMEDOUT or -EINTR. */
static int sleep_once(wal_progress *p, uint64_t after, uint64_t until_ns, uint64_t nap_ns,
                      uint64_t bit, uint64_t *durable)
{
    atomic_fetch_or(&p->sleepers, bit);
    uint32_t seq = atomic_load(&p->seq);
    int rc = 0;
    if ((*durable = atomic_load(&p->durable_lsn)) <= after) {
        /* every publish past after wakes it: the only cap on the sleep is the caller's nap
         * (a lost wake-up would show as a follower that waits out its timeout) */
        uint64_t now = wal_now_ns(), left = until_ns > now ? until_ns - now : 0;
        int napping = nap_ns && nap_ns < left;
        if (napping)
            left = nap_ns;
        struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
        if (!left)
            rc = -ETIMEDOUT;
        else if (syscall(SYS_futex, &p->seq, FUTEX_WAIT, seq,
                         until_ns == UINT64_MAX && !napping ? NULL : &ts, NULL, 0))
            rc = errno == EINTR ? -EINTR
                 : errno != ETIMEDOUT ? 0 : napping ? -EINTR : -ETIMEDOUT;
    }
    atomic_fetch_and(&p->sleepers, ~bit);
    *durable = atomic_load(&p->durable_lsn);
    return rc;
}

int wal_await(wal_progress *p, uint64_t after, uint64_t until_ns, uint64_t nap_ns,
              uint32_t *spin_ns, uint64_t bit, uint64_t *durable)
{
    if ((*durable = atomic_load_explicit(&p->durable_lsn, memory_order_acquire)) > after)
        return 0;
    uint64_t start = wal_now_ns(), budget = *spin_ns;
    if (until_ns > start && until_ns - start < budget)
        budget = until_ns - start;
    if (spin(p, after, start, budget, durable)) {
        uint64_t took = wal_now_ns() - start;
        if (2 * took > *spin_ns) /* (it came late in the spin: room to spare) */
            *spin_ns = 2 * took < WAL_SPIN_MAX ? (uint32_t)(2 * took) : WAL_SPIN_MAX;
        return 0;
    }
    if (wal_now_ns() >= until_ns)
        return -ETIMEDOUT;
    int rc = sleep_once(p, after, until_ns, nap_ns, bit, durable);
    if (*durable > after) {
        uint64_t took = wal_now_ns() - start;
        *spin_ns = took < WAL_SPIN_MAX / 2 ? (uint32_t)(2 * took + 1000) : *spin_ns / 2;
        return 0;
    }
    return rc ? rc : -EAGAIN;
}
