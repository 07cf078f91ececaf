/*
 * module_reader.c -- pmemwal._core.Reader: the binding of the record reader (wal_reader.c).
 *
 * A Reader validates and reads records from segments that Python maps: it asks its getter
 * for a segment's buffer (cached for the call, READER_CACHE of them) and hands the C reader
 * a wal_src over them, held for the call alone.  SegmentView (below) exports payload views
 * of a mapping and counts them.  It stands apart from the writer's binding (module.c, the Core
 * type): it shares no state and no helper with it, and module.c only registers its type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>

#include "module.h"
#include "wal_reader.h"

#include <sys/mman.h>
#include <unistd.h>

#define READER_CACHE 4

typedef struct {
    PyObject_HEAD
    wal_geom g;
    PyObject *getter;
    int salvage; /* page headers unchecked: see wal_src (wal_reader.h) */
} ReaderObject;

/* One call's segment buffers: each call has its own, on its stack, so that threads reading
 * through one Reader at once (the getter is Python and lets the GIL go) never release a
 * buffer another call still reads through. */
typedef struct {
    wal_src src;
    PyObject *getter;
    uint64_t segno[READER_CACHE];
    Py_buffer view[READER_CACHE];
    int used[READER_CACHE];
    int next;
} reader_call;

/* reader_segment -- the getter's buffer for segno, held until the call ends. */
static const uint8_t *reader_segment(void *ctx, uint64_t segno, int *error)
{
    reader_call *c = ctx;
    for (int i = 0; i < READER_CACHE; i++)
        if (c->used[i] && c->segno[i] == segno)
            return c->view[i].buf;
    PyObject *obj = PyObject_CallFunction(c->getter, "K", (unsigned long long)segno);
    if (!obj) {
        *error = 1;
        return NULL;
    }
    if (obj == Py_None) {
        Py_DECREF(obj);
        return NULL;
    }
    int i = c->next;
    c->next = (c->next + 1) % READER_CACHE;
    if (c->used[i])
        PyBuffer_Release(&c->view[i]);
    c->used[i] = 0;
    int rc = PyObject_GetBuffer(obj, &c->view[i], PyBUF_SIMPLE);
    Py_DECREF(obj);
    if (rc < 0) {
        *error = 1;
        return NULL;
    }
    c->used[i] = 1;
    c->segno[i] = segno;
    if ((uint64_t)c->view[i].len < c->src.g.seg_size)
        return NULL; /* a short file holds no complete segment */
    return c->view[i].buf;
}

/* call_begin -- a call's source over the Reader's geometry and getter; -1 (RuntimeError)
 * for a Reader whose __init__ never ran (no geometry: its arithmetic would divide by zero). */
static int call_begin(ReaderObject *r, reader_call *c)
{
    memset(c, 0, sizeof(*c));
    if (!r->getter) {
        PyErr_SetString(PyExc_RuntimeError, "Reader: not initialised");
        return -1;
    }
    c->src.g = r->g;
    c->src.segment = reader_segment;
    c->src.ctx = c;
    c->src.salvage = r->salvage;
    c->getter = r->getter;
    Py_XINCREF(c->getter); /* (a second __init__ may replace the Reader's meanwhile) */
    return 0;
}

/* call_done -- release the call's buffers (never kept between calls) and return result. */
static PyObject *call_done(reader_call *c, PyObject *result)
{
    for (int i = 0; i < READER_CACHE; i++)
        if (c->used[i]) {
            PyBuffer_Release(&c->view[i]);
            c->used[i] = 0;
        }
    Py_CLEAR(c->getter);
    if (PyErr_Occurred()) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

static int Reader_init(ReaderObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"segment_size", "wal_id_lo", "getter", "salvage", NULL};
    unsigned long long seg_size;
    unsigned int wal_id_lo;
    PyObject *getter;
    int salvage = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KIO|p", kwlist, &seg_size, &wal_id_lo, &getter,
                                     &salvage))
        return -1;
    if (seg_size < 2 * WAL_PAGE_SIZE || (seg_size & (seg_size - 1))) {
        PyErr_SetString(PyExc_ValueError, "segment_size must be a power of two of two pages or more");
        return -1;
    }
    wal_geom_init(&self->g, seg_size, wal_id_lo);
    self->salvage = salvage;
    Py_INCREF(getter);
    Py_XSETREF(self->getter, getter);
    return 0;
}

