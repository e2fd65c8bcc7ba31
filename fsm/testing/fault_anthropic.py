"""The fault server's Anthropic Messages API: ``POST …/v1/messages`` (docs/embedding.md).

Same script, same entry keys and the same request counter as the chat completions route of
:mod:`fsm.testing.fault_server`; only the wire shapes are Anthropic's:

- ``json`` / ``body`` / ``status`` / ``headers`` / ``delay_ms``: as for chat (an error body is
  typically ``{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}``
  with status 529).
- a success without ``stream`` answers a ``message`` object, or the event stream below when the
  request asked to stream. A ``stream`` entry answers a request that did not ask to stream
  with one ``message`` object too (its text deltas joined; ``finish_reason`` and ``usage`` as
  below), or, when it holds an ``error`` event, that error body with the status the API gives
  it (``overloaded_error`` 529, ``rate_limit_error`` 429, ``api_error`` 500…); ``drop`` and
  ``no_done`` entries always stream.
- ``stream``: the SSE events ``message_start``, ``content_block_start``, then per item a
  ``content_block_delta`` (a string: a ``text_delta``) or the object sent verbatim as one event
  named by its ``type`` (``{"type": "error", "error": {...}}`` is an SSE ``error`` event inside
  the HTTP 200 stream; the stream ends right after it, as the API's does), then
  ``content_block_stop``, ``message_delta`` (``stop_reason`` = ``finish_reason``, default
  ``end_turn``; ``usage`` = the entry's ``usage`` or an estimate) and ``message_stop``.
- ``drop`` / ``drop_mode`` / ``no_done`` / ``chunk_delay_ms``: as for chat (``no_done`` ends
  the body before ``content_block_stop``).

Strictly private to the fault server: :func:`answer` runs inside its request handler.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["answer"]


def _sse(handler: Any, name: str, obj: Any) -> None:
    handler.chunk(f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode())


def _message(req: dict, index: int, model: str, text: str, stop: str, usage: Any) -> dict:
    return {"id": f"msg_fault_{index}", "type": "message", "role": "assistant",
            "model": req.get("model") or model,
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop, "stop_sequence": None,
            "usage": usage if isinstance(usage, dict) else _usage(text)}


def _usage(text: str) -> dict:
    return {"input_tokens": 10, "output_tokens": max(1, len(text) // 4)}


def answer(handler: Any, entry: dict, req: dict, index: int) -> None:
    """Answer one ``/v1/messages`` request with ``entry`` (see the module docstring)."""
    begun = handler.begin(entry)
    if begun is None:
        return None
    status, headers = begun
    model = handler.server.owner.model
    if "stream" not in entry:
        if status != 200:
            return handler.send(status, b"", "text/plain; charset=utf-8", headers, "empty")
        if not req.get("stream"):
            return handler.send_json(200, _message(req, index, model, "ok", "end_turn", None),
                                      "completion", headers)
        entry = {"stream": ["ok"], **entry}
    elif not req.get("stream") and status == 200 and not entry.get("drop") and not entry.get("no_done"):
        # A request that did not ask to stream gets the same answer as one Message object (the
        # SDK would otherwise hand the SSE text back as a string); an error event becomes the
        # error body with the status the API answers it with.
        errors = [item for item in entry["stream"] if isinstance(item, dict) and item.get("type") == "error"]
        if errors:
            kind = errors[0].get("error", {}).get("type") if isinstance(errors[0].get("error"), dict) else None
            return handler.send_json(_ERROR_STATUS.get(kind, 500), errors[0], "json", headers)
        text = "".join(item for item in entry["stream"] if isinstance(item, str))
        return handler.send_json(200, _message(req, index, model, text, entry.get("finish_reason", "end_turn"),
                                                entry.get("usage")), "completion", headers)
    return _stream(handler, entry, req, index, status, headers, model)


_ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                 "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
                 "api_error": 500, "overloaded_error": 529}
"""The HTTP status the Messages API answers an error type with, outside a stream
(https://docs.anthropic.com/en/api/errors)."""


def _stream(handler: Any, entry: dict, req: dict, index: int, status: int,
            headers: dict[str, str], model: str) -> None:
    handler.open_stream(status, headers)
    start = _message(req, index, model, "", None, {"input_tokens": 10, "output_tokens": 1})  # type: ignore[arg-type]
    _sse(handler, "message_start", {"type": "message_start", "message": start})
    _sse(handler, "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}})
    chunk_delay = entry.get("chunk_delay_ms", 0)
    text = ""
    for i, item in enumerate(entry["stream"]):
        if chunk_delay and i and not handler.pause(chunk_delay):
            return handler.client_gone(status, "client_gone_mid_stream")
        if isinstance(item, str):
            text += item
            _sse(handler, "content_block_delta", {"type": "content_block_delta", "index": 0,
                                                  "delta": {"type": "text_delta", "text": item}})
            continue
        name = item.get("type") if isinstance(item.get("type"), str) else "error"
        _sse(handler, name, item)
        if name == "error":  # the API ends the stream after an error event
            handler.done(status, "stream_error")
            return handler.chunk(b"")
    if entry.get("drop"):
        return handler.drop(entry, status, chunk_delay)
    if entry.get("no_done"):
        return handler.truncate(status)
    usage = entry.get("usage", None) if "usage" in entry else {"output_tokens": max(1, len(text) // 4)}
    _sse(handler, "content_block_stop", {"type": "content_block_stop", "index": 0})
    delta: dict[str, Any] = {"type": "message_delta",
                             "delta": {"stop_reason": entry.get("finish_reason", "end_turn"),
                                       "stop_sequence": None}}
    if usage is not None:
        delta["usage"] = usage
    _sse(handler, "message_delta", delta)
    handler.done(status, "stream")
    _sse(handler, "message_stop", {"type": "message_stop"})
    return handler.chunk(b"")
