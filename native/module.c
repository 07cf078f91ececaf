/*
 * module.c -- pmemwal._core: the thin binding between Python and the C core.
 *
 * Only buffers and integers cross it.  An append or flush starts holding the
 * GIL when its records are smaller than gil_release_size (giving the GIL up
 * and taking it back would cost more than inserting them, and two threads
 * handing it over for every record run slower than one) and gives it up at
 * the core's first wait or system call (wal_env.will_wait), so it never waits
 * for a thread that needs the GIL; larger appends give it up before copying.
 * When the core needs a segment it does not have, it calls back into Python
 * (the WAL's _segment_needed) with the GIL taken, and an exception raised
 * there is carried back to the caller.  C returns negative errnos; this file
 * turns them into pmemwal.errors exceptions.
 *
 * This file has the module and the Core type (the writer, wal_core.h); the Reader
 * type (the record reader, wal_reader.h) is in module_reader.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "module.h"
#include "module_reader.h"
#include "trace.h"
#include "wal_core.h"
#include "wal_reader.h"

/* ---- errors ---------------------------------------------------------------- */

static PyObject *error_class(const char *name)
{
    PyObject *mod = PyImport_ImportModule("pmemwal.errors");
    if (!mod)
        return NULL;
    PyObject *cls = PyObject_GetAttrString(mod, name);
    Py_DECREF(mod);
    return cls;
}

static PyObject *raise_named(const char *name, PyObject *args)
{
    PyObject *cls = error_class(name);
    if (cls && args)
        PyErr_SetObject(cls, args);
    Py_XDECREF(cls);
    Py_XDECREF(args);
    return NULL;
}

/* call_ctx -- one call's environment: an exception raised in the segment callback,
 * and the GIL, held until the core first waits (or given up up front). */
typedef struct call_ctx {
    PyObject *callback;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyThreadState *released; /* the GIL was given up: the state to restore; NULL: held */
    int32_t stalled_pid;     /* a wait gave up (-ETIMEDOUT): the writer it waited for */
    uint64_t wait_ns;        /* ... after this many ns */
    int gil_free;            /* the payload is large: the core call starts without the GIL */
    uint64_t poll_at;        /* when a wait of the main thread gives up next (interrupted) */
    wal_patience patience;   /* the core's timer: kept across the call's retries */
} call_ctx;

/* release_gil -- wal_env.will_wait: let other Python threads run while the core waits. */
static void release_gil(void *ctx)
{
    call_ctx *cc = ctx;
    if (!cc->released)
        cc->released = PyEval_SaveThread();
}

static void regain_gil(call_ctx *cc)
{
    if (cc->released) {
        PyEval_RestoreThread(cc->released);
        cc->released = NULL;
    }
}

/* keep_exception -- the first exception raised in a callback, for raise_rc. */
static void keep_exception(call_ctx *cc)
{
    if (!cc->exc_type)
        PyErr_Fetch(&cc->exc_type, &cc->exc_value, &cc->exc_tb);
    else
        PyErr_Clear();
}

/* main_thread -- the thread that runs Python's signal handlers (set at import). */
static unsigned long main_thread;

int pmemwal_main_thread(void)
{
    return PyThread_get_thread_ident() == main_thread;
}

/* SIGNAL_POLL_NS -- how often a wait of the main thread gives up, so that the call can run
 * the signal handlers (a Ctrl-C's KeyboardInterrupt) outside the core: the first check of
 * the call's wait (a few ms into it), then every SIGNAL_POLL_NS. */
#define SIGNAL_POLL_NS 50000000ull

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* interrupted -- wal_env.interrupted, from a wait the call may give up (nothing reserved,
 * or a flush), perhaps holding write_lock: whether to give up now so that the handlers run
 * (retry_call).  It runs none itself and takes no GIL: a handler run inside the core would
 * run while the call holds what the handler may wait for (a wal.close() in it would wait
 * for the call's slot or its flush; a wal.flush(), for write_lock).  Python has no call
 * that tells whether a signal is pending without running its handler: the main thread's
 * wait gives up at a pace instead, and only it (handlers run nowhere else). */
static int interrupted(void *ctx)
{
    call_ctx *cc = ctx;
    if (PyThread_get_thread_ident() != main_thread)
        return 0;
    uint64_t now = monotonic_ns();
    if (now < cc->poll_at)
        return 0;
    cc->poll_at = now + SIGNAL_POLL_NS;
    return 1;
}

/* retry_call -- after a core call returned rc: whether to call it again.  -EINTR (it gave
 * up for the signal handlers, holding nothing now): run them with the GIL; one that raised
 * ends the call with its exception, else the call goes on where it was (the timer kept). */
static int retry_call(call_ctx *cc, int rc)
{
    if (rc != -EINTR)
        return 0;
    regain_gil(cc);
    if (PyErr_CheckSignals() < 0) {
        keep_exception(cc);
        return 0;
    }
    if (cc->gil_free)
        release_gil(cc);
    return 1;
}

static PyObject *raise_stopped(const char *fmt, int err, const char *what)
{
    return raise_named("WriterStoppedError",
                       Py_BuildValue("(iN)", err, PyUnicode_FromFormat(fmt, what, strerror(err))));
}

/* raise_rc -- the exception for a core return code.  An error that stopped the
 * writer (this call's, or an earlier one's: WAL_ESTOPPED) is a WriterStoppedError
 * with the errno and what failed. */
static PyObject *raise_rc(wal_core *core, int rc, call_ctx *cc)
{
    if (cc && cc->exc_type) {
        PyErr_Restore(cc->exc_type, cc->exc_value, cc->exc_tb);
        return NULL;
    }
    if (rc == -WAL_ECLOSED && core->forked)
        return raise_named("ClosedError", Py_BuildValue("(s)", "the WAL was opened before fork(): "
                                                        "a child process opens it again"));
    if (rc == -WAL_ECLOSED)
        return raise_named("ClosedError", Py_BuildValue("(s)", "the WAL is closed"));
    if (rc == -EMSGSIZE)
        return raise_named("RecordTooLargeError",
                           PyUnicode_FromFormat("record exceeds max_record_size (%llu bytes)",
                                                (unsigned long long)core->max_record));
    if (rc == -EINVAL)
        return PyErr_Format(PyExc_ValueError, "invalid argument");
    if (rc == -ETIMEDOUT && cc) {
        char msg[320];
        if (cc->stalled_pid == (int32_t)getpid())
            snprintf(msg, sizeof(msg), "waited %.3g s for an insertion or the reservation lock "
                     "held by another thread of this process (pid %d), which made no progress: "
                     "gave up (wait_timeout)", (double)cc->wait_ns / 1e9, (int)cc->stalled_pid);
        else
            snprintf(msg, sizeof(msg), "waited %.3g s for the writer with pid %d, which holds an "
                     "insertion or the reservation lock and made no progress (stopped, paused, "
                     "or in a debugger): gave up (wait_timeout)",
                     (double)cc->wait_ns / 1e9, (int)cc->stalled_pid);
        return raise_named("StalledWriterError", Py_BuildValue("(is)", (int)cc->stalled_pid, msg));
    }
    int stop = -atomic_load(&core->error);
    if (rc == -WAL_ESTOPPED)
        return raise_stopped("the writer stopped after an earlier error: %s (%s); "
                             "reopen the WAL to append again", stop, core->error_what);
    if (stop)
        return raise_stopped("%s (%s); the writer stopped: reopen the WAL to append again",
                             -rc, core->error_what);
    return raise_named("StorageError", Py_BuildValue("(is)", -rc, strerror(-rc)));
}

/* ---- Core ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    wal_core *core;
    PyObject *segment_cb;
    uint64_t gil_release_size; /* appends of this many payload bytes give up the GIL first */
    uint64_t wait_ns;          /* a wait for one writer gives up after this long; 0: never */
    Py_buffer ring;
    Py_buffer control;              /* shared: the control file's mapping */
    void *progress_map;             /* the core's own mapping of the FOLLOW file ... */
    size_t progress_len;            /* ... and its length (readers in other processes) */
    Py_buffer views[WAL_SEG_TABLE]; /* direct: the attached mappings */
    char has_view[WAL_SEG_TABLE];
} CoreObject;

