/*
 * wal_shared.c -- shared WALs: several processes appending through one control file.
 *
 * A process joins by taking a free entry of the mapped wal_shared (wal_share) and its
 * liveness lock, and from then on works on the mapping's position, slots and flushed
 * position instead of its own.  A waiter that waits long checks whether the process it
 * waits for is dead (reap: its liveness lock can be taken) and cleans up after it: finishes
 * or drops its reservation (repair_reservation), closes its slots' ranges with void records
 * (void_slot, wal_insert.c) and frees its entry.  The persist method is the first
 * process's (wal_agree_persist).  Closing leaves the entry free (leave_shared).
 *
 * State it touches: the control mapping's process entries, a dead holder's reservation
 * (insert_lock, holder_slot, cur_u, prev_u), the slots of dead processes, reaped, persist;
 * and the core's sh, me, token, ctl_fd, shared when joining and leaving.
 */
#define _GNU_SOURCE
#include "wal_core_internal.h"

#include <fcntl.h>
#include <unistd.h>

/* ---- shared WALs: who is alive, and closing what the dead left open ------ */

/* liveness_lock -- take (F_WRLCK) or drop (F_UNLCK) entry i's liveness lock, never
 * waiting: 0, or a negative errno (-EAGAIN: a live process holds it). */
static int liveness_lock(int fd, uint32_t i, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET,
                       .l_start = (off_t)(WAL_CTL_LIVENESS + i), .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl) ? -errno : 0;
}

/* repair_reservation -- the reservation lock's holder (token) died: finish or drop what
 * it was doing (reserve's order makes this possible), then free the lock. */
static void repair_reservation(wal_core *c, uint32_t token)
{
    wal_shared *sh = c->sh;
    if ((atomic_load(&sh->insert_lock) & ~WAL_LOCK_WAITERS) != token)
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
    release_reservation(c); /* and wake a sleeper: nobody else would */
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
int reap(wal_core *c, const wal_env *env, uint32_t token)
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
    if (!c->shared || enter_call(c))
        return 0;
    for (uint32_t i = 0; i < WAL_MAX_PROCS; i++)
        n += reap(c, env, i + 1);
    reap(c, env, WAL_SLOT_ABANDONED);
    leave_call(c);
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

/* leave_shared -- a shared WAL's close (closed is set): wait for this process's insertions
 * (the other processes' go on) and for its calls in flight (enter_call), then leave the
 * entry free and the state read from here on local.  None of them waits for another
 * process now: a wait they may give up sees closed within a few ms (wait_check), and one
 * inside an insertion only waits for an insertion below its own, which the dead are reaped
 * from.  A call that read the shared state as the switch came would otherwise go on in the
 * private copy, whose slots are all free: a flush would pass peers' insertions.  No signal
 * handler runs inside a call (interrupted, module.c), so a close from one never waits here
 * for the call it interrupted. */
void leave_shared(wal_core *c)
{
    for (uint32_t i = 0; i < c->nslots; i++) {
        unsigned spins = 0;
        while (atomic_load(&c->sh->slots[i].owner) == c->token)
            backoff(NULL, &spins);
    }
    unsigned spins = 0;
    while (atomic_load(&c->calls))
        backoff(NULL, &spins);
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