static void Reader_dealloc(ReaderObject *self)
{
    Py_XDECREF(self->getter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* read(lsn, expect_prev=-1)
 *   -> (status, lsn, next, prev, length, crc, hint, payload_lsn, bad_lsn, void)
 * payload_lsn is -1 when the payload spans pages (use payload()); void: a void record
 * (a closed range, not a record: skip it, and link the next one to it). */
static PyObject *Reader_read(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn;
    long long expect = -1;
    if (!PyArg_ParseTuple(args, "K|L", &lsn, &expect))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    wal_record r;
    int st = wal_read(&c.src, lsn, expect < 0 ? WAL_ANY_PREV : (uint64_t)expect, &r);
    return call_done(&c, Py_BuildValue("(iKKKIIKLKN)", st, r.lsn, r.next_lsn, r.prev_lsn,
                                           r.length, r.crc, r.durable_hint,
                                           r.contiguous ? (long long)r.payload_lsn : -1LL,
                                           r.bad_lsn, PyBool_FromLong(r.type == WAL_REC_VOID)));
}

/* payload(lsn) -> bytes: a record's payload gathered across pages (validated again). */
static PyObject *Reader_payload(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn;
    if (!PyArg_ParseTuple(args, "K", &lsn))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    wal_record r;
    int st = wal_read(&c.src, lsn, WAL_ANY_PREV, &r);
    PyObject *out = NULL;
    if (st == WAL_OK && r.type == WAL_REC_VOID)
        st = WAL_BAD_TYPE; /* not a record */
    if (st == WAL_OK && (out = PyBytes_FromStringAndSize(NULL, r.length)))
        st = wal_copy_payload(&c.src, &r, (uint8_t *)PyBytes_AS_STRING(out));
    if (st != WAL_OK && !PyErr_Occurred()) {
        Py_CLEAR(out);
        PyErr_Format(PyExc_ValueError, "record at %llu is not valid: %s", lsn, wal_status_text(st));
    }
    return call_done(&c, out);
}

/* scan(lsn, expect_prev, stop_lsn) -> (status, end_lsn, last_lsn, count, bytes, bad_lsn) */
static PyObject *Reader_scan(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, stop;
    long long expect;
    int check_body = 1;
    if (!PyArg_ParseTuple(args, "KLK|p", &lsn, &expect, &stop, &check_body))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    wal_scan_result r;
    (check_body ? wal_scan : wal_follow)(&c.src, lsn,
                                         expect < 0 ? WAL_ANY_PREV : (uint64_t)expect, stop, &r);
    return call_done(&c, Py_BuildValue("(iKKKKK)", r.status, r.end_lsn, r.last_lsn, r.count,
                                           r.bytes, r.bad_lsn));
}

/* heads(lsn, expect_prev, stop_lsn, head_bytes, max_count)
 *   -> (status, next_lsn, last_lsn, lsns, lengths, heads)
 * Follows the chain like scan(), at most max_count records, and returns each valid record's
 * (void ones are stepped over)
 * LSN (u64) and payload length (u32) and its first head_bytes payload bytes (zero-filled past
 * the payload), each as bytes: what an index over the records' own headers is built from
 * without a Python call per record (pmemwal.log). */
static PyObject *Reader_heads(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, stop;
    long long expect;
    Py_ssize_t head, max;
    if (!PyArg_ParseTuple(args, "KLKnn", &lsn, &expect, &stop, &head, &max))
        return NULL;
    if (head < 0 || head > 4096 || max < 0) {
        PyErr_SetString(PyExc_ValueError, "heads: head_bytes from 0 to 4096, max_count >= 0");
        return NULL;
    }
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    PyObject *lsns = PyBytes_FromStringAndSize(NULL, max * 8);
    PyObject *lens = PyBytes_FromStringAndSize(NULL, max * 4);
    PyObject *heads = PyBytes_FromStringAndSize(NULL, max * head);
    if (!lsns || !lens || !heads)
        goto fail;
    uint64_t *out_lsn = (uint64_t *)PyBytes_AS_STRING(lsns), prev = expect < 0 ? WAL_ANY_PREV : (uint64_t)expect;
    uint32_t *out_len = (uint32_t *)PyBytes_AS_STRING(lens);
    uint8_t *out_head = (uint8_t *)PyBytes_AS_STRING(heads);
    uint64_t last = 0;
    int st = WAL_OK;
    Py_ssize_t n = 0;
    while (n < max && lsn < stop) {
        wal_record r;
        if ((st = wal_read(&c.src, lsn, prev, &r)) != WAL_OK)
            break;
        if (r.type == WAL_REC_VOID) {
            prev = lsn;
            lsn = r.next_lsn;
            continue;
        }
        uint8_t *h = out_head + n * head;
        memset(h, 0, (size_t)head);
        if ((st = wal_copy_head(&c.src, &r, h, (uint64_t)head)) != WAL_OK)
            break;
        out_lsn[n] = prev = lsn;
        out_len[n] = r.length;
        lsn = r.next_lsn;
        n++;
    }
    if (PyErr_Occurred() || _PyBytes_Resize(&lsns, n * 8) < 0 || _PyBytes_Resize(&lens, n * 4) < 0 ||
        _PyBytes_Resize(&heads, n * head) < 0)
        goto fail;
    last = prev == WAL_ANY_PREV ? 0 : prev; /* where the chain stands: the next call's prev */
    return call_done(&c, Py_BuildValue("(iKKNNN)", st, lsn, (unsigned long long)last,
                                           lsns, lens, heads));
fail:
    Py_XDECREF(lsns);
    Py_XDECREF(lens);
    Py_XDECREF(heads);
    return call_done(&c, NULL);
}

static PyObject *Reader_first_record(ReaderObject *self, PyObject *args)
{
    unsigned long long segno;
    if (!PyArg_ParseTuple(args, "K", &segno))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    uint64_t lsn = 0;
    int st = wal_first_record(&c.src, segno, &lsn);
    return call_done(&c, Py_BuildValue("(iK)", st, lsn));
}

/* beyond(x, last_segno, min_prev) -> (durable_lsn, [page LSNs after x's page to wipe]) */
static PyObject *Reader_beyond(ReaderObject *self, PyObject *args)
{
    unsigned long long x, last, min_prev;
    if (!PyArg_ParseTuple(args, "KKK", &x, &last, &min_prev))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    uint64_t durable = 0, *pages = NULL;
    size_t n = 0;
    int rc = wal_beyond(&c.src, x, last, min_prev, &durable, &pages, &n);
    PyObject *list = NULL;
    if (rc == 0 && (list = PyList_New((Py_ssize_t)n)))
        for (size_t i = 0; i < n; i++)
            PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromUnsignedLongLong(pages[i]));
    free(pages);
    if (rc && !PyErr_Occurred())
        PyErr_SetFromErrno(PyExc_OSError);
    return call_done(&c, list ? Py_BuildValue("(KN)", durable, list) : NULL);
}

/* A salvage call's segments, taken from the getter up front so that the scan runs without
 * the GIL: from segno lo, n of them (have[i]: the getter gave a whole segment). */
typedef struct {
    uint64_t lo;
    size_t n;
    Py_buffer *view;
    char *have;
} salvage_segments;

static const uint8_t *salvage_segment(void *ctx, uint64_t segno, int *error)
{
    (void)error;
    salvage_segments *t = ctx;
    if (segno < t->lo || segno - t->lo >= t->n || !t->have[segno - t->lo])
        return NULL;
    return t->view[segno - t->lo].buf;
}

static void salvage_release(salvage_segments *t)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->have[i])
            PyBuffer_Release(&t->view[i]);
    PyMem_Free(t->view);
    PyMem_Free(t->have);
}

