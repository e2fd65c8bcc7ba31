"""The one SDK client per API key that each provider keeps (shared by the OpenAI and Anthropic
providers): created on first use with the SDK's own retries off (``max_retries=0``: this
project is the only retry layer)."""

from __future__ import annotations

from typing import Any, Callable


def cached_client(cache: dict[str, Any], key: str, sdk_class: Callable[..., Any], *,
                  timeout_s: float, base_url: str | None, http_client: Any) -> Any:
    """``cache[key]``, or a new ``sdk_class(api_key=key, max_retries=0, timeout=timeout_s,
    [base_url], [http_client])`` stored there."""
    client = cache.get(key)
    if client is None:
        kwargs: dict[str, Any] = {"api_key": key, "max_retries": 0, "timeout": timeout_s}
        if base_url is not None:
            kwargs["base_url"] = base_url
        if http_client is not None:
            kwargs["http_client"] = http_client
        client = cache[key] = sdk_class(**kwargs)
    return client


async def load_request_stack(client: Any, *resource: str) -> None:
    """Load what ``client``'s first request would import (a provider's ``warm_up``): the
    resource the request goes through (``client.chat.completions``: the SDKs load resources
    lazily) and the async backend of the SDK's HTTP stack for the running loop (``anyio``, a
    dependency of both SDKs, loads it at its first async call: ~0.1 s). Sends nothing."""
    for name in resource:
        client = getattr(client, name)
    import anyio.lowlevel
    await anyio.lowlevel.checkpoint()
