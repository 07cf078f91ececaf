/*
 * module_batch.c -- the Reader's many-record methods (wal_batch.c).
 *
 * fill/fetch hand back arrays (LSNs, prev-links, lengths, offsets) and one buffer of
 * payloads, read without the GIL: a segment the reader has not taken yet stops it, the
 * segment is taken with the GIL (call_take) and it goes on where it stopped.  records and
 * record hand back Record objects, each payload its own bytes (a memoryview over them
 * would cost more than the rest of the record's read): nothing a caller keeps pins a segment
 * or a batch, and none ever shows other bytes.
 * They hold the GIL but for a payload of RECORD_UNLOCKED_SIZE or more.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "module.h"
#include "module_reader.h"
#include "wal_batch.h"

#define RECORD_UNLOCKED_SIZE (256u << 10)

/* ---- running without the GIL ----------------------------------------------------------- */

typedef int (*batch_step)(const wal_src *s, void *arg);

/* unlocked -- step(arg) without the GIL until it needs no segment it lacks: each one it
 * stopped for is taken with the GIL, and it runs again from where it stopped (a step keeps
 * its position in arg and moves it past a record only once that record is read).  Returns
 * its status, or -1 with the getter's exception. */
static int unlocked(reader_call *c, batch_step step, void *arg)
{
    for (;;) {
        int st;
        c->need = 0;
        c->nogil = 1;
        Py_BEGIN_ALLOW_THREADS
        st = step(&c->src, arg);
        Py_END_ALLOW_THREADS
        c->nogil = 0;
        if (!c->need)
            return st;
        if (call_take(c, c->need_segno) < 0)
            return -1;
    }
}

/* ---- fill and fetch: arrays and one payload buffer --------------------------------------- */

/*
 * A batch lives in one block: its four arrays (room for cap records) and then its payloads.
 * The block belongs to a BatchBuffer, which exports it read-only to the memoryviews (and the
 * numpy arrays) the batch is made of; when the last of them is gone the block goes back to a
 * small pool for the next batch.  A block fresh from the allocator costs a page fault per
 * 4 KiB touched (about as much as reading the records into it); a pooled one is mapped
 * already, and most likely still in cache.
 */
#define POOL_BLOCKS 4
#define POOL_MAX_BLOCK (8u << 20)

static struct {
    uint8_t *mem;
    size_t size;
} pool[POOL_BLOCKS]; /* (taken and given back with the GIL held) */
static int pool_n;

/* block_take -- a block of size bytes or more: the smallest pooled one that will do, or a new
 * one; NULL with MemoryError. */
static uint8_t *block_take(size_t size, size_t *got)
{
    int best = -1;
    for (int i = 0; i < pool_n; i++)
        if (pool[i].size >= size && (best < 0 || pool[i].size < pool[best].size))
            best = i;
    if (best >= 0) {
        uint8_t *mem = pool[best].mem;
        *got = pool[best].size;
        pool[best] = pool[--pool_n];
        return mem;
    }
    uint8_t *mem = PyMem_RawMalloc(size ? size : 1);
    if (!mem)
        PyErr_NoMemory();
    *got = size;
    return mem;
}

/* block_give -- back to the pool (the largest blocks kept), or freed. */
static void block_give(uint8_t *mem, size_t size)
{
    if (size <= POOL_MAX_BLOCK && pool_n < POOL_BLOCKS) {
        pool[pool_n].mem = mem;
        pool[pool_n++].size = size;
        return;
    }
    int small = -1;
    for (int i = 0; i < pool_n; i++)
        if (pool[i].size < size && size <= POOL_MAX_BLOCK && (small < 0 || pool[i].size < pool[small].size))
            small = i;
    if (small >= 0) {
        PyMem_RawFree(pool[small].mem);
        pool[small].mem = mem;
        pool[small].size = size;
        return;
    }
    PyMem_RawFree(mem);
}

typedef struct {
    PyObject_HEAD
    uint8_t *mem;
    size_t size, used;
} BatchBufferObject;

static void BatchBuffer_dealloc(BatchBufferObject *self)
{
    if (self->mem)
        block_give(self->mem, self->size);
    PyObject_Free(self);
}

static int BatchBuffer_getbuffer(BatchBufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->mem, (Py_ssize_t)self->used, 1, flags);
}

static PyBufferProcs BatchBuffer_as_buffer = {(getbufferproc)BatchBuffer_getbuffer, NULL};

