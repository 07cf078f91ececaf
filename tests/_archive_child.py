"""A writer for tests/test_archive.py's SIGKILL test: appends and flushes records of known
content to a WAL that archives to S3, then waits to be killed.

    python _archive_child.py WAL_DIR URL ENDPOINT SEED

Prints "open" once the WAL is open; appends 4.5 segments (1 MiB each), as the archiver ships
them (however late it starts, on a busy machine, what waits for it stays small); then sleeps.
"""

import sys
import time

import pmemwal
from pmemwal.tools.s3_server import storage_options
from _child import payload


def main() -> None:
    path, url, endpoint, seed = sys.argv[1:5]
    wal = pmemwal.open(path, segment_size=1 << 20, archive=url,
                       archive_options=storage_options(endpoint), archive_backoff=0.2)
    print("open", flush=True)
    i, until = 0, wal.insert_lsn + 9 * (1 << 19)
    while wal.insert_lsn < until:
        wal.append(payload(f"{seed}/{i}", 1000 + (i * 7919) % 30000), flush=True)
        i += 1
    time.sleep(3600)  # until killed, the archiver at work


if __name__ == "__main__":
    main()
