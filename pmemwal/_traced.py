"""The traced core in place of ``pmemwal._core`` (``PMEMWAL_TRACED_CORE=1``).

``pmemwal._core_traced`` is the same C core built with native/trace.h's hooks: it tells the
power-loss simulator (pmemwal.tools.powerloss) of every streaming store, fence and sync.  It
must be in place before any module imports ``pmemwal._core``, so pmemwal/__init__.py calls this
first; a process runs one core or the other, never both.
"""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import os
import sys


def use_traced_core() -> None:
    here = os.path.dirname(__file__)
    found = [path for suffix in importlib.machinery.EXTENSION_SUFFIXES
             for path in glob.glob(os.path.join(here, "_core_traced" + suffix))]
    if not found:
        raise ImportError("PMEMWAL_TRACED_CORE=1, but pmemwal._core_traced is not built "
                          "(setup.py builds it beside pmemwal._core)")
    # the file's init function is PyInit__core: it loads under the name it replaces
    spec = importlib.util.spec_from_file_location("pmemwal._core", found[0])
    if spec is None or spec.loader is None:  # (never: an extension suffix has its loader)
        raise ImportError(f"{found[0]} is not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["pmemwal._core"] = module
    setattr(sys.modules["pmemwal"], "_core", module)
