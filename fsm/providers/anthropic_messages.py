"""Streaming client for the Anthropic Messages API, on the official ``anthropic`` SDK.

The SDK's own retries are off (``max_retries=0``): the retry brain is the only retry layer, so
one :meth:`AnthropicMessagesProvider.complete` is exactly one HTTP request.

Failures never raise: an HTTP error (``529 Overloaded``), an SSE ``error`` event inside an HTTP
200 stream (Anthropic's ``overloaded_error`` arrives that way, where the SDK's own retries never
see it), a dropped connection, a timeout or a stream that ends before ``message_stop`` all
come back as ``AssistantMessage(stop_reason="error", ...)`` with the structured facts (status,
the error's ``type``, the headers) and the human text of docs/policy.md §4. An unknown
``stop_reason`` is an error ``Provider stop_reason: <reason>`` (docs/policy.md §2).

Cancelling the task that awaits :meth:`~AnthropicMessagesProvider.complete` closes the stream
and propagates ``asyncio.CancelledError``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable
from urllib.parse import urlsplit

from fsm._extras import require
from fsm.providers._clients import cached_client, load_request_stack
from fsm.providers import sdk_errors as _sdk
from fsm.core.messages import AssistantMessage, Usage

anthropic = require("anthropic", extra="anthropic",
                    feature="the Anthropic provider (fsm.providers.anthropic_messages)")

__all__ = ["AnthropicMessagesProvider", "TRUNCATED_MESSAGE", "DEFAULT_MAX_TOKENS", "STOP_REASONS"]

TRUNCATED_MESSAGE = "Stream ended without message_stop (premature close)"
"""Error text of a stream that ended cleanly but before its last event."""

DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` sent when none is given (the Messages API requires one)."""

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop",
                "max_tokens": "length", "model_context_window_exceeded": "length",
                "tool_use": "toolUse"}
"""Anthropic ``stop_reason`` -> our stop reason; any other is an error (``refusal`` included)."""

_NO_KEY = "sk-ant-no-key-required"


def _anthropic_messages(messages: list[dict]) -> tuple[str | None, list[dict]]:
    """OpenAI-style ``{"role", "content"}`` dicts as the Messages API's ``system`` and turns."""
    system: list[str] = []
    turns: list[dict] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "system":
            if isinstance(content, str) and content:
                system.append(content)
            continue
        if role not in ("user", "assistant"):
            continue
        if turns and turns[-1]["role"] == role and isinstance(content, str) \
                and isinstance(turns[-1]["content"], str):
            turns[-1]["content"] += "\n\n" + content  # the API wants alternating roles
        else:
            turns.append({"role": role, "content": content if content is not None else ""})
    return ("\n\n".join(system) or None), turns


class AnthropicMessagesProvider:
    """An Anthropic Messages API provider, streaming, one HTTP request per call.

    ``base_url``: e.g. ``http://127.0.0.1:8080`` (the SDK appends ``/v1/messages``; ``None``:
    the SDK's default, which honours ``ANTHROPIC_BASE_URL``). ``api_key``: the default key
    (``None``: ``ANTHROPIC_API_KEY``, else a placeholder for local servers). ``max_tokens``:
    sent with every request. ``timeout_s``: the SDK timeout in seconds. ``name``: the provider
    id for credentials (default ``"anthropic"`` without ``base_url``, else its host).

    Raises ``ValueError`` for an empty ``model``, a ``timeout_s`` that is not a positive number
    or a ``max_tokens`` that is not a positive integer.
    """

    api = "anthropic-messages"  # pi's Model.api name (get_state's model.api)

    def __init__(self, *, model: str, base_url: str | None = None, api_key: str | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, timeout_s: float = 600.0,
                 name: str | None = None, http_client: Any = None) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not math.isfinite(timeout_s) or timeout_s <= 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.timeout_s = float(timeout_s)
        self.name = name or ((urlsplit(base_url).hostname or base_url) if base_url else "anthropic")
        self._api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or _NO_KEY
        self._http_client = http_client
        self._clients: dict[str, anthropic.AsyncAnthropic] = {}

    def __repr__(self) -> str:
        return (f"AnthropicMessagesProvider(name={self.name!r}, model={self.model!r}, "
                f"base_url={self.base_url!r})")

    def _client(self, api_key: str | None) -> anthropic.AsyncAnthropic:
        return cached_client(self._clients, api_key or self._api_key, anthropic.AsyncAnthropic,
                             timeout_s=self.timeout_s, base_url=self.base_url,
                             http_client=self._http_client)

    async def warm_up(self) -> None:
        """Create the SDK client of the configured key and load what a request uses (the SDK
        and its HTTP stack import those parts at first use: a few hundred ms), on the running
        event loop: a caller that times requests (``python -m fsm demo``) awaits this first,
        so that the first request's time is the request's. Sends nothing."""
        await load_request_stack(self._client(None), "messages")

    def _error(self, text: str, partial: str, usage: Usage | None) -> AssistantMessage:
        return AssistantMessage("error", text=partial, error_message=text, usage=usage, model=self.model)

    async def complete(self, messages: list[dict], *, on_text: Callable[[str], None] | None = None,
                       api_key: str | None = None) -> AssistantMessage:
        """Stream one answer to ``messages`` (OpenAI-style dicts; ``system`` messages become
        the request's ``system``). ``on_text`` gets each text delta. Returns the assistant
        message; failures are ``stop_reason="error"`` messages, never exceptions.
        ``asyncio.CancelledError`` propagates."""
        system, turns = _anthropic_messages(messages)
        request: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens,
                                   "messages": turns, "stream": True}
        if system is not None:
            request["system"] = system
        text: list[str] = []
        usage = Usage()
        stop: str | None = None
        finished = False
        try:
            stream = await self._client(api_key).messages.create(**request)
        except Exception as exc:  # every provider failure becomes an error message
            return _sdk.error_message(exc, model=self.model)
        try:
            while True:
                try:
                    event = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:  # an SSE error event, a drop, a timeout mid-stream
                    return _sdk.error_message(exc, text="".join(text), model=self.model,
                                              usage=usage if usage.input or usage.output else None)
                kind = event.type
                if kind == "content_block_delta":
                    delta = getattr(event.delta, "text", None)
                    if delta:
                        text.append(delta)
                        if on_text is not None:
                            on_text(delta)
                elif kind == "message_start":
                    u = event.message.usage
                    usage.input = u.input_tokens or 0
                    usage.cache_read = getattr(u, "cache_read_input_tokens", 0) or 0
                    usage.cache_write = getattr(u, "cache_creation_input_tokens", 0) or 0
                elif kind == "message_delta":
                    stop = event.delta.stop_reason or stop
                    if event.usage is not None:
                        usage.output = event.usage.output_tokens or 0
                elif kind == "message_stop":
                    finished = True
        finally:
            try:
                await stream.close()
            except Exception:  # closing a broken connection: nothing more to learn from it
                pass
        joined = "".join(text)
        if not finished:
            return self._error(TRUNCATED_MESSAGE, joined, usage)
        mapped = STOP_REASONS.get(stop or "end_turn")
        if mapped is None:
            return self._error(f"Provider stop_reason: {stop}", joined, usage)
        return AssistantMessage(mapped, text=joined, usage=usage, model=self.model)

    async def aclose(self) -> None:
        """Close the HTTP clients this provider opened (not a caller's ``http_client``)."""
        clients, self._clients = list(self._clients.values()), {}
        if self._http_client is None:
            for client in clients:
                await client.close()