static int need_segment(void *ctx, uint64_t segno)
{
    call_ctx *cc = ctx;
    PyGILState_STATE st = PyGILState_Ensure();
    int rc = 0;
    PyObject *r = PyObject_CallFunction(cc->callback, "K", (unsigned long long)segno);
    if (r) {
        Py_DECREF(r);
    } else {
        keep_exception(cc);
        rc = -EIO;
    }
    PyGILState_Release(st);
    return rc;
}

static int Core_init(CoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"segment_size", "wal_id_lo", "direct", "ring", "insert_slots",
                             "max_record_size", "segment_callback", "gil_release_size", NULL};
    unsigned long long seg_size, max_record, gil_release_size = 0;
    unsigned int wal_id_lo, nslots;
    int direct;
    PyObject *ring, *cb;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KIpOIKO|K", kwlist, &seg_size, &wal_id_lo,
                                     &direct, &ring, &nslots, &max_record, &cb, &gil_release_size))
        return -1;
    if (self->core) {
        PyErr_SetString(PyExc_RuntimeError, "Core is initialised once");
        return -1;
    }
    if (!direct && PyObject_GetBuffer(ring, &self->ring, PyBUF_WRITABLE) < 0)
        return -1;
    void *mem = NULL; /* aligned as its cache-line fields want (calls, the shared state) */
    if (posix_memalign(&mem, 64, sizeof(wal_core))) {
        PyErr_NoMemory();
        return -1;
    }
    self->core = memset(mem, 0, sizeof(wal_core));
    int rc = wal_core_init(self->core, seg_size, wal_id_lo, direct,
                           direct ? 0 : (uint64_t)self->ring.len,
                           direct ? NULL : self->ring.buf, nslots, max_record);
    if (rc) {
        PyErr_Format(PyExc_ValueError, "invalid core parameters (%s)", strerror(-rc));
        return -1;
    }
    Py_INCREF(cb);
    self->segment_cb = cb;
    self->gil_release_size = gil_release_size;
    return 0;
}

static void release_views(CoreObject *self)
{
    for (int i = 0; i < WAL_SEG_TABLE; i++)
        if (self->has_view[i]) {
            PyBuffer_Release(&self->views[i]);
            self->has_view[i] = 0;
        }
}

