/*
 * wal_core.c -- the writer's hot path.
 *
 * Insertion has two stages (seed 004).  Stage one reserves the record's
 * space: a spinlock around "start = cur; cur += size; prev = last; last =
 * start", nothing else.  Stage two builds the header, computes the CRC and
 * copies the record into place (a mapped segment in direct mode, a WAL
 * buffer page in buffered mode) in parallel with other inserters.  An
 * inserter advertises its record in an insertion slot before it reserves, so
 * a flush to X waits only for the insertions that started below X.
 *
 * Buffer mapping takes no lock (seed 000): buffer page p lives in ring slot
 * p % ring_pages, and may be reused once page p - ring_pages has been written
 * out, which is one comparison against written_u.  Nobody sleeps while
 * holding a lock that a crash could leave half-done: the only waits are for
 * other insertions to finish copying.
 */
#define _GNU_SOURCE
#include "wal_core.h"
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"

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

/* backoff -- spin briefly, then yield, then sleep: threads may outnumber cores.
 * The first call of a wait tells the environment (env may be NULL). */
static void backoff(const wal_env *env, unsigned *spins)
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

static int reap(wal_core *c, const wal_env *env, uint32_t token);
static int void_slot(wal_core *c, const wal_env *env, struct wal_slot *slot);

/* REAP_AFTER, REAP_EVERY -- a shared WAL's waiter that has backed off REAP_AFTER times
 * (a few ms: backoff then sleeps 50 us a time) checks whether the process it waits for is
 * dead (one system call), and again every REAP_EVERY back-offs (about 3 ms) after that. */
#define REAP_AFTER 2048u
#define REAP_EVERY 64u

static inline int reap_due(const wal_core *c, unsigned spins)
{
    return c->shared && spins >= REAP_AFTER && (spins - REAP_AFTER) % REAP_EVERY == 0;
}

/* insert_lock / insert_unlock -- the reservation spinlock, holding the holder's token; a
 * waiter yields after a short spin, since the holder may have been preempted (threads >
 * cores), and in a shared WAL checks in time whether the holder died holding it. */
static inline void insert_lock(wal_core *c, const wal_env *env)
{
    unsigned spins = 0;
    uint32_t free_ = 0;
    while (!atomic_compare_exchange_weak_explicit(&c->sh->insert_lock, &free_, c->token,
                                                  memory_order_acquire, memory_order_relaxed)) {
        if (++spins < 128)
            cpu_relax();
        else
            sched_yield();
        if (reap_due(c, spins) && free_ && free_ != c->token)
            reap(c, env, free_);
        free_ = 0;
    }
}

static inline void insert_unlock(wal_core *c)
{
    atomic_store_explicit(&c->sh->insert_lock, 0, memory_order_release);
}

static inline uint64_t load_cur(const wal_core *c)
{
    return atomic_load_explicit(&c->sh->cur_u, memory_order_acquire);
}

static uint64_t now_ns(void)
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
static int fail(wal_core *c, int err, const char *what)
{
    if (!atomic_exchange(&c->failing, 1)) {
        snprintf(c->error_what, sizeof(c->error_what), "%s", what);
        atomic_store_explicit(&c->error, err, memory_order_release);
    }
    return err;
}

