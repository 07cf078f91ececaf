"""The optional extras the tools need (pyproject.toml), imported with a clear error when missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from pmemwal.errors import ConfigError


def require(module: str, extra: str, tool: str) -> ModuleType:
    """``module``, imported; ConfigError naming the extra that installs it when it is missing.

    ``require("tqdm", "bench", "pmemwal torture")`` -> the tqdm module, or ConfigError
    "pmemwal torture needs the 'bench' extra: pip install 'pmemwal[bench]' (...)".
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(f"{tool} needs the {extra!r} extra: pip install 'pmemwal[{extra}]' "
                          f"({error})") from None
