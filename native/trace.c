/* trace.c -- the hooks of trace.h (PMEMWAL_TRACE builds only; see there). */
#include "trace.h"

#ifdef PMEMWAL_TRACE
#include <stdatomic.h>

static trace_stream_fn on_stream;
static trace_fence_fn on_fence;
static trace_sync_fn on_sync;
static atomic_int mutated;

/* this thread's run of streaming stores not handed over yet: [run_lo, run_hi) */
static __thread uintptr_t run_lo, run_hi;

void trace_set(trace_stream_fn stream, trace_fence_fn fence, trace_sync_fn sync, int mutations)
{
    run_lo = run_hi = 0;
    on_stream = stream;
    on_fence = fence;
    on_sync = sync;
    atomic_store(&mutated, mutations);
}

void trace_hand_over(void)
{
    if (run_hi > run_lo && on_stream)
        on_stream(run_lo, run_hi - run_lo);
    run_lo = run_hi = 0;
}

void trace_stream(const void *dst, size_t len)
{
    uintptr_t a = (uintptr_t)dst;
    if (a != run_hi || run_hi == run_lo) {
        trace_hand_over();
        run_lo = a;
    }
    run_hi = a + len;
}

void trace_fence(void)
{
    trace_hand_over();
    if (on_fence)
        on_fence();
}

void trace_sync(int kind, int fd, uintptr_t addr_or_off, size_t len)
{
    if (on_sync)
        on_sync(kind, fd, addr_or_off, len);
}

void trace_forget(void)
{
    run_lo = run_hi = 0;
}

int trace_mutated(int mutation)
{
    return (atomic_load_explicit(&mutated, memory_order_relaxed) & mutation) != 0;
}
#endif