int wal_stop(wal_core *c, int err, const char *what)
{
    fail(c, err, what);
    return atomic_load(&c->error);
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

/* hook_due -- whether the stall or die test hook fires here (wal_inject_fault). */
static int hook_due(wal_core *c, enum wal_op op)
{
    if (__builtin_expect(c->fault.count == 0, 1) || c->fault.op != (int)op)
        return 0; /* read without the lock: a test hook, set before the insertions it stops */
    pthread_mutex_lock(&c->write_lock);
    wal_fault *f = &c->fault;
    int due = f->count && f->op == (int)op && !f->after;
    if (f->count && f->op == (int)op)
        *(due ? &f->count : &f->after) -= 1;
    pthread_mutex_unlock(&c->write_lock);
    return due;
}

/* stall_here -- the stall test hooks: never return if one is due here. */
static void stall_here(wal_core *c, const wal_env *env, enum wal_op op)
{
    if (!hook_due(c, op))
        return;
    will_wait(env);
    for (;;)
        pause();
}

void wal_inject_fault(wal_core *c, enum wal_op op, int err, uint64_t after, uint64_t count)
{
    pthread_mutex_lock(&c->write_lock);
    c->fault = (wal_fault){(int)op, err, after, count};
    pthread_mutex_unlock(&c->write_lock);
}

/* shared_init -- the shared state of a WAL with nothing appended yet (the header aside). */
static void shared_init(wal_shared *sh, uint32_t nslots)
{
    memset((uint8_t *)sh + WAL_CTL_HEADER, 0, sizeof(*sh) - WAL_CTL_HEADER);
    sh->nslots = nslots;
    sh->holder_slot = WAL_NO_HOLDER;
    sh->prev_u = WAL_NO_PREV;
    for (uint32_t i = 0; i < WAL_MAX_SLOTS; i++) {
        atomic_init(&sh->slots[i].start, WAL_POS_FREE);
        atomic_init(&sh->slots[i].progress, WAL_POS_FREE);
    }
}

int wal_core_init(wal_core *c, uint64_t seg_size, uint32_t wal_id_lo, int direct,
                  uint64_t ring_bytes, uint8_t *ring, uint32_t nslots, uint64_t max_record)
{
    memset(c, 0, sizeof(*c));
    if (nslots < 1 || nslots > WAL_MAX_SLOTS)
        return -EINVAL;
    if (!direct && (ring == NULL || ring_bytes % WAL_PAGE_SIZE || ring_bytes < 16 * WAL_PAGE_SIZE))
        return -EINVAL;
    wal_geom_init(&c->geom, seg_size, wal_id_lo);
    c->direct = direct;
    c->persist = direct ? WAL_PERSIST_MSYNC : WAL_PERSIST_FDATASYNC;
    c->ring = ring;
    c->ring_pages = ring_bytes / WAL_PAGE_SIZE;
    c->nslots = nslots;
    c->max_record = max_record;
    c->notify_fd = -1;
    c->ctl_fd = -1;
    c->stream_min = WAL_NT_NEVER;
    c->sh = &c->own;
    c->token = 1;
    c->me = &c->own.procs[0];
    shared_init(c->sh, nslots);
    int rc = pthread_mutex_init(&c->serial_lock, NULL);
    if (!rc)
        rc = pthread_mutex_init(&c->reap_lock, NULL);
    return -(rc ? rc : pthread_mutex_init(&c->write_lock, NULL));
}

void wal_core_destroy(wal_core *c)
{
    pthread_mutex_destroy(&c->write_lock);
    pthread_mutex_destroy(&c->serial_lock);
    pthread_mutex_destroy(&c->reap_lock);
}

int wal_set_position(wal_core *c, uint64_t insert_lsn, uint64_t prev_lsn)
{
    int64_t u = wal_usable(&c->geom, insert_lsn);
    if (u < 0 || insert_lsn % WAL_ALIGN)
        return -EINVAL;
    atomic_store(&c->sh->cur_u, (uint64_t)u);
    c->sh->prev_u = WAL_NO_PREV;
    if (prev_lsn) {
        int64_t p = wal_usable(&c->geom, prev_lsn);
        if (p < 0 || (uint64_t)p >= (uint64_t)u)
            return -EINVAL;
        c->sh->prev_u = (uint64_t)p;
    }
    atomic_store(&c->sh->flushed_u, (uint64_t)u);
    atomic_store(&c->sh->written_u, (uint64_t)u);
    return 0;
}

void wal_set_persist(wal_core *c, enum wal_persist p, void (*pmem_flush)(const void *, size_t),
                     void (*pmem_drain)(void), uint64_t stream_min)
{
    c->persist = p;
    c->pmem_flush = pmem_flush;
    c->pmem_drain = pmem_drain;
    c->stream_min = p == WAL_PERSIST_PMEM && crc32c_streaming() ? stream_min : WAL_NT_NEVER;
}

/* ---- segments ---------------------------------------------------------- */

void wal_attach(wal_core *c, uint64_t segno, uint8_t *base, int fd)
{
    wal_seg_entry *e = &c->segs[segno % WAL_SEG_TABLE];
    atomic_store_explicit(&e->tag, 0, memory_order_release);
    e->base = base;
    e->fd = fd;
    atomic_store_explicit(&e->tag, segno + 1, memory_order_release);
}

void wal_detach(wal_core *c, uint64_t segno)
{
    wal_seg_entry *e = &c->segs[segno % WAL_SEG_TABLE];
    uint64_t tag = segno + 1;
    atomic_compare_exchange_strong(&e->tag, &tag, 0);
}

static inline wal_seg_entry *seg_lookup(wal_core *c, uint64_t segno)
{
    wal_seg_entry *e = &c->segs[segno % WAL_SEG_TABLE];
    return atomic_load_explicit(&e->tag, memory_order_acquire) == segno + 1 ? e : NULL;
}

/* seg_get -- the attached segment, asking the environment for it when missing. */
static int seg_get(wal_core *c, const wal_env *env, uint64_t segno, wal_seg_entry **out)
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

/* READY_SPAN -- segments a reservation finds attached before it is made; those of a batch
 * larger than this (gigabytes) are attached as it is copied, since the segment table could
 * not hold them all at once. */
#define READY_SPAN 64u

/* segments_ready -- whether the segments of usable range [from, from + total) (the first
 * READY_SPAN of them) are attached. */
static int segments_ready(wal_core *c, uint64_t from, uint64_t total)
{
    const uint64_t per = c->geom.seg_usable, first = from / per;
    for (uint64_t s = first; s <= (from + total - 1) / per && s < first + READY_SPAN; s++)
        if (!seg_lookup(c, s))
            return 0;
    return 1;
}

/* ensure_segments -- attach the segments a reservation of `total` bytes at `from` (the
 * insert position a moment ago) would need, before reserving.  The position may be stale
 * by now: a segment the insert position has passed since (and that a truncation may have
 * removed) is skipped, never asked for again. */
static int ensure_segments(wal_core *c, const wal_env *env, uint64_t from, uint64_t total)
{
    const uint64_t per = c->geom.seg_usable, first = from / per;
    for (uint64_t s = first; s <= (from + total - 1) / per && s < first + READY_SPAN; s++) {
        if (seg_lookup(c, s))
            continue;
        int rc = env->need_segment(env->ctx, s);
        if (rc)
            return rc;
        if (!seg_lookup(c, s) && s >= atomic_load_explicit(&c->sh->cur_u, memory_order_relaxed) / per)
            return -ENOENT;
    }
    return 0;
}

/* ---- insertion slots --------------------------------------------------- */

static _Atomic uint32_t next_slot_hint;
static __thread uint32_t slot_hint;
static __thread int slot_hint_set;

static int try_slots(wal_core *c, uint32_t first, wal_slot **out)
{
    for (uint32_t k = 0; k < c->nslots; k++) {
        uint32_t i = (first + k) % c->nslots;
        uint32_t free_ = 0;
        if (atomic_load_explicit(&c->sh->slots[i].owner, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&c->sh->slots[i].owner, &free_, c->token)) {
            slot_hint = i;
            *out = &c->sh->slots[i];
            return 1;
        }
    }
    return 0;
}

/* acquire_slot -- take an insertion slot and mark it "reserving". */
static int acquire_slot(wal_core *c, const wal_env *env, wal_slot **out)
{
    if (!slot_hint_set) {
        slot_hint = atomic_fetch_add(&next_slot_hint, 1);
        slot_hint_set = 1;
    }
    uint64_t waited = 0;
    if (!try_slots(c, slot_hint, out)) {
        uint64_t t0 = now_ns();
        unsigned spins = 0;
        while (!try_slots(c, slot_hint, out)) {
            int rc = stopped(c);
            if (rc)
                return rc;
            backoff(env, &spins);
            if (reap_due(c, spins))
                wal_reap_dead(c, env);
        }
        waited = now_ns() - t0;
    }
    wal_slot *s = *out;
    s->acquire_wait_ns += waited;
    atomic_store(&s->progress, WAL_POS_RESERVING);
    atomic_store(&s->start, WAL_POS_RESERVING); /* seq_cst: before the reservation */
    int rc = stopped(c);
    if (rc) {
        atomic_store(&s->start, WAL_POS_FREE);
        atomic_store(&s->progress, WAL_POS_FREE);
        atomic_store_explicit(&s->owner, 0, memory_order_release);
    }
    return rc;
}

static void release_slot(wal_slot *s)
{
    atomic_store_explicit(&s->start, WAL_POS_FREE, memory_order_release);
    atomic_store_explicit(&s->progress, WAL_POS_FREE, memory_order_release);
    atomic_store_explicit(&s->owner, 0, memory_order_release);
}

/* frontier -- lowest position still being inserted (by start or by progress). */
static uint64_t frontier(wal_core *c, const wal_env *env, int by_progress)
{
    uint64_t lowest = load_cur(c);
    for (uint32_t i = 0; i < c->nslots; i++) {
        _Atomic uint64_t *pos = by_progress ? &c->sh->slots[i].progress : &c->sh->slots[i].start;
        uint64_t v;
        unsigned spins = 0;
        while ((v = atomic_load(pos)) == WAL_POS_RESERVING) {
            backoff(env, &spins);
            if (reap_due(c, spins))
                reap(c, env, atomic_load(&c->sh->slots[i].owner));
        }
        if (v < lowest)
            lowest = v;
    }
    return lowest;
}

/* wait_insertions -- until no insertion below limit is in progress. */
static int wait_insertions(wal_core *c, const wal_env *env, uint64_t limit, int by_progress)
{
    uint64_t t0 = 0;
    for (uint32_t i = 0; i < c->nslots; i++) {
        _Atomic uint64_t *pos = by_progress ? &c->sh->slots[i].progress : &c->sh->slots[i].start;
        unsigned spins = 0;
        for (;;) {
            uint64_t v = atomic_load(pos);
            if (v == WAL_POS_FREE || (v != WAL_POS_RESERVING && v >= limit))
                break;
            if (atomic_load(&c->error))
                return -WAL_ESTOPPED;
            if (!t0)
                t0 = now_ns();
            backoff(env, &spins);
            if (reap_due(c, spins))
                reap(c, env, atomic_load(&c->sh->slots[i].owner));
        }
    }
    if (t0) /* the background writer's waits delay no caller: counted apart */
        atomic_fetch_add(env && env->background ? &c->me->background_wait_ns : &c->me->insert_wait_ns,
                         now_ns() - t0);
    return 0;
}

/* ---- writing out and persisting (write_lock held) ---------------------- */

/* phys_from -- first LSN of usable range starting at u: a page's header belongs to it. */
static inline uint64_t phys_from(const wal_geom *g, uint64_t u)
{
    uint64_t lsn = wal_lsn(g, u);
    return u % WAL_PAGE_USABLE ? lsn : lsn - WAL_PAGE_HDR;
}

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
static int write_upto(wal_core *c, const wal_env *env, uint64_t u)
{
    int rc = wait_insertions(c, env, u, 1);
    if (rc)
        return rc;
    will_wait(env); /* for the lock, then pwrite */
    pthread_mutex_lock(&c->write_lock);
    uint64_t written = atomic_load(&c->sh->written_u);
    if (written < u && !(rc = stopped(c))) {
        uint64_t to = frontier(c, env, 1);
        rc = write_range(c, env, written, to);
        if (!rc)
            atomic_store(&c->sh->written_u, to);
    }
    pthread_mutex_unlock(&c->write_lock);
    return rc;
}

/* ---- stage two: header, CRC, copy --------------------------------------- */

/* ring_page -- buffered: the buffer page for physical page number pg, once free. */
static int ring_page(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t pg,
                     uint64_t pos, uint8_t **out)
{
    if (pg >= c->ring_pages) {
        /* the page last held in this slot must be written out first */
        uint64_t old = pg - c->ring_pages;
        uint64_t pps = c->geom.seg_size / WAL_PAGE_SIZE;
        uint64_t need = old / pps * c->geom.seg_usable + old % pps * WAL_PAGE_USABLE;
        if (atomic_load_explicit(&c->sh->written_u, memory_order_acquire) < need) {
            atomic_store(&slot->progress, pos); /* our bytes below pos are complete */
            int rc = write_upto(c, env, need);
            if (rc)
                return rc;
        }
    }
    *out = c->ring + (pg % c->ring_pages) * WAL_PAGE_SIZE;
    return 0;
}

/* page_base -- where the physical page holding usable position u is written. */
static int page_base(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t u,
                     uint8_t **out)
{
    uint64_t lsn = wal_lsn(&c->geom, u);
    uint64_t page_lsn = lsn - lsn % WAL_PAGE_SIZE;
    if (!c->direct)
        return ring_page(c, env, slot, page_lsn / WAL_PAGE_SIZE, u, out);
    wal_seg_entry *e;
    int rc = seg_get(c, env, page_lsn / c->geom.seg_size, &e);
    if (rc)
        return rc;
    *out = e->base + page_lsn % c->geom.seg_size;
    return 0;
}

/* drain -- make the insertion's cache flushes and streaming stores durable.  pmem_drain
 * is libpmem's fence for its own flushes: where the flush instruction orders itself
 * (CLFLUSH: a CPU with neither CLWB nor CLFLUSHOPT, or PMEM_NO_CLWB=1 PMEM_NO_CLFLUSHOPT=1)
 * libpmem makes it an empty function, and fences its own streaming copies itself.  Our
 * movnt stores would then have none: an sfence follows them, whatever pmem_drain does
 * (where it fenced already, a second one with nothing pending costs a few cycles). */
static inline void drain(wal_core *c, wal_slot *slot, int streamed)
{
    if (trace_mutated(TRACE_SKIP_DRAIN))
        return;
    trace_hand_over(); /* the streamed run, pending before pmem_drain (an sfence where it is one) */
    c->pmem_drain();
#if defined(__x86_64__)
    if (streamed && !trace_mutated(TRACE_SKIP_STREAM_FENCE)) {
        __builtin_ia32_sfence();
        trace_fence();
        slot->stream_fences++;
    }
#else
    (void)slot;
    (void)streamed;
#endif
}

/* written -- in pmem mode, flush what was just stored through the cache. */
static inline void written(wal_core *c, const wal_slot *slot, const void *p, size_t n)
{
    if (c->persist == WAL_PERSIST_PMEM && !slot->defer_flush) {
        trace_hand_over(); /* the simulator must know what this thread streamed before */
        c->pmem_flush(p, n);
    }
}

/* store_header -- a header's 8-aligned bytes: streamed past the cache where the
 * record's payload is (one fence then persists all, no write-back to wait for),
 * else stored and flushed. */
static void store_header(wal_core *c, const wal_slot *slot, uint8_t *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
    if (c->stream_min != WAL_NT_NEVER && !slot->defer_flush) {
        for (size_t i = 0; i < n; i += 8) {
            long long w;
            memcpy(&w, (const uint8_t *)src + i, 8);
            __builtin_ia32_movnti64((long long *)(dst + i), w);
        }
        trace_stream(dst, n);
        return;
    }
#endif
    memcpy(dst, src, n);
    written(c, slot, dst, n);
}

static void write_page_header(wal_core *c, const wal_slot *slot, uint8_t *page, uint64_t page_lsn,
                              uint32_t rem_len)
{
    wal_page_hdr h = {WAL_PAGE_MAGIC, rem_len, page_lsn, c->geom.wal_id_lo, 0};
    h.crc = crc32c_update(0, &h, offsetof(wal_page_hdr, crc));
    store_header(c, slot, page, &h, sizeof(h));
}

/* piece -- one page's share of a record's stream: stream offsets [from, to) at dst. */
typedef struct piece {
    uint8_t *dst;
    uint64_t from, to;
} piece;

/* next_piece -- map the stream offset `off` of the record at u to its page. */
static int next_piece(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t u,
                      uint64_t size, uint64_t off, piece *pc)
{
    uint64_t pos = u + off, in_page = pos % WAL_PAGE_USABLE;
    uint8_t *page;
    int rc = page_base(c, env, slot, pos, &page);
    if (rc)
        return rc;
    if (in_page == 0) /* we own this page's header */
        write_page_header(c, slot, page, wal_lsn(&c->geom, pos) - WAL_PAGE_HDR,
                          off == 0 ? 0 : (uint32_t)(size - off));
    uint64_t room = WAL_PAGE_USABLE - in_page;
    pc->dst = page + WAL_PAGE_HDR + in_page;
    pc->from = off;
    pc->to = off + (room < size - off ? room : size - off);
    return 0;
}

/* copy_payload -- payload bytes to dst, extending crc; pad: zero-fill to 8 bytes. */
static uint32_t copy_payload(wal_core *c, const wal_slot *slot, uint8_t *dst, const uint8_t *src,
                             uint64_t n, uint32_t crc, int pad)
{
    if (n >= c->stream_min)
        return crc32c_copy_nt(crc, dst, src, n, pad); /* past the cache: nothing to flush */
    if (c->direct)
        crc = crc32c_copy(crc, dst, src, n);
    else
        memcpy(dst, src, n); /* buffered: the CRC was taken before */
    uint64_t padded = pad ? (n + WAL_ALIGN - 1) & ~(uint64_t)(WAL_ALIGN - 1) : n;
    memset(dst + n, 0, padded - n);
    written(c, slot, dst, padded);
    return crc;
}

/* wal_payload -- a record's payload: head (head_len bytes, a multiple of 8, or none), then body. */
typedef struct wal_payload {
    const uint8_t *head, *body;
    uint64_t head_len, len; /* len: the whole payload */
} wal_payload;

/* copy_parts -- payload bytes [off, off + n) to dst, from head and body as they fall.
 * head_len is a multiple of 8, so a piece that ends in the head ends 8-aligned, as
 * crc32c_copy_nt wants of every piece but the padded last one. */
static uint32_t copy_parts(wal_core *c, const wal_slot *slot, uint8_t *dst, const wal_payload *pl,
                           uint64_t off, uint64_t n, uint32_t crc, int pad)
{
    if (off < pl->head_len) {
        uint64_t k = pl->head_len - off < n ? pl->head_len - off : n;
        crc = copy_payload(c, slot, dst, pl->head + off, k, crc, pad && k == n);
        dst += k;
        off += k;
        n -= k;
    }
    if (n)
        crc = copy_payload(c, slot, dst, pl->body + (off - pl->head_len), n, crc, pad);
    return crc;
}

static void put_header(wal_core *c, const wal_slot *slot, const piece *pc, const wal_rec_hdr *hdr)
{
    uint64_t to = pc->to < WAL_REC_HDR ? pc->to : WAL_REC_HDR;
    store_header(c, slot, pc->dst, (const uint8_t *)hdr + pc->from, to - pc->from);
}

/*
 * place -- stage two: copy a record to usable [u, u + size).
 *
 * Direct mode copies the payload first, its CRC computed on the way (fused
 * with the copy), and stores the header, whose CRC field needs that result,
 * last.  Buffered mode can't: a record larger than the ring has its first
 * pages written out and their ring slots reused before it ends, so it
 * computes the CRC first and stores everything in stream order.  In pmem mode
 * everything is flushed as it is stored and the caller fences, so a flush
 * later only has to wait for the insertion to end.
 */
static int place(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t u,
                 wal_rec_hdr *hdr, const wal_payload *pl)
{
    const uint64_t len = pl->len, size = wal_rec_size(len), pay_end = WAL_REC_HDR + len;
    const int header_last = c->direct;
    piece hp[2];
    int nh = 0;
    uint32_t crc = crc32c_update(0, (const uint8_t *)hdr + 4, WAL_REC_HDR - 4);
    if (!header_last)
        hdr->crc = crc32c_update(crc32c_update(crc, pl->head, pl->head_len), pl->body,
                                 len - pl->head_len);
    for (uint64_t off = 0; off < size;) {
        piece pc;
        int rc = next_piece(c, env, slot, u, size, off, &pc);
        if (rc)
            return rc;
        if (pc.from < WAL_REC_HDR) {
            if (header_last)
                hp[nh++] = pc;
            else
                put_header(c, slot, &pc, hdr);
        }
        uint64_t a = pc.from > WAL_REC_HDR ? pc.from : WAL_REC_HDR;
        if (a < pc.to) /* payload (and, in the last piece, the padding) */
            crc = copy_parts(c, slot, pc.dst + (a - pc.from), pl, a - WAL_REC_HDR,
                             (pc.to < pay_end ? pc.to : pay_end) - a, crc, pc.to == size);
        off = pc.to;
    }
    if (header_last) {
        hdr->crc = crc;
        for (int i = 0; i < nh; i++)
            put_header(c, slot, &hp[i], hdr);
    }
    return 0;
}

/* flush_range -- pmem: write back the cache lines of usable range [from, to). */
static int flush_range(wal_core *c, const wal_env *env, uint64_t from, uint64_t to)
{
    const wal_geom *g = &c->geom;
    for (uint64_t a = phys_from(g, from), b = wal_lsn_end(g, to); a < b;) {
        uint64_t seg_end = (a / g->seg_size + 1) * g->seg_size, end = b < seg_end ? b : seg_end;
        wal_seg_entry *e;
        int rc = seg_get(c, env, a / g->seg_size, &e);
        if (rc)
            return rc;
        trace_hand_over();
        c->pmem_flush(e->base + a % g->seg_size, end - a);
        a = end;
    }
    return 0;
}

/* reserve -- stage one: the whole critical section.  It reserves only where every segment
 * the range needs is attached (else it returns 0 and the position in *start, reserving
 * nothing: the caller attaches them and tries again), so that a failure to make one leaves
 * no hole; checking under the lock spares a read of the insert position's cache line before
 * it, which other processes write.  The slot is filled and published before the position
 * moves, and the holder's slot is named first, so that a process finding the holder dead
 * can tell what it had done (repair_reservation); a reader of cur_u that sees the new
 * position finds the slot published. */
static inline int reserve(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t size,
                          uint64_t last_off, uint64_t *prev, uint64_t *start_out)
{
    wal_shared *sh = c->sh;
    insert_lock(c, env);
    uint64_t start = *start_out = atomic_load_explicit(&sh->cur_u, memory_order_relaxed);
    if (!segments_ready(c, start, size)) {
        insert_unlock(c);
        return 0;
    }
    sh->holder_slot = (uint32_t)(slot - sh->slots);
    slot->res_end = start + size;
    slot->res_prev = *prev = sh->prev_u;
    slot->res_last = start + last_off;
    atomic_store_explicit(&slot->progress, start, memory_order_release);
    atomic_store_explicit(&slot->start, start, memory_order_release);
    stall_here(c, env, WAL_OP_STALL_LOCKED);
    atomic_store_explicit(&sh->cur_u, start + size, memory_order_release);
    sh->prev_u = start + last_off;
    sh->holder_slot = WAL_NO_HOLDER;
    insert_unlock(c);
    return 1;
}

/* ready_ahead -- whether segment s and the notify_ahead after it are attached: then the
 * background writer has nothing to prepare, and waking it (it needs the GIL) would only
 * take time from the appenders. */
static int ready_ahead(wal_core *c, uint64_t s)
{
    uint32_t ahead = atomic_load_explicit(&c->notify_ahead, memory_order_relaxed);
    for (uint64_t k = 0; k <= ahead; k++)
        if (!seg_lookup(c, s + k))
            return 0;
    return 1;
}

/* payload_of -- record i's payload: heads[i] (if any) then bufs[i]. */
static inline wal_payload payload_of(const void *const *heads, const uint64_t *head_lens,
                                     const void *const *bufs, const uint64_t *lens, size_t i)
{
    uint64_t h = heads ? head_lens[i] : 0;
    return (wal_payload){heads ? heads[i] : NULL, bufs[i], h, h + lens[i]};
}

static int insert_reserved(wal_core *c, const wal_env *env, const void *const *heads,
                           const uint64_t *head_lens, const void *const *bufs,
                           const uint64_t *lens, size_t n, uint64_t total, uint64_t last_off,
                           uint64_t payload, uint64_t largest, uint64_t *lsns);

int wal_insert(wal_core *c, const wal_env *env, const void *const *heads,
               const uint64_t *head_lens, const void *const *bufs, const uint64_t *lens,
               size_t n, uint64_t *lsns)
{
    uint64_t total = 0, last_off = 0, payload = 0, largest = 0;
    int rc = stopped(c);
    if (rc || n == 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = payload_of(heads, head_lens, bufs, lens, i).len;
        if (len > c->max_record || len < lens[i])
            return -EMSGSIZE;
        if (heads && head_lens[i] % WAL_ALIGN)
            return -EINVAL;
        last_off = total;
        total += wal_rec_size(len);
        payload += len;
        largest = len > largest ? len : largest;
    }
    if (c->serial) {
        will_wait(env); /* the GIL goes first: the holder may need it for a segment */
        pthread_mutex_lock(&c->serial_lock);
    }
    rc = insert_reserved(c, env, heads, head_lens, bufs, lens, n, total, last_off, payload,
                         largest, lsns);
    if (c->serial)
        pthread_mutex_unlock(&c->serial_lock);
    return rc;
}

/* insert_reserved -- wal_insert's work once the segments are there: take a slot, reserve,
 * copy and checksum the records into place, persist them, leave the slot. */
static int insert_reserved(wal_core *c, const wal_env *env, const void *const *heads,
                           const uint64_t *head_lens, const void *const *bufs,
                           const uint64_t *lens, size_t n, uint64_t total, uint64_t last_off,
                           uint64_t payload, uint64_t largest, uint64_t *lsns)
{
    int rc;
    wal_slot *slot;
    uint64_t prev_u, u;
    for (;;) {
        if ((rc = acquire_slot(c, env, &slot)))
            return rc;
        if (reserve(c, env, slot, total, last_off, &prev_u, &u))
            break;
        /* Segments to attach first: without the slot, which flushes would wait for. */
        release_slot(slot);
        if ((rc = ensure_segments(c, env, u, total)))
            return rc;
    }
    uint64_t start_u = u;
    stall_here(c, env, WAL_OP_STALL);
    /* Nothing streamed: flush the whole range once at the end rather than each
     * header and payload as stored (small records share cache lines). */
    slot->defer_flush = c->persist == WAL_PERSIST_PMEM &&
                        largest < (c->stream_min < WAL_NT_MIN ? c->stream_min : WAL_NT_MIN);

    const wal_geom *g = &c->geom;
    uint64_t flushed_lsn = wal_lsn(g, atomic_load_explicit(&c->sh->flushed_u, memory_order_relaxed));
    uint64_t prev_lsn = prev_u == WAL_NO_PREV ? 0 : wal_lsn(g, prev_u);
    for (size_t i = 0; i < n && !rc; i++) {
        wal_payload pl = payload_of(heads, head_lens, bufs, lens, i);
        uint64_t lsn = wal_lsn(g, u);
        uint64_t gap = lsn - flushed_lsn;
        wal_rec_hdr h = {0, (uint32_t)pl.len, prev_lsn, WAL_REC_DATA,
                         gap > WAL_GAP_MAX ? WAL_GAP_MAX : (uint32_t)gap};
        rc = place(c, env, slot, u, &h, &pl);
        lsns[i] = prev_lsn = lsn;
        u += wal_rec_size(pl.len);
    }
    if (!rc && hook_due(c, WAL_OP_DIE)) {
        wal_forsake(c); /* the writer vanishes mid-insert, its slot taken */
        return -WAL_ECLOSED;
    }
    if (!rc && slot->defer_flush)
        rc = flush_range(c, env, start_u, start_u + total);
    if (rc) {
        /* The reservation can't be undone.  A shared WAL closes the range (void records)
         * so that the other processes go on; where that fails too, or the WAL is this
         * process's alone, the slot stays taken, so that no flush passes the hole, and
         * this process's writer stops (the others retry closing it: reap). */
        if (c->shared && void_slot(c, env, slot) == 0)
            release_slot(slot);
        else
            atomic_store(&slot->owner, WAL_SLOT_ABANDONED);
        return rc == -WAL_ECLOSED ? rc : fail(c, rc, "inserting a record failed");
    }
    if (c->persist == WAL_PERSIST_PMEM) /* our flushes and streaming stores: durable past here */
        drain(c, slot, c->stream_min != WAL_NT_NEVER && !slot->defer_flush);
    slot->records += n;
    slot->bytes += total;
    slot->payload_bytes += payload;
    release_slot(slot);
    uint64_t end_seg = (start_u + total) / g->seg_usable;
    int first = atomic_load_explicit(&c->notify_first, memory_order_relaxed);
    int notify_fd = atomic_load_explicit(&c->notify_fd, memory_order_relaxed);
    if (notify_fd >= 0 && (first || start_u / g->seg_usable != end_seg)) {
        if (first) /* the WAL grows from here: its segments ahead are wanted now */
            atomic_store_explicit(&c->notify_first, 0, memory_order_relaxed);
        if (!ready_ahead(c, end_seg)) {
            uint64_t one = 1; /* a new segment, and work to do: wake the background writer */
            ssize_t ignored = write(notify_fd, &one, sizeof(one));
            (void)ignored;
        }
    }
    return 0;
}

/* ---- shared WALs: who is alive, and closing what the dead left open ------ */

#define VOID_MAX (1ull << 30) /* payload bytes of one void record, at most (u32 length) */

/* liveness_lock -- take (F_WRLCK) or drop (F_UNLCK) entry i's liveness lock, never
 * waiting: 0, or a negative errno (-EAGAIN: a live process holds it). */
static int liveness_lock(int fd, uint32_t i, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET,
                       .l_start = (off_t)(WAL_CTL_LIVENESS + i), .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl) ? -errno : 0;
}

