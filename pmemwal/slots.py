"""A small file of two slots written in turn: crash-atomic updates of a few hundred bytes.

Each slot is 512 bytes, its last 4 a CRC-32C of the rest, so a slot torn by a crash reads
as invalid and the other, older one still stands (LMDB's two meta pages).  The slots lie
4 KiB apart (offsets 0 and 4096), in blocks of their own: a device that rewrites a whole
block to write a sector (512e disks) cannot tear both with one write.  Writers put
update n in slot ``n % 2`` with pwrite and fdatasync; readers take the valid slot with the
higher sequence number, which the slot's owner keeps in its body (pmemwal/checkpoint.py,
pmemwal/log_index.py).  A missing file is made whole: written to ``<name>.tmp``, synced,
renamed and its directory synced.
"""

from __future__ import annotations

import os
import struct

from pmemwal import _core
from pmemwal.segments import storage_errors, sync_directory

SLOT_SIZE = 512
SLOT_STRIDE = 4096
BODY_SIZE = SLOT_SIZE - 4
_CRC = struct.Struct("<I")


def seal(body: bytes) -> bytes:
    """A slot: ``body`` zero-padded, then its CRC."""
    if len(body) > BODY_SIZE:
        raise ValueError(f"a slot body holds at most {BODY_SIZE} bytes, not {len(body)}")
    padded = body + bytes(BODY_SIZE - len(body))
    return padded + _CRC.pack(_core.crc32c(padded))


def unseal(slot: bytes) -> bytes | None:
    """The body of a slot whose CRC matches, else None."""
    if len(slot) != SLOT_SIZE or _CRC.unpack_from(slot, BODY_SIZE)[0] != _core.crc32c(slot[:BODY_SIZE]):
        return None
    return slot[:BODY_SIZE]


class SlotPair:
    """The two slots of the file at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, checked: bool = True) -> list[bytes | None]:
        """Both slots' bodies (None: torn, damaged, or no file); ``checked=False``: as they
        are, CRC or not (None: no file, or too short)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(SLOT_STRIDE + SLOT_SIZE)
        except FileNotFoundError:
            return [None, None]
        slots = [data[i:i + SLOT_SIZE] for i in (0, SLOT_STRIDE)]
        if not checked:
            return [slot[:BODY_SIZE] if len(slot) == SLOT_SIZE else None for slot in slots]
        return [unseal(slot) for slot in slots]

    def write(self, which: int, body: bytes) -> None:
        """Seal ``body`` into slot ``which`` (0 or 1), durably."""
        slot = seal(body)
        with storage_errors(f"writing {self.path}"):
            if not os.path.exists(self.path):  # (another process of a shared WAL may make it)
                self._create(which, slot)
                return
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, slot, which * SLOT_STRIDE)
                os.fdatasync(fd)
            finally:
                os.close(fd)

    def _create(self, which: int, slot: bytes) -> None:
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = bytearray(SLOT_STRIDE + SLOT_SIZE)
            data[which * SLOT_STRIDE:which * SLOT_STRIDE + SLOT_SIZE] = slot
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
        sync_directory(os.path.dirname(self.path))

