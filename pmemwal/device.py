"""The device probe: what a WAL directory sits on, and which mode suits it.

``probe(path)`` looks at the nearest existing directory of ``path`` (the WAL
directory may not exist yet) and gathers, never raising for something it
cannot tell (that value is None): the filesystem and its mount options, a
MAP_SYNC test mapping, libpmem and what it says about a test mapping and
about eADR, the CPU's cache-flush instructions and frequency governor.

The recommendation, in order:

1. libpmem loaded and ``pmem_is_pmem`` true on an ordinary shared mapping
   (real pmem, or tmpfs under ``PMEM_IS_PMEM_FORCE=1``): ``direct`` mode,
   persisted by libpmem cache flushes (``pmem``);
2. a MAP_SYNC mapping works (DAX) but libpmem does not vouch for it:
   ``direct`` mode, persisted by ``msync``;
3. otherwise ``buffered`` mode with ``fdatasync``: on a page-cache
   filesystem, first-touch faults and msync make mmapped segments slower
   than pwrite (seed 003).

``resolve_mode`` turns a configured mode (or ``PMEMWAL_MODE``) into the
mode to use.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import mmap
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pmemwal import _core, libpmem
from pmemwal.errors import ConfigError

MODES = ("auto", "buffered", "direct")
MODE_ENV_VAR = "PMEMWAL_MODE"
FORCE_ENV_VAR = "PMEM_IS_PMEM_FORCE"
CPU_FLUSH_INSTRUCTIONS = ("clwb", "clflushopt", "clflush")
TEST_FILE_SIZE = 64 * 1024

_MOUNTINFO = Path("/proc/self/mountinfo")
_CPUINFO = Path("/proc/cpuinfo")
_GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")

# Linux mmap flags that Python's mmap module does not expose.
MAP_SHARED_VALIDATE = 0x03  # fail on unknown flags instead of ignoring them
MAP_SYNC = 0x80000  # DAX only: metadata is durable once a page fault returns
_MAP_FAILED = ctypes.c_void_p(-1).value

# what _mount_of says of a directory: mount point, file system type, options
Mount = tuple[str | None, str | None, tuple[str, ...]]
# a stored calibration (calibration_file's JSON): {"mode": "buffered" or "direct", ...}
Calibration = dict[str, Any]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
)
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


@dataclass(frozen=True)
class ProbeResult:
    """What ``probe`` found; None wherever a value could not be determined."""

    path: str
    probed_dir: str
    mount_point: str | None
    fs_type: str | None
    mount_options: tuple[str, ...]
    dax_mount: bool | None
    map_sync: bool | None
    libpmem_path: str | None
    libpmem_version: str | None
    is_pmem: bool | None
    auto_flush: bool | None
    pmem_is_pmem_force: str | None
    cpu_flush: tuple[str, ...] | None
    cpu_model: str | None
    crc32c_path: str        # the CRC32C + copy code in use (PMEMWAL_CPU forces one)
    governor: str | None
    recommended_mode: str
    persist_method: str
    reason: str
    calibration: Calibration | None = None  # a stored measurement of this file system (calibration_file)

    @property
    def is_dax(self) -> bool:
        """Whether the directory is on a DAX filesystem (mount option or MAP_SYNC)."""
        return bool(self.dax_mount or self.map_sync)

    def as_dict(self) -> dict[str, object]:
        """The fields plus ``is_dax`` (next to map_sync), JSON-serialisable."""
        items = list(dataclasses.asdict(self).items())
        at = [key for key, _ in items].index("map_sync") + 1
        return dict(items[:at] + [("is_dax", self.is_dax)] + items[at:])

    def __str__(self) -> str:
        """A "key: value" line per field, values aligned."""
        fields = self.as_dict()
        width = max(map(len, fields)) + 1
        return "\n".join(f"{key + ':':<{width}} {_show(value)}" for key, value in fields.items())


def _show(value: object) -> str:
    """A field value as a report shows it."""
    if value is None:  # unknown, or (PMEM_IS_PMEM_FORCE) not set
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    if isinstance(value, dict) and "mode" in value:  # a stored calibration
        return (f"{value['mode']} (measured {value.get('direct_over_buffered')}x direct/buffered "
                f"on {value.get('measured_at')}; {calibration_file()})")
    return str(value)


def probe(path: str | os.PathLike[str], *, brief: bool = False) -> ProbeResult:
    """Probe the WAL directory ``path`` (or its nearest existing ancestor).  ``brief``
    leaves out what only a report shows (the CPU's flush instructions and model, the
    governor, libpmem's auto-flush answer: None), as an open needs only the verdict."""
    path = os.path.abspath(path)
    probed_dir = _nearest_dir(path)
    mount = _mount_of(probed_dir)
    mount_point, fs_type, options = mount
    lib = libpmem.load()
    map_sync: bool | None
    is_pmem: bool | None
    write_error: OSError | None
    try:
        map_sync, is_pmem = _test_mappings(probed_dir, lib)
        write_error = None
    except OSError as error:
        map_sync = is_pmem = None
        write_error = error
    ignored = is_pmem and force_ignored(fs_type, map_sync)
    if ignored:
        is_pmem = False
    mode, method, reason = _recommend(lib, is_pmem, map_sync, probed_dir, write_error)
    if ignored:
        reason += (f"; {FORCE_ENV_VAR}=1 is ignored on {fs_type} (not DAX): cache flushes "
                   "would leave records in the page cache, not on the disk")
    if fs_type == "tmpfs":
        reason += ("; tmpfs is volatile (its files die with the machine): durability there "
                   "is a benchmark setting")
    cpu_flush, cpu_model = (None, None) if brief else _cpu()
    return ProbeResult(
        path=path,
        probed_dir=probed_dir,
        mount_point=mount_point,
        fs_type=fs_type,
        mount_options=options,
        dax_mount=None if mount_point is None else bool({"dax", "dax=always"} & set(options)),
        map_sync=map_sync,
        libpmem_path=lib.path if lib else None,
        libpmem_version=lib.version if lib else None,
        is_pmem=is_pmem,
        auto_flush=lib.has_auto_flush() if lib and not brief else None,
        pmem_is_pmem_force=os.environ.get(FORCE_ENV_VAR),
        cpu_flush=cpu_flush,
        cpu_model=cpu_model,
        crc32c_path=_core.CRC32C_IMPL,
        governor=None if brief else _read_line(_GOVERNOR),
        recommended_mode=mode,
        persist_method=method,
        reason=reason,
        calibration=stored_calibration(probed_dir, mount),
    )


VOLATILE_FS = ("tmpfs", "ramfs")


def force_ignored(fs: str | None, map_sync: bool | None) -> bool:
    """Whether ``PMEM_IS_PMEM_FORCE=1`` is set where it would lose data: libpmem then takes
    every mapping for pmem, and on a file system that keeps files on a disk (not tmpfs)
    without MAP_SYNC a cache flush leaves the record in the page cache.  pmemwal honours
    the variable only where memory is the storage anyway (emulation, benchmarks)."""
    return os.environ.get(FORCE_ENV_VAR) == "1" and fs not in VOLATILE_FS and not map_sync


def fs_type(path: str | os.PathLike[str]) -> str | None:
    """The file system type of ``path`` (or of its nearest existing ancestor), from
    mountinfo alone: no mapping, so libpmem is not asked (it reads PMEM_IS_PMEM_FORCE
    once, on the first question)."""
    return _mount_of(_nearest_dir(os.path.abspath(path)))[1]


def resolve_mode(mode: str, path: str | os.PathLike[str]) -> tuple[str, ProbeResult | None]:
    """The mode to use for a WAL at ``path``, and the probe if one was needed.

    An explicit ``buffered`` or ``direct`` wins; ``auto`` defers to
    ``PMEMWAL_MODE`` when set, then to ``probe(path)``: a stored calibration of the
    file system (``pmemwal probe --measure``) where there is one and the mapping is not
    persistent memory, else the probe's rule.
    """
    mode = chosen_mode(mode)
    if mode != "auto":
        return mode, None
    result = probe(path, brief=True)
    if result.calibration and result.persist_method != "pmem":
        return result.calibration["mode"], result
    return result.recommended_mode, result


# ---- calibration: the measured choice, per file system ------------------------------------

CALIBRATION_ENV_VAR = "PMEMWAL_CALIBRATION"


def calibration_file() -> str:
    """Where measured choices are kept: ``$PMEMWAL_CALIBRATION``, else
    ``$XDG_CACHE_HOME/pmemwal/calibration.json`` (``~/.cache/...``).  One entry per file
    system (mount point, type and device number); ``pmemwal probe --measure`` writes it
    and refreshes it, ``--forget`` removes it."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(CALIBRATION_ENV_VAR) or os.path.join(cache, "pmemwal",
                                                               "calibration.json")


def calibration_key(path: str | os.PathLike[str], mount: Mount | None = None) -> str:
    """The file system ``path`` is on, as a calibration entry names it (``mount``: what
    _mount_of said of it, when the caller has it)."""
    directory = _nearest_dir(os.path.abspath(path))
    mount_point, fs, _ = mount or _mount_of(directory)
    return f"{mount_point}:{fs}:{os.stat(directory).st_dev}"


def _calibrations() -> dict[str, Calibration]:
    try:
        with open(calibration_file()) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stored_calibration(path: str | os.PathLike[str], mount: Mount | None = None) -> Calibration | None:
    """The stored measurement for the file system of ``path``, or None."""
    entry = _calibrations().get(calibration_key(path, mount))
    return entry if isinstance(entry, dict) and entry.get("mode") in ("buffered", "direct") \
        else None


def store_calibration(path: str | os.PathLike[str], entry: Calibration | None) -> str:
    """Keep ``entry`` (with its ``mode``) for the file system of ``path``; None removes
    it.  Returns the file."""
    data, key = _calibrations(), calibration_key(path)
    if entry is None:
        data.pop(key, None)
    else:
        data[key] = entry
    where = calibration_file()
    os.makedirs(os.path.dirname(where), exist_ok=True)
    tmp = f"{where}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, where)
    return where


def chosen_mode(mode: str) -> str:
    """``mode``, or for ``auto`` the one ``PMEMWAL_MODE`` names when set (``auto`` if not);
    ConfigError if either names no mode.  An open asks before it makes anything."""
    _check_mode(mode, "mode")
    if mode == "auto":
        mode = os.environ.get(MODE_ENV_VAR) or "auto"
        _check_mode(mode, MODE_ENV_VAR)
    return mode


def _check_mode(mode: str, what: str) -> None:
    """Raise ConfigError (a ValueError), listing the valid modes, unless ``mode`` is one."""
    if mode not in MODES:
        from pmemwal.errors import ConfigError
        raise ConfigError(f"{what} must be one of {', '.join(MODES)}; got {mode!r}")


def _nearest_dir(path: str) -> str:
    """The real path of ``path`` or of its nearest ancestor that is a directory."""
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return os.path.realpath(path)


def _mount_of(directory: str) -> Mount:
    """Mount point, filesystem type and options (per-mount, then superblock).

    The longest mount point containing ``directory`` wins; among stacked
    mounts on one point, the last listed (the visible one).
    """
    try:
        lines = _MOUNTINFO.read_text().splitlines()
    except OSError:
        return None, None, ()
    best: tuple[str | None, str | None, tuple[str, ...]] = (None, None, ())
    for line in lines:
        # "id parent dev root MOUNT_POINT MOUNT_OPTS [optional...] - FSTYPE SOURCE SUPER_OPTS"
        left, separator, right = line.partition(" - ")
        before, after = left.split(), right.split()
        if not separator or len(before) < 6 or len(after) < 3:
            continue
        mount_point = _unescape(before[4])
        if _contains(mount_point, directory) and len(mount_point) >= len(best[0] or ""):
            options = before[5].split(",") + after[2].split(",")
            best = (mount_point, after[0], tuple(dict.fromkeys(options)))
    return best


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _contains(mount_point: str, directory: str) -> bool:
    """Whether ``directory`` lies on or under ``mount_point``."""
    return mount_point == "/" or directory == mount_point or directory.startswith(mount_point + "/")


def _test_mappings(directory: str, lib: libpmem.LibPmem | None) -> tuple[bool, bool | None]:
    """Map a scratch file in ``directory``: (MAP_SYNC works, pmem_is_pmem says yes).

    Raises OSError when no file can be made there. The file is unnamed
    (O_TMPFILE) or unlinked at once, so nothing is left behind.
    """
    with tempfile.TemporaryFile(dir=directory, prefix=".pmemwal-probe-") as f:
        os.posix_fallocate(f.fileno(), 0, TEST_FILE_SIZE)
        map_sync = _map_sync_works(f.fileno(), TEST_FILE_SIZE)
        if lib is None:
            return map_sync, None
        with mmap.mmap(f.fileno(), TEST_FILE_SIZE) as mapping:
            return map_sync, lib.is_pmem(libpmem.buffer_address(mapping), TEST_FILE_SIZE)


def _map_sync_works(fd: int, length: int) -> bool:
    """Whether a MAP_SHARED_VALIDATE | MAP_SYNC mapping of ``fd`` succeeds."""
    flags = MAP_SHARED_VALIDATE | MAP_SYNC
    address = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if address == _MAP_FAILED:  # EOPNOTSUPP off DAX; EINVAL on pre-4.15 kernels
        return False
    _libc.munmap(address, length)
    return True


def _recommend(
    lib: libpmem.LibPmem | None,
    is_pmem: bool | None,
    map_sync: bool | None,
    directory: str,
    write_error: OSError | None,
) -> tuple[str, str, str]:
    """(recommended mode, persist method, reason), by the rules in the module doc."""
    if write_error is not None:
        return "buffered", "fdatasync", (
            f"{directory} is not writable ({write_error.strerror}), so no test mapping "
            "could be made: buffered pwrite+fdatasync is the safe default"
        )
    if lib is not None and (is_pmem or map_sync):
        # A MAP_SYNC mapping keeps file metadata durable, so on DAX a CPU cache
        # flush is a complete persist even where pmem_is_pmem says no for it.
        how = "DAX with MAP_SYNC" if map_sync else "PMEM_IS_PMEM_FORCE or DAX"
        return "direct", "pmem", (
            f"mapping is persistent memory ({how}): records are copied straight into "
            "the segments and persisted with CPU cache flushes"
        )
    if map_sync:
        return "direct", "msync", (
            "DAX mapping (MAP_SYNC works) but libpmem is not loaded: records are copied "
            "straight into the segments and persisted with msync"
        )
    absent = "; libpmem is not loaded" if lib is None else ""
    return "buffered", "fdatasync", (
        "not DAX: mapped segments would go through the page cache (faults, then msync "
        "writing dirty pages back), where pwrite+fdatasync is usually faster; a rule, not a "
        f"measurement of this file system{absent}"
    )


def _cpu() -> tuple[tuple[str, ...] | None, str | None]:
    """(cache-flush instructions present, model name) from the first CPU in /proc/cpuinfo."""
    try:
        first_cpu = _CPUINFO.read_text().split("\n\n", 1)[0]
    except OSError:
        return None, None
    info: dict[str, str] = {}
    for line in first_cpu.splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    flags = info.get("flags")
    if flags is None:  # not x86: no flag list to read
        return None, info.get("model name")
    present = set(flags.split())
    return tuple(i for i in CPU_FLUSH_INSTRUCTIONS if i in present), info.get("model name")


# Direct mode on pmem streams (non-temporal stores, past the cache) every payload piece of at
# least this many bytes, and the headers of records that have one; smaller ones are stored
# through the cache and written back.  With CLWB the written-back line stays cached, and 256 B is
# libpmem's own threshold (Optane writes 256-byte units: a shorter streamed write costs a
# read-modify-write there).  Without CLWB the write-back (CLFLUSHOPT) evicts the line, so the next
# small record misses on it: streaming every record ran 1.9-2.3x faster at 16-200 B records
# on Zen 5 (docs/PERFORMANCE.md, "Zen 5"; docs/notes/2026-12-performance-notebook.md §8.3).
# STREAM_MIN_ENV_VAR (bytes) overrides both, as libpmem's
# PMEM_MOVNT_THRESHOLD does for its own copies (that one is followed too when set).
STREAM_MIN_ENV_VAR = "PMEMWAL_STREAM_MIN"
STREAM_MIN_CLWB = _core.STREAM_MIN  # the core's own default: 256 B
STREAM_MIN_NO_CLWB = 0


def stream_min() -> int:
    """Bytes from which direct mode on pmem streams a record (see STREAM_MIN_CLWB)."""
    for var in (STREAM_MIN_ENV_VAR, "PMEM_MOVNT_THRESHOLD"):
        value = os.environ.get(var, "").strip()
        if value:
            try:
                return max(0, int(value, 0))
            except ValueError:
                raise ConfigError(f"{var}={value!r}: a number of bytes") from None
    flush, _ = _cpu()
    # libpmem flushes with CLFLUSHOPT when told PMEM_NO_CLWB=1, or when the CPU lacks CLWB
    no_clwb = os.environ.get("PMEM_NO_CLWB") == "1" or (flush is not None and "clwb" not in flush)
    return STREAM_MIN_NO_CLWB if no_clwb else STREAM_MIN_CLWB


def _read_line(path: Path) -> str | None:
    """The stripped contents of a one-line sysfs file, None if absent."""
    try:
        return path.read_text().strip()
    except OSError:
        return None
