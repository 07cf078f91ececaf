/*
 * wal_insert.c -- insertion: the writer's hot path.
 *
 * Insertion has two stages (seed 004).  Stage one reserves the record's
 * space: a spinlock around "start = cur; cur += size; prev = last; last =
 * start", nothing else.  Stage two builds the header, computes the CRC and
 * copies the record into place (a mapped segment in direct mode, a WAL
 * buffer page in buffered mode) in parallel with other inserters.  An
 * inserter advertises its record in an insertion slot before it reserves, so
 * a flush to X waits only for the insertions that started below X.  In pmem
 * mode an insertion persists its own records (cache flushes or streaming
 * stores, then a fence) before it leaves its slot; a flush then only waits.
 *
 * Buffer mapping takes no lock (seed 000): buffer page p lives in ring slot
 * p % ring_pages, and may be reused once page p - ring_pages has been written
 * out, which is one comparison against written_u.  Nobody sleeps while
 * holding a lock that a crash could leave half-done: the only waits are for
 * other insertions to finish copying.
 *
 * Also here: serial mode (wal_insert under serial_lock), the wake-up of the background
 * writer when an insertion enters a new segment, void records (void_slot: a range
 * reserved and never finished, closed so that others go on), and the position read
 * under the reservation lock (wal_position).
 *
 * State it touches: the reservation (insert_lock, holder_slot, cur_u, prev_u) under the
 * reservation lock; the slot it holds; the bytes of the range it reserved, in the ring or
 * the segments; notify_first.  It reads flushed_u, written_u and the segment table.  Calls
 * out of this unit: write_upto (wal_flush.c) when a ring page is not written out yet, reap
 * and wal_reap_dead (wal_shared.c) when a wait lasts, wal_forsake (a test hook).
 */
#define _GNU_SOURCE
#include "wal_core_internal.h"
#include "trace.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"

/* LOCK_SPINS -- how long a waiter spins on the reservation lock before it sleeps: the
 * holder's critical section is a few dozen ns, unless it was preempted or stopped.
 * LOCK_NAP_NS -- a sleeper's longest nap: the pace of its checks (wait_check), which also
 * find a holder that died holding the lock (nobody would wake the sleeper then). */
#define LOCK_SPINS 128u
#define LOCK_NAP_NS 2000000L

/* wait_reservation -- insert_lock's wait, out of line: spin briefly, then sleep on the lock
 * word (a futex) with its waiters bit set, so that the unlock wakes one sleeper; no
 * sched_yield loop, which burns a core while a stopped holder holds the lock.  A waiter
 * that slept takes the lock with the bit set: others may sleep still.  Woken, it tries the
 * lock at once (a check first would let the arrivals that never slept take it every time);
 * it checks (wait_check) only when a nap ran out, or a signal cut one short.  Whom it waits
 * for is the holder, and the holder's progress the insert position: a lock that changes
 * hands restarts the timeout.  0, or why it gave up: the caller holds a slot, and nothing
 * reserved. */
static __attribute__((noinline)) int wait_reservation(wal_core *c, const wal_env *env)
{
    _Atomic uint32_t *lock = &c->sh->insert_lock;
    uint32_t mine = c->token;
    for (unsigned spins = 0;;) {
        uint32_t v = 0;
        if (atomic_compare_exchange_weak_explicit(lock, &v, mine, memory_order_acquire,
                                                  memory_order_relaxed))
            return 0;
        if (v == 0)
            continue; /* a spurious failure */
        if (++spins < LOCK_SPINS) {
            cpu_relax();
            continue;
        }
        will_wait(env);
        if (!(v & WAL_LOCK_WAITERS)) {
            uint32_t flagged = v | WAL_LOCK_WAITERS;
            if (!atomic_compare_exchange_strong(lock, &v, flagged))
                continue; /* freed or taken meanwhile: look again */
            v = flagged;
        }
        mine = c->token | WAL_LOCK_WAITERS;
        int slept = futex_wait(lock, v, LOCK_NAP_NS, c->shared);
        if (slept == -ETIMEDOUT || slept == -EINTR) {
            int rc = wait_check(c, env, v, load_cur(c));
            if (rc)
                return rc;
        }
    }
}

/* insert_lock / insert_unlock -- the reservation spinlock, holding the holder's token; in
 * a shared WAL a waiter checks in time whether the holder died holding it (wait_check). */
static inline int insert_lock(wal_core *c, const wal_env *env)
{
    uint32_t free_ = 0;
    if (__builtin_expect(atomic_compare_exchange_weak_explicit(&c->sh->insert_lock, &free_,
                                                               c->token, memory_order_acquire,
                                                               memory_order_relaxed), 1))
        return 0;
    return wait_reservation(c, env);
}

static inline void insert_unlock(wal_core *c)
{
    release_reservation(c);
}

