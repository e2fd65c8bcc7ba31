"""Streaming client for OpenAI-compatible Chat Completions endpoints.

Built on the official ``openai`` SDK (``AsyncOpenAI``) with the SDK's own retries switched off
(``max_retries=0``): the retry brain is the only retry layer, so one call of
:meth:`OpenAIChatProvider.complete` is exactly one HTTP request, and a ``retry-after`` header
never turns into a hidden wait.

Provider failures never raise. HTTP errors, error events inside the stream, dropped
connections, connect failures, timeouts and truncated streams all come back as
``AssistantMessage(stop_reason="error", error_message=<text>, text=<partial text>)``, with texts
the classifier (:mod:`fsm.classify`) recognises:

- HTTP status: ``Error code: 529 - {'type': 'error', 'error': {...}}`` (the classic SDK format:
  status, then the whole decoded JSON body, or the raw body text), or
  ``413 status code (no body)`` when the body is empty; the ``retry-after``, ``retry-after-ms``
  and ``x-ratelimit-reset*`` response headers are appended as ``(retry-after: 60)``.
- network: the SDK's text and the underlying exceptions', e.g.
  ``Connection error. (ConnectionResetError: [Errno 104] Connection reset by peer)``.
- error event in the stream: ``Stream error: <message> - <error object>``.
- truncated stream: :data:`TRUNCATED_MESSAGE`.

Cancelling the task that awaits :meth:`~OpenAIChatProvider.complete` (a user abort) closes the
stream and propagates ``asyncio.CancelledError``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import openai

from fsm.messages import AssistantMessage, Usage

__all__ = [
    "HINT_HEADERS",
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

HINT_HEADERS: tuple[str, ...] = ("retry-after", "retry-after-ms")
"""Response headers copied into error texts (plus every ``x-ratelimit-reset*`` header)."""

_BODY_LIMIT = 2000  # characters of a non-JSON error body kept (an HTML error page can be huge)

_FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "toolUse",
                   "function_call": "toolUse"}


@runtime_checkable
class Provider(Protocol):
    """What the session codes against: one streamed completion per call, never raising for
    provider failures (see the module docstring)."""

    name: str
    model: str

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> AssistantMessage: ...


def _hint_suffix(headers: Any) -> str:
    hints = [f"{name}: {headers[name]}" for name in HINT_HEADERS if headers.get(name)]
    hints += [f"{name}: {value}" for name, value in headers.items()
              if name.lower().startswith("x-ratelimit-reset") and value]
    return f" ({', '.join(hints)})" if hints else ""


def _status_text(exc: openai.APIStatusError) -> str:
    """``Error code: N - <body>``: the SDK's older, complete format (newer SDKs keep only the
    body's ``message`` in ``str(exc)``, losing ``type``/``code`` such as ``overloaded_error``)."""
    status = exc.status_code
    try:
        raw = exc.response.text.strip()
    except Exception:  # the body could not be read: fall back to what the SDK kept
        raw = "" if exc.body is None else str(exc.body)
    if not raw:
        return f"{status} status code (no body)"
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw if len(raw) <= _BODY_LIMIT else (
            f"{raw[:_BODY_LIMIT]}… ({len(raw) - _BODY_LIMIT} more characters)")
    return f"Error code: {status} - {body}"


def _cause_chain(exc: BaseException) -> list[str]:
    """``Name: text`` of each distinct, non-empty text among the exception's causes.

    Suppressed contexts are followed too: httpx re-raises its transport errors ``from None``,
    and the root cause (``ConnectionRefusedError``…) is the part worth reading.
    """
    parts: list[str] = []
    seen = {str(exc)}
    first: BaseException | None = None
    pending = [exc.__cause__ or exc.__context__]
    visited = {id(exc)}
    while pending and len(parts) < 5:
        cause = pending.pop(0)
        if cause is None or id(cause) in visited:
            continue
        visited.add(id(cause))
        if isinstance(cause, asyncio.CancelledError):
            # anyio's timeouts are cancel scopes; their text only names a scope's address.
            continue
        first, text = first or cause, str(cause)
        if isinstance(cause, BaseExceptionGroup):
            pending = list(cause.exceptions) + pending
        elif text and text not in seen:
            seen.add(text)
            if (isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0
                    and os.strerror(cause.errno) not in text):
                # asyncio's "Connect call failed (...)" names no reason; the errno does.
                text += f" [{os.strerror(cause.errno)}]"
            parts.append(f"{type(cause).__name__}: {text}")
        pending.insert(0, cause.__cause__ or cause.__context__)
    if not parts and first is not None:
        parts.append(type(first).__name__)
    return parts


def describe_error(exc: BaseException) -> str:
    """The error text of a failed request or stream (see the module docstring); never empty."""
    if isinstance(exc, openai.APIStatusError):
        return _status_text(exc) + _hint_suffix(exc.response.headers)
    if isinstance(exc, openai.APIConnectionError):
        causes = _cause_chain(exc)
        return f"{exc}{' (' + '; '.join(causes) + ')' if causes else ''}"
    if isinstance(exc, openai.APIError):
        # An error event inside an otherwise successful stream.
        body = exc.body
        if body is None or (isinstance(body, dict) and set(body) <= {"message"}):
            return f"Stream error: {exc.message}"
        return f"Stream error: {exc.message} - {body}"
    text = str(exc)
    name = type(exc).__name__
    causes = _cause_chain(exc)
    head = f"{name}: {text}" if text else f"{name} (no message)"
    return head + (f" ({'; '.join(causes)})" if causes else "")


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
        key = api_key or self._api_key
        client = self._clients.get(key)
        if client is None:
            kwargs: dict[str, Any] = {"api_key": key, "max_retries": 0, "timeout": self.timeout_s}
            if self.base_url is not None:
                kwargs["base_url"] = self.base_url
            if self._http_client is not None:
                kwargs["http_client"] = self._http_client
            client = self._clients[key] = openai.AsyncOpenAI(**kwargs)
        return client

    def _error(self, message: str, text: str, usage: Usage | None) -> AssistantMessage:
        return AssistantMessage(stop_reason="error", text=text, error_message=message or
                                "The provider failed without saying why", usage=usage, model=self.model)

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
            return self._error(describe_error(exc), "", None)
        try:
            while True:
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    return self._error(describe_error(exc), "".join(text), usage)
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
        if finish == "error":
            return self._error("The provider ended the stream with finish_reason: error", joined, usage)
        return AssistantMessage(stop_reason=_FINISH_REASONS.get(finish, "stop"), text=joined,
                                usage=usage, model=self.model)

    async def aclose(self) -> None:
        """Close the HTTP clients this provider opened (not a caller's ``http_client``)."""
        clients, self._clients = list(self._clients.values()), {}
        if self._http_client is None:
            for client in clients:
                await client.close()