static void Core_dealloc(CoreObject *self)
{
    if (self->core) {
        Py_BEGIN_ALLOW_THREADS
        wal_close(self->core);
        Py_END_ALLOW_THREADS
        wal_core_destroy(self->core);
        free(self->core);
    }
    release_views(self);
    if (self->ring.obj)
        PyBuffer_Release(&self->ring);
    if (self->control.obj)
        PyBuffer_Release(&self->control);
    if (self->progress_map)
        munmap(self->progress_map, self->progress_len);
    Py_XDECREF(self->segment_cb);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* CORE_ENV -- a core call's environment, holding the GIL; `bytes` of payload to copy
 * at least gil_release_size give it up at once. */
#define CORE_ENV(cc, bytes) \
    call_ctx cc = {self->segment_cb, NULL, NULL, NULL, NULL, 0, self->wait_ns, \
                   (uint64_t)(bytes) >= self->gil_release_size, 0, {0, 0, 0}}; \
    wal_env env = {need_segment, release_gil, &cc, 0, interrupted, self->wait_ns, \
                   &cc.stalled_pid, &cc.patience}; \
    if (cc.gil_free) \
        release_gil(&cc)

static PyObject *Core_set_position(CoreObject *self, PyObject *args)
{
    unsigned long long insert_lsn, prev_lsn;
    if (!PyArg_ParseTuple(args, "KK", &insert_lsn, &prev_lsn))
        return NULL;
    if (wal_set_position(self->core, insert_lsn, prev_lsn))
        return PyErr_Format(PyExc_ValueError, "bad position %llu (prev %llu)", insert_lsn, prev_lsn);
    Py_RETURN_NONE;
}

static PyObject *Core_set_persist(CoreObject *self, PyObject *args)
{
    int kind;
    unsigned long long flush = 0, drain = 0, stream_min = WAL_NT_MIN;
    if (!PyArg_ParseTuple(args, "i|KKK", &kind, &flush, &drain, &stream_min))
        return NULL;
    if (kind < WAL_PERSIST_PMEM || kind > WAL_PERSIST_DSYNC ||
        (kind == WAL_PERSIST_PMEM && !(flush && drain)) ||
        (kind <= WAL_PERSIST_MSYNC) != (self->core->direct != 0))
        return PyErr_Format(PyExc_ValueError, "persist method %d does not fit this mode", kind);
    wal_set_persist(self->core, (enum wal_persist)kind,
                    (void (*)(const void *, size_t))(uintptr_t)flush,
                    (void (*)(void))(uintptr_t)drain, stream_min);
    Py_RETURN_NONE;
}

/* set_notify(fd, ahead=0, mark=0) -- an eventfd the core writes to when insertion enters a
 * new segment (or inserts for the first time since a new fd), or passes the LSN `mark` (once;
 * 0: none), while that segment or one of the `ahead` after it is not attached. */
static PyObject *Core_set_notify(CoreObject *self, PyObject *args)
{
    int fd;
    unsigned int ahead = 0;
    unsigned long long mark = 0;
    if (!PyArg_ParseTuple(args, "i|IK", &fd, &ahead, &mark))
        return NULL;
    if (ahead >= WAL_SEG_TABLE / 2) /* attaching that far ahead would evict the current one */
        return PyErr_Format(PyExc_ValueError, "set_notify: %u segments ahead (at most %d)",
                            ahead, WAL_SEG_TABLE / 2 - 1);
    int64_t mark_u = mark ? wal_usable(&self->core->geom, mark) : 0;
    if (mark_u < 0)
        return PyErr_Format(PyExc_ValueError, "set_notify: mark %llu lies in a header", mark);
    atomic_store(&self->core->notify_ahead, ahead);
    atomic_store(&self->core->notify_mark, (uint64_t)mark_u);
    if (fd != atomic_load(&self->core->notify_fd))
        atomic_store(&self->core->notify_first, 1);
    atomic_store(&self->core->notify_fd, fd);
    Py_RETURN_NONE;
}

/* set_wait_timeout(seconds) -- how long a wait the caller may give up (for a slot, the
 * reservation lock, insertions in a flush) waits for one writer: then StalledWriterError.
 * 0: forever. */
static PyObject *Core_set_wait_timeout(CoreObject *self, PyObject *args)
{
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds))
        return NULL;
    if (!(seconds >= 0 && seconds < 1e9))
        return PyErr_Format(PyExc_ValueError, "wait timeout: seconds, 0 or more");
    self->wait_ns = (uint64_t)(seconds * 1e9);
    Py_RETURN_NONE;
}

/* set_serial(on) -- one insertion at a time (reserve, checksum, copy under one lock). */
static PyObject *Core_set_serial(CoreObject *self, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
    self->core->serial = on;
    Py_RETURN_NONE;
}

static PyObject *Core_attach(CoreObject *self, PyObject *args)
{
    unsigned long long segno;
    int fd;
    PyObject *mapping;
    if (!PyArg_ParseTuple(args, "KiO", &segno, &fd, &mapping))
        return NULL;
    int i = (int)(segno % WAL_SEG_TABLE);
    Py_buffer view = {0};
    if (self->core->direct) {
        if (PyObject_GetBuffer(mapping, &view, PyBUF_WRITABLE) < 0)
            return NULL;
        if ((uint64_t)view.len < self->core->geom.seg_size) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "mapping shorter than a segment");
        }
    }
    wal_attach(self->core, segno, view.buf, fd);
    if (self->has_view[i])
        PyBuffer_Release(&self->views[i]);
    self->views[i] = view;
    self->has_view[i] = self->core->direct;
    Py_RETURN_NONE;
}

static PyObject *Core_detach(CoreObject *self, PyObject *args)
{
    unsigned long long segno;
    if (!PyArg_ParseTuple(args, "K", &segno))
        return NULL;
    int i = (int)(segno % WAL_SEG_TABLE);
    if (atomic_load(&self->core->segs[i].tag) != segno + 1)
        Py_RETURN_NONE;
    wal_detach(self->core, segno);
    if (self->has_view[i]) {
        PyBuffer_Release(&self->views[i]);
        self->has_view[i] = 0;
    }
    Py_RETURN_NONE;
}

static int get_record(PyObject *obj, Py_buffer *view, Py_ssize_t index)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) == 0)
        return 0;
    PyErr_Clear();
    if (index < 0)
        PyErr_Format(PyExc_TypeError, "a bytes-like object is required, not '%.100s'",
                     Py_TYPE(obj)->tp_name);
    else
        PyErr_Format(PyExc_TypeError, "record %zd: a bytes-like object is required, not '%.100s'",
                     index, Py_TYPE(obj)->tp_name);
    return -1;
}

/* parse_flush_flag -- the optional "flush" argument, positional or keyword. */
static int parse_flush_flag(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int *flush)
{
    PyObject *value = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 1 || nargs > 2 || nkw > 1 || (nkw && nargs > 1)) {
        PyErr_SetString(PyExc_TypeError, "append(data, flush=False)");
        return -1;
    }
    if (nkw) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "flush")) {
            PyErr_SetString(PyExc_TypeError, "append() takes only the keyword 'flush'");
            return -1;
        }
        value = args[nargs];
    }
    *flush = value ? PyObject_IsTrue(value) : 0;
    return *flush < 0 ? -1 : 0;
}

/* name_appended -- the exception of an append whose record was appended and whose flush
 * then failed or was given up (a timeout, a signal): its `lsn` names the record, not
 * known durable, so that the caller can flush it again or look for it. */
