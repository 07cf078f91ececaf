/*
 * wal_flush.c -- flush and commit: making records durable, and the flushed position.
 *
 * In pmem mode the inserters persisted their own records, so a flush to X waits for
 * the insertions below X and moves flushed_u, with no lock (wal_commit: in one step when
 * the record before it was committed already).  Otherwise one flusher of this process at
 * a time, under write_lock, persists everything complete below the frontier (group
 * commit): msync of the mapped range (direct), or pwrite from the ring and fdatasync or
 * fsync (or O_DSYNC files) (buffered).  A failed write or sync stops the writer (fail).
 *
 * State it touches: flushed_u (compare-and-swap: other processes move it too), written_u
 * and the fault hook under write_lock, this process's counters (me).  It reads the slots,
 * cur_u, oldest_segno and the segment table, and writes nothing another unit owns.
 * Calls out of this unit: reap (wal_shared.c) when a wait lasts.  backoff, which every
 * unit's waits call, is defined here (see wal_core_internal.h).
 */
#define _GNU_SOURCE
#include "wal_core_internal.h"
#include "trace.h"

#include <sys/mman.h>
#include <unistd.h>

/* backoff -- spin briefly, then yield, then sleep: threads may outnumber cores.
 * The first call of a wait tells the environment (env may be NULL). */
void backoff(const wal_env *env, unsigned *spins)
{
    if (*spins == 0)
        will_wait(env);
    ++*spins;
    if (*spins < 64)
        cpu_relax();
    else if (*spins < 2000)
        sched_yield();
    else
        nanosleep(&(struct timespec){0, 50000}, NULL);
}

/* owner_pid -- the process whose work a wait waits for: a shared WAL's process entry names
 * it; a token of this process's own, or none known, names this process. */
static int32_t owner_pid(wal_core *c, uint32_t owner)
{
    if (c->shared && owner >= 1 && owner <= WAL_MAX_PROCS && owner != c->token)
        return c->sh->procs[owner - 1].pid;
    return owner == WAL_SLOT_ABANDONED ? 0 : (int32_t)getpid();
}

int wait_check(wal_core *c, const wal_env *env, uint32_t owner, uint64_t mark)
{
    owner &= ~WAL_LOCK_WAITERS;
    if (c->shared)
        reap(c, env, owner);
    if (atomic_load(&c->closed))
        return -WAL_ECLOSED;
    if (!env)
        return 0;
    if (env->interrupted && env->interrupted(env->ctx))
        return -EINTR;
    wal_patience *p = env->patience;
    if (!p || !env->wait_ns)
        return 0;
    uint64_t now = now_ns();
    if (!p->since || owner != p->owner || mark != p->mark) {
        *p = (wal_patience){now, mark, owner}; /* a new wait, or progress: the timer restarts */
    } else if (now - p->since >= env->wait_ns) {
        if (env->stalled_pid)
            *env->stalled_pid = owner_pid(c, owner);
        return -ETIMEDOUT;
    }
    return 0;
}

/* injected -- the test hook (wal_inject_fault): the negative errno this call of op
 * fails with, or 0.  Callers hold write_lock. */
static inline int injected(wal_core *c, enum wal_op op)
{
    wal_fault *f = &c->fault;
    if (__builtin_expect(f->count == 0, 1) || f->op != (int)op)
        return 0;
    if (f->after) {
        f->after--;
        return 0;
    }
    f->count--;
    return -f->err;
}

/* wait_slot -- one back-off of a wait for slot i's insertion, whose position reads v;
 * abortable: a wait the caller may give up (wait_check), else one inside an insertion,
 * which only reaps.  A slot still reserving waits for the reservation lock's holder, whose
 * progress is the insert position's. */
static inline int wait_slot(wal_core *c, const wal_env *env, wal_wait *w, uint32_t i,
                            uint64_t v, int abortable)
{
    backoff(env, &w->spins);
    if (!check_due(w->spins))
        return 0;
    uint32_t owner = atomic_load(&c->sh->slots[i].owner);
    if (!abortable) {
        reap(c, env, owner);
        return 0;
    }
    uint32_t holder = v == WAL_POS_RESERVING ? lock_holder(c) : 0;
    return wait_check(c, env, holder ? holder : owner, holder ? load_cur(c) : v);
}