PyTypeObject BatchBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal._core.BatchBuffer",
    .tp_basicsize = sizeof(BatchBufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The memory of one batch of records, exported read-only.",
    .tp_dealloc = (destructor)BatchBuffer_dealloc,
    .tp_as_buffer = &BatchBuffer_as_buffer,
};

typedef struct {
    BatchBufferObject *buf;
    wal_batch b;
} batch_out;

#define RECORD_FIELDS 40 /* bytes of the arrays a record takes: lsn, prev, off, next, len, crc */

/* out_layout -- the arrays and the payloads at their places in the block. */
static void out_layout(batch_out *o, size_t cap, uint64_t data_cap)
{
    uint8_t *mem = o->buf->mem;
    o->b.lsn = (uint64_t *)mem;
    o->b.prev = o->b.lsn + cap;
    o->b.off = o->b.prev + cap;
    o->b.next = o->b.off + cap;
    o->b.len = (uint32_t *)(o->b.next + cap);
    o->b.crc = o->b.len + cap;
    o->b.data = (uint8_t *)(o->b.crc + cap);
    o->b.cap = cap;
    o->b.data_cap = data_cap;
}

/* out_block -- a block for cap records (RECORD_FIELDS bytes each) and data_cap payload bytes
 * in o->buf (its old block given back); -1 with an exception. */
static int out_block(batch_out *o, size_t cap, uint64_t data_cap)
{
    if (cap > (size_t)PY_SSIZE_T_MAX / RECORD_FIELDS ||
        data_cap > PY_SSIZE_T_MAX - RECORD_FIELDS * cap) {
        PyErr_NoMemory();
        return -1;
    }
    size_t got;
    uint8_t *mem = block_take(RECORD_FIELDS * cap + data_cap, &got);
    if (!mem)
        return -1;
    if (o->buf->mem)
        block_give(o->buf->mem, o->buf->size);
    o->buf->mem = mem;
    o->buf->size = got;
    out_layout(o, cap, got - RECORD_FIELDS * cap);
    return 0;
}

static int out_init(batch_out *o, Py_ssize_t max_records, Py_ssize_t max_bytes)
{
    memset(o, 0, sizeof(*o));
    if (max_records < 1 || max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "max_records >= 1 and max_bytes >= 0");
        return -1;
    }
    if (!(o->buf = PyObject_New(BatchBufferObject, &BatchBufferType)))
        return -1;
    o->buf->mem = NULL;
    o->buf->size = o->buf->used = 0;
    if (out_block(o, (size_t)max_records, (uint64_t)max_bytes) < 0) {
        Py_CLEAR(o->buf);
        return -1;
    }
    o->b.cap = (size_t)max_records; /* (the block may be larger: what was asked for holds) */
    o->b.data_cap = (uint64_t)max_bytes;
    return 0;
}

/* out_run -- step until it ends, room made for a first record larger than max_bytes (which
 * then comes alone); the status, or -1 with an exception. */
static int out_run(reader_call *c, batch_out *o, batch_step step, void *arg)
{
    for (;;) {
        int st = unlocked(c, step, arg);
        if (st < 0 || !o->b.want)
            return st;
        uint64_t want = o->b.want;
        if (out_block(o, o->b.cap, want) < 0) /* (b.n is 0: nothing to move) */
            return -1;
        o->b.cap = 1; /* it comes alone */
        o->b.data_cap = want;
        o->b.want = 0;
    }
}

/* out_arrays -- (lsns, prev_lsns, lengths, offsets, data, crcs, next_lsns): memoryviews of
 * the block, cut to what was read; the block's owner goes with them. */
static PyObject *out_arrays(batch_out *o)
{
    uint8_t *mem = o->buf->mem;
    size_t n = o->b.n;
    o->buf->used = (size_t)(o->b.data - mem) + o->b.data_used;
    PyObject *whole = PyMemoryView_FromObject((PyObject *)o->buf);
    Py_CLEAR(o->buf);
    if (!whole)
        return NULL;
    Py_ssize_t at[7][2] = {
        {(uint8_t *)o->b.lsn - mem, 8 * n}, {(uint8_t *)o->b.prev - mem, 8 * n},
        {(uint8_t *)o->b.len - mem, 4 * n}, {(uint8_t *)o->b.off - mem, 8 * n},
        {o->b.data - mem, o->b.data_used}, {(uint8_t *)o->b.crc - mem, 4 * n},
        {(uint8_t *)o->b.next - mem, 8 * n},
    };
    PyObject *t = PyTuple_New(7);
    for (int i = 0; t && i < 7; i++) {
        PyObject *part = PySequence_GetSlice(whole, at[i][0], at[i][0] + at[i][1]);
        if (!part)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, part);
    }
    Py_DECREF(whole);
    return t;
}

