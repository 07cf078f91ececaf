#!/usr/bin/env bash
# setup.sh -- everything pmemwal needs on a fresh Debian machine with Python 3.11:
# libpmem (through apt, when missing and we are root), a virtual environment in
# .venv, and the package with its test and benchmark dependencies (moto's S3 server among
# them, for the archiving tests), its archiving extra (fsspec, s3fs) and the projects its
# integrations adapt to (eventsourcing, pysyncobj), whose own tests run on it.  Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"

if ! ldconfig -p 2>/dev/null | grep -q 'libpmem\.so\.1'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing libpmem1 (PMDK) with apt-get" >&2
    (apt-get install -y -q libpmem1 >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libpmem1 >/dev/null 2>&1; }) ||
      echo "setup: could not install libpmem1; direct mode will persist with msync" >&2
  else
    echo "setup: libpmem1 is not installed and we are not root (or have no apt):" \
         "direct mode will persist with msync; install the Debian package libpmem1 to use it" >&2
  fi
fi

# pip's output (setuptools' editable-install warnings among it) is shown only when it fails
quiet_pip() {
  local log
  log=$(mktemp)
  if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "setup: pip install $* failed" >&2
    return 1
  fi
  rm -f "$log"
}

python3 -m venv .venv
quiet_pip --upgrade pip
quiet_pip -e '.[test,bench,archive,eventsourcing,pysyncobj]'
echo "setup: .venv has pmemwal (native core built) and its test, bench, archive," \
     "eventsourcing and pysyncobj dependencies" >&2

# Peers for the comparison harness (pmemwal.tools.targets): PMDK's libpmemlog, PostgreSQL
# (initdb, pg_ctl, pgbench), and the Python packages rocksdict and lmdb.  Only with --peers or
# PMEMWAL_PEERS=1; each target that still lacks its peer says so from available().
if [ "${PMEMWAL_PEERS:-0}" = 1 ] || case " $* " in *" --peers "*) true ;; *) false ;; esac; then
  if ldconfig -p 2>/dev/null | grep 'libpmemlog\.so\.1' >/dev/null &&
     ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    :  # both there already
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing the peers libpmemlog1 and postgresql with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    (apt-get install -y -q libpmemlog1 postgresql >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 &&
       apt-get install -y -q libpmemlog1 postgresql >/dev/null 2>&1; }) ||
      echo "setup: could not install libpmemlog1 and postgresql:" \
           "the libpmemlog and postgres targets will say they are unavailable" >&2
  else
    echo "setup: not root (or no apt-get): install the Debian packages libpmemlog1 and" \
         "postgresql yourself for the libpmemlog and postgres targets" >&2
  fi
  quiet_pip -e '.[test,bench,archive,eventsourcing,pysyncobj,peers]'
  echo "setup: .venv has the peers' Python packages too" >&2
fi
