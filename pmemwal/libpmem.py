"""The libpmem boundary: PMDK's libpmem, loaded with ctypes at run time.

This is the only module that touches libpmem. It is optional: without it
direct mode persists with msync and the probe says so. Which library is
loaded is decided once, by ``load()``:

- ``PMEMWAL_LIBPMEM`` set to a path or soname: that library;
  set to ``""``, ``none``, ``off`` or ``0``: libpmem is not used;
- otherwise ``libpmem.so.1``, then whatever ``ctypes.util.find_library``
  finds for "pmem".

libpmem reads ``PMEM_IS_PMEM_FORCE`` itself, on the first ``pmem_is_pmem``
call: ``1`` makes every mapping count as pmem (tmpfs development), ``0``
none. Since PMDK 1.5, without it only ranges that libpmem mapped itself
(``pmem_map_file``: MAP_SYNC or device DAX) count as pmem.

The native core calls the flush and copy functions through the raw
addresses exported here (``addr_*``), so no Python runs on the hot path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

ENV_VAR = "PMEMWAL_LIBPMEM"
DISABLED_VALUES = frozenset({"", "none", "off", "0"})
DEFAULT_SONAME = "libpmem.so.1"

# The libpmem API version this module is written against (libpmem.h).
_API_MAJOR = 1
_API_MINOR = 0

_VOID_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t

# name: (restype, argtypes) for every libpmem function used anywhere.
_FUNCTIONS: dict[str, tuple[object, tuple[object, ...]]] = {
    "pmem_check_version": (ctypes.c_char_p, (ctypes.c_uint, ctypes.c_uint)),
    "pmem_errormsg": (ctypes.c_char_p, ()),
    "pmem_is_pmem": (ctypes.c_int, (_VOID_P, _SIZE)),
    "pmem_has_auto_flush": (ctypes.c_int, ()),
    "pmem_persist": (None, (_VOID_P, _SIZE)),
    "pmem_msync": (ctypes.c_int, (_VOID_P, _SIZE)),
    "pmem_flush": (None, (_VOID_P, _SIZE)),
    "pmem_drain": (None, ()),
    "pmem_memcpy_persist": (_VOID_P, (_VOID_P, _VOID_P, _SIZE)),
    "pmem_memcpy_nodrain": (_VOID_P, (_VOID_P, _VOID_P, _SIZE)),
}

# PMDK has no version getter, but release builds embed their source version
# in this log line ("src version: 1.12.1").
_SRC_VERSION = re.compile(rb"src version: (\d+\.\d+[0-9A-Za-z.+~-]*)")


class _DlInfo(ctypes.Structure):
    """glibc's Dl_info, filled by dladdr()."""

    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class LibPmem:
    """A loaded, version-checked libpmem.

    ``path`` is the real file the dynamic linker loaded; ``version`` the PMDK
    release it was built from (or ``"API x.y"`` when the build hides it).
    """

    path: str
    version: str
    api_version: str
    addr_persist: int
    addr_msync: int
    addr_flush: int
    addr_drain: int
    addr_memcpy_persist: int
    addr_memcpy_nodrain: int
    _lib: ctypes.CDLL = field(repr=False, compare=False)

    def is_pmem(self, address: int, length: int) -> bool:
        """Whether libpmem would persist [address, address+length) by flushing."""
        return bool(self._lib.pmem_is_pmem(address, length))

    def persist(self, address: int, length: int) -> None:
        """Flush [address, address+length) from the CPU caches and fence (pmem_persist)."""
        self._lib.pmem_persist(address, length)

    def has_auto_flush(self) -> bool | None:
        """Whether CPU caches are flushed on power loss (eADR); None if unknown."""
        result = self._lib.pmem_has_auto_flush()
        return None if result < 0 else bool(result)

    def errormsg(self) -> str:
        """libpmem's last error message for this thread."""
        return (self._lib.pmem_errormsg() or b"").decode(errors="replace")


def _declare(lib: ctypes.CDLL) -> None:
    """Give every function in ``_FUNCTIONS`` its C signature."""
    for name, (restype, argtypes) in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _address(lib: ctypes.CDLL, name: str) -> int:
    """The entry address of a libpmem function, for the native core."""
    address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    if address is None:  # (never: a symbol dlsym found is not at NULL)
        raise OSError(f"libpmem's {name} has no address")
    return address


def _loaded_file(lib: ctypes.CDLL, fallback: str) -> str:
    """The real path of the file that holds ``lib`` (dladdr on one symbol)."""
    libc = ctypes.CDLL(None)
    libc.dladdr.restype = ctypes.c_int
    libc.dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
    info = _DlInfo()
    if libc.dladdr(_address(lib, "pmem_check_version"), ctypes.byref(info)) and info.dli_fname:
        return os.path.realpath(os.fsdecode(info.dli_fname))
    return fallback


def _api_version(lib: ctypes.CDLL) -> str:
    """The API version libpmem reports, read from its minor-mismatch message."""
    message = lib.pmem_check_version(_API_MAJOR, 0xFFFFFFFF) or b""
    found = re.search(rb"found (\d+)", message)
    return f"{_API_MAJOR}.{int(found.group(1))}" if found else f"{_API_MAJOR}.x"


def _src_version(path: str) -> str | None:
    """The PMDK release embedded in the library file, if the build kept it."""
    try:
        with open(path, "rb") as f:
            found = _SRC_VERSION.search(f.read())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def _open(name: str) -> LibPmem | None:
    """dlopen ``name`` and wrap it; None if it is missing or not a libpmem 1.x."""
    try:
        lib = ctypes.CDLL(name)
        _declare(lib)
    except (OSError, AttributeError):  # not found, or a library without our symbols
        return None
    if lib.pmem_check_version(_API_MAJOR, _API_MINOR) is not None:
        return None
    path = _loaded_file(lib, name)
    api = _api_version(lib)
    return LibPmem(
        path=path,
        version=_src_version(path) or f"API {api}",
        api_version=api,
        addr_persist=_address(lib, "pmem_persist"),
        addr_msync=_address(lib, "pmem_msync"),
        addr_flush=_address(lib, "pmem_flush"),
        addr_drain=_address(lib, "pmem_drain"),
        addr_memcpy_persist=_address(lib, "pmem_memcpy_persist"),
        addr_memcpy_nodrain=_address(lib, "pmem_memcpy_nodrain"),
        _lib=lib,
    )


# Cached for the process: the environment is read once. Two threads racing
# on the first call both dlopen the same, reference-counted library.
@functools.cache
def load() -> LibPmem | None:
    """The process's libpmem, or None when it is disabled or cannot be loaded."""
    choice = os.environ.get(ENV_VAR)
    if choice is not None:
        return None if choice.strip().lower() in DISABLED_VALUES else _open(choice)
    lib = _open(DEFAULT_SONAME)
    if lib is None:
        found = ctypes.util.find_library("pmem")
        lib = _open(found) if found else None
    return lib


def buffer_address(buf: WriteableBuffer) -> int:
    """The address of a writable buffer (mmap, numpy array, bytearray).

    The temporary ctypes view is dropped at once, so the buffer's export is
    released and an mmap can still be closed.
    """
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))
