/*
 * module_reader.c -- pmemwal._core.Reader: the binding of the record reader (wal_reader.c).
 *
 * A Reader validates and reads records from segments that Python maps: it asks its getter
 * for a segment's buffer (cached for the call, READER_CACHE of them) and hands the C reader
 * a wal_src over them.  It stands apart from the writer's binding (module.c, the Core
 * type): it shares no state and no helper with it, and module.c only registers its type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "module.h"
#include "wal_reader.h"

#define READER_CACHE 4

typedef struct {
    PyObject_HEAD
    wal_src src;
    PyObject *getter;
    uint64_t segno[READER_CACHE];
    Py_buffer view[READER_CACHE];
    int used[READER_CACHE];
    int next;
} ReaderObject;

/* reader_segment -- the getter's mapping for segno, cached for the call. */
static const uint8_t *reader_segment(void *ctx, uint64_t segno, int *error)
{
    ReaderObject *r = ctx;
    for (int i = 0; i < READER_CACHE; i++)
        if (r->used[i] && r->segno[i] == segno)
            return r->view[i].buf;
    PyObject *obj = PyObject_CallFunction(r->getter, "K", (unsigned long long)segno);
    if (!obj) {
        *error = 1;
        return NULL;
    }
    if (obj == Py_None) {
        Py_DECREF(obj);
        return NULL;
    }
    int i = r->next;
    r->next = (r->next + 1) % READER_CACHE;
    if (r->used[i])
        PyBuffer_Release(&r->view[i]);
    r->used[i] = 0;
    int rc = PyObject_GetBuffer(obj, &r->view[i], PyBUF_SIMPLE);
    Py_DECREF(obj);
    if (rc < 0) {
        *error = 1;
        return NULL;
    }
    r->used[i] = 1;
    r->segno[i] = segno;
    if ((uint64_t)r->view[i].len < r->src.g.seg_size)
        return NULL; /* a short file holds no complete segment */
    return r->view[i].buf;
}

static void reader_drop(ReaderObject *r)
{
    for (int i = 0; i < READER_CACHE; i++)
        if (r->used[i]) {
            PyBuffer_Release(&r->view[i]);
            r->used[i] = 0;
        }
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
    reader_drop(self);
    wal_geom_init(&self->src.g, seg_size, wal_id_lo);
    self->src.segment = reader_segment;
    self->src.ctx = self;
    self->src.salvage = salvage;
    Py_INCREF(getter);
    Py_XSETREF(self->getter, getter);
    return 0;
}

static void Reader_dealloc(ReaderObject *self)
{
    reader_drop(self);
    Py_XDECREF(self->getter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *reader_done(ReaderObject *self, PyObject *result)
{
    reader_drop(self); /* never keep a mapping exported between calls */
    if (PyErr_Occurred()) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
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
    wal_record r;
    int st = wal_read(&self->src, lsn, expect < 0 ? WAL_ANY_PREV : (uint64_t)expect, &r);
    return reader_done(self, Py_BuildValue("(iKKKIIKLKN)", st, r.lsn, r.next_lsn, r.prev_lsn,
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
    wal_record r;
    int st = wal_read(&self->src, lsn, WAL_ANY_PREV, &r);
    PyObject *out = NULL;
    if (st == WAL_OK && r.type == WAL_REC_VOID)
        st = WAL_BAD_TYPE; /* not a record */
    if (st == WAL_OK && (out = PyBytes_FromStringAndSize(NULL, r.length)))
        st = wal_copy_payload(&self->src, &r, (uint8_t *)PyBytes_AS_STRING(out));
    if (st != WAL_OK && !PyErr_Occurred()) {
        Py_CLEAR(out);
        PyErr_Format(PyExc_ValueError, "record at %llu is not valid: %s", lsn, wal_status_text(st));
    }
    return reader_done(self, out);
}

/* scan(lsn, expect_prev, stop_lsn) -> (status, end_lsn, last_lsn, count, bytes, bad_lsn) */
static PyObject *Reader_scan(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, stop;
    long long expect;
    int check_body = 1;
    if (!PyArg_ParseTuple(args, "KLK|p", &lsn, &expect, &stop, &check_body))
        return NULL;
    wal_scan_result r;
    (check_body ? wal_scan : wal_follow)(&self->src, lsn,
                                         expect < 0 ? WAL_ANY_PREV : (uint64_t)expect, stop, &r);
    return reader_done(self, Py_BuildValue("(iKKKKK)", r.status, r.end_lsn, r.last_lsn, r.count,
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
        if ((st = wal_read(&self->src, lsn, prev, &r)) != WAL_OK)
            break;
        if (r.type == WAL_REC_VOID) {
            prev = lsn;
            lsn = r.next_lsn;
            continue;
        }
        uint8_t *h = out_head + n * head;
        memset(h, 0, (size_t)head);
        if ((st = wal_copy_head(&self->src, &r, h, (uint64_t)head)) != WAL_OK)
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
    return reader_done(self, Py_BuildValue("(iKKNNN)", st, lsn, (unsigned long long)last,
                                           lsns, lens, heads));
fail:
    Py_XDECREF(lsns);
    Py_XDECREF(lens);
    Py_XDECREF(heads);
    return reader_done(self, NULL);
}

static PyObject *Reader_first_record(ReaderObject *self, PyObject *args)
{
    unsigned long long segno;
    if (!PyArg_ParseTuple(args, "K", &segno))
        return NULL;
    uint64_t lsn = 0;
    int st = wal_first_record(&self->src, segno, &lsn);
    return reader_done(self, Py_BuildValue("(iK)", st, lsn));
}

/* beyond(x, last_segno, min_prev) -> (durable_lsn, [page LSNs after x's page to wipe]) */
static PyObject *Reader_beyond(ReaderObject *self, PyObject *args)
{
    unsigned long long x, last, min_prev;
    if (!PyArg_ParseTuple(args, "KKK", &x, &last, &min_prev))
        return NULL;
    uint64_t durable = 0, *pages = NULL;
    size_t n = 0;
    int rc = wal_beyond(&self->src, x, last, min_prev, &durable, &pages, &n);
    PyObject *list = NULL;
    if (rc == 0 && (list = PyList_New((Py_ssize_t)n)))
        for (size_t i = 0; i < n; i++)
            PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromUnsignedLongLong(pages[i]));
    free(pages);
    if (rc && !PyErr_Occurred())
        PyErr_SetFromErrno(PyExc_OSError);
    return reader_done(self, list ? Py_BuildValue("(KN)", durable, list) : NULL);
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
