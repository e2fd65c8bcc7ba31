"""The fault server's Gemini API: ``POST …/v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse`` (SPEC §15.13 "New SDKs' protocols"; what the Google Gen AI
SDK, ``google-genai``, sends by default, given ``HttpOptions(base_url=FaultServer.root_url)``).

Same script, entry keys and request counter as the chat completions route of
:mod:`fsm.testing.fault_server`; only the wire shapes are Gemini's:

- ``json`` / ``body`` / ``status`` / ``headers`` / ``delay_ms``: as for chat. A Gemini error
  body is ``{"error": {"code": 429, "message": "...", "status": "RESOURCE_EXHAUSTED",
  "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"}]}}``
  (503 ``UNAVAILABLE``, 500 ``INTERNAL``, 400 ``INVALID_ARGUMENT``…).
- a success answers one ``GenerateContentResponse`` (``candidates[0].content.parts[0].text``,
  ``finishReason`` = ``finish_reason`` or ``STOP``, ``usageMetadata`` = ``usage`` or an
  estimate) to ``:generateContent``, or, to ``:streamGenerateContent``, one SSE ``data:`` event
  per text item of ``stream`` (a ``GenerateContentResponse`` holding that text; the last one
  carries ``finishReason`` and ``usageMetadata``). An object item is sent verbatim as one
  ``data:`` event (``{"error": {...}}`` is an error inside the HTTP 200 stream, which the SDK
  raises as ``APIError``; the stream ends after it). ``:generateContent`` gets the ``stream``
  text joined in one response, or, when the stream holds an ``{"error": {...}}`` item, that
  error body with the status its ``code`` names (500 when it names none).
- ``drop`` / ``drop_mode`` / ``no_done`` / ``chunk_delay_ms``: as for chat; a ``drop`` with an
  empty ``stream`` cuts the body before any event (an error inside the stream before any
  output); ``no_done`` ends the body without the final event (no ``finishReason``).

Strictly private to the fault server: :func:`answer` runs inside its request handler.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["answer", "is_gemini"]

_GENERATE = ":generateContent"
_STREAM = ":streamGenerateContent"


def is_gemini(path: str) -> bool:
    """Whether ``path`` (query included) is a Gemini generate route of any API version."""
    route = path.split("?")[0].rstrip("/")
    return "/models/" in route and route.endswith((_GENERATE, _STREAM))


def _usage(text: str) -> dict:
    out = max(1, len(text) // 4)
    return {"promptTokenCount": 10, "candidatesTokenCount": out, "totalTokenCount": 10 + out}


def _response(index: int, model: str, text: str, finish: str | None, usage: Any) -> dict:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": model,
                           "responseId": f"gemini-fault-{index}"}
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def _model(path: str, fallback: str) -> str:
    route = path.split("?")[0].rstrip("/")
    name = route.rsplit("/models/", 1)[-1].split(":", 1)[0]
    return name or fallback


def answer(handler: Any, entry: dict, req: dict, index: int) -> None:
    """Answer one Gemini generate request with ``entry`` (see the module docstring)."""
    begun = handler.begin(entry)
    if begun is None:
        return None
    status, headers = begun
    model = _model(handler.path, handler.server.owner.model)
    streamed = handler.path.split("?")[0].rstrip("/").endswith(_STREAM)
    if status != 200 and "stream" not in entry:
        return handler.send(status, b"", "text/plain; charset=utf-8", headers, "empty")
    items = entry.get("stream", ["ok"])
    finish = entry.get("finish_reason", "STOP")
    if not streamed and not entry.get("drop") and not entry.get("no_done"):
        errors = [item for item in items if isinstance(item, dict) and "error" in item]
        if errors:
            code = errors[0]["error"].get("code") if isinstance(errors[0]["error"], dict) else None
            code = code if isinstance(code, int) and 400 <= code <= 599 else 500
            return handler.send_json(code, errors[0], "json", headers)
        text = "".join(item for item in items if isinstance(item, str))
        usage = entry.get("usage", _usage(text))
        return handler.send_json(status, _response(index, model, text, finish, usage), "completion", headers)
    handler.open_stream(status, headers)
    chunk_delay = entry.get("chunk_delay_ms", 0)
    texts = [item for item in items if isinstance(item, str)]
    text, sent = "", 0
    closing = not entry.get("drop") and not entry.get("no_done")
    for i, item in enumerate(items):
        if chunk_delay and i and not handler.pause(chunk_delay):
            return handler.client_gone(status, "client_gone_mid_stream")
        if isinstance(item, str):
            text += item
            sent += 1
            last = closing and sent == len(texts)
            item = _response(index, model, item, finish if last else None,
                             entry.get("usage", _usage(text)) if last else None)
            if last:
                handler.done(status, "stream")
        _event(handler, item)
        if isinstance(item, dict) and "error" in item:  # the API ends the stream after an error
            handler.done(status, "stream_error")
            return handler.chunk(b"")
    if entry.get("drop"):
        return handler.drop({**entry, "stream": items}, status, chunk_delay)
    if entry.get("no_done"):
        return handler.truncate(status)
    if not texts:  # a stream of events only: close it with an empty final response
        handler.done(status, "stream")
        _event(handler, _response(index, model, "", finish, entry.get("usage", _usage(""))))
    return handler.chunk(b"")


def _event(handler: Any, obj: Any) -> None:
    handler.chunk(b"data: " + json.dumps(obj).encode() + b"\r\n\r\n")