/* void_record -- usable [from, to) as one void record (zeros) linked to prev_u. */
static int void_record(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t from,
                       uint64_t to, uint64_t prev_u)
{
    const wal_geom *g = &c->geom;
    uint64_t len = to - from - WAL_REC_HDR;
    uint8_t *zeros = calloc(1, len ? len : 1);
    if (!zeros)
        return -ENOMEM;
    uint64_t lsn = wal_lsn(g, from);
    uint64_t gap = lsn - wal_lsn(g, atomic_load(&c->sh->flushed_u));
    wal_rec_hdr h = {0, (uint32_t)len, prev_u == WAL_NO_PREV ? 0 : wal_lsn(g, prev_u),
                     WAL_REC_VOID, gap > WAL_GAP_MAX ? WAL_GAP_MAX : (uint32_t)gap};
    wal_payload pl = {NULL, zeros, 0, len};
    int rc = place(c, env, slot, from, &h, &pl);
    free(zeros);
    return rc;
}

/* void_slot -- close the range a slot's insertion reserved and did not finish: void
 * records over it, the last one where the reservation's last record starts, since
 * the record after the range links to that position.  Nothing in the range had been
 * acknowledged: its append had not returned. */
static int void_slot(wal_core *c, const wal_env *env, wal_slot *slot)
{
    uint64_t start = atomic_load(&slot->start), at = start, prev = slot->res_prev;
    if (start == WAL_POS_FREE || start == WAL_POS_RESERVING)
        return 0; /* nothing reserved */
    slot->defer_flush = c->persist == WAL_PERSIST_PMEM;
    int rc = 0;
    while (!rc && at < slot->res_last) { /* a batch's records before its last */
        uint64_t n = slot->res_last - at, most = VOID_MAX + WAL_REC_HDR;
        if (n > most)
            n = n - most < WAL_REC_HDR ? most - 64 : most;
        rc = void_record(c, env, slot, at, at + n, prev);
        prev = at;
        at += n;
    }
    if (!rc)
        rc = void_record(c, env, slot, slot->res_last, slot->res_end, prev);
    if (!rc && c->persist == WAL_PERSIST_PMEM && !(rc = flush_range(c, env, start, slot->res_end)))
        drain(c, slot, c->stream_min != WAL_NT_NEVER);
    return rc;
}

