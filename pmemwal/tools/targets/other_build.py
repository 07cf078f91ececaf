"""Another build of pmemwal as a target: ``direct@REV`` runs direct mode at git revision REV,
so that ``pmemwal compare --against REV`` sets two builds of one code path side by side (the
seeds' "master vs patched"), their runs interleaved in one grid.

The revision's tree is exported (``git archive``) into a cache directory named by its commit,
``$PMEMWAL_BUILD_CACHE`` or ``~/.cache/pmemwal/builds/<commit>``, and its C core built there in
place with this interpreter; later comparisons reuse it.  Each run is that tree's own
``pmemwal bench --json`` in a child process (the bench CLI is the interface every revision
has), with this environment's packages and the tree first on ``PYTHONPATH``.  Params become the
bench's options (``segment_size`` -> ``--segment-size``); one the revision's bench does not know
fails that run with its own error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from pmemwal.errors import ConfigError
from pmemwal.tools.targets import RunResult, TargetError, Workload
from pmemwal.tools.targets.common import _empty_dir, _prepare_dir
from pmemwal.tools.targets.pmemwal_modes import interval_for

_BUILD_TIMEOUT_S = 600
_PROGRESS = re.compile(r"^progress: ([\d.]+) s, ([\d.]+) rec/s", re.M)  # its bench's stderr
_STAMP = ".pmemwal-built"


def package_root() -> str:
    """The directory above the pmemwal package this runs (a checkout, or site-packages)."""
    import pmemwal
    return os.path.dirname(os.path.dirname(os.path.abspath(pmemwal.__file__)))


def source_root() -> str:
    """The git checkout this pmemwal runs from (ConfigError where it is not one)."""
    root = package_root()
    if git(root, "rev-parse", "--git-dir") is None:
        raise ConfigError(f"--against needs pmemwal run from a git checkout; {root} is not one")
    return root


def resolve(rev: str, root: str | None = None) -> str:
    """The full commit id of ``rev`` (ConfigError naming it when git does not know it)."""
    root = root or source_root()
    commit = git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if not commit:
        raise ConfigError(f"--against {rev!r}: not a revision of the checkout at {root}")
    return commit


def build(commit: str, root: str | None = None) -> str:
    """The directory holding ``commit``'s tree with its C core built (cached by commit)."""
    root = root or source_root()
    cache = os.environ.get("PMEMWAL_BUILD_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "pmemwal", "builds")
    where = os.path.join(cache, commit)
    if os.path.exists(os.path.join(where, _STAMP)):
        return where
    os.makedirs(where, exist_ok=True)
    archive = subprocess.run(["git", "-C", root, "archive", commit], capture_output=True,
                             timeout=_BUILD_TIMEOUT_S)
    if archive.returncode:
        raise TargetError(f"git archive {commit[:7]}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", where], input=archive.stdout, check=True)
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=where,
                          capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
    if done.returncode:
        raise TargetError(f"building pmemwal at {commit[:7]} failed:\n{done.stderr[-2000:]}")
    open(os.path.join(where, _STAMP), "w").close()
    return where


class OtherBuildTarget:
    """``mode`` of pmemwal at ``rev``, built by ``build``; named ``MODE@REV``."""

    _FLAGS = {"segment_size": "--segment-size", "insert_slots": "--insert-slots",
              "keep_bytes": "--keep", "checkpoint": "--checkpoint", "persist": "--persist"}

    def __init__(self, mode: str, rev: str, commit: str, tree: str) -> None:
        self.name, self.mode, self.rev = f"{mode}@{rev}", mode, rev
        self.commit, self.tree = commit, tree
        from pmemwal.tools.targets import pmemwal_modes
        # This build's target of the same mode: the same params apply to both sides of an
        # A/B, so that none is dropped from REV's side alone (check() refuses, before any
        # run, one that REV's bench cannot be given).
        self._same = {"buffered": pmemwal_modes.BufferedTarget,
                      "direct": pmemwal_modes.DirectTarget}[mode]()
        self.params = self._same.params

    def available(self) -> str | None:
        return None

    def version(self) -> str:
        return f"pmemwal at {self.commit[:7]}"

    def applies(self, param: str) -> bool:
        return self._same.applies(param)

    def check(self, params: dict) -> None:
        """ConfigError, before any run, for a param REV's bench is not given: an A/B must
        differ in the build alone (it used to run REV without it, unsaid)."""
        missing = sorted(name for name in params if name != "prefault" and name not in self._FLAGS)
        if missing:
            raise ConfigError(f"{self.name}: {', '.join(missing)} cannot be passed to the build "
                              f"at {self.rev} (it takes {', '.join(sorted(self._FLAGS))}, "
                              "prefault): drop it or compare without --against")

    def run(self, workload: Workload) -> RunResult:
        _prepare_dir(workload.path)
        try:
            out = self._bench(workload)
        finally:
            _empty_dir(workload.path)
        commit = out.get("append_latency_us") or {}  # flush each: the append is the commit
        return RunResult(
            target=self.name, records=int(out["records"]), bytes=int(out["bytes"]),
            elapsed=float(out["elapsed"]),
            latency_us={k: commit[k] for k in ("p50", "p99", "p999", "mean") if k in commit},
            extra={"version": self.version(), "commit": self.commit, "mode": out.get("mode"),
                   "persist_method": out.get("persist_method"), "stats": out.get("stats"),
                   "segments_after_warm_up": out.get("segments_after_warm_up"),
                   "intervals": out["intervals"]})

    def _bench(self, workload: Workload) -> dict:
        args = ["bench", os.path.join(workload.path, "wal"), "--mode", self.mode,
                "--clients", str(workload.clients), "--size", str(workload.size),
                "--duration", str(workload.duration), "--flush", workload.flush,
                "--progress", str(interval_for(workload.duration)), "--json"]
        for name, value in sorted(workload.params.items()):
            if name == "prefault":
                args.append("--prefault" if value else "--no-prefault")
            elif name in self._FLAGS:
                args += [self._FLAGS[name], str(value)]
            else:
                raise ConfigError(f"param {name!r}: not passed to a build at another revision "
                                  f"(it takes {', '.join(sorted(self._FLAGS))}, prefault)")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (self.tree, os.environ.get("PYTHONPATH")) if p))
        code = "import sys; from pmemwal.tools.cli import main; sys.exit(main())"
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=self.tree, env=env,
                              capture_output=True, text=True,
                              timeout=workload.duration * 10 + 120)
        if done.returncode:
            raise TargetError(f"pmemwal bench at {self.commit[:7]} exited {done.returncode}: "
                              f"{done.stderr.strip()[-1000:]}")
        out = json.loads(done.stdout)
        out["intervals"] = [[float(t), float(r)] for t, r in _PROGRESS.findall(done.stderr)]
        return out


def git(root: str, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or None where git is missing or fails."""
    try:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
