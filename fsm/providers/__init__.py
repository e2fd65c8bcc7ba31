"""Model clients and the fault-injecting test server.

- :class:`OpenAIChatProvider`: streaming OpenAI-compatible Chat Completions client (one HTTP
  request per call; failures come back as ``stop_reason="error"`` messages).
- :class:`AnthropicMessagesProvider`: streaming Anthropic Messages API client (the same
  contract; SSE ``error`` events inside a 200 stream are failed turns).
- :class:`FaultServer`: a scripted OpenAI-compatible server that injects HTTP errors, dropped
  connections and truncated streams (``python -m fsm fault-server --script FILE``).

Names are imported on first use, so that the fault server (standard library only) starts
without loading the ``openai`` SDK.
"""

from __future__ import annotations

from fsm._lazy import lazy_exports

_EXPORTS = {
    "FaultServer": "fsm.testing.fault_server",
    "validate_script": "fsm.testing.fault_server",
    "OpenAIChatProvider": "fsm.providers.openai_chat",
    "Provider": "fsm.providers.openai_chat",
    "describe_error": "fsm.providers.openai_chat",
    "AnthropicMessagesProvider": "fsm.providers.anthropic_messages",
    "build_provider": "fsm.providers.apis",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("fsm.providers", _EXPORTS)
