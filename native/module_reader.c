/*
 * module_reader.c -- pmemwal._core.Reader: the binding of the record reader (wal_reader.c).
 *
 * A Reader validates and reads records from segments that Python maps: it asks its getter
 * for a segment's buffer (READER_CACHE of them per call, or all a holding call needs) and
 * hands the C reader a wal_src over them; it keeps the last READER_KEEP of them between
 * calls until forget().  Its many-record methods are module_batch.c's.
 * It stands apart from the writer's binding (module.c, the Core type): it shares no state
 * and no helper with it, and module.c only registers its type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>

#include "module.h"
#include "module_reader.h"


static held_segment *call_find(reader_call *c, uint64_t segno)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->held[i].segno == segno)
            return &c->held[i];
    return NULL;
}

static const uint8_t *held_buf(const held_segment *h)
{
    return h->kept ? h->kept->view.buf : h->view.buf;
}

/* held_release -- a call is done with h: its own view released, or the kept one unpinned
 * (and released when stale and no other call uses it). */
static void held_release(held_segment *h)
{
    kept_segment *k = h->kept;
    if (k) {
        if (--k->pins == 0 && k->stale) {
            PyBuffer_Release(&k->view);
            k->used = k->stale = 0;
        }
    } else if (h->have) {
        PyBuffer_Release(&h->view);
    }
    h->have = 0;
    h->kept = NULL;
}

/* call_slot -- room for one more buffer: a new one when holding (the array grown as needed),
 * else the oldest let go once READER_CACHE are kept. */
static held_segment *call_slot(reader_call *c)
{
    if (c->n < c->cap)
        return &c->held[c->n++];
    if (c->hold) {
        held_segment *more = PyMem_Malloc(2 * c->cap * sizeof(held_segment));
        if (!more)
            return (held_segment *)PyErr_NoMemory();
        memcpy(more, c->held, c->n * sizeof(held_segment));
        if (c->held != c->fixed)
            PyMem_Free(c->held);
        c->held = more;
        c->cap *= 2;
        return &c->held[c->n++];
    }
    held_segment *slot = &c->held[c->next];
    c->next = (c->next + 1) % c->cap;
    held_release(slot);
    return slot;
}

/* kept_find -- the Reader's live buffer of segment segno, or NULL. */
static kept_segment *kept_find(ReaderObject *r, uint64_t segno)
{
    for (int i = 0; i < READER_KEEP; i++)
        if (r->kept[i].used && !r->kept[i].stale && r->kept[i].segno == segno)
            return &r->kept[i];
    return NULL;
}

/* keep -- hand a call's own whole-segment view to the Reader to keep (a free entry, or the
 * least recently used one no call uses), pinned for the call; left the call's own when
 * every entry is in use. */
static void keep(ReaderObject *r, held_segment *h)
{
    kept_segment *k = NULL;
    for (int i = 0; i < READER_KEEP; i++) {
        kept_segment *e = &r->kept[i];
        if (!e->used) {
            k = e;
            break;
        }
        if (e->pins == 0 && (!k || e->last_use < k->last_use))
            k = e;
    }
    if (!k)
        return;
    if (k->used)
        PyBuffer_Release(&k->view);
    k->view = h->view;
    k->segno = h->segno;
    k->used = k->pins = 1;
    k->stale = 0;
    k->last_use = ++r->uses;
    h->kept = k;
}

void reader_forget(ReaderObject *r)
{
    r->forgets++;
    for (int i = 0; i < READER_KEEP; i++) {
        kept_segment *k = &r->kept[i];
        if (!k->used)
            continue;
        k->stale = 1;
        if (k->pins == 0) {
            PyBuffer_Release(&k->view);
            k->used = k->stale = 0;
        }
    }
}

int call_take(reader_call *c, uint64_t segno)
{
    kept_segment *k = kept_find(c->reader, segno);
    if (k) {
        held_segment *slot = call_slot(c);
        if (!slot) {
            c->failed = 1;
            return -1;
        }
        k->pins++;
        k->last_use = ++c->reader->uses;
        *slot = (held_segment){segno, {0}, 1, k};
        return 0;
    }
    uint64_t forgets = c->reader->forgets; /* (the getter may run one: a truncation's) */
    PyObject *obj = PyObject_CallFunction(c->getter, "K", (unsigned long long)segno);
    if (!obj) {
        c->failed = 1;
        return -1;
    }
    if (obj == Py_None && !c->hold) {
        Py_DECREF(obj); /* (only a holding call remembers that there is none) */
        return 0;
    }
    held_segment *slot = call_slot(c);
    if (!slot) {
        Py_DECREF(obj);
        c->failed = 1;
        return -1;
    }
    slot->segno = segno;
    slot->have = 0;
    slot->kept = NULL;
    int rc = obj == Py_None ? 0 : PyObject_GetBuffer(obj, &slot->view, PyBUF_SIMPLE);
    Py_DECREF(obj);
    if (rc < 0) {
        slot->segno = UINT64_MAX; /* (no segment has that number) */
        c->failed = 1;
        return -1;
    }
    if (obj == Py_None)
        return 0;
    if ((uint64_t)slot->view.len < c->src.g.seg_size) {
        PyBuffer_Release(&slot->view); /* a short file holds no complete segment */
        return 0;
    }
    slot->have = 1;
    if (c->reader->forgets == forgets) /* else the call's own: what it shows may be moved */
        keep(c->reader, slot);
    return 0;
}