static void name_appended(uint64_t lsn)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *n = PyLong_FromUnsignedLongLong(lsn);
    if (!n || PyObject_SetAttrString(value, "lsn", n) < 0)
        PyErr_Clear();
    Py_XDECREF(n);
    PyErr_Restore(type, value, tb);
}

/* append(data, flush=False) -> lsn: one record; with flush, durable before returning. */
static PyObject *Core_append(CoreObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    int flush;
    Py_buffer view;
    if (parse_flush_flag(args, nargs, kwnames, &flush) < 0 || get_record(args[0], &view, -1) < 0)
        return NULL;
    const void *buf = view.buf;
    uint64_t len = (uint64_t)view.len, lsn = 0, flushed;
    CORE_ENV(cc, len);
    int rc;
    do
        rc = wal_insert(self->core, &env, NULL, NULL, &buf, &len, 1, &lsn);
    while (retry_call(&cc, rc));
    int appended = !rc;
    if (!rc && flush) /* appended: only the commit is retried, the record is kept */
        do
            rc = wal_commit(self->core, &env, lsn, wal_rec_size(len), &flushed);
        while (retry_call(&cc, rc));
    regain_gil(&cc);
    PyBuffer_Release(&view);
    if (rc) {
        raise_rc(self->core, rc, &cc);
        if (appended)
            name_appended(lsn);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(lsn);
}

/* append_prefixed(prefix, data) -> lsn: one record whose payload is prefix (a multiple of 8
 * bytes) then data, neither copied together first (pmemwal.log: its header, then an entry). */
static PyObject *Core_append_prefixed(CoreObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append_prefixed(prefix, data)");
        return NULL;
    }
    Py_buffer head, body;
    if (get_record(args[0], &head, -1) < 0)
        return NULL;
    if (head.len % WAL_ALIGN) {
        PyBuffer_Release(&head);
        PyErr_Format(PyExc_ValueError, "append_prefixed: the prefix is %zd bytes, not a multiple "
                     "of %u", head.len, WAL_ALIGN);
        return NULL;
    }
    if (get_record(args[1], &body, -1) < 0) {
        PyBuffer_Release(&head);
        return NULL;
    }
    const void *hbuf = head.buf, *bbuf = body.buf;
    uint64_t hlen = (uint64_t)head.len, blen = (uint64_t)body.len, lsn = 0;
    CORE_ENV(cc, hlen + blen);
    int rc;
    do
        rc = wal_insert(self->core, &env, &hbuf, &hlen, &bbuf, &blen, 1, &lsn);
    while (retry_call(&cc, rc));
    regain_gil(&cc);
    PyBuffer_Release(&head);
    PyBuffer_Release(&body);
    if (rc)
        return raise_rc(self->core, rc, &cc);
    return PyLong_FromUnsignedLongLong(lsn);
}

/* append_many -- one reservation for the whole batch; LSNs come back as bytes of u64. */
static PyObject *Core_append_many(CoreObject *self, PyObject *records)
{
    PyObject *seq = PySequence_Fast(records, "append_many takes a sequence of bytes-like objects");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    Py_buffer *views = PyMem_Malloc((size_t)(n ? n : 1) * (sizeof(Py_buffer) + 2 * sizeof(void *)));
    if (!out || !views)
        goto fail_nomem;
    const void **bufs = (const void **)(views + n);
    uint64_t *lens = (uint64_t *)(bufs + n);
    uint64_t total = 0;
    for (; got < n; got++) {
        if (get_record(PySequence_Fast_GET_ITEM(seq, got), &views[got], got) < 0)
            goto fail;
        bufs[got] = views[got].buf;
        lens[got] = (uint64_t)views[got].len;
        total += lens[got];
    }
    uint64_t *lsns = (uint64_t *)PyBytes_AS_STRING(out);
    CORE_ENV(cc, total);
    int rc;
    do
        rc = wal_insert(self->core, &env, NULL, NULL, bufs, lens, (size_t)n, lsns);
    while (retry_call(&cc, rc));
    regain_gil(&cc);
    if (rc) {
        raise_rc(self->core, rc, &cc);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
fail_nomem:
    PyErr_NoMemory();
fail:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *Core_flush(CoreObject *self, PyObject *args)
{
    PyObject *lsn_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &lsn_obj))
        return NULL;
    uint64_t upto = UINT64_MAX, flushed = 0;
    if (lsn_obj != Py_None) {
        upto = PyLong_AsUnsignedLongLong(lsn_obj);
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return NULL;
            PyErr_Clear();
            return PyErr_Format(PyExc_ValueError, "LSN %R is out of range", lsn_obj);
        }
        if (upto == WAL_FLUSH_READY)
            return PyErr_Format(PyExc_ValueError, "LSN %R is not a record appended so far",
                                lsn_obj);
    }
    CORE_ENV(cc, 0); /* held: a flush that must wait or sync gives it up there */
    int rc;
    do
        rc = wal_flush(self->core, &env, upto, &flushed);
    while (retry_call(&cc, rc));
    regain_gil(&cc);
    if (rc == -EINVAL)
        return PyErr_Format(PyExc_ValueError, "LSN %llu is not a record appended so far",
                            (unsigned long long)upto);
    if (rc)
        return raise_rc(self->core, rc, &cc);
    return PyLong_FromUnsignedLongLong(flushed);
}

/* flush_ready() -> flushed LSN: make durable what is completely inserted, waiting for no
 * insertion in progress (the background writer's flush: appenders that flush their own
 * records are not made to share a core with a flush that spins on them). */
static PyObject *Core_flush_ready(CoreObject *self, PyObject *unused)
{
    (void)unused;
    uint64_t flushed = 0;
    CORE_ENV(cc, 0);
    env.background = 1;
    int rc;
    do
        rc = wal_flush(self->core, &env, WAL_FLUSH_READY, &flushed);
    while (retry_call(&cc, rc));
    regain_gil(&cc);
    if (rc)
        return raise_rc(self->core, rc, &cc);
    return PyLong_FromUnsignedLongLong(flushed);
}

static void let_go_of_progress(CoreObject *self);

