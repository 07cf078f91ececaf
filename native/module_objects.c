/*
 * module_objects.c -- the objects reads hand to Python: pmemwal._core.Record, and for a batch
 * the payloads as bytes (split), their first bytes (heads), a Log's entries (entries) and
 * the iterator that hands them out while the log is unchanged (Unchanged).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

#include "module.h"
#include "module_reader.h"

/* ---- pmemwal._core.Record ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    unsigned long long lsn, prev_lsn;
    PyObject *payload;
} RecordObject;

PyObject *record_new(uint64_t lsn, uint64_t prev_lsn, PyObject *payload)
{
    RecordObject *rec = PyObject_New(RecordObject, &RecordType);
    if (!rec)
        return NULL;
    rec->lsn = lsn;
    rec->prev_lsn = prev_lsn;
    Py_INCREF(payload);
    rec->payload = payload;
    return (PyObject *)rec;
}

static PyObject *Record_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"lsn", "payload", "prev_lsn", NULL};
    unsigned long long lsn, prev;
    PyObject *payload;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KOK", kwlist, &lsn, &payload, &prev))
        return NULL;
    (void)type;
    return record_new(lsn, prev, payload);
}

static void Record_dealloc(RecordObject *self)
{
    Py_XDECREF(self->payload);
    PyObject_Free(self);
}

static PyObject *Record_repr(RecordObject *self)
{
    return PyUnicode_FromFormat("Record(lsn=%llu, payload=%R, prev_lsn=%llu)", self->lsn,
                                self->payload, self->prev_lsn);
}

static PyObject *Record_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &RecordType) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    RecordObject *x = (RecordObject *)a, *y = (RecordObject *)b;
    int eq = x->lsn == y->lsn && x->prev_lsn == y->prev_lsn;
    if (eq && (eq = PyObject_RichCompareBool(x->payload, y->payload, Py_EQ)) < 0)
        return NULL;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyMemberDef Record_members[] = {
    {"lsn", T_ULONGLONG, offsetof(RecordObject, lsn), READONLY, "the record's LSN"},
    {"payload", T_OBJECT, offsetof(RecordObject, payload), READONLY,
     "its payload: bytes of its own (a view of its batch's buffer from a RecordBatch)"},
    {"prev_lsn", T_ULONGLONG, offsetof(RecordObject, prev_lsn), READONLY,
     "the LSN of the record before it"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal.Record",
    .tp_basicsize = sizeof(RecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Record(lsn, payload, prev_lsn): a record read back: its LSN, its payload, and "
              "the LSN of the record before it.",
    .tp_new = Record_new,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_repr = (reprfunc)Record_repr,
    .tp_richcompare = Record_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_members = Record_members,
};

/* split(data, offsets, lengths) -> [bytes]: the payloads of a batch (data[offsets[i]:
 * offsets[i] + lengths[i]], offsets u64s, lengths u32s, as many), each bytes of its own:
 * what iterating a batch hands out, made without a Python step per payload. */
PyObject *batch_split(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer data, off, len;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &off, &len))
        return NULL;
    PyObject *list = NULL;
    Py_ssize_t n = off.len / 8;
    if (len.len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "split: as many offsets (u64) as lengths (u32)");
        goto done;
    }
    if (!(list = PyList_New(n)))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t o = ((const uint64_t *)off.buf)[i], l = ((const uint32_t *)len.buf)[i];
        if (o > (uint64_t)data.len || l > (uint64_t)data.len - o) {
            PyErr_SetString(PyExc_ValueError, "split: a payload past the end of the data");
            Py_CLEAR(list);
            goto done;
        }
        PyObject *item = PyBytes_FromStringAndSize((const char *)data.buf + o, (Py_ssize_t)l);
        if (!item) {
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, item);
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&off);
    PyBuffer_Release(&len);
    return list;
}

/* heads(data, offsets, lengths, width) -> bytes: the first width bytes of each payload, one
 * after another (zeros past a shorter one): what a batch's log headers are checked from as
 * an array. */