/* reader_segment -- the call's buffer for segno, taken from the getter when not held yet
 * (asked for instead when the call runs without the GIL). */
static const uint8_t *reader_segment(void *ctx, uint64_t segno, int *error)
{
    reader_call *c = ctx;
    if (c->failed) {
        *error = 1;
        return NULL;
    }
    held_segment *h = call_find(c, segno);
    if (!h && c->nogil) {
        c->need = 1;
        c->need_segno = segno;
        *error = 1;
        return NULL;
    }
    if (!h) {
        if (call_take(c, segno) < 0) {
            *error = 1;
            return NULL;
        }
        h = call_find(c, segno);
    }
    return h && h->have ? held_buf(h) : NULL;
}

/* call_begin -- a call's source over the Reader's geometry and getter; -1 (RuntimeError)
 * for a Reader whose __init__ never ran (no geometry: its arithmetic would divide by zero). */
int call_begin(ReaderObject *r, reader_call *c)
{
    memset(c, 0, sizeof(*c));
    c->held = c->fixed;
    c->cap = READER_CACHE;
    if (!r->getter) {
        PyErr_SetString(PyExc_RuntimeError, "Reader: not initialised");
        return -1;
    }
    c->reader = r;
    c->src.g = r->g;
    c->src.segment = reader_segment;
    c->src.ctx = c;
    c->src.salvage = r->salvage;
    c->getter = r->getter;
    Py_XINCREF(c->getter); /* (a second __init__ may replace the Reader's meanwhile) */
    return 0;
}

/* call_done -- let the call's buffers go (the Reader keeps some) and return result. */
PyObject *call_done(reader_call *c, PyObject *result)
{
    for (size_t i = 0; i < c->n; i++)
        held_release(&c->held[i]);
    if (c->held != c->fixed)
        PyMem_Free(c->held);
    c->held = c->fixed;
    c->n = 0;
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
    reader_forget(self); /* (another __init__: what it kept may be another WAL's) */
    wal_geom_init(&self->g, seg_size, wal_id_lo);
    self->salvage = salvage;
    Py_INCREF(getter);
    Py_XSETREF(self->getter, getter);
    return 0;
}

static void Reader_dealloc(ReaderObject *self)
{
    reader_forget(self); /* (no call is in flight: it would hold a reference) */
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

/* forget() -- let go of the segment buffers the Reader keeps between calls (those a call in
 * flight uses, once it is done): the WAL calls it before it unmaps or moves a segment. */
static PyObject *Reader_forget_method(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    reader_forget(self);
    Py_RETURN_NONE;
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
    {"fill", (PyCFunction)Reader_fill, METH_VARARGS,
     "fill(lsn, expect_prev, stop_lsn, max_records, max_bytes) -> (status, next_lsn, last_lsn, "
     "bad_lsn, lsns, prev_lsns, lengths, offsets, data), read without the GIL"},
    {"fetch", (PyCFunction)Reader_fetch, METH_VARARGS,
     "fetch(lsns, max_bytes) -> (status, done, bad_lsn, prev_lsns, lengths, offsets, data)"},
    {"records", (PyCFunction)Reader_records, METH_VARARGS,
     "records(lsn, expect_prev, stop_lsn, max_records, max_bytes) -> (status, next_lsn, "
     "last_lsn, bad_lsn, [Record])"},
    {"entry", (PyCFunction)Reader_entry, METH_VARARGS,
     "entry(lsn, index, prefix) -> (status, bad_lsn, term, payload or None): a Log entry"},
    {"record", (PyCFunction)Reader_record, METH_O,
     "record(lsn) -> (status, bad_lsn, Record or None)"},
    {"forget", (PyCFunction)Reader_forget_method, METH_NOARGS,
     "forget(): let go of the segment buffers kept between calls"},
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
