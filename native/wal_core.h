/*
 * wal_core.h -- the writer: two-stage insertion, insertion slots, flush.
 *
 * Plain C with no Python in it; module.c is the thin binding.  Every function
 * returns 0 or a negative errno; WAL_ECLOSED is returned once wal_close ran.
 */
#ifndef PMEMWAL_CORE_H
#define PMEMWAL_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "wal_follow.h"
#include "wal_format.h"

#define WAL_MAX_SLOTS 256
#define WAL_SEG_TABLE 1024      /* segments the writer can have attached at once */
#define WAL_ECLOSED 100000      /* not an errno: the WAL was closed */
#define WAL_ESTOPPED 100001     /* not an errno: refused, an earlier error stopped the writer */
#define WAL_SLOT_ABANDONED UINT32_MAX /* slot owner: an insertion that failed past its reservation */
#define WAL_POS_FREE UINT64_MAX /* slot: no insertion in progress */
#define WAL_POS_RESERVING (UINT64_MAX - 1) /* slot: reserving, position not known yet */
#define WAL_NO_PREV UINT64_MAX
#define WAL_NT_MIN 256          /* pmem, with CLWB: payload pieces this large are streamed */
#define WAL_NT_NEVER UINT64_MAX /* stream_min: never stream */

enum wal_persist {
    WAL_PERSIST_PMEM,        /* direct: libpmem flush + drain, by each inserter */
    WAL_PERSIST_MSYNC,       /* direct: msync(MS_SYNC) of the dirty pages */
    WAL_PERSIST_FDATASYNC,   /* buffered: pwrite, then fdatasync */
    WAL_PERSIST_FSYNC,       /* buffered: pwrite, then fsync */
    WAL_PERSIST_DSYNC,       /* buffered: pwrite to files opened O_DSYNC */
};

/* The system calls a test can make fail (wal_inject_fault). */
enum wal_op {
    WAL_OP_WRITE, /* buffered: pwrite */
    WAL_OP_SYNC,  /* buffered: fdatasync / fsync */
    WAL_OP_MSYNC, /* direct: msync */
    WAL_OP_STALL, /* an insertion stops for good once its space is reserved (err unused): a
                     process to SIGKILL mid-insert, in tests of shared WALs */
    WAL_OP_STALL_LOCKED, /* the same, inside the reservation lock, before the position moves */
    WAL_OP_DIE,   /* an insertion's records are placed, not yet persisted, and the writer
                     vanishes: its slot stays taken and the core refuses all work (as after
                     fork), for a test to drop its liveness lock (a death in one process) */
};

/* wal_fault -- a test hook: fail `count` calls of `op` with `err`, after `after` good ones. */
typedef struct wal_fault {
    int op, err;
    uint64_t after, count;
} wal_fault;

/* wal_env -- per call: how the core gets a segment that is not attached yet, and
 * what it does before it waits.  will_wait (may be NULL) runs before every wait
 * for another thread (a slot, an insertion, the write lock) and every system
 * call: the binding lets other threads run there (it gives up Python's GIL if
 * the call still holds it), so a caller may enter holding a lock that the
 * thread it waits for needs, as long as the core never waits while holding it. */
/* wal_patience -- the core's own record, in the caller's keeping, of whom a call waits for
 * and since when without progress: zeroed at the call's start, and kept across the retries
 * of a call that gave up with -EINTR, so that the timeout counts the whole wait. */
typedef struct wal_patience {
    uint64_t since, mark; /* since: 0, no wait yet; mark: the owner's progress as last seen */
    uint32_t owner;
} wal_patience;

typedef struct wal_env {
    int (*need_segment)(void *ctx, uint64_t segno); /* 0, or a negative errno */
    void (*will_wait)(void *ctx);
    void *ctx;
    int background; /* the background writer's flush: its waits are counted apart */
    /* A wait the caller may give up -- for a slot or the reservation lock (nothing reserved
     * yet), for insertions in a flush -- checks these every few ms.  interrupted (may be
     * NULL): nonzero when the call must give up (-EINTR) so that its caller can run the
     * signal handlers outside the core, holding nothing, and then call again; it runs no
     * Python and takes no lock (write_lock may be held).  wait_ns (0: none): how long it
     * waits for one writer that makes no progress, then -ETIMEDOUT with that writer's pid
     * in *stalled_pid (shared: the process's; else this process's); patience: the timer. */
    int (*interrupted)(void *ctx);
    uint64_t wait_ns;
    int32_t *stalled_pid;
    wal_patience *patience;
} wal_env;

