#!/usr/bin/env bash
# setup.sh -- everything pmemwal needs on a fresh Debian machine with Python 3.11:
# libpmem (through apt, when missing and we are root), a virtual environment in
# .venv, and the package with its test dependencies.  Safe to run again.
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

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'
