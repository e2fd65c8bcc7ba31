"""Provider SDK failures → one error :class:`~fsm.core.messages.AssistantMessage`: human text plus
the structured facts the classifier reads first (``docs/policy.md §2`` "Structured facts first",
§4 "Human text").

One mapping for every provider layer (the OpenAI-compatible provider, the Anthropic provider,
the runner):

- an HTTP error of the official ``openai`` or ``anthropic`` SDK (``APIStatusError`` and its
  subclasses: ``RateLimitError``, ``InternalServerError``, ``OverloadedError``…): the text is
  ``"<status> <error.message>"`` (``529 Overloaded``, ``401 Incorrect API key provided: …``),
  ``"<status> status code (no body)"`` for an empty body, the page title of an HTML error page,
  or the raw body text (first :data:`BODY_LIMIT` characters); a router's wrapped upstream error
  (OpenRouter's ``error.metadata.raw``) is unwrapped and named after it, ``429 Provider
  returned error (Anthropic: Overloaded)``. The facts: ``status``, ``error_type`` /
  ``error_code`` (the innermost body's ``error.type`` / ``error.code``; Anthropic's
  ``error.details.error_code``) and the hint-bearing response ``headers``
  (:data:`KEPT_HEADERS`);
- an error event inside a stream (Anthropic ``{"type":"error","error":{"type":
  "overloaded_error","message":"Overloaded"}}``, OpenAI ``{"error":{...}}``): ``Stream error:
  Overloaded (overloaded_error)``, with ``error_type``/``error_code`` and no status;
- a connection failure or a timeout of either SDK (``APIConnectionError``, ``APITimeoutError``)
  and the transport errors of ``httpx``/``httpx2`` and ``httpcore`` underneath
  (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``…): the SDK's text followed by the
  chain of causes, ``Connection error. (ConnectError: [Errno 111] Connection refused)``. A bare
  transport error (the Anthropic SDK lets a dropped stream's ``ReadError`` through; older
  ``openai`` releases too) reads the same: ``Connection error.`` (or ``Request timed out.`` for
  a timeout) and its chain, so one failure has one text whichever SDK saw it;
- an error of the Google Gen AI SDK (``google.genai.errors.APIError``: ``ClientError``,
  ``ServerError``): ``"<code> <error.message>"`` with ``status`` = its ``code``, ``error_type``
  = Google's ``error.status`` (``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``…), the response's hint
  headers; one raised for an ``{"error": {...}}`` event inside a 200 stream reads as a stream
  error (``Stream error: … (UNAVAILABLE)``, its ``code`` the inner status). Google's typed
  ``error.details`` speak in the text, for every host: ``RetryInfo.retryDelay`` (a retry hint,
  ``retryDelay: "20s"``), ``QuotaFailure`` quota ids and values (the quota's window, a limit of
  0) and ``ErrorInfo.reason`` (``API_KEY_INVALID``); the ``aiohttp`` errors under the SDK's
  async client (``ClientPayloadError``: a stream cut; ``ClientConnectionError``) read as the
  other transports' connection errors;
- any other exception: ``"<Type>: <text> (<causes>)"``.

The retry hints the server sent are appended to the text as ``(retry-after: 20)`` — the one
header hint the classifier would choose (:func:`fsm.core.hints.header_hint`), and ``x-should-retry``
— so that a host that only has the text (an RPC client, a log) classifies it the same way.
A text never carries a language's repr of a parsed body, and bearer tokens and ``sk-…`` keys
are masked.

The SDKs are recognised by their class names and modules, so this module imports neither (a
provider that uses one pays for its import, no one else does).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsm.core.classify import ERROR_CODES
from fsm.core.hints import header_hint
from fsm.core.messages import AssistantMessage, Usage
from fsm.core.text import clip_text, safe_error_text

__all__ = [
    "BODY_LIMIT",
    "ErrorFacts",
    "KEPT_HEADERS",
    "error_facts",
    "error_message",
    "speaking_error",
    "kept_headers",
    "status_error_facts",
    "stream_error_facts",
]

BODY_LIMIT = 2000
"""Characters of a raw (non-JSON, non-HTML) error body kept in the text."""

KEPT_HEADERS = re.compile(
    r"retry-after(?:-ms)?|x-should-retry|x-request-id|request-id"
    r"|(?:x-)?ratelimit-[a-z0-9-]{1,40}|(?:x|anthropic)-ratelimit-[a-z0-9-]{1,40}")
"""Response headers kept as facts (full match, lower case): the retry hints, the server's
verdict and the request id. Every other header is dropped (cookies and tokens never reach an
event, a log or a file)."""

_SDK_MODULES = ("openai", "anthropic")
_STREAM_HEADERS = frozenset({"retry-after", "retry-after-ms", "x-should-retry", "request-id", "x-request-id"})
_TRANSPORT_MODULES = ("httpx", "httpx2", "httpcore", "httpcore2", "aiohttp")
_TRANSPORT_TIMEOUTS = frozenset({"TimeoutException", "ServerTimeoutError"})
_TRANSPORT_FAILURES = frozenset({"TransportError", "NetworkError", "ProtocolError", "ClientConnectionError",
                                 "ClientPayloadError"}) | _TRANSPORT_TIMEOUTS
"""httpx/httpcore base classes of a failure to reach or read the server (httpx's
``TransportError`` tree; httpcore's ``NetworkError``, ``ProtocolError``, ``TimeoutException``),
and aiohttp's (``ClientConnectionError`` and its ``ServerTimeoutError``; ``ClientPayloadError``,
a body cut short: what the Google Gen AI SDK's async client raises)."""
_GENAI_MODULE = "google.genai"
CONNECTION_TEXT = "Connection error."
"""The SDKs' ``APIConnectionError`` text, also used for a bare transport error."""
TIMEOUT_TEXT = "Request timed out."
"""The SDKs' ``APITimeoutError`` text, also used for a bare transport timeout."""
_RATE_FAMILIES = ("rate_limit", "usage_limit")
_TITLE = re.compile(r"<title[^>]{0,100}>\s*([^<]{1,200}?)\s*</title>", re.IGNORECASE)
_SECRET = re.compile(r"(?i)(bearer\s+)[^\s'\"\\]{4,}|\bsk-[A-Za-z0-9_\-]{6,}")


@dataclass(frozen=True, slots=True)
class ErrorFacts:
    """What a provider failure says: ``message`` (the human text, never empty), ``status``
    (HTTP status, ``None`` when there was no HTTP error), ``error_type`` / ``error_code`` (the
    provider's, as sent), ``headers`` (:func:`kept_headers`, lower-case keys, or ``None``)."""

    message: str
    status: int | None = None
    error_type: str | None = None
    error_code: str | None = None
    headers: Mapping[str, str] | None = None

    def to_message(self, *, text: str = "", usage: Usage | None = None,
                   model: str = "") -> AssistantMessage:
        """The ``stop_reason="error"`` assistant message carrying these facts; ``text`` is the
        partial answer streamed before the failure."""
        return AssistantMessage(stop_reason="error", text=text, error_message=self.message,
                                usage=usage, model=model, status=self.status,
                                error_type=self.error_type, error_code=self.error_code,
                                headers=self.headers)


def error_message(exc: BaseException, *, text: str = "", usage: Usage | None = None,
                  model: str = "", now_ms: float | None = None) -> AssistantMessage:
    """``error_facts(exc).to_message(text=…, usage=…, model=…)``: the error message of a
    failed request or stream."""
    return error_facts(exc, now_ms=now_ms).to_message(text=text, usage=usage, model=model)


def error_facts(exc: BaseException, *, now_ms: float | None = None) -> ErrorFacts:
    """The facts of any exception a provider call raised (see the module docstring). Never
    raises; the message is never empty. ``now_ms``: epoch ms against which absolute reset
    headers are read when choosing the hint the text carries (default: now)."""
    try:
        return _error_facts(exc, now_ms=now_ms)
    except Exception:  # an exception whose __str__ (or attributes) raise: its class is all we know
        return ErrorFacts(f"{type(exc).__name__} (its message could not be read)")


def speaking_error(exc: BaseException) -> BaseException:
    """The exception whose facts describe ``exc``: ``exc`` itself when it is an SDK error or an
    ``httpx``/``httpx2`` error, else the first such error among its causes (``__cause__``,
    then ``__context__``, at most 8 deep) — a framework's own exception (pydantic-ai's
    ``ModelHTTPError`` raised ``from`` the SDK's ``RateLimitError``) reads as the SDK error
    behind it, status, body and retry hint headers included (docs/integrations.md, "Retry hints
    behind a framework's exception"); ``exc`` when none is found. The project's own exceptions
    (``fsm.…``) are never looked behind."""
    if _speaks(exc) or type(exc).__module__.split(".", 1)[0] == "fsm":
        return exc
    seen, cause = {id(exc)}, exc.__cause__ or exc.__context__
    for _ in range(8):
        if cause is None or id(cause) in seen:
            break
        if _speaks(cause):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return exc


_SDK_SPEAKERS = frozenset({"APIError", "APIStatusError", "APIConnectionError"})
_TRANSPORT_SPEAKERS = _TRANSPORT_FAILURES | {"HTTPStatusError"}


def _speaks(exc: BaseException) -> bool:
    """An SDK error, or an ``httpx``/``httpx2`` status or transport error."""
    return _by_class(exc, "speaks") is True


def _genai_error(exc: BaseException) -> bool:
    """A ``google.genai.errors.APIError`` (by its module and class name: no import)."""
    return _by_class(exc, "genai") is True


def _genai_facts(exc: BaseException, now_ms: float | None) -> ErrorFacts:
    """The facts of a Google Gen AI ``APIError``: its ``code`` (the HTTP status, or the inner
    code of an error event inside a 200 stream, whose ``response`` is the SDK's own
    ``HttpResponse``), its parsed body (``details``: ``{"error": {"code", "message",
    "status", "details"}}``) and its response's headers."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    body = getattr(exc, "details", None)
    if isinstance(body, Mapping) and "error" not in body and set(body) <= {"message", "status"}:
        # a body that was not JSON: the SDK kept its text and the reason phrase
        body = body.get("message") or None
    if body is None and getattr(exc, "message", None):
        body = {"error": {"message": getattr(exc, "message", None), "status": getattr(exc, "status", None)}}
    if type(response).__name__ == "HttpResponse" and type(response).__module__.startswith(_GENAI_MODULE):
        # an {"error": {...}} event inside a stream that began with a 200
        return stream_error_facts(body if isinstance(body, Mapping) else {"error": body}, headers=headers)
    code = getattr(exc, "code", None)
    if isinstance(code, int) and not isinstance(code, bool) and code >= 400:
        return status_error_facts(code, body, headers, now_ms=now_ms)
    return stream_error_facts(body if isinstance(body, Mapping) else {"error": body}, headers=headers)


def _error_facts(exc: BaseException, *, now_ms: float | None = None) -> ErrorFacts:
    exc = speaking_error(exc)
    names = _class_names(exc, _SDK_MODULES)
    if "APIStatusError" in names:
        response = getattr(exc, "response", None)
        status = getattr(exc, "status_code", None)
        headers = getattr(response, "headers", None)
        if isinstance(status, int) and status >= 400:
            return status_error_facts(status, _read_body(exc, response), headers, now_ms=now_ms)
        # an error event inside a stream answered 200 (the Anthropic SDK raises it this way)
        body = getattr(exc, "body", None)
        if isinstance(body, str):
            try:
                body = json.loads(body)
            except ValueError:
                pass
        event = body if isinstance(body, Mapping) else {
            "error": {"message": body if isinstance(body, str) and body else getattr(exc, "message", "")}}
        return stream_error_facts(event, headers=headers)
    if "APIConnectionError" in names:  # APITimeoutError included
        causes = _cause_chain(exc)
        return ErrorFacts(_mask(f"{exc}{' (' + '; '.join(causes) + ')' if causes else ''}"))
    if "APIError" in names:  # an error event inside an otherwise successful stream (OpenAI)
        body = getattr(exc, "body", None)
        if isinstance(body, Mapping):
            return stream_error_facts({"error": body})
        return ErrorFacts(_mask(f"Stream error: {getattr(exc, 'message', '') or exc}"))
    if _genai_error(exc):
        return _genai_facts(exc, now_ms)
    transport = _class_names(exc, _TRANSPORT_MODULES)
    if transport & _TRANSPORT_FAILURES:
        # A bare transport error (raised mid-stream, where one SDK wraps it and the other does
        # not) reads as the SDKs' own connection error, so the same failure has the same words
        # through either SDK and through a transport.
        head = TIMEOUT_TEXT if transport & _TRANSPORT_TIMEOUTS else CONNECTION_TEXT
        causes = _cause_chain(exc, include_self=True)
        return ErrorFacts(_mask(f"{head} ({'; '.join(causes)})"))
    text = clip_text(str(exc))  # before any copy: the text may be 100 MB
    head = f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (no message)"
    causes = _cause_chain(exc)
    return ErrorFacts(_mask(head + (f" ({'; '.join(causes)})" if causes else "")))


def status_error_facts(status: int, body: Any, headers: Mapping[str, str] | Any = None, *,
                       now_ms: float | None = None) -> ErrorFacts:
    """The facts of an HTTP error response: ``status`` (an int ≥ 400), ``body`` (the decoded
    JSON — a dict such as ``{"error": {"type", "code", "message"}}`` or ``{"type": "error",
    "error": {...}}`` — or the raw text, or ``None``), ``headers`` (any mapping, or an
    ``httpx`` ``Headers``). For providers that do their own HTTP."""
    kept = kept_headers(headers)
    if isinstance(body, str):
        raw = body.strip()
        try:
            body = json.loads(raw) if raw[:1] in "{[" else raw
        except ValueError:
            body = raw
    message, error_type, error_code = _describe_body(body)
    if not message:
        text = f"{status} status code (no body)"
    elif message.startswith(f"{status} "):  # an HTML page titled "502 Bad Gateway"
        text = message
    else:
        text = f"{status} {message}"
    if error_code is not None and error_code.isdigit() and error_code != str(status):
        text += f" (code {error_code})"  # a router's inner status: 400 … (code 429)
    return ErrorFacts(_mask(text) + _hint_suffix(kept, status, error_type, error_code, now_ms), status,
                      error_type, error_code, kept)


def stream_error_facts(event: Mapping[str, Any], *, headers: Mapping[str, str] | Any = None) -> ErrorFacts:
    """The facts of an error event inside a stream: ``{"type": "error", "error": {"type":
    "overloaded_error", "message": "Overloaded"}}`` (Anthropic) or ``{"error": {"message",
    "type", "code"}}`` (OpenAI-compatible). Text: ``Stream error: Overloaded
    (overloaded_error)``; no status (the stream itself was a 200)."""
    message, error_type, error_code = _describe_body(event)
    kind = error_code or error_type
    text = f"Stream error: {message or 'the provider reported an error without a message'}"
    if kind and kind.lower() not in text.lower():
        text += f" ({kind})"
    # the stream's own headers are those of a 200: its rate-limit windows say nothing here
    kept = {k: v for k, v in (kept_headers(headers) or {}).items() if k in _STREAM_HEADERS}
    return ErrorFacts(_mask(text), None, error_type, error_code, kept or None)


def kept_headers(headers: Mapping[str, str] | Any) -> dict[str, str] | None:
    """The :data:`KEPT_HEADERS` of ``headers`` (lower-case names), or ``None`` when none."""
    if headers is None:
        return None
    try:
        items = list(headers.items())
    except (AttributeError, TypeError):
        return None
    out = {str(name).lower(): str(value) for name, value in items
           if KEPT_HEADERS.fullmatch(str(name).lower())}
    return out or None


# --------------------------------------------------------------------------------------------

def _class_names(exc: BaseException, modules: tuple[str, ...]) -> frozenset[str]:
    """Names of the exception's classes that come from one of ``modules`` (by root package)."""
    names: frozenset[str] = _by_class(exc, modules)
    return names


_BY_CLASS: dict[tuple[type, Any], Any] = {}
_BY_CLASS_LIMIT = 1024


def _by_class(exc: BaseException, what: Any) -> Any:
    """What the exception's class says, read once per class (a runner reads it several times
    per failure): ``"speaks"`` (:func:`_speaks`), ``"genai"`` (:func:`_genai_error`), or a
    tuple of root packages (:func:`_class_names`). At most :data:`_BY_CLASS_LIMIT` classes
    are remembered (emptied when full)."""
    key = (type(exc), what)
    found = _BY_CLASS.get(key)
    if found is None:
        mro = type(exc).__mro__
        if what == "speaks":
            found = bool(_class_names(exc, _SDK_MODULES) & _SDK_SPEAKERS
                         or _class_names(exc, _TRANSPORT_MODULES) & _TRANSPORT_SPEAKERS
                         or _genai_error(exc))
        elif what == "genai":
            found = any(cls.__name__ == "APIError" and cls.__module__.startswith(_GENAI_MODULE)
                        for cls in mro)
        else:
            found = frozenset(cls.__name__ for cls in mro
                              if cls.__module__.split(".", 1)[0] in what)
        if len(_BY_CLASS) >= _BY_CLASS_LIMIT:
            _BY_CLASS.clear()
        _BY_CLASS[key] = found
    return found


def _read_body(exc: BaseException, response: Any) -> Any:
    """The response body: decoded JSON, else its text, else what the SDK kept (``exc.body``)."""
    raw = None
    try:
        raw = response.text
    except Exception:  # a streamed response that was never read, or no response at all
        raw = None
    if isinstance(raw, str) and raw.strip():
        raw = raw.strip()
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    body = getattr(exc, "body", None)
    return body if body not in ("", b"") else None


def _text(value: Any) -> str:
    """A body part as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value.strip()
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):  # pragma: no cover - default=str always converts
        return str(value)


def _describe_body(body: Any, depth: int = 0) -> tuple[str, str | None, str | None]:
    """``(message, type, code)`` of an error body; a wrapped upstream error is unwrapped (its
    type/code win: the innermost verdict decides)."""
    if body is None or body == "":
        return "", None, None
    if isinstance(body, list) and len(body) == 1 and isinstance(body[0], Mapping):
        body = body[0]  # Gemini's OpenAI-compatible and REST errors: [{"error": {...}}]
    if isinstance(body, str):
        title = _TITLE.search(body[:20000])
        if title is not None and body.lstrip()[:1] == "<":
            return title.group(1), None, None
        if len(body) > BODY_LIMIT:
            return f"{body[:BODY_LIMIT]}… ({len(body) - BODY_LIMIT} more characters)", None, None
        return body, None, None
    if not isinstance(body, Mapping):
        return _text(body), None, None
    error = body.get("error")
    if isinstance(error, str):
        return error, _str(body.get("type"), skip="error"), _str(body.get("code"))
    if not isinstance(error, Mapping):
        error = body  # a bare {"message", "type", "code"}
    message = error.get("message", error.get("detail"))
    error_type = _str(error.get("type"), skip="error") or _str(error.get("status"))
    details = error.get("details")
    error_code = _str(error.get("code"))
    if isinstance(details, Mapping) and _str(details.get("error_code")):
        error_code = _str(details.get("error_code"))
    text = _text(message) if message not in (None, "") else ""
    if not text and (error or body):
        text = _text(body)  # no message: the body itself, as compact JSON
    elif isinstance(details, list):
        google = _google_details(details)
        if google:
            text += f" ({google})"
    metadata = error.get("metadata")
    if depth < 3 and isinstance(metadata, Mapping) and metadata.get("raw") not in (None, ""):
        raw = metadata.get("raw")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip()[:1] in "{[" else raw
            except ValueError:
                pass
        inner_text, inner_type, inner_code = _describe_body(raw, depth + 1)
        provider = metadata.get("provider_name")
        if inner_text:
            inner_text = inner_text[:BODY_LIMIT]
            text += f" ({provider}: {inner_text})" if isinstance(provider, str) and provider else f" ({inner_text})"
        if inner_type or inner_code:
            error_type, error_code = inner_type, inner_code
    return text, error_type, error_code


_GOOGLE_RPC = "type.googleapis.com/google.rpc."
_DURATION_RE = re.compile(r"\d{1,12}(?:\.\d{1,9})?m?s")


def _google_details(details: list) -> str:
    """Google's typed ``error.details`` (``google.rpc`` messages) as words the text rules and
    the hint parser read (docs/policy.md §2, "Structured facts first"): ``RetryInfo``'s
    ``retryDelay: "20s"`` (a retry hint), each ``QuotaFailure`` violation's ``quotaId`` and
    ``quotaValue`` (the window — ``…PerMinute…``, ``…PerDay…`` — and a limit of 0),
    ``ErrorInfo``'s ``reason`` and ``quota_limit_value``. ``""`` when there is none."""
    parts: list[str] = []
    for item in details[:16]:
        if not isinstance(item, Mapping):
            continue
        kind = str(item.get("@type", ""))
        if not kind.startswith(_GOOGLE_RPC):
            continue
        kind = kind[len(_GOOGLE_RPC):]
        if kind == "RetryInfo":
            delay = item.get("retryDelay")
            if isinstance(delay, str) and _DURATION_RE.fullmatch(delay.strip()):
                parts.append(f'retryDelay: "{delay.strip()}"')
        elif kind == "QuotaFailure":
            for violation in (item.get("violations") or [])[:4]:
                if not isinstance(violation, Mapping):
                    continue
                words = [f"{key}: {_str(violation.get(key))}" for key in ("quotaId", "quotaValue")
                         if _str(violation.get(key)) is not None]
                if words:
                    parts.append(", ".join(words))
        elif kind == "ErrorInfo":
            if _str(item.get("reason")):
                parts.append(f"reason: {_str(item.get('reason'))}")
            metadata = item.get("metadata")
            if isinstance(metadata, Mapping) and _str(metadata.get("quota_limit_value")) is not None:
                parts.append(f"quota_limit_value: {_str(metadata.get('quota_limit_value'))}")
    return clip_text("; ".join(parts), 1024)


def _str(value: Any, *, skip: str | None = None) -> str | None:
    """A type or code as a string (numbers too: OpenRouter's ``"code": 429``), else ``None``."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip() and value != skip:
        return value.strip()
    return None


def _rate_limited(status: int | None, error_type: str | None, error_code: str | None) -> bool:
    if status == 429:
        return True
    for value in (error_code, error_type):
        verdict = ERROR_CODES.get(value.lower()) if value else None
        if verdict is not None and verdict[1] in _RATE_FAMILIES:
            return True
    return False


def _hint_suffix(headers: Mapping[str, str] | None, status: int | None, error_type: str | None,
                 error_code: str | None, now_ms: float | None) -> str:
    """`` (retry-after: 20, x-should-retry: false)``: the header hint the classifier would use
    and the server's verdict, for hosts that only keep the text."""
    if not headers:
        return ""
    parts = []
    hint = header_hint(headers, rate_limited=_rate_limited(status, error_type, error_code), now_ms=now_ms)
    if hint is not None:
        parts.append(hint.as_text())
    elif headers.get("retry-after"):  # kept as sent, even when it says nothing usable
        parts.append(f"retry-after: {headers['retry-after']}")
    if headers.get("x-should-retry"):
        parts.append(f"x-should-retry: {headers['x-should-retry']}")
    return f" ({', '.join(parts)})" if parts else ""


def _mask(text: str) -> str:
    """``text`` through the scrubbing layer and clipped to 8 KB
    (:func:`fsm.core.text.safe_error_text`: a 100 MB exception text costs microseconds, not
    seconds), then the remaining bearer tokens and ``sk-…`` keys replaced by ``***`` (an SDK
    error can echo a header)."""
    text = safe_error_text(text)
    lowered = text.lower()
    if "sk-" not in lowered and "bearer" not in lowered:  # nothing _SECRET could match
        return text
    return _SECRET.sub(lambda m: (m.group(1) or "") + "***", text)


def _cause_chain(exc: BaseException, *, include_self: bool = False) -> list[str]:
    """``Name: text`` of each distinct, non-empty text among the exception's causes (and the
    exception itself first with ``include_self``); when none has a text, the first one's name.

    Suppressed contexts are followed too: httpx re-raises its transport errors ``from None``,
    and the root cause (``ConnectionRefusedError``…) is the part worth reading.
    """
    parts: list[str] = []
    seen = set() if include_self else {clip_text(str(exc), 1024)}
    first: BaseException | None = None
    pending: list[BaseException | None] = [exc] if include_self else [exc.__cause__ or exc.__context__]
    visited = set() if include_self else {id(exc)}
    while pending and len(parts) < 5:
        cause = pending.pop(0)
        if cause is None or id(cause) in visited:
            continue
        visited.add(id(cause))
        if isinstance(cause, asyncio.CancelledError):
            # anyio's timeouts are cancel scopes; their text only names a scope's address.
            continue
        first, text = first or cause, clip_text(str(cause), 1024)
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
