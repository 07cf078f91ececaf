/*
 * module_reader.h -- what the Reader's units share: module_reader.c (the type, its segment
 * source and its one-record methods), module_batch.c (its many-record methods) and
 * module_objects.c (the Record objects they make, and the batch helpers).
 */
#ifndef PMEMWAL_MODULE_READER_H
#define PMEMWAL_MODULE_READER_H

#include <Python.h>

#include "wal_reader.h"

#define READER_CACHE 4
#define READER_KEEP 8

/* A segment buffer the Reader keeps between calls (asking the getter, which is Python and
 * takes the WAL's segment lock, costs more than reading a small record): pins counts the
 * calls using it now; forget() makes every one stale, let go once no call uses it. */
typedef struct {
    uint64_t segno, last_use;
    Py_buffer view;
    int used, pins, stale;
} kept_segment;

typedef struct {
    PyObject_HEAD
    wal_geom g;
    PyObject *getter;
    int salvage; /* page headers unchecked: see wal_src (wal_reader.h) */
    kept_segment kept[READER_KEEP];
    uint64_t uses;
    uint64_t forgets; /* forget()s so far: a buffer the getter gave while one ran is not kept */
} ReaderObject;

/* A segment buffer a call took: have, when the getter gave a whole segment (else there is
 * none: the getter said None, or the file is short); its own view, or one the Reader keeps
 * (kept, pinned for the call). */
typedef struct {
    uint64_t segno;
    Py_buffer view;
    int have;
    kept_segment *kept;
} held_segment;

/* One call's segment buffers: each call has its own, on its stack, so that threads reading
 * through one Reader at once (the getter is Python and lets the GIL go) never release a
 * buffer another call still reads through.  A call keeps at most READER_CACHE of them, the
 * oldest let go first, unless it holds them all (hold: pointers into them stay valid for the
 * whole call, as the batch reader's page cache needs).  nogil: the source runs without the
 * GIL and cannot ask the getter; a segment not held yet is asked for (need) instead, and the
 * caller takes it and runs again. */
typedef struct {
    wal_src src;
    ReaderObject *reader;
    PyObject *getter;
    held_segment fixed[READER_CACHE];
    held_segment *held; /* fixed, or a larger array once a holding call outgrows it */
    size_t n, cap, next;
    int hold, nogil, need;
    int failed; /* the getter raised: every later segment fails at once, the exception kept */
    uint64_t need_segno;
} reader_call;

int call_begin(ReaderObject *r, reader_call *c);
/* reader_forget -- every kept buffer stale: let go now, or by the last call using it. */
void reader_forget(ReaderObject *r);
PyObject *call_done(reader_call *c, PyObject *result);
/* call_take -- ask the getter for segment segno (GIL held) and keep its buffer; -1 with the
 * getter's exception. */
int call_take(reader_call *c, uint64_t segno);

PyObject *Reader_scan(ReaderObject *self, PyObject *args);
PyObject *Reader_fill(ReaderObject *self, PyObject *args);
PyObject *Reader_fetch(ReaderObject *self, PyObject *args);
PyObject *Reader_records(ReaderObject *self, PyObject *args);
PyObject *Reader_record(ReaderObject *self, PyObject *arg);
PyObject *Reader_entry(ReaderObject *self, PyObject *args);
/* module_objects.c */
PyObject *record_new(uint64_t lsn, uint64_t prev_lsn, PyObject *payload);
PyObject *batch_split(PyObject *module, PyObject *args);
PyObject *batch_entries(PyObject *module, PyObject *args);
PyObject *batch_heads(PyObject *module, PyObject *args);

#endif