/* repair_reservation -- the reservation lock's holder (token) died: finish or drop what
 * it was doing (reserve's order makes this possible), then free the lock. */
static void repair_reservation(wal_core *c, uint32_t token)
{
    wal_shared *sh = c->sh;
    if (atomic_load(&sh->insert_lock) != token)
        return;
    if (sh->holder_slot < WAL_MAX_SLOTS) {
        wal_slot *s = &sh->slots[sh->holder_slot];
        uint64_t start = atomic_load(&s->start);
        if (start != WAL_POS_FREE && start != WAL_POS_RESERVING) { /* published: complete it */
            if (atomic_load(&sh->cur_u) == start)
                atomic_store(&sh->cur_u, s->res_end);
            sh->prev_u = s->res_last;
        } /* else it had reserved nothing */
        sh->holder_slot = WAL_NO_HOLDER;
    }
    atomic_store(&sh->insert_lock, 0);
}

/* close_slots -- void and free every slot whose owner is `owner`, claiming each first
 * (for abandoned slots, which any process may be closing); 0, or why one failed. */
static int close_slots(wal_core *c, const wal_env *env, uint32_t owner)
{
    for (uint32_t i = 0; i < c->nslots; i++) {
        wal_slot *s = &c->sh->slots[i];
        uint32_t expect = owner;
        if (!atomic_compare_exchange_strong(&s->owner, &expect, c->token))
            continue;
        int rc = void_slot(c, env, s);
        if (rc) {
            atomic_store(&s->owner, owner);
            return rc;
        }
        release_slot(s);
    }
    return 0;
}

