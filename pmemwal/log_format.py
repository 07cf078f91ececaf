"""The log records: how ``pmemwal.Log`` writes entries, rewinds, snapshots and states.

A Log writes four kinds of *log record* into an ordinary WAL (no second
file format): each is one WAL record whose payload starts with this 24-byte
header, little-endian (docs/FORMAT.md, "Log records", says the same):

    0  u16  magic    0x4C50 ("PL")
    2  u8   version  1
    3  u8   kind     1 entry, 2 rewind, 3 snapshot, 4 state
    4  u32  aux      snapshot: 1 when it resets the log; state: how the vote is encoded
    8  u64  index    entry, rewind, snapshot: an entry index; state: the commit index
   16  u64  term     entry, snapshot: that entry's term; state: the current term
   24  ...  body     entry: the payload; state: the vote; others: nothing

How open replays them is log_replay.py's.
"""

from __future__ import annotations

import operator
import struct
from functools import partial
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from pmemwal.errors import CorruptionError, FormatError, LogIndexError, TermError, format_lsn

if TYPE_CHECKING:
    from pmemwal._core import Record

MAGIC = 0x4C50
VERSION = 1
ENTRY, REWIND, SNAPSHOT, STATE = 1, 2, 3, 4
KIND_NAMES = {ENTRY: "entry", REWIND: "rewind", SNAPSHOT: "snapshot", STATE: "state"}
RESET = 1                                   # snapshot aux: the log was reset, not compacted
VOTE_NONE, VOTE_INT, VOTE_STR, VOTE_BYTES = 0, 1, 2, 3  # state aux: the vote's encoding
HEADER = struct.Struct("<HBBIQQ")
HEADER_SIZE = HEADER.size                   # 24
MAX_TERM = (1 << 64) - 1                    # a term is a u64 field
MAX_INDEX = (1 << 63) - 1                   # an index is too, but append_many answers int64
HEADER_DTYPE = np.dtype([("magic", "<u2"), ("version", "u1"), ("kind", "u1"), ("aux", "<u4"),
                         ("index", "<u8"), ("term", "<u8")])


class Entry(NamedTuple):
    """A log entry: its index, its term, and its payload (bytes of its own; a view of its
    batch's buffer from ``EntryBatch.payload``)."""

    index: int  # type: ignore[assignment]  # the entry's number, in place of tuple.index
    term: int
    payload: bytes


new_entry = partial(tuple.__new__, Entry)  # (Entry(*fields) without its Python __new__)
ENTRY_PREFIX = HEADER.pack(MAGIC, VERSION, ENTRY, 0, 0, 0)[:8]  # an entry's header: this,
_ENTRY_HEAD = struct.Struct("<8sQQ")                            # then its index and term


class HardState(NamedTuple):
    """What a Raft node must not forget: its current term, its vote in it, its commit index."""

    term: int = 0
    vote: int | str | bytes | None = None
    commit: int = 0



def out_of_range(index: int, term: int) -> LogIndexError | TermError:
    """The error for an entry's index or term that its header cannot hold (or a negative
    index: never the log's).  Only ever called once packing failed: costs the append nothing."""
    try:  # (2.0, "2": struct's "required argument is not an integer"; numpy's ints are ints)
        term = operator.index(term)
    except TypeError:
        return TermError(f"term must be an int, not {type(term).__name__} {term!r}")
    if not 0 <= term <= MAX_TERM:
        return TermError(f"term {term} does not fit the log: terms are 0..2**64-1")
    if not hasattr(index, "__index__"):
        return LogIndexError(f"an entry index must be an int, not {type(index).__name__} "
                             f"{index!r}")
    return LogIndexError(f"entry {index} does not fit the log: indexes are 0..2**63-1")


def entry_of(index: int, record: Record, segment_size: int) -> Entry:
    """Entry ``index`` from the record the index names for it, which must say so itself (the
    index files hold no checksum: a record of another entry is damage, never an answer)."""
    payload = record.payload
    prefix, at, term = _ENTRY_HEAD.unpack_from(payload) if len(payload) >= HEADER_SIZE \
        else (b"", -1, 0)
    if prefix != ENTRY_PREFIX or at != index:
        raise CorruptionError(record.lsn, record.lsn // segment_size,
                              f"the log's index names the record at {format_lsn(record.lsn)} "
                              f"for entry {index}, but it is "
                              f"{describe(bytes(payload[:HEADER_SIZE])) or 'no log record'}")
    return new_entry((index, term, payload[HEADER_SIZE:]))


