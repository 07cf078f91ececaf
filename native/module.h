/*
 * module.h -- what the units of the CPython binding (pmemwal._core) share: module.c (the
 * module and the Core type) registers the Reader and SegmentView types that module_reader.c defines.
 */
#ifndef PMEMWAL_MODULE_H
#define PMEMWAL_MODULE_H

#include <Python.h>

#pragma GCC visibility push(hidden)
extern PyTypeObject ReaderType;      /* module_reader.c */
extern PyTypeObject SegmentViewType; /* module_reader.c */
#pragma GCC visibility pop

#endif
