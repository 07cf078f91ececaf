/*
 * module.h -- what the units of the CPython binding (pmemwal._core) share: module.c (the
 * module and the Core type) registers the Reader type that module_reader.c defines and the Record and BatchBuffer
 * types of module_batch.c.
 */
#ifndef PMEMWAL_MODULE_H
#define PMEMWAL_MODULE_H

#include <Python.h>

#pragma GCC visibility push(hidden)
extern PyTypeObject ReaderType;      /* module_reader.c */
extern PyTypeObject RecordType;      /* module_batch.c */
extern PyTypeObject BatchBufferType; /* module_batch.c */
extern PyTypeObject UnchangedType;   /* module_batch.c */
#pragma GCC visibility pop

#endif