static void out_clear(batch_out *o)
{
    Py_CLEAR(o->buf);
}

typedef struct {
    wal_batch *b;
    uint64_t lsn, prev, stop, bad;
    const uint64_t *lsns;
    size_t count, done;
} batch_pos;

static int fill_step(const wal_src *s, void *arg)
{
    batch_pos *p = arg;
    return wal_fill(s, &p->lsn, &p->prev, p->stop, p->b, &p->bad);
}

static int fetch_step(const wal_src *s, void *arg)
{
    batch_pos *p = arg;
    return wal_fetch(s, p->lsns, p->count, &p->done, p->b, &p->bad);
}

/* scan(lsn, expect_prev, stop_lsn, check_body=True)
 *   -> (status, end_lsn, last_lsn, count, bytes, bad_lsn)
 * The chain from lsn to stop_lsn or the first record that fails, each record checked whole
 * (a count: wal_fill without arrays or data, without the GIL); without check_body, headers
 * alone (wal_follow). */
PyObject *Reader_scan(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, stop;
    long long expect;
    int check_body = 1;
    if (!PyArg_ParseTuple(args, "KLK|p", &lsn, &expect, &stop, &check_body))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    uint64_t prev = expect < 0 ? WAL_ANY_PREV : (uint64_t)expect;
    wal_scan_result r = {0};
    if (check_body) {
        c.hold = 1;
        wal_batch count = {.cap = SIZE_MAX, .data_cap = UINT64_MAX};
        batch_pos p = {&count, lsn, prev, stop, 0, NULL, 0, 0};
        r.status = unlocked(&c, fill_step, &p);
        if (r.status < 0)
            return call_done(&c, NULL);
        r.end_lsn = p.lsn;
        r.last_lsn = p.prev == WAL_ANY_PREV ? 0 : p.prev;
        r.count = count.n;
        r.bytes = count.data_used;
        r.bad_lsn = r.status ? p.bad : 0;
    } else {
        wal_follow(&c.src, lsn, prev, stop, &r);
    }
    return call_done(&c, Py_BuildValue("(iKKKKK)", r.status, r.end_lsn, r.last_lsn, r.count,
                                       r.bytes, r.bad_lsn));
}

/* fill(lsn, expect_prev, stop_lsn, max_records, max_bytes)
 *   -> (status, next_lsn, last_lsn, bad_lsn, (lsns, prev_lsns, lengths, offsets, data,
 *       crcs, next_lsns))
 * The chain from lsn, void records stepped over, until stop_lsn, max_records records or
 * max_bytes of payload (a first record larger than that comes alone), or a failure (status
 * nonzero, next_lsn the failing record).  last_lsn: the last record read, void ones
 * included (0: none), the next call's expect_prev.  The arrays are native-endian u64 (u32
 * for lengths and crcs) bytes; payload i is data[offsets[i]:offsets[i] + lengths[i]]. */
PyObject *Reader_fill(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, stop;
    long long expect;
    Py_ssize_t max_records, max_bytes;
    if (!PyArg_ParseTuple(args, "KLKnn", &lsn, &expect, &stop, &max_records, &max_bytes))
        return NULL;
    batch_out o;
    if (out_init(&o, max_records, max_bytes) < 0)
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0) {
        out_clear(&o);
        return NULL;
    }
    c.hold = 1;
    batch_pos p = {&o.b, lsn, expect < 0 ? WAL_ANY_PREV : (uint64_t)expect, stop, 0, NULL, 0, 0};
    int st = out_run(&c, &o, fill_step, &p);
    if (st < 0) {
        out_clear(&o);
        return call_done(&c, NULL);
    }
    PyObject *arrays = out_arrays(&o);
    uint64_t last = p.prev == WAL_ANY_PREV ? 0 : p.prev;
    return call_done(&c, arrays ? Py_BuildValue("(iKKKN)", st, p.lsn, last, p.bad, arrays)
                                : NULL);
}

/* fetch(lsns, max_bytes) -> (status, done, bad_lsn, lsns, prev_lsns, lengths, offsets, data)
 * The records at lsns (a buffer of native-endian u64s), each on its own, in that order,
 * until max_bytes of payload (a first record larger than that comes alone) or a failure
 * (status nonzero at lsns[done]; WAL_VOID_RECORD where a void range starts there). */