/* frontier -- lowest position still being inserted (by start or by progress), in *out. */
static int frontier(wal_core *c, const wal_env *env, int by_progress, int abortable,
                    uint64_t *out)
{
    uint64_t lowest = load_cur(c);
    for (uint32_t i = 0; i < c->nslots; i++) {
        _Atomic uint64_t *pos = by_progress ? &c->sh->slots[i].progress : &c->sh->slots[i].start;
        uint64_t v;
        wal_wait w = {0};
        while ((v = atomic_load(pos)) == WAL_POS_RESERVING) {
            int rc = wait_slot(c, env, &w, i, v, abortable);
            if (rc)
                return rc;
        }
        if (v < lowest)
            lowest = v;
    }
    *out = lowest;
    return 0;
}

/* wait_insertions -- until no insertion below limit is in progress (abortable: wait_slot). */
static int wait_insertions(wal_core *c, const wal_env *env, uint64_t limit, int by_progress,
                           int abortable)
{
    uint64_t t0 = 0;
    for (uint32_t i = 0; i < c->nslots; i++) {
        _Atomic uint64_t *pos = by_progress ? &c->sh->slots[i].progress : &c->sh->slots[i].start;
        wal_wait w = {0};
        for (;;) {
            uint64_t v = atomic_load(pos);
            if (v == WAL_POS_FREE || (v != WAL_POS_RESERVING && v >= limit))
                break;
            if (atomic_load(&c->error))
                return -WAL_ESTOPPED;
            if (!t0)
                t0 = now_ns();
            int rc = wait_slot(c, env, &w, i, v, abortable);
            if (rc)
                return rc;
        }
    }
    if (t0) /* the background writer's waits delay no caller: counted apart */
        atomic_fetch_add(env && env->background ? &c->me->background_wait_ns : &c->me->insert_wait_ns,
                         now_ns() - t0);
    return 0;
}

/* ---- writing out and persisting (write_lock held) ---------------------- */

