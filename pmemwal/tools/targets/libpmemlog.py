"""The ``libpmemlog`` target: PMDK's libpmemlog through ctypes."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os

from pmemwal.errors import ConfigError
from pmemwal.tools.targets import RunResult, TargetError, Workload
from pmemwal.tools.targets.common import (_available_or_raise, _check_params, _Clients,
                                          _empty_dir, _Nothing, _prepare_dir, _size_param,
                                          _thread_result)


_PMEMLOG_SONAME = "libpmemlog.so.1"
_ENOSPC = 28

# name: (restype, argtypes), every libpmemlog function used
_PMEMLOG_FUNCTIONS: dict[str, tuple[object, tuple[object, ...]]] = {
    "pmemlog_check_version": (ctypes.c_char_p, (ctypes.c_uint, ctypes.c_uint)),
    "pmemlog_errormsg": (ctypes.c_char_p, ()),
    "pmemlog_create": (ctypes.c_void_p, (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint)),
    "pmemlog_close": (None, (ctypes.c_void_p,)),
    "pmemlog_append": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)),
    "pmemlog_tell": (ctypes.c_longlong, (ctypes.c_void_p,)),
    "pmemlog_rewind": (None, (ctypes.c_void_p,)),
    "pmemlog_nbyte": (ctypes.c_size_t, (ctypes.c_void_p,)),
}


@functools.cache
def _pmemlog() -> ctypes.CDLL | str:
    """libpmemlog, declared; or why it cannot be used."""
    try:
        lib = ctypes.CDLL(_PMEMLOG_SONAME, use_errno=True)
        for name, (restype, argtypes) in _PMEMLOG_FUNCTIONS.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as error:
        return (f"{_PMEMLOG_SONAME} cannot be loaded ({error}): install the Debian package "
                "libpmemlog1 (PMDK)")
    mismatch = lib.pmemlog_check_version(1, 0)
    if mismatch:
        return f"{_PMEMLOG_SONAME}: {mismatch.decode(errors='replace')}"
    return lib


def _mapped_file(fragment: str) -> str | None:
    """The path of the first file mapped in this process whose name contains ``fragment``."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if fragment in os.path.basename(path):
                return path
    return None


class LibpmemlogTarget:
    """PMDK's libpmemlog, called through ctypes: ``pmemlog_append`` into one pool.

    One pool file of ``pool_size`` (256 MiB) in PATH, shared by all clients
    (libpmemlog serializes appends with its own lock; each ctypes call releases
    the GIL).  ``pmemlog_append`` persists before it returns (pmem_persist
    where libpmem takes the mapping for pmem, e.g. tmpfs under
    ``PMEM_IS_PMEM_FORCE=1`` or DAX; msync otherwise), so every record is
    durable on return whatever the flush policy: ``group`` and ``end`` run
    the same calls as ``each``.  When the pool is full, the client that hit
    ENOSPC calls ``pmemlog_rewind`` and appends again (inside that record's
    latency).  With ``warm`` (default), the pool is filled once and rewound
    before the clock starts, so no append meets a first-touch page fault.
    """

    name = "libpmemlog"
    params = {"pool_size": 256 << 20, "warm": True}

    def available(self) -> str | None:
        lib = _pmemlog()
        return lib if isinstance(lib, str) else None

    def version(self) -> str:
        if self.available():
            return ""
        path = _mapped_file("libpmemlog") or _PMEMLOG_SONAME
        return f"PMDK {_src_version(path) or 'libpmemlog API 1'}"

    def run(self, workload: Workload) -> RunResult:
        params = _check_params(self, workload)
        pool_size = _size_param(params, "pool_size")
        if pool_size < 8 << 20:
            raise ConfigError(f"pool_size={pool_size}: 8 MiB or more")
        if workload.size > pool_size // 4:
            raise ConfigError(f"size={workload.size}: at most a quarter of pool_size "
                              f"({pool_size} bytes)")
        lib = _available_or_raise(self, _pmemlog)
        _prepare_dir(workload.path)
        pool = None
        try:
            pool_path = os.path.join(workload.path, "pool.log")
            pool = lib.pmemlog_create(os.fsencode(pool_path), pool_size, 0o600)
            if not pool:
                raise TargetError(f"pmemlog_create({pool_path}): "
                                  f"{(lib.pmemlog_errormsg() or b'').decode(errors='replace')}")
            usable = lib.pmemlog_nbyte(pool)
            if params["warm"]:
                _fill_pmemlog(lib, pool, usable)
            rewinds = [0]
            payload = os.urandom(workload.size)

            class Client(_Nothing):
                def write(self) -> None:
                    tries = 0
                    while lib.pmemlog_append(pool, payload, len(payload)) != 0:
                        # full: rewind and append again; another client may refill the
                        # pool between our rewind and our append, so try a few times
                        tries += 1
                        if ctypes.get_errno() != _ENOSPC or tries > 8:
                            raise TargetError(f"pmemlog_append: {_pmemlog_error(lib)}")
                        lib.pmemlog_rewind(pool)
                        rewinds[0] += 1

            measured = _Clients(workload, 0, lambda i: Client()).measure()
            return _thread_result(
                self, workload, measured, pool_size=pool_size, pool_usable=usable,
                rewinds=rewinds[0], warm=bool(params["warm"]), library=_mapped_file("libpmemlog"),
                pmem_is_pmem_force=os.environ.get("PMEM_IS_PMEM_FORCE"),
                durability="pmemlog_append persists before returning: every policy is 'each'",
                terms=None if workload.flush == "each" else
                f"persists every record (libpmemlog cannot batch): stronger than flush "
                f"{workload.flush}, so slower for it")
        finally:
            if pool:
                lib.pmemlog_close(pool)
            _empty_dir(workload.path)


def _fill_pmemlog(lib: ctypes.CDLL, pool: int, usable: int) -> None:
    """Append 1 MiB pieces until the pool is full, then rewind: every page touched once."""
    piece = bytes(1 << 20)
    while lib.pmemlog_tell(pool) + len(piece) <= usable:
        if lib.pmemlog_append(pool, piece, len(piece)) != 0:
            break
    lib.pmemlog_rewind(pool)


def _pmemlog_error(lib: ctypes.CDLL) -> str:
    return (lib.pmemlog_errormsg() or b"").decode(errors="replace") or os.strerror(
        ctypes.get_errno())


def _src_version(path: str) -> str | None:
    """The PMDK release embedded in a PMDK library file (see pmemwal.libpmem)."""
    from pmemwal import libpmem
    return libpmem._src_version(path)
