"""Child processes of tests/test_follow_crash.py: a writer and followers to SIGKILL, and a
power-loss run that holds each crash image to what the writer had published to followers.

Run as ``python _follow_child.py '<json spec>'``; each op writes lines to stdout with one
os.write per line (a SIGKILL never leaves half a line in the pipe):

- writer:   "READY", then "R <lsn> <index> <length>" once each append returned, and
            "A <lsn>" once a flush returned it: every record below <lsn> is acknowledged.
- follower: "Y <lsn> <index> <length> <digest>" for each record yielded; loops until the
            parent's stop file exists, then follows once more until its timeout.
- named:    "S <position>" at start, "P <lsn> <digest>" for each record processed, "c <pos>"
            before each confirm() and "C <pos>" once it returned; "LOST" on FollowerLostError.
- powerloss: one JSON line, what a function of pmemwal.tools.powerloss_follow returned (on
  the traced core).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import sys
import time

import pmemwal

SEG = 1 << 20


def payload(seed: int, index: int, length: int) -> bytes:
    """Record ``index``'s content: its index, then bytes regenerated from (seed, index)."""
    return struct.pack("<Q", index) + hashlib.shake_128(
        struct.pack("<QQ", seed, index)).digest(length - 8)


def digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(bytes(data), digest_size=8).hexdigest()


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def writer(spec: dict) -> None:
    """Appends until killed: flushed appends, unflushed ones, append_many batches."""
    options = {"mode": spec["mode"], "segment_size": SEG, "background": False,
               "shared": spec.get("shared", False)}
    wal = pmemwal.open(spec["dir"], **options)
    rng, seed = random.Random(spec["seed"]), spec["seed"]
    index = spec["seed"] << 32  # (writers of a shared pair number their records apart)
    emit(f"READY {wal.persist_method}")
    while True:
        roll = rng.random()
        n = rng.randrange(2, 12) if roll > 0.8 else 1
        datas = [payload(seed, index + i, rng.choice((24, 200, 3000, 20000))) for i in range(n)]
        if n > 1:
            lsns = wal.append_many(datas).tolist()
        else:
            lsns = [wal.append(datas[0], flush=roll < 0.5)]
        for i, (lsn, data) in enumerate(zip(lsns, datas)):
            emit(f"R {lsn} {index + i} {len(data)}")
        index += n
        if roll < 0.5:
            emit(f"A {lsns[0] + 1}")  # append(flush=True): it and every record before it
        elif n > 1 or roll > 0.7:
            emit(f"A {wal.flush()}")
        if rng.random() < 0.05:
            time.sleep(0.001)
        if spec.get("hold_after") and index - (seed << 32) >= spec["hold_after"]:
            for _ in range(5):  # records no flush covers, then wait for the SIGKILL
                emit(f"R {wal.append(payload(seed, index, 500))} {index} 500")
                index += 1
            emit("HOLD")
            time.sleep(3600)


def follower(spec: dict) -> None:
    """Everything pmemwal.follow yields, until the stop file is there and a last pass
    (started after it appeared) times out."""
    with pmemwal.follow(spec["dir"], timeout=spec["timeout"]) as f:
        while True:
            stop = os.path.exists(spec["stop"])
            for record in f:
                data = bytes(record.payload)
                index = struct.unpack_from("<Q", data)[0] if len(data) >= 8 else -1
                emit(f"Y {record.lsn} {index} {len(data)} {digest(data)}")
            if stop:
                break
    emit("DONE")


def named(spec: dict) -> None:
    """A consumer that processes each record (its line) before it confirms, every k."""
    try:
        f = pmemwal.follow(spec["dir"], name=spec["name"], timeout=spec["timeout"])
    except pmemwal.FollowerLostError as exc:
        emit(f"LOST {exc.__class__.__name__}")
        return
    with f:
        emit(f"S {f.position}")
        count = 0
        while True:
            stop = os.path.exists(spec["stop"])
            for record in f:
                emit(f"P {record.lsn} {digest(record.payload)}")
                count += 1
                if count % spec["k"] == 0:
                    emit(f"c {f.position}")
                    emit(f"C {f.confirm()}")
                if spec.get("hold_after") and count >= spec["hold_after"]:
                    time.sleep(3600)  # (confirmed, now waits for its SIGKILL)
            if stop:
                break
        emit(f"c {f.position}")
        emit(f"C {f.confirm()}")
    emit("DONE")


def powerloss(spec: dict) -> None:
    from pmemwal.tools import powerloss_follow
    run = getattr(powerloss_follow, spec["run"])
    print(json.dumps(run(**spec["options"])), flush=True)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    {"writer": writer, "follower": follower, "named": named, "powerloss": powerloss}[
        spec["op"]](spec)