/* reap -- if the process with this token is dead, clean up after it: its reservation, its
 * slots, its entry.  Returns 1 if it did.  Holding the dead one's liveness lock makes this
 * process the only one doing it; reap_lock, the only thread of it. */
static int reap(wal_core *c, const wal_env *env, uint32_t token)
{
    if (!c->shared || !env || token == 0 || token == c->token)
        return 0;
    if (token == WAL_SLOT_ABANDONED) /* an insertion failed and could not close its range */
        return close_slots(c, env, WAL_SLOT_ABANDONED) == 0;
    uint32_t i = token - 1;
    if (i >= WAL_MAX_PROCS || atomic_load(&c->sh->procs[i].state) != WAL_PROC_ALIVE)
        return 0;
    will_wait(env);
    pthread_mutex_lock(&c->reap_lock);
    int reaped = 0;
    if (liveness_lock(c->ctl_fd, i, F_WRLCK) == 0) { /* its owner is gone */
        if (atomic_load(&c->sh->procs[i].state) == WAL_PROC_ALIVE) {
            repair_reservation(c, token);
            if (close_slots(c, env, token) == 0) {
                c->sh->procs[i].pid = 0;
                atomic_store(&c->sh->procs[i].state, WAL_PROC_FREE);
                atomic_fetch_add(&c->sh->reaped, 1);
                reaped = 1;
            } /* else left ALIVE and unlocked: the next waiter tries again */
        }
        liveness_lock(c->ctl_fd, i, F_UNLCK);
    }
    pthread_mutex_unlock(&c->reap_lock);
    return reaped;
}

