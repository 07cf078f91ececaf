"""Build of pmemwal's C core, ``pmemwal._core``; the package metadata is in pyproject.toml.

``PMEMWAL_SANITIZE=address,undefined`` (any list that gcc's ``-fsanitize=`` takes) builds the
core with AddressSanitizer/UBSan instead of optimised: ``-O1 -g``, frame pointers kept, and
undefined behaviour fatal.  Such a build needs the sanitizer runtime loaded first
(``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``); ``.ci/sanitize`` builds one in a scratch
copy of the tree and runs the fuzzers and crash tests against it.

``pmemwal._core_traced`` is the same core built with ``PMEMWAL_TRACE``: native/trace.h's hooks
report every streaming store, fence and sync to the power-loss simulator, which loads it in
place of ``pmemwal._core`` under ``PMEMWAL_TRACED_CORE=1``.
"""

import glob
import os

from setuptools import Extension, setup

WARNINGS = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
compile_args = ["-O2", *WARNINGS]
link_args: list[str] = []

sanitize = os.environ.get("PMEMWAL_SANITIZE", "").strip()
if sanitize:
    flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    compile_args = ["-O1", "-g", *WARNINGS, *flags]
    link_args = flags

SOURCES = ["native/module.c", "native/module_reader.c", "native/module_batch.c",
           "native/module_objects.c", "native/module_follow.c", "native/wal_core.c", "native/wal_insert.c",
           "native/wal_flush.c", "native/wal_shared.c", "native/wal_reader.c",
           "native/wal_batch.c", "native/wal_follow.c", "native/crc32c.c", "native/trace.c"]


def core(name: str, *macros: tuple[str, str]) -> Extension:
    return Extension(
        name, sources=SOURCES, include_dirs=["native"],
        depends=sorted(glob.glob("native/*.h")),  # a changed header rebuilds the core
        extra_compile_args=compile_args, extra_link_args=link_args,
        # recorded with every comparison (pmemwal.tools.harness), so A/B runs say
        # what each side was built with
        define_macros=[("PMEMWAL_BUILD_FLAGS", '"' + " ".join(compile_args) + '"'), *macros])


setup(
    ext_modules=[
        core("pmemwal._core"),
        # the same core with native/trace.h's hooks compiled in, for the power-loss
        # simulator only (PMEMWAL_TRACED_CORE=1 loads it in place of pmemwal._core)
        core("pmemwal._core_traced", ("PMEMWAL_TRACE", "1")),
    ],
)