typedef struct wal_seg_entry {
    _Atomic uint64_t tag; /* segno + 1; 0: empty */
    uint8_t *base;        /* direct: the mapping */
    int fd;               /* buffered: the file */
} wal_seg_entry;

/* wal_slot -- an insertion slot; its counters belong to whoever holds it.  res_*: the
 * reservation being filled (written under the reservation lock, before start), what a
 * process that finds the owner dead needs to close the range (wal_reap). */
typedef struct wal_slot {
    _Atomic uint32_t owner;    /* 0: free; a process token; WAL_SLOT_ABANDONED */
    _Atomic uint64_t start;    /* usable position of the record being inserted */
    _Atomic uint64_t progress; /* everything below is copied */
    uint64_t res_end, res_prev, res_last; /* reserved [start, res_end); prev_u; last record */
    uint64_t records, bytes, payload_bytes, acquire_wait_ns;
    uint64_t stream_fences;    /* sfences after streaming stores (drain in wal_insert.c) */
    int defer_flush;           /* pmem: flush the insertion's range once, at its end */
} __attribute__((aligned(64))) wal_slot;

typedef struct wal_stats {
    uint64_t records, bytes, payload_bytes, slot_wait_ns, stream_fences; /* summed over slots */
    uint64_t flushes, flush_requests, coalesced, insert_wait_ns, writes, background_wait_ns;
    uint64_t processes, reaped; /* shared: processes attached now; dead ones whose ranges were closed */
} wal_stats;

#define WAL_MAX_PROCS 128
#define WAL_CTL_VERSION 2
#define WAL_CTL_HEADER 64          /* bytes of the control file's header (pmemwal/control.py) */
#define WAL_CTL_LIVENESS 1048576u  /* byte offset of the per-process liveness locks */
#define WAL_CTL_COUNTERS 8
#define WAL_NO_HOLDER UINT32_MAX
#define WAL_LOCK_WAITERS 0x80000000u /* insert_lock: a waiter sleeps; the unlock wakes one */

enum wal_proc_state { WAL_PROC_FREE, WAL_PROC_ALIVE };

/* wal_proc -- a process's entry, and its counters: each process counts in its own line,
 * since counters every process bumped would bounce one cache line between them at every
 * flush (stats add the entries up, those of processes gone included). */
typedef struct wal_proc {
    _Atomic uint32_t state;
    int32_t pid;               /* for people reading the control file: liveness is the lock */
    _Atomic uint64_t flushes, flush_requests, coalesced, writes;
    _Atomic uint64_t insert_wait_ns;     /* flushes waiting for insertions */
    _Atomic uint64_t background_wait_ns; /* the same, the background writer's flushes */
} __attribute__((aligned(64))) wal_proc;

/*
 * wal_shared -- the state every writer of a WAL shares: the insert position, the slots,
 * the flushed position, the counters.  One process's WAL has it in its wal_core; a WAL
 * opened with shared=True has it in the mapped control file (CONTROL in the WAL
 * directory), after the 64-byte header pmemwal/control.py writes and checks.  It is a
 * cache of what the segments say: the first process to open the WAL rebuilds it by
 * recovery, and nothing here is read when no process has the WAL open.
 *
 * A process is alive while it holds an OFD write lock on byte WAL_CTL_LIVENESS + i of the
 * control file (i: its entry in procs); the kernel drops the lock when it dies, however it
 * dies, so a process that can take the lock knows the owner is dead and is the one to
 * clean up after it (wal_reap).  Its token in lock words and slot owners is i + 1.
 */
