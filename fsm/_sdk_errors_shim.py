"""Exceptions of the ``openai`` / ``anthropic`` SDKs and ``httpx`` as assistant messages.

TODO(merge): replace with fsm.sdk_errors (the one mapping, owned by the classification work);
this private stand-in keeps the runner and the Anthropic provider working until it lands.

Strictly private. No SDK is imported: exceptions are read by their attributes
(``status_code``, ``response.headers``, ``body``), so a host that never loads ``anthropic``
pays nothing for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .messages import AssistantMessage

__all__ = ["error_message"]

_HINT_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry")
_STRUCTURED = {f.name for f in dataclasses.fields(AssistantMessage)} >= {"status", "error_type",
                                                                        "error_code", "headers"}


def _headers(exc: BaseException) -> dict[str, str]:
    response = getattr(exc, "response", None)
    raw = getattr(response, "headers", None)
    if raw is None:
        return {}
    try:
        return {str(k).lower(): str(v) for k, v in raw.items()}
    except Exception:  # an odd headers object: no hint from it
        return {}


def _hint_suffix(headers: Mapping[str, str]) -> str:
    hints = [f"{name}: {headers[name]}" for name in _HINT_HEADERS if headers.get(name)]
    hints += [f"{name}: {value}" for name, value in headers.items()
              if (name.startswith("x-ratelimit-reset") or
                  (name.startswith("anthropic-ratelimit-") and name.endswith("-reset"))) and value]
    return f" ({', '.join(hints)})" if hints else ""


def _error_object(body: Any) -> dict:
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            return dict(inner)
    return {}


def human_text(status: int | None, error: Mapping[str, Any], fallback: str) -> str:
    """``"<status> <error.message>"`` (``529 Overloaded``), as the original writes it."""
    message = error.get("message") if isinstance(error.get("message"), str) else None
    kind = error.get("type") if isinstance(error.get("type"), str) else None
    text = message or fallback or (kind or "")
    if kind and kind not in text:
        text = f"{text} ({kind})"
    return f"{status} {text}".strip() if status is not None else text


def _message(text: str, *, status: int | None = None, error_type: str | None = None,
             error_code: str | None = None, headers: Mapping[str, str] | None = None,
             model: str = "", partial: str = "", usage: Any = None) -> AssistantMessage:
    kwargs: dict[str, Any] = {}
    if _STRUCTURED:
        kwargs = {"status": status, "error_type": error_type, "error_code": error_code,
                  "headers": dict(headers) if headers else None}
    return AssistantMessage("error", text=partial, error_message=text or "The request failed without saying why",
                            usage=usage, model=model, **kwargs)


def _transport_text(exc: BaseException) -> str:
    parts, seen, cause = [], {str(exc)}, exc.__cause__ or exc.__context__
    while cause is not None and len(parts) < 4:
        text = str(cause)
        if text and text not in seen:
            seen.add(text)
            parts.append(f"{type(cause).__name__}: {text}")
        cause = cause.__cause__ or cause.__context__
    head = str(exc) or type(exc).__name__
    if not str(exc).startswith(("Connection error", "Request timed out")):
        head = f"{type(exc).__name__}: {head}" if str(exc) else head
    return head + (f" ({'; '.join(parts)})" if parts else "")


def error_message(exc: BaseException, *, text: str = "", usage: Any = None, model: str = "",
                  now_ms: float | None = None) -> AssistantMessage:
    """A failed request's exception as an error message with the structured facts.

    SDK status errors (``openai`` / ``anthropic`` ``APIStatusError``) give their status, the
    body's ``error.type`` / ``error.code`` and the headers, and the text ``"<status>
    <error.message>"``; an Anthropic status error with status 200 is an error event inside
    the stream (no status). Connection and timeout errors, ``httpx`` transport errors and
    anything else give ``"<Name>: <text>"`` with their causes.
    """
    partial = text
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    headers = _headers(exc)
    if isinstance(status, int) and not isinstance(status, bool) and getattr(exc, "response", None) is not None:
        error = _error_object(body)
        kind = error.get("type") if isinstance(error.get("type"), str) else None
        code = error.get("code") if isinstance(error.get("code"), str) else getattr(exc, "error_code", None)
        if status == 200:  # an SSE error event inside a successful response
            return _message(human_text(None, error, str(exc)), error_type=kind,
                            error_code=code if isinstance(code, str) else None, headers=headers,
                            model=model, partial=partial, usage=usage)
        fallback = "" if body is None else (body if isinstance(body, str) else "")
        human = human_text(status, error, fallback[:2000] or ("status code (no body)" if not body else ""))
        return _message(human + _hint_suffix(headers), status=status, error_type=kind,
                        error_code=code if isinstance(code, str) else None, headers=headers,
                        model=model, partial=partial, usage=usage)
    if body is not None and getattr(exc, "request", None) is not None:  # an openai in-stream error
        error = _error_object(body) or {"message": getattr(exc, "message", str(exc))}
        kind = error.get("type") if isinstance(error.get("type"), str) else None
        return _message(f"Stream error: {human_text(None, error, str(exc))}", error_type=kind,
                        model=model, partial=partial, usage=usage)
    return _message(_transport_text(exc), model=model, partial=partial, usage=usage)