int wal_reap_dead(wal_core *c, const wal_env *env)
{
    int n = 0;
    if (!c->shared)
        return 0;
    for (uint32_t i = 0; i < WAL_MAX_PROCS; i++)
        n += reap(c, env, i + 1);
    reap(c, env, WAL_SLOT_ABANDONED);
    return n;
}

int wal_share(wal_core *c, wal_shared *mem, int fd, int init)
{
    if (init)
        shared_init(mem, c->nslots);
    else if (mem->nslots < 1 || mem->nslots > WAL_MAX_SLOTS)
        return -EINVAL;
    for (uint32_t i = 0; i < WAL_MAX_PROCS; i++) {
        int rc = liveness_lock(fd, i, F_WRLCK);
        if (rc == -EAGAIN || rc == -EACCES)
            continue; /* a live process's */
        if (rc)
            return rc;
        if (atomic_load(&mem->procs[i].state) != WAL_PROC_FREE) {
            liveness_lock(fd, i, F_UNLCK); /* a dead one's, not cleaned up yet: left to reap */
            continue;
        }
        mem->procs[i].pid = (int32_t)getpid();
        atomic_store(&mem->procs[i].state, WAL_PROC_ALIVE);
        c->nslots = mem->nslots;
        c->ctl_fd = fd;
        c->token = i + 1;
        c->me = &mem->procs[i];
        c->sh = mem;
        c->shared = 1;
        return 0;
    }
    return -EUSERS;
}

