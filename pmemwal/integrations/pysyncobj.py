"""A pysyncobj Raft journal on a ``pmemwal.Log``: each entry durable before Raft counts it.

pysyncobj (github.com/bakwc/PySyncObj) keeps a node's Raft log in a *journal*: a list
(``MemoryJournal``) or an mmap'ed file synced only when it is closed (``FileJournal``: until
then entries reach the disk when the kernel writes the pages back, so a power failure can
lose entries the node had acknowledged).  ``PmemwalJournal`` keeps it in a ``pmemwal.Log``.
To use it, give ``SyncObjConf`` a ``JournalPath`` as its ``journalFile``::

    from pysyncobj import SyncObj, SyncObjConf
    from pysyncobj.batteries import ReplCounter
    from pmemwal.integrations.pysyncobj import JournalPath

    counter = ReplCounter()
    conf = SyncObjConf(journalFile=JournalPath("/dev/shm/raft-a"),   # + pmemwal.open's options
                       fullDumpFile="/dev/shm/raft-a.dump")           # snapshots: pysyncobj's
    node = SyncObj("127.0.0.1:4321", ["127.0.0.1:4322", "127.0.0.1:4323"], conf,
                   consumers=[counter])
    counter.inc(sync=True)   # returns once the entry is durable in a majority of the journals

How it hooks in: ``SyncObj.__init__`` makes its journal with ``createJournal(conf.journalFile)``,
a name syncobj.py imports from pysyncobj.journal.  Importing this module wraps that name in
``pysyncobj.syncobj``: a ``JournalPath`` gives a ``PmemwalJournal``, every other value (None,
a str) what it gave before.  No pysyncobj file is changed, and SyncObj, its subclasses, its
consumers and the batteries are used as they are.

The journal is positional, as pysyncobj reads it (``journal[0][1]`` is the first entry's
index, ``journal[-1]`` the last entry, slices are lists): position ``p`` is log entry
``first_index + p``, an item is the tuple ``(command bytes, index, term)``, as FileJournal
returns after a restart.  The operations map onto the log's:

    add(command, idx, term)    append(command, term, sync=True); idx is last_index + 1
    deleteEntriesFrom(p)       truncate_after(first_index + p - 1)   (a new leader's suffix)
    deleteEntriesTo(p)         compact(first_index + p)              (after a snapshot)
    clear()                    reset(last_index, 0)                  (a snapshot installed)
    setCurrentTerm(t, v)       set_state(term=t, vote=v)             (v: a node id or None)
    setRaftCommitIndex(c)      set_state(commit=c) once a second     (see below)

Why every ``add`` syncs: a leader counts its own log toward the majority that commits an
entry as soon as ``add`` returns, and a follower sends its acknowledgement of an
append_entries message before pysyncobj makes its next journal call: there is no later hook
in which to sync a batch before the entries are counted.  Term and vote are durable when
``setCurrentTerm`` returns: Raft needs them on disk before any vote is sent.  The commit
index is Raft's volatile state: a node that restarts with an older one re-learns it from the
leader, so it is stored as FileJournal stores it, on the one-second timer (and with the term
and vote, and on close), at no cost per entry.

Reads: an entry read from the log costs a few appends, and pysyncobj reads each new entry
several times (sent to each follower, checked for commit, applied) and the first and last
on every tick; so the last ``keep_recent`` (4096) to twice that many entries are kept in
memory as well, and the first once read.

A Raft log has no gaps and no term going backwards: ``add`` raises ValueError for an index
that does not follow the last entry's (``TermError``, a ValueError, for a lower term), except
on an empty journal, which takes any next entry, as pysyncobj needs after ``clear()``;
``setCurrentTerm`` raises TermError for a term lower than the stored one.

Snapshots stay pysyncobj's: it writes ``fullDumpFile`` to a temporary file and renames it,
without fsync, then compacts the journal; a power failure right after a compaction can
therefore lose the snapshot that the dropped entries went into.  It writes it from a forked
child (``useFork``, the default); the child drops its copy of the WAL directory's lock at fork
(pmemwal.segments), so a node restarted while such a child of its killed predecessor still
runs opens its journal as usual.
"""

from __future__ import annotations

import operator
import os
from typing import Any

from pysyncobj import journal as _journal
from pysyncobj import syncobj as _syncobj

from pmemwal.log import Log

Item = tuple[bytes, int, int]               # (command, index, term): pysyncobj's journal item
NodeId = Any                                # pysyncobj: a node's id (TCPNode: "host:port") or None
FIRST_COMMIT = 1                            # pysyncobj's commit index before any is stored
RECENT = 4096                               # entries kept in memory behind the last one