PyObject *Reader_fetch(ReaderObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "y*n", &in, &max_bytes))
        return NULL;
    size_t count = (size_t)in.len / 8;
    batch_out o;
    if (out_init(&o, count ? (Py_ssize_t)count : 1, max_bytes) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    reader_call c;
    if (call_begin(self, &c) < 0) {
        out_clear(&o);
        PyBuffer_Release(&in);
        return NULL;
    }
    c.hold = 1;
    batch_pos p = {&o.b, 0, 0, 0, 0, in.buf, count, 0};
    int st = out_run(&c, &o, fetch_step, &p);
    PyObject *arrays = st < 0 ? (out_clear(&o), NULL) : out_arrays(&o);
    PyBuffer_Release(&in);
    return call_done(&c, arrays ? Py_BuildValue("(inKN)", st, (Py_ssize_t)p.done, p.bad, arrays)
                                : NULL);
}

/* ---- records, record and entry: Record objects --------------------------------------- */

typedef struct {
    wal_batch *b;
    uint64_t lsn, prev;
    wal_record *r;
} one_pos;

static int one_step(const wal_src *s, void *arg)
{
    one_pos *p = arg;
    return wal_batch_read(s, p->b, p->lsn, p->prev, p->r);
}

/* read_object -- the record at lsn, its payload (a data record's) in *payload: copied out
 * of a page-sized scratch buffer, or read straight into bytes of its own when larger
 * (without the GIL from RECORD_UNLOCKED_SIZE).  Its status, or -1 with an exception. */
static int read_object(reader_call *c, wal_batch *b, uint64_t lsn, uint64_t prev,
                       wal_record *r, PyObject **payload)
{
    uint8_t scratch[WAL_PAGE_SIZE];
    *payload = NULL;
    b->n = b->data_used = b->want = 0;
    b->cap = 1;
    b->data = scratch;
    b->data_cap = sizeof(scratch);
    int st = wal_batch_read(&c->src, b, lsn, prev, r);
    if (PyErr_Occurred())
        return -1;
    if (st == WAL_BATCH_FULL) {
        if (!(*payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)b->want)))
            return -1;
        b->data = (uint8_t *)PyBytes_AS_STRING(*payload);
        b->data_cap = b->want;
        one_pos p = {b, lsn, prev, r};
        st = b->want >= RECORD_UNLOCKED_SIZE ? unlocked(c, one_step, &p) : one_step(&c->src, &p);
        if (PyErr_Occurred()) {
            Py_CLEAR(*payload);
            return -1;
        }
        /* a length (or type) other than the one room was made for: the bytes changed under
         * the read */
        if (st == WAL_BATCH_FULL ||
            (st == WAL_OK && (r->length != b->data_cap || r->type != WAL_REC_DATA)))
            st = WAL_BAD_CRC;
        if (st != WAL_OK)
            Py_CLEAR(*payload);
        return st;
    }
    if (st == WAL_OK && r->type == WAL_REC_DATA &&
        !(*payload = PyBytes_FromStringAndSize((const char *)scratch, r->length)))
        return -1;
    return st;
}

/* push_record -- append Record(lsn, payload, prev) to list; steals payload. */
static int push_record(PyObject *list, const wal_record *r, PyObject *payload)
{
    PyObject *rec = record_new(r->lsn, r->prev_lsn, payload);
    Py_DECREF(payload);
    if (!rec)
        return -1;
    int rc = PyList_Append(list, rec);
    Py_DECREF(rec);
    return rc;
}

/* records(lsn, expect_prev, stop_lsn, max_records, max_bytes)
 *   -> (status, next_lsn, last_lsn, bad_lsn, [Record])
 * As fill, each record a Record (void ones stepped over). */
PyObject *Reader_records(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, stop;
    long long expect;
    Py_ssize_t max_records, max_bytes;
    if (!PyArg_ParseTuple(args, "KLKnn", &lsn, &expect, &stop, &max_records, &max_bytes))
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    c.hold = 1;
    PyObject *list = PyList_New(0);
    uint64_t prev = expect < 0 ? WAL_ANY_PREV : (uint64_t)expect, bad = 0, bytes = 0;
    wal_batch b = {0};
    int st = WAL_OK;
    while (list && lsn < stop && PyList_GET_SIZE(list) < max_records &&
           bytes < (uint64_t)max_bytes) {
        wal_record r;
        PyObject *payload;
        if ((st = read_object(&c, &b, lsn, prev, &r, &payload)) < 0)
            Py_CLEAR(list);
        else if (st != WAL_OK)
            bad = r.bad_lsn;
        else if (payload && push_record(list, &r, payload) < 0)
            Py_CLEAR(list);
        if (!list || st != WAL_OK)
            break;
        bytes += r.length;
        prev = lsn;
        lsn = r.next_lsn;
    }
    unsigned long long last = prev == WAL_ANY_PREV ? 0 : prev;
    return call_done(&c, list ? Py_BuildValue("(iKKKN)", st, lsn, last, bad, list) : NULL);
}