static PyObject *Core_close(CoreObject *self, PyObject *unused)
{
    (void)unused;
    atomic_store(&self->core->notify_fd, -1); /* the background writer closes it next */
    Py_BEGIN_ALLOW_THREADS
    wal_close(self->core);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < WAL_SEG_TABLE; i++)
        atomic_store(&self->core->segs[i].tag, 0);
    release_views(self);
    let_go_of_progress(self);
    /* The core reads its own copy from here on, but the control mapping stays exported until
     * dealloc: a thread of this process already inside a call (a flush waiting on a slot)
     * may still read it through a pointer taken before close, and every call holds a
     * reference to the core.  ControlFile.close finds it exported and leaves the unmapping
     * to its last reference. */
    Py_RETURN_NONE;
}

/* share(control, fd, init) -- use the control file's shared state (control: its writable
 * mapping, past the header pmemwal/control.py keeps; fd: the file, for the liveness
 * locks) and register this process in it; init: the first opener, which rebuilds it. */
static PyObject *Core_share(CoreObject *self, PyObject *args)
{
    PyObject *mapping;
    int fd, init;
    if (!PyArg_ParseTuple(args, "Oip", &mapping, &fd, &init))
        return NULL;
    if (self->control.obj || !self->core->direct)
        return PyErr_Format(PyExc_ValueError, "share: once, and in direct mode");
    Py_buffer view;
    if (PyObject_GetBuffer(mapping, &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if ((size_t)view.len < sizeof(wal_shared) || (uintptr_t)view.buf % 64) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "share: a 64-byte aligned mapping of %zu bytes",
                            sizeof(wal_shared));
    }
    int rc = wal_share(self->core, view.buf, fd, init);
    if (rc) {
        PyBuffer_Release(&view);
        if (rc == -EUSERS)
            return raise_named("LockedError", Py_BuildValue("(s)", "every process entry of the "
                                                            "shared WAL is taken"));
        return raise_named("StorageError", Py_BuildValue("(is)", -rc, strerror(-rc)));
    }
    self->control = view;
    Py_RETURN_NONE;
}

/* set_progress(fd, length) -- publish every flushed position in the FOLLOW file (fd: open
 * for writing; length: its size), for readers in other processes.  Once, before appends
 * start.  The core maps the file itself: close swaps the mapping for anonymous memory at the
 * same address (a commit still publishing as close runs writes there), so that the file is
 * let go at close -- a Python mmap would hold it, and a descriptor of it, until dealloc. */
static PyObject *Core_set_progress(CoreObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "in", &fd, &len))
        return NULL;
    if (self->progress_map)
        return PyErr_Format(PyExc_ValueError, "set_progress: once");
    if (len < (Py_ssize_t)(WAL_PROGRESS_OFFSET + sizeof(wal_progress)))
        return PyErr_Format(PyExc_ValueError, "set_progress: %zd bytes is no FOLLOW file", len);
    void *map = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return raise_named("StorageError", Py_BuildValue("(is)", errno, strerror(errno)));
    self->progress_map = map;
    self->progress_len = (size_t)len;
    self->core->progress = (wal_progress *)((char *)map + WAL_PROGRESS_OFFSET);
    Py_RETURN_NONE;
}

/* let_go_of_progress -- close: the FOLLOW file's mapping becomes anonymous memory. */
static void let_go_of_progress(CoreObject *self)
{
    if (self->progress_map)
        mmap(self->progress_map, self->progress_len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

/* agree_persist(kind) -> kind: the persist method of every process of a shared WAL, set by
 * the first to ask (kind, for one process's WAL). */
static PyObject *Core_agree_persist(CoreObject *self, PyObject *args)
{
    int kind;
    if (!PyArg_ParseTuple(args, "i", &kind))
        return NULL;
    if (kind < WAL_PERSIST_PMEM || kind > WAL_PERSIST_DSYNC)
        return PyErr_Format(PyExc_ValueError, "persist method %d", kind);
    return PyLong_FromLong(wal_agree_persist(self->core, (enum wal_persist)kind));
}

/* reap_dead() -> int: clean up after the processes of a shared WAL that died (their open
 * insertions closed with void records); how many. */
static PyObject *Core_reap_dead(CoreObject *self, PyObject *unused)
{
    (void)unused;
    CORE_ENV(cc, UINT64_MAX);
    int n = wal_reap_dead(self->core, &env);
    regain_gil(&cc);
    if (cc.exc_type)
        return raise_rc(self->core, -EIO, &cc);
    return PyLong_FromLong(n);
}

/* forsake() -- in a child after fork(): refuse all work, touch nothing shared. */
static PyObject *Core_forsake(CoreObject *self, PyObject *unused)
{
    (void)unused;
    wal_forsake(self->core);
    if (self->control.obj) { /* the parent's mapping: the child may drop its reference */
        PyBuffer_Release(&self->control);
        self->core->sh = &self->core->own;
    }
    Py_RETURN_NONE;
}

/* shared(name, add=0) -> value: one of the shared WAL's counters, or the oldest segment
 * (name "oldest_segno": add raises it to at least add).  One process's WAL keeps them too. */
static PyObject *Core_shared(CoreObject *self, PyObject *args)
{
    unsigned int i;
    unsigned long long add = 0;
    if (!PyArg_ParseTuple(args, "I|K", &i, &add))
        return NULL;
    wal_shared *sh = self->core->sh;
    if (i == WAL_CTL_COUNTERS) {
        uint64_t v = atomic_load(&sh->oldest_segno);
        while (v < add && !atomic_compare_exchange_weak(&sh->oldest_segno, &v, add))
            ;
        return PyLong_FromUnsignedLongLong(v < add ? add : v);
    }
    if (i > WAL_CTL_COUNTERS)
        return PyErr_Format(PyExc_ValueError, "shared: counter %u of %d", i, WAL_CTL_COUNTERS);
    return PyLong_FromUnsignedLongLong(atomic_fetch_add(&sh->counters[i], add) + add);
}

/* stop(errno, reason) -> errno: stop the writer as a failed write would (the
 * background writer's check for deleted segments); returns the errno that stopped it. */
static PyObject *Core_stop(CoreObject *self, PyObject *args)
{
    int err;
    const char *reason;
    if (!PyArg_ParseTuple(args, "is", &err, &reason))
        return NULL;
    if (err <= 0)
        return PyErr_Format(PyExc_ValueError, "errno must be positive, not %d", err);
    return PyLong_FromLong(-wal_stop(self->core, -err, reason));
}

/* inject_fault(op, errno, after=0, count=1) -- a TEST HOOK: the next `count` calls of
 * op ("write": pwrite, "sync": fdatasync/fsync, "msync"), after `after` that succeed,
 * fail with errno without being made; "stall" and "stall_locked" (errno ignored): the
 * insertion stops for good once its space is reserved, or inside the reservation lock
 * (a process to SIGKILL mid-insert); "die": the insertion's records are placed, not yet
 * persisted, and the core refuses all work from then on, its slot taken (a death, once
 * the test drops the control file's descriptor).  count=0 clears it. */
static PyObject *Core_inject_fault(CoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"op", "errno", "after", "count", NULL};
    static const char *ops[] = {[WAL_OP_WRITE] = "write", [WAL_OP_SYNC] = "sync",
                                [WAL_OP_MSYNC] = "msync", [WAL_OP_STALL] = "stall",
                                [WAL_OP_STALL_LOCKED] = "stall_locked", [WAL_OP_DIE] = "die"};
    const char *op;
    int err;
    unsigned long long after = 0, count = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "si|KK", kwlist, &op, &err, &after, &count))
        return NULL;
    for (int i = 0; i < (int)(sizeof(ops) / sizeof(ops[0])); i++)
        if (!strcmp(op, ops[i])) {
            if (err <= 0 && i < WAL_OP_STALL)
                return PyErr_Format(PyExc_ValueError, "errno must be positive, not %d", err);
            Py_BEGIN_ALLOW_THREADS /* write_lock: its holder may be waiting for the GIL */
            wal_inject_fault(self->core, (enum wal_op)i, err, after, count);
            Py_END_ALLOW_THREADS
            Py_RETURN_NONE;
        }
    return PyErr_Format(PyExc_ValueError, "op must be 'write', 'sync', 'msync', 'stall', "
                        "'stall_locked' or 'die', not '%s'", op);
}

