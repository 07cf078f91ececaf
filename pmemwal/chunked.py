"""Columns of fixed-size items kept in sparse chunk files, mapped read-only.

Concern: the storage under the indexes that layers keep beside a WAL (the Log's entry ->
LSN, eventsourcing's notification -> entry).  Item ``i`` lies in the file
``<i // 2^20, 16 hex digits>.<suffix>`` at ``(i % 2^20) * itemsize``; a file is made
full-sized and sparse, so only the pages written take space.  ``write`` syncs what it
wrote (and the directory, the first time this process writes a file) before it returns:
a caller names items in a durable state only after that.  Items are read through
read-only mappings, so memory follows what is read, not what is kept.  Nothing here
writes the WAL.
"""

from __future__ import annotations

import mmap
import os
import re

import numpy as np

from pmemwal.segments import make_directories, storage_errors, sync_directory

CHUNK_BITS = 20
CHUNK = 1 << CHUNK_BITS


class ChunkedColumn:
    """The chunk files ``*.<suffix>`` in directory ``path``, of items of ``dtype``."""

    def __init__(self, path: str, suffix: str, dtype: np.dtype) -> None:
        self.path = path
        self.suffix = suffix
        self.dtype = np.dtype(dtype)
        self._name = re.compile(rf"^([0-9A-F]{{16}})\.{re.escape(suffix)}$")
        self._maps: dict[int, tuple[mmap.mmap, np.ndarray]] = {}
        self._words: dict[int, memoryview] = {}  # a chunk's u64s, for word(): dropped with it
        self._entered: set[int] = set()  # chunks whose directory entry this process synced

    @property
    def file_size(self) -> int:
        return CHUNK * self.dtype.itemsize

    def file(self, chunk: int) -> str:
        return os.path.join(self.path, f"{chunk:016X}.{self.suffix}")

    def missing(self, first: int, stop: int) -> list[int]:
        """The chunks items [first, stop) lie in whose files are missing or short."""
        if first >= stop:
            return []
        gone = []
        for chunk in range(first // CHUNK, (stop - 1) // CHUNK + 1):
            try:
                if os.stat(self.file(chunk)).st_size < self.file_size:
                    gone.append(chunk)
            except FileNotFoundError:
                gone.append(chunk)
        return gone

    def _chunk(self, chunk: int) -> np.ndarray:
        """Chunk ``chunk``'s items, mapped read-only (the file exists: a state named it)."""
        got = self._maps.get(chunk)
        if got is None:
            path = self.file(chunk)
            with storage_errors(f"mapping {path}"), open(path, "rb") as f:
                mapping = mmap.mmap(f.fileno(), self.file_size, prot=mmap.PROT_READ)
            got = self._maps[chunk] = (mapping, np.frombuffer(mapping, self.dtype))
        return got[1]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Items [start, stop): a view of the mapping within one chunk, else a copy."""
        if start >= stop:
            return np.empty(0, self.dtype)
        parts = []
        while start < stop:
            chunk, off = divmod(start, CHUNK)
            n = min(stop - start, CHUNK - off)
            parts.append(self._chunk(chunk)[off:off + n])
            start += n
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def take(self, items: np.ndarray) -> np.ndarray:
        """The items at the (int64) positions ``items``, copied."""
        out = np.empty(len(items), self.dtype)
        chunks, offs = np.divmod(items, CHUNK)
        for chunk in set(chunks.tolist()):     # (not np.unique: it imports numpy.ma, 5 ms)
            at = chunks == chunk
            out[at] = self._chunk(chunk)[offs[at]]
        return out

    def item(self, index: int) -> np.void:
        chunk, off = divmod(index, CHUNK)
        return self._chunk(chunk)[off]

    def word(self, index: int, field: int) -> int:
        """The u64 ``field`` of item ``index`` (items of u64s alone): one read of the mapping,
        without a numpy scalar on the way (a Log's entry reads one per call)."""
        chunk, off = divmod(index, CHUNK)
        words = self._words.get(chunk)
        if words is None:
            words = self._words[chunk] = self._chunk(chunk).view(np.uint64).data.cast("B").cast("Q")
        return words[off * (self.dtype.itemsize // 8) + field]

    def write(self, start: int, items: np.ndarray) -> None:
        """Items [start, start + len(items)), written and synced."""
        data = np.ascontiguousarray(items, self.dtype).view(np.uint8).data  # (a memoryview)
        size, entered = self.dtype.itemsize, []
        with storage_errors(f"writing {self.path}"):
            make_directories(self.path)
            done = 0
            while done < len(items):
                chunk, off = divmod(start + done, CHUNK)
                n = min(len(items) - done, CHUNK - off)
                fd = os.open(self.file(chunk), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    if os.fstat(fd).st_size != self.file_size:
                        os.ftruncate(fd, self.file_size)
                    os.pwrite(fd, data[done * size:(done + n) * size], off * size)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                if chunk not in self._entered:  # (made now, or by a run cut short)
                    entered.append(chunk)
                done += n
            if entered:
                sync_directory(self.path)
                self._entered.update(entered)

    def remove_below(self, first: int) -> None:
        """Delete the chunk files wholly below item ``first`` (a durable state says so)."""
        if not os.path.isdir(self.path):
            return
        gone = False
        for name in os.listdir(self.path):
            match = self._name.match(name)
            if match and (int(match.group(1), 16) + 1) * CHUNK <= first:
                chunk = int(match.group(1), 16)
                if chunk in self._maps:
                    self._words.pop(chunk, None)
                    close_map(self._maps.pop(chunk)[0])  # (its array goes with the pair)
                os.unlink(os.path.join(self.path, name))
                gone = True
        if gone:
            sync_directory(self.path)

    def close(self) -> None:
        self._words.clear()
        for chunk in list(self._maps):
            close_map(self._maps.pop(chunk)[0])


def close_map(mapping: mmap.mmap) -> None:
    """Unmap, the arrays over it let go; a view of it still handed out keeps it mapped
    until that dies."""
    try:
        mapping.close()
    except BufferError:
        pass
