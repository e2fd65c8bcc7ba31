"""Which model API a command talks to: ``--api openai`` (Chat Completions) or ``--api anthropic``
(the Messages API). The SDK of the chosen API is imported only when the provider is built."""

from __future__ import annotations

from typing import Any

__all__ = ["APIS", "build_provider"]

APIS: tuple[str, ...] = ("openai", "anthropic")
"""The values of ``--api``; ``openai`` is the default (any OpenAI-compatible endpoint)."""


def build_provider(api: str, *, base_url: str | None, model: str, api_key: str | None = None,
                   timeout_s: float = 600.0, name: str | None = None) -> Any:
    """An :class:`~fsm.providers.openai_chat.OpenAIChatProvider` or an
    :class:`~fsm.providers.anthropic_messages.AnthropicMessagesProvider`. For ``anthropic`` a
    ``base_url`` ending in ``/v1`` is taken as the API root (the SDK adds ``/v1/messages``).
    Raises ``ValueError`` naming an unknown ``api``."""
    if api == "openai":
        from fsm.providers.openai_chat import OpenAIChatProvider
        return OpenAIChatProvider(base_url=base_url, model=model, api_key=api_key,
                                  timeout_s=timeout_s, name=name)
    if api == "anthropic":
        from fsm.providers.anthropic_messages import AnthropicMessagesProvider
        if base_url is not None:
            base_url = base_url.rstrip("/").removesuffix("/v1")
        return AnthropicMessagesProvider(base_url=base_url, model=model, api_key=api_key,
                                         timeout_s=timeout_s, name=name)
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(APIS)}")
