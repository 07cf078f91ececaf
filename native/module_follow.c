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

/* progress_wait(mapping, after, timeout, spin_ns) -> (durable_lsn, spin_ns, moved): wait
 * without the GIL until the durable LSN passes after (moved: True) or timeout seconds (None:
 * never) pass (moved: False); signal handlers run between sleeps (an exception they raise
 * comes out of here).  spin_ns: how long to spin first; the next call's comes back. */
PyObject *follow_wait(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *mapping, *timeout;
    unsigned long long after;
    unsigned int spin_ns;
    if (!PyArg_ParseTuple(args, "OKOI", &mapping, &after, &timeout, &spin_ns))
        return NULL;
    uint64_t until = UINT64_MAX;
    if (timeout != Py_None) {
        double seconds = PyFloat_AsDouble(timeout);
        if (seconds == -1.0 && PyErr_Occurred())
            return NULL;
        until = wal_now_ns() + (seconds > 0 ? (uint64_t)(seconds * 1e9) : 0);
    }
    if (spin_ns > WAL_SPIN_MAX)
        spin_ns = WAL_SPIN_MAX;
    Py_buffer view;
    wal_progress *p = progress_of(&view, mapping, 0);
    if (!p)
        return NULL;
    uint64_t durable = atomic_load_explicit(&p->durable_lsn, memory_order_acquire);
    int rc = 0;
    while (durable <= after) { /* (the GIL is kept when there is no need to wait) */
        Py_BEGIN_ALLOW_THREADS
        rc = wal_await(p, after, until, &spin_ns, &durable);
        Py_END_ALLOW_THREADS
        if (rc != -EINTR)
            break;
        if (PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("KIO", (unsigned long long)durable, spin_ns, rc ? Py_False : Py_True);
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

/* atomic_u64(mapping, offset, value=None, raise_to=False) -> the value before: an atomic
 * load (value None), store, or raise to at least value (raise_to), of the 8-byte aligned
 * word at offset.  The FOLLOW file's fields that processes read while others write them. */
PyObject *follow_atomic_u64(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *mapping, *value = Py_None;
    Py_ssize_t offset;
    int raise_to = 0;
    if (!PyArg_ParseTuple(args, "On|Op", &mapping, &offset, &value, &raise_to))
        return NULL;
    unsigned long long v = 0;
    if (value != Py_None && (v = PyLong_AsUnsignedLongLong(value)) == (unsigned long long)-1 &&
        PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mapping, &view, value == Py_None ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0)
        return NULL;
    if (offset < 0 || offset % 8 || offset + 8 > view.len || (uintptr_t)view.buf % 8) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "atomic_u64: offset %zd", offset);
    }
    _Atomic uint64_t *word = (_Atomic uint64_t *)((char *)view.buf + offset);
    uint64_t was = atomic_load(word);
    if (value != Py_None && !raise_to)
        was = atomic_exchange(word, v);
    else if (value != Py_None)
        while (was < v && !atomic_compare_exchange_weak(word, &was, v))
            ;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(was);
}
