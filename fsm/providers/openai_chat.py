"""Streaming client for OpenAI-compatible Chat Completions endpoints.

Built on the official ``openai`` SDK (``AsyncOpenAI``) with the SDK's own retries switched off
(``max_retries=0``): the retry brain is the only retry layer, so one call of
:meth:`OpenAIChatProvider.complete` is exactly one HTTP request, and a ``retry-after`` header
never turns into a hidden wait.

Provider failures never raise. HTTP errors, error events inside the stream, dropped
connections, connect failures, timeouts, truncated streams and unknown finish reasons all come
back as ``AssistantMessage(stop_reason="error", error_message=<human text>, text=<partial
text>)`` with the structured facts set (``status``, ``error_type``, ``error_code``, the
hint-bearing ``headers``), built by :mod:`fsm.providers.sdk_errors`:

- HTTP status: ``529 Overloaded``, ``429 Rate limit reached … (retry-after: 60)``,
  ``413 status code (no body)`` when the body is empty;
- network: the SDK's text and the underlying exceptions', e.g.
  ``Connection error. (ConnectionResetError: [Errno 104] Connection reset by peer)``;
- error event in the stream: ``Stream error: <message> (<type or code>)``;
- truncated stream: :data:`TRUNCATED_MESSAGE`;
- a finish reason this layer does not know: ``Provider finish_reason: <reason>``
  (``network_error`` is then retryable, ``docs/policy.md §2``); ``content_filter`` and
  ``error`` are errors too.

Cancelling the task that awaits :meth:`~OpenAIChatProvider.complete` (a user abort) closes the
stream and propagates ``asyncio.CancelledError``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from fsm._extras import require
from fsm.providers._clients import cached_client, load_request_stack
from fsm.core.messages import AssistantMessage, Usage
from fsm.core.protocols import Provider  # re-exported: the protocol lives in fsm.core.protocols
from fsm.providers.sdk_errors import ErrorFacts, error_facts

openai = require("openai", extra="openai", feature="the OpenAI provider (fsm.providers.openai_chat)")

__all__ = [
    "KNOWN_FINISH_REASONS",
    "NO_KEY_PLACEHOLDER",
    "OpenAIChatProvider",
    "Provider",
    "TRUNCATED_MESSAGE",
    "describe_error",
]

NO_KEY_PLACEHOLDER = "sk-no-key-required"
"""API key sent when none is given and ``OPENAI_API_KEY`` is unset (local servers ignore it)."""

TRUNCATED_MESSAGE = "Stream ended without a finish_reason or [DONE] (premature close)"
"""Error text of a stream that ended cleanly but before its final chunk."""

_FINISH_REASONS = {"stop": "stop", "end": "stop", "end_turn": "stop", "stop_sequence": "stop",
                   "length": "length", "max_tokens": "length", "tool_calls": "toolUse",
                   "function_call": "toolUse", "tool_use": "toolUse"}
KNOWN_FINISH_REASONS = frozenset(_FINISH_REASONS)
"""Finish reasons that end a turn normally (the Chat Completions ones, and the Messages API
names some gateways pass through). ``content_filter``, ``error`` and any other reason end it
in an error."""


def describe_error(exc: BaseException) -> str:
    """The human error text of a failed request or stream (:func:`fsm.providers.sdk_errors.error_facts`);
    never empty."""
    return error_facts(exc).message


def _usage(raw: Any) -> Usage:
    prompt = getattr(raw, "prompt_tokens", 0) or 0
    details = getattr(raw, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return Usage(input=max(0, prompt - cached), output=getattr(raw, "completion_tokens", 0) or 0,
                 cache_read=cached)


class OpenAIChatProvider:
    """An OpenAI-compatible Chat Completions provider, streaming, one HTTP request per call.

    ``base_url``: e.g. ``http://127.0.0.1:8080/v1`` (``None``: the SDK's default, which honours
    ``OPENAI_BASE_URL``). ``api_key``: the default key (``None``: ``OPENAI_API_KEY``, else
    :data:`NO_KEY_PLACEHOLDER`). ``timeout_s``: the SDK timeout in seconds (connect, and each
    read of the stream). ``name``: the provider id used for credentials (default ``"openai"``
    without ``base_url``, else the base URL's host). ``http_client``: an ``httpx2.AsyncClient``
    to send through; it stays the caller's to close.

    Raises ``ValueError`` for an empty ``model`` or a ``timeout_s`` that is not a positive number.
    """

    api = "openai-completions"  # pi's Model.api name (get_state's model.api)

    def __init__(self, *, base_url: str | None = None, model: str, api_key: str | None = None,
                 timeout_s: float = 600.0, name: str | None = None, http_client: Any = None) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not math.isfinite(timeout_s) or timeout_s <= 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.base_url = base_url
        self.model = model
        self.timeout_s = float(timeout_s)
        if name is None:
            name = (urlsplit(base_url).hostname or base_url) if base_url else "openai"
        self.name = name
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY_PLACEHOLDER
        self._http_client = http_client
        self._clients: dict[str, openai.AsyncOpenAI] = {}

    def __repr__(self) -> str:
        return f"OpenAIChatProvider(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _client(self, api_key: str | None) -> openai.AsyncOpenAI:
        return cached_client(self._clients, api_key or self._api_key, openai.AsyncOpenAI,
                             timeout_s=self.timeout_s, base_url=self.base_url,
                             http_client=self._http_client)

    async def warm_up(self) -> None:
        """Create the SDK client of the configured key and load what a request uses (the SDK
        and its HTTP stack import those parts at first use: a few hundred ms), on the running
        event loop: a caller that times requests (``python -m fsm demo``) awaits this first,
        so that the first request's time is the request's. Sends nothing."""
        await load_request_stack(self._client(None), "chat", "completions")

    def _error(self, facts: ErrorFacts | str, text: str, usage: Usage | None) -> AssistantMessage:
        if isinstance(facts, str):
            facts = ErrorFacts(facts or "The provider failed without saying why")
        return facts.to_message(text=text, usage=usage, model=self.model)

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> AssistantMessage:
        """Stream one completion of ``messages`` (OpenAI chat dicts).

        ``on_text`` gets each text delta as it arrives (its exceptions propagate, after the
        stream is closed). ``api_key`` overrides the key for this call. Returns the assistant
        message; provider failures are ``stop_reason="error"`` messages, never exceptions.
        ``asyncio.CancelledError`` propagates.
        """
        client = self._client(api_key)
        text: list[str] = []
        usage: Usage | None = None
        finish: str | None = None
        try:
            stream = await client.chat.completions.create(
                model=self.model, messages=messages, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True})
        except Exception as exc:  # every provider failure becomes an error message
            return self._error(error_facts(exc), "", None)
        try:
            while True:
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    return self._error(error_facts(exc), "".join(text), usage)
                if getattr(chunk, "usage", None) is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices or ():
                    if choice.index != 0:
                        continue
                    delta = choice.delta.content if choice.delta is not None else None
                    if delta:
                        text.append(delta)
                        if on_text is not None:
                            on_text(delta)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        finally:
            try:
                await stream.close()
            except Exception:  # closing a broken connection: nothing more to learn from it
                pass
        joined = "".join(text)
        if finish is None:
            return self._error(TRUNCATED_MESSAGE, joined, usage)
        if finish == "content_filter":
            return self._error("Response blocked by the provider's content filter "
                               "(finish_reason: content_filter)", joined, usage)
        stop_reason = _FINISH_REASONS.get(finish)
        if stop_reason is None:  # "error", "network_error", anything this layer does not know
            return self._error(f"Provider finish_reason: {finish}", joined, usage)
        return AssistantMessage(stop_reason=stop_reason, text=joined, usage=usage, model=self.model)

    async def aclose(self) -> None:
        """Close the HTTP clients this provider opened (not a caller's ``http_client``)."""
        clients, self._clients = list(self._clients.values()), {}
        if self._http_client is None:
            for client in clients:
                await client.close()