static PyObject *Core_stats(CoreObject *self, PyObject *unused)
{
    (void)unused;
    wal_stats s;
    Py_BEGIN_ALLOW_THREADS
    wal_get_stats(self->core, &s);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsK}", "records", s.records, "bytes", s.bytes,
                         "processes", s.processes, "processes_reaped", s.reaped,
                         "payload_bytes", s.payload_bytes,
                         "slot_wait_ns", s.slot_wait_ns, "insert_wait_ns", s.insert_wait_ns,
                         "background_wait_ns", s.background_wait_ns,
                         "flushes", s.flushes, "flush_requests", s.flush_requests,
                         "coalesced", s.coalesced, "writes", s.writes,
                         "stream_fences", s.stream_fences);
}

/* position() -> (insert_lsn, last record's LSN or 0), read together (wal_position) */
static PyObject *Core_position(CoreObject *self, PyObject *unused)
{
    (void)unused;
    uint64_t insert = 0, prev = 0;
    CORE_ENV(cc, 0);
    int rc;
    do
        rc = wal_position(self->core, &env, &insert, &prev);
    while (retry_call(&cc, rc));
    regain_gil(&cc);
    if (rc || cc.exc_type) /* a reap while waiting for the lock may have failed */
        return raise_rc(self->core, rc, &cc);
    return Py_BuildValue("(KK)", (unsigned long long)insert, (unsigned long long)prev);
}

static PyObject *Core_get_insert_lsn(CoreObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(wal_insert_lsn(self->core));
}

static PyObject *Core_get_flushed_lsn(CoreObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(wal_flushed_lsn(self->core));
}

static PyObject *Core_get_error(CoreObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(-atomic_load(&self->core->error));
}

