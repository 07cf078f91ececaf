"""Child process for tests/test_pysyncobj.py: a pysyncobj node on a pmemwal journal.

    python tests/_pysyncobj_node.py '{"mode": "node", ...}'

``node``: a SyncObj holding a ReplDict, its journal a ``JournalPath`` in ``dir``.  With
``writers`` > 0, that many threads set fresh keys through the cluster with ``sync=True``
and print ``ACK key value`` once a write is acknowledged (committed by a majority); with
``report``, the dict is printed as ``STATE {json}`` whenever it changes.  It runs until
killed, or until its parent goes.

``journal``: add entries to a PmemwalJournal in ``dir``, printing ``ADDED idx`` after each
``add`` returns, until killed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from pysyncobj import SyncObj, SyncObjConf, SyncObjException
from pysyncobj.batteries import ReplDict

from pmemwal.integrations.pysyncobj import JournalPath, PmemwalJournal

# No background writer: nothing becomes durable unless the journal itself makes it so.
WAL_OPTIONS = {"segment_size": 1 << 20, "background": False}
POLL = 0.2


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def write_forever(data: ReplDict, prefix: str) -> None:
    """Set fresh keys one by one; print each write the cluster acknowledged."""
    seq = 0
    while True:
        seq += 1
        key = f"{prefix}.{seq}"
        try:
            data.set(key, seq, sync=True, timeout=3)
        except SyncObjException:        # no leader or majority now: it may land or not
            continue
        emit(f"ACK {key} {seq}")


def report_forever(data: ReplDict, parent: int) -> None:
    """Print the dict whenever it changes; stop when the parent goes."""
    last = None
    while os.getppid() == parent:
        try:
            state = json.dumps(dict(data.items()), sort_keys=True)
        except RuntimeError:            # changed size while copied: the tick thread applied one
            continue
        if state != last:
            emit(f"STATE {state}")
            last = state
        time.sleep(POLL)


def run_node(spec: dict) -> None:
    data = ReplDict()
    journal = JournalPath(os.path.join(spec["dir"], "journal"), **WAL_OPTIONS)
    conf = SyncObjConf(journalFile=journal, fullDumpFile=os.path.join(spec["dir"], "dump"),
                       logCompactionMinEntries=spec.get("compact_after", 5000))
    node = SyncObj(spec["self"], spec["others"], conf, consumers=[data])
    parent = os.getppid()
    prefix = f"{spec['self'].rsplit(':', 1)[1]}.{os.getpid()}"
    for i in range(spec.get("writers", 0)):
        threading.Thread(target=write_forever, args=(data, f"{prefix}.{i}"), daemon=True).start()
    if spec.get("report"):
        report_forever(data, parent)
    while os.getppid() == parent:
        time.sleep(POLL)
    node.destroy()


def run_journal(spec: dict) -> None:
    journal = PmemwalJournal(spec["dir"], **WAL_OPTIONS)
    idx = journal.log.last_index
    term = journal.log.last_term
    while True:
        idx += 1
        journal.add(os.urandom(64) + idx.to_bytes(8, "little"), idx, term)
        emit(f"ADDED {idx}")


if __name__ == "__main__":
    SPEC = json.loads(sys.argv[1])
    {"node": run_node, "journal": run_journal}[SPEC["mode"]](SPEC)