static int pwrite_all(wal_core *c, int fd, const uint8_t *buf, size_t len, uint64_t off)
{
    int rc = injected(c, WAL_OP_WRITE);
    if (rc)
        return rc;
    const uint64_t from = off;
    while (len) {
        ssize_t n = pwrite(fd, buf, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        buf += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    if (c->persist == WAL_PERSIST_DSYNC) /* O_DSYNC: durable as the write returns */
        trace_sync(TRACE_DSYNC_WRITE, fd, from, off - from);
    return 0;
}

/* write_range -- buffered: pwrite usable range [from, to) from the ring to its segments. */
static int write_range(wal_core *c, const wal_env *env, uint64_t from, uint64_t to)
{
    const wal_geom *g = &c->geom;
    uint64_t a = phys_from(g, from), b = wal_lsn_end(g, to);
    uint64_t ring_bytes = c->ring_pages * WAL_PAGE_SIZE;
    while (a < b) {
        uint64_t seg_end = (a / g->seg_size + 1) * g->seg_size;
        uint64_t ring_end = (a / ring_bytes + 1) * ring_bytes;
        uint64_t end = b < seg_end ? b : seg_end;
        if (ring_end < end)
            end = ring_end;
        wal_seg_entry *e;
        int rc = seg_get(c, env, a / g->seg_size, &e);
        if (!rc)
            rc = pwrite_all(c, e->fd, c->ring + a % ring_bytes, end - a, a % g->seg_size);
        if (rc)
            return fail(c, rc, "pwrite failed");
        atomic_fetch_add_explicit(&c->me->writes, 1, memory_order_relaxed);
        a = end < seg_end ? end : seg_end + WAL_PAGE_SIZE; /* skip the next segment header */
    }
    return 0;
}

static int sync_fd(wal_core *c, int fd)
{
    int rc = injected(c, WAL_OP_SYNC);
    if (rc)
        return rc;
    if (trace_mutated(TRACE_SKIP_SYNC))
        return 0;
    if (c->persist == WAL_PERSIST_FSYNC ? fsync(fd) : fdatasync(fd))
        return -errno;
    trace_sync(TRACE_FDATASYNC, fd, 0, 0);
    return 0;
}

/* sync_segments -- buffered: make what was written to segments [s0, s1] durable. */
static int sync_segments(wal_core *c, const wal_env *env, uint64_t s0, uint64_t s1)
{
    if (c->persist == WAL_PERSIST_DSYNC)
        return 0;
    for (uint64_t s = s0; s <= s1; s++) {
        wal_seg_entry *e;
        int rc = seg_get(c, env, s, &e);
        if (rc)
            return fail(c, rc, "attaching a segment failed");
        if ((rc = sync_fd(c, e->fd))) {
            /* after a failed sync the page cache can't be trusted */
            int fsync_ = c->persist == WAL_PERSIST_FSYNC;
            return fail(c, rc, fsync_ ? "fsync failed" : "fdatasync failed");
        }
    }
    return 0;
}

static int msync_range(wal_core *c, uint8_t *p, size_t len)
{
    int rc = injected(c, WAL_OP_MSYNC);
    if (rc)
        return rc;
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(4096 - 1), hi = (uintptr_t)p + len;
    if (trace_mutated(TRACE_SKIP_SYNC))
        return 0;
    if (trace_mutated(TRACE_SHORT_MSYNC)) /* the range's last page left out */
        hi = hi - lo > 4096 ? (hi - 1) & ~(uintptr_t)(4096 - 1) : lo;
    if (hi > lo && msync((void *)lo, hi - lo, MS_SYNC))
        return -errno;
    trace_sync(TRACE_MSYNC, -1, lo, hi - lo);
    return 0;
}

/* persist_range -- direct, msync: make usable range [from, to) durable where it lies. */
/* truncated_by_peer -- a shared WAL: whether another process truncated segment segno.
 * Truncation removes only what a flush made durable, and this process may read the
 * flushed position before that other process moved it: what lies there needs no msync
 * (and the segment may be gone, or unmapped under the call by _drop_truncated). */
static inline int truncated_by_peer(wal_core *c, uint64_t segno)
{
    return c->shared && segno < atomic_load(&c->sh->oldest_segno);
}

static int persist_range(wal_core *c, const wal_env *env, uint64_t from, uint64_t to)
{
    const wal_geom *g = &c->geom;
    uint64_t a = phys_from(g, from), b = wal_lsn_end(g, to);
    while (a < b) {
        uint64_t segno = a / g->seg_size, seg_end = (segno + 1) * g->seg_size;
        uint64_t end = b < seg_end ? b : seg_end;
        if (!truncated_by_peer(c, segno)) {
            wal_seg_entry *e;
            int rc = seg_get(c, env, segno, &e);
            if (rc && !truncated_by_peer(c, segno)) /* (it may be, since the check) */
                return fail(c, rc, "attaching a segment failed");
            if (!rc && (rc = msync_range(c, e->base + a % g->seg_size, end - a)) &&
                !truncated_by_peer(c, segno))
                return fail(c, rc, "msync failed");
            atomic_fetch_add_explicit(&c->me->writes, 1, memory_order_relaxed);
        }
        a = end;
    }
    return 0;
}

/* write_upto -- buffered: hand everything below usable position u to the OS. */
int write_upto(wal_core *c, const wal_env *env, uint64_t u)
{
    int rc = wait_insertions(c, env, u, 1, 0); /* inside an insertion: not given up */
    if (rc)
        return rc;
    will_wait(env); /* for the lock, then pwrite */
    pthread_mutex_lock(&c->write_lock);
    uint64_t written = atomic_load(&c->sh->written_u);
    uint64_t to;
    if (written < u && !(rc = stopped(c)) && !(rc = frontier(c, env, 1, 0, &to))) {
        rc = write_range(c, env, written, to);
        if (!rc)
            atomic_store(&c->sh->written_u, to);
    }
    pthread_mutex_unlock(&c->write_lock);
    return rc;
}

/* ---- flush ---------------------------------------------------------------- */

static int flush_below(wal_core *c, const wal_env *env, uint64_t limit, uint64_t end,
                       uint64_t *flushed_lsn);

int wal_flush(wal_core *c, const wal_env *env, uint64_t upto_lsn, uint64_t *flushed_lsn)
{
    int rc = enter_call(c);
    if (rc)
        return rc;
    uint64_t limit = load_cur(c);
    if (upto_lsn == WAL_FLUSH_READY) {
        rc = frontier(c, env, 0, 1, &limit); /* below it, no insertion is in progress */
    } else if (upto_lsn != UINT64_MAX) {
        int64_t u = wal_usable(&c->geom, upto_lsn);
        if (u < 0 || (uint64_t)u > limit)
            rc = -EINVAL; /* not a position in the WAL appended so far */
        else if ((uint64_t)u < limit)
            limit = (uint64_t)u + 1;
    }
    if (!rc)
        rc = flush_below(c, env, limit, 0, flushed_lsn);
    leave_call(c);
    return rc;
}

/* publish -- tell readers in other processes (the FOLLOW file) that lsn is durable. */
static inline void publish(wal_core *c, uint64_t lsn)
{
    if (c->progress)
        wal_publish(c->progress, lsn);
}

/* COMMIT_SPINS -- how long a commit waits for the record before it to be committed
 * (flushed_u to reach it) before it looks at the slots instead: a few hundred ns, what
 * a small insertion in another process takes to finish. */
#define COMMIT_SPINS 64

/* commit_in_turn -- move flushed_u from u to end, if it reaches u soon: true if done;
 * *seen: flushed_u as last read. */
static int commit_in_turn(wal_core *c, uint64_t u, uint64_t end, uint64_t *seen)
{
    for (unsigned spins = 0;; spins++) {
        *seen = u;
        if (atomic_compare_exchange_strong(&c->sh->flushed_u, seen, end))
            return 1;
        if (*seen > u || spins >= COMMIT_SPINS)
            return 0;
        while (spins < COMMIT_SPINS &&
               atomic_load_explicit(&c->sh->flushed_u, memory_order_relaxed) < u) {
            cpu_relax();
            spins++;
        }
    }
}

int wal_commit(wal_core *c, const wal_env *env, uint64_t lsn, uint64_t size, uint64_t *flushed_lsn)
{
    int64_t su = wal_usable(&c->geom, lsn);
    if (su < 0)
        return -EINVAL;
    uint64_t u = (uint64_t)su, end = u + size, seen = u;
    int rc = stopped(c);
    if (rc)
        return rc;
    /* pmem: the record persisted itself.  Where everything below it was durable already
     * (flushed_u == u: the common case of commits in turn), flushed_u moves past it in one
     * step, with no look at the slots or the insert position, lines other writers own. */
    if (c->persist == WAL_PERSIST_PMEM && commit_in_turn(c, u, end, &seen)) {
        atomic_fetch_add_explicit(&c->me->flush_requests, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->me->flushes, 1, memory_order_relaxed);
        *flushed_lsn = wal_lsn(&c->geom, end);
        publish(c, *flushed_lsn);
        return 0;
    }
    if (seen >= end) { /* a later flush covered it */
        *flushed_lsn = wal_lsn(&c->geom, seen);
        return 0;
    }
    if ((rc = enter_call(c)))
        return rc;
    rc = flush_below(c, env, u + 1, end, flushed_lsn);
    leave_call(c);
    return rc;
}

/* sync_end -- where a flush's sync ends: at to, the position it publishes as flushed.
 * (TRACE_SYNC_OWN_RECORD, a mutation of the traced build only: a commit's sync ends at
 * its own record's end, which a lone writer's frontier is; other writers' records
 * complete past it are published unsynced.) */
static inline uint64_t sync_end(uint64_t end, uint64_t to)
{
    return end && trace_mutated(TRACE_SYNC_OWN_RECORD) ? end : to;
}

/* publish_early -- (TRACE_PUBLISH_EARLY, a mutation of the traced build only) followers
 * told that the frontier is durable before the sync that makes it so: a power cut in that
 * sync takes records a follower may have read, though no caller was acknowledged. */
static inline void publish_early(wal_core *c, uint64_t to)
{
    if (trace_mutated(TRACE_PUBLISH_EARLY))
        publish(c, wal_lsn(&c->geom, to));
}

/* flush_below -- make durable everything below usable position limit, and as much more
 * as is complete; end (0: unknown) is the end of the record that contains limit - 1,
 * which a pmem flush then moves flushed_u to without looking further (no read of the
 * insert position, no second scan of the slots: lines other processes write). */
static int flush_below(wal_core *c, const wal_env *env, uint64_t limit, uint64_t end,
                       uint64_t *flushed_lsn)
{
    int rc = stopped(c);
    if (rc)
        return rc;
    uint64_t flushed = atomic_load_explicit(&c->sh->flushed_u, memory_order_acquire);
    if (flushed >= limit) { /* covered: publish anyway (a writer killed between moving
                             * flushed_u and publishing it left readers behind) */
        publish(c, wal_lsn(&c->geom, flushed));
    } else if (c->persist == WAL_PERSIST_PMEM) {
        /* Inserters persisted their own records before leaving their slots: a
         * flush only waits for them, then moves flushed_u forward, no lock. */
        uint64_t to = end;
        if ((rc = wait_insertions(c, env, limit, 0, 1)) ||
            (!to && (rc = frontier(c, env, 0, 1, &to))))
            return rc;
        atomic_fetch_add_explicit(&c->me->flush_requests, 1, memory_order_relaxed);
        while (flushed < to &&
               !atomic_compare_exchange_weak(&c->sh->flushed_u, &flushed, to))
            ;
        atomic_fetch_add_explicit(flushed < to ? &c->me->flushes : &c->me->coalesced, 1,
                                  memory_order_relaxed);
        flushed = flushed < to ? to : flushed;
        publish(c, wal_lsn(&c->geom, flushed));
    } else {
        if ((rc = wait_insertions(c, env, limit, 0, 1)))
            return rc;
        will_wait(env); /* for the lock, then the system calls */
        pthread_mutex_lock(&c->write_lock);
        c->me->flush_requests++;
        flushed = atomic_load(&c->sh->flushed_u);
        if ((rc = stopped(c))) {
        } else if (flushed >= limit) {
            c->me->coalesced++;
        } else {
            uint64_t to; /* everyone complete below: flush them too */
            if (!(rc = frontier(c, env, 0, 1, &to)))
                publish_early(c, to);
            if (rc) {
            } else if (c->direct) {
                rc = persist_range(c, env, flushed, sync_end(end, to));
            } else {
                uint64_t written = atomic_load(&c->sh->written_u);
                if (written < to && !(rc = write_range(c, env, written, to)))
                    atomic_store(&c->sh->written_u, to);
                if (!rc)
                    rc = sync_segments(c, env, phys_from(&c->geom, flushed) / c->geom.seg_size,
                                       (wal_lsn_end(&c->geom, sync_end(end, to)) - 1) / c->geom.seg_size);
            }
            if (!rc) {
                uint64_t was = atomic_load(&c->sh->flushed_u); /* other processes move it too */
                while (was < to && !atomic_compare_exchange_weak(&c->sh->flushed_u, &was, to))
                    ;
                c->me->flushes++;
                flushed = to;
            }
        }
        pthread_mutex_unlock(&c->write_lock);
        if (!rc)
            publish(c, wal_lsn(&c->geom, flushed));
    }
    *flushed_lsn = wal_lsn(&c->geom, flushed);
    return rc;
}

uint64_t wal_flushed_lsn(wal_core *c)
{
    return wal_lsn(&c->geom, atomic_load(&c->sh->flushed_u));
}
