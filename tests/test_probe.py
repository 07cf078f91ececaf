"""Tests for the device probe and the libpmem boundary, on real files.

libpmem reads PMEM_IS_PMEM_FORCE once per process, so probes that depend on
it (or on hiding libpmem) run in a fresh interpreter.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import pmemwal
from pmemwal import ConfigError, _core, libpmem
from pmemwal.device import FORCE_ENV_VAR, MODE_ENV_VAR, MODES, ProbeResult, probe, resolve_mode

REPO_ROOT = Path(__file__).resolve().parent.parent
HIDDEN_LIBPMEM = "/nonexistent/libpmem.so.1"


@pytest.fixture
def fresh_load(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Let a test call libpmem.load() under its own environment, then forget it."""
    libpmem.load.cache_clear()
    yield
    monkeypatch.undo()
    libpmem.load.cache_clear()


def probe_in_subprocess(directory: Path, **env: str) -> dict:
    """probe(directory).as_dict() from a new interpreter with ``env`` added."""
    clean = {k: v for k, v in os.environ.items()
             if k not in (FORCE_ENV_VAR, MODE_ENV_VAR, libpmem.ENV_VAR)}
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH")]
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    code = ("import json, sys; from pmemwal.device import probe; "
            "print(json.dumps(probe(sys.argv[1]).as_dict()))")
    done = subprocess.run(
        [sys.executable, "-c", code, str(directory)],
        env={**clean, **env}, cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    )
    return json.loads(done.stdout)


def test_probe_tmpfs(shm_dir: Path) -> None:
    result = probe(shm_dir)
    assert result.probed_dir == os.path.realpath(shm_dir)
    assert result.fs_type == "tmpfs"
    assert result.mount_point == "/dev/shm"
    assert result.dax_mount is False
    assert result.map_sync is False  # tmpfs refuses MAP_SYNC
    assert not result.is_dax
    assert (result.recommended_mode, result.persist_method) in {
        ("buffered", "fdatasync"), ("direct", "pmem"), ("direct", "msync")}


def test_probe_missing_subdir_uses_ancestor_and_leaves_nothing(shm_dir: Path) -> None:
    wal = shm_dir / "wal" / "deeper"
    result = probe(wal)
    assert result.path == str(wal)
    assert result.probed_dir == os.path.realpath(shm_dir)
    assert result.fs_type == "tmpfs"
    assert list(shm_dir.iterdir()) == []  # no WAL dir made, test file gone


def test_probe_unwritable_dir() -> None:
    result = probe("/sys/pmemwal-probe")
    if result.fs_type != "sysfs":
        pytest.skip("/sys is not sysfs here")
    assert result.probed_dir == "/sys"
    assert result.map_sync is None and result.is_pmem is None
    assert result.recommended_mode == "buffered"
    assert "not writable" in result.reason


def test_force_on_tmpfs_gives_direct_pmem(shm_dir: Path) -> None:
    lib = libpmem.load()
    if lib is None:
        pytest.skip("libpmem cannot be loaded here")
    result = probe_in_subprocess(shm_dir, **{FORCE_ENV_VAR: "1"})
    assert result["pmem_is_pmem_force"] == "1"
    assert result["libpmem_version"] == lib.version
    assert result["is_pmem"] is True
    assert (result["recommended_mode"], result["persist_method"]) == ("direct", "pmem")
    assert result["is_dax"] is False  # pmem only by force: tmpfs is not DAX


def test_hidden_libpmem_gives_buffered(shm_dir: Path) -> None:
    # The force variable alone is not enough: it acts inside libpmem.
    result = probe_in_subprocess(shm_dir, **{libpmem.ENV_VAR: HIDDEN_LIBPMEM, FORCE_ENV_VAR: "1"})
    assert result["libpmem_path"] is None and result["libpmem_version"] is None
    assert result["is_pmem"] is None and result["auto_flush"] is None
    assert (result["recommended_mode"], result["persist_method"]) == ("buffered", "fdatasync")
    assert "libpmem is not loaded" in result["reason"]
    assert "a rule, not a measurement" in result["reason"] and "seed" not in result["reason"]