/* salvage_take -- the getter's buffer of every segment from lo through hi. */
static int salvage_take(ReaderObject *self, salvage_segments *t, uint64_t lo, uint64_t hi)
{
    t->lo = lo;
    t->n = 0;
    t->view = PyMem_Calloc(hi - lo + 1, sizeof(Py_buffer));
    t->have = PyMem_Calloc(hi - lo + 1, 1);
    if (!t->view || !t->have) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t segno = lo; segno <= hi; segno++, t->n++) {
        PyObject *obj = PyObject_CallFunction(self->getter, "K", (unsigned long long)segno);
        if (!obj)
            return -1;
        int rc = obj == Py_None ? 0 : PyObject_GetBuffer(obj, &t->view[t->n], PyBUF_SIMPLE);
        Py_DECREF(obj);
        if (rc < 0)
            return -1;
        if (obj != Py_None && (uint64_t)t->view[t->n].len < self->g.seg_size)
            PyBuffer_Release(&t->view[t->n]); /* a short file holds no complete segment */
        else if (obj != Py_None)
            t->have[t->n] = 1;
    }
    return 0;
}

/* salvage(x, pages, link, floor) -> [(lsn, next_lsn, length, crc)]: wal_salvage over the
 * segments from x's through the one after the last page's, scanned without the GIL. */