enum wal_persist wal_agree_persist(wal_core *c, enum wal_persist wanted)
{
    uint32_t agreed = 0;
    if (!c->shared ||
        atomic_compare_exchange_strong(&c->sh->persist, &agreed, (uint32_t)wanted + 1))
        return wanted;
    return (enum wal_persist)(agreed - 1);
}

void wal_forsake(wal_core *c)
{
    c->forked = 1;
    atomic_store(&c->closed, 1);
}

/* ---- flush ---------------------------------------------------------------- */

static int flush_below(wal_core *c, const wal_env *env, uint64_t limit, uint64_t end,
                       uint64_t *flushed_lsn);

int wal_flush(wal_core *c, const wal_env *env, uint64_t upto_lsn, uint64_t *flushed_lsn)
{
    uint64_t limit = load_cur(c);
    if (upto_lsn == WAL_FLUSH_READY) {
        limit = frontier(c, env, 0); /* below it, no insertion is in progress */
    } else if (upto_lsn != UINT64_MAX) {
        int64_t u = wal_usable(&c->geom, upto_lsn);
        if (u < 0 || (uint64_t)u > limit)
            return -EINVAL; /* not a position in the WAL appended so far */
        if ((uint64_t)u < limit)
            limit = (uint64_t)u + 1;
    }
    return flush_below(c, env, limit, 0, flushed_lsn);
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
        return 0;
    }
    if (seen >= end) { /* a later flush covered it */
        *flushed_lsn = wal_lsn(&c->geom, seen);
        return 0;
    }
    return flush_below(c, env, u + 1, end, flushed_lsn);
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
    if (flushed < limit && c->persist == WAL_PERSIST_PMEM) {
        /* Inserters persisted their own records before leaving their slots: a
         * flush only waits for them, then moves flushed_u forward, no lock. */
        if ((rc = wait_insertions(c, env, limit, 0)))
            return rc;
        uint64_t to = end ? end : frontier(c, env, 0);
        atomic_fetch_add_explicit(&c->me->flush_requests, 1, memory_order_relaxed);
        while (flushed < to &&
               !atomic_compare_exchange_weak(&c->sh->flushed_u, &flushed, to))
            ;
        atomic_fetch_add_explicit(flushed < to ? &c->me->flushes : &c->me->coalesced, 1,
                                  memory_order_relaxed);
        flushed = flushed < to ? to : flushed;
    } else if (flushed < limit) {
        if ((rc = wait_insertions(c, env, limit, 0)))
            return rc;
        will_wait(env); /* for the lock, then the system calls */
        pthread_mutex_lock(&c->write_lock);
        c->me->flush_requests++;
        flushed = atomic_load(&c->sh->flushed_u);
        if ((rc = stopped(c))) {
        } else if (flushed >= limit) {
            c->me->coalesced++;
        } else {
            uint64_t to = frontier(c, env, 0); /* everyone complete below: flush them too */
            if (c->direct) {
                rc = persist_range(c, env, flushed, to);
            } else {
                uint64_t written = atomic_load(&c->sh->written_u);
                if (written < to && !(rc = write_range(c, env, written, to)))
                    atomic_store(&c->sh->written_u, to);
                if (!rc)
                    rc = sync_segments(c, env, phys_from(&c->geom, flushed) / c->geom.seg_size,
                                       (wal_lsn_end(&c->geom, to) - 1) / c->geom.seg_size);
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
    }
    *flushed_lsn = wal_lsn(&c->geom, flushed);
    return rc;
}

/* leave_shared -- a shared WAL's close: wait for this process's insertions (the other
 * processes' go on), then leave the entry free and the state read from here on local. */
static void leave_shared(wal_core *c)
{
    for (uint32_t i = 0; i < c->nslots; i++) {
        unsigned spins = 0;
        while (atomic_load(&c->sh->slots[i].owner) == c->token)
            backoff(NULL, &spins);
    }
    pthread_mutex_lock(&c->write_lock);
    pthread_mutex_unlock(&c->write_lock);
    wal_shared *sh = c->sh;
    c->own.cur_u = atomic_load(&sh->cur_u);
    c->own.flushed_u = atomic_load(&sh->flushed_u);
    c->sh = &c->own;
    c->me = &c->own.procs[0];
    sh->procs[c->token - 1].pid = 0;
    atomic_store(&sh->procs[c->token - 1].state, WAL_PROC_FREE);
    liveness_lock(c->ctl_fd, c->token - 1, F_UNLCK);
    c->shared = 0;
}

void wal_close(wal_core *c)
{
    if (atomic_exchange(&c->closed, 1))
        return;
    if (c->shared) {
        leave_shared(c);
        return;
    }
    /* holding every slot and the write lock excludes all work in progress */
    for (uint32_t i = 0; i < c->nslots; i++) {
        unsigned spins = 0;
        uint32_t free_ = 0;
        while (!atomic_compare_exchange_weak(&c->sh->slots[i].owner, &free_, 1)) {
            if (free_ == WAL_SLOT_ABANDONED)
                break; /* a failed insertion keeps its slot forever */
            free_ = 0;
            backoff(NULL, &spins);
        }
    }
    pthread_mutex_lock(&c->write_lock);
    pthread_mutex_unlock(&c->write_lock);
}

int wal_position(wal_core *c, const wal_env *env, uint64_t *insert_lsn, uint64_t *prev_lsn)
{
    if (atomic_load(&c->closed) || c->forked)
        return -WAL_ECLOSED;
    insert_lock(c, env);
    uint64_t u = atomic_load_explicit(&c->sh->cur_u, memory_order_relaxed);
    uint64_t p = c->sh->prev_u;
    insert_unlock(c);
    *insert_lsn = wal_lsn(&c->geom, u);
    *prev_lsn = p == WAL_NO_PREV ? 0 : wal_lsn(&c->geom, p);
    return 0;
}

uint64_t wal_insert_lsn(wal_core *c)
{
    uint64_t u = load_cur(c);
    return wal_lsn(&c->geom, u);
}

uint64_t wal_flushed_lsn(wal_core *c)
{
    return wal_lsn(&c->geom, atomic_load(&c->sh->flushed_u));
}

void wal_get_stats(wal_core *c, wal_stats *s)
{
    memset(s, 0, sizeof(*s));
    for (uint32_t i = 0; i < c->nslots; i++) {
        s->records += c->sh->slots[i].records;
        s->bytes += c->sh->slots[i].bytes;
        s->payload_bytes += c->sh->slots[i].payload_bytes;
        s->slot_wait_ns += c->sh->slots[i].acquire_wait_ns;
        s->stream_fences += c->sh->slots[i].stream_fences;
    }
    s->reaped = atomic_load(&c->sh->reaped);
    for (uint32_t i = 0; i < WAL_MAX_PROCS; i++) {
        wal_proc *p = &c->sh->procs[i];
        s->processes += c->shared && atomic_load(&p->state) == WAL_PROC_ALIVE;
        s->writes += atomic_load(&p->writes);
        s->flushes += atomic_load(&p->flushes);
        s->flush_requests += atomic_load(&p->flush_requests);
        s->coalesced += atomic_load(&p->coalesced);
        s->insert_wait_ns += atomic_load(&p->insert_wait_ns);
        s->background_wait_ns += atomic_load(&p->background_wait_ns);
    }
}