typedef struct wal_shared {
    uint8_t header[WAL_CTL_HEADER]; /* magic, version, WAL id, segment size, archive: control.py */
    uint32_t nslots;
    _Atomic uint32_t persist;       /* enum wal_persist + 1, as the first process chose; 0: none yet */

    /* reservation: a spinlock (holder's token, and WAL_LOCK_WAITERS while a waiter sleeps
     * on it: a futex) around two integers and the holder's slot, all in one cache line */
    _Alignas(64) _Atomic uint32_t insert_lock;
    uint32_t holder_slot;    /* the slot the reservation lock's holder fills, or none */
    _Atomic uint64_t cur_u;  /* next free usable position: read without the lock */
    uint64_t prev_u;         /* usable position of the last reserved record */

    _Alignas(64) _Atomic uint64_t flushed_u; /* durable below; a record boundary */
    _Atomic uint64_t written_u;              /* buffered: handed to the OS below */
    _Alignas(64) _Atomic uint64_t reaped;    /* dead processes cleaned up after */
    _Atomic uint64_t oldest_segno;           /* shared: segments below were truncated */
    _Atomic uint64_t counters[WAL_CTL_COUNTERS]; /* the Python side's (segments made, ...) */
    wal_proc procs[WAL_MAX_PROCS];

    wal_slot slots[WAL_MAX_SLOTS];
} wal_shared;

typedef struct wal_core {
    wal_geom geom;
    int direct;
    enum wal_persist persist;
    void (*pmem_flush)(const void *, size_t); /* pmem: libpmem's cache-line flush */
    void (*pmem_drain)(void);                 /* pmem: libpmem's fence */
    uint64_t stream_min;     /* pmem: payload pieces this large bypass the cache (fused CRC +
                                NT copy), and so do their records' headers; WAL_NT_NEVER: none */
    /* set by the background writer's thread while appenders read them (relaxed) */
    _Atomic int notify_fd;   /* eventfd written when an insertion enters a new segment ... */
    _Atomic uint32_t notify_ahead; /* ... and it or one of this many after it is not attached */
    _Atomic int notify_first; /* ... or it is the first insertion since set_notify */
    _Atomic uint64_t notify_mark; /* ... or it passes this usable position (once; 0: none) */
    uint8_t *ring;           /* buffered: WAL buffer pages, indexed by physical page */
    uint64_t ring_pages;
    uint32_t nslots;
    uint64_t max_record;
    _Atomic int error;       /* sticky negative errno: this process's writer stopped */
    _Atomic int failing;     /* claimed by the first failure: it sets error_what, then error */
    char error_what[64];     /* what failed: written before error is published */
    _Atomic int closed;      /* read by every insertion and commit (stopped) */
    int forked;              /* a child's copy after fork(): touches nothing shared */

    wal_progress *progress;  /* the FOLLOW file's progress lines, or NULL: set before appends */
    wal_shared *sh;          /* &own, or the control file's mapping (shared) */
    uint32_t token;          /* this process's token: 1, or its entry + 1 (shared) */
    wal_proc *me;            /* its entry: its counters */
    int shared;
    int ctl_fd;              /* shared: the control file, for the liveness locks */
    pthread_mutex_t reap_lock; /* one thread of this process cleans up after the dead */

    /* one writer/flusher at a time (this process).  Its holder may take the GIL (a segment
     * to attach: need_segment), so nobody waits for it holding the GIL (will_wait first). */
    pthread_mutex_t write_lock;
    /* serial insertion (seed 004's "before"): one insertion at a time, reserving, checksum
     * and copy all under this lock, as WALInsertLock did before parallel insertion */
    int serial;
    pthread_mutex_t serial_lock;
    wal_fault fault;                          /* test hook, under write_lock */

    /* a shared WAL's calls that read the state outside a slot (flushes, reaps, the position):
     * its close waits for them (leave_shared).  A line of its own: flushes of every thread
     * write it, and closed, which every insertion reads, must not bounce with it. */
    _Alignas(64) _Atomic uint32_t calls;
    char calls_line[60];

    wal_seg_entry segs[WAL_SEG_TABLE];
    wal_shared own;                           /* one process's WAL: its shared state */
} wal_core;

int wal_core_init(wal_core *c, uint64_t seg_size, uint32_t wal_id_lo, int direct,
                  uint64_t ring_bytes, uint8_t *ring, uint32_t nslots, uint64_t max_record);
void wal_core_destroy(wal_core *c);

