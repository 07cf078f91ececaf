"""Warnings that name the line of the user's code that called pmemwal.

A warning found deep in an open (recovery, an index set aside) is reached through a call
depth that differs by entry: ``pmemwal.open`` calls ``WAL``, which ``Log`` calls too.  A
fixed ``stacklevel`` names the right line for one of them only, so ``warn`` counts the
library's frames instead.  The tools (pmemwal/tools) call the library as a user does: a
warning reaching one names the tool's line.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from types import FrameType

_LIBRARY = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TOOLS = os.path.join(_LIBRARY, "tools") + os.sep
_THREADING = threading.__file__


def _inside(filename: str) -> bool:
    return filename.startswith(_LIBRARY) and not filename.startswith(_TOOLS)


def _stacklevel() -> int:
    """``warn``'s stacklevel: its first caller outside the library; 2 (the library's own
    line) where no user's code is on the stack: a thread the library started."""
    frame: FrameType | None = sys._getframe(2)     # (warn's caller)
    level = 2
    while frame is not None and _inside(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    if frame is None or frame.f_code.co_filename == _THREADING:
        return 2
    return level


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` at the line of the user's call into pmemwal."""
    warnings.warn(message, category, stacklevel=_stacklevel())