static PyMethodDef Core_methods[] = {
    {"set_position", (PyCFunction)Core_set_position, METH_VARARGS, "set_position(insert_lsn, prev_lsn)"},
    {"set_persist", (PyCFunction)Core_set_persist, METH_VARARGS,
     "set_persist(kind, pmem_flush_address=0, pmem_drain_address=0, stream_min=STREAM_MIN)\n\n"
     "stream_min (pmem only): payloads of at least this many bytes are streamed past the\n"
     "cache, headers included; STREAM_NEVER: none (every store then goes through pmem_flush:\n"
     "what a persist tracer needs)."},
    {"position", (PyCFunction)Core_position, METH_NOARGS,
     "position() -> (insert_lsn, last record's LSN or 0), read together"},
    {"flush_ready", (PyCFunction)Core_flush_ready, METH_NOARGS, "flush_ready() -> flushed lsn"},
    {"set_notify", (PyCFunction)Core_set_notify, METH_VARARGS,
     "set_notify(eventfd, ahead=0, mark=0)"},
    {"set_serial", (PyCFunction)Core_set_serial, METH_VARARGS, "set_serial(on)"},
    {"set_wait_timeout", (PyCFunction)Core_set_wait_timeout, METH_VARARGS,
     "set_wait_timeout(seconds): a wait for one writer gives up after it (0: never)"},
    {"share", (PyCFunction)Core_share, METH_VARARGS, "share(control_mapping, fd, init)"},
    {"set_progress", (PyCFunction)Core_set_progress, METH_VARARGS, "set_progress(fd, length)"},
    {"reap_dead", (PyCFunction)Core_reap_dead, METH_NOARGS, "reap_dead() -> processes reaped"},
    {"agree_persist", (PyCFunction)Core_agree_persist, METH_VARARGS,
     "agree_persist(kind) -> the kind every process of a shared WAL uses"},
    {"forsake", (PyCFunction)Core_forsake, METH_NOARGS, "forsake(): in a forked child"},
    {"shared", (PyCFunction)Core_shared, METH_VARARGS,
     "shared(index, add=0) -> value: shared counter index (0..7) after adding; 8: the oldest\n"
     "segment, raised to at least add"},
    {"attach", (PyCFunction)Core_attach, METH_VARARGS, "attach(segno, fd, mapping_or_None)"},
    {"detach", (PyCFunction)Core_detach, METH_VARARGS, "detach(segno)"},
    {"append", (PyCFunction)(void (*)(void))Core_append, METH_FASTCALL | METH_KEYWORDS,
     "append(data, flush=False) -> lsn"},
    {"append_prefixed", (PyCFunction)(void (*)(void))Core_append_prefixed, METH_FASTCALL,
     "append_prefixed(prefix, data) -> lsn"},
    {"append_many", (PyCFunction)Core_append_many, METH_O, "append_many(records) -> bytes of u64 LSNs"},
    {"flush", (PyCFunction)Core_flush, METH_VARARGS, "flush(lsn=None) -> flushed LSN"},
    {"close", (PyCFunction)Core_close, METH_NOARGS, "close()"},
    {"stats", (PyCFunction)Core_stats, METH_NOARGS, "stats() -> dict"},
    {"stop", (PyCFunction)Core_stop, METH_VARARGS,
     "stop(errno, reason) -> the errno that stopped the writer"},
    {"inject_fault", (PyCFunction)(void (*)(void))Core_inject_fault, METH_VARARGS | METH_KEYWORDS,
     "inject_fault(op, errno, after=0, count=1) -- test hook: fail the next calls of\n"
     "op ('write', 'sync', 'msync') with errno, after `after` that succeed; 'stall' and\n"
     "'stall_locked' stop an insertion for good, 'die' abandons it and the core (errno\n"
     "ignored); count=0 clears."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Core_getset[] = {
    {"insert_lsn", (getter)Core_get_insert_lsn, NULL, "next record's LSN", NULL},
    {"flushed_lsn", (getter)Core_get_flushed_lsn, NULL, "durable below this LSN", NULL},
    {"error", (getter)Core_get_error, NULL, "errno that stopped the writer, 0 if none", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal._core.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native WAL writer: reservation, copy, flush.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
};

/* ---- module ------------------------------------------------------------------- */

/* mod_crc32c -- crc32c(data, crc=0): the CRC-32C of a bytes-like object. */
static PyObject *mod_crc32c(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_buffer view;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &crc))
        return NULL;
    uint32_t out;
    Py_BEGIN_ALLOW_THREADS
    out = crc32c_update(crc, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

/* mod_crc32c_copy -- crc32c alone (how 0), crc32c_copy (1) or crc32c_copy_nt (2), repeat times:
 * for the tests and benchmarks/crc.py. */
static PyObject *mod_crc32c_copy(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_buffer dst, src;
    unsigned int crc = 0;
    int how = 1;
    Py_ssize_t repeat = 1;
    if (!PyArg_ParseTuple(args, "w*y*|Iin", &dst, &src, &crc, &how, &repeat))
        return NULL;
    if (dst.len < src.len || how < 0 || how > 2 || repeat < 1) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, "dst shorter than src, or a bad how or repeat");
        return NULL;
    }
    uint32_t out = crc;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < repeat; i++) {
        if (how == 0)
            out = crc32c_update(crc, src.buf, (size_t)src.len);
        else if (how == 1)
            out = crc32c_copy(crc, dst.buf, src.buf, (size_t)src.len);
        else
            out = crc32c_copy_nt(crc, dst.buf, src.buf, (size_t)src.len, 0);
    }
    if (how == 2)
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the streamed stores, visible */
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return PyLong_FromUnsignedLong(out);
}

/* mod_status_text -- a wal status code in words. */
static PyObject *mod_status_text(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long st = PyLong_AsLong(arg);
    if (st == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(wal_status_text((int)st));
}

#ifdef PMEMWAL_TRACE
/* _trace(stream, fence, sync, mutations=0) -- the traced build's hooks (trace.h): addresses
 * of C-callable functions (ctypes callbacks), 0 for none; mutations: TRACE_* bits. */
static PyObject *mod_trace(PyObject *m, PyObject *args)
{
    (void)m;
    unsigned long long stream, fence, sync;
    int mutations = 0;
    if (!PyArg_ParseTuple(args, "KKK|i", &stream, &fence, &sync, &mutations))
        return NULL;
    trace_set((trace_stream_fn)(uintptr_t)stream, (trace_fence_fn)(uintptr_t)fence,
              (trace_sync_fn)(uintptr_t)sync, mutations);
    Py_RETURN_NONE;
}

/* _trace_forget() -- drop the calling thread's streaming stores not handed over yet. */
static PyObject *mod_trace_forget(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    trace_forget();
    Py_RETURN_NONE;
}
#endif

/* unlinked(fds) -> the first descriptor whose file has no name left (st_nlink 0), or -1:
 * the background writer's check of its segments, every fstat with the GIL given up once
 * (one at a time from Python, each gave it up and took it back, from the appenders). */
static PyObject *mod_unlinked(PyObject *mod, PyObject *arg)
{
    (void)mod;
    PyObject *seq = PySequence_Fast(arg, "unlinked takes a sequence of descriptors");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int *fds = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int));
    if (!fds) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((fd == -1 && PyErr_Occurred()) || fd < 0 || fd > INT_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "unlinked: not a file descriptor");
            PyMem_Free(fds);
            Py_DECREF(seq);
            return NULL;
        }
        fds[i] = (int)fd;
    }
    Py_DECREF(seq);
    int found = -1, err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && found < 0 && !err; i++) {
        struct stat st;
        if (fstat(fds[i], &st))
            err = errno;
        else if (st.st_nlink == 0)
            found = fds[i];
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(fds);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(found);
}