PyObject *batch_heads(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer data, off, len;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*y*y*n", &data, &off, &len, &width))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = off.len / 8;
    if (len.len / 4 != n || width < 0 || width > 4096) {
        PyErr_SetString(PyExc_ValueError, "heads: as many offsets as lengths, width 0..4096");
        goto done;
    }
    if (!(out = PyBytes_FromStringAndSize(NULL, n * width)))
        goto done;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    memset(dst, 0, (size_t)(n * width));
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t o = ((const uint64_t *)off.buf)[i], l = ((const uint32_t *)len.buf)[i];
        if (o > (uint64_t)data.len || l > (uint64_t)data.len - o) {
            PyErr_SetString(PyExc_ValueError, "heads: a payload past the end of the data");
            Py_CLEAR(out);
            goto done;
        }
        memcpy(dst + i * width, (const uint8_t *)data.buf + o, l < (uint64_t)width ? l : (size_t)width);
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&off);
    PyBuffer_Release(&len);
    return out;
}

/* entries(type, indices, terms, data, offsets, lengths) -> [type(index, term, payload)]: a
 * Log batch's entries as instances of type (a tuple subclass of three: pmemwal.Entry), each
 * payload bytes of its own (indices i64s, terms and offsets u64s, lengths u32s). */
PyObject *batch_entries(PyObject *module, PyObject *args)
{
    (void)module;
    PyTypeObject *type;
    Py_buffer ix, tm, data, off, len;
    if (!PyArg_ParseTuple(args, "O!y*y*y*y*y*", &PyType_Type, &type, &ix, &tm, &data, &off, &len))
        return NULL;
    PyObject *list = NULL;
    Py_ssize_t n = ix.len / 8;
    if (!PyType_IsSubtype(type, &PyTuple_Type) || tm.len / 8 != n || off.len / 8 != n ||
        len.len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "entries: a tuple type, and as many indices, terms, "
                                          "offsets and lengths");
        goto done;
    }
    if (!(list = PyList_New(n)))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t o = ((const uint64_t *)off.buf)[i], l = ((const uint32_t *)len.buf)[i];
        PyObject *entry = NULL;
        if (o > (uint64_t)data.len || l > (uint64_t)data.len - o)
            PyErr_SetString(PyExc_ValueError, "entries: a payload past the end of the data");
        else if ((entry = type->tp_alloc(type, 3))) {
            PyObject *index = PyLong_FromLongLong(((const long long *)ix.buf)[i]);
            PyObject *term = PyLong_FromUnsignedLongLong(((const uint64_t *)tm.buf)[i]);
            PyObject *payload = PyBytes_FromStringAndSize((const char *)data.buf + o, (Py_ssize_t)l);
            PyTuple_SET_ITEM(entry, 0, index);
            PyTuple_SET_ITEM(entry, 1, term);
            PyTuple_SET_ITEM(entry, 2, payload);
            if (!index || !term || !payload)
                Py_CLEAR(entry);
            else if (PyObject_IS_GC(entry) && type->tp_dictoffset == 0)
                PyObject_GC_UnTrack(entry); /* (ints and bytes: no cycle; what the collector
                                               would find out itself, at a cost per entry) */
        }
        if (!entry) {
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, entry);
    }
done:
    PyBuffer_Release(&ix);
    PyBuffer_Release(&tm);
    PyBuffer_Release(&data);
    PyBuffer_Release(&off);
    PyBuffer_Release(&len);
    return list;
}

/*
 * pmemwal._core.Unchanged(items, counter, expected): an iterator over the list items that
 * stops early once the u64 at the start of counter (a buffer another thread may change: the
 * Log's count of rewinds, compactions and resets) is no longer expected; ``given`` says how
 * many it handed out.  What a Python loop would check before each entry, at a C call's cost.
 */
typedef struct {
    PyObject_HEAD
    PyObject *items;
    Py_buffer counter;
    uint64_t expected;
    Py_ssize_t given;
} UnchangedObject;

