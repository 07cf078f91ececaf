"""A writer for tests/test_archive.py's SIGKILL test: appends and flushes records of known
content to a WAL that archives to S3, until it is killed.

    python _archive_child.py WAL_DIR URL ENDPOINT SEED

Prints "open" once the WAL is open, then the LSN of every 50th record.
"""

import sys

import pmemwal
from pmemwal.tools.s3_server import storage_options
from _child import payload


def main() -> None:
    path, url, endpoint, seed = sys.argv[1:5]
    wal = pmemwal.open(path, segment_size=1 << 20, archive=url,
                       archive_options=storage_options(endpoint), archive_backoff=0.2)
    print("open", flush=True)
    i = 0
    while True:
        lsn = wal.append(payload(f"{seed}/{i}", 1000 + (i * 7919) % 30000), flush=True)
        if i % 50 == 0:
            print(lsn, flush=True)
        i += 1


if __name__ == "__main__":
    main()
