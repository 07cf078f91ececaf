"""The one entry point of every crash-torture child:
``python -m pmemwal.tools.torture.child SPEC_JSON``.

The spec names the workload (``workloads.PLUGINS``).  The child writes ``O`` to
stdout (its open, so its recovery, begins), opens the workload's target, writes
``R`` and the workload's ready fields, then runs the workload until the parent kills
it; the workload's lines follow on the same pipe.  A failed open, like any error,
ends the process with status 70 and a traceback on stderr (``childkit``).
"""

from __future__ import annotations

import json
import sys

from pmemwal.tools import mutants
from pmemwal.tools.torture.childkit import Pipe, opened
from pmemwal.tools.torture.workloads import PLUGINS


def main(argv: list[str]) -> None:
    mutants.apply_from_environment()  # PMEMWAL_MUTANT: the run's mutant, in the child too
    spec = json.loads(argv[1])
    workload = PLUGINS[spec["workload"]]
    pipe = Pipe(sys.stdout.fileno())
    pipe.say("O")  # opening: a kill from here on may land inside recovery
    target = opened(lambda: workload.open(spec))
    pipe.say(f"R {workload.ready(target)}")
    workload.run(target, pipe, spec)


if __name__ == "__main__":
    main(sys.argv)
