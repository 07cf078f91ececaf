/*
 * module_follow.c -- the binding of wal_follow.c: the FOLLOW file's progress lines, read and
 * written through a mapping of the whole file (pmemwal/follow_file.py) by readers and by the
 * Python side of writers (the core itself publishes flushes: Core.set_progress).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdatomic.h>

#include "module.h"
#include "wal_follow.h"

/* SIGNAL_NAP_NS -- how long the thread that runs Python's signal handlers sleeps at most: a
 * signal that lands between its last check and the futex wait does not interrupt the wait,
 * so Ctrl-C would otherwise go unseen until a record came. */
#define SIGNAL_NAP_NS 50000000ull

/* progress_of -- the progress lines of a FOLLOW mapping; NULL with an exception. */
static wal_progress *progress_of(Py_buffer *view, PyObject *mapping, int writable)
{
    if (PyObject_GetBuffer(mapping, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return NULL;
    if ((size_t)view->len < WAL_PROGRESS_OFFSET + sizeof(wal_progress) ||
        (uintptr_t)view->buf % 64) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "not a mapping of a FOLLOW file");
        return NULL;
    }
    return (wal_progress *)((char *)view->buf + WAL_PROGRESS_OFFSET);
}

/* until -- the deadline of a wait of timeout seconds (None, inf or beyond 2**63 ns: never);
 * UINT64_MAX - 1 with an exception set for what is no number of seconds. */
static uint64_t until(PyObject *timeout)
{
    if (timeout == Py_None)
        return UINT64_MAX;
    double seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred())
        return UINT64_MAX - 1;
    if (!(seconds < 9.2e9)) /* (inf, and NaN: never; the ns would overflow) */
        return UINT64_MAX;
    return wal_now_ns() + (seconds > 0 ? (uint64_t)(seconds * 1e9) : 0);
}

/* progress_wait(mapping, after, timeout, spin_ns, sleeper) -> (durable_lsn, spin_ns, status):
 * wait without the GIL until the durable LSN passes after (status 0), timeout seconds (None:
 * never) pass (1), or a wake that did not move it (2: a truncation, or another thread's close;
 * the caller looks, and calls again).  Signal handlers run between sleeps (an exception they
 * raise comes out of here).  spin_ns: how long to spin first; the next call's comes back.
 * sleeper: the caller's sleeper slot (0..63), whose bit it sets while it sleeps. */
PyObject *follow_wait(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *mapping, *timeout;
    unsigned long long after;
    unsigned int spin_ns, sleeper;
    if (!PyArg_ParseTuple(args, "OKOII", &mapping, &after, &timeout, &spin_ns, &sleeper))
        return NULL;
    if (sleeper >= 64)
        return PyErr_Format(PyExc_ValueError, "sleeper slot %u: 0..63", sleeper);
    uint64_t deadline = until(timeout);
    if (deadline == UINT64_MAX - 1)
        return NULL;
    if (spin_ns > WAL_SPIN_MAX)
        spin_ns = WAL_SPIN_MAX;
    Py_buffer view;
    wal_progress *p = progress_of(&view, mapping, 1);
    if (!p)
        return NULL;
    uint64_t durable = atomic_load_explicit(&p->durable_lsn, memory_order_acquire);
    uint64_t nap = pmemwal_main_thread() ? SIGNAL_NAP_NS : 0;
    int rc = 0;
    while (durable <= after) { /* (the GIL is kept when there is no need to wait) */
        Py_BEGIN_ALLOW_THREADS
        rc = wal_await(p, after, deadline, nap, &spin_ns, 1ull << sleeper, &durable);
        Py_END_ALLOW_THREADS
        if (rc != -EINTR)
            break;
        if (PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("KIi", (unsigned long long)durable, spin_ns,
                         !rc ? 0 : rc == -ETIMEDOUT ? 1 : 2);
}

/* progress_publish(mapping, lsn, reset=False) */
PyObject *follow_publish(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *mapping;
    unsigned long long lsn;
    int reset = 0;
    if (!PyArg_ParseTuple(args, "OK|p", &mapping, &lsn, &reset))
        return NULL;
    Py_buffer view;
    wal_progress *p = progress_of(&view, mapping, 1);
    if (!p)
        return NULL;
    (reset ? wal_publish_reset : wal_publish)(p, lsn);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* progress_wake(mapping) */
PyObject *follow_wake(PyObject *m, PyObject *mapping)
{
    (void)m;
    Py_buffer view;
    wal_progress *p = progress_of(&view, mapping, 1);
    if (!p)
        return NULL;
    wal_wake(p);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* atomic_u64(mapping, offset, value=None, op=0) -> the value before: an atomic load (value
 * None), or store (op 0), raise to at least value (1), AND (2) or OR (3), of the 8-byte
 * aligned word at offset: the FOLLOW file's fields that processes read while others write. */
PyObject *follow_atomic_u64(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *mapping, *value = Py_None;
    Py_ssize_t offset;
    int op = 0;
    if (!PyArg_ParseTuple(args, "On|Oi", &mapping, &offset, &value, &op))
        return NULL;
    unsigned long long v = 0;
    if (value != Py_None && (v = PyLong_AsUnsignedLongLong(value)) == (unsigned long long)-1 &&
        PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mapping, &view, value == Py_None ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0)
        return NULL;
    if (offset < 0 || offset % 8 || offset + 8 > view.len || (uintptr_t)view.buf % 8 ||
        op < 0 || op > 3) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "atomic_u64: offset %zd, op %d", offset, op);
    }
    _Atomic uint64_t *word = (_Atomic uint64_t *)((char *)view.buf + offset);
    uint64_t was = atomic_load(word);
    if (value == Py_None)
        ;
    else if (op == 0)
        was = atomic_exchange(word, v);
    else if (op == 1)
        while (was < v && !atomic_compare_exchange_weak(word, &was, v))
            ;
    else if (op == 2)
        was = atomic_fetch_and(word, v);
    else
        was = atomic_fetch_or(word, v);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(was);
}