/* record(lsn) -> (status, bad_lsn, Record or None): the record at lsn on its own (any
 * earlier prev-link); WAL_VOID_RECORD where a void range starts there.  OverflowError for
 * an int that is no u64. */
PyObject *Reader_record(ReaderObject *self, PyObject *arg)
{
    PyObject *index = PyNumber_Index(arg); /* (a numpy integer too) */
    if (!index)
        return NULL;
    unsigned long long lsn = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (lsn == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    c.hold = 1;
    wal_batch b = {0};
    wal_record r;
    PyObject *payload, *rec = NULL;
    int st = read_object(&c, &b, lsn, WAL_ANY_PREV, &r, &payload);
    if (st == WAL_OK && r.type == WAL_REC_VOID)
        st = WAL_VOID_RECORD;
    if (st == WAL_OK && !(rec = record_new(r.lsn, r.prev_lsn, payload)))
        st = -1;
    Py_XDECREF(payload);
    if (st < 0)
        return call_done(&c, NULL);
    return call_done(&c, Py_BuildValue("(iKN)", st, st ? r.bad_lsn : 0ULL,
                                       rec ? rec : Py_NewRef(Py_None)));
}

/* behead -- payload (a fresh bytes of its own) without its first n bytes, in place when large. */
static PyObject *behead(PyObject *payload, Py_ssize_t n)
{
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    if (len < WAL_PAGE_SIZE) {
        PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(payload) + n, len - n);
        Py_DECREF(payload);
        return rest;
    }
    memmove(PyBytes_AS_STRING(payload), PyBytes_AS_STRING(payload) + n, (size_t)(len - n));
    return _PyBytes_Resize(&payload, len - n) < 0 ? NULL : payload;
}

/* entry(lsn, index, prefix) -> (status, bad_lsn, term, payload or None): the record at lsn as
 * a pmemwal.Log entry (log_format.py): its payload starts with the 8 bytes prefix, then u64
 * index, u64 term (little-endian), then the entry's own payload, handed back without them.
 * Status ENTRY_OTHER when the record reads but is not entry index (the caller reads it again
 * to say what it is). */
#define ENTRY_OTHER (-2)
#define ENTRY_HEAD 24

PyObject *Reader_entry(ReaderObject *self, PyObject *args)
{
    unsigned long long lsn, index;
    const char *prefix;
    Py_ssize_t prefix_len;
    if (!PyArg_ParseTuple(args, "KKy#", &lsn, &index, &prefix, &prefix_len))
        return NULL;
    if (prefix_len != 8) {
        PyErr_SetString(PyExc_ValueError, "entry: an 8-byte prefix");
        return NULL;
    }
    reader_call c;
    if (call_begin(self, &c) < 0)
        return NULL;
    c.hold = 1;
    wal_batch b = {0};
    wal_record r;
    PyObject *payload = NULL;
    uint64_t term = 0;
    int st = read_object(&c, &b, lsn, WAL_ANY_PREV, &r, &payload);
    if (st == WAL_OK && r.type == WAL_REC_VOID)
        st = WAL_VOID_RECORD;
    if (st == WAL_OK) {
        const char *p = PyBytes_AS_STRING(payload);
        if (PyBytes_GET_SIZE(payload) < ENTRY_HEAD || memcmp(p, prefix, 8) ||
            le_load64(p + 8) != index)
            st = ENTRY_OTHER;
        else if ((term = le_load64(p + 16)), !(payload = behead(payload, ENTRY_HEAD)))
            st = -1;
    }
    if (st != WAL_OK)
        Py_CLEAR(payload);
    if (st == -1)
        return call_done(&c, NULL);
    return call_done(&c, Py_BuildValue("(iKKN)", st, st > 0 ? r.bad_lsn : 0ULL,
                                       (unsigned long long)term,
                                       payload ? payload : Py_NewRef(Py_None)));
}
