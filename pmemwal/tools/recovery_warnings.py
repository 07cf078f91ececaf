"""The RecoveryWarnings of a checker's own recoveries, counted instead of shown.

A crash checker (pmemwal powerloss) recovers one crash image after another: records set
aside in lost+found, or every record read for want of a valid checkpoint, is what a crash
may leave, and the checker judges the records each recovery returns.  Shown, those
warnings would be hundreds of lines on the user's terminal about the checker's scratch
directories.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

from pmemwal.recovery import RecoveryWarning


@contextmanager
def recovery_warnings() -> Iterator[list[str]]:
    """Catch the RecoveryWarnings given inside: their messages fill the list yielded.
    Any other warning is given on as it came."""
    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecoveryWarning)
        yield said
    for w in caught:
        if issubclass(w.category, RecoveryWarning):
            said.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