static PyObject *Reader_salvage(ReaderObject *self, PyObject *args)
{
    unsigned long long x, floor;
    long long link;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "KOLK", &x, &seq, &link, &floor))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "salvage: pages must be a sequence of LSNs");
    if (!fast)
        return NULL;
    Py_ssize_t npages = PySequence_Fast_GET_SIZE(fast);
    uint64_t *pages = PyMem_Malloc((npages ? npages : 1) * sizeof(uint64_t)), hi = x;
    salvage_segments t = {0};
    PyObject *list = NULL;
    if (!pages) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < npages; i++) {
        pages[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (PyErr_Occurred())
            goto done;
        if (i && pages[i] <= pages[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "salvage: pages must ascend");
            goto done;
        }
        if (pages[i] > hi)
            hi = pages[i];
    }
    if (salvage_take(self, &t, x / self->g.seg_size, hi / self->g.seg_size + 1) < 0)
        goto done;
    wal_src src = {self->g, salvage_segment, &t, 1};
    wal_found *found = NULL;
    size_t n = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = wal_salvage(&src, x, pages, (size_t)npages, link < 0 ? WAL_ANY_PREV : (uint64_t)link,
                     floor, &found, &n);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_NoMemory();
    } else if ((list = PyList_New((Py_ssize_t)n))) {
        for (size_t i = 0; i < n; i++) {
            PyObject *item = Py_BuildValue("(KKII)", found[i].lsn, found[i].next_lsn,
                                           found[i].length, found[i].crc);
            if (!item) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
        }
    }
    free(found);
