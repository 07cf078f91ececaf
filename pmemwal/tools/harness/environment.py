"""The machine a comparison runs on: the probe of its path, CPU model, frequency
governor and frequency, load, kernel, versions, the build that runs (commit,
uncommitted changes, cflags, CRC32C path) and the PMEM_*/PMEMWAL_* variables; the
governor warning, and the terminal's text of all that.

May touch, reading only: /proc/cpuinfo, /sys's cpufreq files (``_CPU_GLOB``), git of
pmemwal's source tree, and ``pmemwal.probe(path)``.  Writes nothing.
"""

from __future__ import annotations

import datetime
import glob
import os
import platform
import socket
import statistics

import pmemwal
from pmemwal.tools.progress import plural


_CPU_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/"


def collect_environment(path: str) -> dict:
    """What every result row carries: probe, CPU, governor, kernel, versions, env vars."""
    import numpy
    uname = platform.uname()
    probe = pmemwal.probe(path).as_dict()
    return {
        "timestamp": _now(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "nproc": os.cpu_count(),
        "governor": cpu_governor(),
        "energy_perf": _cpu_setting("energy_performance_preference"),
        "kernel": f"{uname.system} {uname.release} {uname.version} {uname.machine}",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pmemwal": pmemwal.__version__,
        "probe": {k: list(v) if isinstance(v, tuple) else v for k, v in probe.items()},
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("PMEM_", "PMEMWAL_"))},
        "machine": machine_state(),  # shown before the runs; each run stores its own
        "build": build_info(),
    }


def build_info() -> dict:
    """Which pmemwal ran: its version, the git commit of its source tree and whether that
    had uncommitted changes (None outside a git checkout), the C core's compiler flags and
    its CRC32C + copy path; so that two builds compared (A/B) say what each side was."""
    from pmemwal import _core
    from pmemwal.tools.targets.other_build import git, package_root

    root = package_root()
    commit = git(root, "rev-parse", "HEAD")
    status = git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {"pmemwal": pmemwal.__version__, "commit": commit,
            "dirty": None if status is None else bool(status), "source": root,
            "cflags": getattr(_core, "BUILD_FLAGS", None), "crc32c_path": _core.CRC32C_IMPL}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model"):
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _cpu_setting(name: str) -> str | None:
    """A cpufreq setting of all CPUs: ``performance``, ``performance x2, powersave x4``, or None."""
    values = []
    for directory in glob.glob(_CPU_GLOB):
        try:
            with open(os.path.join(directory, name)) as f:
                values.append(f.read().strip())
        except OSError:
            continue
    if not values:
        return None
    counts = {v: values.count(v) for v in sorted(set(values))}
    if len(counts) == 1:
        return values[0]
    return ", ".join(f"{v} x{n}" for v, n in counts.items())


def cpu_governor() -> str | None:
    """The CPU frequency governor (all CPUs), or None where /sys does not show it."""
    return _cpu_setting("scaling_governor")


def cpu_mhz() -> float | None:
    """The CPUs' mean current frequency (MHz): cpufreq's scaling_cur_freq, else
    /proc/cpuinfo's "cpu MHz" (which a VM may report as a constant), else None."""
    values = []
    for directory in glob.glob(_CPU_GLOB):
        try:
            with open(os.path.join(directory, "scaling_cur_freq")) as f:
                values.append(int(f.read()) / 1000)
        except (OSError, ValueError):
            continue
    if not values:
        try:
            with open("/proc/cpuinfo") as f:
                values = [float(line.partition(":")[2]) for line in f
                          if line.partition(":")[0].strip() == "cpu MHz"]
        except (OSError, ValueError):
            values = []
    return round(statistics.fmean(values), 1) if values else None


def machine_state() -> dict:
    """What may change between two runs and change their results: the governor, the CPU
    frequency, the load average (1 min).  Recorded at the start and end of each run."""
    return {"governor": cpu_governor(), "mhz": cpu_mhz(), "load": round(os.getloadavg()[0], 2)}


def governor_warning(environment: dict | None = None) -> str | None:
    """A warning unless every CPU runs the ``performance`` governor (and EPP, where shown)."""
    env = environment if environment is not None else {
        "governor": cpu_governor(), "energy_perf": _cpu_setting("energy_performance_preference")}
    governor, epp = env.get("governor"), env.get("energy_perf")
    if governor is None:
        return ("warning: CPU frequency governor not visible (no "
                "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor); results may vary "
                "with CPU frequency scaling")
    if governor != "performance":
        return (f"warning: CPU frequency governor is {governor}, not performance: contended "
                "runs can come out much slower than they should (cpupower frequency-set "
                "-g performance)")
    if epp is not None and epp != "performance":
        return (f"warning: energy_performance_preference is {epp}, not performance: "
                "results may vary with CPU frequency scaling")
    return None


def environment_text(environment: dict, group: str | None = None) -> str:
    """The environment as "key: value" lines, for the terminal (a line whose value was not
    recorded left out).  ``machine`` is the machine's state at the start: compare's, taken
    before its first run, or (``summarize``) the one its first run recorded."""
    env = environment
    probe = env.get("probe") or {}
    where = (env.get("config") or {}).get("path") or probe.get("path")
    fs = f" ({probe['fs_type']})" if probe.get("fs_type") else ""
    verdict = (f"{probe.get('recommended_mode')}/{probe.get('persist_method')}: "
               f"{probe.get('reason')}" if probe else "-")
    governor = env.get("governor") or "not visible"
    if env.get("energy_perf"):
        governor += f" (energy_performance_preference {env['energy_perf']})"
    host = [env.get("hostname"), env.get("nproc") and plural(env["nproc"], "CPU")]
    lines = [
        ("run group", group or env.get("run_group") or "-"),
        ("host", ", ".join(str(h) for h in host if h) or None),
        ("cpu", env.get("cpu_model")),
        ("governor", governor),
        ("cpu at start", _machine_text(env.get("machine"))),
        ("kernel", env.get("kernel")),
        ("versions", f"python {env.get('python')}, numpy {env.get('numpy')}, "
                     f"pmemwal {env.get('pmemwal')}"),
        ("build", build_text(env.get("build"))),
        ("against", (f"{env['against']['rev']} = {env['against']['commit'][:7]} (the @ series)"
                     if env.get("against") else "-")),
        ("path", where and where + fs),
        ("probe verdict", verdict),
        ("environment", " ".join(f"{k}={v}" for k, v in (env.get("env") or {}).items()) or "-"),
    ]
    width = max(len(k) for k, _ in lines) + 1
    return "\n".join(f"{k + ':':<{width}} {v}" for k, v in lines if v is not None)


def _machine_text(machine: dict | None) -> str | None:
    """``2596 MHz, load average 1.93 (1 min)`` from a ``machine_state``; None where none
    was recorded (the line is left out), and only what it holds."""
    if not machine:
        return None
    parts = [f"{machine['mhz']:.0f} MHz" if machine.get("mhz") else "frequency not visible"]
    if machine.get("load") is not None:
        parts.append(f"load average {machine['load']:.2f} (1 min)")
    return ", ".join(parts)


def build_text(build: dict | None) -> str:
    """``9a540f9 (uncommitted changes), -O2 ..., CRC32C avx512-vpclmulqdq``."""
    if not build:
        return "not recorded"
    commit = (build["commit"][:7] + (" (uncommitted changes)" if build.get("dirty") else "")
              if build.get("commit") else "not a git checkout")
    return f"{commit}, cflags {build.get('cflags')}, CRC32C {build.get('crc32c_path')}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
