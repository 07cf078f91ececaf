/*
 * wal_core.c -- the writer's lifecycle, and what the other units only read.
 *
 * The writer is split by concern (wal_core_internal.h lists the units): insertion
 * (wal_insert.c), flush and commit (wal_flush.c), shared WALs (wal_shared.c).  This unit
 * keeps the rest: init and destroy, the position where appending resumes after recovery,
 * the persist method, the segment table (attach and detach; the lookups are inline in
 * wal_core_internal.h), the sticky error (wal_stop; fail), the test hooks' setter,
 * forsake and close, and the stats.
 *
 * State it touches: the whole core at init and set_position (before any appender); then
 * the segment table's entries, error and error_what, closed and forked, the fault hook
 * (under write_lock), and every slot and the write lock at close, to wait for work in
 * progress.  Calls out of this unit: leave_shared (wal_shared.c) at a shared WAL's close.
 */
#define _GNU_SOURCE
#include "wal_core_internal.h"

#include <string.h>

#include "crc32c.h"

int wal_stop(wal_core *c, int err, const char *what)
{
    fail(c, err, what);
    return atomic_load(&c->error);
}

void wal_inject_fault(wal_core *c, enum wal_op op, int err, uint64_t after, uint64_t count)
{
    pthread_mutex_lock(&c->write_lock);
    c->fault = (wal_fault){(int)op, err, after, count};
    pthread_mutex_unlock(&c->write_lock);
}

/* shared_init -- the shared state of a WAL with nothing appended yet (the header aside). */
void shared_init(wal_shared *sh, uint32_t nslots)
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

void wal_forsake(wal_core *c)
{
    c->forked = 1;
    atomic_store(&c->closed, 1);
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
