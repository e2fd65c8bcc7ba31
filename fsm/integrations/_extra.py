"""An optional package, imported where it is used, or an error that says which extra brings it."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """``import module``, or ``ImportError`` naming the line to run:
    ``pip install 'retry-fsm[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is not installed: this part of retry-fsm needs the "
                          f"'{extra}' extra: pip install 'retry-fsm[{extra}]'") from exc
