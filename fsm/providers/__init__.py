"""Model clients and the fault-injecting test server.

- :class:`OpenAIChatProvider`: streaming OpenAI-compatible Chat Completions client (one HTTP
  request per call; failures come back as ``stop_reason="error"`` messages).
- :class:`FaultServer`: a scripted OpenAI-compatible server that injects HTTP errors, dropped
  connections and truncated streams (``python -m fsm fault-server --script FILE``).

Names are imported on first use, so that the fault server (standard library only) starts
without loading the ``openai`` SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FaultServer": "fsm.providers.fault_server",
    "validate_script": "fsm.providers.fault_server",
    "OpenAIChatProvider": "fsm.providers.openai_chat",
    "Provider": "fsm.providers.openai_chat",
    "describe_error": "fsm.providers.openai_chat",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fsm.providers' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