class PmemwalJournal(_journal.Journal):
    """pysyncobj's ``Journal`` interface over a ``pmemwal.Log`` in directory ``path``
    (``wal_options`` go to ``pmemwal.open``); the log is ``journal.log``.  The last
    ``keep_recent`` to ``2 * keep_recent`` entries added are kept in memory as well.
    """

    def __init__(self, path: str | os.PathLike[str], *, keep_recent: int = RECENT,
                 **wal_options: Any) -> None:
        self.log = Log(path, **wal_options)
        self._keep = keep_recent
        self._commit = self.log.state.commit or FIRST_COMMIT
        # kept in memory (see "Reads" above): _recent[-1] is the last item, _recent[-2] the
        # one before, and so on; _head is item 0 once read
        self._recent: list[Item] = []
        self._head: Item | None = None

    # ---- entries -----------------------------------------------------------------

    def add(self, command: bytes | str, idx: int, term: int) -> None:
        log = self.log
        follows = idx == log.last_index + 1
        if not len(log) and (not follows or term < log.last_term):
            log.reset(idx - 1, 0)       # empty: the numbering may go on anywhere (a snapshot's)
        elif not follows:
            raise ValueError(f"add(idx={idx}): the journal ends at entry {log.last_index}, "
                             "and a Raft log has no gaps")
        data: bytes = _journal.to_bytes(command)
        log.append(data, term, sync=True)
        self._recent.append((data, idx, term))
        if len(self._recent) > 2 * self._keep:
            del self._recent[:self._keep]

    def __getitem__(self, item: int | slice) -> Item | list[Item]:
        n = len(self.log)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            base = n - len(self._recent)        # position of _recent[0]
            if step == 1 and start >= base:     # (stop may lie before start: then none)
                return self._recent[start - base:max(stop, start) - base]
            return self._read_many(range(start, stop, step), n)
        position = operator.index(item)
        if position < 0:
            position += n
        if not 0 <= position < n:
            raise IndexError(f"journal position {item} out of range (length {n})")
        return self._at(position, n)

    def __len__(self) -> int:
        return len(self.log)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop the items from position ``entryFrom`` on (``del items[entryFrom:]``)."""
        start = slice(entryFrom, None).indices(len(self))[0]
        try:
            self.log.truncate_after(self.log.first_index + start - 1)
        finally:                # (what is kept in memory follows the log, whatever it raised)
            self._forget_beyond_log()

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop the items before position ``entryTo`` (``items = items[entryTo:]``)."""
        start = slice(entryTo, None).indices(len(self))[0]
        try:
            self.log.compact(self.log.first_index + start)
        finally:                # (it may raise after the log moved its first entry)
            self._forget_beyond_log()

    def clear(self) -> None:
        try:
            self.log.reset(self.log.last_index, 0)
        finally:
            self._forget_beyond_log()

    def _forget_beyond_log(self) -> None:
        """Keep in memory only items the log still holds: after a change to the log,
        whether it completed or raised part way (a compaction moves the first entry
        before it truncates the WAL, which may fail)."""
        self._head = None
        log = self.log
        self._recent = [item for item in self._recent
                        if log.first_index <= item[1] <= log.last_index]

    def _at(self, position: int, n: int) -> Item:
        """Item ``position`` of the ``n`` (0 <= position < n)."""
        base = n - len(self._recent)
        if position >= base:
            return self._recent[position - base]
        if position == 0:
            if self._head is None:
                self._head = self._read(0)
            return self._head
        return self._read(position)

    def _read_many(self, positions: range, n: int) -> list[Item]:
        """Items ``positions`` of the ``n``: those older than what is kept in memory read from
        the log in one call (a node loading its journal reads it all)."""
        base, first = n - len(self._recent), self.log.first_index
        read = iter(self.log.entries_at([first + p for p in positions if p < base]))
        items = []
        for p in positions:
            if p < base:
                entry = next(read)
                items.append((entry.payload, entry.index, entry.term))
            else:
                items.append(self._recent[p - base])
        return items

    def _read(self, position: int) -> Item:
        entry = self.log.entry(self.log.first_index + position)
        return bytes(entry.payload), entry.index, entry.term

    # ---- hard state ----------------------------------------------------------------

    def setCurrentTerm(self, term: int, votedForNodeId: NodeId) -> None:
        self.log.set_state(term=term, vote=votedForNodeId, commit=self._commit)

    def getCurrentTerm(self) -> int:
        return self.log.state.term

    def getVotedForNodeId(self) -> NodeId:
        return self.log.state.vote

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit = raftCommitIndex

    def getRaftCommitIndex(self) -> int:
        return self._commit

    def onOneSecondTimer(self) -> None:
        self._store_commit()

    def _store_commit(self) -> None:
        if self._commit != self.log.state.commit:
            self.log.set_state(commit=self._commit)

    # ---- lifecycle -------------------------------------------------------------------

    def _destroy(self) -> None:
        """Store the commit index and close the log (SyncObj.destroy calls it)."""
        if not self.log.closed:
            self._store_commit()
            self.log.close()


class JournalPath(str):
    """A ``SyncObjConf(journalFile=...)`` value: the Raft log goes to a ``PmemwalJournal``
    in directory ``path``, opened with ``wal_options`` (``pmemwal.open``'s, and
    ``keep_recent``)."""

    wal_options: dict[str, Any]

    def __new__(cls, path: str | os.PathLike[str], **wal_options: Any) -> JournalPath:
        self = super().__new__(cls, os.fspath(path))
        self.wal_options = wal_options
        return self


def create_journal(journalFile: str | None = None) -> _journal.Journal:
    """pysyncobj's ``createJournal``, with a ``PmemwalJournal`` for a ``JournalPath``."""
    if isinstance(journalFile, JournalPath):
        return PmemwalJournal(journalFile, **journalFile.wal_options)
    return _journal.createJournal(journalFile)


# SyncObj looks createJournal up in its own module's globals at each construction.
_syncobj.createJournal = create_journal