@pytest.mark.parametrize("value", ["", "none", "off", "0", "OFF", HIDDEN_LIBPMEM])
def test_libpmem_disabled_or_missing(
    value: str, fresh_load: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(libpmem.ENV_VAR, value)
    assert libpmem.load() is None


def test_libpmem_not_a_libpmem(fresh_load: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(libpmem.ENV_VAR, "libc.so.6")  # loads, but lacks the symbols
    assert libpmem.load() is None


def test_libpmem_loaded() -> None:
    lib = libpmem.load()
    if lib is None:
        pytest.skip("libpmem cannot be loaded here")
    assert libpmem.load() is lib
    assert os.path.isfile(lib.path)
    assert lib.api_version.startswith("1.") and lib.version
    addresses = [lib.addr_persist, lib.addr_msync, lib.addr_flush, lib.addr_drain,
                 lib.addr_memcpy_persist, lib.addr_memcpy_nodrain]
    assert all(isinstance(a, int) and a > 0 for a in addresses)
    assert len(set(addresses)) == len(addresses)
    assert lib.has_auto_flush() in (True, False, None)
    assert isinstance(lib.errormsg(), str)
    with mmap.mmap(-1, mmap.PAGESIZE) as anonymous:
        assert isinstance(lib.is_pmem(libpmem.buffer_address(anonymous), mmap.PAGESIZE), bool)


def test_buffer_address() -> None:
    array = np.zeros(16, dtype=np.uint64)
    assert libpmem.buffer_address(array) == array.ctypes.data
    # Leaving the block closes the mapping, which fails if an export is still held.
    with mmap.mmap(-1, mmap.PAGESIZE) as mapping:
        assert libpmem.buffer_address(mapping) % mmap.PAGESIZE == 0


def test_resolve_mode_rejects_unknown(monkeypatch: pytest.MonkeyPatch, shm_dir: Path) -> None:
    monkeypatch.delenv(MODE_ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="auto, buffered, direct"):
        resolve_mode("fast", shm_dir)
    monkeypatch.setenv(MODE_ENV_VAR, "fast")
    with pytest.raises(ValueError, match=MODE_ENV_VAR):
        resolve_mode("auto", shm_dir)


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_resolve_mode_explicit_wins(
    mode: str, monkeypatch: pytest.MonkeyPatch, shm_dir: Path
) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, "buffered" if mode == "direct" else "direct")
    assert resolve_mode(mode, shm_dir) == (mode, None)


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_resolve_mode_env_overrides_auto(
    mode: str, monkeypatch: pytest.MonkeyPatch, shm_dir: Path
) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, mode)
    assert resolve_mode("auto", shm_dir) == (mode, None)


@pytest.mark.parametrize("env", [None, "", "auto"])
def test_resolve_mode_auto_probes(
    env: str | None, monkeypatch: pytest.MonkeyPatch, shm_dir: Path
) -> None:
    if env is None:
        monkeypatch.delenv(MODE_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(MODE_ENV_VAR, env)
    mode, result = resolve_mode("auto", shm_dir / "wal")
    assert isinstance(result, ProbeResult)
    assert mode == result.recommended_mode and mode in MODES


def test_report_and_json(shm_dir: Path) -> None:
    result = probe(shm_dir)
    fields = result.as_dict()
    assert json.loads(json.dumps(fields))["mount_options"] == list(result.mount_options)
    assert fields["is_dax"] is result.is_dax and fields["fs_type"] == "tmpfs"
    lines = str(result).splitlines()
    assert [line.split(":", 1)[0] for line in lines] == list(fields)
    value_columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}
    assert len(value_columns) == 1  # values aligned
    assert "fs_type:" in str(result) and "tmpfs" in str(result)


