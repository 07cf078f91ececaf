"""``python -m pmemwal._archiver_process``: the archiver process's entry (pmemwal/archiver.py).

Apart from pmemwal.archiver, which the package imports, so that ``-m`` does not run
a module that is already imported."""

import sys

from pmemwal.archiver import main

sys.exit(main(sys.argv[1:]))