done:
    salvage_release(&t);
    PyMem_Free(pages);
    Py_DECREF(fast);
    return list;
}

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)Reader_read, METH_VARARGS, "read(lsn, expect_prev=-1) -> tuple"},
    {"payload", (PyCFunction)Reader_payload, METH_VARARGS, "payload(lsn) -> bytes"},
    {"scan", (PyCFunction)Reader_scan, METH_VARARGS,
     "scan(lsn, expect_prev, stop_lsn, check_body=True) -> tuple; without check_body, "
     "headers alone (wal_follow)"},
    {"heads", (PyCFunction)Reader_heads, METH_VARARGS,
     "heads(lsn, expect_prev, stop_lsn, head_bytes, max_count) -> (status, next, last, lsns, lengths, heads)"},
    {"first_record", (PyCFunction)Reader_first_record, METH_VARARGS, "first_record(segno) -> (status, lsn)"},
    {"beyond", (PyCFunction)Reader_beyond, METH_VARARGS, "beyond(x, last_segno, min_prev) -> (durable_lsn, pages)"},
    {"salvage", (PyCFunction)Reader_salvage, METH_VARARGS,
     "salvage(x, pages, link, floor) -> [(lsn, next_lsn, length, crc)]"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal._core.Reader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Validates and reads records from mapped segments.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

/*
 * pmemwal._core.SegmentView -- the exporter of payload views over one segment mapping.
 *
 * Payload memoryviews point into a segment's mapping; once the file is recycled (renamed to a
 * future number and written again) or a later open reuses it, they would show other records'
 * bytes.  Every payload view is made from a SegmentView, which counts the views alive
 * (``exports``: a memoryview and every slice of it count once, until the last is gone), so
 * that the WAL recycles no file a view still shows (truncation removes it instead: the
 * mapping keeps the unlinked file's pages), and detach() replaces the pages under the views
 * with a private copy when the WAL closes.  It holds its own export of the mapping: the
 * mapping cannot be unmapped under a view (mmap.close() raises BufferError).
 */
typedef struct {
    PyObject_HEAD
    Py_buffer base; /* the mapping's buffer, held while has_base */
    int has_base;
    int detached;
    Py_ssize_t exports;
} SegmentViewObject;

static int SegmentView_init(SegmentViewObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mapping", NULL};
    PyObject *mapping;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O", kwlist, &mapping))
        return -1;
    if (self->has_base) {
        PyErr_SetString(PyExc_RuntimeError, "SegmentView: already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(mapping, &self->base, PyBUF_SIMPLE) < 0)
        return -1;
    /* detach() remaps whole pages over base.buf: a buffer that starts inside a page, or ends
     * inside one, would have its neighbours' pages replaced too (the owner's next page). */
    long page = sysconf(_SC_PAGESIZE);
    if ((uintptr_t)self->base.buf % (uintptr_t)page || self->base.len == 0 ||
        self->base.len % page) {
        PyBuffer_Release(&self->base);
        PyErr_SetString(PyExc_ValueError, "SegmentView: the mapping must be whole pages at a "
                                          "page boundary");
        return -1;
    }
    self->has_base = 1;
    return 0;
}

static void SegmentView_dealloc(SegmentViewObject *self)
{
    if (self->has_base)
        PyBuffer_Release(&self->base);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* SegmentView_getbuffer -- a read-only buffer over the whole mapping, counted. */
static int SegmentView_getbuffer(SegmentViewObject *self, Py_buffer *view, int flags)
{
    if (!self->has_base) {
        PyErr_SetString(PyExc_ValueError, "SegmentView: released");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->base.buf, self->base.len, 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void SegmentView_releasebuffer(SegmentViewObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

/* release() -> bool: let the mapping go when no view is alive (True); False otherwise. */
static PyObject *SegmentView_release(SegmentViewObject *self, PyObject *unused)
{
    (void)unused;
    if (self->exports > 0)
        Py_RETURN_FALSE;
    if (self->has_base) {
        PyBuffer_Release(&self->base);
        self->has_base = 0;
    }
    Py_RETURN_TRUE;
}

/* detach() -> bool: put a private, read-only copy of the mapping's pages in place under the
 * views (mremap over the same addresses), so that they keep their bytes whatever happens to
 * the file; once only, and only where views are alive (False otherwise).  Nothing may write
 * through the mapping after it: the WAL calls it when closing. */
static PyObject *SegmentView_detach(SegmentViewObject *self, PyObject *unused)
{
    (void)unused;
    if (self->exports == 0 || !self->has_base || self->detached)
        Py_RETURN_FALSE;
    size_t len = (size_t)self->base.len;
    void *copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
    memcpy(copy, self->base.buf, len);
    if (mprotect(copy, len, PROT_READ) != 0 ||
        mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, self->base.buf) == MAP_FAILED) {
        int err = errno;
        munmap(copy, len);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->detached = 1;
    Py_RETURN_TRUE;
}

static PyObject *SegmentView_get_exports(SegmentViewObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->exports);
}

static PyBufferProcs SegmentView_as_buffer = {
    (getbufferproc)SegmentView_getbuffer,
    (releasebufferproc)SegmentView_releasebuffer,
};

static PyMethodDef SegmentView_methods[] = {
    {"release", (PyCFunction)SegmentView_release, METH_NOARGS,
     "release() -> bool: let the mapping go if no view is alive"},
    {"detach", (PyCFunction)SegmentView_detach, METH_NOARGS,
     "detach() -> bool: a private copy of the pages under the views alive"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SegmentView_getset[] = {
    {"exports", (getter)SegmentView_get_exports, NULL, "payload views alive", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SegmentViewType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal._core.SegmentView",
    .tp_basicsize = sizeof(SegmentViewObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Exports read-only payload views of a segment mapping and counts them.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SegmentView_init,
    .tp_dealloc = (destructor)SegmentView_dealloc,
    .tp_as_buffer = &SegmentView_as_buffer,
    .tp_methods = SegmentView_methods,
    .tp_getset = SegmentView_getset,
};