static PyMethodDef module_methods[] = {
    {"crc32c", mod_crc32c, METH_VARARGS, "crc32c(data, crc=0) -> int"},
    {"status_text", mod_status_text, METH_O, "status_text(status) -> str"},
    {"split", batch_split, METH_VARARGS, "split(data, offsets, lengths) -> [bytes]"},
    {"heads", batch_heads, METH_VARARGS,
     "heads(data, offsets, lengths, width) -> bytes: each payload's first width bytes"},
    {"entries", batch_entries, METH_VARARGS,
     "entries(type, indices, terms, data, offsets, lengths) -> [type(index, term, payload)]"},
    {"progress_wait", follow_wait, METH_VARARGS,
     "progress_wait(mapping, after, timeout, spin_ns, sleeper) -> (durable_lsn, spin_ns, status)"},
    {"progress_publish", follow_publish, METH_VARARGS,
     "progress_publish(mapping, lsn, reset=False): raise (reset: set) the durable LSN, wake"},
    {"progress_wake", follow_wake, METH_O, "progress_wake(mapping): wake every sleeper"},
    {"atomic_u64", follow_atomic_u64, METH_VARARGS,
     "atomic_u64(mapping, offset, value=None, op=0) -> the value before (op: store, raise, and, or)"},
    {"unlinked", mod_unlinked, METH_O,
     "unlinked(fds) -> the first descriptor whose file was deleted (no link left), or -1"},
    {"_crc32c_copy", mod_crc32c_copy, METH_VARARGS,
     "_crc32c_copy(dst, src, crc=0, how=1, repeat=1) -> int: how 0 CRC only, 1 copy, 2 streaming copy"},
#ifdef PMEMWAL_TRACE
    {"_trace", mod_trace, METH_VARARGS,
     "_trace(stream, fence, sync, mutations=0) -- the power-loss simulator's hooks (trace.h)"},
    {"_trace_forget", mod_trace_forget, METH_NOARGS,
     "_trace_forget() -- drop this thread's streaming stores not handed over yet"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "pmemwal._core", "pmemwal's native core.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&ReaderType) < 0 ||
        PyType_Ready(&RecordType) < 0 ||
        PyType_Ready(&BatchBufferType) < 0 || PyType_Ready(&UnchangedType) < 0 ||
        PyType_Ready(&RefillType) < 0)
        return NULL;
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
    Py_XDECREF(threading);
    Py_XDECREF(main);
    if (!ident)
        return NULL;
    main_thread = PyLong_AsUnsignedLong(ident);
    Py_DECREF(ident);
    if (PyErr_Occurred())
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&CoreType);
    Py_INCREF(&ReaderType);
    Py_INCREF(&RecordType);
    Py_INCREF(&UnchangedType);
    Py_INCREF(&RefillType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObject(m, "Record", (PyObject *)&RecordType) < 0 ||
        PyModule_AddObject(m, "Unchanged", (PyObject *)&UnchangedType) < 0 ||
        PyModule_AddObject(m, "Refill", (PyObject *)&RefillType) < 0)
        return NULL;
    PyModule_AddIntConstant(m, "CONTROL_SIZE", (long)sizeof(wal_shared));
    PyModule_AddIntConstant(m, "CONTROL_HEADER", WAL_CTL_HEADER);
    PyModule_AddIntConstant(m, "CONTROL_VERSION", WAL_CTL_VERSION);
    PyModule_AddIntConstant(m, "SHARED_COUNTERS", WAL_CTL_COUNTERS);
    PyModule_AddIntConstant(m, "MAX_PROCESSES", WAL_MAX_PROCS);
    PyModule_AddIntConstant(m, "SEG_TABLE", WAL_SEG_TABLE);
    PyModule_AddIntConstant(m, "PAGE_SIZE", WAL_PAGE_SIZE);
    PyModule_AddIntConstant(m, "PAGE_HEADER_SIZE", WAL_PAGE_HDR);
    PyModule_AddIntConstant(m, "RECORD_HEADER_SIZE", WAL_REC_HDR);
    PyModule_AddIntConstant(m, "FORMAT_VERSION", WAL_FORMAT_VERSION);
    PyModule_AddIntConstant(m, "PERSIST_PMEM", WAL_PERSIST_PMEM);
    PyModule_AddIntConstant(m, "PERSIST_MSYNC", WAL_PERSIST_MSYNC);
    PyModule_AddIntConstant(m, "PERSIST_FDATASYNC", WAL_PERSIST_FDATASYNC);
    PyModule_AddIntConstant(m, "PERSIST_FSYNC", WAL_PERSIST_FSYNC);
    PyModule_AddIntConstant(m, "PERSIST_DSYNC", WAL_PERSIST_DSYNC);
    PyModule_AddStringConstant(m, "CRC32C_IMPL", crc32c_impl());
#ifndef PMEMWAL_BUILD_FLAGS
#define PMEMWAL_BUILD_FLAGS "unknown"
#endif
    PyModule_AddStringConstant(m, "BUILD_FLAGS", PMEMWAL_BUILD_FLAGS); /* setup.py's cflags */
    PyModule_AddObject(m, "STREAM_MIN", PyLong_FromUnsignedLongLong(WAL_NT_MIN));
    PyModule_AddObject(m, "STREAM_NEVER", PyLong_FromUnsignedLongLong(WAL_NT_NEVER));
#ifdef PMEMWAL_TRACE
    PyModule_AddIntConstant(m, "TRACED", 1); /* the extension pmemwal._core_traced */
#else
    PyModule_AddIntConstant(m, "TRACED", 0);
#endif
    PyModule_AddIntConstant(m, "TRACE_SKIP_STREAM_FENCE", TRACE_SKIP_STREAM_FENCE);
    PyModule_AddIntConstant(m, "TRACE_SKIP_DRAIN", TRACE_SKIP_DRAIN);
    PyModule_AddIntConstant(m, "TRACE_SKIP_SYNC", TRACE_SKIP_SYNC);
    PyModule_AddIntConstant(m, "TRACE_SHORT_MSYNC", TRACE_SHORT_MSYNC);
    PyModule_AddIntConstant(m, "TRACE_SYNC_OWN_RECORD", TRACE_SYNC_OWN_RECORD);
    PyModule_AddIntConstant(m, "TRACE_PUBLISH_EARLY", TRACE_PUBLISH_EARLY);
    return m;
}
