"""An optional package, imported where it is used, or an error that says which extra brings it:
the integrations' name for the one helper, :func:`fsm._extras.require`."""

from __future__ import annotations

from types import ModuleType

from fsm._extras import require as _require


def require(module: str, extra: str) -> ModuleType:
    """``import module``, or :class:`fsm._extras.MissingExtraError` (an ``ImportError``) naming
    the line to run: ``pip install 'retry-fsm[extra]'``."""
    return _require(module, extra=extra, feature=f"the {extra} integration (fsm.integrations)")