/* hook_due -- whether the stall or die test hook fires here (wal_inject_fault). */
static int hook_due(wal_core *c, const wal_env *env, enum wal_op op)
{
    if (__builtin_expect(c->fault.count == 0, 1) || c->fault.op != (int)op)
        return 0; /* read without the lock: a test hook, set before the insertions it stops */
    will_wait(env); /* nobody waits for write_lock holding the GIL: its holder may want it */
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
    if (!hook_due(c, env, op))
        return;
    will_wait(env);
    for (;;)
        pause();
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

/* oldest_owner -- whom a wait for a free slot waits for: the owner of the oldest insertion
 * in progress (the lowest start), or the reservation lock's holder where every slot is
 * still reserving. */
static uint32_t oldest_owner(wal_core *c)
{
    uint64_t lowest = WAL_POS_FREE;
    uint32_t owner = 0;
    for (uint32_t i = 0; i < c->nslots; i++) {
        uint64_t start = atomic_load(&c->sh->slots[i].start);
        if (start < lowest) {
            lowest = start;
            owner = atomic_load(&c->sh->slots[i].owner);
        }
    }
    uint32_t holder = lowest >= WAL_POS_RESERVING ? lock_holder(c) : 0;
    return holder ? holder : owner;
}

/* wait_for_slot -- acquire_slot's wait, when every slot is taken, out of line; nothing is
 * reserved yet, so it may give up (wait_check).  Progress is the insert position's: a
 * slot freed and taken again reserves. */
static __attribute__((noinline)) int wait_for_slot(wal_core *c, const wal_env *env,
                                                   wal_slot **out, uint64_t *waited)
{
    uint64_t t0 = now_ns();
    wal_wait w = {0};
    while (!try_slots(c, slot_hint, out)) {
        int rc = stopped(c);
        if (rc)
            return rc;
        backoff(env, &w.spins);
        if (check_due(w.spins)) {
            wal_reap_dead(c, env);
            if ((rc = wait_check(c, env, oldest_owner(c), load_cur(c))))
                return rc;
        }
    }
    *waited = now_ns() - t0;
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
        int rc = wait_for_slot(c, env, out, &waited);
        if (rc)
            return rc;
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
 * nothing: the caller attaches them and tries again; a negative errno: it gave up waiting
 * for the lock, reserving nothing), so that a failure to make one leaves
 * no hole; checking under the lock spares a read of the insert position's cache line before
 * it, which other processes write.  The slot is filled and published before the position
 * moves, and the holder's slot is named first, so that a process finding the holder dead
 * can tell what it had done (repair_reservation); a reader of cur_u that sees the new
 * position finds the slot published. */
static inline int reserve(wal_core *c, const wal_env *env, wal_slot *slot, uint64_t size,
                          uint64_t last_off, uint64_t *prev, uint64_t *start_out)
{
    wal_shared *sh = c->sh;
    int rc = insert_lock(c, env);
    if (__builtin_expect(rc, 0))
        return rc;
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
    uint64_t prev_u = 0, u = 0; /* (set when reserve returns 1) */
    for (;;) {
        if ((rc = acquire_slot(c, env, &slot)))
            return rc;
        if ((rc = reserve(c, env, slot, total, last_off, &prev_u, &u)) > 0)
            break;
        /* Segments to attach first: without the slot, which flushes would wait for (or
         * the wait for the lock given up: nothing reserved). */
        release_slot(slot);
        if (rc || (rc = ensure_segments(c, env, u, total)))
            return rc;
    }
    rc = 0;
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
    if (!rc && hook_due(c, env, WAL_OP_DIE)) {
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
    uint64_t mark = atomic_load_explicit(&c->notify_mark, memory_order_relaxed);
    int marked = mark && start_u < mark && start_u + total >= mark;
    if (notify_fd >= 0 && (first || marked || start_u / g->seg_usable != end_seg)) {
        if (first) /* the WAL grows from here: its segments ahead are wanted now */
            atomic_store_explicit(&c->notify_first, 0, memory_order_relaxed);
        if (marked) /* a small WAL grew past the mark: its segments ahead are wanted now */
            atomic_store_explicit(&c->notify_mark, 0, memory_order_relaxed);
        if (!ready_ahead(c, end_seg)) {
            uint64_t one = 1; /* a new segment, and work to do: wake the background writer */
            ssize_t ignored = write(notify_fd, &one, sizeof(one));
            (void)ignored;
        }
    }
    return 0;
}

#define VOID_MAX (1ull << 30) /* payload bytes of one void record, at most (u32 length) */

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
int void_slot(wal_core *c, const wal_env *env, wal_slot *slot)
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

int wal_position(wal_core *c, const wal_env *env, uint64_t *insert_lsn, uint64_t *prev_lsn)
{
    if (c->forked)
        return -WAL_ECLOSED;
    int rc = enter_call(c);
    if (rc)
        return rc;
    if ((rc = insert_lock(c, env))) {
        leave_call(c);
        return rc;
    }
    uint64_t u = atomic_load_explicit(&c->sh->cur_u, memory_order_relaxed);
    uint64_t p = c->sh->prev_u;
    insert_unlock(c);
    leave_call(c);
    *insert_lsn = wal_lsn(&c->geom, u);
    *prev_lsn = p == WAL_NO_PREV ? 0 : wal_lsn(&c->geom, p);
    return 0;
}

uint64_t wal_insert_lsn(wal_core *c)
{
    uint64_t u = load_cur(c);
    return wal_lsn(&c->geom, u);
}
