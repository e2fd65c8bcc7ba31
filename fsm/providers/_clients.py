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
