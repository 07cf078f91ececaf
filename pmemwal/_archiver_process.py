"""``python -m pmemwal._archiver_process``: the archiver process's entry (pmemwal/archiver.py).

Apart from pmemwal.archiver, so that ``-m`` never runs a module that is already imported
(a WAL that archives imports it in the parent)."""

import sys

from pmemwal.archiver import main

sys.exit(main(sys.argv[1:]))
