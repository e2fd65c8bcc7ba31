"""The fault server's OpenAI Responses API: ``POST …/v1/responses`` (SPEC §15.13 "New SDKs'
protocols"; the OpenAI Agents SDK's default).

Same script, entry keys and request counter as the chat completions route of
:mod:`fsm.testing.fault_server`; only the wire shapes are the Responses API's:

- ``json`` / ``body`` / ``status`` / ``headers`` / ``delay_ms``: as for chat.
- a success answers one ``response`` object (``output``: one assistant ``message`` with one
  ``output_text``), or, when the request asked to stream, the SSE events ``response.created``,
  ``response.output_item.added``, one ``response.output_text.delta`` per text item of
  ``stream`` (an object item is sent verbatim as one event named by its ``type``; a ``drop``
  with an empty ``stream`` cuts right after ``response.created``),
  ``response.output_text.done``, ``response.output_item.done`` and ``response.completed``.
  A request that did not ask to stream gets the ``stream`` text joined in one object.
- ``drop`` / ``drop_mode`` / ``no_done`` / ``chunk_delay_ms``: as for chat (the cut comes after
  the deltas).

Strictly private to the fault server: :func:`answer` runs inside its request handler.
"""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["answer"]


def _sse(handler: Any, obj: dict) -> None:
    handler.chunk(f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode())


def _item(index: int, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": f"msg_fault_{index}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
            if status == "completed" else []}


def _response(req: dict, index: int, model: str, text: str, status: str = "completed") -> dict:
    out = max(1, len(text) // 4)
    return {"id": f"resp_fault_{index}", "object": "response", "created_at": int(time.time()),
            "status": status, "model": req.get("model") or model,
            "output": [_item(index, text)] if status == "completed" else [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 10, "output_tokens": out, "total_tokens": 10 + out,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def answer(handler: Any, entry: dict, req: dict, index: int) -> None:
    """Answer one ``/v1/responses`` request with ``entry`` (see the module docstring)."""
    begun = handler.begin(entry)
    if begun is None:
        return None
    status, headers = begun
    model = handler.server.owner.model
    if status != 200 and "stream" not in entry:
        return handler.send(status, b"", "text/plain; charset=utf-8", headers, "empty")
    items = entry.get("stream", ["ok"])
    if not req.get("stream") and not entry.get("drop") and not entry.get("no_done"):
        text = "".join(item for item in items if isinstance(item, str))
        return handler.send_json(status, _response(req, index, model, text), "completion", headers)
    handler.open_stream(status, headers, no_cache=False)
    seq = iter(range(1 << 30))
    _sse(handler, {"type": "response.created", "sequence_number": next(seq),
                   "response": _response(req, index, model, "", "in_progress")})
    chunk_delay = entry.get("chunk_delay_ms", 0)
    text, added = "", False

    def add() -> None:  # the output item opens with the first item (a bare drop: before it)
        nonlocal added
        if not added:
            added = True
            _sse(handler, {"type": "response.output_item.added", "sequence_number": next(seq),
                           "output_index": 0, "item": _item(index, "", "in_progress")})
    for i, item in enumerate(items):
        if chunk_delay and i and not handler.pause(chunk_delay):
            return handler.client_gone(status, "client_gone_mid_stream")
        add()
        if isinstance(item, str):
            text += item
            item = {"type": "response.output_text.delta", "item_id": f"msg_fault_{index}",
                    "output_index": 0, "content_index": 0, "delta": item, "logprobs": []}
        _sse(handler, {**item, "sequence_number": next(seq)})
    if entry.get("drop"):
        return handler.drop({**entry, "stream": items}, status, chunk_delay)
    if entry.get("no_done"):
        return handler.truncate(status)
    add()
    _sse(handler, {"type": "response.output_text.done", "sequence_number": next(seq),
                   "item_id": f"msg_fault_{index}", "output_index": 0, "content_index": 0,
                   "text": text, "logprobs": []})
    _sse(handler, {"type": "response.output_item.done", "sequence_number": next(seq),
                   "output_index": 0, "item": _item(index, text)})
    handler.done(status, "stream")
    _sse(handler, {"type": "response.completed", "sequence_number": next(seq),
                   "response": _response(req, index, model, text)})
    return handler.chunk(b"")