def check_entry_record(indices: np.ndarray, lsns: np.ndarray, lengths: np.ndarray,
                       head: np.ndarray, heads: np.ndarray, segment_size: int) -> None:
    """entry_of's test for many records at once (``head``: their headers, ``heads`` the
    same bytes): CorruptionError at the first that is not entry ``indices[i]``."""
    bad = (lengths < HEADER_SIZE) | (head["magic"] != MAGIC) | (head["version"] != VERSION) | \
        (head["kind"] != ENTRY) | (head["index"] != indices.astype(np.uint64))
    if bad.any():
        i = int(np.argmax(bad))
        lsn = int(lsns[i])
        shown = bytes(heads[i]) if lengths[i] >= HEADER_SIZE else b""
        raise CorruptionError(lsn, lsn // segment_size,
                              f"the log's index names the record at {format_lsn(lsn)} for "
                              f"entry {int(indices[i])}, but it is "
                              f"{describe(shown) or 'no log record'}")


def check_headers(lsns: np.ndarray, lengths: np.ndarray, head: np.ndarray) -> None:
    """FormatError at the first record that is not a log record of a version we read."""
    bad = (lengths < HEADER_SIZE) | (head["magic"] != MAGIC) | (head["version"] != VERSION)
    if bad.any():
        i = int(np.argmax(bad))
        what = (f"log format version {head['version'][i]} (this pmemwal reads {VERSION})"
                if lengths[i] >= HEADER_SIZE and head["magic"][i] == MAGIC else "not a log record")
        raise FormatError(f"the record at LSN {format_lsn(int(lsns[i]))} is {what}: "
                          "this WAL was not written by pmemwal.Log")


def dense_entries(head: np.ndarray, next_index: int | None) -> bool:
    """Is this batch only entries numbered consecutively, starting at or below ``next_index``
    (None: anywhere)?  Then it is applied in one step."""
    if not (head["kind"] == ENTRY).all():
        return False
    index = head["index"]
    start = int(index[0])
    if next_index is not None and start > next_index:
        return False
    return bool((index == np.arange(start, start + len(index), dtype=np.uint64)).all())


def describe(payload: bytes) -> dict[str, object] | None:
    """What a WAL record's payload says as a log record (kind and fields), or None when it is
    not one of a version this module reads; for inspection tools (``pmemwal dump``)."""
    if len(payload) < HEADER_SIZE:
        return None
    magic, version, kind, aux, index, term = HEADER.unpack_from(payload)
    if magic != MAGIC or version != VERSION or kind not in KIND_NAMES:
        return None
    if kind == STATE:
        try:
            vote = decode_state(memoryview(payload)).vote
        except (FormatError, ValueError):
            vote = "?"
        return {"kind": "state", "term": term, "vote": vote if not isinstance(vote, bytes)
                else vote.hex(), "commit": index}
    fields: dict[str, object] = {"kind": KIND_NAMES[kind], "index": index}
    if kind in (ENTRY, SNAPSHOT):
        fields["term"] = term
    if kind == SNAPSHOT and aux == RESET:
        fields["reset"] = True
    return fields


def encode_state(state: HardState) -> bytes:
    vote = state.vote
    if vote is None:
        aux, body = VOTE_NONE, b""
    elif isinstance(vote, bool) or not isinstance(vote, (int, str, bytes)):
        raise TypeError(f"vote must be None, an int, a str or bytes, not {type(vote).__name__}")
    elif isinstance(vote, int):
        aux, body = VOTE_INT, str(vote).encode()
    elif isinstance(vote, str):
        aux, body = VOTE_STR, vote.encode()
    else:
        aux, body = VOTE_BYTES, bytes(vote)
    return HEADER.pack(MAGIC, VERSION, STATE, aux, state.commit, state.term) + body


def decode_state(payload: bytes | memoryview) -> HardState:
    _, _, _, aux, commit, term = HEADER.unpack_from(payload)
    body = bytes(payload[HEADER_SIZE:])
    decoders: dict[int, Callable[[bytes], int | str | bytes | None]] = {
        VOTE_NONE: lambda b: None, VOTE_INT: lambda b: int(b), VOTE_STR: lambda b: b.decode(),
        VOTE_BYTES: lambda b: b}
    vote = decoders.get(aux)
    if vote is None:
        raise FormatError(f"log state record with unknown vote encoding {aux}")
    return HardState(term, vote(body), commit)

