"""The crash-torture child of the log workload:
``python -m pmemwal.tools._torture_log_child SPEC_JSON`` (see pmemwal.tools.log_workload).

Opens the log as the spec says, writes ``R <persist_method> <first_index>
<last_index>`` to stdout, then runs ``threads`` workers (``log_workload.Worker``)
on it, in the spec's term, until the parent kills it; every event is a pipe
line.  Any error ends the process with status 70 and a traceback on stderr.
"""

from __future__ import annotations

import json
import random
import sys

import pmemwal
from pmemwal.tools._torture_child import Pipe, opened, run_threads, wal_options
from pmemwal.tools.log_workload import Shared, Worker
from pmemwal.tools.torture import record_size


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    pipe = Pipe(sys.stdout.fileno())
    pipe.say("O")  # opening: a kill from here on may land inside recovery
    log = opened(lambda: pmemwal.open_log(spec["dir"], **wal_options(spec)))
    pipe.say(f"R {log.wal.persist_method} {log.first_index} {log.last_index}")
    shared = Shared(log, spec["round"], spec["term"],
                    lambda *event: pipe.say(" ".join(map(str, event))),
                    lambda rng: record_size(rng, spec["segment_size"]))

    def work(thread: int) -> None:
        worker, rng = Worker(shared, thread), random.Random(f"{spec['seed']}/{thread}")
        while True:
            worker.step(rng)

    run_threads(spec["threads"], work)


if __name__ == "__main__":
    main(sys.argv)