/* wal_set_position -- where appending resumes (after recovery); lsns are LSNs. */
int wal_set_position(wal_core *c, uint64_t insert_lsn, uint64_t prev_lsn);
/* stream_min: in pmem mode, payload pieces of at least this many bytes are stored with
 * non-temporal stores where the CPU has them (WAL_NT_NEVER: never), the rest through the
 * cache and flushed. */
void wal_set_persist(wal_core *c, enum wal_persist p, void (*pmem_flush)(const void *, size_t),
                     void (*pmem_drain)(void), uint64_t stream_min);

void wal_attach(wal_core *c, uint64_t segno, uint8_t *base, int fd);
void wal_detach(wal_core *c, uint64_t segno);

/* wal_insert -- append n records as one reservation; their LSNs go to lsns.  Record i's
 * payload is bufs[i] (lens[i] bytes), after heads[i] (head_lens[i] bytes, a multiple of 8:
 * -EINVAL otherwise) when heads is not NULL: a layer's header and its caller's payload
 * become one record without being copied together first. */
int wal_insert(wal_core *c, const wal_env *env, const void *const *heads,
               const uint64_t *head_lens, const void *const *bufs, const uint64_t *lens,
               size_t n, uint64_t *lsns);

/* wal_flush -- make durable every record whose LSN is <= upto_lsn (UINT64_MAX: all;
 * WAL_FLUSH_READY: all whose insertion is complete, waiting for none in progress). */
#define WAL_FLUSH_READY (UINT64_MAX - 1) /* not 8-aligned: never a record's LSN */
int wal_flush(wal_core *c, const wal_env *env, uint64_t upto_lsn, uint64_t *flushed_lsn);

/* wal_commit -- wal_flush(lsn) for the record at lsn, of size stream bytes (wal_rec_size),
 * just appended by the caller: what an append with flush does.  In pmem mode the flushed
 * position moves to the record's end, read from nothing another writer changes. */
int wal_commit(wal_core *c, const wal_env *env, uint64_t lsn, uint64_t size, uint64_t *flushed_lsn);

/* wal_stop -- stop the writer from outside (err: a negative errno; what: why), as a
 * failed write would: every later append and flush is refused.  Returns the error
 * that stopped it (an earlier one wins). */
int wal_stop(wal_core *c, int err, const char *what);

/* wal_inject_fault -- a test hook: the next calls of op fail (see wal_fault); count 0 clears. */
void wal_inject_fault(wal_core *c, enum wal_op op, int err, uint64_t after, uint64_t count);

/* wal_share -- use the control file's state (mem, mapped from fd) instead of this
 * process's own, and register this process in it.  init: the first opener, which
 * rebuilds it (then sets the position); else it must already be set up.  Returns
 * 0, -EUSERS when every process entry is taken, or a negative errno. */
int wal_share(wal_core *c, wal_shared *mem, int fd, int init);

/* wal_agree_persist -- a shared WAL: the persist method every process uses, which the
 * first to ask sets to `wanted` (a process persisting by cache flush next to one using
 * msync would move the flushed position past records the other has not synced yet). */
enum wal_persist wal_agree_persist(wal_core *c, enum wal_persist wanted);

/* wal_reap_dead -- clean up after every registered process that died: close the
 * ranges its insertions left open (void records), free its slots and its entry.
 * Waiters do this themselves when they wait long; returns how many were reaped. */
int wal_reap_dead(wal_core *c, const wal_env *env);

/* wal_forsake -- in a child after fork(): refuse all work and never touch the
 * shared state the parent's copy owns. */
void wal_forsake(wal_core *c);

/* wal_close -- stop accepting work and wait until none is in progress. */
void wal_close(wal_core *c);

/* wal_position -- the insert position and the last reserved record's LSN (0: none), read
 * together under the reservation lock: a pair a checkpoint can name once everything
 * below the insert position is flushed.  -WAL_ECLOSED once closed. */
int wal_position(wal_core *c, const wal_env *env, uint64_t *insert_lsn, uint64_t *prev_lsn);

uint64_t wal_insert_lsn(wal_core *c);
uint64_t wal_flushed_lsn(wal_core *c);
void wal_get_stats(wal_core *c, wal_stats *s);

#endif
