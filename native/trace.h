/*
 * trace.h -- what the power-loss simulator must see of the core's persistence
 * (pmemwal.tools.powerloss): every streaming store, every fence of its own, every
 * sync of a file or range.  Compiled in only with -DPMEMWAL_TRACE (the extension
 * pmemwal._core_traced, see setup.py); otherwise each hook is an empty inline and
 * the production core is unchanged.
 *
 * Streaming stores go to the hook as runs: a thread's stores that continue where
 * its last one ended extend that run, so a 1 MiB record costs one call, not 2^17.
 * A run is handed over before the thread's next flush or fence (the core's own
 * sfence, or pmem_drain, an sfence where libpmem's flush instruction needs one), so
 * the simulator holds it pending until that fence as pmemcheck does.  Mutations (trace_mutated) put known
 * persistence bugs back, so that tests can show the simulator catching each.
 */
#ifndef PMEMWAL_TRACE_H
#define PMEMWAL_TRACE_H

#include <stddef.h>
#include <stdint.h>

enum trace_sync_kind {
    TRACE_FDATASYNC = 0, /* fdatasync or fsync of fd: the whole file */
    TRACE_MSYNC = 1,     /* msync of [addr, addr + len) */
    TRACE_DSYNC_WRITE = 2, /* pwrite of len bytes at off to an O_DSYNC fd, returned */
};

enum trace_mutation {          /* bits of trace_set's mutations */
    TRACE_SKIP_STREAM_FENCE = 1, /* no sfence after streaming stores (issue 27's hole 1) */
    TRACE_SKIP_DRAIN = 2,        /* neither pmem_drain nor the sfence after an insertion */
    TRACE_SKIP_SYNC = 4,         /* no fdatasync, fsync or msync of a segment */
    TRACE_SHORT_MSYNC = 8,       /* msync leaves out the range's last page */
    TRACE_SYNC_OWN_RECORD = 16,  /* a commit syncs up to its own record's end, yet publishes
                                  * the frontier as flushed (only concurrent writers differ) */
    TRACE_PUBLISH_EARLY = 32,    /* page cache: a flush publishes its frontier to followers
                                  * before its msync or fdatasync (acknowledged after it) */
};

typedef void (*trace_stream_fn)(uintptr_t addr, size_t len);
typedef void (*trace_fence_fn)(void);
typedef void (*trace_sync_fn)(int kind, int fd, uintptr_t addr_or_off, size_t len);

#ifdef PMEMWAL_TRACE
void trace_set(trace_stream_fn stream, trace_fence_fn fence, trace_sync_fn sync, int mutations);
void trace_stream(const void *dst, size_t len);
void trace_fence(void);
void trace_hand_over(void); /* this thread's run to the simulator now (before a flush or drain) */
void trace_sync(int kind, int fd, uintptr_t addr_or_off, size_t len);
int trace_mutated(int mutation);
void trace_forget(void); /* this thread's run, dropped (its process died mid-insert) */
#else
static inline void trace_stream(const void *dst, size_t len) { (void)dst; (void)len; }
static inline void trace_fence(void) {}
static inline void trace_hand_over(void) {}
static inline void trace_sync(int kind, int fd, uintptr_t a, size_t len)
{
    (void)kind; (void)fd; (void)a; (void)len;
}
static inline int trace_mutated(int mutation) { (void)mutation; return 0; }
static inline void trace_forget(void) {}
#endif

#endif
