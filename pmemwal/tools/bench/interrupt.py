"""Ctrl-C in the measurement: ``stopping_on_ctrl_c`` has the first SIGINT call ``stop``
(which ends the run as its deadline would, so that the result covers the time until then)
instead of raising KeyboardInterrupt somewhere in the main thread; a second one raises it,
for a run that does not stop.

``pmemwal bench`` asks for it; a library caller (compare's pmemwal target) gets its
KeyboardInterrupt as before.  Only where Ctrl-C would raise KeyboardInterrupt anyway: in the
main thread, with Python's own handler in place (not where SIGINT is ignored or an
application handles it).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def stopping_on_ctrl_c(stop: Callable[[], None], enabled: bool = True) -> Iterator[None]:
    """Within the block, the first SIGINT calls ``stop()`` (in the main thread, between
    two of its bytecodes) and the next raises KeyboardInterrupt; not ``enabled``, nothing
    changes."""
    if not enabled or threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop()

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