static PyObject *Unchanged_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)kw;
    PyObject *items;
    unsigned long long expected;
    UnchangedObject *self = (UnchangedObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    if (!PyArg_ParseTuple(args, "O!y*K", &PyList_Type, &items, &self->counter, &expected)) {
        self->counter.obj = NULL;
        Py_DECREF(self);
        return NULL;
    }
    if (self->counter.len < 8) {
        PyErr_SetString(PyExc_ValueError, "Unchanged: the counter is a u64");
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(items);
    self->items = items;
    self->expected = expected;
    return (PyObject *)self;
}

static void Unchanged_dealloc(UnchangedObject *self)
{
    Py_XDECREF(self->items);
    if (self->counter.obj)
        PyBuffer_Release(&self->counter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Unchanged_next(UnchangedObject *self)
{
    if (!self->items || self->given >= PyList_GET_SIZE(self->items))
        return NULL;
    uint64_t now;
    memcpy(&now, self->counter.buf, 8); /* (written under the GIL: no torn value) */
    if (now != self->expected)
        return NULL;
    PyObject *item = PyList_GET_ITEM(self->items, self->given++);
    Py_INCREF(item);
    return item;
}

static PyMemberDef Unchanged_members[] = {
    {"given", T_PYSSIZET, offsetof(UnchangedObject, given), READONLY, "items handed out"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject UnchangedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal._core.Unchanged",
    .tp_basicsize = sizeof(UnchangedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Unchanged(items, counter, expected): items, until the counter changes.",
    .tp_new = Unchanged_new,
    .tp_dealloc = (destructor)Unchanged_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Unchanged_next,
    .tp_members = Unchanged_members,
};

/*
 * pmemwal._core.Refill(refill): an iterator over lists of items that calls refill() for the
 * next list once it has handed out the current one (None, or StopIteration: the iteration
 * ends here; a later next() calls refill again).  ``items`` is the current list and ``given``
 * how many of it were handed out: a follower's position (pmemwal/follow.py) at a C call's
 * cost per record, where a Python generator would cost more than reading the record.
 */
typedef struct {
    PyObject_HEAD
    PyObject *refill;
    PyObject *items;
    Py_ssize_t given;
} RefillObject;

static PyObject *Refill_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)kw;
    PyObject *refill;
    if (!PyArg_ParseTuple(args, "O", &refill))
        return NULL;
    RefillObject *self = (RefillObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    Py_INCREF(refill);
    self->refill = refill;
    self->items = PyList_New(0);
    if (!self->items) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Refill_traverse(RefillObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->refill);
    Py_VISIT(self->items);
    return 0;
}

static int Refill_clear(RefillObject *self)
{
    Py_CLEAR(self->refill);
    Py_CLEAR(self->items);
    return 0;
}

static void Refill_dealloc(RefillObject *self)
{
    PyObject_GC_UnTrack(self);
    Refill_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Refill_next(RefillObject *self)
{
    while (self->given >= PyList_GET_SIZE(self->items)) {
        if (!self->refill)
            return NULL;
        PyObject *more = PyObject_CallNoArgs(self->refill);
        if (!more) {
            if (PyErr_ExceptionMatches(PyExc_StopIteration))
                PyErr_Clear();
            return NULL;
        }
        if (more == Py_None) {
            Py_DECREF(more);
            return NULL;
        }
        if (!PyList_Check(more)) {
            Py_DECREF(more);
            PyErr_SetString(PyExc_TypeError, "Refill: refill() gives a list or None");
            return NULL;
        }
        Py_SETREF(self->items, more);
        self->given = 0;
    }
    PyObject *item = PyList_GET_ITEM(self->items, self->given++);
    Py_INCREF(item);
    return item;
}

static PyMemberDef Refill_members[] = {
    {"items", T_OBJECT, offsetof(RefillObject, items), READONLY, "the current list"},
    {"given", T_PYSSIZET, offsetof(RefillObject, given), READONLY, "its items handed out"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject RefillType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pmemwal._core.Refill",
    .tp_basicsize = sizeof(RefillObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Refill(refill): the items of the lists refill() gives, one list after another.",
    .tp_new = Refill_new,
    .tp_traverse = (traverseproc)Refill_traverse,
    .tp_clear = (inquiry)Refill_clear,
    .tp_dealloc = (destructor)Refill_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Refill_next,
    .tp_members = Refill_members,
};
