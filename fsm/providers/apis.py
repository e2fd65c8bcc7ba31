"""Which model API a command talks to: ``--api openai`` (Chat Completions) or ``--api anthropic``
(the Messages API). The SDK of the chosen API is imported only when the provider is built."""

from __future__ import annotations

from typing import Any

__all__ = ["APIS", "build_provider", "check_api_installed"]

APIS: tuple[str, ...] = ("openai", "anthropic")
"""The values of ``--api``; ``openai`` is the default (any OpenAI-compatible endpoint)."""


def check_api_installed(api: str) -> None:
    """Refuse at start-up an ``api`` whose SDK is not installed: raises
    :class:`fsm._extras.MissingExtraError` (an ``ImportError``) whose text names the flag, the
    missing package and the line to run (``pip install 'retry-fsm[anthropic]'``). Looks the
    package up without importing it (the SDKs take most of a second to import; the commands
    load them in the background). ``ValueError`` naming an unknown ``api``."""
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; expected one of {', '.join(APIS)}")
    import importlib.util

    from fsm._extras import EXTRAS, MissingExtraError
    for module in EXTRAS[api]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken entry in sys.modules / on the path
            found = False
        if not found:
            raise MissingExtraError(module, api, f"--api {api}")


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