def test_probe_names_the_crc32c_path(tmp_path):
    """The CRC32C + copy path in use is part of the probe (and so of every harness record);
    PMEMWAL_CPU, read once at load, forces it."""
    assert probe(tmp_path).crc32c_path == _core.CRC32C_IMPL
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMEMWAL_")}
    out = subprocess.run([sys.executable, "-m", "pmemwal.tools.cli", "probe", str(tmp_path),
                          "--json"], env={**env, "PMEMWAL_CPU": "table"}, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert json.loads(out)["crc32c_path"] == "table"


# ---- the persist option: direct mode's persistence chosen, not only probed ----------

def _open_in_subprocess(directory: Path, options: dict, **env: str) -> str:
    """In a new interpreter: open a WAL with ``options``, append and flush a record,
    reopen it, and print its persist method and the record; or the error's type and text."""
    clean = {k: v for k, v in os.environ.items()
             if k not in (FORCE_ENV_VAR, MODE_ENV_VAR, libpmem.ENV_VAR)}
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH")]
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    code = ("import json, sys, pmemwal\n"
            "path, options = sys.argv[1], json.loads(sys.argv[2])\n"
            "try:\n"
            "    with pmemwal.open(path, **options) as wal:\n"
            "        method = wal.persist_method\n"
            "        wal.append(b'kept', flush=True)\n"
            "except pmemwal.WALError as error:\n"
            "    method = f'{type(error).__name__}: {error}'\n"
            "with pmemwal.open(path) as wal:\n"
            "    print(method, [bytes(r.payload) for r in wal.records()])\n")
    done = subprocess.run([sys.executable, "-c", code, str(directory / "wal"), json.dumps(options)],
                          env={**clean, **env}, cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


@pytest.mark.parametrize("persist, expected", [("msync", "msync [b'kept']"),
                                               ("pmem", "pmem [b'kept']"),
                                               ("auto", "pmem [b'kept']")])
def test_persist_chooses_direct_modes_path_under_emulated_pmem(shm_dir: Path, persist,
                                                              expected) -> None:
    """With PMEM_IS_PMEM_FORCE=1 both paths can run in one process (seed 003's grid)."""
    if libpmem.load() is None:
        pytest.skip("libpmem cannot be loaded here")
    out = _open_in_subprocess(shm_dir, {"mode": "direct", "persist": persist},
                              **{FORCE_ENV_VAR: "1"})
    assert out == expected


@pytest.mark.parametrize("env, why", [
    ({}, "libpmem does not take this mapping for persistent memory"),
    ({libpmem.ENV_VAR: HIDDEN_LIBPMEM}, "libpmem is not installed"),
])
def test_persist_pmem_where_it_cannot_be_is_a_config_error(shm_dir: Path, env, why) -> None:
    """Not pmem (tmpfs without the force variable), or no libpmem: a typed error that says
    how to emulate it, and the WAL opens afterwards (the failed open left no lock)."""
    if not env and libpmem.load() is None:
        pytest.skip("libpmem cannot be loaded here")
    out = _open_in_subprocess(shm_dir, {"mode": "direct", "persist": "pmem"}, **env)
    assert out.startswith(f"ConfigError: persist='pmem': {why}")
    assert "PMEM_IS_PMEM_FORCE=1 emulates it" in out and out.endswith("[]")


def test_persist_is_direct_modes_alone(shm_dir: Path) -> None:
    out = _open_in_subprocess(shm_dir, {"mode": "buffered", "persist": "msync"})
    assert out.startswith("ConfigError: persist='msync': buffered mode persists with sync_method")
    with pytest.raises(ConfigError, match="persist='nvme': valid values are auto, pmem, msync"):
        pmemwal.open(shm_dir / "other", persist="nvme")


# ---- probe --measure and the stored calibration --------------------------------------

def test_measure_keeps_the_choice_and_auto_follows_it(shm_dir: Path, tmp_path, monkeypatch):
    """`probe --measure` runs both modes, reports the measured choice beside the rule's, and
    keeps it for the file system: mode="auto" then follows it where the mapping is not pmem
    (here direct, as measured on tmpfs, though the rule says buffered); --forget undoes it."""
    from conftest import cli_runner
    from pmemwal.tools.cli import main

    monkeypatch.setenv("PMEMWAL_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(pmemwal.device, "_recommend",
                        lambda *a: ("buffered", "fdatasync", "not DAX (stand-in rule)"))
    result = cli_runner().invoke(main, ["probe", str(shm_dir / "not" / "yet"), "--measure",
                                        "--seconds", "0.1"])
    assert result.exit_code == 0, result.output + result.stderr
    out = result.stdout
    assert "direct/buffered" in out and re.search(r"^ +8k +[\d,]+ +[\d,]+ +\d+\.\d\d$", out, re.M)
    choice = re.search(r"^measured choice: (\w+) \(([\d.]+)x, geometric mean\); the rule's: "
                       r"buffered$", out, re.M)
    assert choice and choice[1] == ("direct" if float(choice[2]) > 1 else "buffered")
    assert f"in {tmp_path / 'calibration.json'}: mode='auto' uses {choice[1]} here" in out
    stored = json.loads((tmp_path / "calibration.json").read_text())
    (entry,) = stored.values()
    assert entry["mode"] == choice[1] and set(entry["rates"]) == {"8192", "65536"}
    assert not [p for p in shm_dir.iterdir()]       # the scratch WAL and not/yet are gone

    entry["mode"] = "direct"                              # whatever was measured: follow it
    (tmp_path / "calibration.json").write_text(json.dumps(stored))
    with pmemwal.open(shm_dir / "wal") as wal:
        assert wal.mode == "direct" and wal.probe.calibration["mode"] == "direct"
    forgot = cli_runner().invoke(main, ["probe", str(shm_dir), "--forget"])
    assert forgot.exit_code == 0 and json.loads((tmp_path / "calibration.json").read_text()) == {}
    assert forgot.stdout.startswith("forgot the measured choice for ")
    again = cli_runner().invoke(main, ["probe", str(shm_dir), "--forget"])  # nothing stored now
    assert again.exit_code == 0 and "no measured choice was stored" in again.stdout
    assert "forgot" not in again.stdout
    with pmemwal.open(shm_dir / "wal2") as wal:
        assert wal.mode == "buffered"                     # the rule again


def test_a_calibration_never_overrides_persistent_memory(shm_dir: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("PMEMWAL_CALIBRATION", str(tmp_path / "c.json"))
    pmemwal.device.store_calibration(shm_dir, {"mode": "buffered"})
    monkeypatch.setattr(pmemwal.device, "_recommend", lambda *a: ("direct", "pmem", "DAX"))
    assert pmemwal.device.resolve_mode("auto", shm_dir)[0] == "direct"


# ---- MAP_SYNC is a segment's, not the probe's (issue 27, item 17) --------------------------

_MAP_SYNC_CHILD = r"""
import dataclasses, errno, json, sys
import pmemwal
from pmemwal import device, segments
from pmemwal.wal import opening as wal_module  # where the WAL resolves its mode
# The probe's scratch file is DAX (MAP_SYNC worked there), as on XFS or ext4 with dax=inode
# when the directory got the flag after the WAL was made: its segment files are not DAX.
real_resolve = wal_module.resolve_mode
def dax_probe(mode, path):
    mode, probe = real_resolve(mode, path)
    return "direct", dataclasses.replace(probe or device.probe(path), map_sync=True)
wal_module.resolve_mode = dax_probe
pretend = set(json.loads(sys.argv[2]))   # segments whose mapping MAP_SYNC "took" (a hook)
real_map = segments.Segment._map
def map_(self, *, populate, sync):
    out = real_map(self, populate=populate, sync=sync)
    self.map_sync = self.map_sync or (sync and self.segno in pretend)
    return out
segments.Segment._map = map_
wal = pmemwal.open(sys.argv[1], mode="auto", segment_size=1 << 20, background=False,
                   prefault=False)
result = {"persist": wal.persist_method}
try:
    for _ in range(30):
        wal.append(bytes(100_000), flush=True)   # into segment 1 and on
    result["segment_1"] = "appended"
except pmemwal.StorageError as exc:
    result["segment_1"] = errno.errorcode.get(exc.errno, exc.errno)
print(json.dumps(result))
"""


@pytest.mark.parametrize("pretend, expected", [
    ([], {"persist": "msync", "segment_1": "appended"}),       # none DAX: msync, not flushes
    ([0], {"persist": "pmem", "segment_1": errno.errorcode[errno.EOPNOTSUPP]}),  # loudly
])
def test_cache_flushes_persist_only_segments_mapped_with_map_sync(tmp_path, pretend, expected):
    """The probe tested MAP_SYNC on a scratch file, and direct mode chose cache flushes from
    that alone; a segment that refused MAP_SYNC was mapped through the page cache without a
    word, and flush=True then flushed CPU caches over dirty page-cache pages."""
    if libpmem.load() is None:
        pytest.skip("needs libpmem")
    env = {k: v for k, v in os.environ.items() if k not in ("PMEM_IS_PMEM_FORCE", "PMEMWAL_MODE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", _MAP_SYNC_CHILD, str(tmp_path / "wal"),
                          json.dumps(pretend)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected


_FORCE_CHILD = r"""
import json, sys, warnings
import pmemwal
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    wal = pmemwal.open(sys.argv[1], mode="direct", segment_size=1 << 20)
    method = wal.persist_method
    wal.close()
probe = pmemwal.probe(sys.argv[1])
print(json.dumps({"persist": method, "warned": [str(w.message) for w in caught],
                  "probe": [probe.recommended_mode, probe.persist_method, probe.reason]}))
"""


def _disk_dir(tmp_path: Path) -> Path | None:
    """A directory on a file system that keeps files on a disk (not tmpfs), or None."""
    from pmemwal.device import VOLATILE_FS, fs_type
    for base in (tmp_path, REPO_ROOT):
        if fs_type(base) not in VOLATILE_FS:
            return base
    return None


def test_pmem_is_pmem_force_is_honoured_only_where_memory_is_the_storage(tmp_path, shm_dir):
    """Issue 27, item 18: with PMEM_IS_PMEM_FORCE=1 exported (as benchmark recipes do),
    every WAL the process opened persisted by cache flush, on ext4 over an SSD too, where
    nothing was then durable.  Off tmpfs (and without MAP_SYNC) it is ignored, saying so."""
    if libpmem.load() is None:
        pytest.skip("needs libpmem")
    disk = _disk_dir(tmp_path)
    if disk is None:
        pytest.skip("no directory off tmpfs to try")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMEMWAL_")}
    env.update(PMEM_IS_PMEM_FORCE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH"))
                                          if p))
    import shutil
    import tempfile
    on_disk = tempfile.mkdtemp(dir=disk, prefix=".pmemwal-force-")
    try:
        out = subprocess.run([sys.executable, "-c", _FORCE_CHILD, os.path.join(on_disk, "w")],
                             env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(on_disk, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["persist"] == "msync"
    assert any("PMEM_IS_PMEM_FORCE=1 is set" in w for w in got["warned"]), got
    assert got["probe"][:2] == ["buffered", "fdatasync"] and "is ignored on" in got["probe"][2]
    out = subprocess.run([sys.executable, "-c", _FORCE_CHILD, str(shm_dir / "w")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)             # tmpfs: emulation, as asked
    assert got["persist"] == "pmem" and got["probe"][:2] == ["direct", "pmem"] and \
        not got["warned"]


def test_probe_says_what_pmemwal_mode_makes_auto_opens_use(shm_dir: Path, monkeypatch) -> None:
    """The probe recommends by the file system; PMEMWAL_MODE overrides what mode='auto'
    opens use: the probe says so (and a bad value is the open's error)."""
    from click.testing import CliRunner
    from pmemwal.tools.cli import main
    monkeypatch.setenv("PMEMWAL_MODE", "direct")
    shown = CliRunner().invoke(main, ["probe", str(shm_dir)])
    assert shown.exit_code == 0
    assert "PMEMWAL_MODE=direct is set: open(mode='auto') uses direct here" in shown.output
    as_json = json.loads(CliRunner().invoke(main, ["probe", str(shm_dir), "--json"]).output)
    assert as_json["recommended_mode"] == "buffered" and as_json["auto_opens_use"] == "direct"
    monkeypatch.setenv("PMEMWAL_MODE", "bogus")
    refused = CliRunner().invoke(main, ["probe", str(shm_dir)])
    assert refused.exit_code == 1 and "PMEMWAL_MODE must be one of" in refused.output
