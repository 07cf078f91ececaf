/*
 * module.h -- what the units of the CPython binding (pmemwal._core) share: module.c (the
 * module and the Core type) registers the Reader type of module_reader.c, the BatchBuffer
 * type of module_batch.c and the Record and Unchanged types of module_objects.c.
 */
#ifndef PMEMWAL_MODULE_H
#define PMEMWAL_MODULE_H

#include <Python.h>

#pragma GCC visibility push(hidden)
extern PyTypeObject ReaderType;      /* module_reader.c */
extern PyTypeObject RecordType;      /* module_objects.c */
extern PyTypeObject BatchBufferType; /* module_batch.c */
extern PyTypeObject UnchangedType;   /* module_objects.c */
extern PyTypeObject RefillType;      /* module_objects.c */
/* module.c: whether the calling thread runs Python's signal handlers */
int pmemwal_main_thread(void);
/* module_follow.c: the FOLLOW file's progress lines, for readers in other processes */
PyObject *follow_wait(PyObject *m, PyObject *args);
PyObject *follow_publish(PyObject *m, PyObject *args);
PyObject *follow_wake(PyObject *m, PyObject *mapping);
PyObject *follow_atomic_u64(PyObject *m, PyObject *args);
#pragma GCC visibility pop

#endif
